//! The issue's three measurements, side by side in one run, medians of
//! `--runs` (default 5), alternating the variants:
//!
//! * `puts`: durable 100-byte puts from 256 tasks on a 2-worker runtime,
//!   through a `batch` object vs a `noop` one: puts/s, puts per CPU-second
//!   of the process, p99 latency;
//! * `tenants`: a light tenant alone, then next to a tenant flooding at 10x
//!   its limit on the same 2 workers, with the async API and with the
//!   blocking one: the light tenant's p99;
//! * `enforce`: `enforce_async` vs `enforce` on an unthrottled channel, ns/op.
//!
//! ```sh
//! cargo run --release -p kv-async --example async_bench            # everything
//! cargo run --release -p kv-async --example async_bench -- --part puts --runs 3
//! ```
//!
//! Every run makes its DB in a temporary directory that is removed after.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use kv_async::AsyncDb;
use kv_stage::{Context, ObjectChange, RequestContext, RequestType, RuleSet, RulesFormat, Stage};
use rocks_env::StagedDb;

#[derive(Parser)]
struct Args {
    /// puts, tenants, enforce or all.
    #[arg(long, default_value = "all")]
    part: String,
    /// Runs per variant (medians are reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds per run (puts and tenants).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrent tasks of the puts part.
    #[arg(long, default_value_t = 256)]
    tasks: usize,
    /// The AsyncDb's blocking threads in the puts part.
    #[arg(long, default_value_t = kv_async::DEFAULT_BLOCKING_THREADS)]
    blocking_threads: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

/// CPU time of the whole process (every thread: workers, blocking pool,
/// RocksDB's own), from /proc/self/stat.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the
    // state field, which does not parse as a number.
    let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
    // USER_HZ, the unit of these fields, is 100 on every Linux ABI.
    Duration::from_millis(ticks * 10)
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().expect("a runtime")
}

fn options() -> rocksdb::Options {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o
}

fn apply(stage: &Stage, rules: &str) {
    let set = RuleSet::parse(rules, RulesFormat::Toml, None, &Default::default()).expect("the bench's rules");
    stage.apply(&set).expect("the bench's rules apply");
}

fn channel(name: &str, types: &str, spec: &str) -> String {
    format!(
        "[[rules]]\nop = \"create_channel\"\nchannel = \"{name}\"\nmatch = {{ context = \"{name}\", type = [{types}] }}\n\
         [[rules]]\nop = \"create_object\"\nchannel = \"{name}\"\nobject = \"o\"\nspec = {spec}\n"
    )
}

// ----- puts ---------------------------------------------------------------

struct PutsRun {
    puts_per_sec: f64,
    puts_per_cpu_sec: f64,
    p99_us: f64,
    batches: u64,
}

fn puts_run(batch: bool, args: &Args) -> PutsRun {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let db = Arc::new(StagedDb::open(options(), dir.path().join("db")).expect("the DB opens"));
    let tenant = RequestContext::register("bench_writer").expect("a context");
    let spec = if batch { "{ kind = \"batch\" }" } else { "{ kind = \"noop\" }" };
    apply(db.stage(), &format!("version = 1\n{}", channel("bench_writer", "\"put\"", spec)));
    let adb = AsyncDb::builder(Arc::clone(&db)).blocking_threads(args.blocking_threads).build();
    let rt = runtime(2);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let seconds = args.seconds;
    let (hist, cpu, elapsed) = rt.block_on(async {
        let cpu0 = process_cpu();
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..args.tasks)
            .map(|t| {
                let (adb, stop, count) = (adb.clone(), Arc::clone(&stop), Arc::clone(&count));
                tokio::spawn(kv_async::scope(tenant, async move {
                    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("a histogram");
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("t{t:03}-{i:08}");
                        let s = Instant::now();
                        adb.put(key.into_bytes(), vec![7u8; 100 - 13]).await.expect("a durable put");
                        h.saturating_record(s.elapsed().as_micros() as u64);
                        count.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    h
                }))
            })
            .collect();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("a histogram");
        for t in tasks {
            all.add(t.await.expect("a writer task")).expect("histograms add");
        }
        (all, process_cpu() - cpu0, t0.elapsed())
    });
    let n = count.load(Ordering::Relaxed) as f64;
    let batches = adb.batch_stats().batches;
    drop(rt);
    drop(adb);
    PutsRun {
        puts_per_sec: n / elapsed.as_secs_f64(),
        puts_per_cpu_sec: n / cpu.as_secs_f64().max(1e-9),
        p99_us: hist.value_at_quantile(0.99) as f64,
        batches,
    }
}

