//! A volume per DB instance: two RocksDBs on one stage, one of them a
//! `[[volumes]]` entry with an `io.max` write limit. Every request of that
//! DB (WAL, flush, compaction) goes through its volume's limit; the other
//! DB's requests are untouched; the limit is lifted live with an io.max line.

use std::sync::Arc;

use kv_stage::paio::PaioOptions;
use kv_stage::{InstanceId, RuleSet, RulesFormat, Stage, volumes::Volume};
use rocks_env::StagedDb;
use tests::{key, small_lsm_options, value};

const RULES: &str = r#"
[[volumes]]
name = "orders"
instance = 1
limits = "wbps=2MiB"
"#;

#[test]
fn a_db_instance_volume_limits_that_db_only_and_changes_live() {
    let stage = Arc::new(Stage::new("volumes"));
    stage
        .apply(&RuleSet::parse(RULES, RulesFormat::Toml, Some("rules".into()), &PaioOptions::default()).unwrap())
        .unwrap();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |dir: &std::path::Path, i: u16| {
        StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).instance(InstanceId(i)).open(dir).unwrap()
    };
    let (orders, other) = (open(d1.path(), 1), open(d2.path(), 2));
    // 1 MiB to each: the limited DB's WAL writes arrive faster than 2 MiB/s.
    for i in 0..1_000u64 {
        orders.put(key(i), value(i, 1000)).unwrap();
        other.put(key(i), value(i, 1000)).unwrap();
    }
    let c = stage.collect();
    let vol = c.channel("orders").unwrap();
    let limits = c.object("orders", "limits").unwrap();
    let default = c.channel("default").unwrap();
    eprintln!(
        "orders volume: {} B in {} requests, {} waits ({} ms); default channel {} B",
        vol.bytes,
        vol.ops,
        limits.stats.waits,
        limits.stats.wait_ns / 1_000_000,
        default.bytes
    );
    // All of the limited DB's writes and none of the other's are in the volume.
    assert!(vol.bytes >= 1_000 * 1_000, "{} B", vol.bytes);
    assert!(default.bytes >= 1_000 * 1_000, "{} B", default.bytes);
    assert!(limits.stats.waits > 0, "the volume's limit never held a write");
    // Lifted live, as a write of `wbps=max` to io.max would: no more waits.
    stage.apply_rules([Volume::limit_rule(&"orders wbps=max".parse().unwrap())]).unwrap();
    let waits = stage.collect().object("orders", "limits").unwrap().stats.waits;
    for i in 0..1_000u64 {
        orders.put(key(10_000 + i), value(i, 1000)).unwrap();
    }
    assert_eq!(stage.collect().object("orders", "limits").unwrap().stats.waits, waits);
}
