//! Several DBs under max-min fair share (Paio Algorithm 2): two RocksDBs,
//! each on its own stage with one DRL for all of its I/O, share a budget.
//! While only one writes it gets (nearly) the whole budget; once both
//! write, each gets about half (30% to 70% of it, on average over the
//! phase's last second); the limits never add up to much more than the
//! budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, DecisionRecord, FairShareConfig, InstanceConfig, PolicyKind};
use kv_stage::{
    DrlSpec, Match, ObjectSpec, Rule, Stage,
    units::{Bandwidth, Rate},
};
use rocks_env::StagedDb;
use tests::{key, small_lsm_options, value};

const MIB: f64 = 1048576.0;
const BUDGET: f64 = 16.0 * MIB;

fn tenant_stage(name: &str) -> Arc<Stage> {
    let stage = Arc::new(Stage::new(name));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "io".into(), matches: Some(Match::any()) },
            Rule::CreateObject {
                channel: "io".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
                matches: None,
            },
        ])
        .unwrap();
    stage
}

/// Writes 1 KiB values as fast as the stage lets it until `stop`.
fn writer(db: &StagedDb, stop: &AtomicBool, offset: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        db.put(key(offset + i % 50_000), value(i, 1024)).unwrap();
        i += 1;
    }
}

/// The limits the controller set in a record, per instance.
fn limits(r: &DecisionRecord) -> (Option<f64>, Option<f64>) {
    let of = |name: &str| r.settings.iter().find(|s| s.instance == name && s.error.is_none()).map(|s| s.rate_bps);
    (of("a"), of("b"))
}

#[test]
fn two_dbs_share_a_budget_max_min() {
    let (da, db_) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (sa, sb) = (tenant_stage("a"), tenant_stage("b"));
    let open = |d: &tempfile::TempDir, s: &Arc<Stage>| {
        StagedDb::builder(small_lsm_options()).stage(Arc::clone(s)).open(d.path()).unwrap()
    };
    let (a, b) = (open(&da, &sa), open(&db_, &sb));
    let inst = |name: &str| InstanceConfig {
        name: name.into(),
        demand: Rate::UNLIMITED,
        channel: "io".into(),
        object: "drl".into(),
    };
    let cfg = ControllerConfig {
        policy: PolicyKind::MaxMin,
        interval: Some(Duration::from_millis(100)),
        log: None,
        silk: Default::default(),
        adaptive: Default::default(),
        fair_share: Some(FairShareConfig {
            device_bandwidth: Bandwidth::new(BUDGET).unwrap(),
            instances: vec![inst("a"), inst("b")],
        }),
    };
    cfg.validate().unwrap();
    let ctl = Controller::builder(cfg).instance("a", sa.clone()).instance("b", sb.clone()).start().unwrap();

    let (stop_a, stop_b) = (AtomicBool::new(false), AtomicBool::new(false));
    let phase = Duration::from_secs(3);
    let (split_at, mut a_alone, mut both) = (std::cell::Cell::new(0u64), Vec::new(), Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| writer(&a, &stop_a, 0));
        std::thread::sleep(phase);
        split_at.set(ctl.cycles());
        s.spawn(|| writer(&b, &stop_b, 100_000));
        std::thread::sleep(phase);
        stop_a.store(true, Ordering::Relaxed);
        stop_b.store(true, Ordering::Relaxed);
    });
    let log = ctl.stop();
    let split = split_at.get();
    for r in &log {
        if let (Some(la), Some(lb)) = limits(r) {
            assert!(la + lb <= BUDGET * 1.25, "cycle {}: limits {la:.0} + {lb:.0} exceed the budget", r.cycle);
            // The last second of each phase, once converged.
            if r.cycle + 10 < split && r.cycle + 20 >= split {
                a_alone.push((la, lb));
            } else if r.cycle + 10 < log.len() as u64 && r.cycle >= split + 15 {
                both.push((la, lb));
            }
        }
    }
    let mean = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| v.iter().map(f).sum::<f64>() / v.len().max(1) as f64;
    let (a1, b1) = (mean(&a_alone, |x| x.0), mean(&a_alone, |x| x.1));
    let (a2, b2) = (mean(&both, |x| x.0), mean(&both, |x| x.1));
    eprintln!(
        "alone: a {:.1} MiB/s, b {:.1} MiB/s ({} cycles); both: a {:.1}, b {:.1} MiB/s ({} cycles); budget {:.0} MiB/s",
        a1 / MIB,
        b1 / MIB,
        a_alone.len(),
        a2 / MIB,
        b2 / MIB,
        both.len(),
        BUDGET / MIB
    );
    assert!(!a_alone.is_empty() && !both.is_empty(), "too few cycles: {} in all", log.len());
    assert!(a1 >= 0.8 * BUDGET, "a alone got {:.1} MiB/s of {:.0}", a1 / MIB, BUDGET / MIB);
    // Each about half: the policy judges who is saturated from measured use,
    // so a writer that stalls for a moment (a flush) is briefly given less.
    for (who, got) in [("a", a2), ("b", b2)] {
        assert!((0.3..=0.7).contains(&(got / BUDGET)), "{who} got {:.1} MiB/s with both writing", got / MIB);
    }
}
