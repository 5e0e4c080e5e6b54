//! Prometheus metrics of RocksDB instances under rocks-env, read at scrape
//! time.
//!
//! [`DbMetrics`] is a [`Collector`]: register it once and add every
//! [`StagedDb`] (held weakly: a DB that closes stops appearing). A scrape
//! reads what rocks-env counts anyway (jobs from RocksDB's event listener,
//! the file I/O that went through the wrapper) and a few DB properties
//! (L0 files, pending compaction bytes, immutable memtables, write stops);
//! nothing is added to the I/O path. The stage's own metrics are
//! [`kv_stage::metrics::StageMetrics`]'s.
//!
//! ```
//! use std::sync::Arc;
//! use rocks_env::{StagedDb, metrics::DbMetrics};
//! use prometheus_client::registry::Registry;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let mut opts = rocks_env::rocksdb::Options::default();
//! opts.create_if_missing(true);
//! let db = Arc::new(StagedDb::open(opts, dir.path()).unwrap());
//! let metrics = DbMetrics::new();
//! metrics.add(&db);
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(metrics));
//! let text = kv_stage::metrics::encode_text(&registry);
//! assert!(text.contains("kvsds_rocksdb_l0_files{db="));
//! ```
//!
//! Every metric is listed in `docs/monitoring.md`.

use std::sync::{Arc, Mutex, Weak};

use kv_stage::metrics::{counter, family, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::io::{CompactionLevelStats, IoStats, JobClassStats};
use crate::{FileKind, StagedDb};

/// The DBs one registry reports (see the module documentation). Cheap to
/// clone: clones share the list.
#[derive(Clone, Default)]
pub struct DbMetrics {
    dbs: Arc<Mutex<Vec<Weak<StagedDb>>>>,
}

impl std::fmt::Debug for DbMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbMetrics").field("dbs", &self.live().len()).finish()
    }
}

impl DbMetrics {
    /// No DB yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports `db` from the next scrape on, while it is open.
    pub fn add(&self, db: &Arc<StagedDb>) {
        let mut v = self.dbs.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        if !v.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(db))) {
            v.push(Arc::downgrade(db));
        }
    }

    fn live(&self) -> Vec<Arc<StagedDb>> {
        self.dbs.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect()
    }
}

/// One DB as a scrape reads it.
struct Scrape {
    db: String,
    jobs: [(&'static str, JobClassStats); 3],
    levels: Vec<CompactionLevelStats>,
    io: IoStats,
    props: Props,
    stall_seconds: Option<f64>,
    refused: u64,
    background_errors: u64,
}

#[derive(Default)]
struct Props {
    l0_files: u64,
    pending_compaction_bytes: u64,
    immutable_memtables: u64,
    write_stopped: u64,
    delayed_write_rate: u64,
}

fn scrape(db: &StagedDb) -> Scrape {
    let prop = |name: &str| db.db().property_int_value(name).ok().flatten().unwrap_or(0);
    let j = db.jobs();
    Scrape {
        db: db.path().display().to_string(),
        jobs: [("flush", j.flush), ("compaction_l0", j.compaction_l0), ("compaction_ln", j.compaction_ln)],
        levels: db.compaction_levels(),
        io: db.io_stats(),
        props: Props {
            l0_files: prop("rocksdb.num-files-at-level0"),
            pending_compaction_bytes: prop("rocksdb.estimate-pending-compaction-bytes"),
            immutable_memtables: prop("rocksdb.num-immutable-mem-table"),
            write_stopped: prop("rocksdb.is-write-stopped"),
            delayed_write_rate: prop("rocksdb.actual-delayed-write-rate"),
        },
        stall_seconds: db.stall_micros().map(|us| us as f64 * 1e-6),
        refused: db.refused_requests(),
        background_errors: db.background_errors().count,
    }
}

impl Collector for DbMetrics {
    fn encode(&self, e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let dbs: Vec<Scrape> = self.live().iter().map(|d| scrape(d)).collect();
        encode_scrapes(&dbs, e)
    }
}

/// The metrics of DBs read once, now, from DBs the caller holds however it
/// holds them (not necessarily in an `Arc`): for a one-off file, such as a
/// benchmark's end-of-run scrape. Same families as [`DbMetrics`].
pub struct DbSnapshot(Vec<Scrape>);

impl std::fmt::Debug for DbSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbSnapshot").field("dbs", &self.0.len()).finish()
    }
}

impl DbSnapshot {
    /// Reads `dbs` now.
    pub fn of(dbs: &[&StagedDb]) -> DbSnapshot {
        DbSnapshot(dbs.iter().map(|d| scrape(d)).collect())
    }
}

impl Collector for DbSnapshot {
    fn encode(&self, e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        encode_scrapes(&self.0, e)
    }
}

