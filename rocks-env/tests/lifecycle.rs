//! Closing, failing and reopening DBs on a stage: nothing hangs, no job
//! state is left behind, and what RocksDB does next is tagged right.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use kv_stage::{
    Context, FieldError, InstanceId, Match, ObjectChange, ObjectSpec, RequestContext as C, RequestType, Rule, Stage,
    errors::Rejection,
    info::ObjectHandle,
    object::{EnforcementObject, Outcome},
    units::Rate,
};
use rocks_env::{RocksLayout, StagedDb};

/// Waits up to `limit` for a thread; `None` if it is still running.
fn join_within<T>(h: JoinHandle<T>, limit: Duration) -> Option<T> {
    let deadline = Instant::now() + limit;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Some(h.join().expect("thread panicked"))
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Tests here hold RocksDB's pool threads (process-wide, shared by every
/// DB) in throttled objects; with the defaults' single flush thread, one
/// test's held flush would queue another's.
fn wide_pools() {
    let mut env = rocksdb::Env::new().unwrap();
    env.set_high_priority_background_threads(4);
    env.set_background_threads(4);
}

fn closed() -> ObjectChange {
    ObjectChange::rate(Rate::from_bytes_per_sec(0.0).unwrap())
}

fn unlimited() -> ObjectChange {
    ObjectChange::rate(Rate::UNLIMITED)
}

/// Writes `n` keys of 1 KiB and asks for a flush without waiting for it.
fn write_and_start_flush(db: &StagedDb, n: u64) {
    for i in 0..n {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    let mut f = rocksdb::FlushOptions::default();
    f.set_wait(false);
    db.flush_opt(&f).unwrap();
}

/// Drops `db` on another thread; fails (after opening `unstick`, so the
/// process can still exit) if that takes a second or more.
fn drop_within_a_second(db: StagedDb, unstick: &[&ObjectHandle]) -> Duration {
    let t = Instant::now();
    let h = std::thread::spawn(move || drop(db));
    if join_within(h, Duration::from_secs(1)).is_none() {
        for o in unstick {
            o.configure(&unlimited()).unwrap();
        }
        panic!("dropping the DB took over a second: it waits on the throttled stage");
    }
    t.elapsed()
}

/// A flush waits in a DRL at rate 0; RocksDB's close waits for it. Closing
/// the DB must admit it at once.
#[test]
fn drop_returns_while_a_flush_waits_in_a_closed_drl() {
    wide_pools();
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("drop"));
    let layout = RocksLayout::new().install(&stage).unwrap();
    layout.flush.configure(&closed()).unwrap();
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    write_and_start_flush(&db, 200);
    wait_for("the flush to wait in its DRL", Duration::from_secs(10), || layout.flush.stats().waiting > 0);
    let took = drop_within_a_second(db, &[&layout.flush]);
    eprintln!("drop took {took:?} with a flush held at rate 0");
    // Reopen: the flushed data (or the WAL) has every key.
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    assert_eq!(db.get(key(199)).unwrap().as_deref(), Some(&value(199, 1024)[..]));
}

/// Two DBs on one stage each have a flush waiting at rate 0; shutting the
/// stage down fails both waits, and both DBs drop at once.
#[test]
fn stage_shutdown_releases_the_waiters_of_every_db() {
    wide_pools();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stage = Arc::new(Stage::new("shutdown"));
    let l1 = RocksLayout::for_instance(InstanceId(1), "db1.").install(&stage).unwrap();
    let l2 = RocksLayout::for_instance(InstanceId(2), "db2.").install(&stage).unwrap();
    l1.flush.configure(&closed()).unwrap();
    l2.flush.configure(&closed()).unwrap();
    let open = |d: &tempfile::TempDir, i| {
        StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).instance(InstanceId(i)).open(d.path()).unwrap()
    };
    let (db1, db2) = (open(&d1, 1), open(&d2, 2));
    write_and_start_flush(&db1, 200);
    write_and_start_flush(&db2, 200);
    wait_for("both flushes to wait", Duration::from_secs(10), || {
        l1.flush.stats().waiting > 0 && l2.flush.stats().waiting > 0
    });
    stage.shutdown();
    drop_within_a_second(db1, &[&l1.flush]);
    drop_within_a_second(db2, &[&l2.flush]);
}

/// Refuses the writes of one request context; counts the deletes of every
/// context.
struct RefuseWrites {
    context: C,
    armed: AtomicBool,
}

impl EnforcementObject for RefuseWrites {
    fn kind(&self) -> &'static str {
        "refuse-writes"
    }
    fn validate(&self, _: &ObjectChange) -> Result<(), FieldError> {
        Ok(())
    }
    fn configure(&self, _: &ObjectChange) {}
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        if self.armed.load(Ordering::Relaxed) && ctx.context == self.context && ctx.request_type == RequestType::Write {
            return Err(Rejection::Failed("refused by the test".into()));
        }
        Ok(Outcome::IMMEDIATE)
    }
}