fn puts(args: &Args) {
    println!(
        "\n## Durable 100-byte puts, {} tasks, 2 workers, {} blocking threads ({} s runs)\n",
        args.tasks, args.blocking_threads, args.seconds
    );
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for r in 0..args.runs {
        for batch in [r % 2 == 0, r % 2 != 0] {
            let run = puts_run(batch, args);
            println!(
                "run {r} {:8}: {:>8.0} puts/s, {:>8.0} puts/CPU-s, p99 {:>7.0} us{}",
                if batch { "batch" } else { "no batch" },
                run.puts_per_sec,
                run.puts_per_cpu_sec,
                run.p99_us,
                if batch { format!(", {} batches", run.batches) } else { String::new() }
            );
            if batch { with.push(run) } else { without.push(run) }
        }
    }
    let m = |v: &[PutsRun], f: fn(&PutsRun) -> f64| median(v.iter().map(f).collect());
    println!("\n| | puts/s | puts per CPU-second | p99 latency |");
    println!("|---|---|---|---|");
    for (name, v) in [("without batch", &without), ("with batch", &with)] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.1} ms |",
            m(v, |r| r.puts_per_sec),
            m(v, |r| r.puts_per_cpu_sec),
            m(v, |r| r.p99_us) / 1000.0
        );
    }
    println!(
        "| ratio (with / without) | {:.2}x | {:.2}x | {:.2}x |",
        m(&with, |r| r.puts_per_sec) / m(&without, |r| r.puts_per_sec),
        m(&with, |r| r.puts_per_cpu_sec) / m(&without, |r| r.puts_per_cpu_sec),
        m(&with, |r| r.p99_us) / m(&without, |r| r.p99_us)
    );
}

// ----- tenants --------------------------------------------------------------

const LIGHT_RATE: f64 = 200.0; // ops/s offered by the light tenant
const HEAVY_LIMIT: f64 = 500.0; // ops/s the heavy tenant may do
const KEYS: u32 = 10_000;

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Async,
    Blocking,
}

/// One get as each API does it: async (admission as a future, the read on
/// the blocking pool) or blocking (admission and read on the worker).
async fn get(api: Api, adb: &AsyncDb, ctx_name: RequestContext, key: Vec<u8>) -> std::io::Result<()> {
    match api {
        Api::Async => adb.get(key).await.map(drop),
        Api::Blocking => {
            let ctx = Context::new(RequestType::Get, key.len() as u64).in_context(ctx_name);
            adb.stage().enforce(&ctx)?;
            adb.db().ok_or_else(|| std::io::Error::other("closed"))?.get(&key).map(drop).map_err(std::io::Error::other)
        }
    }
}

/// The light tenant's p99 (µs, from each request's scheduled time) over a
/// run, with or without a heavy tenant offering 10x its limit.
fn tenants_run(api: Api, flood: bool, args: &Args) -> f64 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut opts = options();
    opts.set_max_background_jobs(1);
    let db = Arc::new(StagedDb::open(opts, dir.path().join("db")).expect("the DB opens"));
    let (light, heavy) = (
        RequestContext::register("bench_light").expect("a context"),
        RequestContext::register("bench_heavy").expect("a context"),
    );
    apply(
        db.stage(),
        &format!(
            "version = 1\n{}{}",
            channel("bench_light", "\"get\"", "{ kind = \"drl\", rate = \"1000ops/s\" }"),
            channel("bench_heavy", "\"get\"", &format!("{{ kind = \"drl\", rate = \"{HEAVY_LIMIT}ops/s\" }}"))
        ),
    );
    for i in 0..KEYS {
        db.put(i.to_be_bytes(), [1u8; 100]).expect("a load put");
    }
    let adb = AsyncDb::new(Arc::clone(&db));
    let rt = runtime(2);
    let seconds = args.seconds;
    let stop = Arc::new(AtomicBool::new(false));
    // Bounds the run: one second after the light tenant's last request was
    // due, the flood's limit is lifted, which releases every flood request
    // (a blocked worker too). A light request stuck behind the flood until
    // then is charged its wait up to that moment and a little more: the
    // blocking API's p99 is a lower bound of the stall.
    let release = {
        let (stage, stop) = (Arc::clone(db.stage()), Arc::clone(&stop));
        std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs_f64(seconds + 1.0);
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
            }
            stop.store(true, Ordering::Relaxed);
            let _ = stage.configure("bench_heavy", "o", ObjectChange::rate(kv_stage::units::Rate::UNLIMITED));
        })
    };
    let p99 = rt.block_on(async {
        let start = tokio::time::Instant::now() + Duration::from_millis(20);
        if flood {
            let (adb, stop) = (adb.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let interval = Duration::from_secs_f64(1.0 / (10.0 * HEAVY_LIMIT));
                let mut next = start;
                let mut i = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep_until(next).await;
                    let now = tokio::time::Instant::now();
                    while next <= now {
                        let (adb, stop) = (adb.clone(), Arc::clone(&stop));
                        let key = (i % KEYS).to_be_bytes().to_vec();
                        tokio::spawn(kv_async::scope(heavy, async move {
                            // Errors only when the run's runtime shuts down under it.
                            if !stop.load(Ordering::Relaxed) {
                                let _ = get(api, &adb, heavy, key).await;
                            }
                        }));
                        next += interval;
                        i += 1;
                    }
                }
            });
        }
        let interval = Duration::from_secs_f64(1.0 / LIGHT_RATE);
        let n = (seconds * LIGHT_RATE) as u32;
        let mut handles = Vec::with_capacity(n as usize);
        let mut next = start;
        for i in 0..n {
            tokio::time::sleep_until(next).await;
            let scheduled = next;
            let adb = adb.clone();
            let key = (i * 7 % KEYS).to_be_bytes().to_vec();
            handles.push(tokio::spawn(kv_async::scope(light, async move {
                get(api, &adb, light, key).await.expect("a light get");
                scheduled.elapsed()
            })));
            next += interval;
        }
        let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("a histogram");
        for t in handles {
            h.saturating_record(t.await.expect("a light task").as_micros() as u64);
        }
        stop.store(true, Ordering::Relaxed);
        h.value_at_quantile(0.99) as f64
    });
    stop.store(true, Ordering::Relaxed);
    release.join().expect("the release thread");
    rt.shutdown_timeout(Duration::from_secs(10));
    p99
}

