//! The loop itself: a failing or panicking policy keeps the previous rates
//! and the loop goes on; instances join and leave; stop is clean; bad
//! bindings are refused at start.

use std::time::Duration;

use controller::{Controller, ControllerConfig, FairShareConfig, InstanceConfig, PolicyKind, SilkConfig};
use kv_stage::{ObjectSpec, Rule, units::Rate};

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
        demand: Rate::from_bytes_per_sec(100.0).unwrap(),
        channel: "io".into(),
        object: "drl".into(),
    };
    let cfg = ControllerConfig::fair_share(
        PolicyKind::Static,
        FairShareConfig { device_bandwidth: kv_stage::units::Bandwidth::new(1e6).unwrap(), instances: vec![inst] },
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

#[test]
fn by_default_the_memory_log_keeps_the_last_thousand_cycles() {
    let stage = stage_with_drl("default_bound");
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_micros(200));
    let ctl = Controller::builder(cfg).instance("s", stage).start().unwrap();
    let t = std::time::Instant::now();
    while ctl.cycles() < 1_200 {
        assert!(t.elapsed() < Duration::from_secs(60), "{} cycles in 60 s", ctl.cycles());
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = ctl.stop();
    assert_eq!(log.len(), controller::DEFAULT_MAX_LOG);
    assert_eq!(log.len(), 1_000);
    assert!(log.windows(2).all(|w| w[1].cycle == w[0].cycle + 1), "the newest, in order");
    assert!(log[0].cycle >= 200);
}

/// A stage whose next collect fails when asked (a remote stage with a
/// network hiccup).
struct Hiccup {
    stage: std::sync::Arc<kv_stage::Stage>,
    fail: std::sync::atomic::AtomicBool,
}

impl controller::StageHandle for Hiccup {
    fn collect(&self) -> Result<kv_stage::Collection, controller::HandleError> {
        if self.fail.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return Err(controller::HandleError::Unreachable("unreachable for a moment".into()));
        }
        Ok(self.stage.collect())
    }
    fn stage_info(&self) -> Result<kv_stage::info::StageInfo, controller::HandleError> {
        Ok(self.stage.stage_info())
    }
    fn apply(&self, rules: &kv_stage::RuleSet) -> Result<kv_stage::info::ApplyReport, controller::HandleError> {
        Ok(self.stage.apply(rules)?)
    }
    fn object(&self, channel: &str, object: &str) -> Option<std::sync::Arc<dyn controller::ObjectControl>> {
        self.stage
            .object(channel, object)
            .map(|h| std::sync::Arc::new(h) as std::sync::Arc<dyn controller::ObjectControl>)
    }
}

