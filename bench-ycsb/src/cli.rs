//! The `bench-ycsb` command line: run a YCSB workload side by side against
//! RocksDB, RocksDB with its auto-tuned rate limiter, and RocksDB through a
//! stage with SILK. The binary is [`main`] with the process's arguments;
//! tests call it in a child process of their own.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::profile::Profile;
use crate::report::{self, BenchReport, SystemReport};
use crate::runner::{self, RunParams};
use crate::systems::{self, DbOptions, SystemConfig, SystemKind};
use crate::workload::Workload;
use crate::{Error, Result};
use clap::{Args, Parser, Subcommand};
use kv_stage::units::{Bandwidth, parse_duration};

const EXAMPLES: &str = "\
Examples:
  # The default comparison (mixture workload, all four systems, about 5 minutes):
  bench-ycsb run --out results

  # Read-heavy, SILK against plain RocksDB only, 2 minutes each, a faster device:
  bench-ycsb run --workload read-heavy --systems rocksdb,paio-silk --duration 120s --device 128MiB/s --out rh

  # A YCSB property file and a constant load:
  bench-ycsb run --workload workloads/workloada --profile constant:3000 --out a

  # Load once, reuse the loaded DB for several runs:
  bench-ycsb load --db /tmp/ycsb-base
  bench-ycsb run --base /tmp/ycsb-base --out run1

  # Re-plot saved results:
  bench-ycsb report results";

/// Records a built-in workload loads unless `--recordcount` says otherwise:
/// about 400 MB of 1 KB records, enough that compactions reach L2.
const DEFAULT_RECORDCOUNT: u64 = 400_000;

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
    /// Only load a DB, for later runs with --base.
    Load(LoadArgs),
    /// Re-make the table, CSV and plots from a results directory.
    Report {
        /// Directory with summary.json.
        dir: PathBuf,
    },
}

#[derive(Args, Clone)]
struct WorkloadArgs {
    /// Built-in workload (a-f, mixture, read-heavy, write-heavy) or a YCSB property file.
    #[arg(long, default_value = "mixture")]
    workload: String,
    /// Records to load [default: 400000 for a built-in workload, the file's
    /// `recordcount` for a property file].
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

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Systems, comma-separated: rocksdb, rocksdb-autotuned, paio-silk, paio-static.
    #[arg(long, default_value = "rocksdb,rocksdb-autotuned,paio-silk,paio-static")]
    systems: String,
    /// Client threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Load profile: constant:RATE, silk:low=..,peak=..[,valley=..,low-for=..,period=..], file:PATH.
    #[arg(long, default_value = "silk:low=1000,peak=5000,valley=1000,low-for=10s,period=20s")]
    profile: String,
    /// Length of each run phase.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Emulated device bandwidth (shared by reads and writes).
    #[arg(long, default_value = "64MiB/s")]
    device: Bandwidth,
    /// KVS_B: SILK's budget, the auto-tuned limiter's maximum, what static limits split.
    #[arg(long, default_value = "56MiB/s")]
    kvs_bandwidth: Bandwidth,
    /// SILK's min_B.
    #[arg(long, default_value = "4MiB/s")]
    min_bandwidth: Bandwidth,
    /// Runs per system (systems alternate).
    #[arg(long, default_value_t = 1)]
    repeats: usize,
    /// Output directory.
    #[arg(long, default_value = "ycsb-results")]
    out: PathBuf,
    /// Use this loaded DB (from `bench-ycsb load`) instead of loading.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Where the DB copies live (default: OUT/data; removed after each run).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Keep the DB copies.
    #[arg(long)]
    keep_data: bool,
    /// Only the table (no progress, no YCSB summaries).
    #[arg(long)]
    quiet: bool,
}

fn workload(args: &WorkloadArgs) -> Result<Workload> {
    let (mut w, warnings) = Workload::load(&args.workload)?;
    for warning in warnings {
        eprintln!("warning: {}: {warning}", args.workload);
    }
    w.recordcount = match args.recordcount {
        Some(n) => n,
        None if Workload::builtin(&args.workload).is_some() => DEFAULT_RECORDCOUNT,
        None => w.recordcount,
    };
    w.validate()?;
    Ok(w)
}

fn progress_bar(label: &str, quiet: bool) -> impl Fn(f64) + Sync + '_ {
    move |f: f64| {
        if quiet {
            return;
        }
        let n = (f * 40.0) as usize;
        eprint!("\r{label:<20} [{}{}] {:>3.0}%", "#".repeat(n), " ".repeat(40 - n), f * 100.0);
        let _ = std::io::stderr().flush();
        if f >= 1.0 {
            eprintln!();
        }
    }
}

fn load_base(w: &Workload, db: &DbOptions, path: &Path, seed: u64, quiet: bool) -> Result<rocksdb::DB> {
    if !quiet {
        eprintln!("loading {} records of {} bytes into {} ...", w.recordcount, w.record_bytes(), path.display());
    }
    let t = Instant::now();
    let base = runner::load(path, &db.rocksdb(), w, 2, seed)?;
    if !quiet {
        eprintln!("loaded in {:.1}s", t.elapsed().as_secs_f64());
    }
    Ok(base)
}

