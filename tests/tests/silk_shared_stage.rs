//! SILK on one stage shared by two DBs, each with its own layout: the
//! bandwidth left by the clients is split among the flush and L0 DRLs that
//! need it, not handed whole to every DB's (which over-allocated by the
//! number of DBs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use controller::{Controller, ControllerConfig, SilkConfig};
use kv_stage::{InstanceId, RequestContext as C, Stage, units::Rate};
use rocks_env::{RocksLayout, StagedDb};
use tests::{key, small_lsm_options, value, wait_for};

const MIB: f64 = 1048576.0;

#[test]
fn silk_splits_what_is_left_between_two_dbs_flushing_at_once() {
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stage = Arc::new(Stage::new("two-dbs"));
    for (i, prefix) in [(1, "db1."), (2, "db2.")] {
        RocksLayout::for_instance(InstanceId(i), prefix).install(&stage).unwrap();
    }
    // Two flush threads, so the DBs' flushes can run at the same time.
    rocksdb::Env::new().unwrap().set_high_priority_background_threads(2);
    let open = |d: &tempfile::TempDir, i| {
        let mut o = small_lsm_options();
        o.set_write_buffer_size(4 << 20);
        o.set_max_background_jobs(8);
        StagedDb::builder(o).stage(Arc::clone(&stage)).instance(InstanceId(i)).open(d.path()).unwrap()
    };
    let (db1, db2) = (open(&d1, 1), open(&d2, 2));
    let (kvs, min) = (64.0 * MIB, 4.0 * MIB);
    let mut cfg = ControllerConfig::silk(SilkConfig {
        kvs_bandwidth: kv_stage::units::Bandwidth::new(kvs).unwrap(),
        min_bandwidth: kv_stage::units::Bandwidth::new(min).unwrap(),
        // Every cycle sets every rate, so each record holds a whole decision.
        hysteresis: Rate::from_bytes_per_sec(0.0).unwrap(),
        pressure: None,
    });
    cfg.interval = Some(Duration::from_millis(5));
    let ctl = Controller::builder(cfg).instance("stage", stage.clone()).start().unwrap();

    // Fill both memtables, then flush both at once, several times.
    for round in 0..4u64 {
        for i in 0..3000u64 {
            db1.put(key(i), value(i + round, 1000)).unwrap();
            db2.put(key(i), value(i + round, 1000)).unwrap();
        }
        let mut f = rocksdb::FlushOptions::default();
        f.set_wait(false);
        db1.flush_opt(&f).unwrap();
        db2.flush_opt(&f).unwrap();
        wait_for("both flushes", Duration::from_secs(30), || stage.collect().jobs(C::BG_FLUSH).counts.running == 0);
    }
    let log = ctl.stop();

    // Every cycle: the rates set on all six DRLs (two flush, two L0, two LN)
    // add up to at most what SILK may hand out, KVS_B, plus the floors.
    let mut both_flushing = 0;
    for r in &log {
        let rates: HashMap<String, f64> = r
            .settings
            .iter()
            .filter(|s| s.error.is_none())
            .map(|s| (format!("{}/{}", s.channel, s.object), s.rate_bps))
            .collect();
        if rates.len() < 6 {
            continue;
        }
        let total: f64 = rates.values().sum();
        assert!(
            total <= kvs + 6.0 * min + 1.0,
            "cycle {} handed out {:.1} MiB/s on one stage with KVS_B {:.0} MiB/s: {rates:?}",
            r.cycle,
            total / MIB,
            kvs / MIB
        );
        let (f1, f2) = (rates["db1.flush/drl"], rates["db2.flush/drl"]);
        if f1 > min && f2 > min {
            both_flushing += 1;
            assert!(f1 + f2 <= kvs + 1.0, "cycle {}: flush DRLs at {f1} and {f2} B/s", r.cycle);
        }
    }
    eprintln!("{} cycles, {both_flushing} with both DBs' flushes above the floor", log.len());
    assert!(both_flushing > 0, "no cycle saw both DBs flush at once");
}
