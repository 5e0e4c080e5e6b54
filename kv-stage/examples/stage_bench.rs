//! The stage micro-benchmark of the Paio paper's Fig. 4: threads enforcing
//! requests through channels of Noop or DRL objects, as fast as they can.
//!
//! ```text
//! cargo run --release -p kv-stage --example stage_bench -- --threads 1 --channels 1 --size 0 --object noop --duration 5s
//! cargo run --release -p kv-stage --example stage_bench -- --object drl --size 4096 --rate 64MiB/s --duration 5s --json
//! cargo run --release -p kv-stage --example stage_bench -- --object drl --size 0 --rate 1000 --change-rate 2000 --change-at 2s
//! ```
//!
//! Thread `t` uses workflow id `t` and goes to channel `t % channels`, so each
//! thread has its own channel when the counts match and threads share
//! channels when there are fewer. Each thread builds a fresh context per
//! request (the whole enforce path: context, channel and object selection,
//! enforcement, counting). `--rate` is per channel, in ops/s when `--size 0`
//! and bytes/s otherwise.
//!
//! Output: ops/s (all threads), ns/op (wall time per request on one thread,
//! i.e. threads / ops_per_sec), GiB/s; for DRL the configured rate and the
//! measured rate per channel (mean over channels, from the stage's own
//! counters, over the whole run including the initial burst). With
//! `--change-rate`, the rate is changed on every channel at `--change-at`, and
//! the rates measured before, during the first refill period after, and after
//! that are reported.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use kv_stage::units::parse_duration;
use kv_stage::{
    Context, DrlSpec, Match, ObjectChange, ObjectSpec, RequestType, Rule, Stage, WorkflowId, rule::FieldMatch,
    units::Rate,
};
use serde_json::json;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    Noop,
    Drl,
}

