//! SILK sees an `AsyncDb` service's tenants: their bandwidth is client
//! bandwidth (`Fg`), so the budget SILK hands background work shrinks while
//! they write, and grows back when they stop. Real RocksDB, real threads.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use controller::{Controller, ControllerConfig, DecisionRecord, SilkConfig};
use kv_async::AsyncDb;
use kv_stage::{
    RequestContext, RuleSet, RulesFormat, Stage,
    units::{Bandwidth, Rate},
};
use rocks_env::{RocksLayout, StagedDb};

const MIB: f64 = 1048576.0;
const KVS: f64 = 256.0 * MIB;

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn note(r: &DecisionRecord, key: &str) -> f64 {
    r.notes[0][key].as_f64().unwrap_or_else(|| panic!("cycle {}: no {key}: {}", r.cycle, r.notes))
}

#[test]
fn silk_counts_async_tenants_as_client_bandwidth() {
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("silk-tenants"));
    RocksLayout::new().install(&stage).unwrap();
    // Two tenants, each with its own (unlimited) channel, as a service
    // declares them.
    let mut rules = String::from("version = 1\n");
    for t in ["gold_t", "silver_t"] {
        rules += &format!(
            "[[rules]]\nop = \"create_channel\"\nchannel = \"{t}\"\nmatch = {{ context = \"{t}\" }}\n\
             [[rules]]\nop = \"create_object\"\nchannel = \"{t}\"\nobject = \"limit\"\n\
             spec = {{ kind = \"drl\", rate = \"unlimited\" }}\n"
        );
    }
    let tenants = [RequestContext::register("gold_t").unwrap(), RequestContext::register("silver_t").unwrap()];
    stage.apply(&RuleSet::parse(&rules, RulesFormat::Toml, None, &Default::default()).unwrap()).unwrap();
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    // A large memtable: few flushes in the run, so the tenants' rate
    // depends little on how fast the machine flushes.
    opts.set_write_buffer_size(64 << 20);
    let staged = Arc::new(StagedDb::builder(opts).stage(Arc::clone(&stage)).open(dir.path()).unwrap());
    let db = AsyncDb::builder(Arc::clone(&staged)).sync_writes(false).build();

    let silk = SilkConfig {
        kvs_bandwidth: Bandwidth::new(KVS).unwrap(),
        min_bandwidth: Bandwidth::new(MIB).unwrap(),
        hysteresis: Rate::from_bytes_per_sec(0.0).unwrap(),
        pressure: None,
    };
    let ctl = Controller::builder(ControllerConfig::silk(silk)).instance("db", Arc::clone(&stage)).start().unwrap();

    // 1.5 s of quiet, 2 s of both tenants writing 4 KiB values as fast as
    // they go (bounded in count too), 1.5 s of quiet.
    std::thread::sleep(Duration::from_millis(1500));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (write_start, ws) = (Instant::now(), unix_ms());
    let written_before: u64 = staged.client_io().iter().map(|c| c.written.bytes).sum();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (n, t) in tenants.into_iter().enumerate() {
            let db = db.clone();
            tasks.push(tokio::spawn(kv_async::scope(t, async move {
                let value = vec![b'v'; 4096];
                for i in 0..200_000u64 {
                    if write_start.elapsed() >= Duration::from_secs(2) {
                        break;
                    }
                    db.put(format!("t{n}-{:08}", i % 20_000).into_bytes(), value.clone()).await.unwrap();
                }
            })));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let (write_end, we) = (Instant::now(), unix_ms());
    let tenant_bps = (staged.client_io().iter().map(|c| c.written.bytes).sum::<u64>() - written_before) as f64
        / (write_end - write_start).as_secs_f64();
    std::thread::sleep(Duration::from_millis(1500));
    let log = ctl.stop();

    // The tenants' file I/O went through as foreground's, none in their
    // own contexts; their contexts hold their puts.
    let c = stage.collect();
    for t in tenants {
        let x = c.contexts.iter().find(|x| x.context == t).expect("the tenant's puts");
        assert!(x.counter.ops > 100, "{}: {} puts", t.name(), x.counter.ops);
        assert_eq!(x.file.ops, 0, "{}: file I/O in the tenant's context", t.name());
    }
    let wal: u64 = staged.client_io().iter().map(|c| c.written.bytes).sum();
    assert!(wal > 0);

    // Cycles fully inside the writing window, and after it (quiet).
    let busy: Vec<&DecisionRecord> = log.iter().filter(|r| r.unix_ms > ws + 300 && r.unix_ms < we).collect();
    let quiet: Vec<&DecisionRecord> = log.iter().filter(|r| r.unix_ms > we + 500).collect();
    assert!(busy.len() >= 10 && quiet.len() >= 10, "{} busy and {} quiet cycles", busy.len(), quiet.len());
    // Means weighted by each cycle's interval: the tenants' writes come in
    // bursts on a busy machine, and a 10 ms cycle sees a burst or nothing.
    let mean = |v: &[&DecisionRecord], key: &str| {
        let total: f64 = v.iter().map(|r| r.interval_ms).sum();
        v.iter().map(|r| note(r, key) * r.interval_ms).sum::<f64>() / total.max(1e-9)
    };
    let (fg_busy, left_busy, left_quiet) = (mean(&busy, "fg_bps"), mean(&busy, "left_bps"), mean(&quiet, "left_bps"));
    eprintln!(
        "tenants wrote {:.1} MiB/s of WAL; SILK's Fg (mean while writing) {:.1} MiB/s; left_B {:.1} MiB/s while writing, {:.1} MiB/s after",
        tenant_bps / MIB,
        fg_busy / MIB,
        left_busy / MIB,
        left_quiet / MIB
    );
    // SILK's Fg holds the tenants' bandwidth (the cycles cover most of the
    // writing window, not all of it: hence half), and background work got
    // that much less.
    assert!(tenant_bps > 0.25 * MIB, "the tenants wrote only {:.2} MiB/s", tenant_bps / MIB);
    assert!(fg_busy >= 0.5 * tenant_bps, "Fg {:.2} MiB/s vs the tenants' {:.2}", fg_busy / MIB, tenant_bps / MIB);
    assert!(left_busy <= KVS - 0.5 * tenant_bps, "left_B {:.2} MiB/s did not shrink", left_busy / MIB);
    assert!(
        left_quiet > left_busy,
        "left_B {:.2} MiB/s after vs {:.2} while writing",
        left_quiet / MIB,
        left_busy / MIB
    );
}
