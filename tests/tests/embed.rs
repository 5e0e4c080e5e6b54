//! Embedding a RocksDB through a stage the way a service does: the layout
//! comes from the rules file shipped with kv-stage, the service tags its own
//! work with an application context, and the stage's statistics account for
//! every byte RocksDB wrote, by context.

use std::path::Path;
use std::sync::Arc;

use kv_stage::{Match, ObjectSpec, RequestContext, Rule, RuleSet, Stage};
use rocks_env::{FileKind, StagedDb, with_context};
use tests::{key, small_lsm_options, value};

#[test]
fn a_service_embeds_a_db_through_the_shipped_rules_file() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kv-stage/examples/rules/rocksdb.toml");
    let set = RuleSet::load(&rules).unwrap();
    let stage = Arc::new(Stage::new("service"));
    stage.apply(&set).unwrap();
    // The service's own context, with a channel of its own.
    let backup = RequestContext::register("embed-backup").unwrap();
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "backup".into(), matches: Some(Match::context(backup)) },
            Rule::CreateObject {
                channel: "backup".into(),
                object: "noop".into(),
                spec: ObjectSpec::Noop,
                matches: None,
            },
        ])
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    for i in 0..2_000u64 {
        db.put(key(i), value(i, 1000)).unwrap();
    }
    with_context(backup, || {
        for i in 0..100u64 {
            db.put(key(100_000 + i), value(i, 1000)).unwrap();
        }
    });
    db.flush().unwrap();

    let c = stage.collect();
    let io = db.io_stats();
    let wal = io.kind(FileKind::Wal).write.bytes;
    let (fg, bk) = (c.channel("foreground").unwrap().bytes, c.channel("backup").unwrap().bytes);
    eprintln!(
        "WAL {wal} B; foreground channel {fg} B, backup channel {bk} B, flush {} B",
        c.channel("flush").unwrap().bytes
    );
    // Every WAL byte is in the client's channel or the service's own.
    assert!((100 * 1000..2 * 100 * 1000).contains(&bk), "backup channel {bk} B");
    assert!(fg + bk >= wal, "channels {fg} + {bk} B < WAL {wal} B");
    // The flush wrote the SST through the flush DRL of the file's layout.
    assert!(c.channel("flush").unwrap().bytes >= io.kind(FileKind::Sst).write.bytes.min(1));
    assert!(c.object("flush", "drl").unwrap().counter.bytes > 0);
    // The file's enforcement rule set the LN compactions' DRL to 10 MiB/s.
    let ln = stage.stage_info();
    let spec = ln.object("compaction", "ln").unwrap().spec.clone().unwrap();
    assert_eq!(serde_json::to_value(spec).unwrap()["rate"], "10MiB/s");
}
