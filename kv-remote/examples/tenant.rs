//! A tenant: a service with its own RocksDB (a `StagedDb`), a YCSB-like
//! client load (workload A: 50% reads, 50% updates of 1 KB values over a
//! preloaded key space), and a stage agent a controller reaches it by.
//!
//! Its stage is the paper's RocksDB layout plus a DRL, `foreground/drl`,
//! on the client I/O (unlimited until a controller sets it): the object a
//! fleet file names for this tenant. Every second it prints one JSON line
//! on stdout: operations done, client bytes through the DRL, and the DRL's
//! rate now.
//!
//! Start a fleet on one machine (three tenants, one controller):
//!
//! ```text
//! cargo build --release -p kv-remote --example tenant --bin kvsds-controller
//! install -d -m 0700 /run/kvsds
//! for t in t1 t2 t3; do
//!     target/release/examples/tenant --name $t --listen unix:/run/kvsds/$t.sock --duration 120s &
//! done
//! target/release/kvsds-controller --config kv-remote/examples/fleet.toml --duration 100s
//! ```
//!
//! Stops by itself after `--duration` (default 60 s) or on SIGINT/SIGTERM,
//! and removes its socket and (unless `--db` was given) its database.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use kv_remote::{Endpoint, Fallback, StageAgent};
use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, RuleSet, Stage, units::Rate};
use rocks_env::{RocksLayout, StagedDb};

/// A tenant service for fleet demos and tests.
#[derive(Debug, Parser)]
struct Args {
    /// The tenant's (and its stage's) name.
    #[arg(long)]
    name: String,
    /// Where the agent listens: unix:/path or 127.0.0.1:port.
    #[arg(long)]
    listen: String,
    /// The database directory (default: a temporary one, removed at exit).
    #[arg(long)]
    db: Option<std::path::PathBuf>,
    /// How long the load runs.
    #[arg(long, default_value = "60s")]
    duration: String,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Records preloaded (and the key space).
    #[arg(long, default_value_t = 5000)]
    records: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1000)]
    value_size: usize,
    /// Share of reads (the rest are updates).
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// What the stage returns to when its lease runs out: restore, keep.
    #[arg(long, default_value = "restore")]
    fallback: String,
    /// A token the controller must send.
    #[arg(long)]
    token: Option<String>,
    /// RocksDB's write buffer (memtable) size, e.g. 4MiB. A buffer larger
    /// than the run writes means no flush, so the load does not wait on a
    /// disk that is busy with something else.
    #[arg(long, default_value = "4MiB")]
    write_buffer: String,
    /// Serve Prometheus metrics (the stage's, the agent's and the
    /// RocksDB's) at http://ADDR/metrics; port 0 picks one, printed on
    /// stderr.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Register the stage in etcd at these endpoints (comma-separated),
    /// for a controller elected there (see `kvsds-controller --etcd`).
    #[arg(long)]
    etcd: Option<String>,
    /// The fleet's key prefix in etcd.
    #[arg(long, default_value = "/kvsds")]
    etcd_prefix: String,
    /// The registration's etcd lease TTL (whole seconds).
    #[arg(long, default_value = "2s")]
    etcd_ttl: String,
}