/// A stage that cannot be read in one cycle is left out of it, and the
/// next cycle's rates span the gap: not a false zero (which a fair-share
/// policy would read as an idle tenant and cut to its floor).
#[test]
fn a_stage_missed_for_a_cycle_is_left_out_and_its_rates_span_the_gap() {
    use kv_stage::{Context, RequestContext, RequestType};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stage = stage_with_drl("hiccup");
    let handle = Arc::new(Hiccup { stage: Arc::clone(&stage), fail: AtomicBool::new(false) });
    let mut cfg = ControllerConfig::silk(SilkConfig::default());
    cfg.interval = Some(Duration::from_millis(20));
    let ctl = Controller::builder(cfg).instance("s", handle.clone()).start().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stage, stop) = (Arc::clone(&stage), Arc::clone(&stop));
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(10) {
                let _ = stage.enforce(&Context::new(RequestType::Write, 1000).in_context(RequestContext::FOREGROUND));
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    while ctl.cycles() < 5 {
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.fail.store(true, Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    let log = loop {
        let log = ctl.log();
        if let Some(i) = log.iter().position(|r| r.inputs[0].error.is_some())
            && log.len() > i + 1
        {
            break log;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no failed cycle");
        std::thread::sleep(Duration::from_millis(5));
    };
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    ctl.stop();
    let i = log.iter().position(|r| r.inputs[0].error.is_some()).unwrap();
    assert!(log[i].inputs[0].error.as_deref().unwrap().contains("unreachable"));
    assert!(log[i].inputs[0].context_bps.is_empty(), "the failed cycle has no rates");
    let after = controller::context_rate(&log[i + 1].inputs[0], RequestContext::FOREGROUND);
    assert!(after > 100_000.0, "the cycle after the gap saw {after} B/s of foreground writes");
}

/// The default controller on the paper's layout, in its loop: no limit
/// while nothing is busy; a flood of flush bytes makes the device busy and
/// the flush DRL falls to the calm budget (a third of `D`) while the
/// others keep the floor; a stall precursor (pressure 0.95) gives the
/// flush all that the client leaves of `D` even without a backlog; when the
/// client leaves, everything is unlimited again after `hold`, though the
/// flood goes on (nobody to protect).
#[test]
fn the_adaptive_policy_limits_only_while_busy_and_promotes_near_a_stall() {
    use controller::{AdaptiveConfig, Pressure, WithPressure};
    use kv_stage::{Context, InstanceId, RequestContext as C, RequestType};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const MIB: f64 = 1048576.0;
    let stage = Arc::new(kv_stage::Stage::new("db"));
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/../kv-stage/examples/rules/rocksdb.toml");
    stage.apply(&kv_stage::RuleSet::load(std::path::Path::new(layout)).unwrap()).unwrap();
    let pressure = Arc::new(AtomicU64::new(0f64.to_bits()));
    let p = Arc::clone(&pressure);
    let handle = Arc::new(WithPressure::new(stage.clone(), move || {
        Pressure::new(f64::from_bits(p.load(Ordering::Relaxed)), 0.0, 0.0)
    }));
    let config = AdaptiveConfig {
        device_bandwidth: kv_stage::units::Bandwidth::new(60.0 * MIB).unwrap(),
        min_bandwidth: kv_stage::units::Bandwidth::new(4.0 * MIB).unwrap(),
        hold: Duration::from_millis(100),
        ..AdaptiveConfig::default()
    };
    // Every cycle kept (the test asserts on the first one, however slow the machine).
    let ctl = Controller::builder(ControllerConfig::adaptive(config))
        .instance("db", handle)
        .max_log_records(1 << 20)
        .start()
        .unwrap();
    let rate = |c: &str, o: &str| match stage.object(c, o).unwrap().spec() {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec() / MIB,
        other => panic!("{other:?}"),
    };
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: flush {} l0 {} ln {} MiB/s",
                rate("flush", "drl"),
                rate("compaction", "l0"),
                rate("compaction", "ln")
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    let unlimited = || {
        rate("flush", "drl").is_infinite()
            && rate("compaction", "l0").is_infinite()
            && rate("compaction", "ln").is_infinite()
    };
    // A new instance starts contended for `hold` (100 ms), then, with no
    // traffic, is healthy: nothing limited.
    wait("healthy after the start's hold", &unlimited);
    // A client reads 4 KiB about every millisecond (light: well below
    // `busy_foreground_ops`), and a flush floods the device (256 KiB
    // requests, as fast as the flush DRL lets them through); both bounded
    // in time.
    stage.job_started(InstanceId(0), C::BG_FLUSH);
    let stop = AtomicBool::new(false);
    let clients_stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (stage, stop, clients_stop) = (&stage, &stop, &clients_stop);
        s.spawn(move || {
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !clients_stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                stage.enforce(&Context::new(RequestType::Read, 4096)).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        s.spawn(move || {
            let _scope = kv_stage::ContextScope::enter(C::BG_FLUSH);
            let until = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                stage.enforce(&Context::new(RequestType::Write, 256 << 10)).unwrap();
            }
        });
        wait("busy: the flush at the calm budget", &|| {
            (rate("flush", "drl") - 20.0).abs() < 1e-6
                && rate("compaction", "l0") == 4.0
                && rate("compaction", "ln") == 4.0
        });
        // A stall nears: the flush gets all that the client leaves of D,
        // L0 and LN the floor.
        pressure.store(0.95f64.to_bits(), Ordering::Relaxed);
        wait("promoted", &|| {
            let f = rate("flush", "drl");
            f > 55.0 && f <= 60.0 && rate("compaction", "l0") == 4.0 && rate("compaction", "ln") == 4.0
        });
        pressure.store(0f64.to_bits(), Ordering::Relaxed);
        wait("busy again: the calm budget", &|| (rate("flush", "drl") - 20.0).abs() < 1e-6);
        // The client leaves while the flush still floods its limit: with
        // nobody to protect, the binding limit no longer keeps the
        // instance contended, and the flush runs unlimited after `hold`.
        clients_stop.store(true, Ordering::Relaxed);
        wait("no clients: unlimited while the flush still floods", &unlimited);
        stop.store(true, Ordering::Relaxed);
    });
    stage.job_finished(InstanceId(0), C::BG_FLUSH);
    // Quiet again: unlimited after the hold.
    wait("healthy again", &unlimited);
    let log = ctl.stop();
    let modes: Vec<String> =
        log.iter().map(|r| serde_json::to_value(r).unwrap()["notes"][0]["mode"].as_str().unwrap().to_owned()).collect();
    for m in ["healthy", "contended", "promoted"] {
        assert!(modes.iter().any(|x| x == m), "no {m} cycle in {modes:?}");
    }
    assert_eq!(modes[0], "contended", "the first cycle starts contended");
}

#[test]
fn silk_refuses_to_start_on_a_stage_with_nothing_to_drive() {
    let stage = std::sync::Arc::new(kv_stage::Stage::new("bare"));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: None },
            Rule::CreateObject { channel: "fg".into(), object: "noop".into(), spec: ObjectSpec::Noop, matches: None },
        ])
        .unwrap();
    for cfg in [ControllerConfig::silk(SilkConfig::default()), ControllerConfig::adaptive(Default::default())] {
        // `Arc::clone(&stage)` as a handle (it did not compile when
        // `instance` took `Arc<dyn StageHandle>`: E0308).
        let e = Controller::builder(cfg).instance("db", std::sync::Arc::clone(&stage)).start().unwrap_err().to_string();
        assert!(e.contains("instance 'db'") && e.contains("stage 'bare' has none (channels: default, fg)"), "{e}");
        assert!(e.contains("RocksLayout"), "{e}");
    }
}

