//! `kvsds-controller --config fleet.toml`: one controller for the stages a
//! fleet file lists (see `kv_remote::FleetConfig`). Runs until SIGINT or
//! SIGTERM (or `--duration`), then writes the rest of its decision log.

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
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => {}
        Err(e) => {
            eprintln!("kvsds-controller: {e}");
            std::process::exit(2);
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = FleetConfig::load(&args.config)?;
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
    eprintln!(
        "kvsds-controller: policy {:?}, {} stage(s) and {} host(s), interval {:?}, lease {:?}, pid {}",
        config.controller.policy,
        config.fleet.stage.len(),
        config.fleet.host.len(),
        config.controller.effective_interval(),
        config.lease(),
        std::process::id()
    );
    let fleet = Fleet::start(config)?;
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
            eprintln!("kvsds-controller: signal: stopping");
            break;
        }
    }
    let log = fleet.stop();
    eprintln!("kvsds-controller: stopped after {} cycles", log.last().map_or(0, |r| r.cycle + 1));
    Ok(())
}
