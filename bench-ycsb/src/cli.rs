//! The `bench-ycsb` command line: run a YCSB workload side by side against
//! RocksDB, RocksDB with its auto-tuned rate limiter, and RocksDB through a
//! stage with SILK or static limits, on an emulated or a kernel-throttled
//! device; or the paper's three workloads at once (`figures`). The binary is
//! [`main`] with the process's arguments; tests call it in a child process
//! of their own.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::disk_probe::DiskProbe;
use crate::kernel::{self, KernelDevice};
use crate::profile::Profile;
use crate::report::{self, BenchReport, ByteCheck, SystemReport};
use crate::runner::{self, RunParams};
use crate::systems::{self, DbOptions, DeviceSpec, SystemConfig, SystemKind};
use crate::workload::Workload;
use crate::{Error, Result};
use crate::{attribution, debt};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kv_stage::units::{Bandwidth, parse_duration};

const EXAMPLES: &str = "\
Examples:
  # The default comparison (mixture workload, all four systems, about 5 minutes):
  bench-ycsb run --out results

  # The same on the real disk, throttled by the kernel to 64 MiB/s each way (root):
  bench-ycsb run --device kernel:rbps=64MiB,wbps=64MiB --out results-kernel

  # The paper's three workloads (Fig. 5-7), cold and warm start, 3 repeats:
  bench-ycsb figures --out figures

  # Read-heavy, SILK against plain RocksDB only, 2 minutes each, a faster device:
  bench-ycsb run --workload read-heavy --systems rocksdb,paio-silk --duration 120s --device 128MiB/s --out rh

  # A YCSB property file and a constant load:
  bench-ycsb run --workload workloads/workloada --profile constant:3000 --out a

  # Load once, reuse the loaded DB for several runs:
  bench-ycsb load --db /tmp/ycsb-base
  bench-ycsb run --base /tmp/ycsb-base --out run1

  # Re-plot saved results:
  bench-ycsb report results

  # Several runs of one command, pooled against plain RocksDB:
  bench-ycsb pool run1 run2 run3 --target 1.1";

/// The longest a disk probe runs (a bound on its loop; a comparison drops
/// its probe when it ends).
const PROBE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// Records a built-in workload loads unless `--recordcount` says otherwise:
/// about 400 MB of 1 KB records, enough that compactions reach L2.
const DEFAULT_RECORDCOUNT: u64 = 400_000;

/// The default load profile: SILK's shape, peaks of 5,000 ops/s.
const DEFAULT_PROFILE: &str = "paper";

#[derive(Parser)]
#[command(name = "bench-ycsb", about = "YCSB workloads, open loop, side by side: RocksDB vs RocksDB with SILK through a kv-stage stage", after_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load (unless --base), then run every system and report.
    Run(RunArgs),
    /// The paper's three workloads (mixture, read-heavy, write-heavy), every
    /// system, cold and warm start, alternating repeats; one figures.md.
    Figures(FiguresArgs),
    /// Only load a DB, for later runs with --base.
    Load(LoadArgs),
    /// Re-make the table, CSV and plots from a results directory.
    Report {
        /// Directory with summary.json.
        dir: PathBuf,
    },
    /// Pool several runs of one command: per system, each run's p99 ratio
    /// to the baseline, and every repeat paired with the baseline's repeat
    /// of the same number, with a bootstrap interval over runs (see
    /// bench_ycsb::pool).
    Pool(PoolArgs),
}