/// Calm hours cost next to nothing: while the default controller's store
/// runs no job, the loop sleeps for `idle_interval` (here 60 s, so no cycle
/// runs while the test watches), also while the store is contended (a new
/// instance is contended for `hold`, here 60 s: the whole test), a job's
/// start on the stage wakes it at once, it cycles at its interval while the
/// job runs, and it goes back to sleep once the job has ended.
#[test]
fn the_adaptive_loop_sleeps_while_no_job_runs_and_a_job_start_wakes_it() {
    use controller::AdaptiveConfig;
    use kv_stage::{InstanceId, RequestContext as C};
    use std::sync::Arc;
    use std::time::Instant;
    let stage = Arc::new(kv_stage::Stage::new("db"));
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/../kv-stage/examples/rules/rocksdb.toml");
    stage.apply(&kv_stage::RuleSet::load(std::path::Path::new(layout)).unwrap()).unwrap();
    let config = AdaptiveConfig {
        hold: Duration::from_secs(60),
        idle_interval: Duration::from_secs(60),
        ..AdaptiveConfig::default()
    };
    let ctl =
        Controller::builder(ControllerConfig::adaptive(config)).instance("db", Arc::clone(&stage)).start().unwrap();
    // Waits (at most 20 s) until the cycle count stops moving for 300 ms:
    // at the 10 ms interval that would be about 30 cycles.
    let settled = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let before = ctl.cycles();
            std::thread::sleep(Duration::from_millis(300));
            if ctl.cycles() == before {
                return before;
            }
            assert!(Instant::now() < deadline, "{what}: the loop never slept ({} cycles)", ctl.cycles());
        }
    };
    let asleep = settled("contended, no job");
    let last = ctl.log().last().cloned().expect("a cycle ran");
    assert_eq!(last.notes[0]["mode"], "contended", "{:?}", last.notes);
    // A flush begins: the loop wakes long before its 60 s sleep ends.
    stage.job_started(InstanceId(0), C::BG_FLUSH);
    let woke = Instant::now();
    while ctl.cycles() == asleep {
        assert!(woke.elapsed() < Duration::from_secs(10), "a job's start did not wake the loop");
        std::thread::sleep(Duration::from_millis(5));
    }
    // While the job runs, the loop cycles at its interval.
    let running = ctl.cycles();
    std::thread::sleep(Duration::from_millis(500));
    assert!(ctl.cycles() >= running + 5, "{} cycles in 500 ms while a flush ran", ctl.cycles() - running);
    let during = ctl.log().last().cloned().expect("cycles ran");
    assert_eq!(during.notes[0]["running"]["flush"], 1, "{:?}", during.notes);
    // The job ends: asleep again after its next cycle.
    stage.job_finished(InstanceId(0), C::BG_FLUSH);
    settled("after the job");
    let records = ctl.stop();
    assert!(records.iter().any(|r| r.interval_ms >= 200.0), "no cycle came after a sleep");
}
