//! What a control cycle costs: runs SILK every millisecond against a stage
//! with the paper's RocksDB layout (foreground Noop, flush DRL, L0 and LN
//! DRLs) while a thread sends requests and flips flushes and compactions on
//! and off; with no hysteresis, every cycle sets every DRL. Prints the controller thread's
//! CPU time per cycle (from `/proc/self/task/<tid>/schedstat`).
//!
//! ```text
//! cargo run --release -p controller --example cycle_cost -- [seconds]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, SilkConfig};
use kv_stage::{
    Context, DrlSpec, InstanceId, Match, ObjectSpec, RequestContext as C, RequestType, Rule, Stage, units::Rate,
};

fn layout(stage: &Stage) {
    let drl = || ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "foreground".into(), matches: Some(Match::context(C::FOREGROUND)) },
            Rule::CreateObject {
                channel: "foreground".into(),
                object: "noop".into(),
                spec: ObjectSpec::Noop,
                matches: None,
            },
            Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(C::BG_FLUSH)) },
            Rule::CreateObject { channel: "flush".into(), object: "drl".into(), spec: drl(), matches: None },
            Rule::CreateChannel {
                channel: "compaction".into(),
                matches: Some(Match::contexts([C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN])),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "l0".into(),
                spec: drl(),
                matches: Some(Match::context(C::BG_COMPACTION_L0_L1)),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "ln".into(),
                spec: drl(),
                matches: Some(Match::context(C::BG_COMPACTION_LN)),
            },
        ])
        .expect("the layout applies");
}

/// Nanoseconds the thread named `name` has run on a CPU.
fn thread_cpu_ns(name: &str) -> Option<u64> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
            return s.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

fn main() {
    let secs: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    let stage = Arc::new(Stage::new("cycle-cost"));
    layout(&stage);
    // No hysteresis: every cycle sets every DRL, the most a cycle does.
    let silk =
        SilkConfig { hysteresis: Rate::from_bytes_per_sec(0.0).expect("zero is a rate"), ..SilkConfig::default() };
    let mut cfg = ControllerConfig::silk(silk);
    cfg.interval = Some(Duration::from_millis(1));
    let ctl = Controller::builder(cfg).instance("db", stage.clone()).max_log_records(16).start().expect("starts");

    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (stage, stop) = (Arc::clone(&stage), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            let deadline = Instant::now() + Duration::from_secs(secs + 5);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                for ctx in [C::FOREGROUND, C::BG_FLUSH, C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN] {
                    let _ = stage.enforce(&Context::new(RequestType::Write, 4096).in_context(ctx));
                }
                // A flush or an L0 compaction runs about half the time.
                if n.is_multiple_of(2000) {
                    stage.job_started(
                        InstanceId(0),
                        if n.is_multiple_of(4000) { C::BG_FLUSH } else { C::BG_COMPACTION_L0_L1 },
                    );
                } else if n % 2000 == 1000 {
                    stage.job_finished(
                        InstanceId(0),
                        if n % 4000 == 1000 { C::BG_FLUSH } else { C::BG_COMPACTION_L0_L1 },
                    );
                }
                n += 1;
                if n.is_multiple_of(64) {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let (c0, t0) = (ctl.cycles(), thread_cpu_ns("controller-silk").unwrap_or(0));
    std::thread::sleep(Duration::from_secs(secs));
    let (c1, t1) = (ctl.cycles(), thread_cpu_ns("controller-silk").unwrap_or(0));
    stop.store(true, Ordering::Relaxed);
    load.join().expect("load thread");
    let log = ctl.stop();
    let changed = log.iter().filter(|r| !r.settings.is_empty()).count();
    let cycles = c1 - c0;
    println!(
        "{cycles} cycles in {secs} s; controller thread CPU {:.1} µs per cycle; {changed} of the last {} cycles changed a rate",
        (t1 - t0) as f64 / 1e3 / cycles.max(1) as f64,
        log.len()
    );
}
