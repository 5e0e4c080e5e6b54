//! The work a run leaves behind: a policy must not win by starving
//! compactions until the clock stops. At the end of each run, before the DB
//! closes and still on the run's device, bench-ycsb reads RocksDB's backlog
//! (pending compaction bytes, L0 files, immutable memtables) and keeps the
//! DB open, with the system's controller running, until RocksDB reports
//! nothing pending or running (at most `--drain-timeout`), timing it.

use std::time::{Duration, Instant};

use rocksdb::DB;
use serde::{Deserialize, Serialize};

use crate::systems::DbOptions;

/// A system's debt is flagged when it is above this many times plain
/// RocksDB's in the same run (see [`Debt::score`]).
pub const FLAG_RATIO: f64 = 1.25;

/// What a run left for after it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Debt {
    /// `rocksdb.estimate-pending-compaction-bytes` when the clock stopped.
    pub pending_compaction_bytes: u64,
    /// `rocksdb.num-files-at-level0`.
    pub l0_files: u64,
    /// `rocksdb.num-immutable-mem-table` (memtables waiting for a flush).
    pub immutable_memtables: u64,
    /// Flushes and compactions running then.
    pub running_jobs: u64,
    /// Time until RocksDB reported nothing pending or running, ms; `None`
    /// when the drain timeout passed first (or was 0).
    pub drain_ms: Option<u64>,
    /// The drain timeout, ms.
    pub drain_timeout_ms: u64,
    /// Pending compaction bytes when the drain ended.
    pub pending_after_drain: u64,
    /// [`Debt::score`] with the run's options, bytes.
    pub score_bytes: f64,
    /// The run's memtable size (the floor of [`Debt::flagged_against`]).
    pub memtable_bytes: u64,
}

fn prop(db: &DB, name: &str) -> u64 {
    db.property_int_value(name).ok().flatten().unwrap_or(0)
}

/// Reads the debt, then drains it (at most `timeout`).
pub fn measure(db: &DB, options: &DbOptions, timeout: Duration) -> Debt {
    let mut d = Debt {
        pending_compaction_bytes: prop(db, "rocksdb.estimate-pending-compaction-bytes"),
        l0_files: prop(db, "rocksdb.num-files-at-level0"),
        immutable_memtables: prop(db, "rocksdb.num-immutable-mem-table"),
        running_jobs: prop(db, "rocksdb.num-running-compactions") + prop(db, "rocksdb.num-running-flushes"),
        drain_ms: None,
        drain_timeout_ms: timeout.as_millis() as u64,
        pending_after_drain: 0,
        score_bytes: 0.0,
        memtable_bytes: options.write_buffer_size as u64,
    };
    d.score_bytes = d.score(options);
    if !timeout.is_zero() {
        let start = Instant::now();
        let mut quiet = 0;
        loop {
            quiet = if crate::runner::has_background_work(db) { 0 } else { quiet + 1 };
            // Twice in a row, 50 ms apart: a job that just ended may have
            // scheduled the next one.
            if quiet >= 2 {
                d.drain_ms = Some(start.elapsed().as_millis() as u64);
                break;
            }
            if start.elapsed() >= timeout {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    d.pending_after_drain = prop(db, "rocksdb.estimate-pending-compaction-bytes");
    d
}

impl Debt {
    /// One number to compare systems by: pending compaction bytes plus a
    /// memtable's worth (`write_buffer_size`) per L0 file beyond the
    /// compaction trigger and per immutable memtable, the work each stands
    /// for. Zero when nothing waits.
    pub fn score(&self, o: &DbOptions) -> f64 {
        let over_l0 = self.l0_files.saturating_sub(o.level0_file_num_compaction_trigger.max(0) as u64);
        self.pending_compaction_bytes as f64 + (over_l0 + self.immutable_memtables) as f64 * o.write_buffer_size as f64
    }

    /// Whether this debt is above [`FLAG_RATIO`] times `plain`'s (plain
    /// RocksDB's in the same run), from the scores recorded with the runs.
    /// A floor of one memtable keeps a handful of bytes against zero from
    /// counting.
    pub fn flagged_against(&self, plain: &Debt) -> bool {
        self.score_bytes > FLAG_RATIO * plain.score_bytes.max(self.memtable_bytes as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_and_flags() {
        let o = DbOptions::default();
        let m = o.write_buffer_size as f64;
        // As `measure` records them: the score with the run's options.
        let scored = |d: Debt| Debt { score_bytes: d.score(&o), memtable_bytes: o.write_buffer_size as u64, ..d };
        let plain = scored(Debt { pending_compaction_bytes: 100 << 20, l0_files: 2, ..Debt::default() });
        assert_eq!(plain.score(&o), (100 << 20) as f64);
        let same = scored(Debt { pending_compaction_bytes: 120 << 20, l0_files: 4, ..Debt::default() });
        assert!(!same.flagged_against(&plain));
        // 6 L0 files: 2 over the trigger, each a memtable's worth.
        let more = scored(Debt {
            pending_compaction_bytes: 100 << 20,
            l0_files: 6,
            immutable_memtables: 1,
            ..Debt::default()
        });
        assert_eq!(more.score(&o), (100 << 20) as f64 + 3.0 * m);
        assert!(more.flagged_against(&plain));
        // Against no debt at all, less than 1.25 memtables is not flagged.
        let none = scored(Debt::default());
        assert!(!scored(Debt { pending_compaction_bytes: 1 << 20, ..Debt::default() }).flagged_against(&none));
        assert!(scored(Debt { pending_compaction_bytes: 64 << 20, ..Debt::default() }).flagged_against(&none));
    }
}
