//! Deleting obsolete files later. `delete_rate`: they go to `*.trash` first
//! and RocksDB's delete scheduler removes them one after the other; without
//! a rate they are removed at once; trash a closed DB left is removed when
//! it is opened again with a rate. `defer_deletions`: while a limit holds
//! the DB's background work back they wait (renamed), and go once no limit
//! holds, once they have waited the longest allowed, or when the DB
//! closes; what a crash left goes at the next open. `delete_in_pieces`:
//! every deleted file goes to the layer's thread, which shrinks it a piece
//! at a time before unlinking it; closing in the middle leaves nothing.
//! The data reads back intact throughout.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kv_stage::{ObjectChange, Stage, units::Rate};
use rocks_env::{DEFERRED_SUFFIX, LayoutHandles, RocksLayout, StagedDb};

const VALUES: u64 = 4_000;

fn ending(dir: &Path, suffix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(suffix))
        .collect()
}

fn trash(dir: &Path) -> Vec<String> {
    ending(dir, ".trash")
}

fn deferred(dir: &Path) -> Vec<String> {
    ending(dir, DEFERRED_SUFFIX)
}

/// A stage with the RocksDB layout and its flush DRL at `rate` (a limit
/// far above what the test moves still counts as one).
fn layout_stage(rate: Rate) -> (Arc<Stage>, LayoutHandles) {
    let stage = Arc::new(Stage::new("deletes"));
    let h = RocksLayout::new().install(&stage).unwrap();
    h.flush.configure(&ObjectChange::rate(rate)).unwrap();
    (stage, h)
}

/// A DB on `stage` whose deletions wait up to `max_wait`.
fn deferring(dir: &Path, stage: Arc<Stage>, max_wait: Duration) -> StagedDb {
    StagedDb::builder(small_lsm_options()).stage(stage).defer_deletions(max_wait).open(dir).unwrap()
}

fn limited() -> Rate {
    Rate::from_bytes_per_sec(1e12).unwrap()
}

/// Writes two overlapping generations, flushes each and compacts: the
/// flushed files and the first WAL become obsolete.
fn load_and_compact(db: &StagedDb) {
    for i in 0..VALUES {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    for i in 0..VALUES {
        db.put(key(i), value(i + 1, 1024)).unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
}

fn check(db: &StagedDb) {
    for i in (0..VALUES).step_by(97) {
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&value(i + 1, 1024)[..]), "key {i}");
    }
}

/// Polls `cond` every 20 ms for at most `limit`.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Asserts that what `list` finds in `dir` is gone within `limit`.
fn all_go(dir: &Path, list: fn(&Path) -> Vec<String>, limit: Duration) {
    assert!(eventually(limit, || list(dir).is_empty()), "left after {limit:?}: {:?}", list(dir));
}

#[test]
fn obsolete_files_wait_in_trash_and_go_at_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    // 2 MiB/s: the ~8 MiB of obsolete files take a few seconds; the trash
    // may be ten times the DB's size, so nothing is deleted at once.
    let db =
        StagedDb::builder(small_lsm_options()).delete_rate(2 << 20).max_trash_ratio(10.0).open(dir.path()).unwrap();
    load_and_compact(&db);
    assert!(!trash(dir.path()).is_empty(), "no trash right after the compaction: files were deleted at once");
    check(&db);
    all_go(dir.path(), trash, Duration::from_secs(60));
    check(&db);
}

#[test]
fn without_a_rate_files_are_deleted_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = StagedDb::builder(small_lsm_options()).open(dir.path()).unwrap();
    load_and_compact(&db);
    assert_eq!(trash(dir.path()), Vec::<String>::new());
    check(&db);
}

#[test]
fn trash_left_at_close_goes_when_the_db_opens_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        // 1 KiB/s: nothing of the trash is deleted before the DB closes.
        let db =
            StagedDb::builder(small_lsm_options()).delete_rate(1 << 10).max_trash_ratio(10.0).open(dir.path()).unwrap();
        load_and_compact(&db);
        assert!(!trash(dir.path()).is_empty());
    }
    assert!(!trash(dir.path()).is_empty(), "the trash went with the close");
    let db = StagedDb::builder(small_lsm_options()).delete_rate(64 << 20).open(dir.path()).unwrap();
    all_go(dir.path(), trash, Duration::from_secs(60));
    check(&db);
}

#[test]
fn a_bad_trash_ratio_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let e = StagedDb::builder(small_lsm_options()).delete_rate(1 << 20).max_trash_ratio(f64::NAN).open(dir.path());
    let msg = e.err().expect("NaN ratio accepted").to_string();
    assert!(msg.contains("max_trash_ratio"), "{msg}");
}

