//! Benchmarks of the remote control plane (figures for the README; not
//! timed tests).
//!
//! ```text
//! # Control round trip (collect + configure) on loopback TCP and a Unix socket
//! cargo run --release -p kv-remote --example control_bench -- roundtrip
//! # One controller against N simulated stages (agents in child processes)
//! cargo run --release -p kv-remote --example control_bench -- fleet --stages 500 --interval 100ms --cycles 50
//! # The enforce path with and without an agent and a controller polling every 10 ms
//! cargo run --release -p kv-remote --example control_bench -- enforce
//! ```
//!
//! Everything listens on loopback or Unix sockets in a temporary directory;
//! child processes are bounded in time and killed when the run ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use controller::{Controller, ControllerConfig, FairShareConfig, InstanceConfig, PolicyKind, SilkConfig, StageHandle};
use kv_remote::{ClientOptions, Connector, Endpoint, StageAgent};
use kv_stage::units::parse_duration;
use kv_stage::{
    Context, DrlSpec, Match, ObjectChange, ObjectSpec, RequestContext, RequestType, Rule, Stage,
    units::{Bandwidth, Rate},
};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Collect + configure round trips against one agent.
    Roundtrip {
        /// Round trips per transport.
        #[arg(long, default_value_t = 5000)]
        iterations: usize,
    },
    /// One controller (max-min) against many stages.
    Fleet {
        /// Simulated stages.
        #[arg(long, default_value_t = 100)]
        stages: usize,
        /// Processes hosting the agents.
        #[arg(long, default_value_t = 4)]
        processes: usize,
        /// Control interval.
        #[arg(long, default_value = "1s")]
        interval: String,
        /// Cycles measured.
        #[arg(long, default_value_t = 20)]
        cycles: u64,
        /// One agent (and one socket, one call per cycle) per stage,
        /// instead of one agent per process serving all its stages.
        #[arg(long)]
        agent_per_stage: bool,
    },
    /// Threads enforcing through a RocksDB-like layout, with and without an
    /// agent and a SILK controller polling every 10 ms.
    Enforce {
        /// Enforcing threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Requests per thread per run.
        #[arg(long, default_value_t = 20_000_000)]
        requests: u64,
        /// Alternating pairs of runs.
        #[arg(long, default_value_t = 5)]
        pairs: usize,
    },
    /// (internal) Hosts agents for `fleet`.
    Agents {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        first: usize,
        #[arg(long)]
        count: usize,
        #[arg(long, default_value = "120s")]
        duration: String,
        #[arg(long)]
        agent_per_stage: bool,
    },
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match Args::parse().mode {
        Mode::Roundtrip { iterations } => roundtrip(iterations),
        Mode::Fleet { stages, processes, interval, cycles, agent_per_stage } => {
            fleet(stages, processes, &interval, cycles, agent_per_stage)
        }
        Mode::Enforce { threads, requests, pairs } => enforce(threads, requests, pairs),
        Mode::Agents { dir, first, count, duration, agent_per_stage } => {
            agents(&dir, first, count, &duration, agent_per_stage)
        }
    }
}

/// A stage with one channel and a DRL on the foreground context.
fn small_stage(name: &str) -> Arc<Stage> {
    let stage = Arc::new(Stage::new(name));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
                matches: None,
            },
        ])
        .expect("layout");
    stage
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn roundtrip(iterations: usize) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let stage = small_stage("bench");
    for endpoint in [
        "127.0.0.1:0".parse::<Endpoint>()?,
        format!("unix:{}", dir.path().join("rt.sock").display()).parse::<Endpoint>()?,
    ] {
        // A TCP listener needs a token; the Unix socket takes it too.
        let agent = StageAgent::builder(Arc::clone(&stage)).token("bench-token").serve(&endpoint)?;
        let remote = Connector::new(ClientOptions {
            lease: Duration::from_secs(3),
            token: Some("bench-token".into()),
            ..Default::default()
        })?
        .connect(agent.endpoint())?;
        let object = remote.object("fg", "drl");
        assert!(object.is_none(), "no layout read yet");
        remote.stage_info()?;
        let object = remote.object("fg", "drl").ok_or("no fg/drl")?;
        let mut collect = Vec::with_capacity(iterations);
        let mut both = Vec::with_capacity(iterations);
        for i in 0..iterations + 200 {
            let t0 = Instant::now();
            StageHandle::collect(&remote)?;
            let t1 = Instant::now();
            object.configure(&ObjectChange::rate(Rate::from_bytes_per_sec(1e9 + i as f64)?))?;
            let t2 = Instant::now();
            if i >= 200 {
                collect.push((t1 - t0).as_secs_f64() * 1e6);
                both.push((t2 - t0).as_secs_f64() * 1e6);
            }
        }
        collect.sort_by(f64::total_cmp);
        both.sort_by(f64::total_cmp);
        println!(
            "{}: collect p50 {:.0} us p99 {:.0} us; collect + configure p50 {:.0} us p99 {:.0} us ({iterations} round trips)",
            agent.endpoint(),
            percentile(&collect, 0.5),
            percentile(&collect, 0.99),
            percentile(&both, 0.5),
            percentile(&both, 0.99)
        );
    }
    Ok(())
}

