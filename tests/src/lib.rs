//! Helpers shared by the cross-crate scenarios in `tests/tests/`: RocksDB
//! options for a small, busy LSM, deterministic keys and values, and
//! waiting with a deadline.

#![forbid(unsafe_code)]

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Options for a small LSM that flushes and compacts a lot: 512 KiB
/// memtables, L0 compaction at 2 files, a 2 MiB L1, no compression.
pub fn small_lsm_options() -> rocksdb::Options {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_write_buffer_size(512 << 10);
    o.set_max_write_buffer_number(4);
    o.set_level_zero_file_num_compaction_trigger(2);
    o.set_level_zero_slowdown_writes_trigger(1000);
    o.set_level_zero_stop_writes_trigger(1000);
    o.set_max_bytes_for_level_base(2 << 20);
    o.set_target_file_size_base(512 << 10);
    o.set_compression_type(rocksdb::DBCompressionType::None);
    o.set_max_background_jobs(2);
    o
}

/// The key of number `i`.
pub fn key(i: u64) -> Vec<u8> {
    format!("key{i:010}").into_bytes()
}

/// A value of `len` bytes that names `i`.
pub fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(len, b'x');
    v
}

/// A deterministic pseudo-random sequence (64-bit LCG).
#[derive(Debug, Clone)]
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number (31 bits).
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Waits up to `limit` for a thread; `None` if it is still running.
pub fn join_within<T>(h: JoinHandle<T>, limit: Duration) -> Option<T> {
    let deadline = Instant::now() + limit;
    while !h.is_finished() {
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Some(h.join().expect("thread panicked"))
}

/// Polls `cond` every 5 ms; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
