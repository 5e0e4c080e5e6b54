//! A small service's memory over time: a staged RocksDB with the paper's
//! layout, the default controller (adaptive, every 10 ms) next to it, and
//! two tenants writing through `AsyncDb` at a steady rate (enough to make
//! RocksDB flush and compact), for `--minutes`. Prints the process's RSS
//! (`VmRSS`), the controller's cycles and the records its in-memory log
//! holds every `--every` seconds, so a reader can see whether memory grows
//! with time.
//!
//! ```sh
//! cargo run --release -p kv-async --example service_rss                # 10 minutes
//! cargo run --release -p kv-async --example service_rss -- --minutes 1 --every 5
//! ```
//!
//! The DB lives in a temporary directory, removed at the end; the load
//! stops by itself after `--minutes`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use controller::{AdaptiveConfig, Controller, ControllerConfig};
use kv_async::AsyncDb;
use kv_stage::RequestContext;
use rocks_env::StagedDb;

#[derive(Parser)]
struct Args {
    /// How long the service runs.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seconds between samples.
    #[arg(long, default_value_t = 30.0)]
    every: f64,
    /// Synced puts per second of each tenant (1 KiB values).
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Cycles the controller keeps in memory (default: its default, 1,000;
    /// 100000 was the old default).
    #[arg(long)]
    max_log: Option<usize>,
}

/// This process's resident set, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let mut opts = rocks_env::rocksdb::Options::default();
    opts.create_if_missing(true);
    // Small memtables and a small L1, so the run flushes and compacts.
    opts.set_write_buffer_size(1 << 20);
    opts.set_max_bytes_for_level_base(4 << 20);
    opts.set_target_file_size_base(1 << 20);
    let staged = Arc::new(StagedDb::open(opts, dir.path())?);
    let mut builder = Controller::builder(ControllerConfig::adaptive(AdaptiveConfig::default()))
        .instance("db", Arc::clone(staged.stage()));
    if let Some(n) = args.max_log {
        builder = builder.max_log_records(n);
    }
    let controller = builder.start()?;
    let db = AsyncDb::new(Arc::clone(&staged));
    let tenants = [RequestContext::register("gold")?, RequestContext::register("silver")?];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let run_for = Duration::from_secs_f64(args.minutes * 60.0);
    let start = Instant::now();
    let writers: Vec<_> = tenants
        .iter()
        .enumerate()
        .map(|(t, &tenant)| {
            let db = db.clone();
            let (rate, end) = (args.rate.max(1), start + run_for);
            rt.spawn(kv_async::scope(tenant, async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1) / rate as u32);
                let value = vec![b'v'; 1024];
                let mut i: u64 = 0;
                while Instant::now() < end {
                    tick.tick().await;
                    // 100k keys per tenant, overwritten: the DB stays small.
                    let key = format!("t{t}-{:06}", i % 100_000);
                    db.put(key.into_bytes(), value.clone()).await?;
                    i += 1;
                }
                Ok::<u64, std::io::Error>(i)
            }))
        })
        .collect();
    println!("{:>8} {:>10} {:>10} {:>12}", "seconds", "rss_kib", "cycles", "log_records");
    let row = || {
        let (s, rss) = (start.elapsed().as_secs_f64(), rss_kib());
        println!("{s:>8.0} {rss:>10} {:>10} {:>12}", controller.cycles(), controller.log().len());
    };
    let every = Duration::from_secs_f64(args.every.max(0.1));
    let mut next = start;
    while start.elapsed() < run_for {
        if Instant::now() >= next {
            row();
            next += every;
        }
        std::thread::sleep(Duration::from_millis(100).min(run_for.saturating_sub(start.elapsed())));
    }
    let mut puts = 0;
    for w in writers {
        puts += rt.block_on(w)??;
    }
    row();
    println!("puts: {puts} in {:.0} s", start.elapsed().as_secs_f64());
    controller.stop();
    drop(db);
    rt.shutdown_timeout(Duration::from_secs(5));
    Ok(())
}