#[test]
fn deletions_wait_while_a_limit_holds_background_work() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, h) = layout_stage(limited());
    let db = deferring(dir.path(), stage, Duration::from_secs(600));
    load_and_compact(&db);
    // Held back for the limit: renamed, still on disk, and counted.
    std::thread::sleep(Duration::from_millis(300));
    let waiting = deferred(dir.path());
    assert!(waiting.iter().any(|n| n.contains(".sst")), "no table file waits: {waiting:?}");
    assert!(waiting.iter().any(|n| n.contains(".log")), "no WAL waits: {waiting:?}");
    assert!(db.deletions_deferred() >= waiting.len() as u64, "{} < {}", db.deletions_deferred(), waiting.len());
    check(&db);
    // The limit goes: so do the files.
    h.flush.configure(&ObjectChange::rate(Rate::UNLIMITED)).unwrap();
    all_go(dir.path(), deferred, Duration::from_secs(30));
    check(&db);
}

#[test]
fn a_deletion_waits_no_longer_than_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, _h) = layout_stage(limited());
    let db = deferring(dir.path(), stage, Duration::from_millis(200));
    load_and_compact(&db);
    assert!(db.deletions_deferred() > 0);
    // The limit stays, and the files still go.
    all_go(dir.path(), deferred, Duration::from_secs(30));
    check(&db);
}

#[test]
fn without_a_limit_nothing_waits() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, _h) = layout_stage(Rate::UNLIMITED);
    let db = deferring(dir.path(), stage, Duration::from_secs(600));
    load_and_compact(&db);
    assert_eq!((db.deletions_deferred(), deferred(dir.path())), (0, Vec::<String>::new()));
    check(&db);
}

#[test]
fn waiting_deletions_are_done_at_close_and_a_crash_leftover_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (stage, _h) = layout_stage(limited());
        let db = deferring(dir.path(), stage, Duration::from_secs(600));
        load_and_compact(&db);
        assert!(!deferred(dir.path()).is_empty());
    }
    assert_eq!(deferred(dir.path()), Vec::<String>::new(), "left after close");
    // What a crash would leave: removed when the DB opens, with or
    // without deferral.
    let left = dir.path().join(format!("000777.sst{DEFERRED_SUFFIX}"));
    std::fs::write(&left, b"obsolete").unwrap();
    let db = StagedDb::builder(small_lsm_options()).open(dir.path()).unwrap();
    assert!(!left.exists());
    check(&db);
}

/// A DB (no limit anywhere) whose deleted files are freed `piece` bytes at
/// a time.
fn in_pieces(dir: &Path, piece: u64) -> StagedDb {
    StagedDb::builder(small_lsm_options()).delete_in_pieces(piece).open(dir).unwrap()
}

#[test]
fn in_pieces_a_deleted_file_shrinks_before_it_goes() {
    let dir = tempfile::tempdir().unwrap();
    let db = in_pieces(dir.path(), 64 << 10);
    load_and_compact(&db);
    // Every size each renamed file was seen at, polled every 2 ms.
    let mut seen: std::collections::HashMap<String, Vec<u64>> = Default::default();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(60) {
        let now = deferred(dir.path());
        if now.is_empty() && !seen.is_empty() {
            break;
        }
        for n in now {
            if let Ok(m) = std::fs::metadata(dir.path().join(&n)) {
                let sizes = seen.entry(n).or_default();
                if sizes.last() != Some(&m.len()) {
                    sizes.push(m.len());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(seen.keys().any(|n| n.contains(".sst")), "no table file went to the layer's thread: {seen:?}");
    assert!(
        seen.values().any(|s| s.len() >= 3 && s.windows(2).all(|w| w[1] < w[0])),
        "no file was seen shrinking step by step: {seen:?}"
    );
    assert_eq!(deferred(dir.path()), Vec::<String>::new(), "left after 60 s");
    // Nothing was held for a limit: these were not deferrals.
    assert_eq!(db.deletions_deferred(), 0);
    check(&db);
}

#[test]
fn closing_in_the_middle_of_a_deletion_in_pieces_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        // 4 KiB pieces, 10 ms apart: megabytes take seconds.
        let db = in_pieces(dir.path(), 4 << 10);
        load_and_compact(&db);
        assert!(
            eventually(Duration::from_secs(5), || !deferred(dir.path()).is_empty()),
            "no deletion went to the layer's thread"
        );
    }
    assert_eq!(deferred(dir.path()), Vec::<String>::new(), "left after close");
    let db = in_pieces(dir.path(), 4 << 10);
    check(&db);
}

#[test]
fn in_pieces_a_file_a_checkpoint_shares_is_not_shrunk() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("checkpoint");
    let db = in_pieces(&dir.path().join("db"), 64 << 10);
    for i in 0..VALUES {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    // The checkpoint hard-links the table files the compaction below
    // deletes from the DB.
    rocksdb::checkpoint::Checkpoint::new(db.db()).unwrap().create_checkpoint(&copy).unwrap();
    for i in 0..VALUES {
        db.put(key(i), value(i + 1, 1024)).unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
    let db_dir = dir.path().join("db");
    all_go(&db_dir, deferred, Duration::from_secs(60));
    check(&db);
    drop(db);
    // The copy still reads the first generation, every table intact.
    let copy = rocksdb::DB::open(&small_lsm_options(), &copy).unwrap();
    for i in (0..VALUES).step_by(97) {
        assert_eq!(copy.get(key(i)).unwrap().as_deref(), Some(&value(i, 1024)[..]), "checkpoint key {i}");
    }
}
