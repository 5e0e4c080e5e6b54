//! How skewed YCSB's request distributions are: draws keys from the zipfian
//! and scrambled-zipfian generators and prints the ten most requested keys
//! with their observed and expected shares, and the share of requests the
//! hottest 1% of keys receive.
//!
//! `cargo run --release -p bench-ycsb --example key_popularity -- [ITEMS] [SAMPLES]`
//! (defaults: 400000 items, the default `recordcount`, and 2000000 samples).

use std::collections::HashMap;

use bench_ycsb::generator::{Rng, ScrambledZipfian, Zipfian};

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<u64>());
    let items = match args.next() {
        Some(Ok(n)) if n > 0 => n,
        None => 400_000,
        _ => return eprintln!("ITEMS must be a positive integer"),
    };
    let samples = match args.next() {
        Some(Ok(n)) if n > 0 => n,
        None => 2_000_000,
        _ => return eprintln!("SAMPLES must be a positive integer"),
    };
    let mut rng = Rng::new(1);

    let zipf = Zipfian::new(0, items - 1);
    let mut counts = vec![0u64; items as usize];
    for _ in 0..samples {
        counts[zipf.next(&mut rng) as usize] += 1;
    }
    println!("zipfian over {items} items, {samples} samples");
    println!("{:>6} {:>10} {:>10} {:>10}", "rank", "key", "observed", "expected");
    for k in 0..10u64.min(items) {
        let observed = counts[k as usize] as f64 / samples as f64;
        println!("{:>6} {:>10} {:>9.3}% {:>9.3}%", k, k, observed * 100.0, zipf.probability(k, items) * 100.0);
    }
    println!("hottest 1% of keys: {:.1}% of requests\n", hot_share(&counts, samples) * 100.0);

    let scrambled = ScrambledZipfian::new(0, items - 1);
    let mut hits: HashMap<u64, u64> = HashMap::new();
    for _ in 0..samples {
        *hits.entry(scrambled.next(&mut rng)).or_insert(0) += 1;
    }
    println!("scrambled zipfian (YCSB's `zipfian` request distribution): hot keys hashed (FNV-1a) away from 0");
    println!("{:>6} {:>10} {:>10} {:>10}", "rank", "key", "observed", "expected");
    for r in 0..10u64.min(items) {
        let key = scrambled.item_of_rank(r);
        let observed = hits.get(&key).copied().unwrap_or(0) as f64 / samples as f64;
        println!("{:>6} {:>10} {:>9.3}% {:>9.3}%", r, key, observed * 100.0, scrambled.rank_probability(r) * 100.0);
    }
    let mut dense = vec![0u64; items as usize];
    for (k, c) in hits {
        dense[k as usize] = c;
    }
    println!("hottest 1% of keys: {:.1}% of requests", hot_share(&dense, samples) * 100.0);
}

/// Share of all samples that went to the most requested 1% of keys.
fn hot_share(counts: &[u64], samples: u64) -> f64 {
    let mut sorted = counts.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let top = (counts.len() / 100).max(1);
    sorted[..top].iter().sum::<u64>() as f64 / samples as f64
}