#[derive(Args)]
struct PoolArgs {
    /// Results directories (each with summary.json) of one command.
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// The system ratios are to (a name or an alias, e.g. passthrough).
    #[arg(long, default_value = "rocksdb")]
    baseline: String,
    /// A ratio to hold each run to (e.g. 1.1): the table says how many
    /// runs' p99 ratio was at or under it.
    #[arg(long)]
    target: Option<f64>,
    /// Also write pool.txt and pool.json here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Args, Clone)]
struct WorkloadArgs {
    /// Built-in workload (a-f, mixture, read-heavy, write-heavy, longpeak) or a YCSB property file.
    #[arg(long, default_value = "mixture")]
    workload: String,
    /// Records to load [default: 400000 for a built-in workload, the file's
    /// `recordcount` for a property file]; for `longpeak`, the key space
    /// (5000000 by default), of which nothing is loaded.
    #[arg(long)]
    recordcount: Option<u64>,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

#[derive(Args)]
struct LoadArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Where to create the DB.
    #[arg(long)]
    db: PathBuf,
}

/// What `run` and `figures` share.
#[derive(Args, Clone)]
struct SystemArgs {
    /// Systems, comma-separated: rocksdb, paio-passthrough (alias passthrough),
    /// paio-adaptive (alias default: the default controller), rocksdb-autotuned,
    /// paio-silk, paio-static, paio-silk-pressure.
    #[arg(long, default_value = "rocksdb,paio-passthrough,paio-adaptive,rocksdb-autotuned,paio-silk,paio-static")]
    systems: String,
    /// Client threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Load profile: constant:RATE, silk:low=..,peak=..[,valley=..,low-for=..,period=..], file:PATH,
    /// or a name: paper (silk:low=1000,peak=5000,valley=1000,low-for=10s,period=20s),
    /// light (constant:1000), write-peaks (as paper with peaks of 10000).
    #[arg(long, default_value = DEFAULT_PROFILE)]
    profile: String,
    /// The device: emulated:RATE (rocks-env's FIFO device, reads and writes
    /// share RATE; a bare RATE means the same), or kernel:rbps=..,wbps=..,riops=..,wiops=..
    /// (the disk under --data, throttled by a cgroup; io.max keys, human
    /// units, `max` = unlimited; needs root).
    #[arg(long, default_value = "emulated:64MiB/s")]
    device: DeviceSpec,
    /// KVS_B: SILK's budget, the auto-tuned limiter's maximum, what static
    /// limits split, the default controller's D. Default: 7/8 of what the
    /// device moves, reads and writes together (56MiB/s of emulated:64MiB/s;
    /// 112MiB/s of kernel:rbps=64MiB,wbps=64MiB, which throttles each
    /// direction on its own).
    #[arg(long)]
    kvs_bandwidth: Option<Bandwidth>,
    /// SILK's min_B.
    #[arg(long, default_value = "4MiB/s")]
    min_bandwidth: Bandwidth,
    /// Where the DB copies live (default: OUT/data; removed after each run).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Keep the DB copies.
    #[arg(long)]
    keep_data: bool,
    /// Longest wait for RocksDB to settle before a warm start.
    #[arg(long, default_value = "600s", value_parser = parse_duration)]
    settle_timeout: Duration,
    /// Warm start: where the loaded DB's compactions run: `base` (once, on
    /// the loaded DB off the throttled device, so every system starts from
    /// the same settled LSM) or `each` (on each system's copy, on its device,
    /// under its controller).
    #[arg(long, default_value = "base", value_parser = ["base", "each"])]
    settle_on: String,
    /// After each run, how long to keep the DB open (on the same device,
    /// its controller running) for RocksDB to pay the debt the run left;
    /// the time it took is reported (`0s`: do not wait).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    drain_timeout: Duration,
    /// CPU priority of RocksDB's background threads (flushes,
    /// compactions), for every system: `normal`, or `low` (nice 19, through
    /// RocksDB's own `LowerThreadPoolCPUPriority`).
    #[arg(long, default_value = "normal", value_parser = ["normal", "low"])]
    background_cpu: String,
    /// The default controller's parameters (`paio-adaptive`): a controller
    /// file (TOML) whose `[adaptive]` table replaces the defaults (which are
    /// `device_bandwidth` = --kvs-bandwidth, `min_bandwidth` = --min-bandwidth).
    #[arg(long)]
    adaptive_config: Option<PathBuf>,
    /// A bound on head-of-line blocking for the default controller
    /// (`paio-adaptive` only): the largest read or write a flush or
    /// compaction issues to the device at once, on direct-I/O files (a
    /// kernel device); larger ones go in pieces of this size. Default
    /// 64 KiB (rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST); `0`: no bound.
    #[arg(long, default_value_t = rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST, value_parser = parse_request_size)]
    max_background_request: u64,
    /// Paced deletion of obsolete files for the default controller
    /// (`paio-adaptive` only), bytes per second: RocksDB's delete
    /// scheduler unlinks them one after the other at this rate
    /// (rocks_env::StagedDbBuilder::delete_rate); `0`: at once.
    #[arg(long, default_value = "0", value_parser = parse_request_size)]
    delete_rate: u64,
    /// Deferred deletion of obsolete files for the default controller
    /// (`paio-adaptive` only): while its controller limits flushes or
    /// compactions, a deleted file waits (renamed) for a calm moment, at
    /// most this long (rocks_env::StagedDbBuilder::defer_deletions).
    /// Default 30s (rocks_env::DEFAULT_DEFER_DELETIONS); `0s`: deleted at
    /// once.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    defer_deletions: std::time::Duration,
    /// Deletion in pieces for the default controller (`paio-adaptive`
    /// only): every obsolete file is freed this many bytes at a time by the
    /// file system layer's thread, 10 ms apart, so that no discard of a
    /// whole file holds the device (rocks_env::StagedDbBuilder::delete_in_pieces).
    /// Default 1MiB (rocks_env::DEFAULT_DELETE_PIECE); `0`: at once.
    #[arg(long, default_value = "1MiB", value_parser = parse_request_size)]
    delete_piece: u64,
    /// Block-cache warming for the default controller (`paio-adaptive`
    /// only): RocksDB's `prepopulate_block_cache`, `off`, `flush` (blocks
    /// a flush writes go into the block cache) or `flush-and-compaction`
    /// (also the blocks a compaction writes, so that the clients' reads of
    /// a compaction's new files do not all miss the cache at once).
    #[arg(long, default_value = "off", value_parser = ["off", "flush", "flush-and-compaction"])]
    prepopulate_block_cache: String,
    /// The default controller's `demand_memory` (`paio-adaptive` only; it
    /// overrides the value of `--adaptive-config`): how long the clients'
    /// recent file traffic still counts as their demand when it sets what
    /// background work may use. Default: the controller's (0s, off).
    #[arg(long, value_parser = parse_duration)]
    demand_memory: Option<std::time::Duration>,
    /// The disk probe (see bench_ycsb::disk_probe): a 4 KiB direct read of
    /// a file of its own under --data every this often, outside the
    /// throttle, so that each repeat reports what the disk itself gave
    /// while it ran, the same for every system; `0s`: off. The data
    /// directory must take direct I/O (a disk, not a tmpfs).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    disk_probe: Duration,
    /// The client threads' timer slack (see bench_ycsb::runner): how late
    /// the kernel may wake a client that slept until a request's time.
    /// Default 1ns, the smallest; `50us` is Linux's default, as runs before
    /// this option had it (their latencies include up to that much of the
    /// load generator's own lateness).
    #[arg(long, default_value = "1ns", value_parser = parse_duration)]
    client_timer_slack: Duration,
    /// Only the table (no progress, no YCSB summaries).
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    sys: SystemArgs,
    /// Length of each run's schedule.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Runs per system (systems alternate).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Warm start: after opening each system's copy of the loaded DB, wait
    /// until RocksDB reports no pending flush or compaction, then start the clock.
    #[arg(long)]
    settle: bool,
    /// Output directory.
    #[arg(long, default_value = "ycsb-results")]
    out: PathBuf,
    /// Use this loaded DB (from `bench-ycsb load`) instead of loading.
    #[arg(long)]
    base: Option<PathBuf>,
}

#[derive(Args)]
struct FiguresArgs {
    /// Workloads, comma-separated.
    #[arg(long, default_value = "mixture,read-heavy,write-heavy")]
    workloads: String,
    /// Starts, comma-separated: cold (the clock starts right after opening
    /// the loaded DB), warm (after RocksDB settles; see `run --settle`).
    #[arg(long, default_value = "cold,warm")]
    starts: String,
    /// Records to load per workload.
    #[arg(long, default_value_t = DEFAULT_RECORDCOUNT)]
    recordcount: u64,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[command(flatten)]
    sys: SystemArgs,
    /// Length of each run's schedule (the default profile then has 6 peaks
    /// and 5 valleys after its low phase).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    duration: Duration,
    /// Runs per system (systems alternate); the tables show medians.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Output directory (one subdirectory per workload and start, and figures.md).
    #[arg(long, default_value = "ycsb-figures")]
    out: PathBuf,
}

fn workload(args: &WorkloadArgs) -> Result<Workload> {
    let (mut w, warnings) = Workload::load(&args.workload)?;
    for warning in warnings {
        tracing::warn!("{}: {warning}", args.workload);
    }
    w.recordcount = match args.recordcount {
        Some(n) => n,
        // A built-in with a load of its own (longpeak: an empty DB over 5
        // million keys) keeps its key space.
        None if Workload::builtin(&args.workload).is_some_and(|b| b.insertcount.is_none()) => DEFAULT_RECORDCOUNT,
        None => w.recordcount,
    };
    w.validate()?;
    Ok(w)
}

/// Progress: a bar on a terminal; otherwise at most one line per phase.
struct Progress {
    quiet: bool,
    tty: bool,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        Progress { quiet, tty: std::io::stderr().is_terminal() }
    }

