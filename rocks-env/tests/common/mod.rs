//! Helpers shared by the rocks-env tests.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_stage::{Match, ObjectSpec, RequestContext as C, RequestType, Rule, Stage};
use rocks_env::StagedDb;

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

/// The contexts the accounting stage separates, with their channel ids.
pub const CONTEXTS: [(C, &str); 6] = [
    (C::FOREGROUND, "fg"),
    (C::BG_FLUSH, "flush"),
    (C::BG_COMPACTION_L0_L1, "l0"),
    (C::BG_COMPACTION_LN, "ln"),
    (C::BG_COMPACTION, "unknown"),
    (C::BACKGROUND, "bg"),
];

/// A stage with one channel per context and, in each, a `writes` Noop for
/// write requests and a default `other` Noop for the rest, so tests can read
/// write bytes per context.
pub fn accounting_stage() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("accounting"));
    let mut rules = Vec::new();
    for (ctx, ch) in CONTEXTS {
        rules.push(Rule::CreateChannel { channel: ch.into(), matches: Some(Match::context(ctx)) });
        rules.push(Rule::CreateObject {
            channel: ch.into(),
            object: "writes".into(),
            spec: ObjectSpec::Noop,
            matches: Some(Match::request_type(RequestType::Write)),
        });
        rules.push(Rule::CreateObject {
            channel: ch.into(),
            object: "other".into(),
            spec: ObjectSpec::Noop,
            matches: None,
        });
    }
    stage.apply_rules(rules).unwrap();
    stage
}

/// Bytes written in a context, as the accounting stage counted them.
pub fn written(stage: &Stage, channel: &str) -> u64 {
    stage.collect().object(channel, "writes").map_or(0, |o| o.counter.bytes)
}

/// A deterministic pseudo-random sequence (64-bit LCG).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

pub fn key(i: u64) -> Vec<u8> {
    format!("key{i:010}").into_bytes()
}

pub fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(len, b'x');
    v
}

/// Waits until RocksDB has no flush or compaction running or pending.
pub fn wait_idle(db: &StagedDb, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let p = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        let busy = p("rocksdb.num-running-flushes")
            + p("rocksdb.num-running-compactions")
            + p("rocksdb.compaction-pending")
            + p("rocksdb.mem-table-flush-pending");
        let j = db.jobs();
        if busy == 0
            && j.flush.counts.running == 0
            && j.compaction_l0.counts.running == 0
            && j.compaction_ln.counts.running == 0
        {
            return;
        }
        assert!(Instant::now() < deadline, "RocksDB still busy after {timeout:?}: {j:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `wchar` of /proc/self/io: bytes this process passed to write(2) and
/// friends.
pub fn proc_wchar() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").expect("/proc/self/io");
    s.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc/self/io")
}

/// `|a - b| <= tolerance * b`.
pub fn close_to(a: u64, b: u64, tolerance: f64) -> bool {
    (a as f64 - b as f64).abs() <= tolerance * b as f64
}
