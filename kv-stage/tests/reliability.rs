//! Regression tests for defects found in review: waiters stranded by a unit
//! change, counter slots that never came back, and contexts registered by
//! rules that were rejected.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kv_stage::{
    Context, DrlSpec, EnforceError, ObjectChange, ObjectSpec, RequestContext, RequestType, Rule, RuleSet, RulesFormat,
    Stage, object::Outcome, units::Rate,
};

/// Waits up to `limit` for a thread; `None` if it is still running.
fn join_within<T>(h: JoinHandle<T>, limit: Duration) -> Option<T> {
    let deadline = Instant::now() + limit;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(h.join().expect("thread panicked"))
}

fn drl_stage(rate: Rate) -> Arc<Stage> {
    let stage = Arc::new(Stage::new("reliability"));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "c".into(), matches: Some(kv_stage::Match::any()) },
            Rule::CreateObject {
                channel: "c".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(rate)),
                matches: None,
            },
        ])
        .unwrap();
    stage
}

fn spawn_enforce(stage: &Arc<Stage>, size: u64) -> JoinHandle<Result<Outcome, EnforceError>> {
    let stage = Arc::clone(stage);
    std::thread::spawn(move || stage.enforce(&Context::new(RequestType::Write, size)))
}

/// A 1 MiB request waits in a 1 MiB/s DRL; the DRL is switched to 100 ops/s.
/// The waiter, and a new request, must go at the new rate (a few ms), not
/// after the old unit's ticket of a million tokens is paid at 100/s (about
/// 9,300 s).
#[test]
fn switching_a_drl_from_bytes_to_ops_does_not_strand_waiters() {
    let stage = drl_stage(Rate::from_bytes_per_sec(1048576.0).unwrap());
    // Drain the initial burst so the next request waits.
    stage.enforce(&Context::new(RequestType::Write, 10_485)).unwrap();
    let waiter = spawn_enforce(&stage, 1 << 20);
    let t0 = Instant::now();
    while stage.collect().object("c", "drl").unwrap().stats.waiting == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the 1 MiB request never started waiting");
        std::thread::sleep(Duration::from_millis(2));
    }
    stage.configure("c", "drl", ObjectChange::rate("100ops/s".parse().unwrap())).unwrap();
    let switched = Instant::now();
    let Some(result) = join_within(waiter, Duration::from_secs(2)) else {
        // Unstick it before failing, so the test process can exit.
        stage.configure("c", "drl", ObjectChange::rate(Rate::UNLIMITED)).unwrap();
        panic!("the waiter is still held 2 s after the switch to 100 ops/s");
    };
    result.unwrap();
    let waited = switched.elapsed();
    // A new request, at 100 ops/s with a 1-op burst, waits at most ~10 ms
    // behind the re-based waiter.
    let fresh = spawn_enforce(&stage, 1 << 20);
    let Some(result) = join_within(fresh, Duration::from_secs(2)) else {
        stage.configure("c", "drl", ObjectChange::rate(Rate::UNLIMITED)).unwrap();
        panic!("a new request is held 2 s after the switch to 100 ops/s");
    };
    result.unwrap();
    eprintln!("waiter admitted {waited:?} after the switch");
    // And back to bytes: an ops-era request does not strand a byte request.
    stage.configure("c", "drl", ObjectChange::rate("1MiB/s".parse().unwrap())).unwrap();
    let back = spawn_enforce(&stage, 4096);
    assert!(join_within(back, Duration::from_secs(2)).is_some(), "a 4 KiB request is held after switching back");
}

/// Creating and removing one object over and over must not exhaust the
/// stage: a removed object's counter slot is reused (about 4,094 cycles
/// used to fail).
#[test]
fn counter_slots_are_reused_after_removal() {
    let stage = Stage::new("slots");
    stage.apply_rules([Rule::CreateChannel { channel: "c".into(), matches: Some(kv_stage::Match::any()) }]).unwrap();
    let mut last_incarnation = None;
    for i in 0..5_000u64 {
        stage
            .apply_rules([Rule::CreateObject {
                channel: "c".into(),
                object: "o".into(),
                spec: ObjectSpec::Noop,
                matches: None,
            }])
            .unwrap_or_else(|e| panic!("cycle {i}: {e}"));
        // The new incarnation starts from zero, whatever its slot counted before.
        stage.enforce(&Context::new(RequestType::Read, i + 1)).unwrap();
        let stats = stage.collect();
        let o = stats.object("c", "o").unwrap();
        assert_eq!((o.counter.ops, o.counter.bytes), (1, i + 1), "cycle {i}: counters did not restart");
        assert_ne!(Some(o.incarnation), last_incarnation, "cycle {i}: incarnation did not change");
        last_incarnation = Some(o.incarnation);
        stage.apply_rules([Rule::RemoveObject { channel: "c".into(), object: "o".into() }]).unwrap();
    }
    // The channel counted every request exactly once throughout.
    assert_eq!(stage.collect().channel("c").unwrap().ops, 5_000);
}

fn toml_rules(text: &str) -> kv_stage::Result<RuleSet> {
    RuleSet::parse(text, RulesFormat::Toml, Some("test.toml".into()), &Default::default())
}

/// A rules file that fails to parse registers none of its contexts.
#[test]
fn a_rejected_rules_file_registers_no_context() {
    let text = r#"
version = 1
contexts = ["rejected-at-parse"]
[[rules]]
op = "create_channel"
channel = "t"
match = { context = "rejected-at-parse" }
[[rules]]
op = "create_object"
channel = "t"
object = "d"
spec = { kind = "drl", rate = "-5" }
"#;
    let err = toml_rules(text).unwrap_err();
    assert!(err.to_string().contains("test.toml"), "{err}");
    assert_eq!(RequestContext::lookup("rejected-at-parse"), None, "a rejected file registered its context");
}

/// Rules that parse but fail to apply register none of their contexts
/// either; applied rules do.
#[test]
fn contexts_are_registered_only_when_their_rules_apply() {
    let stage = Stage::new("contexts");
    let text = r#"
version = 1
contexts = ["rejected-at-apply"]
[[rules]]
op = "route"
channel = "no-such-channel"
match = { context = "rejected-at-apply" }
"#;
    let set = toml_rules(text).unwrap();
    assert!(stage.apply(&set).is_err());
    drop(set);
    assert_eq!(RequestContext::lookup("rejected-at-apply"), None, "a rejected batch registered its context");

    let good = r#"
version = 1
contexts = ["applied-ctx"]
[[rules]]
op = "create_channel"
channel = "t"
match = { context = "applied-ctx" }
"#;
    let set = toml_rules(good).unwrap();
    stage.apply(&set).unwrap();
    drop(set);
    let ctx = RequestContext::lookup("applied-ctx").expect("applied rules register their context");
    stage.enforce(&Context::new(RequestType::Write, 7).in_context(ctx)).unwrap();
    assert_eq!(stage.collect().channel("t").unwrap().bytes, 7);
}