    /// One line about a phase (both modes).
    fn line(&self, msg: &str) {
        if !self.quiet {
            eprintln!("{msg}");
        }
    }

    /// A bar for a run of `len` (terminal only).
    fn bar(&self, label: &str, len: Duration) -> Option<ProgressBar> {
        if self.quiet || !self.tty {
            return None;
        }
        let bar = ProgressBar::with_draw_target(Some(len.as_secs()), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{prefix:<24} [{bar:40}] {pos}/{len} s")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("#>-"),
        );
        bar.set_prefix(label.to_owned());
        Some(bar)
    }
}

/// Paths to remove if the run is interrupted (the cgroups go too).
static INTERRUPT_CLEANUP: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn cleanup_on_interrupt(path: &Path) {
    INTERRUPT_CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).push(path.to_path_buf());
}

fn install_interrupt_handler() {
    kernel::install_interrupt_cleanup(|| {
        for p in INTERRUPT_CLEANUP.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = std::fs::remove_dir_all(&p);
            // The data directory too, once it is empty.
            if let Some(parent) = p.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    });
}

fn load_base(w: &Workload, db: &DbOptions, path: &Path, seed: u64, progress: &Progress) -> Result<rocksdb::DB> {
    progress.line(&format!("loading {} records of {} bytes into {} ...", w.loaded(), w.record_bytes(), path.display()));
    let t = Instant::now();
    let base = runner::load(path, &db.rocksdb(), w, 2, seed)?;
    progress.line(&format!("loaded in {:.1}s", t.elapsed().as_secs_f64()));
    Ok(base)
}

/// The machine, for reports: CPUs, memory, kernel.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<f64>().ok()))
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs ({model}), {mem_gib:.0} GiB memory, Linux {}", kernel.trim())
}

/// One benchmark: a workload, its systems and repeats, one start.
struct Bench<'a> {
    w: &'a Workload,
    kinds: Vec<SystemKind>,
    params: RunParams,
    cfg: SystemConfig,
    repeats: usize,
    warm: bool,
    settle_base: bool,
    settle_timeout: Duration,
    drain_timeout: Duration,
    kernel: Option<&'a KernelDevice>,
    /// The loaded DB every run starts from.
    base: &'a Path,
    /// Where the run copies go.
    data: &'a Path,
    keep_data: bool,
    out: &'a Path,
    print_ycsb: bool,
    /// The disk probe's interval (zero: off).
    disk_probe: Duration,
}

fn probe_device(sys: &SystemArgs, data: &Path) -> Result<Option<KernelDevice>> {
    match sys.device {
        DeviceSpec::Emulated(_) => Ok(None),
        DeviceSpec::Kernel(l) => KernelDevice::probe(l, data).map(Some),
    }
}

/// Applies `--background-cpu` to RocksDB's process-wide thread pools
/// (every system runs on them).
fn set_background_cpu(sys: &SystemArgs) -> Result<()> {
    if sys.background_cpu == "low" {
        let mut env = rocksdb::Env::new()?;
        env.lower_thread_pool_cpu_priority();
        env.lower_high_priority_thread_pool_cpu_priority();
    }
    Ok(())
}

fn check_system_args(sys: &SystemArgs) -> Result<Vec<SystemKind>> {
    let kinds = SystemKind::parse_list(&sys.systems)?;
    if kinds.is_empty() {
        return Err(Error::Usage("--systems is empty".into()));
    }
    if sys.threads == 0 {
        return Err(Error::Usage("--threads must be at least 1".into()));
    }
    if sys.min_bandwidth > kvs_bandwidth(sys) {
        return Err(Error::Usage("--min-bandwidth must not exceed --kvs-bandwidth".into()));
    }
    Ok(kinds)
}