/// Kills the children when the run ends, also on failure.
struct Children(Vec<Child>);
impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process, in clock ticks (100 per second here).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0) + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn fleet(
    stages: usize,
    processes: usize,
    interval: &str,
    cycles: u64,
    agent_per_stage: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let interval = parse_duration(interval)?;
    let dir = tempfile::tempdir()?;
    let exe = std::env::current_exe()?;
    let per = stages.div_ceil(processes.max(1));
    let mut children = Children(Vec::new());
    let mut first = 0;
    let mut hosts = Vec::new();
    while first < stages {
        let count = per.min(stages - first);
        let mut cmd = Command::new(&exe);
        cmd.args(["agents", "--first", &first.to_string(), "--count", &count.to_string(), "--dir"]).arg(dir.path());
        if agent_per_stage {
            cmd.arg("--agent-per-stage");
        }
        children.0.push(cmd.stdout(Stdio::null()).spawn()?);
        hosts.push(first);
        first += count;
    }
    let sock = |i: usize| dir.path().join(if agent_per_stage { format!("s{i}.sock") } else { format!("h{i}.sock") });
    let sockets: Vec<usize> = if agent_per_stage { (0..stages).collect() } else { hosts };
    let deadline = Instant::now() + Duration::from_secs(60);
    for &i in &sockets {
        while std::os::unix::net::UnixStream::connect(sock(i)).is_err() {
            if Instant::now() > deadline {
                return Err(format!("agent {i} never listened").into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let connector = Connector::new(ClientOptions { lease: interval * 3, ..Default::default() })?;
    let names: Vec<String> = (0..stages).map(|i| format!("s{i}")).collect();
    let config = ControllerConfig {
        interval: Some(interval),
        ..ControllerConfig::fair_share(
            PolicyKind::MaxMin,
            FairShareConfig {
                device_bandwidth: Bandwidth::new(stages as f64 * 1048576.0)?,
                instances: names
                    .iter()
                    .map(|n| InstanceConfig {
                        name: n.clone(),
                        demand: Rate::UNLIMITED,
                        channel: "fg".into(),
                        object: "drl".into(),
                    })
                    .collect(),
            },
        )
    };
    let mut builder = Controller::builder(config);
    for &i in &sockets {
        let endpoint: Endpoint = format!("unix:{}", sock(i).display()).parse()?;
        for stage in connector.connect_all(&endpoint)? {
            let name = stage.name().to_owned();
            builder = builder.instance(name, Arc::new(stage) as Arc<dyn StageHandle>);
        }
    }
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let ctl = builder.start()?;
    while ctl.cycles() < cycles + 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let log = ctl.stop();
    // The first two cycles read every layout; the rest are the steady state.
    let mut times: Vec<f64> = log.iter().skip(2).map(|r| r.cycle_ms).collect();
    let errors = log.iter().skip(2).flat_map(|r| &r.settings).filter(|s| s.error.is_some()).count();
    let unread = log.iter().skip(2).flat_map(|r| &r.inputs).filter(|i| i.error.is_some()).count();
    times.sort_by(f64::total_cmp);
    println!(
        "{stages} stages in {} processes ({}), interval {interval:?}: cycle p50 {:.2} ms p99 {:.2} ms max {:.2} ms over {} cycles; controller CPU {:.1}% of one core; {errors} failed changes, {unread} unread stages",
        children.0.len(),
        if agent_per_stage { "an agent per stage" } else { "an agent per process" },
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.last().copied().unwrap_or(f64::NAN),
        times.len(),
        cpu / wall * 100.0
    );
    Ok(())
}

fn agents(
    dir: &std::path::Path,
    first: usize,
    count: usize,
    duration: &str,
    agent_per_stage: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let duration = parse_duration(duration)?;
    // One runtime for all the agents of this process, as a service with
    // many stages would have.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let mut held = Vec::new();
    let stages: Vec<Arc<Stage>> = (first..first + count)
        .map(|i| {
            let stage = small_stage(&format!("s{i}"));
            // Some traffic, so counters move.
            let _ = stage.enforce(&Context::new(RequestType::Write, 4096));
            stage
        })
        .collect();
    if agent_per_stage {
        for (i, stage) in (first..).zip(&stages) {
            let endpoint: Endpoint = format!("unix:{}", dir.join(format!("s{i}.sock")).display()).parse()?;
            held.push(StageAgent::builder(Arc::clone(stage)).runtime(runtime.handle().clone()).serve(&endpoint)?);
        }
    } else {
        let mut b = StageAgent::builder(Arc::clone(&stages[0])).runtime(runtime.handle().clone());
        for stage in &stages[1..] {
            b = b.stage(Arc::clone(stage));
        }
        let endpoint: Endpoint = format!("unix:{}", dir.join(format!("h{first}.sock")).display()).parse()?;
        held.push(b.serve(&endpoint)?);
    }
    // Bounded: the parent kills us, or we stop by ourselves.
    std::thread::sleep(duration);
    Ok(())
}

/// The paper's RocksDB layout: foreground through a Noop, flush and
/// compaction DRLs (what SILK drives).
fn rocks_stage() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("enforce"));
    let layout = concat!(env!("CARGO_MANIFEST_DIR"), "/../kv-stage/examples/rules/rocksdb.toml");
    stage.apply(&kv_stage::RuleSet::load(std::path::Path::new(layout)).expect("layout")).expect("apply");
    stage
}

/// ns per request per thread, enforcing foreground writes of 4 KiB.
fn enforce_run(stage: &Arc<Stage>, threads: usize, requests: u64) -> f64 {
    let start = Arc::new(std::sync::Barrier::new(threads + 1));
    let done = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (stage, start, done) = (Arc::clone(stage), Arc::clone(&start), Arc::clone(&done));
            std::thread::spawn(move || {
                start.wait();
                let t0 = Instant::now();
                for _ in 0..requests {
                    let _ = std::hint::black_box(stage.enforce(&Context::new(RequestType::Write, 4096)));
                }
                done.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    for h in handles {
        let _ = h.join();
    }
    done.load(Ordering::Relaxed) as f64 / (threads as u64 * requests) as f64
}

fn enforce(threads: usize, requests: u64, pairs: usize) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut without = Vec::new();
    let mut with = Vec::new();
    for _ in 0..pairs {
        let stage = rocks_stage();
        without.push(enforce_run(&stage, threads, requests));

        let stage = rocks_stage();
        let endpoint: Endpoint = format!("unix:{}", dir.path().join("e.sock").display()).parse()?;
        let agent = StageAgent::serve(Arc::clone(&stage), &endpoint)?;
        let remote = Connector::new(ClientOptions { lease: Duration::from_millis(100), ..Default::default() })?
            .connect(agent.endpoint())?;
        let mut cfg = ControllerConfig::silk(SilkConfig::default());
        cfg.interval = Some(Duration::from_millis(10));
        let ctl = Controller::builder(cfg).instance("kv", Arc::new(remote) as Arc<dyn StageHandle>).start()?;
        let stop = AtomicBool::new(false);
        with.push(enforce_run(&stage, threads, requests));
        stop.store(true, Ordering::Relaxed);
        let cycles = ctl.cycles();
        let log = ctl.stop();
        assert!(cycles > 0 && log.iter().all(|r| r.inputs.iter().all(|i| i.error.is_none())));
        drop(agent);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (a, b) = (median(&mut without), median(&mut with));
    println!(
        "enforce, {threads} threads, 4 KiB foreground writes: without an agent {a:.1} ns/op, with an agent and SILK polling every 10 ms {b:.1} ns/op (median of {pairs}); ratio {:.3}",
        b / a
    );
    Ok(())
}