/// A small xorshift generator (the load needs no more).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn main() {
    // Logs (the agent's lease fallbacks, refused connections) on stderr,
    // filtered by RUST_LOG.
    kv_remote::log_to_stderr();
    if let Err(e) = run() {
        eprintln!("tenant: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let duration = kv_stage::units::parse_duration(&args.duration).map_err(|e| format!("--duration: {e}"))?;
    let endpoint: Endpoint = args.listen.parse()?;
    let fallback = match args.fallback.as_str() {
        "restore" => Fallback::Restore,
        "keep" => Fallback::Keep,
        other => return Err(format!("--fallback: '{other}' (restore, keep)").into()),
    };

    let stage = Arc::new(Stage::new(args.name.clone()));
    let layout = RocksLayout::new();
    let mut rules = layout.rules();
    rules.push(Rule::CreateObject {
        channel: layout.foreground(),
        object: "drl".into(),
        spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
        matches: Some(Match::context(RequestContext::FOREGROUND)),
    });
    stage.apply(&RuleSet::from_rules(rules))?;
    stage.object(&layout.foreground(), "drl").ok_or("no foreground/drl")?;

    let scratch = match &args.db {
        Some(_) => None,
        None => Some(tempfile::Builder::new().prefix("kvsds-tenant-").tempdir()?),
    };
    let path = args.db.clone().unwrap_or_else(|| scratch.as_ref().expect("temp dir").path().to_owned());
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let write_buffer = kv_stage::units::parse_bytes(&args.write_buffer).map_err(|e| format!("--write-buffer: {e}"))?;
    if !(64.0 * 1024.0..=4.0 * 1024.0 * 1024.0 * 1024.0).contains(&write_buffer) {
        return Err(format!("--write-buffer: {} is outside 64KiB..4GiB", args.write_buffer).into());
    }
    opts.set_write_buffer_size(write_buffer as usize);
    let db = Arc::new(StagedDb::builder(opts).stage(Arc::clone(&stage)).open(&path)?);
    let value = vec![b'v'; args.value_size];
    for i in 0..args.records {
        db.put(format!("user{i:010}"), &value)?;
    }

    let mut builder = StageAgent::builder(Arc::clone(&stage)).fallback(fallback).name(args.name.clone());
    if let Some(t) = &args.token {
        builder = builder.token(t.clone());
    }
    if let Some(addr) = args.metrics {
        let db_metrics = rocks_env::metrics::DbMetrics::new();
        db_metrics.add(&db);
        builder = builder.metrics(addr).collector(Box::new(db_metrics));
    }
    let agent = builder.serve(&endpoint)?;
    if let Some(addr) = agent.metrics_addr() {
        eprintln!("tenant {}: metrics at http://{addr}/metrics", args.name);
    }
    eprintln!("tenant {}: pid {}, agent on {}, load for {duration:?}", args.name, std::process::id(), agent.endpoint());
    // Dropped before the agent: the key vanishes at once on a clean exit.
    let registration = match &args.etcd {
        Some(list) => {
            let ttl = kv_stage::units::parse_duration(&args.etcd_ttl).map_err(|e| format!("--etcd-ttl: {e}"))?;
            let etcd = kv_remote::etcd::EtcdConfig::new(kv_remote::etcd::EtcdConfig::parse_endpoints(list)?)
                .with_prefix(args.etcd_prefix.clone())
                .with_ttl(ttl);
            let labels = [("tenant".to_owned(), args.name.clone())].into_iter().collect();
            Some(agent.register(etcd, labels)?)
        }
        None => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    ctrlc::set_handler(move || s.store(true, Ordering::Relaxed))?;
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.threads)
        .map(|t| {
            let (db, stop, ops, errors, value) =
                (Arc::clone(&db), Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&errors), value.clone());
            let (records, read_ratio) = (args.records.max(1), args.read_ratio);
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1) ^ u64::from(std::process::id()));
                while !stop.load(Ordering::Relaxed) && started.elapsed() < duration {
                    let key = format!("user{:010}", rng.next() % records);
                    let read = (rng.next() % 10_000) as f64 / 10_000.0 < read_ratio;
                    let r = if read { db.get(&key).map(|_| ()) } else { db.put(&key, &value) };
                    match r {
                        Ok(()) => ops.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();

    let mut last = (Instant::now(), 0u64, stage.collect().channel(&layout.foreground()).unwrap_or_default().bytes);
    while !stop.load(Ordering::Relaxed) && started.elapsed() < duration {
        std::thread::sleep(Duration::from_secs(1).min(duration.saturating_sub(started.elapsed())));
        let now = Instant::now();
        let n = ops.load(Ordering::Relaxed);
        let bytes = stage.collect().channel(&layout.foreground()).unwrap_or_default().bytes;
        let dt = now.duration_since(last.0).as_secs_f64().max(1e-9);
        let st = agent.stats();
        // Looked up each time: a lease's fallback (restore) may make the
        // object again, and a handle to the old one would show its old rate.
        let rate = match stage.object(&layout.foreground(), "drl").and_then(|o| o.spec()) {
            Some(ObjectSpec::Drl(s)) if !s.rate.is_unlimited() => serde_json::json!(s.rate.per_sec()),
            _ => serde_json::json!("unlimited"),
        };
        println!(
            "{}",
            serde_json::json!({
                "tenant": args.name,
                "t_s": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
                "ops_per_sec": ((n - last.1) as f64 / dt).round(),
                "fg_bytes_per_sec": ((bytes - last.2) as f64 / dt).round(),
                "drl_rate_bps": rate,
                "errors": errors.load(Ordering::Relaxed),
                "term": st.term,
                "change_term": st.change_term,
                "refused_term": st.refused_term,
                "registered": registration.as_ref().map(kv_remote::etcd::Registration::is_registered),
            })
        );
        last = (now, n, bytes);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    drop(registration);
    drop(agent);
    eprintln!(
        "tenant {}: done, {} ops, {} errors",
        args.name,
        ops.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed)
    );
    Ok(())
}
