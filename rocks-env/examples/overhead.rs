//! Overhead of the stage: plain RocksDB versus RocksDB through rocks-env
//! with a pass-through stage (the RocksDB layout, every rate unlimited), on
//! db_bench-style fillrandom, overwrite and readrandom with 1 KB values.
//!
//! ```text
//! cargo run --release -p rocks-env --example overhead -- --ops 300000 --chunk 10000
//! ```
//!
//! Both DBs are open in the same process, with the same options, in their
//! own directories (memtables large enough that the write phases never flush,
//! no automatic compaction). Each phase runs in chunks that alternate between the two
//! systems (plain, staged, staged, plain, ...), so drift on this shared
//! machine and the background work of either DB hit both alike. Reported per
//! phase and system: the median chunk throughput and the p99 latency over
//! all its operations; and the median of the paired chunk throughput ratios
//! (staged / plain) and the ratio of p99s. Before readrandom both DBs are
//! flushed and fully compacted, so reads go to table files (through the
//! wrapper for the staged DB). One client thread, as db_bench's default.
//!
//! `--direct` reads table files with direct I/O (and flushes and compacts
//! with it), and `--block-cache-mib` sets the block cache, so that
//! readrandom's gets reach the disk as they do in bench-ycsb's kernel-device
//! runs (`--direct --block-cache-mib 8`): the phase then measures what the
//! wrapper adds to a get that reads a block from the disk.

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use hdrhistogram::Histogram;
use kv_stage::Stage;
use rocks_env::{RocksLayout, StagedDb};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Throughput and p99 of plain RocksDB vs RocksDB through a pass-through stage")]
struct Args {
    /// Operations per phase and system.
    #[arg(long, default_value_t = 300_000)]
    ops: u64,
    /// Operations per chunk (systems alternate between chunks).
    #[arg(long, default_value_t = 10_000)]
    chunk: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 1000)]
    value_size: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Direct I/O for reads, flush and compaction (the temporary
    /// directories must be on a disk, not tmpfs).
    #[arg(long)]
    direct: bool,
    /// Block cache size in MiB (default: RocksDB's).
    #[arg(long)]
    block_cache_mib: Option<usize>,
    /// Run only one system (for profilers such as callgrind): plain or staged.
    #[arg(long)]
    only: Option<String>,
}

const PHASES: [&str; 3] = ["fillrandom", "overwrite", "readrandom"];

/// Memtables large enough that the write phases never flush, and no
/// automatic compaction: the write phases measure the client path (WAL
/// appends through the wrapper, memtable inserts) without background work
/// of either DB landing in the other's chunks. Both DBs are flushed and
/// compacted before readrandom, which then reads table files.
fn options(a: &Args) -> rocksdb::Options {
    let mut o = rocksdb::Options::default();
    o.set_use_direct_reads(a.direct);
    o.set_use_direct_io_for_flush_and_compaction(a.direct);
    if let Some(mib) = a.block_cache_mib {
        let mut t = rocksdb::BlockBasedOptions::default();
        t.set_block_cache(&rocksdb::Cache::new_lru_cache(mib << 20));
        o.set_block_based_table_factory(&t);
    }
    o.create_if_missing(true);
    o.set_write_buffer_size(1 << 30);
    o.set_max_write_buffer_number(4);
    o.set_disable_auto_compactions(true);
    o.set_max_background_jobs(2);
    o
}

/// SplitMix64: a cheap deterministic key sequence.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

struct PhaseResult {
    chunk_ops_per_sec: [Vec<f64>; 2],
    histogram: [Histogram<u64>; 2],
}