/// The accounting stage of `common`, with flush writes refused while armed.
fn refusing_stage() -> (Arc<Stage>, Arc<RefuseWrites>) {
    let stage = accounting_stage();
    let refuse = Arc::new(RefuseWrites { context: C::BG_FLUSH, armed: AtomicBool::new(false) });
    stage.apply_rules([Rule::RemoveObject { channel: "flush".into(), object: "writes".into() }]).unwrap();
    stage
        .create_custom_object("flush", "writes", refuse.clone(), Some(Match::request_type(RequestType::Write)))
        .unwrap();
    for (_, ch) in CONTEXTS {
        stage
            .apply_rules([Rule::CreateObject {
                channel: ch.into(),
                object: "deletes".into(),
                spec: ObjectSpec::Noop,
                matches: Some(Match::request_type(RequestType::Delete)),
            }])
            .unwrap();
    }
    (stage, refuse)
}

fn deletes(stage: &Stage, channel: &str) -> u64 {
    stage.collect().object(channel, "deletes").map_or(0, |o| o.counter.ops)
}

/// RocksDB reports a flush's begin but not its end when the flush fails.
/// Afterwards no flush may count as running, and the purge that removes the
/// failed flush's table file is background work, not the flush.
#[test]
fn a_refused_flush_leaves_no_running_job_and_its_cleanup_is_background() {
    wide_pools();
    let dir = tempfile::tempdir().unwrap();
    let (stage, refuse) = refusing_stage();
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    for i in 0..200u64 {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    refuse.armed.store(true, Ordering::Relaxed);
    let err = db.flush().expect_err("the flush writes are refused");
    eprintln!("flush failed as expected: {err}");
    refuse.armed.store(false, Ordering::Relaxed);
    // RocksDB reports the failure as a background error, on the flush thread.
    wait_for("the background error", Duration::from_secs(10), || db.background_errors().count > 0);
    wait_for("the failed flush's task to end", Duration::from_secs(10), || db.jobs().flush.retired > 0);
    let running = stage.collect().jobs(C::BG_FLUSH).counts.running;
    assert_eq!(running, 0, "the failed flush still counts as running on the stage");
    assert_eq!(db.jobs().flush.counts.running, 0, "the failed flush still counts as running in the DB");
    drop(db);

    // Reopen on the same stage. A flush now succeeds; the purge that deletes
    // its obsolete WAL runs after the flush, in the flush task: background
    // work, neither the flush (a stale tag) nor a client.
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    assert_eq!(db.get(key(199)).unwrap().as_deref(), Some(&value(199, 1024)[..]));
    let before = [deletes(&stage, "fg"), deletes(&stage, "flush"), deletes(&stage, "bg")];
    for i in 0..200u64 {
        db.put(key(1000 + i), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    wait_idle(&db, Duration::from_secs(20));
    let after = [deletes(&stage, "fg"), deletes(&stage, "flush"), deletes(&stage, "bg")];
    assert_eq!(after[0], before[0], "the WAL purge after a flush was tagged foreground");
    assert_eq!(after[1], before[1], "the WAL purge after a flush was tagged as the flush");
    assert!(after[2] > before[2], "the WAL purge after a flush was not tagged background");
    assert_eq!(stage.collect().jobs(C::BG_FLUSH).counts.running, 0);
}

/// Two DBs share a stage, each with its own layout. The first closes while
/// one of its compactions is throttled mid-way (RocksDB skips every
/// completion report once shutdown starts): afterwards no compaction
/// counts as running, the second DB runs on, and the first reopens on the
/// same stage.
#[test]
fn a_db_closed_mid_compaction_leaves_no_running_job_on_a_shared_stage() {
    wide_pools();
    let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let stage = Arc::new(Stage::new("shared"));
    let l1 = RocksLayout::for_instance(InstanceId(1), "db1.").install(&stage).unwrap();
    RocksLayout::for_instance(InstanceId(2), "db2.").install(&stage).unwrap();
    // Slow enough that the compaction is mid-way when the DB closes.
    l1.compaction_l0.configure(&ObjectChange::rate(Rate::from_bytes_per_sec(256.0 * 1024.0).unwrap())).unwrap();
    let open = |d: &tempfile::TempDir, i| {
        StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).instance(InstanceId(i)).open(d.path()).unwrap()
    };
    let db1 = open(&d1, 1);
    let db2 = open(&d2, 2);
    // Two flushes of keys spread over the whole key space make overlapping
    // L0 files: a real (not trivially moved) L0->L1 compaction starts.
    let mut rng = Lcg(5);
    for round in 0..2u64 {
        for _ in 0..600u64 {
            let i = 10 + rng.next() % 5000;
            db1.put(key(i), value(i + round, 1024)).unwrap();
        }
        db1.put(key(5), value(6 + round, 1024)).unwrap();
        db1.flush().unwrap();
    }
    wait_for("db1's L0 compaction", Duration::from_secs(20), || {
        stage.collect().jobs(C::BG_COMPACTION_L0_L1).counts.running > 0
    });
    std::thread::sleep(Duration::from_millis(300));
    drop_within_a_second(db1, &[&l1.compaction_l0]);
    let jobs = stage.collect().jobs(C::BG_COMPACTION_L0_L1);
    assert_eq!(jobs.counts.running, 0, "db1's compaction still counts as running after db1 closed: {jobs:?}");

    // db2 goes on: its flush is counted as its flush, and it ends.
    for i in 0..300u64 {
        db2.put(key(i), value(i, 1024)).unwrap();
    }
    db2.flush().unwrap();
    wait_for("db2's flush to end", Duration::from_secs(10), || stage.collect().jobs(C::BG_FLUSH).counts.running == 0);
    assert!(stage.collect().channel("db2.flush").unwrap().bytes > 300 * 1024);

    // db1 reopens on the same stage and finishes its compaction; then
    // nothing runs (a job of its old life would count forever).
    l1.compaction_l0.configure(&unlimited()).unwrap();
    let db1 = open(&d1, 1);
    assert_eq!(db1.get(key(5)).unwrap().as_deref(), Some(&value(7, 1024)[..]));
    wait_idle(&db1, Duration::from_secs(20));
    let c = stage.collect();
    let running = c.jobs(C::BG_COMPACTION_L0_L1).counts.running
        + c.jobs(C::BG_FLUSH).counts.running
        + c.jobs(C::BG_COMPACTION_LN).counts.running;
    assert_eq!(running, 0, "jobs still count as running with both DBs idle: {:?}", c.jobs);
}

/// The application's own Env is kept: with `Env::mem_env()` the DB lives in
/// memory (nothing on disk), and the stage still sees its I/O.
#[test]
fn the_applications_env_is_wrapped_not_replaced() {
    wide_pools();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in-memory-db");
    let env = rocksdb::Env::mem_env().unwrap();
    let mut opts = small_lsm_options();
    opts.set_env(&env);
    let stage = accounting_stage();
    {
        let db = StagedDb::builder(opts.clone()).stage(Arc::clone(&stage)).open(&path).unwrap();
        for i in 0..500u64 {
            db.put(key(i), value(i, 512)).unwrap();
        }
        db.flush().unwrap();
        assert_eq!(db.get(key(7)).unwrap().as_deref(), Some(&value(7, 512)[..]));
    }
    // (The rocksdb crate creates the directory itself; RocksDB put nothing in it.)
    let on_disk: Vec<_> =
        std::fs::read_dir(&path).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(
        on_disk.is_empty(),
        "the DB was written to the real disk, not to the application's in-memory Env: {on_disk:?}"
    );
    assert!(written(&stage, "fg") >= 500 * 512, "the stage did not see the WAL writes");
    assert!(written(&stage, "flush") > 0, "the stage did not see the flush");
    // The data is still in the in-memory Env: reopening finds it.
    let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open(&path).unwrap();
    assert_eq!(db.get(key(499)).unwrap().as_deref(), Some(&value(499, 512)[..]));
}

/// RocksDB's compactions read ahead into the page cache (`Prefetch`),
/// which went past the wrapper unseen. It is accounted per file kind now;
/// the reads that take the data from the cache are what the stage
/// enforces, with the compaction's context (charging both would count the
/// bytes twice).
#[test]
fn compaction_readahead_is_accounted_and_its_reads_enforced() {
    wide_pools();
    let dir = tempfile::tempdir().unwrap();
    let stage = accounting_stage();
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    for round in 0..4u64 {
        for i in 0..600u64 {
            db.put(key(i * 7 + round), value(i, 1024)).unwrap();
        }
        db.flush().unwrap();
    }
    wait_idle(&db, Duration::from_secs(30));
    let jobs = db.jobs();
    assert!(jobs.compaction_l0.counts.completed > 0, "no L0 compaction ran");
    let sst = db.io_stats().kind(rocks_env::FileKind::Sst);
    let read_by_compactions = stage.collect().object("l0", "other").map_or(0, |o| o.counter.bytes);
    eprintln!(
        "compactions read {} B of {} B input; readahead {} B in {} calls",
        read_by_compactions, jobs.compaction_l0.bytes_read, sst.prefetch.bytes, sst.prefetch.ops
    );
    assert!(sst.prefetch.ops > 0 && sst.prefetch.bytes > 0, "readahead was not accounted: {sst:?}");
    assert!(
        close_to(read_by_compactions, jobs.compaction_l0.bytes_read, 0.01),
        "the stage saw {read_by_compactions} B of compaction reads for {} B of input",
        jobs.compaction_l0.bytes_read
    );
}

#[test]
fn opening_an_open_db_again_says_so_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = rocks_env::rocksdb::Options::default();
    opts.create_if_missing(true);
    let first = StagedDb::open(opts.clone(), dir.path()).unwrap();
    let Err(e) = StagedDb::open(opts.clone(), dir.path()) else { panic!("opened twice") };
    assert!(matches!(e, rocks_env::Error::Locked { by: "in this process", .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&dir.path().display().to_string()) && text.contains("already open in this process"),
        "{text}"
    );
    drop(first);
    // Closed, it opens again.
    StagedDb::open(opts, dir.path()).unwrap();
}
