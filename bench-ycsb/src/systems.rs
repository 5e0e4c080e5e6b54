//! The systems compared, and the RocksDB options and device they share.
//!
//! Every system is RocksDB with the same options on the same device; they
//! differ only in rate control. The device is either the emulated one
//! rocks-env implements (`--device emulated:64MiB/s`: every system runs
//! through rocks-env with the device below its stage) or a real disk the
//! kernel throttles (`--device kernel:rbps=..,wbps=..`: see
//! [`crate::kernel`]; RocksDB uses direct I/O for reads, flush and
//! compaction, and plain `rocksdb` is rust-rocksdb with no wrapper at all).
//!
//! * `rocksdb`: no rate control (on the emulated device, a pass-through
//!   stage: no object ever holds a request; it is there only so that
//!   RocksDB sees the device);
//! * `rocksdb-autotuned`: RocksDB's own auto-tuned rate limiter for flush and
//!   compaction writes, at most `KVS_B`;
//! * `paio-silk`: the paper's RocksDB layout and the SILK controller
//!   (`KVS_B`, `min_B`);
//! * `paio-silk-pressure`: SILK with RocksDB's compaction pressure as an
//!   extra input ([`controller::PressureConfig`]): the background budget
//!   slides from `KVS_B / 3` with no backlog up to SILK's `left_B` as L0
//!   files, waiting memtables or pending compaction bytes pile up;
//! * `paio-static`: the same layout with static DRLs: flushes, L0 and LN
//!   compactions each get a third of `KVS_B`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use controller::{Controller, ControllerConfig, Pressure, PressureConfig, SilkConfig, StageHandle, WithPressure};
use kv_stage::iomax::IoMax;
use kv_stage::{
    ObjectChange, Stage,
    units::{Bandwidth, Rate},
};
use rocks_env::{Device, RocksLayout, StagedDb};
use rocksdb::DB;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::workload::Workload;

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
    /// SILK with compaction pressure as an extra input.
    PaioSilkPressure,
    /// RocksDB through rocks-env and a stage with no limiter and no
    /// controller: what the wrapper alone costs.
    PaioPassthrough,
    /// RocksDB through the stage with the default controller
    /// ([`controller::Adaptive`]).
    PaioAdaptive,
}

impl SystemKind {
    /// All systems, in report order.
    pub const ALL: [SystemKind; 7] = [
        SystemKind::RocksDb,
        SystemKind::PaioPassthrough,
        SystemKind::PaioAdaptive,
        SystemKind::RocksDbAutotuned,
        SystemKind::PaioSilk,
        SystemKind::PaioStatic,
        SystemKind::PaioSilkPressure,
    ];

    /// Other names `--systems` accepts: `(alias, system)`.
    pub const ALIASES: [(&'static str, SystemKind); 2] =
        [("passthrough", SystemKind::PaioPassthrough), ("default", SystemKind::PaioAdaptive)];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            SystemKind::RocksDb => "rocksdb",
            SystemKind::RocksDbAutotuned => "rocksdb-autotuned",
            SystemKind::PaioSilk => "paio-silk",
            SystemKind::PaioStatic => "paio-static",
            SystemKind::PaioSilkPressure => "paio-silk-pressure",
            SystemKind::PaioPassthrough => "paio-passthrough",
            SystemKind::PaioAdaptive => "paio-adaptive",
        }
    }

    /// Whether the system runs through rocks-env and a stage.
    pub fn staged(self) -> bool {
        self != SystemKind::RocksDb
    }

