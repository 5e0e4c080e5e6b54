//! Fault coverage: a refused Sync, Fsync, Close, Rename, MANIFEST write,
//! flush write or compaction write (injected below the stage, as a failing
//! disk would) reaches the application as an error, either from the call
//! that hit it or as a background error RocksDB reports; nothing hangs; and
//! the DB reopens with every acknowledged write.

use std::sync::Arc;
use std::time::Duration;

use kv_stage::Stage;
use rocks_env::{FaultInjection, FaultRule, FileKind, FileOp, IoActivity, RocksLayout, StagedDb};
use tests::{join_within, key, small_lsm_options, value, wait_for};

/// How a fault shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Surfaces {
    /// The call that hit it returned an error.
    Foreground,
    /// RocksDB reported a background error (and the call that waited for
    /// the background work, if any, failed).
    Background,
}

struct Case {
    name: &'static str,
    rule: FaultRule,
    surfaces: Surfaces,
    /// Options for the DB (some faults need an option to be reachable).
    options: fn() -> rocksdb::Options,
    /// Does what hits the fault; returns its result.
    trigger: fn(&StagedDb) -> Result<(), String>,
}

fn synced(db: &StagedDb, from: u64, n: u64) -> Result<(), String> {
    let mut w = rocksdb::WriteOptions::default();
    w.set_sync(true);
    for i in from..from + n {
        db.put_opt(key(i), value(i, 1000), &w).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Unsynced writes (acknowledged only by a later flush), then a flush.
fn write_and_flush(db: &StagedDb) -> Result<(), String> {
    for i in 10_000..10_300u64 {
        db.put(key(i), value(i, 1000)).map_err(|e| e.to_string())?;
    }
    db.flush().map_err(|e| e.to_string())
}

fn compact(db: &StagedDb) -> Result<(), String> {
    for round in 0..3u64 {
        for i in 0..400u64 {
            db.put(key(20_000 + (i * 13 + round) % 400), value(i, 1000)).map_err(|e| e.to_string())?;
        }
        db.flush().map_err(|e| e.to_string())?;
    }
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
    Ok(())
}

fn fsync_options() -> rocksdb::Options {
    let mut o = small_lsm_options();
    o.set_use_fsync(true);
    o
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "WAL sync",
            rule: FaultRule::new([FileOp::Sync]).files([FileKind::Wal]),
            surfaces: Surfaces::Foreground,
            options: small_lsm_options,
            trigger: |db| synced(db, 5_000, 10),
        },
        Case {
            name: "WAL fsync (use_fsync)",
            rule: FaultRule::new([FileOp::Fsync]).files([FileKind::Wal]),
            surfaces: Surfaces::Foreground,
            options: fsync_options,
            trigger: |db| synced(db, 5_000, 10),
        },
        Case {
            name: "directory fsync after a flush",
            rule: FaultRule::new([FileOp::Fsync]).files([FileKind::Directory]),
            surfaces: Surfaces::Background,
            options: small_lsm_options,
            trigger: write_and_flush,
        },
        Case {
            name: "table file close",
            rule: FaultRule::new([FileOp::Close]).files([FileKind::Sst]),
            surfaces: Surfaces::Background,
            options: small_lsm_options,
            trigger: write_and_flush,
        },
        Case {
            name: "MANIFEST write",
            rule: FaultRule::new([FileOp::Write]).files([FileKind::Manifest]),
            surfaces: Surfaces::Background,
            options: small_lsm_options,
            trigger: write_and_flush,
        },
        Case {
            name: "flush write",
            rule: FaultRule::new([FileOp::Write]).activity(IoActivity::Flush),
            surfaces: Surfaces::Background,
            options: small_lsm_options,
            trigger: write_and_flush,
        },
        Case {
            name: "compaction write",
            rule: FaultRule::new([FileOp::Write]).activity(IoActivity::Compaction),
            surfaces: Surfaces::Background,
            options: small_lsm_options,
            trigger: compact,
        },
    ]
}

fn open(options: rocksdb::Options, dir: &std::path::Path, fault: &Arc<FaultInjection>) -> StagedDb {
    let stage = Arc::new(Stage::new("faults"));
    RocksLayout::new().install(&stage).unwrap();
    StagedDb::builder(options).stage(stage).fault_injection(Arc::clone(fault)).open(dir).unwrap()
}

fn check_acknowledged(db: &StagedDb, n: u64) {
    for i in 0..n {
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&value(i, 1000)[..]), "acknowledged key {i} lost");
    }
}

#[test]
fn every_injected_fault_surfaces_and_the_db_recovers() {
    for case in cases() {
        let dir = tempfile::tempdir().unwrap();
        let fault = Arc::new(FaultInjection::new());
        let db = open((case.options)(), dir.path(), &fault);
        synced(&db, 0, 300).unwrap();
        fault.fail(case.rule);
        let result = (case.trigger)(&db);
        let injected = fault.injected();
        let bg = db.background_errors();
        eprintln!("{}: {injected} ops failed; call: {result:?}; background errors: {bg:?}", case.name);
        assert!(injected > 0, "{}: the fault was never hit", case.name);
        match case.surfaces {
            Surfaces::Foreground => {
                let e = result.expect_err(&format!("{}: the call that hit the fault succeeded", case.name));
                assert!(e.contains("injected fault"), "{}: error does not name the fault: {e}", case.name);
            }
            Surfaces::Background => {
                wait_for(&format!("{}: a background error", case.name), Duration::from_secs(20), || {
                    db.background_errors().count > 0
                });
                let last = db.background_errors().last.unwrap_or_default();
                assert!(
                    last.contains("injected fault"),
                    "{}: background error does not name the fault: {last}",
                    case.name
                );
            }
        }
        // Nothing hangs: the DB closes with the fault still in place.
        let h = std::thread::spawn(move || drop(db));
        join_within(h, Duration::from_secs(20)).unwrap_or_else(|| panic!("{}: closing the DB hangs", case.name));
        fault.clear();
        let db = open((case.options)(), dir.path(), &fault);
        check_acknowledged(&db, 300);
        synced(&db, 300, 10).unwrap_or_else(|e| panic!("{}: writes fail after reopening: {e}", case.name));
    }
}

/// A refused rename while the DB opens (CURRENT, OPTIONS) fails the open
/// with the fault named; with the fault gone it opens with every
/// acknowledged write.
#[test]
fn a_refused_rename_fails_the_open_and_the_next_open_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let fault = Arc::new(FaultInjection::new());
    let db = open(small_lsm_options(), dir.path(), &fault);
    synced(&db, 0, 300).unwrap();
    drop(db);
    fault.fail(FaultRule::new([FileOp::Rename]));
    let stage = Arc::new(Stage::new("faults"));
    let err = match StagedDb::builder(small_lsm_options())
        .stage(stage)
        .fault_injection(Arc::clone(&fault))
        .open(dir.path())
    {
        Ok(_) => panic!("the open succeeded although every rename fails"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("injected fault"), "{err}");
    assert!(fault.injected() > 0);
    fault.clear();
    let db = open(small_lsm_options(), dir.path(), &fault);
    check_acknowledged(&db, 300);
}
