//! The loop itself: a failing or panicking policy keeps the previous rates
//! and the loop goes on; instances join and leave; stop is clean; bad
//! bindings are refused at start.

use std::time::Duration;

use controller::{Controller, ControllerConfig, FairShareConfig, InstanceConfig, PolicyKind, SilkConfig};
use kv_stage::{ObjectSpec, Rate, Rule};

mod scenarios;
use scenarios::stage_with_drl;

#[test]
fn failing_policies_keep_the_last_rates_and_never_close_a_drl() {
    scenarios::failing_policies_keep_the_last_rates_and_never_close_a_drl(&scenarios::InProcess);
}

#[test]
fn fair_share_instances_join_and_leave() {
    scenarios::fair_share_instances_join_and_leave(&scenarios::InProcess);
}

#[test]
fn nan_and_negative_infinity_are_policy_errors_that_keep_the_rate() {
    scenarios::nan_and_negative_infinity_are_policy_errors_that_keep_the_rate(&scenarios::InProcess);
}

#[test]
fn pressure_from_the_handle_drives_silk_with_pressure() {
    scenarios::pressure_from_the_handle_drives_silk_with_pressure(&scenarios::InProcess);
}

#[test]
fn silk_sees_level_pair_jobs_through_their_classes() {
    scenarios::silk_sees_level_pair_jobs_through_their_classes(&scenarios::InProcess);
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
