//! Policy scenarios run through any stage handle: in-process
//! (`controller/tests/control_loop.rs`) and over the network
//! (`kv-remote/tests/policies.rs` includes this file), with the same
//! assertions.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use controller::{
    Controller, ControllerConfig, Decision, FairShareConfig, InstanceConfig, InstanceKey, ObjectRef, Observation,
    Policy, PolicyError, PolicyKind, Setting, SilkConfig, StageHandle,
};
use kv_stage::{DrlSpec, ObjectSpec, Rule, Stage, units::Rate};

/// How a scenario reaches its stages.
pub trait Via {
    /// A handle on `stage` (the stage itself, or a remote stage behind an
    /// agent this `Via` keeps alive).
    fn handle(&self, stage: &Arc<Stage>) -> Arc<dyn StageHandle>;
}

/// The stage itself.
pub struct InProcess;

impl Via for InProcess {
    fn handle(&self, stage: &Arc<Stage>) -> Arc<dyn StageHandle> {
        Arc::clone(stage) as Arc<dyn StageHandle>
    }
}

pub fn stage_with_drl(name: &str) -> Arc<Stage> {
    let stage = Arc::new(Stage::new(name));
    let drl = || ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "io".into(), matches: None },
            Rule::CreateObject { channel: "io".into(), object: "drl".into(), spec: drl(), matches: None },
            // Something for SILK to drive (it refuses to start without).
            Rule::CreateChannel {
                channel: "flush".into(),
                matches: Some(kv_stage::Match::context(kv_stage::RequestContext::BG_FLUSH)),
            },
            Rule::CreateObject { channel: "flush".into(), object: "drl".into(), spec: drl(), matches: None },
        ])
        .unwrap();
    stage
}

pub fn rate(stage: &Stage) -> f64 {
    match stage.object("io", "drl").unwrap().spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec(),
        other => panic!("{other:?}"),
    }
}

/// Sets 1000 B/s in cycle 0, then fails in odd cycles, panics in even ones,
/// and asks for 0 (which the controller floors) from cycle 6 on.
struct Flaky;

impl Policy for Flaky {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        let set = |rate| Decision {
            settings: vec![Setting { instance: InstanceKey(0), object: ObjectRef::new("io", "drl"), rate }],
            notes: serde_json::Value::Null,
            branches: Vec::new(),
        };
        match obs.cycle {
            0 => Ok(set(5000.0)),
            1 | 3 | 5 => Err(PolicyError::Failed("no data".into())),
            2 | 4 => panic!("policy bug"),
            _ => Ok(set(0.0)),
        }
    }
}

/// Sets the rates a test hands it, one per cycle; nothing when none is
/// waiting.
struct Scripted(Arc<std::sync::Mutex<std::collections::VecDeque<f64>>>);

impl Policy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn decide(&mut self, _obs: &Observation) -> Result<Decision, PolicyError> {
        let settings = match self.0.lock().unwrap().pop_front() {
            Some(rate) => vec![Setting { instance: InstanceKey(0), object: ObjectRef::new("io", "drl"), rate }],
            None => Vec::new(),
        };
        Ok(Decision { settings, notes: serde_json::Value::Null, branches: Vec::new() })
    }
}

/// Waits until the controller has run the cycle that consumed the last
/// scripted rate, and returns that cycle's record.
fn run_script(ctl: &Controller, script: &std::sync::Mutex<std::collections::VecDeque<f64>>, rate: f64) -> String {
    let before = ctl.cycles();
    script.lock().unwrap().push_back(rate);
    let t0 = std::time::Instant::now();
    while !script.lock().unwrap().is_empty() || ctl.cycles() < before + 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the controller stopped cycling");
        std::thread::sleep(Duration::from_millis(2));
    }
    let log = ctl.log();
    let rec = log.iter().rev().find(|r| !r.settings.is_empty() || r.error.is_some()).expect("a record with the rate");
    serde_json::to_string(rec).unwrap()
}