#[derive(Parser)]
#[command(about = "Stage micro-benchmark (Paio Fig. 4): threads x channels x request size")]
struct Args {
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Channels (threads are spread over them).
    #[arg(long, default_value_t = 1)]
    channels: usize,
    /// Request size in bytes (0 = context-only requests).
    #[arg(long, default_value_t = 0)]
    size: u64,
    /// Enforcement object in every channel.
    #[arg(long, value_enum, default_value_t = Kind::Noop)]
    object: Kind,
    /// DRL rate per channel: ops/s when --size 0, bytes/s otherwise
    /// (a number, or a rate such as 64MiB/s).
    #[arg(long)]
    rate: Option<String>,
    /// Requests per thread (default: until --duration).
    #[arg(long)]
    ops: Option<u64>,
    /// How long to run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    duration: Duration,
    /// New DRL rate, applied to every channel at --change-at.
    #[arg(long)]
    change_rate: Option<String>,
    /// When to apply --change-rate (default: half way).
    #[arg(long, value_parser = parse_duration)]
    change_at: Option<Duration>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// A rate in the unit the benchmark uses: ops/s for 0-byte requests.
fn parse_rate(s: &str, size: u64) -> Result<Rate, String> {
    let r: Rate = s.parse().map_err(|e| format!("--rate: {e}"))?;
    if size == 0 && !r.is_unlimited() {
        return Rate::from_ops_per_sec(r.per_sec()).map_err(|e| e.to_string());
    }
    Ok(r)
}

fn main() -> Result<(), String> {
    let a = Args::parse();
    if a.threads == 0 || a.channels == 0 {
        return Err("--threads and --channels must be at least 1".into());
    }
    if a.object == Kind::Noop && (a.rate.is_some() || a.change_rate.is_some()) {
        return Err("--rate and --change-rate need --object drl".into());
    }
    let rate = match (&a.rate, a.object) {
        (Some(r), _) => parse_rate(r, a.size)?,
        (None, Kind::Drl) => return Err("--object drl needs --rate".into()),
        (None, Kind::Noop) => Rate::UNLIMITED,
    };
    let change = a.change_rate.as_deref().map(|r| parse_rate(r, a.size)).transpose()?;
    let change_at = a.change_at.unwrap_or(a.duration / 2);

    let stage = Arc::new(Stage::new("stage_bench"));
    let mut rules = Vec::new();
    for c in 0..a.channels {
        let workflows = (0..a.threads).filter(|t| t % a.channels == c).map(|t| WorkflowId(t as u64));
        let spec = match a.object {
            Kind::Noop => ObjectSpec::Noop,
            Kind::Drl => ObjectSpec::Drl(DrlSpec::new(rate)),
        };
        rules.push(Rule::CreateChannel {
            channel: format!("c{c}"),
            matches: Some(Match { workflow: FieldMatch::set(workflows), ..Match::default() }),
        });
        rules.push(Rule::CreateObject { channel: format!("c{c}"), object: "o".into(), spec, matches: None });
    }
    stage.apply_rules(rules).map_err(|e| e.to_string())?;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(a.threads + 1));
    let per_thread_ops = a.ops.unwrap_or(u64::MAX);
    let workers: Vec<_> = (0..a.threads)
        .map(|t| {
            let (stage, stop, done, barrier) = (stage.clone(), stop.clone(), done.clone(), barrier.clone());
            let size = a.size;
            // A Noop thread checks the shared stop flag every 256 requests;
            // a DRL thread after each one, as it may be held for long.
            let batch = if a.object == Kind::Noop { 256 } else { 1 };
            std::thread::spawn(move || {
                let workflow = WorkflowId(t as u64);
                barrier.wait();
                let mut n = 0u64;
                'run: while n < per_thread_ops {
                    for _ in 0..batch {
                        let ctx = Context::new(RequestType::Write, std::hint::black_box(size)).in_workflow(workflow);
                        if stage.enforce(&ctx).is_err() {
                            break 'run;
                        }
                        n += 1;
                        if n == per_thread_ops {
                            break 'run;
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                let finished = Instant::now();
                done.fetch_add(1, Ordering::Relaxed);
                (n, finished)
            })
        })
        .collect();

    let channel_tokens = |s: &Stage| -> u64 {
        let c = s.collect();
        (0..a.channels)
            .map(|i| {
                let k = c.channel(&format!("c{i}")).unwrap_or_default();
                if a.size == 0 { k.ops } else { k.bytes }
            })
            .sum()
    };

    barrier.wait();
    let start = Instant::now();
    // Samples of (time, admitted tokens) around the rate change.
    let mut samples: Vec<(Duration, u64)> = Vec::new();
    let mut changed = false;
    let period = kv_stage::object::DEFAULT_REFILL_PERIOD;
    while start.elapsed() < a.duration && done.load(Ordering::Relaxed) < a.threads as u64 {
        if let Some(r) = change {
            let t = start.elapsed();
            if !changed && t >= change_at / 2 && samples.is_empty() {
                samples.push((t, channel_tokens(&stage)));
            }
            if !changed && t >= change_at {
                samples.push((start.elapsed(), channel_tokens(&stage)));
                for c in 0..a.channels {
                    stage.configure(&format!("c{c}"), "o", ObjectChange::rate(r)).map_err(|e| e.to_string())?;
                }
                samples.push((start.elapsed(), channel_tokens(&stage)));
                changed = true;
            }
            if changed && samples.len() == 3 && t >= change_at + period {
                samples.push((start.elapsed(), channel_tokens(&stage)));
            }
        }
        // Wake often only when a rate change has to be timed; otherwise stay
        // out of the way of the worker threads.
        let nap = if change.is_some() { Duration::from_millis(1) } else { Duration::from_millis(20) };
        std::thread::sleep(nap.min(a.duration / 100));
    }
    stop.store(true, Ordering::Relaxed);
    if change.is_some() {
        samples.push((start.elapsed(), channel_tokens(&stage)));
    }
    // A DRL at rate 0 would hold its threads forever; shutting down frees them.
    if a.object == Kind::Drl {
        std::thread::sleep(Duration::from_millis(50));
        if done.load(Ordering::Relaxed) < a.threads as u64 {
            stage.shutdown();
        }
    }
    let results: Vec<(u64, Instant)> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
    let total_ops: u64 = results.iter().map(|r| r.0).sum();
    // Until the last thread finished its last request.
    let elapsed = results.iter().map(|r| r.1).max().map_or(0.0, |t| (t - start).as_secs_f64());
    let tokens = channel_tokens(&stage);

    let ops_per_sec = total_ops as f64 / elapsed;
    let ns_per_op = if total_ops == 0 { f64::NAN } else { elapsed * 1e9 * a.threads as f64 / total_ops as f64 };
    let gib_per_sec = total_ops as f64 * a.size as f64 / elapsed / (1u64 << 30) as f64;
    let mut out = json!({
        "threads": a.threads,
        "channels": a.channels,
        "size": a.size,
        "object": match a.object { Kind::Noop => "noop", Kind::Drl => "drl" },
        "duration_s": elapsed,
        "ops": total_ops,
        "ops_per_sec": ops_per_sec,
        "ns_per_op": ns_per_op,
        "gib_per_sec": gib_per_sec,
    });
    if a.object == Kind::Drl {
        let unit = if a.size == 0 { "ops/s" } else { "bytes/s" };
        out["rate_unit"] = json!(unit);
        out["configured_rate"] = json!(rate.per_sec());
        out["measured_rate"] = json!(tokens as f64 / elapsed / a.channels as f64);
        if let (Some(r), 5) = (change, samples.len()) {
            let rate_between = |i: usize, j: usize| {
                let (t0, v0) = samples[i];
                let (t1, v1) = samples[j];
                (v1 - v0) as f64 / (t1 - t0).as_secs_f64().max(1e-9) / a.channels as f64
            };
            out["changed_rate"] = json!(r.per_sec());
            out["rate_before_change"] = json!(rate_between(0, 1));
            out["rate_first_period_after_change"] = json!(rate_between(2, 3));
            out["rate_after_first_period"] = json!(rate_between(3, 4));
            out["refill_period_ms"] = json!(period.as_secs_f64() * 1e3);
        }
    }
    if a.json {
        println!("{out}");
    } else {
        println!(
            "threads={} channels={} size={}B object={}: {:.0} ops/s, {:.1} ns/op, {:.3} GiB/s",
            a.threads,
            a.channels,
            a.size,
            out["object"].as_str().unwrap_or(""),
            ops_per_sec,
            ns_per_op,
            gib_per_sec
        );
        if a.object == Kind::Drl {
            println!(
                "  DRL per channel: configured {:.0} {}, measured {:.0} {} ({:+.2}%)",
                rate.per_sec(),
                out["rate_unit"].as_str().unwrap_or(""),
                out["measured_rate"].as_f64().unwrap_or(0.0),
                out["rate_unit"].as_str().unwrap_or(""),
                (out["measured_rate"].as_f64().unwrap_or(0.0) / rate.per_sec() - 1.0) * 100.0
            );
            if out.get("changed_rate").is_some() {
                println!(
                    "  rate change to {:.0} at {:?}: before {:.0}, first {} ms after {:.0}, after that {:.0}",
                    out["changed_rate"].as_f64().unwrap_or(0.0),
                    change_at,
                    out["rate_before_change"].as_f64().unwrap_or(0.0),
                    period.as_millis(),
                    out["rate_first_period_after_change"].as_f64().unwrap_or(0.0),
                    out["rate_after_first_period"].as_f64().unwrap_or(0.0)
                );
            }
        }
    }
    Ok(())
}