    /// Parses a comma-separated list of names.
    pub fn parse_list(s: &str) -> Result<Vec<SystemKind>> {
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(|x| {
                SystemKind::ALL
                    .into_iter()
                    .find(|k| k.name() == x)
                    .or_else(|| SystemKind::ALIASES.iter().find(|(a, _)| *a == x).map(|(_, k)| *k))
                    .ok_or_else(|| {
                        Error::Usage(format!(
                            "unknown system '{x}' (one of: {}; aliases: {})",
                            SystemKind::ALL.map(SystemKind::name).join(", "),
                            SystemKind::ALIASES.map(|(a, k)| format!("{a} = {}", k.name())).join(", ")
                        ))
                    })
            })
            .collect::<Result<Vec<_>>>()
            .map(|mut v| {
                // An alias and its name given both: once.
                let mut seen = std::collections::HashSet::new();
                v.retain(|k| seen.insert(*k));
                v
            })
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
    /// Bloom filter bits per key (0: no filter).
    pub bloom_bits: f64,
    /// Direct I/O for reads, flush and compaction (on for a kernel device,
    /// so that the kernel charges the I/O to the run's cgroup).
    pub direct_io: bool,
    /// `wal_bytes_per_sync`: the writing thread starts writeback of the WAL
    /// every this many bytes (0: never; the kernel device sets it so that
    /// WAL writes are charged to the run's cgroup, not left to background
    /// writeback).
    pub wal_bytes_per_sync: u64,
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
            bloom_bits: 0.0,
            direct_io: false,
            wal_bytes_per_sync: 0,
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
        if self.bloom_bits > 0.0 {
            t.set_bloom_filter(self.bloom_bits, false);
        }
        o.set_block_based_table_factory(&t);
        o.set_use_direct_reads(self.direct_io);
        o.set_use_direct_io_for_flush_and_compaction(self.direct_io);
        o.set_wal_bytes_per_sync(self.wal_bytes_per_sync);
        o.enable_statistics();
        o
    }

    /// The options for workload `w`: these, except for `longpeak`, which
    /// gets the options of SILK's recipe for its db_bench test
    /// (`../shared/peers/silk/run_silk.sh`): 64 MiB memtables x 4, two
    /// flushes and two compactions, 10 bloom bits, db_bench's 8 MiB cache
    /// and RocksDB's defaults for L0 (slowdown 20, stop 36), L1 (256 MiB)
    /// and table files (64 MiB). The device's settings stay.
    pub fn for_workload(self, w: &Workload) -> DbOptions {
        if w.name != "longpeak" {
            return self;
        }
        DbOptions {
            write_buffer_size: 64 << 20,
            max_write_buffer_number: 4,
            level0_file_num_compaction_trigger: 4,
            level0_slowdown_writes_trigger: 20,
            level0_stop_writes_trigger: 36,
            max_bytes_for_level_base: 256 << 20,
            target_file_size_base: 64 << 20,
            max_background_jobs: 4,
            block_cache_bytes: 8 << 20,
            bloom_bits: 10.0,
            ..self
        }
    }

    /// The options for `device`: direct I/O and WAL writeback by the
    /// writer on a kernel-throttled device.
    pub fn for_device(device: &DeviceSpec) -> DbOptions {
        match device {
            DeviceSpec::Emulated(_) => DbOptions::default(),
            DeviceSpec::Kernel(_) => {
                DbOptions { direct_io: true, wal_bytes_per_sync: KERNEL_WAL_BYTES_PER_SYNC, ..DbOptions::default() }
            }
        }
    }
}

/// `wal_bytes_per_sync` on a kernel device.
pub const KERNEL_WAL_BYTES_PER_SYNC: u64 = 256 << 10;

/// The device every system of a run uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DeviceSpec {
    /// rocks-env's emulated FIFO device: one bandwidth shared by reads and
    /// writes. Spelled `emulated:64MiB/s`, or a bare rate.
    Emulated(Bandwidth),
    /// The disk under the data directory, throttled by the kernel (cgroup
    /// v2 `io.max` or v1 `blkio.throttle.*`). Spelled `kernel:` and the
    /// io.max keys: `kernel:rbps=64MiB,wbps=64MiB,riops=max,wiops=max`.
    Kernel(IoMax),
}

/// The share of a device's bandwidth that `KVS_B` is by default (56 MiB/s
/// of a 64 MiB/s device): some headroom, so that a budget that is used in
/// full does not queue requests at the device.
pub const DEFAULT_BUDGET_SHARE: f64 = 0.875;

/// `KVS_B` when a kernel device limits neither bytes direction.
pub const FALLBACK_BUDGET: f64 = 56.0 * 1048576.0;