fn main() {
    let a = Args::parse();
    let chunk = a.chunk.clamp(1, a.ops);
    let chunks = a.ops / chunk;
    let dirs = [tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir")];
    let plain = rocksdb::DB::open(&options(&a), dirs[0].path()).expect("open plain");
    let stage = Arc::new(Stage::new("overhead"));
    RocksLayout::new().install(&stage).expect("layout");
    let staged = StagedDb::builder(options(&a)).stage(Arc::clone(&stage)).open(dirs[1].path()).expect("open staged");
    let dbs: [&rocksdb::DB; 2] = [&plain, &staged];

    let value = vec![b'v'; a.value_size];
    let keyspace = a.ops;
    let key = |i: u64| format!("{:016}", mix(i) % keyspace).into_bytes();
    let mut results = Vec::new();
    for (p, phase) in PHASES.iter().enumerate() {
        if *phase == "readrandom" {
            for db in dbs {
                db.flush().expect("flush");
                db.compact_range::<&[u8], &[u8]>(None, None);
            }
        }
        let mut r = PhaseResult {
            chunk_ops_per_sec: [Vec::new(), Vec::new()],
            histogram: std::array::from_fn(|_| {
                Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("histogram")
            }),
        };
        for c in 0..chunks {
            // plain, staged, staged, plain, plain, staged, ...
            let order = if c % 2 == 0 { [0, 1] } else { [1, 0] };
            for s in order {
                if a.only.as_deref().is_some_and(|o| o != ["plain", "staged"][s]) {
                    continue;
                }
                let db = dbs[s];
                let t0 = Instant::now();
                for j in 0..chunk {
                    let i = c * chunk + j;
                    let k = match *phase {
                        // Each system gets the same key sequence.
                        "fillrandom" => key(i),
                        "overwrite" => key(mix(i ^ 0xA5A5) % keyspace),
                        _ => key(mix(i ^ 0x5A5A) % keyspace),
                    };
                    let t = Instant::now();
                    if p == 2 {
                        std::hint::black_box(db.get(&k).expect("get"));
                    } else {
                        db.put(&k, &value).expect("put");
                    }
                    r.histogram[s].saturating_record(t.elapsed().as_nanos().max(1) as u64);
                }
                r.chunk_ops_per_sec[s].push(chunk as f64 / t0.elapsed().as_secs_f64());
            }
        }
        results.push(r);
    }

    let rows: Vec<_> = PHASES
        .iter()
        .zip(&results)
        .map(|(phase, r)| {
            let pairs: Vec<f64> =
                r.chunk_ops_per_sec[1].iter().zip(&r.chunk_ops_per_sec[0]).map(|(s, p)| s / p).collect();
            let p99 = |s: usize| r.histogram[s].value_at_quantile(0.99) as f64 / 1000.0;
            let p50 = |s: usize| r.histogram[s].value_at_quantile(0.5) as f64 / 1000.0;
            json!({
                "phase": phase,
                "plain_ops_per_sec": median(r.chunk_ops_per_sec[0].clone()),
                "staged_ops_per_sec": median(r.chunk_ops_per_sec[1].clone()),
                "throughput_ratio": median(pairs),
                "plain_p50_us": p50(0),
                "staged_p50_us": p50(1),
                "plain_p99_us": p99(0),
                "staged_p99_us": p99(1),
                "p99_ratio": p99(1) / p99(0),
            })
        })
        .collect();
    if a.json {
        println!(
            "{}",
            json!({ "ops": a.ops, "chunk": chunk, "value_size": a.value_size, "direct": a.direct,
                    "block_cache_mib": a.block_cache_mib, "phases": rows })
        );
        return;
    }
    println!(
        "{:<11} {:>14} {:>14} {:>7}   {:>9} {:>9}   {:>9} {:>9} {:>7}",
        "phase", "rocksdb ops/s", "staged ops/s", "ratio", "p50 µs", "p50 µs", "p99 µs", "p99 µs", "ratio"
    );
    for r in &rows {
        println!(
            "{:<11} {:>14.0} {:>14.0} {:>7.3}   {:>9.2} {:>9.2}   {:>9.2} {:>9.2} {:>7.3}",
            r["phase"].as_str().unwrap_or(""),
            r["plain_ops_per_sec"].as_f64().unwrap_or(0.0),
            r["staged_ops_per_sec"].as_f64().unwrap_or(0.0),
            r["throughput_ratio"].as_f64().unwrap_or(0.0),
            r["plain_p50_us"].as_f64().unwrap_or(0.0),
            r["staged_p50_us"].as_f64().unwrap_or(0.0),
            r["plain_p99_us"].as_f64().unwrap_or(0.0),
            r["staged_p99_us"].as_f64().unwrap_or(0.0),
            r["p99_ratio"].as_f64().unwrap_or(0.0),
        );
    }
    println!(
        "({} ops per phase and system in chunks of {}, {} B values, one client thread; throughput: median chunk, ratio: median of paired chunks)",
        a.ops, chunk, a.value_size
    );
}