pub fn failing_policies_keep_the_last_rates_and_never_close_a_drl(via: &dyn Via) {
    let stage = stage_with_drl("flaky");
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(5));
    let ctl = Controller::builder(cfg).instance("s", via.handle(&stage)).policy(Box::new(Flaky)).start().unwrap();
    while ctl.cycles() < 6 {
        std::thread::sleep(Duration::from_millis(5));
        if ctl.cycles() == 3 {
            assert_eq!(rate(&stage), 5000.0, "rates are kept while the policy fails");
        }
    }
    while ctl.cycles() < 8 {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(ctl.policy_errors() >= 5);
    let log = ctl.stop();
    assert!(log[2].error.as_deref().unwrap().contains("policy bug"));
    assert!(log[1].error.as_deref().unwrap().contains("no data"));
    assert_eq!(rate(&stage), controller::RATE_FLOOR, "a rate of 0 is floored, never closing the DRL");
}

pub fn fair_share_instances_join_and_leave(via: &dyn Via) {
    let a = stage_with_drl("a");
    let b = stage_with_drl("b");
    let c = stage_with_drl("c");
    let inst = |n: &str| InstanceConfig {
        name: n.into(),
        demand: Rate::from_bytes_per_sec(100.0).unwrap(),
        channel: "io".into(),
        object: "drl".into(),
    };
    let mut cfg = ControllerConfig::fair_share(
        PolicyKind::MaxMin,
        FairShareConfig {
            device_bandwidth: kv_stage::units::Bandwidth::new(1_000_000.0).unwrap(),
            instances: vec![inst("a"), inst("b")],
        },
    );
    cfg.interval = Some(Duration::from_millis(5));
    let ctl = Controller::builder(cfg).instance("a", via.handle(&a)).instance("b", via.handle(&b)).start().unwrap();
    let wait = |n: u64| {
        let target = ctl.cycles() + n;
        while ctl.cycles() < target {
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait(3);
    // Two idle instances asking for 100 B/s of 1 MB/s: each is offered half.
    assert_eq!(rate(&a), 500_000.0);
    ctl.join(inst("c"), via.handle(&c));
    wait(3);
    assert!((rate(&c) - 1_000_000.0 / 3.0).abs() < 1.0, "{}", rate(&c));
    ctl.leave("a");
    wait(3);
    assert_eq!(rate(&b), 500_000.0);
    drop(ctl); // stops and joins
}

/// Only +inf means unlimited. A policy asking for NaN or -inf made the
/// controller set the DRL to unlimited with no error (it failed open); it
/// is a policy error now, recorded, and the previous rate stays.
pub fn nan_and_negative_infinity_are_policy_errors_that_keep_the_rate(via: &dyn Via) {
    let stage = stage_with_drl("nan");
    let script = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(2));
    let ctl = Controller::builder(cfg)
        .instance("s", via.handle(&stage))
        .policy(Box::new(Scripted(script.clone())))
        .start()
        .unwrap();
    run_script(&ctl, &script, 5000.0);
    assert_eq!(rate(&stage), 5000.0);
    for bad in [f64::NAN, f64::NEG_INFINITY] {
        let errors = ctl.policy_errors();
        let record = run_script(&ctl, &script, bad);
        assert_eq!(rate(&stage), 5000.0, "a rate of {bad} changed the DRL: {record}");
        assert!(ctl.policy_errors() > errors, "a rate of {bad} was not counted as a policy error: {record}");
        assert!(record.contains("error"), "the record of a {bad} rate has no error: {record}");
    }
    run_script(&ctl, &script, f64::INFINITY);
    assert!(rate(&stage).is_infinite(), "+inf sets the DRL unlimited");
    ctl.stop();
}

/// SILK with pressure: what the handle reports reaches the policy and the
/// decision log; an LN compaction (no flush, no L0) gets the calm budget
/// with no pressure and all of `left_B` under pressure.
pub fn pressure_from_the_handle_drives_silk_with_pressure(via: &dyn Via) {
    use kv_stage::{Match, RequestContext};
    const MIB: f64 = 1048576.0;
    let stage = Arc::new(Stage::new("kv"));
    stage
        .apply_rules([
            Rule::CreateChannel {
                channel: "ln".into(),
                matches: Some(Match::context(RequestContext::BG_COMPACTION_LN)),
            },
            Rule::CreateObject {
                channel: "ln".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
                matches: None,
            },
        ])
        .unwrap();
    let level = Arc::new(std::sync::Mutex::new(0.0));
    let source = Arc::clone(&level);
    let handle = Arc::new(controller::WithPressure::new(via.handle(&stage), move || {
        controller::Pressure::new(*source.lock().unwrap(), 0.0, 0.0)
    }));
    let silk = SilkConfig {
        kvs_bandwidth: kv_stage::units::Bandwidth::new(60.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::units::Bandwidth::new(4.0 * MIB).unwrap(),
        hysteresis: Rate::from_bytes_per_sec(0.0).unwrap(),
        pressure: Some(controller::PressureConfig::new(kv_stage::units::Bandwidth::new(20.0 * MIB).unwrap())),
    };
    let ln_rate = || match stage.object("ln", "drl").unwrap().spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec() / MIB,
        other => panic!("{other:?}"),
    };
    let ctl = Controller::builder(ControllerConfig::silk(silk)).instance("kv", handle.clone()).start().unwrap();
    let wait = |want: f64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while (ln_rate() - want).abs() > 1e-6 {
            assert!(std::time::Instant::now() < deadline, "LN rate {} MiB/s, expected {want}", ln_rate());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // Idle clients: left_B is all of KVS_B (60); calm with no pressure.
    wait(20.0);
    *level.lock().unwrap() = 2.0;
    wait(60.0);
    *level.lock().unwrap() = 0.5;
    wait(40.0);
    let log = ctl.stop();
    let last = log.last().unwrap();
    assert_eq!(last.inputs[0].pressure.map(|p| p.level), Some(0.5));
    let json = serde_json::to_value(last).unwrap();
    assert_eq!(json["notes"][0]["pressure"]["l0"], 0.5, "{json}");
    assert_eq!(json["notes"][0]["budget_bps"], 40.0 * MIB, "{json}");
}

/// SILK reads its L0 and LN classes: a job reported under a level pair
/// (an intra-L0 compaction, an L2->L3 one) counts as L0 or LN work, and
/// the objects on the classes' routes are found.
pub fn silk_sees_level_pair_jobs_through_their_classes(via: &dyn Via) {
    use kv_stage::{InstanceId, RequestContext as C};
    const MIB: f64 = 1048576.0;
    // The paper's layout (flush DRL, compaction channel with `l0` and `ln`
    // DRLs on the two classes), as the example rules file has it.
    let stage = Arc::new(Stage::new("pairs"));
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/../kv-stage/examples/rules/rocksdb.toml");
    stage.apply(&kv_stage::RuleSet::load(std::path::Path::new(layout)).unwrap()).unwrap();
    let silk = SilkConfig {
        kvs_bandwidth: kv_stage::units::Bandwidth::new(60.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::units::Bandwidth::new(4.0 * MIB).unwrap(),
        hysteresis: Rate::from_bytes_per_sec(0.0).unwrap(),
        pressure: None,
    };
    let rate = |o: &str| match stage.object("compaction", o).unwrap().spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec() / MIB,
        other => panic!("{other:?}"),
    };
    let ctl = Controller::builder(ControllerConfig::silk(silk)).instance("db", via.handle(&stage)).start().unwrap();
    let wait = |l0: f64, ln: f64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while (rate("l0") - l0).abs() > 1e-6 || (rate("ln") - ln).abs() > 1e-6 {
            assert!(
                std::time::Instant::now() < deadline,
                "l0 {} ln {} MiB/s, expected {l0} {ln}",
                rate("l0"),
                rate("ln")
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // Idle: LN gets left_B (all of KVS_B).
    wait(4.0, 60.0);
    // An intra-L0 compaction is L0 work: the L0 DRL gets left_B.
    stage.job_started(InstanceId(0), C::BG_COMPACTION_L0_L0);
    wait(60.0, 4.0);
    stage.job_finished(InstanceId(0), C::BG_COMPACTION_L0_L0);
    // An L2->L3 compaction is LN work: LN gets left_B again once the L0
    // job is out of the last cycle.
    stage.job_started(InstanceId(0), C::BG_COMPACTION_L2_L3);
    wait(4.0, 60.0);
    stage.job_finished(InstanceId(0), C::BG_COMPACTION_L2_L3);
    let log = ctl.stop();
    // The log names the pairs.
    let named = |c: &str| log.iter().any(|r| r.inputs[0].running_jobs.iter().any(|(n, _)| n == c));
    assert!(named("bg_compaction_L0_L0") && named("bg_compaction_L2_L3"));
}