impl DeviceSpec {
    /// The default `KVS_B` (and the default controller's `D`): 7/8 of what
    /// the device moves per second, reads and writes together, as the
    /// stage counts them (every DRL charges both). The emulated device
    /// serves reads and writes from one rate: 7/8 of it. A kernel device
    /// throttles each direction on its own: 7/8 of `rbps + wbps` (of the
    /// one that is set, when only one is; [`FALLBACK_BUDGET`] with iops
    /// limits only).
    pub fn default_budget(&self) -> Bandwidth {
        let total = match self {
            DeviceSpec::Emulated(b) => b.bytes_per_sec(),
            DeviceSpec::Kernel(l) => {
                let sum: u64 = [l.rbps, l.wbps].iter().filter_map(|x| x.and_then(|v| v.per_sec())).sum();
                if sum == 0 {
                    return Bandwidth::new(FALLBACK_BUDGET).expect("constant");
                }
                sum as f64
            }
        };
        Bandwidth::new(DEFAULT_BUDGET_SHARE * total).expect("a device's rate is positive")
    }

    /// The default controller's per-direction budgets
    /// ([`controller::AdaptiveConfig::read_bandwidth`] and `write_bandwidth`):
    /// 7/8 of a kernel device's `rbps` and `wbps`, each when set. The
    /// emulated device serves both directions from one rate: none.
    pub fn direction_budgets(&self) -> (Option<Bandwidth>, Option<Bandwidth>) {
        match self {
            DeviceSpec::Emulated(_) => (None, None),
            DeviceSpec::Kernel(l) => {
                let share = |x: Option<_>| {
                    x.and_then(|v: kv_stage::iomax::Limit| v.per_sec())
                        .filter(|&v| v > 0)
                        .and_then(|v| Bandwidth::new(DEFAULT_BUDGET_SHARE * v as f64).ok())
                };
                (share(l.rbps), share(l.wbps))
            }
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if let Some(rest) = s.strip_prefix("kernel:") {
            let l = IoMax::parse(rest).map_err(|e| Error::Usage(format!("--device kernel: {e}")))?.in_effect();
            if l.is_unlimited() {
                return Err(Error::Usage(
                    "--device kernel: no limit given (set at least one of rbps, wbps, riops, wiops)".into(),
                ));
            }
            return Ok(DeviceSpec::Kernel(l));
        }
        if s == "kernel" {
            return Err(Error::Usage("--device kernel needs limits, e.g. kernel:rbps=64MiB,wbps=64MiB".into()));
        }
        let rate = s.strip_prefix("emulated:").unwrap_or(s);
        rate.parse::<Bandwidth>().map(DeviceSpec::Emulated).map_err(|e| {
            Error::Usage(format!(
                "--device '{s}': {e} (emulated:RATE, a bare RATE, or kernel:rbps=..,wbps=..,riops=..,wiops=..)"
            ))
        })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Emulated(b) => write!(f, "emulated:{b}"),
            DeviceSpec::Kernel(l) => write!(f, "kernel:{}", l.to_string().replace(' ', ",")),
        }
    }
}

impl Serialize for DeviceSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Settings shared by all systems of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemConfig {
    /// The device (`emulated:RATE` or `kernel:KEYS` in the report).
    pub device: DeviceSpec,
    /// `KVS_B`: SILK's budget, the auto-tuned limiter's maximum, and what
    /// the static limits split.
    #[serde(rename = "kvs_bps", serialize_with = "bytes_per_sec")]
    pub kvs: Bandwidth,
    /// SILK's `min_B`.
    #[serde(rename = "min_bps", serialize_with = "bytes_per_sec")]
    pub min: Bandwidth,
    /// SILK's interval.
    pub silk_interval_ms: u64,
    /// CPU priority of RocksDB's background threads (`normal`, `low`).
    pub background_cpu: String,
    /// The default controller's parameters (`paio-adaptive`): `D` is
    /// `KVS_B` and the floor `min_B` unless a controller file said otherwise.
    pub adaptive: controller::AdaptiveConfig,
    /// The default controller's bound on head-of-line blocking
    /// (`paio-adaptive` only): the largest read or write a flush or
    /// compaction issues at once (0: none), see
    /// [`rocks_env::StagedDbBuilder::max_background_request`].
    pub max_background_request: u64,
    /// The default controller's paced deletion of obsolete files, bytes/s
    /// (`paio-adaptive` only; 0: at once), see
    /// [`rocks_env::StagedDbBuilder::delete_rate`].
    pub delete_rate: u64,
    /// The default controller's deferred deletion of obsolete files: the
    /// longest a deletion waits for a calm moment (`paio-adaptive` only;
    /// zero: none), see [`rocks_env::StagedDbBuilder::defer_deletions`].
    #[serde(with = "kv_stage::units::duration_str")]
    pub defer_deletions: std::time::Duration,
    /// The default controller's deletion in pieces: bytes freed at a time
    /// (`paio-adaptive` only; 0: at once), see
    /// [`rocks_env::StagedDbBuilder::delete_in_pieces`].
    pub delete_piece: u64,
    /// The default controller's block-cache warming (`paio-adaptive`
    /// only): `off`, `flush` or `flush-and-compaction`, RocksDB's
    /// `prepopulate_block_cache` (kDisable, kFlushOnly,
    /// kFlushAndCompaction).
    pub prepopulate_block_cache: String,
    /// RocksDB options.
    pub db: DbOptions,
}