/// A request size in bytes (`64KiB`, `1M`, `0`): a whole number of bytes.
fn parse_request_size(s: &str) -> std::result::Result<u64, String> {
    let v = kv_stage::units::parse_bytes(s).map_err(|e| e.to_string())?;
    if !(0.0..=(1u64 << 40) as f64).contains(&v) || v.fract() != 0.0 {
        return Err(format!("'{s}' is not a whole number of bytes between 0 and 1TiB"));
    }
    Ok(v as u64)
}

/// `--kvs-bandwidth`, or the device's default budget.
fn kvs_bandwidth(sys: &SystemArgs) -> Bandwidth {
    sys.kvs_bandwidth.unwrap_or_else(|| sys.device.default_budget())
}

fn system_config(sys: &SystemArgs) -> Result<SystemConfig> {
    let adaptive = match &sys.adaptive_config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(Error::io(format!("reading {}", path.display())))?;
            let c = controller::ControllerConfig::from_toml(&text)
                .map_err(|e| Error::Usage(format!("--adaptive-config {}: {e}", path.display())))?;
            c.adaptive
        }
        None => {
            let (read_bandwidth, write_bandwidth) = sys.device.direction_budgets();
            controller::AdaptiveConfig {
                device_bandwidth: kvs_bandwidth(sys),
                min_bandwidth: sys.min_bandwidth,
                read_bandwidth,
                write_bandwidth,
                ..controller::AdaptiveConfig::default()
            }
        }
    };
    let adaptive = match sys.demand_memory {
        Some(demand_memory) => controller::AdaptiveConfig { demand_memory, ..adaptive },
        None => adaptive,
    };
    Ok(SystemConfig {
        device: sys.device,
        kvs: kvs_bandwidth(sys),
        min: sys.min_bandwidth,
        silk_interval_ms: 10,
        background_cpu: sys.background_cpu.clone(),
        adaptive,
        max_background_request: sys.max_background_request,
        delete_rate: sys.delete_rate,
        defer_deletions: sys.defer_deletions,
        delete_piece: sys.delete_piece,
        prepopulate_block_cache: sys.prepopulate_block_cache.clone(),
        db: DbOptions::for_device(&sys.device),
    })
}

fn device_description(cfg: &SystemConfig, kernel: Option<&KernelDevice>) -> String {
    match (cfg.device, kernel) {
        (_, Some(k)) => k.describe(),
        (DeviceSpec::Emulated(b), None) => format!("emulated FIFO device, {b} shared by reads and writes"),
        (DeviceSpec::Kernel(l), None) => format!("kernel-throttled disk, {l}"),
    }
}

/// The longest a run waits for the disk to be quiet before it starts.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);

/// Runs every system of `b` `repeats` times, alternating, and writes the
/// report into `b.out`.
fn bench(b: &Bench<'_>, progress: &Progress) -> Result<BenchReport> {
    std::fs::create_dir_all(b.out).map_err(Error::io(format!("creating {}", b.out.display())))?;
    let start_name = if b.warm { "warm" } else { "cold" };
    let provenance = report::Provenance::now();
    let base = rocksdb::DB::open(&b.cfg.db.rocksdb(), b.base)?;
    if b.warm && b.settle_base {
        // Every system starts from the same settled LSM: the loaded DB's
        // compactions run once here (off the throttled device), and each
        // copy then settles at once.
        progress.line("settling the loaded DB once for the warm starts");
        if runner::settle(&base, b.settle_timeout).is_none() {
            tracing::warn!("the loaded DB still had compaction work after {}s", b.settle_timeout.as_secs());
        }
    }
    let mut runs = Vec::new();
    for r in 1..=b.repeats {
        // Alternate the order between repeats.
        let mut order = b.kinds.clone();
        order.rotate_left((r - 1) % b.kinds.len());
        for kind in order {
            let path = b.data.join(format!("{}-{}-{start_name}-{r}", b.w.name, kind.name()));
            let _ = std::fs::remove_dir_all(&path);
            cleanup_on_interrupt(&path);
            rocksdb::checkpoint::Checkpoint::new(&base)?.create_checkpoint(&path)?;
            runs.push((kind, r, path));
        }
    }
    drop(base);
    // One probe for the whole comparison, started before the first run. It
    // is a diagnostic: where it cannot run (a tmpfs), the runs go on
    // without it.
    let probe = if b.disk_probe.is_zero() {
        None
    } else {
        match DiskProbe::start(b.data, b.disk_probe, PROBE_LIMIT) {
            Ok(p) => {
                cleanup_on_interrupt(p.dir());
                Some(p)
            }
            Err(e) => {
                tracing::warn!("the disk probe is off: {e}");
                None
            }
        }
    };
    let mut reports = Vec::new();
    let mut runs = runs.into_iter();
    while let Some((kind, r, path)) = runs.next() {
        // Every run starts on a quiet disk (see KernelDevice::quiesce).
        let quiet = match b.kernel {
            Some(k) => k.quiesce(QUIESCE_LIMIT).map(|w| {
                if w > Duration::from_secs(2) {
                    progress.line(&format!("waited {:.1}s for the disk to be quiet", w.as_secs_f64()));
                }
                Some(w.as_millis() as u64)
            }),
            None => Ok(None),
        };
        let result = quiet.and_then(|q| {
            run_one(b, kind, r, &path, probe.as_ref(), progress).map(|mut rep| {
                rep.quiesce_ms = q;
                rep
            })
        });
        if !b.keep_data {
            let _ = std::fs::remove_dir_all(&path);
        }
        let rep = match result {
            Ok(rep) => rep,
            Err(e) => {
                // The copies made for the runs that will not happen go too.
                for (_, _, p) in runs {
                    let _ = std::fs::remove_dir_all(p);
                }
                return Err(e);
            }
        };
        if b.print_ycsb && !progress.quiet {
            println!("== {} (repeat {r})\n{}", kind.name(), rep.ycsb_text());
        }
        reports.push(rep);
    }
    let report = BenchReport {
        workload: b.w.name.clone(),
        workload_properties: serde_json::to_value(b.w).unwrap_or_default(),
        profile: b.params.profile.describe(),
        threads: b.params.threads,
        duration_s: b.params.duration.as_secs_f64(),
        seed: b.params.seed,
        device: device_description(&b.cfg, b.kernel),
        start: start_name.into(),
        machine: machine(),
        provenance,
        kvs_bandwidth: b.cfg.kvs.to_string(),
        config: serde_json::to_value(&b.cfg).unwrap_or_default(),
        systems: reports,
    };
    report::write_all(&report, b.out)?;
    Ok(report)
}