fn run(a: RunArgs) -> Result<BenchReport> {
    let w = workload(&a.workload)?;
    let kinds = SystemKind::parse_list(&a.systems)?;
    if kinds.is_empty() {
        return Err(Error::Usage("--systems is empty".into()));
    }
    if a.threads == 0 || a.repeats == 0 {
        return Err(Error::Usage("--threads and --repeats must be at least 1".into()));
    }
    let profile = Profile::parse(&a.profile)?;
    let cfg = SystemConfig {
        device: a.device,
        kvs: a.kvs_bandwidth,
        min: a.min_bandwidth,
        silk_interval_ms: 10,
        db: DbOptions::default(),
    };
    if cfg.min > cfg.kvs {
        return Err(Error::Usage("--min-bandwidth must not exceed --kvs-bandwidth".into()));
    }
    std::fs::create_dir_all(&a.out).map_err(Error::io(format!("creating {}", a.out.display())))?;
    let data = a.data.clone().unwrap_or_else(|| a.out.join("data"));
    std::fs::create_dir_all(&data).map_err(Error::io(format!("creating {}", data.display())))?;

    // Load once; every run starts from a checkpoint (hard links) of it.
    let base_path = a.base.clone().unwrap_or_else(|| data.join("base"));
    let base = if a.base.is_some() {
        rocksdb::DB::open(&cfg.db.rocksdb(), &base_path)?
    } else {
        let _ = std::fs::remove_dir_all(&base_path);
        load_base(&w, &cfg.db, &base_path, a.workload.seed, a.quiet)?
    };
    let mut runs = Vec::new();
    for r in 1..=a.repeats {
        // Alternate the order between repeats.
        let mut order = kinds.clone();
        order.rotate_left((r - 1) % kinds.len());
        for kind in order {
            let path = data.join(format!("{}-{r}", kind.name()));
            let _ = std::fs::remove_dir_all(&path);
            rocksdb::checkpoint::Checkpoint::new(&base)?.create_checkpoint(&path)?;
            runs.push((kind, r, path));
        }
    }
    drop(base);

    let params = RunParams {
        threads: a.threads,
        duration: a.duration,
        profile: profile.clone(),
        seed: a.workload.seed,
        drain: Duration::from_secs(30).min(a.duration),
    };
    let mut reports = Vec::new();
    for (kind, r, path) in runs {
        let decisions = a.out.join(format!("decisions-{}-{r}.jsonl", kind.name()));
        let _ = std::fs::remove_file(&decisions);
        let sys = systems::open(kind, &path, &cfg, Some(&decisions))?;
        let label = format!("{} #{r}", kind.name());
        let result = runner::run(&sys.db, &w, &params, &progress_bar(&label, a.quiet));
        let mut rep = SystemReport::new(kind.name(), r, &result);
        rep.stall_us = sys.options.get_ticker_count(rocksdb::statistics::Ticker::StallMicros);
        rep.device_wait_us = sys.device.stats().wait_ns / 1000;
        rep.context_bytes =
            sys.stage.collect().contexts.iter().map(|c| (c.context.name().to_owned(), c.counter.bytes)).collect();
        if let Some(ctl) = sys.controller {
            rep.controller_cycles = ctl.cycles();
            ctl.stop(); // flushes the decision log
        }
        drop(sys.db);
        if !a.keep_data {
            let _ = std::fs::remove_dir_all(&path);
        }
        if !a.quiet {
            println!("== {} (repeat {r})\n{}", kind.name(), rep.ycsb_text());
        }
        reports.push(rep);
    }
    if !a.keep_data && a.base.is_none() {
        let _ = std::fs::remove_dir_all(&base_path);
    }
    if !a.keep_data {
        // Only removes the data directory when it is empty now.
        let _ = std::fs::remove_dir(&data);
    }
    let report = BenchReport {
        workload: w.name.clone(),
        workload_properties: serde_json::to_value(&w).unwrap_or_default(),
        profile: profile.describe(),
        threads: a.threads,
        duration_s: a.duration.as_secs_f64(),
        seed: a.workload.seed,
        device: format!("emulated FIFO device, {} shared by reads and writes", a.device),
        kvs_bandwidth: a.kvs_bandwidth.to_string(),
        config: serde_json::to_value(&cfg).unwrap_or_default(),
        systems: reports,
    };
    report::write_all(&report, &a.out)?;
    Ok(report)
}

/// Runs the command line `args` (the program name first) and returns the
/// exit status: 0 on success, 2 when the input was bad or the run failed
/// (the error is on stderr, naming what was wrong).
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> u8 {
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
                println!("{}; {} threads, {:.0}s per system; {}", r.profile, r.threads, r.duration_s, r.device);
                println!(
                    "results, time series (timeseries.csv) and plots (throughput.svg, p99.svg) in {}",
                    out.display()
                );
            })
        }
        Command::Load(a) => workload(&a.workload).and_then(|w| {
            let _ = std::fs::remove_dir_all(&a.db);
            load_base(&w, &DbOptions::default(), &a.db, a.workload.seed, false).map(drop)
        }),
        Command::Report { dir } => report::read(&dir).and_then(|r| {
            report::write_all(&r, &dir)?;
            println!("{}", report::table(&r));
            Ok(())
        }),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}