fn bytes_per_sec<S: serde::Serializer>(b: &Bandwidth, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(b.bytes_per_sec())
}

/// The DB of a system: plain rust-rocksdb, or through a stage.
pub enum SystemDb {
    /// rust-rocksdb with no wrapper (plain `rocksdb` on a kernel device).
    Plain(DB),
    /// Through rocks-env and a stage.
    Staged(Arc<StagedDb>),
}

impl SystemDb {
    /// The RocksDB handle clients use.
    pub fn db(&self) -> &DB {
        match self {
            SystemDb::Plain(db) => db,
            SystemDb::Staged(s) => s.db(),
        }
    }
}

/// Bytes a system read and wrote, as it saw them: through the stage, or,
/// for plain RocksDB, from RocksDB's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SeenBytes {
    /// Bytes read from files.
    pub read_bytes: u64,
    /// Bytes written to files.
    pub write_bytes: u64,
    /// Where the figures come from: `stage` or `rocksdb-statistics`.
    pub source: String,
}

/// A system, open and ready for clients.
pub struct RunningSystem {
    /// Which.
    pub kind: SystemKind,
    /// The DB.
    pub db: SystemDb,
    /// Its stage (none for plain RocksDB on a kernel device).
    pub stage: Option<Arc<Stage>>,
    /// The emulated device (none on a kernel device).
    pub device: Option<Arc<Device>>,
    /// The controller (paio-silk).
    pub controller: Option<Controller>,
    /// The options it was opened with (for statistics).
    pub options: rocksdb::Options,
    /// Where the pressure the controller reads comes from
    /// (`paio-silk-pressure`): [`RunningSystem::sample_pressure`] fills it.
    /// The default controller reads RocksDB's properties on its own thread
    /// instead.
    pub pressure: Option<Arc<PressureCell>>,
}

impl RunningSystem {
    /// Bytes read and written so far, as the system saw them. For plain
    /// RocksDB: WAL, flush and compaction writes, and every table-file read
    /// RocksDB counted (`rocksdb.{last,non.last}.level.read.bytes`).
    pub fn seen_bytes(&self) -> SeenBytes {
        use rocksdb::statistics::Ticker;
        match &self.db {
            SystemDb::Staged(s) => {
                let io = s.io_stats();
                SeenBytes { read_bytes: io.bytes_read(), write_bytes: io.bytes_written(), source: "stage".into() }
            }
            SystemDb::Plain(_) => {
                let t = |k| self.options.get_ticker_count(k);
                SeenBytes {
                    read_bytes: t(Ticker::LastLevelReadBytes) + t(Ticker::NonLastLevelReadBytes),
                    write_bytes: t(Ticker::WalFileBytes) + t(Ticker::FlushWriteBytes) + t(Ticker::CompactWriteBytes),
                    source: "rocksdb-statistics".into(),
                }
            }
        }
    }

    /// Per-level-pair compaction statistics (systems on the stage; empty
    /// for plain RocksDB, which has no listener).
    pub fn compaction_levels(&self) -> Vec<rocks_env::CompactionLevelStats> {
        match &self.db {
            SystemDb::Staged(s) => s.compaction_levels(),
            SystemDb::Plain(_) => Vec::new(),
        }
    }

    /// Reads RocksDB's compaction pressure into the cell the controller
    /// reads (`paio-silk-pressure` only; a no-op otherwise). The caller
    /// calls it every few milliseconds while the system runs.
    pub fn sample_pressure(&self, o: &DbOptions) {
        if let Some(cell) = &self.pressure {
            cell.set(read_pressure(self.db.db(), o));
        }
    }

