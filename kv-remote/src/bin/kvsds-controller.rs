//! `kvsds-controller --config fleet.toml`: one controller for the stages a
//! fleet file lists (see `kv_remote::FleetConfig`). Runs until SIGINT or
//! SIGTERM (or `--duration`), then writes the rest of its decision log.
//! With `--metrics 127.0.0.1:9465` (or `metrics` in the `[fleet]` table)
//! it serves Prometheus metrics at `/metrics`. Logs go to stderr, filtered
//! by `RUST_LOG` (default `info`).
//!
//! `kvsds-controller --etcd 127.0.0.1:2379`: one of several controllers
//! electing a leader through etcd (see `kv_remote::ElectedController`);
//! the leader drives the stages registered under `<prefix>/stages/` with
//! the policy at `<prefix>/policy`, which `--put-policy FILE` checks and
//! writes.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use kv_remote::etcd::EtcdConfig;
use kv_remote::{ElectedController, ElectedOptions, Fleet, FleetConfig};

/// One controller, many stages over gRPC.
#[derive(Debug, Parser)]
#[command(name = "kvsds-controller", version)]
struct Args {
    /// The fleet file (TOML: the controller's keys and a `[fleet]` table).
    #[arg(long, required_unless_present = "etcd", conflicts_with = "etcd")]
    config: Option<PathBuf>,
    /// Campaign for the leadership through etcd at these endpoints
    /// (comma-separated host:port); the policy and the stages are read
    /// from etcd.
    #[arg(long)]
    etcd: Option<String>,
    /// The fleet's key prefix in etcd.
    #[arg(long, default_value = "/kvsds", requires = "etcd")]
    etcd_prefix: String,
    /// The etcd lease TTL of the leadership (whole seconds): a dead
    /// leader is replaced this long after its last keep-alive.
    #[arg(long, default_value = "2s", requires = "etcd")]
    etcd_ttl: String,
    /// With --etcd: check this fleet file as a policy, write it to
    /// `<prefix>/policy`, and exit.
    #[arg(long, requires = "etcd")]
    put_policy: Option<PathBuf>,
    /// With --etcd: this controller's decision log (in place of the
    /// policy's `log`).
    #[arg(long, requires = "etcd")]
    log: Option<PathBuf>,
    /// Stop after this long (e.g. "60s"); default: run until a signal.
    #[arg(long)]
    duration: Option<String>,
    /// Check the file and exit.
    #[arg(long)]
    check: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (overrides the
    /// fleet file's `metrics`; loopback unless `--metrics-allow-remote`).
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Let `--metrics` listen on an address that is not loopback.
    #[arg(long)]
    metrics_allow_remote: bool,
}

fn main() {
    let args = Args::parse();
    kv_remote::log_to_stderr();
    match run(&args) {
        Ok(()) => {}
        Err(e) => {
            tracing::error!("{e}");
            std::process::exit(2);
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(list) = &args.etcd {
        return run_elected(args, list);
    }
    let path = args.config.as_ref().ok_or("--config: give a fleet file, or --etcd")?;
    let mut config = FleetConfig::load(path)?;
    if let Some(addr) = args.metrics {
        check_metrics(addr, args.metrics_allow_remote)?;
        config.metrics = Some(addr);
        config.fleet.metrics_allow_remote = args.metrics_allow_remote;
    }
    let duration = parse_duration(args)?;
    if args.check {
        println!(
            "{}: policy {:?}, {} stage(s) and {} host(s), interval {:?}, lease {:?}",
            path.display(),
            config.controller.policy,
            config.fleet.stage.len(),
            config.fleet.host.len(),
            config.controller.effective_interval(),
            config.lease()
        );
        return Ok(());
    }
    let rx = signals()?;
    tracing::info!(
        policy = ?config.controller.policy,
        stages = config.fleet.stage.len(),
        hosts = config.fleet.host.len(),
        interval = ?config.controller.effective_interval(),
        lease = ?config.lease(),
        pid = std::process::id(),
        "starting"
    );
    let fleet = Fleet::start(config)?;
    if let Some(addr) = fleet.metrics_addr() {
        tracing::info!("metrics at http://{addr}/metrics");
    }
    wait(duration, &rx);
    let log = fleet.stop();
    tracing::info!(cycles = log.last().map_or(0, |r| r.cycle + 1), "stopped");
    Ok(())
}

fn check_metrics(addr: std::net::SocketAddr, allow_remote: bool) -> Result<(), String> {
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(format!(
            "--metrics: {addr} is not a loopback address; add --metrics-allow-remote to serve metrics there"
        ));
    }
    Ok(())
}

fn parse_duration(args: &Args) -> Result<Option<Duration>, String> {
    match &args.duration {
        Some(d) => Ok(Some(kv_stage::units::parse_duration(d).map_err(|e| format!("--duration: {e}"))?)),
        None => Ok(None),
    }
}

fn signals() -> Result<mpsc::Receiver<()>, Box<dyn std::error::Error>> {
    let (tx, rx) = mpsc::channel::<()>();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
    Ok(rx)
}

/// Until `duration` passed or a signal came.
fn wait(duration: Option<Duration>, rx: &mpsc::Receiver<()>) {
    let started = Instant::now();
    loop {
        let wait = match duration {
            Some(d) => match d.checked_sub(started.elapsed()) {
                Some(left) => left.min(Duration::from_millis(200)),
                None => break,
            },
            None => Duration::from_millis(200),
        };
        if rx.recv_timeout(wait).is_ok() {
            tracing::info!("signal: stopping");
            break;
        }
    }
}

fn run_elected(args: &Args, list: &str) -> Result<(), Box<dyn std::error::Error>> {
    let ttl = kv_stage::units::parse_duration(&args.etcd_ttl).map_err(|e| format!("--etcd-ttl: {e}"))?;
    let etcd = EtcdConfig::new(EtcdConfig::parse_endpoints(list)?).with_prefix(args.etcd_prefix.clone()).with_ttl(ttl);
    etcd.validate()?;
    if args.check {
        return Err("--check checks a fleet file (--config); with --etcd, --put-policy FILE checks a policy before it writes it".into());
    }
    if let Some(file) = &args.put_policy {
        let text = std::fs::read_to_string(file).map_err(|e| format!("--put-policy: {}: {e}", file.display()))?;
        FleetConfig::parse_policy(&text, &file.display().to_string())?;
        kv_remote::etcd::put_policy(&etcd, &text)?;
        println!("{}: written to {}", file.display(), etcd.policy_key());
        return Ok(());
    }
    if let Some(addr) = args.metrics {
        check_metrics(addr, args.metrics_allow_remote)?;
    }
    let duration = parse_duration(args)?;
    let rx = signals()?;
    tracing::info!(etcd = list, prefix = etcd.prefix.as_str(), ttl = ?etcd.ttl, pid = std::process::id(), "starting");
    let elected = ElectedController::start(ElectedOptions {
        etcd,
        log: args.log.clone(),
        metrics: args.metrics,
        metrics_allow_remote: args.metrics_allow_remote,
    })?;
    if let Some(addr) = elected.metrics_addr() {
        tracing::info!("metrics at http://{addr}/metrics");
    }
    wait(duration, &rx);
    elected.stop();
    tracing::info!("stopped");
    Ok(())
}
