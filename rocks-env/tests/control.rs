//! A DRL on LN compactions set to X makes LN compactions run at X, while
//! foreground writes are not slowed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kv_stage::{ObjectChange, Stage, units::Rate};
use rocks_env::{RocksLayout, StagedDb};

#[test]
fn ln_compaction_rate_follows_its_drl_and_clients_keep_their_pace() {
    const LN_RATE: f64 = 2.0 * 1024.0 * 1024.0; // 2 MiB/s
    // A fresh machine has gigabytes of build output to write back; flush
    // it first, so the compactions measured wait for their DRL and not
    // for the disk.
    let _ = std::process::Command::new("sync").status();
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("control"));
    let handles = RocksLayout::new().install(&stage).unwrap();
    handles.compaction_ln.configure(&ObjectChange::rate(Rate::from_bytes_per_sec(LN_RATE).unwrap())).unwrap();

    let mut opts = small_lsm_options();
    opts.set_max_background_jobs(4);
    opts.enable_statistics();
    let db = StagedDb::builder(opts.clone()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();

    // Clients: 2 000 puts/s of 1 KiB for 10 s, paced.
    let (rate, secs) = (2_000u64, 10u64);
    let start = Instant::now();
    let mut rng = Lcg(11);
    for i in 0..rate * secs {
        let due = start + Duration::from_nanos(i * 1_000_000_000 / rate);
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        db.put(key(rng.next() % 30_000), value(i, 1024)).unwrap();
    }
    let client_time = start.elapsed();

    let jobs = db.jobs();
    let ln = stage.collect().object(&RocksLayout::new().compaction(), "ln").unwrap().counter;
    let busy = Duration::from_nanos(jobs.compaction_ln.busy_ns);
    let measured = ln.bytes as f64 / busy.as_secs_f64();
    eprintln!(
        "LN compactions: {} begun, busy {busy:?}, {} bytes through the LN DRL: {:.0} B/s (limit {LN_RATE:.0}); clients took {client_time:?}",
        jobs.compaction_ln.counts.begun, ln.bytes, measured
    );
    assert!(busy >= Duration::from_secs(2), "too little LN compaction to measure: {jobs:?}");
    // Over the limit by more than 5% would be the DRL letting bytes
    // through; under it is the device's or the CPU's doing (a compaction
    // cannot go faster than its disk), seen down to -15% on a fresh CI
    // machine, against -2.5% on an idle one. -20% still tells a wrong rate
    // (half, double) from the right one.
    let off = measured / LN_RATE - 1.0;
    assert!(
        (-0.20..=0.05).contains(&off),
        "LN rate {measured:.0} B/s vs limit {LN_RATE:.0} B/s ({:+.1}%)",
        off * 100.0
    );

    // Clients were not slowed: RocksDB never stalled writes, the foreground
    // Noop never held a request, and the paced writer kept its schedule.
    assert_eq!(opts.get_ticker_count(rocksdb::statistics::Ticker::StallMicros), 0, "RocksDB stalled writes");
    // The foreground Noop counted the clients' WAL appends (plus what the
    // DB read and wrote from the opening thread: OPTIONS, MANIFEST, a few
    // hundred KB of read buffers).
    let fg = stage.collect().object(&RocksLayout::new().foreground(), "noop").unwrap().counter.bytes;
    let wal = db.io_stats().kind(rocks_env::FileKind::Wal).write.bytes;
    assert!(wal >= rate * secs * 1024, "WAL bytes {wal}");
    assert!(fg >= wal && fg - wal < 1 << 20, "foreground Noop counted {fg} B, the WAL got {wal} B");
    assert!(client_time < Duration::from_secs(secs) + Duration::from_secs(2), "clients fell behind: {client_time:?}");

    // Let the backlog go, then close.
    handles.compaction_ln.configure(&ObjectChange::rate(Rate::UNLIMITED)).unwrap();
}