    /// Stops the controller (which flushes its log), then closes the DB.
    pub fn close(self) {
        let RunningSystem { db, controller, .. } = self;
        if let Some(c) = controller {
            c.stop();
        }
        drop(db);
    }
}

/// RocksDB's compaction pressure as SILK with pressure reads it: L0 files
/// over the slowdown trigger, immutable memtables over how many may wait
/// (`max_write_buffer_number - 1`), and pending compaction bytes over
/// [`PENDING_REFERENCE_LEVELS`] times the L1 size.
pub fn read_pressure(db: &DB, o: &DbOptions) -> Pressure {
    let prop = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0) as f64;
    Pressure::new(
        prop("rocksdb.num-files-at-level0") / f64::from(o.level0_slowdown_writes_trigger.max(1)),
        prop("rocksdb.num-immutable-mem-table") / f64::from((o.max_write_buffer_number - 1).max(1)),
        prop("rocksdb.estimate-pending-compaction-bytes")
            / (PENDING_REFERENCE_LEVELS * o.max_bytes_for_level_base as f64).max(1.0),
    )
}

/// A [`WithPressure`] source: `db`'s pressure ([`read_pressure`]), read
/// each time it is called (on the controller's thread, once per cycle),
/// and no pressure once the DB is closed (the source holds it weakly, so
/// the controller does not keep it open).
pub fn pressure_source(db: &Arc<StagedDb>, o: &DbOptions) -> impl Fn() -> Pressure + Send + Sync + 'static {
    let (weak, o) = (Arc::downgrade(db), o.clone());
    move || weak.upgrade().map_or_else(|| Pressure::new(0.0, 0.0, 0.0), |db| read_pressure(db.db(), &o))
}

/// Pending compaction bytes count as pressure 1 at this many L1 sizes.
pub const PENDING_REFERENCE_LEVELS: f64 = 4.0;

/// The latest pressure reading, shared between the sampler and the
/// controller's handle (f64 bits in atomics: no lock).
#[derive(Debug, Default)]
pub struct PressureCell {
    parts: [AtomicU64; 3],
}

impl PressureCell {
    /// Stores a reading.
    pub fn set(&self, p: Pressure) {
        for (a, v) in self.parts.iter().zip([p.l0, p.memtables, p.pending]) {
            a.store(v.to_bits(), Ordering::Relaxed);
        }
    }

    /// The latest reading.
    pub fn get(&self) -> Pressure {
        let [l0, m, p] = [0, 1, 2].map(|i| f64::from_bits(self.parts[i].load(Ordering::Relaxed)));
        Pressure::new(l0, m, p)
    }
}

/// Sets RocksDB's `prepopulate_block_cache` on an open DB (its table
/// options are mutable): `off`, `flush` (kFlushOnly) or
/// `flush-and-compaction` (kFlushAndCompaction). `off` changes nothing.
pub fn prepopulate_block_cache(db: &DB, value: &str) -> Result<()> {
    let v = match value {
        "off" => return Ok(()),
        "flush" => "kFlushOnly",
        "flush-and-compaction" => "kFlushAndCompaction",
        other => {
            return Err(Error::Usage(format!(
                "--prepopulate-block-cache: {other:?} is not off, flush or flush-and-compaction"
            )));
        }
    };
    db.set_options(&[("block_based_table_factory", &format!("{{prepopulate_block_cache={v};}}"))])?;
    Ok(())
}

