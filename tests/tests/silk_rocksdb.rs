//! SILK against a real RocksDB (through rocks-env, on an emulated device):
//! during a write burst the flush DRL gets `left_B` while a flush runs and
//! LN compactions sit at `min_B`; when no flush or L0 compaction runs, LN
//! compactions get `left_B`. The decision log shows it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, DecisionRecord, SilkConfig};
use kv_stage::{ObjectSpec, Stage, units::Rate};
use rocks_env::{Device, RocksLayout, StagedDb};
use serde_json::Value;

const MIB: f64 = 1048576.0;

fn rate_of(r: &DecisionRecord, channel: &str, object: &str) -> Option<f64> {
    r.settings.iter().find(|s| s.channel == channel && s.object == object && s.error.is_none()).map(|s| s.rate_bps)
}

fn note<'a>(r: &'a DecisionRecord, key: &str) -> &'a Value {
    &r.notes[0][key]
}

#[test]
fn silk_shifts_bandwidth_between_flushes_and_ln_compactions() {
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("silk-e2e"));
    let layout = RocksLayout::new();
    let handles = layout.install(&stage).unwrap();

    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_write_buffer_size(1 << 20);
    opts.set_level_zero_file_num_compaction_trigger(2);
    opts.set_max_bytes_for_level_base(4 << 20);
    opts.set_target_file_size_base(1 << 20);
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    opts.set_max_background_jobs(4);
    let device = Device::parse("64MiB/s").unwrap();
    let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).device(device).open(dir.path()).unwrap();

    let silk = SilkConfig {
        kvs_bandwidth: kv_stage::units::Bandwidth::new(48.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::units::Bandwidth::new(2.0 * MIB).unwrap(),
        // Every cycle sets every rate, so the log shows each decision.
        hysteresis: Rate::from_bytes_per_sec(0.0).unwrap(),
        pressure: None,
    };
    let ctl = Controller::builder(ControllerConfig::silk(silk)).instance("db", stage.clone()).start().unwrap();

    // A write burst: 3 s of puts as fast as they go, then 2 s of quiet while
    // compactions finish.
    let t = Instant::now();
    let mut i = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 50_000;
        db.put(format!("key{k:08}"), vec![b'v'; 1000]).unwrap();
        i += 1;
    }
    std::thread::sleep(Duration::from_secs(2));
    let log = ctl.stop();
    assert!(log.len() > 100, "too few cycles: {}", log.len());

    let (flush, l0, ln) = ((layout.flush(), "drl"), (layout.compaction(), "l0"), (layout.compaction(), "ln"));
    let (mut flush_only, mut both, mut neither) = (0, 0, 0);
    for r in &log {
        assert!(r.error.is_none(), "cycle {}: {:?}", r.cycle, r.error);
        let left = note(r, "left_bps").as_f64().unwrap();
        let branch = note(r, "branch").as_str().unwrap();
        let (fl, l0r, lnr) = (
            rate_of(r, &flush.0, flush.1).unwrap(),
            rate_of(r, &l0.0, l0.1).unwrap(),
            rate_of(r, &ln.0, ln.1).unwrap(),
        );
        let min = 2.0 * MIB;
        match branch {
            "flush_only" => {
                flush_only += 1;
                assert!(note(r, "flush_active").as_bool().unwrap());
                assert_eq!((fl, l0r, lnr), (left, min, min), "cycle {}", r.cycle);
            }
            "flush_and_l0" => {
                both += 1;
                assert_eq!((fl, l0r, lnr), (left / 2.0, left / 2.0, min), "cycle {}", r.cycle);
            }
            "l0_only" => assert_eq!((fl, l0r, lnr), (min, left, min), "cycle {}", r.cycle),
            "neither" => {
                neither += 1;
                assert!(!note(r, "flush_active").as_bool().unwrap() && !note(r, "l0_active").as_bool().unwrap());
                assert_eq!((fl, l0r, lnr), (min, min, left), "cycle {}", r.cycle);
            }
            other => panic!("unknown branch {other}"),
        }
        // left_B = max(KVS_B - Fg, min_B).
        let fg = note(r, "fg_bps").as_f64().unwrap();
        assert!((left - (48.0 * MIB - fg).max(min)).abs() < 1.0);
    }
    eprintln!("cycles: {} (flush only {flush_only}, flush and L0 {both}, neither {neither})", log.len());
    for r in log
        .iter()
        .filter(|r| note(r, "branch") == "flush_only")
        .take(2)
        .chain(log.iter().rev().filter(|r| note(r, "branch") == "neither").take(1))
    {
        eprintln!("{}", serde_json::to_string(r).unwrap());
    }
    assert!(flush_only + both > 0, "no cycle saw a flush running");
    assert!(neither > 0, "no quiet cycle");

    // The log names compactions by level pair: whenever SILK counted L0 or
    // LN jobs (its classes), the cycle's inputs list them under their pairs,
    // and no compaction is without levels.
    let in_class = |r: &DecisionRecord, class: kv_stage::RequestContext| -> u64 {
        r.inputs[0]
            .running_jobs
            .iter()
            .filter(|(c, _)| {
                kv_stage::RequestContext::lookup(c).is_some_and(|c| c.level_pair().is_some() && class.covers(c))
            })
            .map(|(_, n)| n)
            .sum()
    };
    let mut pairs: Vec<&str> = Vec::new();
    for r in &log {
        let running = &note(r, "running");
        assert_eq!(
            running["l0"].as_u64().unwrap(),
            in_class(r, kv_stage::RequestContext::BG_COMPACTION_L0_L1),
            "cycle {}",
            r.cycle
        );
        assert_eq!(
            running["ln"].as_u64().unwrap(),
            in_class(r, kv_stage::RequestContext::BG_COMPACTION_LN),
            "cycle {}",
            r.cycle
        );
        for (c, _) in &r.inputs[0].running_jobs {
            assert!(c != "bg_compaction_LN" && c != "bg_compaction", "cycle {}: a compaction without levels", r.cycle);
            if c.starts_with("bg_compaction_L") && !pairs.contains(&c.as_str()) {
                pairs.push(c);
            }
        }
    }
    eprintln!("level pairs in the decision log: {pairs:?}");
    assert!(!pairs.is_empty(), "no compaction in the log");

    // The stage holds the rates of the last cycle.
    let last = log.last().unwrap();
    let spec_rate = |h: &kv_stage::info::ObjectHandle| match h.spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec(),
        other => panic!("{other:?}"),
    };
    assert_eq!(spec_rate(&handles.compaction_ln), rate_of(last, &ln.0, ln.1).unwrap());
    assert_eq!(spec_rate(&handles.flush), rate_of(last, &flush.0, flush.1).unwrap());
}