/// One system, one repeat: (cgroup,) open, (settle,) run, measure, close.
fn run_one(
    b: &Bench<'_>,
    kind: SystemKind,
    r: usize,
    path: &Path,
    probe: Option<&DiskProbe>,
    progress: &Progress,
) -> Result<SystemReport> {
    let label = format!("{} {} #{r}", b.w.name, kind.name());
    let cgroup = match b.kernel {
        Some(k) => {
            let cg = k.create(&format!("{}-{r}", kind.name()))?;
            cg.enter()?;
            Some(cg)
        }
        None => None,
    };
    // The probe's reads stay out of the throttle where the kernel allows.
    let probe_outside = match (&cgroup, probe.and_then(DiskProbe::thread_id)) {
        (Some(cg), Some(tid)) => match cg.exempt_thread(tid) {
            Ok(out) => out,
            Err(e) => {
                let _ = cg.leave();
                return Err(e);
            }
        },
        (Some(_), None) => false,
        (None, _) => true,
    };
    let decisions = b.out.join(format!("decisions-{}-{r}.jsonl", kind.name()));
    let _ = std::fs::remove_file(&decisions);
    let sys = systems::open(kind, path, &b.cfg, Some(&decisions))?;
    // SILK with pressure reads RocksDB's pressure from a sampler thread
    // (every 10 ms, as often as the controller decides).
    let stop_sampler = std::sync::atomic::AtomicBool::new(false);
    let stop_attribution = std::sync::atomic::AtomicBool::new(false);
    let clock = std::sync::OnceLock::new();
    let rep = std::thread::scope(|scope| -> Result<SystemReport> {
        if sys.pressure.is_some() {
            let (sys, stop, db) = (&sys, &stop_sampler, &b.cfg.db);
            scope.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sys.sample_pressure(db);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
        }
        // The attribution's sampler: readings from the clock's start on.
        let sampler = {
            let (sys, stop, clock, cg) = (&sys, &stop_attribution, &clock, cgroup.as_ref());
            let stats = Some(&sys.options).filter(|o| o.get_statistics().is_some());
            scope.spawn(move || attribution::sample(sys.stage.as_deref(), sys.db.db(), stats, cg, clock, stop))
        };
        let measured = settle_and_run(b, &sys, cgroup.as_ref(), &label, progress, &clock);
        let clock_stopped = Instant::now();
        stop_attribution.store(true, std::sync::atomic::Ordering::Release);
        let samples = sampler.join().map_err(|_| Error::Usage("the attribution sampler panicked".into()));
        // The disk probe's reads while the clock ran: its figures, and what
        // the attribution sets the clients' requests against.
        let disk = match (probe, clock.get()) {
            (Some(p), Some(&from)) => p.reads(from, clock_stopped),
            _ => Vec::new(),
        };
        let disk_stats = probe.and_then(|p| p.stats_of(&disk, probe_outside));
        let measured = measured.map(|m| Measured { disk, ..m });
        let rep = measured.and_then(|m| report_of(b, kind, r, &sys, cgroup.as_ref(), m, &samples?)).map(|mut rep| {
            if let Some(p) = probe {
                rep.disk_probe = disk_stats;
                if let Some(e) = p.error() {
                    tracing::warn!("the disk probe stopped: {e}");
                }
            }
            rep
        });
        // What a Prometheus scrape would have read at the end of the run,
        // next to summary.json (the drain below is not in it).
        // (No early return here: the pressure sampler stops below.)
        let rep = rep.and_then(|rep| {
            let file = b.out.join(format!("metrics-{}-{r}.prom", kind.name()));
            std::fs::write(&file, end_of_run_metrics(&sys))
                .map_err(Error::io(format!("writing {}", file.display())))
                .map(|()| rep)
        });
        // The end-of-run debt, and the time to pay it (on the same device,
        // with the system's controller still running), after the run's
        // counters were read.
        let rep = rep.map(|mut rep| {
            if !b.drain_timeout.is_zero() {
                progress
                    .line(&format!("{label}: draining the end-of-run debt (at most {}s)", b.drain_timeout.as_secs()));
            }
            rep.debt = Some(debt::measure(sys.db.db(), &b.cfg.db, b.drain_timeout));
            rep
        });
        stop_sampler.store(true, std::sync::atomic::Ordering::Relaxed);
        rep
    });
    let rep = match rep {
        Ok(rep) => rep,
        Err(e) => {
            if let Some(cg) = &cgroup {
                let _ = cg.leave();
            }
            sys.close();
            return Err(e);
        }
    };
    // Close outside the throttle: what is left of the background work is
    // not measured.
    if let Some(cg) = &cgroup {
        cg.leave()?;
    }
    sys.close();
    drop(cgroup);
    let check = rep
        .byte_check
        .as_ref()
        .map(|c| format!(", kernel saw {:.0}% of writes{}", c.write_ratio * 100.0, if c.low { " (LOW)" } else { "" }))
        .unwrap_or_default();
    progress.line(&format!(
        "{label}: {:.0} ops/s, p99 {:.1} ms, stall {:.1}s{check}",
        rep.throughput_ops,
        rep.p99_us as f64 / 1e3,
        rep.stall_us as f64 / 1e6
    ));
    Ok(rep)
}