/// Opens `kind` on a copy of the loaded DB at `path`. A controller, if the
/// system has one, appends its decision log to `decision_log`.
pub fn open(kind: SystemKind, path: &Path, cfg: &SystemConfig, decision_log: Option<&Path>) -> Result<RunningSystem> {
    let device = match cfg.device {
        DeviceSpec::Emulated(b) => Some(Device::new(b)),
        DeviceSpec::Kernel(_) => None,
    };
    let mut options = cfg.db.rocksdb();
    let kvs = cfg.kvs;
    if kind == SystemKind::RocksDbAutotuned {
        options.set_auto_tuned_ratelimiter(cfg.kvs.bytes_per_sec() as i64, 100_000, 10);
    }
    if kind == SystemKind::RocksDb && device.is_none() {
        // On a real device, plain RocksDB is plain rust-rocksdb.
        let db = DB::open(&options, path)?;
        return Ok(RunningSystem {
            kind,
            db: SystemDb::Plain(db),
            stage: None,
            device,
            controller: None,
            options,
            pressure: None,
        });
    }
    let stage = Arc::new(Stage::new(kind.name()));
    match kind {
        SystemKind::RocksDb | SystemKind::RocksDbAutotuned | SystemKind::PaioPassthrough => {}
        SystemKind::PaioSilk | SystemKind::PaioSilkPressure | SystemKind::PaioAdaptive => {
            RocksLayout::new().install(&stage)?;
        }
        SystemKind::PaioStatic => {
            let h = RocksLayout::new().install(&stage)?;
            let third = ObjectChange::rate(
                Rate::from_bytes_per_sec(kvs.bytes_per_sec() / 3.0).map_err(|e| Error::Usage(e.to_string()))?,
            );
            for o in [&h.flush, &h.compaction_l0, &h.compaction_ln] {
                o.configure(&third)?;
            }
        }
    }
    let mut builder = StagedDb::builder(options.clone()).stage(Arc::clone(&stage));
    if let Some(d) = &device {
        builder = builder.device(Arc::clone(d));
    }
    if kind == SystemKind::PaioAdaptive {
        builder = builder
            .max_background_request(cfg.max_background_request)
            .delete_rate(cfg.delete_rate)
            .defer_deletions(cfg.defer_deletions)
            .delete_in_pieces(cfg.delete_piece);
    }
    let db = Arc::new(builder.open(path)?);
    if kind == SystemKind::PaioAdaptive {
        prepopulate_block_cache(db.db(), &cfg.prepopulate_block_cache)?;
    }
    let pressure = matches!(kind, SystemKind::PaioSilkPressure).then(|| Arc::new(PressureCell::default()));
    let controller = match kind {
        SystemKind::PaioAdaptive => {
            let mut c = ControllerConfig::adaptive(cfg.adaptive.clone());
            c.interval = Some(Duration::from_millis(cfg.silk_interval_ms));
            c.log = decision_log.map(Path::to_path_buf);
            // As an embedding gets it (`kv_async::Protection`): the pressure
            // is read on the controller's thread when it cycles, with no
            // sampler thread of its own, so a calm store is read only as
            // often as the controller wakes (`adaptive.idle_interval`).
            let handle: Arc<dyn StageHandle> =
                Arc::new(WithPressure::new(stage.clone(), pressure_source(&db, &cfg.db)));
            Some(Controller::builder(c).instance("db", handle).max_log_records(0).start()?)
        }
        SystemKind::PaioSilk | SystemKind::PaioSilkPressure => {
            let mut c = ControllerConfig::silk(SilkConfig {
                kvs_bandwidth: kvs,
                min_bandwidth: cfg.min,
                hysteresis: Rate::from_bytes_per_sec(cfg.min.bytes_per_sec() / 4.0)
                    .map_err(|e| Error::Usage(e.to_string()))?,
                pressure: pressure
                    .is_some()
                    .then(|| Bandwidth::new(kvs.bytes_per_sec() / 3.0).map(PressureConfig::new))
                    .transpose()
                    .map_err(|e| Error::Usage(e.to_string()))?,
            });
            c.interval = Some(Duration::from_millis(cfg.silk_interval_ms));
            c.log = decision_log.map(Path::to_path_buf);
            let handle: Arc<dyn StageHandle> = match &pressure {
                Some(cell) => {
                    let cell = Arc::clone(cell);
                    Arc::new(WithPressure::new(stage.clone(), move || cell.get()))
                }
                None => stage.clone(),
            };
            // The file has every cycle; nothing needs them in memory.
            Some(Controller::builder(c).instance("db", handle).max_log_records(0).start()?)
        }
        _ => None,
    };
    Ok(RunningSystem { kind, db: SystemDb::Staged(db), stage: Some(stage), device, controller, options, pressure })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The setting reaches RocksDB: the OPTIONS file it writes after
    /// `SetOptions` has the value; a bad value is refused by name.
    #[test]
    fn prepopulate_block_cache_reaches_rocksdb() {
        let dir = tempfile::tempdir().unwrap();
        let db = DB::open(&DbOptions::default().rocksdb(), dir.path()).unwrap();
        let latest = || {
            let mut files: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("OPTIONS-"))
                .collect();
            files.sort_by_key(|n| n["OPTIONS-".len()..].parse::<u64>().unwrap());
            std::fs::read_to_string(dir.path().join(files.last().unwrap())).unwrap()
        };
        assert!(latest().contains("prepopulate_block_cache=kDisable"));
        prepopulate_block_cache(&db, "off").unwrap();
        assert!(latest().contains("prepopulate_block_cache=kDisable"));
        prepopulate_block_cache(&db, "flush-and-compaction").unwrap();
        assert!(latest().contains("prepopulate_block_cache=kFlushAndCompaction"), "{}", latest());
        prepopulate_block_cache(&db, "flush").unwrap();
        assert!(latest().contains("prepopulate_block_cache=kFlushOnly"));
        let e = prepopulate_block_cache(&db, "always").unwrap_err().to_string();
        assert!(e.contains("--prepopulate-block-cache") && e.contains("always"), "{e}");
    }

    #[test]
    fn device_specs() {
        let e: DeviceSpec = "64MiB/s".parse().unwrap();
        assert_eq!(e, "emulated:64MiB/s".parse().unwrap());
        let k: DeviceSpec = "kernel:rbps=64MiB,wbps=64MiB".parse().unwrap();
        assert_eq!(k.to_string(), "kernel:rbps=67108864,wbps=67108864,riops=max,wiops=max");
        assert_eq!(k.to_string().parse::<DeviceSpec>().unwrap(), k);
        for (bad, words) in [
            ("kernel:wbps=-1", "wbps: "),
            ("kernel:rbps=12XB", "rbps: "),
            ("kernel:rbps=1M,speed=3", "speed: unknown key"),
            ("kernel:", "no limit"),
            ("kernel", "needs limits"),
            ("emulated:fast", "--device 'emulated:fast'"),
        ] {
            let e = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert!(e.contains(words), "{bad}: {e}");
        }
    }

    #[test]
    fn the_default_budget_is_seven_eighths_of_what_the_device_moves() {
        const MIB: f64 = 1048576.0;
        let b = |s: &str| s.parse::<DeviceSpec>().unwrap().default_budget().bytes_per_sec() / MIB;
        assert_eq!(b("emulated:64MiB/s"), 56.0);
        assert_eq!(b("64MiB/s"), 56.0);
        assert_eq!(b("kernel:rbps=64MiB,wbps=64MiB"), 112.0);
        assert_eq!(b("kernel:rbps=64MiB,wbps=32MiB"), 84.0);
        assert_eq!(b("kernel:wbps=64MiB"), 56.0);
        assert_eq!(b("kernel:riops=1000"), 56.0);
        // Per direction: 7/8 of each limit a kernel device sets.
        let d = |s: &str| {
            let (r, w) = s.parse::<DeviceSpec>().unwrap().direction_budgets();
            (r.map(|x| x.bytes_per_sec() / MIB), w.map(|x| x.bytes_per_sec() / MIB))
        };
        assert_eq!(d("emulated:64MiB/s"), (None, None));
        assert_eq!(d("kernel:rbps=64MiB,wbps=32MiB"), (Some(56.0), Some(28.0)));
        assert_eq!(d("kernel:wbps=64MiB"), (None, Some(56.0)));
        assert_eq!(d("kernel:riops=1000"), (None, None));
    }

    #[test]
    fn longpeak_gets_the_options_of_silks_recipe_and_keeps_the_device() {
        let k: DeviceSpec = "kernel:rbps=64MiB,wbps=64MiB".parse().unwrap();
        let base = DbOptions::for_device(&k);
        let lp = base.clone().for_workload(&Workload::builtin("longpeak").unwrap());
        assert_eq!((lp.write_buffer_size, lp.max_write_buffer_number, lp.max_background_jobs), (64 << 20, 4, 4));
        assert_eq!((lp.bloom_bits, lp.block_cache_bytes), (10.0, 8 << 20));
        assert_eq!((lp.direct_io, lp.wal_bytes_per_sync), (true, KERNEL_WAL_BYTES_PER_SYNC));
        // Every other workload keeps the defaults.
        assert_eq!(base.clone().for_workload(&Workload::builtin("mixture").unwrap()), base);
    }
}
