//! RocksDB's I/O arrives at the stage with the right context: flush bytes
//! match the SSTs flushes produced, compaction bytes split into L0 and LN as
//! the compactions reported, WAL bytes are foreground, and the bytes the
//! stage saw written match what the process wrote.
//!
//! One test per file: it compares against /proc/self/io, which counts the
//! whole process.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use rocks_env::{FileKind, StagedDb};

#[test]
fn flush_compaction_and_wal_bytes_are_tagged_and_nothing_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let stage = accounting_stage();
    let wchar_before = proc_wchar();
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();

    // About 40 MB of 1 KiB values over 20 000 keys: many flushes, L0->L1
    // compactions, and (L1 is 2 MiB) L1->L2 compactions.
    let mut rng = Lcg(7);
    for i in 0..40_000u64 {
        let k = rng.next() % 20_000;
        db.put(key(k), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    wait_idle(&db, Duration::from_secs(120));

    let jobs = db.jobs();
    let io = db.io_stats();
    let flush_w = written(&stage, "flush");
    let l0_w = written(&stage, "l0");
    let ln_w = written(&stage, "ln");
    let unknown_w = written(&stage, "unknown");
    let fg_w = written(&stage, "fg");
    let bg_w = written(&stage, "bg");
    let wal = io.kind(FileKind::Wal).write.bytes;
    eprintln!("jobs: {jobs:?}");
    eprintln!("stage writes: fg {fg_w} flush {flush_w} l0 {l0_w} ln {ln_w} unknown {unknown_w} bg {bg_w}; wal {wal}");

    assert!(jobs.flush.counts.completed >= 20, "expected many flushes: {jobs:?}");
    assert!(jobs.compaction_l0.counts.completed >= 5 && jobs.compaction_ln.counts.completed >= 1, "{jobs:?}");

    // Flush writes = SST bytes the flushes produced (plus a few hundred
    // bytes of MANIFEST edit per flush).
    assert!(close_to(flush_w, jobs.flush.bytes_written, 0.01), "flush {flush_w} vs SSTs {}", jobs.flush.bytes_written);
    // Compaction writes per class = output bytes the compactions reported.
    assert!(
        close_to(l0_w, jobs.compaction_l0.bytes_written, 0.01),
        "L0 {l0_w} vs {}",
        jobs.compaction_l0.bytes_written
    );
    assert!(
        close_to(ln_w, jobs.compaction_ln.bytes_written, 0.01),
        "LN {ln_w} vs {}",
        jobs.compaction_ln.bytes_written
    );
    // Every compaction byte was attributed to a level.
    assert!(unknown_w as f64 <= 0.01 * (l0_w + ln_w) as f64, "untagged compaction writes: {unknown_w}");
    // The WAL is written by client threads: foreground writes are the WAL
    // plus the few files written at open (OPTIONS, MANIFEST, CURRENT).
    assert!(wal >= 40_000 * 1024, "WAL {wal}");
    assert!(fg_w >= wal && close_to(fg_w, wal, 0.01), "foreground {fg_w} vs WAL {wal}");

    drop(db);
    // Everything the stage saw written vs everything the process wrote.
    let wchar = proc_wchar() - wchar_before;
    // (Counted again after the close, which writes a little too.)
    let staged: u64 = CONTEXTS.iter().map(|(_, ch)| written(&stage, ch)).sum();
    let passthrough = stage.collect().channel("default").unwrap().bytes;
    assert_eq!(passthrough, 0, "every context has a channel");
    eprintln!("process wrote {wchar} bytes, stage saw {staged}");
    assert!(close_to(staged, wchar, 0.01), "stage saw {staged} written, the process wrote {wchar}");
}