/// The stage's, the RocksDB's and the controller's metrics now, in the
/// Prometheus text format (`promtool check metrics` reads it; empty of
/// stage and DB families for plain RocksDB).
fn end_of_run_metrics(sys: &systems::RunningSystem) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    if let Some(stage) = &sys.stage {
        let m = kv_stage::metrics::StageMetrics::new();
        m.add(stage);
        registry.register_collector(Box::new(m));
    }
    if let systems::SystemDb::Staged(db) = &sys.db {
        registry.register_collector(Box::new(rocks_env::metrics::DbSnapshot::of(&[&**db])));
    }
    if let Some(c) = &sys.controller {
        registry.register_collector(Box::new(c.metrics()));
    }
    kv_stage::metrics::encode_text(&registry)
}

/// The report of one run, from the counters as the run left them.
fn report_of(
    b: &Bench<'_>,
    kind: SystemKind,
    r: usize,
    sys: &systems::RunningSystem,
    cgroup: Option<&kernel::Cgroup>,
    measured: Measured,
    samples: &attribution::Samples,
) -> Result<SystemReport> {
    let Measured { settle_ms, charged0, seen0, stall0, levels0, result, disk } = measured;
    let charged = cgroup.map(|c| c.charged()).transpose()?;
    let seen = sys.seen_bytes();
    let mut rep = SystemReport::new(kind.name(), r, &result, &b.params.profile);
    rep.settle_ms = settle_ms;
    rep.stall_us = sys.options.get_ticker_count(rocksdb::statistics::Ticker::StallMicros).saturating_sub(stall0);
    let stalls = sys.options.get_histogram_data(rocksdb::statistics::Histogram::WriteStall);
    rep.longest_stall_us = stalls.max() as u64;
    rep.stalled_writes = stalls.count();
    rep.device_wait_us = sys.device.as_ref().map_or(0, |d| d.stats().wait_ns / 1000);
    if let Some(stage) = &sys.stage {
        let now = stage.collect();
        rep.context_bytes = now.contexts.iter().map(|c| (c.context.name().to_owned(), c.counter.bytes)).collect();
        rep.run_context_bytes = samples.run_context_bytes();
    }
    rep.attribution = Some(samples.attribute(&result.requests, rep.p99_us, &disk));
    if let (Some(c1), Some(c0)) = (charged, charged0) {
        let seen = systems::SeenBytes {
            read_bytes: seen.read_bytes.saturating_sub(seen0.read_bytes),
            write_bytes: seen.write_bytes.saturating_sub(seen0.write_bytes),
            source: seen.source,
        };
        rep.byte_check = Some(ByteCheck::new(c1.since(&c0), seen));
    }
    rep.controller_cycles = sys.controller.as_ref().map_or(0, |c| c.cycles());
    rep.compaction_levels = report::LevelReport::between(&levels0, &sys.compaction_levels());
    Ok(rep)
}

/// What [`settle_and_run`] measured: settle time, the cgroup's and the
/// system's byte counters and the stall counter at the start of the
/// clock, and the run; then the disk probe's reads while the clock ran
/// (empty from `settle_and_run`, filled after the clock stopped).
struct Measured {
    settle_ms: Option<u64>,
    charged0: Option<kernel::Charged>,
    seen0: systems::SeenBytes,
    stall0: u64,
    levels0: Vec<rocks_env::CompactionLevelStats>,
    result: runner::RunResult,
    disk: Vec<crate::disk_probe::ProbeRead>,
}

/// Settles (warm start), takes the counters at the start of the clock,
/// then runs the clients.
fn settle_and_run(
    b: &Bench<'_>,
    sys: &systems::RunningSystem,
    cgroup: Option<&kernel::Cgroup>,
    label: &str,
    progress: &Progress,
    clock: &std::sync::OnceLock<Instant>,
) -> Result<Measured> {
    let settle_ms = if b.warm {
        progress.line(&format!("{label}: settling (waiting for RocksDB's pending compactions)"));
        match runner::settle(sys.db.db(), b.settle_timeout) {
            Some(d) => Some(d.as_millis() as u64),
            None => {
                tracing::warn!(
                    "{label}: RocksDB still had compaction work after {}s; starting anyway",
                    b.settle_timeout.as_secs()
                );
                Some(b.settle_timeout.as_millis() as u64)
            }
        }
    } else {
        None
    };
    let charged0 = cgroup.map(|c| c.charged()).transpose()?;
    let seen0 = sys.seen_bytes();
    let stall0 = sys.options.get_ticker_count(rocksdb::statistics::Ticker::StallMicros);
    let levels0 = sys.compaction_levels();
    let bar = progress.bar(label, b.params.duration);
    if bar.is_none() {
        progress.line(&format!("{label}: running {}s", b.params.duration.as_secs()));
    }
    let secs = b.params.duration.as_secs_f64();
    let tick = |f: f64| {
        if let Some(bar) = &bar {
            bar.set_position((f * secs).round() as u64);
        }
    };
    let result = runner::run_with_clock(sys.db.db(), b.w, &b.params, &tick, clock);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // Write out (and sync) what is left of the WAL in the page cache, from
    // this process: on a kernel device those bytes are then charged before
    // the counters are read, as the stage already counted them.
    sys.db.db().flush_wal(true)?;
    Ok(Measured { settle_ms, charged0, seen0, stall0, levels0, result, disk: Vec::new() })
}

