//! The systems compared, and the RocksDB options and device they share.
//!
//! Every system is RocksDB opened through rocks-env on the same emulated
//! device, with the same options; they differ only in rate control:
//!
//! * `rocksdb`: no rate control (a pass-through stage: no object ever holds
//!   a request; it is there only so that RocksDB sees the emulated device);
//! * `rocksdb-autotuned`: RocksDB's own auto-tuned rate limiter for flush and
//!   compaction writes, at most `KVS_B`;
//! * `paio-silk`: the paper's RocksDB layout and the SILK controller
//!   (`KVS_B`, `min_B`);
//! * `paio-static`: the same layout with static DRLs: flushes, L0 and LN
//!   compactions each get a third of `KVS_B`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use controller::{Controller, ControllerConfig, SilkConfig};
use kv_stage::{Bandwidth, ObjectConfig, Rate, Stage};
use rocks_env::{Device, RocksLayout, StagedDb};
use serde::Serialize;

use crate::error::{Error, Result};

/// A system under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum SystemKind {
    /// Plain RocksDB.
    RocksDb,
    /// RocksDB with its auto-tuned rate limiter.
    RocksDbAutotuned,
    /// RocksDB through the stage with the SILK controller.
    PaioSilk,
    /// RocksDB through the stage with static limits.
    PaioStatic,
}

impl SystemKind {
    /// All systems, in report order.
    pub const ALL: [SystemKind; 4] =
        [SystemKind::RocksDb, SystemKind::RocksDbAutotuned, SystemKind::PaioSilk, SystemKind::PaioStatic];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::RocksDb => "rocksdb",
            SystemKind::RocksDbAutotuned => "rocksdb-autotuned",
            SystemKind::PaioSilk => "paio-silk",
            SystemKind::PaioStatic => "paio-static",
        }
    }

    /// Parses a comma-separated list of names.
    pub fn parse_list(s: &str) -> Result<Vec<SystemKind>> {
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| {
                SystemKind::ALL.into_iter().find(|k| k.name() == x).ok_or_else(|| {
                    Error::Usage(format!(
                        "unknown system '{x}' (one of: {})",
                        SystemKind::ALL.map(SystemKind::name).join(", ")
                    ))
                })
            })
            .collect()
    }
}

/// RocksDB options every system gets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DbOptions {
    /// Memtable size.
    pub write_buffer_size: usize,
    /// Memtables (writes stall when all are full and not flushed).
    pub max_write_buffer_number: i32,
    /// L0 files that trigger an L0->L1 compaction.
    pub level0_file_num_compaction_trigger: i32,
    /// L0 files at which writes slow down.
    pub level0_slowdown_writes_trigger: i32,
    /// L0 files at which writes stop.
    pub level0_stop_writes_trigger: i32,
    /// Size of L1.
    pub max_bytes_for_level_base: u64,
    /// Table file size.
    pub target_file_size_base: u64,
    /// Background threads (flushes and compactions).
    pub max_background_jobs: i32,
    /// Block cache size.
    pub block_cache_bytes: usize,
}

impl Default for DbOptions {
    /// Options under which flushes and compactions compete with clients on a
    /// slow device: small memtables, an L0 that stalls writes early, a block
    /// cache smaller than the default data set (256 MiB for about 400 MB),
    /// so reads reach the device.
    fn default() -> Self {
        DbOptions {
            write_buffer_size: 16 << 20,
            max_write_buffer_number: 2,
            level0_file_num_compaction_trigger: 4,
            level0_slowdown_writes_trigger: 12,
            level0_stop_writes_trigger: 20,
            max_bytes_for_level_base: 64 << 20,
            target_file_size_base: 16 << 20,
            max_background_jobs: 3,
            block_cache_bytes: 256 << 20,
        }
    }
}

