//! Durability under power loss, not just SIGKILL (which keeps the page
//! cache, so it would pass even if nothing were ever synced).
//!
//! The DB runs through the whole stack (the stage's layer over the fault
//! injector over the real files). A writer acknowledges each write once
//! RocksDB returned it; at a random moment the power is cut: from then on
//! every file operation fails, the DB is closed, and the fault injector
//! drops every byte not covered by a completed sync and undoes every file
//! creation and rename not followed by a directory sync. The DB must reopen
//! every time with every acknowledged write.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kv_stage::Stage;
use rocks_env::{FaultInjection, PowerCutReport, RocksLayout, StagedDb};
use tests::{Lcg, join_within, key, small_lsm_options, value};

/// How the writer makes its writes durable.
#[derive(Debug, Clone, Copy)]
enum Durability {
    /// Every put with `sync = true`.
    SyncEveryWrite,
    /// Puts with `sync = false`; `FlushWAL(true)` every few puts. A put is
    /// acknowledged once a later `FlushWAL(true)` returned.
    FlushWal,
}

/// Writes keys 0, 1, ... until the power is cut, publishing in `acked` how
/// many of them (from 0) are acknowledged.
fn writer(db: &StagedDb, durability: Durability, seed: u64, acked: &AtomicU64) {
    let mut rng = Lcg(seed);
    let mut opts = rocksdb::WriteOptions::default();
    opts.set_sync(matches!(durability, Durability::SyncEveryWrite));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut since_flush = 0u64;
    let mut every = 1 + rng.next_u64() % 50;
    for i in 0..200_000u64 {
        if Instant::now() > deadline {
            return;
        }
        let len = 200 + (rng.next_u64() % 1000) as usize;
        if db.put_opt(key(i), value(seed ^ i, len), &opts).is_err() {
            return;
        }
        match durability {
            Durability::SyncEveryWrite => acked.store(i + 1, Ordering::Release),
            Durability::FlushWal => {
                since_flush += 1;
                if since_flush == every {
                    if db.flush_wal(true).is_err() {
                        return;
                    }
                    acked.store(i + 1, Ordering::Release);
                    since_flush = 0;
                    every = 1 + rng.next_u64() % 50;
                }
            }
        }
    }
}

/// How the value of key `i` starts (its length varies).
fn prefix(seed: u64, i: u64) -> Vec<u8> {
    format!("value-{}-", seed ^ i).into_bytes()
}

struct Outcome {
    acked: u64,
    lost: u64,
    report: PowerCutReport,
}

fn one_cut(durability: Durability, seed: u64, cut_after: u64, extra_us: u64) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let fault = Arc::new(FaultInjection::new());
    let stage = Arc::new(Stage::new("power-loss"));
    RocksLayout::new().install(&stage).unwrap();
    let db = StagedDb::builder(small_lsm_options())
        .stage(Arc::clone(&stage))
        .fault_injection(Arc::clone(&fault))
        .open(dir.path())
        .unwrap();
    let acked = AtomicU64::new(0);
    std::thread::scope(|s| {
        let w = s.spawn(|| writer(&db, durability, seed, &acked));
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked.load(Ordering::Acquire) < cut_after && !w.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        // Land the cut at some point inside whatever RocksDB is doing.
        std::thread::sleep(Duration::from_micros(extra_us));
        fault.power_cut();
    });
    let acked = acked.load(Ordering::Acquire);
    // Closing with the power off must not hang.
    let h = std::thread::spawn(move || drop(db));
    join_within(h, Duration::from_secs(30)).expect("closing the DB after the power cut hangs");
    let report = fault.recover().expect("recovery from the power cut");

    let db = StagedDb::open(small_lsm_options(), dir.path()).expect("the DB reopens after the power cut");
    let mut lost = 0;
    for i in 0..acked {
        match db.get(key(i)).unwrap() {
            Some(v) if v.starts_with(&prefix(seed, i)) => {}
            other => {
                if lost < 3 {
                    eprintln!("seed {seed}: acknowledged key {i} of {acked} lost: {:?}", other.map(|v| v.len()));
                }
                lost += 1;
            }
        }
    }
    Outcome { acked, lost, report }
}

fn run(durability: Durability, cuts: u64, seed: u64) {
    let mut rng = Lcg(seed);
    let (mut acked, mut lost) = (0, 0);
    let mut dropped = PowerCutReport::default();
    for c in 0..cuts {
        let cut_after = 20 + rng.next_u64() % 2500;
        let extra_us = rng.next_u64() % 3000;
        let o = one_cut(durability, seed.wrapping_add(c), cut_after, extra_us);
        acked += o.acked;
        lost += o.lost;
        dropped.bytes_dropped += o.report.bytes_dropped;
        dropped.files_truncated += o.report.files_truncated;
        dropped.files_removed += o.report.files_removed;
        dropped.renames_undone += o.report.renames_undone;
    }
    eprintln!(
        "{durability:?}: {cuts} power cuts, {acked} acknowledged writes, {lost} lost; the cuts dropped {} unsynced bytes \
         in {} files, removed {} files and undid {} renames",
        dropped.bytes_dropped, dropped.files_truncated, dropped.files_removed, dropped.renames_undone
    );
    assert!(dropped.bytes_dropped > 0, "no cut ever found unsynced data: the test cuts nothing");
    assert_eq!(lost, 0, "{lost} of {acked} acknowledged writes were lost");
}

#[test]
fn synced_writes_survive_50_power_cuts() {
    run(Durability::SyncEveryWrite, 50, 0x5EED_0001);
}

#[test]
fn writes_before_a_synced_wal_flush_survive_20_power_cuts() {
    run(Durability::FlushWal, 20, 0x5EED_1001);
}