fn tenants(args: &Args) {
    println!(
        "\n## Light tenant ({LIGHT_RATE} gets/s) p99, alone and next to a tenant offering 10x its {HEAVY_LIMIT} ops/s limit, 2 workers ({} s runs)\n",
        args.seconds
    );
    let mut results: Vec<(Api, bool, Vec<f64>)> = vec![
        (Api::Async, false, vec![]),
        (Api::Async, true, vec![]),
        (Api::Blocking, false, vec![]),
        (Api::Blocking, true, vec![]),
    ];
    for r in 0..args.runs {
        for (api, flood, v) in results.iter_mut() {
            let p99 = tenants_run(*api, *flood, args);
            println!(
                "run {r} {:8} {:12}: light p99 {:>9.0} us",
                if *api == Api::Async { "async" } else { "blocking" },
                if *flood { "with flood" } else { "alone" },
                p99
            );
            v.push(p99);
        }
    }
    let m: Vec<f64> = results.iter().map(|(_, _, v)| median(v.clone())).collect();
    println!("\n| API | light p99 alone | light p99 with the flood | ratio |");
    println!("|---|---|---|---|");
    println!("| async (`AsyncDb`) | {:.2} ms | {:.2} ms | {:.2}x |", m[0] / 1e3, m[1] / 1e3, m[1] / m[0]);
    println!(
        "| blocking (`enforce` on the worker) | {:.2} ms | at least {:.2} ms (the flood is released 1 s after the run) | {:.0}x |",
        m[2] / 1e3,
        m[3] / 1e3,
        m[3] / m[2]
    );
}

// ----- enforce ----------------------------------------------------------------

fn enforce(args: &Args) {
    const N: u32 = 2_000_000;
    println!("\n## enforce vs enforce_async on an unthrottled channel (an unlimited DRL), {N} requests per run\n");
    let stage = Stage::new("bench");
    apply(
        &stage,
        "version = 1\n[[rules]]\nop = \"create_object\"\nchannel = \"default\"\nobject = \"o\"\nspec = { kind = \"drl\", rate = \"unlimited\" }\n",
    );
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
    let ctx = Context::new(RequestType::Put, 100);
    let (mut blocking, mut asynchronous) = (Vec::new(), Vec::new());
    for r in 0..args.runs {
        let t0 = Instant::now();
        for _ in 0..N {
            std::hint::black_box(stage.enforce(std::hint::black_box(&ctx)).expect("admitted"));
        }
        let b = t0.elapsed().as_nanos() as f64 / f64::from(N);
        let t0 = Instant::now();
        rt.block_on(async {
            for _ in 0..N {
                std::hint::black_box(stage.enforce_async(*std::hint::black_box(&ctx)).await.expect("admitted"));
            }
        });
        let a = t0.elapsed().as_nanos() as f64 / f64::from(N);
        println!("run {r}: enforce {b:.1} ns/op, enforce_async {a:.1} ns/op");
        blocking.push(b);
        asynchronous.push(a);
    }
    let (b, a) = (median(blocking), median(asynchronous));
    println!("\n| | ns/op |\n|---|---|\n| enforce | {b:.1} |\n| enforce_async | {a:.1} |\n| ratio | {:.2}x |", a / b);
}

fn main() {
    let args = Args::parse();
    let all = args.part == "all";
    if !["all", "puts", "tenants", "enforce"].contains(&args.part.as_str()) {
        eprintln!("--part: '{}' is not one of puts, tenants, enforce, all", args.part);
        std::process::exit(2);
    }
    if all || args.part == "enforce" {
        enforce(&args);
    }
    if all || args.part == "puts" {
        puts(&args);
    }
    if all || args.part == "tenants" {
        tenants(&args);
    }
}
