//! The loop itself: a failing or panicking policy keeps the previous rates
//! and the loop goes on; instances join and leave; stop is clean; bad
//! bindings are refused at start.

use std::sync::Arc;
use std::time::Duration;

use controller::{
    Controller, ControllerConfig, Decision, FairShareConfig, InstanceConfig, InstanceKey, ObjectRef, Observation,
    Policy, PolicyError, PolicyKind, Setting, SilkConfig,
};
use kv_stage::{DrlSpec, ObjectSpec, Rate, Rule, Stage};

fn stage_with_drl(name: &str) -> Arc<Stage> {
    let stage = Arc::new(Stage::new(name));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "io".into(), matches: None },
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

fn rate(stage: &Stage) -> f64 {
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
        };
        match obs.cycle {
            0 => Ok(set(5000.0)),
            1 | 3 | 5 => Err(PolicyError::Failed("no data".into())),
            2 | 4 => panic!("policy bug"),
            _ => Ok(set(0.0)),
        }
    }
}

#[test]
fn failing_policies_keep_the_last_rates_and_never_close_a_drl() {
    let stage = stage_with_drl("flaky");
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(5));
    let ctl = Controller::builder(cfg).instance("s", stage.clone()).policy(Box::new(Flaky)).start().unwrap();
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

#[test]
fn fair_share_instances_join_and_leave() {
    let a = stage_with_drl("a");
    let b = stage_with_drl("b");
    let c = stage_with_drl("c");
    let inst = |n: &str| InstanceConfig {
        name: n.into(),
        demand: Rate::bytes_per_sec(100.0).unwrap(),
        channel: "io".into(),
        object: "drl".into(),
    };
    let mut cfg = ControllerConfig::fair_share(
        PolicyKind::MaxMin,
        FairShareConfig {
            device_bandwidth: kv_stage::Bandwidth::new(1_000_000.0).unwrap(),
            instances: vec![inst("a"), inst("b")],
        },
    );
    cfg.interval = Some(Duration::from_millis(5));
    let ctl = Controller::builder(cfg).instance("a", a.clone()).instance("b", b.clone()).start().unwrap();
    let wait = |n: u64| {
        let target = ctl.cycles() + n;
        while ctl.cycles() < target {
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    wait(3);
    // Two idle instances asking for 100 B/s of 1 MB/s: each is offered half.
    assert_eq!(rate(&a), 500_000.0);
    ctl.join(inst("c"), c.clone());
    wait(3);
    assert!((rate(&c) - 1_000_000.0 / 3.0).abs() < 1.0, "{}", rate(&c));
    ctl.leave("a");
    wait(3);
    assert_eq!(rate(&b), 500_000.0);
    drop(ctl); // stops and joins
}

#[test]
fn bad_bindings_are_refused_at_start() {
    let a = stage_with_drl("a");
    let inst = InstanceConfig {
        name: "a".into(),
        demand: Rate::bytes_per_sec(100.0).unwrap(),
        channel: "io".into(),
        object: "drl".into(),
    };
    let cfg = ControllerConfig::fair_share(
        PolicyKind::Static,
        FairShareConfig { device_bandwidth: kv_stage::Bandwidth::new(1e6).unwrap(), instances: vec![inst] },
    );
    let e = Controller::builder(cfg.clone()).instance("zzz", a.clone()).start().unwrap_err();
    assert!(e.to_string().contains("fair_share.instance[0].name"), "{e}");
    let e = Controller::builder(cfg.clone()).instance("a", a.clone()).instance("b", a.clone()).start().unwrap_err();
    assert!(e.to_string().contains("unknown instance 'b'"), "{e}");
    let e = Controller::builder(cfg.clone()).start().unwrap_err();
    assert!(e.to_string().contains("instances"), "{e}");

    // The instance's DRL must exist in its stage, and be a DRL.
    let with = |channel: &str, object: &str| {
        let mut c = cfg.clone();
        let fs = c.fair_share.as_mut().unwrap();
        fs.instances[0].channel = channel.into();
        fs.instances[0].object = object.into();
        c
    };
    let e = Controller::builder(with("disk", "drl")).instance("a", a.clone()).start().unwrap_err();
    assert!(e.to_string().contains("fair_share.instance[0].channel") && e.to_string().contains("'disk'"), "{e}");
    let e = Controller::builder(with("io", "limit")).instance("a", a.clone()).start().unwrap_err();
    assert!(e.to_string().contains("fair_share.instance[0].object") && e.to_string().contains("'limit'"), "{e}");
    a.apply_rules([Rule::CreateObject {
        channel: "io".into(),
        object: "count".into(),
        spec: ObjectSpec::Noop,
        matches: Some(kv_stage::Match::request_type(kv_stage::RequestType::Sync)),
    }])
    .unwrap();
    let e = Controller::builder(with("io", "count")).instance("a", a.clone()).start().unwrap_err();
    assert!(e.to_string().contains("not a drl"), "{e}");
    Controller::builder(cfg).instance("a", a).start().unwrap().stop();
}

#[test]
fn the_memory_log_is_bounded_and_the_file_has_every_cycle() {
    let stage = stage_with_drl("bounded");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("decisions.jsonl");
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(2));
    cfg.log = Some(file.clone());
    let ctl = Controller::builder(cfg.clone()).instance("s", stage.clone()).max_log_records(3).start().unwrap();
    while ctl.cycles() < 10 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let log = ctl.stop();
    assert_eq!(log.len(), 3, "only the newest cycles are kept");
    assert!(log.windows(2).all(|w| w[1].cycle == w[0].cycle + 1));
    assert!(log[2].cycle >= 9);
    let lines = std::fs::read_to_string(&file).unwrap().lines().count() as u64;
    assert_eq!(lines, log[2].cycle + 1, "the file has every cycle");

    std::fs::remove_file(&file).unwrap();
    let ctl = Controller::builder(cfg).instance("s", stage).max_log_records(0).start().unwrap();
    while ctl.cycles() < 5 {
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(ctl.stop().is_empty());
    assert!(std::fs::read_to_string(&file).unwrap().lines().count() >= 5);
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
        Ok(Decision { settings, notes: serde_json::Value::Null })
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

/// Only +inf means unlimited. A policy asking for NaN or -inf made the
/// controller set the DRL to unlimited with no error (it failed open); it
/// is a policy error now, recorded, and the previous rate stays.
#[test]
fn nan_and_negative_infinity_are_policy_errors_that_keep_the_rate() {
    let stage = stage_with_drl("nan");
    let script = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(2));
    let ctl = Controller::builder(cfg)
        .instance("s", stage.clone())
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
#[test]
fn pressure_from_the_handle_drives_silk_with_pressure() {
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
    let handle = Arc::new(controller::WithPressure::new(stage.clone(), move || {
        controller::Pressure::new(*source.lock().unwrap(), 0.0, 0.0)
    }));
    let silk = SilkConfig {
        kvs_bandwidth: kv_stage::Bandwidth::new(60.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::Bandwidth::new(4.0 * MIB).unwrap(),
        hysteresis: Rate::bytes_per_sec(0.0).unwrap(),
        pressure: Some(controller::PressureConfig::new(kv_stage::Bandwidth::new(20.0 * MIB).unwrap())),
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
#[test]
fn silk_sees_level_pair_jobs_through_their_classes() {
    use kv_stage::{InstanceId, RequestContext as C};
    const MIB: f64 = 1048576.0;
    // The paper's layout (flush DRL, compaction channel with `l0` and `ln`
    // DRLs on the two classes), as the example rules file has it.
    let stage = Arc::new(Stage::new("pairs"));
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/../kv-stage/examples/rules/rocksdb.toml");
    stage.apply(&kv_stage::RuleSet::load(std::path::Path::new(layout)).unwrap()).unwrap();
    let silk = SilkConfig {
        kvs_bandwidth: kv_stage::Bandwidth::new(60.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::Bandwidth::new(4.0 * MIB).unwrap(),
        hysteresis: Rate::bytes_per_sec(0.0).unwrap(),
        pressure: None,
    };
    let rate = |o: &str| match stage.object("compaction", o).unwrap().spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec() / MIB,
        other => panic!("{other:?}"),
    };
    let ctl = Controller::builder(ControllerConfig::silk(silk)).instance("db", stage.clone()).start().unwrap();
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