fn params(sys: &SystemArgs, duration: Duration, profile: &Profile, seed: u64) -> RunParams {
    RunParams {
        threads: sys.threads,
        duration,
        profile: profile.clone(),
        seed,
        drain: Duration::from_secs(30).min(duration),
        timer_slack_ns: (sys.client_timer_slack.as_nanos() as u64).max(1),
    }
}

/// What `run` and `figures` do before loading: the output and data
/// directories, every check the kernel device needs, the interrupt
/// handler, the background CPU priority. Returns the data directory.
fn prepare(sys: &SystemArgs, out: &Path) -> Result<(PathBuf, Option<KernelDevice>)> {
    std::fs::create_dir_all(out).map_err(Error::io(format!("creating {}", out.display())))?;
    let data = sys.data.clone().unwrap_or_else(|| out.join("data"));
    std::fs::create_dir_all(&data).map_err(Error::io(format!("creating {}", data.display())))?;
    let kernel = probe_device(sys, &data)?;
    install_interrupt_handler();
    set_background_cpu(sys)?;
    Ok((data, kernel))
}

fn run(a: RunArgs) -> Result<BenchReport> {
    let w = workload(&a.workload)?;
    let kinds = check_system_args(&a.sys)?;
    if a.repeats == 0 {
        return Err(Error::Usage("--repeats must be at least 1".into()));
    }
    let profile = Profile::parse(&a.sys.profile)?;
    let mut cfg = system_config(&a.sys)?;
    cfg.db = cfg.db.for_workload(&w);
    let progress = Progress::new(a.sys.quiet);
    let (data, kernel) = prepare(&a.sys, &a.out)?;

    let base_path = a.base.clone().unwrap_or_else(|| data.join("base"));
    if a.base.is_none() {
        let _ = std::fs::remove_dir_all(&base_path);
        if !a.sys.keep_data {
            cleanup_on_interrupt(&base_path);
        }
        drop(load_base(&w, &cfg.db, &base_path, a.workload.seed, &progress)?);
    }
    let b = Bench {
        w: &w,
        kinds,
        params: params(&a.sys, a.duration, &profile, a.workload.seed),
        cfg,
        repeats: a.repeats,
        warm: a.settle,
        settle_base: a.sys.settle_on == "base",
        settle_timeout: a.sys.settle_timeout,
        drain_timeout: a.sys.drain_timeout,
        kernel: kernel.as_ref(),
        base: &base_path,
        data: &data,
        keep_data: a.sys.keep_data,
        out: &a.out,
        print_ycsb: true,
        disk_probe: a.sys.disk_probe,
    };
    let report = bench(&b, &progress);
    if !a.sys.keep_data && a.base.is_none() {
        let _ = std::fs::remove_dir_all(&base_path);
    }
    if !a.sys.keep_data {
        // Only removes the data directory when it is empty now.
        let _ = std::fs::remove_dir(&data);
    }
    report
}

fn figures(a: FiguresArgs) -> Result<()> {
    let kinds = check_system_args(&a.sys)?;
    if a.repeats == 0 {
        return Err(Error::Usage("--repeats must be at least 1".into()));
    }
    let mut starts = Vec::new();
    for s in a.starts.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match s {
            "cold" => starts.push(false),
            "warm" => starts.push(true),
            other => return Err(Error::Usage(format!("--starts: unknown start '{other}' (cold, warm)"))),
        }
    }
    if starts.is_empty() {
        return Err(Error::Usage("--starts is empty".into()));
    }
    let workloads: Vec<Workload> = a
        .workloads
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            workload(&WorkloadArgs { workload: name.to_owned(), recordcount: Some(a.recordcount), seed: a.seed })
        })
        .collect::<Result<_>>()?;
    if workloads.is_empty() {
        return Err(Error::Usage("--workloads is empty".into()));
    }
    let profile = Profile::parse(&a.sys.profile)?;
    let cfg = system_config(&a.sys)?;
    let progress = Progress::new(a.sys.quiet);
    let (data, kernel) = prepare(&a.sys, &a.out)?;
    let started = Instant::now();
    let mut done = Vec::new();
    for w in &workloads {
        let base_path = data.join(format!("base-{}", w.name));
        let _ = std::fs::remove_dir_all(&base_path);
        if !a.sys.keep_data {
            cleanup_on_interrupt(&base_path);
        }
        let cfg = SystemConfig { db: cfg.db.clone().for_workload(w), ..cfg.clone() };
        drop(load_base(w, &cfg.db, &base_path, a.seed, &progress)?);
        for &warm in &starts {
            let out = a.out.join(format!("{}-{}", w.name, if warm { "warm" } else { "cold" }));
            let b = Bench {
                w,
                kinds: kinds.clone(),
                params: params(&a.sys, a.duration, &profile, a.seed),
                cfg: cfg.clone(),
                repeats: a.repeats,
                warm,
                settle_base: a.sys.settle_on == "base",
                settle_timeout: a.sys.settle_timeout,
                drain_timeout: a.sys.drain_timeout,
                kernel: kernel.as_ref(),
                base: &base_path,
                data: &data,
                keep_data: a.sys.keep_data,
                out: &out,
                print_ycsb: false,
                disk_probe: a.sys.disk_probe,
            };
            let report = bench(&b, &progress);
            let report = match report {
                Ok(r) => r,
                Err(e) => {
                    if !a.sys.keep_data {
                        let _ = std::fs::remove_dir_all(&base_path);
                    }
                    return Err(e);
                }
            };
            println!("== {} ({} start)\n{}", w.name, report.start, report::table(&report));
            done.push((out, report));
            // What is done so far is readable while the rest runs.
            let md = report::figures_md(&done, &a.out, &command_line(), started.elapsed());
            std::fs::write(a.out.join("figures.md"), md).map_err(Error::io("writing figures.md"))?;
        }
        if !a.sys.keep_data {
            let _ = std::fs::remove_dir_all(&base_path);
        }
    }
    if !a.sys.keep_data {
        let _ = std::fs::remove_dir(&data);
    }
    println!("figures.md, tables and plots in {} ({:.0} min)", a.out.display(), started.elapsed().as_secs_f64() / 60.0);
    Ok(())
}

