//! Waiting, waking and failing: closed DRLs, rate changes, removal,
//! shutdown, and failed enforcement reaching layer callers as I/O errors.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_stage::{
    Context, DrlSpec, Match, ObjectChange, ObjectSpec, RequestContext as C, RequestType as T, Rule, Stage,
    errors::{EnforceErrorKind, Rejection},
    layer::{KvStore, MemKv, StagedFile, StagedKv},
    object::{EnforcementObject, Outcome},
    units::Rate,
};

fn stage_with_closed_drl() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("lifecycle"));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(C::BG_FLUSH)) },
            Rule::CreateObject {
                channel: "flush".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::from_bytes_per_sec(0.0).unwrap())),
                matches: None,
            },
        ])
        .unwrap();
    stage
}

fn spawn_waiters(
    stage: &Arc<Stage>,
    n: usize,
) -> Vec<std::thread::JoinHandle<Result<Outcome, kv_stage::EnforceError>>> {
    (0..n)
        .map(|_| {
            let stage = Arc::clone(stage);
            std::thread::spawn(move || stage.enforce(&Context::new(T::Write, 4096).in_context(C::BG_FLUSH)))
        })
        .collect()
}

fn wait_until_waiting(stage: &Stage, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while stage.object("flush", "drl").unwrap().stats().waiting < n {
        assert!(Instant::now() < deadline, "waiters never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn closed_drl_holds_requests_until_the_rate_changes() {
    let stage = stage_with_closed_drl();
    let waiters = spawn_waiters(&stage, 4);
    wait_until_waiting(&stage, 4);
    std::thread::sleep(Duration::from_millis(50));
    assert!(waiters.iter().all(|w| !w.is_finished()), "a closed DRL admitted a request");
    stage.configure("flush", "drl", ObjectChange::rate(Rate::from_bytes_per_sec(1e9).unwrap())).unwrap();
    for w in waiters {
        let outcome = w.join().unwrap().expect("admitted after the rate change");
        assert!(outcome.waited >= Duration::from_millis(50));
    }
    assert_eq!(stage.collect().channel("flush").unwrap().ops, 4);
}

#[test]
fn shutdown_fails_every_waiter_and_every_later_request() {
    let stage = stage_with_closed_drl();
    let waiters = spawn_waiters(&stage, 8);
    wait_until_waiting(&stage, 8);
    stage.shutdown();
    for w in waiters {
        let e = w.join().unwrap().expect_err("a waiter must fail on shutdown");
        assert_eq!(e.kind(), EnforceErrorKind::ShutDown);
        assert_eq!(e.object(), Some("flush/drl"));
    }
    let e = stage.enforce(&Context::new(T::Read, 1)).unwrap_err();
    assert_eq!(e.kind(), EnforceErrorKind::ShutDown);
    assert!(stage.apply_rules([Rule::CreateChannel { channel: "x".into(), matches: None }]).is_err());
}

#[test]
fn removing_an_object_releases_its_waiters() {
    let stage = stage_with_closed_drl();
    let waiters = spawn_waiters(&stage, 3);
    wait_until_waiting(&stage, 3);
    stage.apply_rules([Rule::RemoveObject { channel: "flush".into(), object: "drl".into() }]).unwrap();
    for w in waiters {
        w.join().unwrap().expect("released, not failed");
    }
    // Later requests pass through the channel, which has no object now.
    assert_eq!(stage.select(&Context::new(T::Write, 1).in_context(C::BG_FLUSH)).1, None);
}

/// Refuses writes, admits everything else: a failing device for tests.
struct RefuseWrites;

impl EnforcementObject for RefuseWrites {
    fn kind(&self) -> &'static str {
        "refuse-writes"
    }
    fn validate(&self, _: &ObjectChange) -> Result<(), kv_stage::FieldError> {
        Ok(())
    }
    fn configure(&self, _: &ObjectChange) {}
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        if matches!(ctx.request_type, T::Write | T::Put) {
            Err(Rejection::Failed("writes are refused".into()))
        } else {
            Ok(Outcome::IMMEDIATE)
        }
    }
}

#[test]
fn a_failed_enforcement_reaches_the_file_caller_and_nothing_is_written() {
    let stage = Arc::new(Stage::new("files"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let mut f = StagedFile::create(Arc::clone(&stage), &path).unwrap();
    f.write_all(b"before").unwrap();
    stage.create_custom_object("default", "refuse", Arc::new(RefuseWrites), None).unwrap();
    let e = f.write_all(b"after").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(e.to_string().contains("writes are refused"), "{e}");
    let inner = e.get_ref().and_then(|i| i.downcast_ref::<kv_stage::EnforceError>()).expect("the stage's error");
    assert_eq!(inner.kind(), kv_stage::errors::EnforceErrorKind::Refused);
    f.sync_all().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), b"before");
    let mut s = String::new();
    StagedFile::open(Arc::clone(&stage), &path).unwrap().read_to_string(&mut s).unwrap();
    assert_eq!(s, "before");
}

