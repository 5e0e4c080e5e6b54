//! `kvsds-controller --config fleet.toml`: one controller for the stages a
//! fleet file lists (see `kv_remote::FleetConfig`). Runs until SIGINT or
//! SIGTERM (or `--duration`), then writes the rest of its decision log.
//! With `--metrics 127.0.0.1:9465` (or `metrics` in the `[fleet]` table)
//! it serves Prometheus metrics at `/metrics`. Logs go to stderr, filtered
//! by `RUST_LOG` (default `info`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use kv_remote::{Fleet, FleetConfig};

/// One controller, many stages over gRPC.
#[derive(Debug, Parser)]
#[command(name = "kvsds-controller", version)]
struct Args {
    /// The fleet file (TOML: the controller's keys and a `[fleet]` table).
    #[arg(long)]
    config: PathBuf,
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
    let mut config = FleetConfig::load(&args.config)?;
    if let Some(addr) = args.metrics {
        if !addr.ip().is_loopback() && !args.metrics_allow_remote {
            return Err(format!(
                "--metrics: {addr} is not a loopback address; add --metrics-allow-remote to serve metrics there"
            )
            .into());
        }
        config.metrics = Some(addr);
        config.fleet.metrics_allow_remote = args.metrics_allow_remote;
    }
    let duration = match &args.duration {
        Some(d) => Some(kv_stage::units::parse_duration(d).map_err(|e| format!("--duration: {e}"))?),
        None => None,
    };
    if args.check {
        println!(
            "{}: policy {:?}, {} stage(s) and {} host(s), interval {:?}, lease {:?}",
            args.config.display(),
            config.controller.policy,
            config.fleet.stage.len(),
            config.fleet.host.len(),
            config.controller.effective_interval(),
            config.lease()
        );
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<()>();
    ctrlc::set_handler(move || {
        let _ = tx.send(());
    })?;
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
    let log = fleet.stop();
    tracing::info!(cycles = log.last().map_or(0, |r| r.cycle + 1), "stopped");
    Ok(())
}