impl DbOptions {
    /// The `rocksdb::Options` (shared by load and every system).
    pub fn rocksdb(&self) -> rocksdb::Options {
        let mut o = rocksdb::Options::default();
        o.create_if_missing(true);
        o.set_write_buffer_size(self.write_buffer_size);
        o.set_max_write_buffer_number(self.max_write_buffer_number);
        o.set_level_zero_file_num_compaction_trigger(self.level0_file_num_compaction_trigger);
        o.set_level_zero_slowdown_writes_trigger(self.level0_slowdown_writes_trigger);
        o.set_level_zero_stop_writes_trigger(self.level0_stop_writes_trigger);
        o.set_max_bytes_for_level_base(self.max_bytes_for_level_base);
        o.set_target_file_size_base(self.target_file_size_base);
        o.set_max_background_jobs(self.max_background_jobs);
        o.set_compression_type(rocksdb::DBCompressionType::None);
        let mut t = rocksdb::BlockBasedOptions::default();
        t.set_block_cache(&rocksdb::Cache::new_lru_cache(self.block_cache_bytes));
        o.set_block_based_table_factory(&t);
        o.enable_statistics();
        o
    }
}

/// Settings shared by all systems of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemConfig {
    /// Emulated device bandwidth (bytes/s in the report).
    #[serde(rename = "device_bps", serialize_with = "bytes_per_sec")]
    pub device: Bandwidth,
    /// `KVS_B`: SILK's budget, the auto-tuned limiter's maximum, and what
    /// the static limits split.
    #[serde(rename = "kvs_bps", serialize_with = "bytes_per_sec")]
    pub kvs: Bandwidth,
    /// SILK's `min_B`.
    #[serde(rename = "min_bps", serialize_with = "bytes_per_sec")]
    pub min: Bandwidth,
    /// SILK's interval.
    pub silk_interval_ms: u64,
    /// RocksDB options.
    pub db: DbOptions,
}

fn bytes_per_sec<S: serde::Serializer>(b: &Bandwidth, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(b.bytes_per_sec())
}

/// A system, open and ready for clients.
pub struct RunningSystem {
    /// Which.
    pub kind: SystemKind,
    /// The DB.
    pub db: StagedDb,
    /// Its stage.
    pub stage: Arc<Stage>,
    /// The emulated device.
    pub device: Arc<Device>,
    /// The controller (paio-silk).
    pub controller: Option<Controller>,
    /// The options it was opened with (for statistics).
    pub options: rocksdb::Options,
}

/// Opens `kind` on a copy of the loaded DB at `path`. A controller, if the
/// system has one, appends its decision log to `decision_log`.
pub fn open(kind: SystemKind, path: &Path, cfg: &SystemConfig, decision_log: Option<&Path>) -> Result<RunningSystem> {
    let device = Device::new(cfg.device);
    let stage = Arc::new(Stage::new(kind.name()));
    let mut options = cfg.db.rocksdb();
    let kvs = cfg.kvs;
    match kind {
        SystemKind::RocksDb => {}
        SystemKind::RocksDbAutotuned => {
            options.set_auto_tuned_ratelimiter(cfg.kvs.bytes_per_sec() as i64, 100_000, 10);
        }
        SystemKind::PaioSilk => {
            RocksLayout::new().install(&stage)?;
        }
        SystemKind::PaioStatic => {
            let h = RocksLayout::new().install(&stage)?;
            let third = ObjectConfig::rate(
                Rate::bytes_per_sec(kvs.bytes_per_sec() / 3.0).map_err(|e| Error::Usage(e.to_string()))?,
            );
            for o in [&h.flush, &h.compaction_l0, &h.compaction_ln] {
                o.configure(&third)?;
            }
        }
    }
    let db = StagedDb::builder(options.clone()).stage(Arc::clone(&stage)).device(Arc::clone(&device)).open(path)?;
    let controller = match kind {
        SystemKind::PaioSilk => {
            let mut c = ControllerConfig::silk(SilkConfig {
                kvs_bandwidth: kvs,
                min_bandwidth: cfg.min,
                hysteresis: Rate::bytes_per_sec(cfg.min.bytes_per_sec() / 4.0)
                    .map_err(|e| Error::Usage(e.to_string()))?,
            });
            c.interval = Some(Duration::from_millis(cfg.silk_interval_ms));
            c.log = decision_log.map(Path::to_path_buf);
            // The file has every cycle; nothing needs them in memory.
            Some(Controller::builder(c).instance("db", stage.clone()).max_log_records(0).start()?)
        }
        _ => None,
    };
    Ok(RunningSystem { kind, db, stage, device, controller, options })
}
