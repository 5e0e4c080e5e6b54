//! Micro-benchmarks of the enforce path: context creation, channel selection,
//! object selection, Noop enforce, and the whole path (through a Noop, an
//! unlimited DRL, and a DRL with a finite rate that never makes a request
//! wait), for 0 B, 1 KiB, 4 KiB and 128 KiB requests. Run with `cargo bench -p kv-stage`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kv_stage::{
    Context, DrlSpec, Match, ObjectSpec, RequestContext, RequestType, Rule, Stage,
    object::{EnforcementObject, Noop},
    units::Rate,
};

const SIZES: [u64; 4] = [0, 1024, 4096, 128 * 1024];

/// The layout rocks-env installs: a foreground Noop, a flush DRL, and a
/// compaction channel with one DRL for L0->L1 and one for LN.
fn rocksdb_like_stage() -> Stage {
    let stage = Stage::new("bench");
    let drl = || ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject { channel: "fg".into(), object: "noop".into(), spec: ObjectSpec::Noop, matches: None },
            Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
            Rule::CreateObject { channel: "flush".into(), object: "drl".into(), spec: drl(), matches: None },
            Rule::CreateChannel {
                channel: "compaction".into(),
                matches: Some(Match::contexts([RequestContext::BG_COMPACTION_L0_L1, RequestContext::BG_COMPACTION_LN])),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "l0".into(),
                spec: drl(),
                matches: Some(Match::context(RequestContext::BG_COMPACTION_L0_L1)),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "ln".into(),
                spec: drl(),
                matches: Some(Match::context(RequestContext::BG_COMPACTION_LN)),
            },
        ])
        .expect("bench layout");
    stage
}

fn benches(c: &mut Criterion) {
    let stage = rocksdb_like_stage();
    let ctx = Context::new(RequestType::Write, 4096);

    c.bench_function("context_creation", |b| b.iter(|| Context::new(black_box(RequestType::Write), black_box(4096))));
    c.bench_function("channel_selection", |b| b.iter(|| kv_stage::__bench::select_channel(&stage, black_box(&ctx))));
    c.bench_function("object_selection", |b| b.iter(|| kv_stage::__bench::select_object(&stage, black_box(&ctx))));
    c.bench_function("noop_enforce", |b| b.iter(|| Noop.enforce(black_box(&ctx))));

    let mut g = c.benchmark_group("whole_path");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size.max(1)));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let ctx = Context::new(RequestType::Write, black_box(size));
                stage.enforce(&ctx).expect("noop admits")
            })
        });
    }
    g.finish();

    // A DRL with a finite rate far above what one thread asks: every
    // request takes the bucket's lock and reserves its tokens, and none
    // waits (10 PB/s; 128 KiB requests at 20 ns each would be 6.5 PB/s).
    let finite = Stage::new("finite");
    finite
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::from_bytes_per_sec(1e16).expect("rate"))),
                matches: None,
            },
        ])
        .expect("finite layout");
    let mut g = c.benchmark_group("whole_path_finite_drl");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size.max(1)));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let ctx = Context::new(RequestType::Write, black_box(size));
                finite.enforce(&ctx).expect("a finite DRL admits")
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("whole_path_unlimited_drl");
    for size in SIZES {
        g.throughput(Throughput::Bytes(size.max(1)));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let ctx = Context::new(RequestType::Write, black_box(size)).in_context(RequestContext::BG_FLUSH);
                stage.enforce(&ctx).expect("unlimited admits")
            })
        });
    }
    g.finish();
}

criterion_group!(enforce, benches);
criterion_main!(enforce);
