//! What metrics cost: one scrape of a stage with 100 channels (each with a
//! limited DRL that has seen traffic), and the enforce path with and without
//! a scraper reading the stage, alternated in one run (idle, scraped every
//! second, idle, scraped every second, then scraped every 10 ms as a
//! stress case). Run with `cargo bench -p kv-stage --bench metrics`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use kv_stage::metrics::{StageMetrics, encode_text};
use kv_stage::{Context, DrlSpec, Match, ObjectSpec, RequestContext, RequestType, Rule, Stage, units::Rate};
use prometheus_client::registry::Registry;

/// `n` channels, one per application context, each with a DRL far above
/// what the bench asks (no request waits), every one of them used once.
fn stage_with_channels(n: usize) -> Arc<Stage> {
    let stage = Arc::new(Stage::new("bench"));
    let mut rules = Vec::new();
    let mut contexts = Vec::new();
    for i in 0..n {
        let ctx = RequestContext::register(&format!("tenant_{i}")).expect("context");
        contexts.push(ctx);
        rules.push(Rule::CreateChannel { channel: format!("ch{i}"), matches: Some(Match::context(ctx)) });
        rules.push(Rule::CreateObject {
            channel: format!("ch{i}"),
            object: "drl".into(),
            spec: ObjectSpec::Drl(DrlSpec::new(Rate::from_bytes_per_sec(1e16).expect("rate"))),
            matches: None,
        });
    }
    stage.apply_rules(rules).expect("layout");
    for ctx in contexts {
        stage.enforce(&Context::new(RequestType::Write, 4096).in_context(ctx)).expect("admitted");
    }
    stage
}

fn registry_of(stage: &Arc<Stage>) -> Registry {
    let m = StageMetrics::new();
    m.add(stage);
    let mut r = Registry::default();
    r.register_collector(Box::new(m));
    r
}

/// Scrapes `registry` every `every` until dropped.
struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Scraper {
    fn start(registry: Arc<Registry>, every: Duration) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !s.load(Ordering::Relaxed) {
                black_box(encode_text(&registry));
                n += 1;
                let mut slept = Duration::ZERO;
                while slept < every && !s.load(Ordering::Relaxed) {
                    let step = every.min(Duration::from_millis(10));
                    std::thread::sleep(step);
                    slept += step;
                }
            }
            n
        });
        Scraper { stop, thread: Some(thread) }
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn benches(c: &mut Criterion) {
    let stage = stage_with_channels(100);
    let registry = Arc::new(registry_of(&stage));
    let text = encode_text(&registry);
    eprintln!("a scrape of 100 channels: {} bytes, {} lines", text.len(), text.lines().count());
    c.bench_function("scrape_100_channels", |b| b.iter(|| black_box(encode_text(&registry))));

    // The enforce path of one channel's DRL, alternated: nobody scraping,
    // then a scraper thread reading the whole stage every second.
    let ctx = Context::new(RequestType::Write, 4096).in_context(RequestContext::lookup("tenant_7").expect("ctx"));
    let mut g = c.benchmark_group("enforce_4KiB_drl");
    g.measurement_time(Duration::from_secs(4));
    for round in 1..=2 {
        g.bench_function(format!("not_scraped_{round}"), |b| b.iter(|| stage.enforce(black_box(&ctx)).expect("ok")));
        let scraper = Scraper::start(Arc::clone(&registry), Duration::from_secs(1));
        g.bench_function(format!("scraped_every_1s_{round}"), |b| {
            b.iter(|| stage.enforce(black_box(&ctx)).expect("ok"))
        });
        drop(scraper);
    }
    let scraper = Scraper::start(Arc::clone(&registry), Duration::from_millis(10));
    g.bench_function("scraped_every_10ms", |b| b.iter(|| stage.enforce(black_box(&ctx)).expect("ok")));
    drop(scraper);
    g.finish();
}

criterion_group!(metrics, benches);
criterion_main!(metrics);