#[test]
fn file_requests_carry_their_context() {
    let stage = Arc::new(Stage::new("ctx"));
    stage
        .apply_rules([Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(C::BG_FLUSH)) }])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut f = StagedFile::create(Arc::clone(&stage), dir.path().join("sst")).unwrap().with_context(C::BG_FLUSH);
    f.write_all(&[7u8; 1000]).unwrap();
    let mut g = StagedFile::create(Arc::clone(&stage), dir.path().join("wal")).unwrap();
    kv_stage::with_context(C::BG_FLUSH, || g.write_all(&[1u8; 10])).unwrap();
    g.write_all(&[1u8; 20]).unwrap();
    let stats = stage.collect();
    assert_eq!(stats.channel("flush").unwrap().bytes, 1010);
    assert_eq!(stats.context(C::FOREGROUND).bytes, 20);
}

#[test]
fn kv_layer_enforces_before_the_store_sees_the_call() {
    let stage = Arc::new(Stage::new("kv"));
    let kv = StagedKv::new(MemKv::default(), Arc::clone(&stage));
    kv.put(b"a", b"1").unwrap();
    stage.create_custom_object("default", "refuse", Arc::new(RefuseWrites), None).unwrap();
    assert!(kv.put(b"b", b"2").is_err());
    assert_eq!(kv.inner().len(), 1, "a refused put must not reach the store");
    assert_eq!(kv.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    let mut seen = Vec::new();
    kv.scan(b"", 10, &mut |k, _| seen.push(k.to_vec())).unwrap();
    assert_eq!(seen, vec![b"a".to_vec()]);
}

fn spawn_instance_waiter(
    stage: &Arc<Stage>,
    instance: u16,
    size: u64,
) -> std::thread::JoinHandle<Result<Outcome, kv_stage::EnforceError>> {
    let stage = Arc::clone(stage);
    std::thread::spawn(move || {
        stage.enforce(&Context::new(T::Write, size).in_context(C::BG_FLUSH).in_instance(kv_stage::InstanceId(instance)))
    })
}

/// Closing an instance admits, at once, every request of it that waits in
/// any object (here a DRL at rate 0), and holds none of its later ones;
/// other instances' requests keep waiting. Opening it again restores its
/// limits.
#[test]
fn closing_an_instance_admits_its_waiters_and_only_its() {
    let stage = stage_with_closed_drl();
    let mine: Vec<_> = (0..3).map(|_| spawn_instance_waiter(&stage, 1, 4096)).collect();
    let other = spawn_instance_waiter(&stage, 2, 4096);
    wait_until_waiting(&stage, 4);
    let t = Instant::now();
    stage.close_instance(kv_stage::InstanceId(1));
    for w in mine {
        w.join().unwrap().expect("a closing instance's waiter is admitted");
    }
    let released = t.elapsed();
    assert!(released < Duration::from_secs(1), "closing took {released:?} to release its waiters");
    // A later request of the closed instance is not held either.
    spawn_instance_waiter(&stage, 1, 1 << 20).join().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(!other.is_finished(), "closing instance 1 released instance 2's request");
    assert_eq!(stage.object("flush", "drl").unwrap().stats().waiting, 1);

    // Open again: instance 1 is held like everyone else; the stage refuses
    // a second open of the same instance.
    stage.open_instance(kv_stage::InstanceId(1), "db-1").unwrap();
    let err = stage.open_instance(kv_stage::InstanceId(1), "db-1-again").unwrap_err().to_string();
    assert!(err.contains("already open (by db-1)"), "{err}");
    let again = spawn_instance_waiter(&stage, 1, 4096);
    wait_until_waiting(&stage, 2);
    // Objects created while an instance is closed know it too.
    stage.close_instance(kv_stage::InstanceId(1));
    again.join().unwrap().unwrap();
    stage
        .apply_rules([Rule::CreateObject {
            channel: "flush".into(),
            object: "late".into(),
            spec: ObjectSpec::Drl(DrlSpec::new(Rate::from_bytes_per_sec(0.0).unwrap())),
            matches: Some(Match::request_type(T::Sync)),
        }])
        .unwrap();
    stage
        .enforce(&Context::new(T::Sync, 1).in_context(C::BG_FLUSH).in_instance(kv_stage::InstanceId(1)))
        .expect("the new object does not hold a closed instance");
    stage.shutdown();
    assert!(other.join().unwrap().is_err());
}

/// Shutting the stage down releases (fails) the waiters of every instance.
#[test]
fn shutdown_fails_the_waiters_of_every_instance() {
    let stage = stage_with_closed_drl();
    let waiters: Vec<_> = (0..4).map(|i| spawn_instance_waiter(&stage, i, 4096)).collect();
    wait_until_waiting(&stage, 4);
    stage.shutdown();
    for w in waiters {
        let e = w.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), EnforceErrorKind::ShutDown);
    }
}