fn encode_scrapes(dbs: &[Scrape], mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
    {
        let db = |s: &Scrape| ("db", s.db.clone());
        type JobField = fn(&JobClassStats) -> u64;
        let job_counters: [(&str, &str, JobField); 4] = [
            ("kvsds_rocksdb_jobs_started", "Flushes and compactions that began, per class.", |j| j.counts.begun),
            ("kvsds_rocksdb_jobs_completed", "Jobs RocksDB reported as completed, per class.", |j| j.counts.completed),
            (
                "kvsds_rocksdb_jobs_retired",
                "Jobs that ended without a completion report (failed, refused, cut short at close).",
                |j| j.retired,
            ),
            (
                "kvsds_rocksdb_job_written_bytes",
                "Bytes the completed jobs wrote (flush: SST size; compaction: output).",
                |j| j.bytes_written,
            ),
        ];
        for (name, help, field) in job_counters {
            family(&mut e, name, help, MetricType::Counter, |m| {
                for s in dbs {
                    for (class, j) in &s.jobs {
                        counter(m, &[db(s), ("class", (*class).to_owned())], field(j))?;
                    }
                }
                Ok(())
            })?;
        }
        family(&mut e, "kvsds_rocksdb_jobs_running", "Jobs running now, per class.", MetricType::Gauge, |m| {
            for s in dbs {
                for (class, j) in &s.jobs {
                    gauge(m, &[db(s), ("class", (*class).to_owned())], j.counts.running as f64)?;
                }
            }
            Ok(())
        })?;
        family(
            &mut e,
            "kvsds_rocksdb_jobs_busy_seconds",
            "Time at least one job of the class ran.",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    for (class, j) in &s.jobs {
                        counter(m, &[db(s), ("class", (*class).to_owned())], j.busy_ns as f64 * 1e-9)?;
                    }
                }
                Ok(())
            },
        )?;
        let level = |s: &Scrape, l: &CompactionLevelStats| [db(s), ("context", l.context.name().to_owned())];
        family(
            &mut e,
            "kvsds_rocksdb_compactions_started",
            "Compactions that began, per level pair (bg_compaction_L1_L2, ...).",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    for l in &s.levels {
                        counter(m, &level(s, l), l.jobs.counts.begun)?;
                    }
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_rocksdb_compactions_completed",
            "Compactions completed, per level pair.",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    for l in &s.levels {
                        counter(m, &level(s, l), l.jobs.counts.completed)?;
                    }
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_rocksdb_compactions_running",
            "Compactions running now, per level pair.",
            MetricType::Gauge,
            |m| {
                for s in dbs {
                    for l in &s.levels {
                        gauge(m, &level(s, l), l.jobs.counts.running as f64)?;
                    }
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_rocksdb_file_bytes",
            "Bytes read and written through the wrapper, per file kind.",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    for (kind, io) in &s.io.files {
                        for (op, c) in [("read", io.read), ("write", io.write)] {
                            counter(
                                m,
                                &[db(s), ("kind", kind_name(*kind).to_owned()), ("op", op.to_owned())],
                                c.bytes,
                            )?;
                        }
                    }
                }
                Ok(())
            },
        )?;
        type PropField = fn(&Props) -> u64;
        let props: [(&str, &str, PropField); 5] = [
            ("kvsds_rocksdb_l0_files", "SST files in L0 (rocksdb.num-files-at-level0).", |p| p.l0_files),
            (
                "kvsds_rocksdb_pending_compaction_bytes",
                "RocksDB's estimate of the bytes compactions must rewrite (rocksdb.estimate-pending-compaction-bytes).",
                |p| p.pending_compaction_bytes,
            ),
            (
                "kvsds_rocksdb_immutable_memtables",
                "Full memtables waiting for a flush (rocksdb.num-immutable-mem-table).",
                |p| p.immutable_memtables,
            ),
            ("kvsds_rocksdb_write_stopped", "1 while RocksDB stops writes (rocksdb.is-write-stopped).", |p| {
                p.write_stopped
            }),
            (
                "kvsds_rocksdb_delayed_write_rate_bytes_per_second",
                "The rate RocksDB slows writes to, 0 when it does not (rocksdb.actual-delayed-write-rate).",
                |p| p.delayed_write_rate,
            ),
        ];
        for (name, help, field) in props {
            family(&mut e, name, help, MetricType::Gauge, |m| {
                for s in dbs {
                    gauge(m, &[db(s)], field(&s.props) as f64)?;
                }
                Ok(())
            })?;
        }
        family(
            &mut e,
            "kvsds_rocksdb_write_stall_seconds",
            "Time RocksDB stalled writes (the stall.micros ticker; only for DBs opened with statistics enabled).",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    if let Some(secs) = s.stall_seconds {
                        counter(m, &[db(s)], secs)?;
                    }
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_rocksdb_refused_requests",
            "File requests the stage refused (each became an I/O error in RocksDB).",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    counter(m, &[db(s)], s.refused)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_rocksdb_background_errors",
            "Background errors RocksDB reported (failed flushes, compactions, WAL or MANIFEST writes).",
            MetricType::Counter,
            |m| {
                for s in dbs {
                    counter(m, &[db(s)], s.background_errors)?;
                }
                Ok(())
            },
        )?;
        Ok(())
    }
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::Other => "other",
        FileKind::Wal => "wal",
        FileKind::Sst => "sst",
        FileKind::Blob => "blob",
        FileKind::Manifest => "manifest",
        FileKind::InfoLog => "info_log",
        FileKind::Directory => "directory",
    }
}