/// `report` on a `figures` directory: re-makes each run's table and plots
/// and `figures.md`, keeping the command and time its first version named.
fn refigure(dir: &Path) -> Result<()> {
    let old = std::fs::read_to_string(dir.join("figures.md")).map_err(Error::io("reading figures.md"))?;
    let line = old.lines().find(|l| l.starts_with("- Command: `")).unwrap_or("");
    let command = line.trim_start_matches("- Command: `").split('`').next().unwrap_or("").to_owned();
    let minutes: f64 = line
        .rsplit_once('(')
        .and_then(|(_, t)| t.split_whitespace().next())
        .and_then(|m| m.parse().ok())
        .unwrap_or(0.0);
    let mut done = Vec::new();
    let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(Error::io(format!("reading {}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("summary.json").exists())
        .collect();
    // In the order the figures ran: workload as given is unknown here, so
    // the first version's order of sections.
    subdirs.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (w, start) = name.rsplit_once('-').unwrap_or((&name, ""));
        (old.find(&format!("## {w} ({start} start)")).unwrap_or(usize::MAX), name.clone())
    });
    for sub in subdirs {
        let r = report::read(&sub)?;
        report::write_all(&r, &sub)?;
        done.push((sub, r));
    }
    let md = report::figures_md(&done, dir, &command, Duration::from_secs_f64(minutes * 60.0));
    std::fs::write(dir.join("figures.md"), md).map_err(Error::io("writing figures.md"))?;
    println!("figures.md re-made in {}", dir.display());
    Ok(())
}

fn command_line() -> String {
    let mut s = String::new();
    for (i, a) in std::env::args().enumerate() {
        let a = if i == 0 { "bench-ycsb".to_owned() } else { a };
        let _ = write!(s, "{}{a}", if i > 0 { " " } else { "" });
    }
    s
}

/// `bench-ycsb pool`: reads, checks, pools, prints (and writes).
fn pool_runs(a: &PoolArgs) -> Result<()> {
    if let Some(t) = a.target
        && !(t.is_finite() && t > 0.0)
    {
        return Err(Error::Usage(format!("--target: {t} is not a positive ratio")));
    }
    let baseline = SystemKind::parse_list(&a.baseline)?;
    let [baseline] = baseline.as_slice() else {
        return Err(Error::Usage(format!("--baseline: '{}' is not one system", a.baseline)));
    };
    let runs = crate::pool::read_runs(&a.dirs)?;
    let p = crate::pool::pool(&runs, baseline.name(), a.target)?;
    print!("{}", crate::pool::table(&p));
    if let Some(out) = &a.out {
        crate::pool::write(&p, out)?;
        println!("pool.txt and pool.json in {}", out.display());
    }
    Ok(())
}

/// Runs the command line `args` (the program name first) and returns the
/// exit status: 0 on success, 2 when the input was bad or the run failed
/// (the error is on stderr, naming what was wrong).
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
    // Warnings and errors go to stderr through `tracing`, filtered by
    // RUST_LOG (default `info`); progress lines and the results table are
    // the command's own output. A process that installed a subscriber of
    // its own keeps it.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let result = match cli.command {
        Command::Run(a) => {
            let out = a.out.clone();
            run(a).map(|r| {
                println!("{}", report::table(&r));
                println!(
                    "{}; {} threads, {:.0}s per system, {} start; {}",
                    r.profile, r.threads, r.duration_s, r.start, r.device
                );
                println!(
                    "results, time series (timeseries.csv) and plots (throughput.svg, p99.svg) in {}",
                    out.display()
                );
            })
        }
        Command::Figures(a) => figures(a),
        Command::Load(a) => workload(&a.workload).and_then(|w| {
            let _ = std::fs::remove_dir_all(&a.db);
            load_base(&w, &DbOptions::default().for_workload(&w), &a.db, a.workload.seed, &Progress::new(false))
                .map(drop)
        }),
        Command::Report { dir } if !dir.join("summary.json").exists() && dir.join("figures.md").exists() => {
            refigure(&dir)
        }
        Command::Pool(a) => pool_runs(&a),
        Command::Report { dir } => report::read(&dir).and_then(|r| {
            report::write_all(&r, &dir)?;
            println!("{}", report::table(&r));
            Ok(())
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("{e}");
            2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_request_size;

    #[test]
    fn request_sizes_take_units_and_refuse_what_is_not_a_byte_count() {
        assert_eq!(parse_request_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_request_size("1M"), Ok(1_000_000));
        assert_eq!(parse_request_size("0"), Ok(0));
        for bad in ["-1", "1.5", "2TiB", "fast", "64KiB/s"] {
            let e = parse_request_size(bad).unwrap_err();
            assert!(e.contains(bad) || e.contains("unit"), "{bad}: {e}");
        }
    }
}
