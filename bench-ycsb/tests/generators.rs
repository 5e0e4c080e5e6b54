//! The generators against YCSB's expected distributions.

use bench_ycsb::generator::{
    Hotspot, Rng, SCRAMBLED_ITEM_COUNT, SCRAMBLED_ZETAN, ScrambledZipfian, ZIPFIAN_CONSTANT, Zipfian, zeta_from,
};

const SAMPLES: usize = 10_000_000;

/// Relative error.
fn rel(observed: f64, expected: f64) -> f64 {
    (observed - expected).abs() / expected
}

#[test]
fn constants_are_ycsbs() {
    assert_eq!(ZIPFIAN_CONSTANT, 0.99);
    assert_eq!(SCRAMBLED_ITEM_COUNT, 10_000_000_000);
    assert_eq!(SCRAMBLED_ZETAN, 26.46902820178302);
    // The precomputed zeta is consistent with the series: zeta(10^6) plus an
    // integral bound of the tail stays within 0.1% of it.
    let head = zeta_from(0, 1_000_000, 0.99, 0.0);
    let tail = ((1e10f64).powf(0.01) - (1e6f64).powf(0.01)) / 0.01;
    assert!(rel(head + tail, SCRAMBLED_ZETAN) < 1e-3, "{}", head + tail);
}

#[test]
fn zipfian_top_ten_frequencies_match_ycsb() {
    let n = 100_000u64;
    let z = Zipfian::new(0, n - 1);
    let mut rng = Rng::new(1);
    let mut counts = [0u64; 10];
    for _ in 0..SAMPLES {
        let k = z.next(&mut rng);
        if k < 10 {
            counts[k as usize] += 1;
        }
    }
    let zeta = zeta_from(0, n, 0.99, 0.0);
    for (k, &c) in counts.iter().enumerate() {
        let observed = c as f64 / SAMPLES as f64;
        let expected = z.probability(k as u64, n);
        let ideal = 1.0 / ((k + 1) as f64).powf(0.99) / zeta;
        eprintln!("zipfian rank {k}: observed {observed:.5} expected {expected:.5} (ideal zipf {ideal:.5})");
        assert!(rel(observed, expected) < 0.02, "rank {k}: {observed} vs {expected}");
    }
}

#[test]
fn scrambled_zipfian_top_ten_keys_match_ycsb() {
    let n = 100_000u64;
    let z = ScrambledZipfian::new(0, n - 1);
    let mut rng = Rng::new(2);
    let mut counts = std::collections::HashMap::new();
    for _ in 0..SAMPLES {
        *counts.entry(z.next(&mut rng)).or_insert(0u64) += 1;
    }
    for r in 0..10 {
        let key = z.item_of_rank(r);
        let observed = counts.get(&key).copied().unwrap_or(0) as f64 / SAMPLES as f64;
        let expected = z.rank_probability(r);
        eprintln!("scrambled rank {r} -> key {key}: observed {observed:.5} expected {expected:.5}");
        assert!(rel(observed, expected) < 0.02, "rank {r}: {observed} vs {expected}");
    }
    // The ten most frequent keys are the ten top ranks.
    let mut top: Vec<(u64, u64)> = counts.into_iter().collect();
    top.sort_by_key(|e| std::cmp::Reverse(e.1));
    let ranks: std::collections::HashSet<u64> = (0..10).map(|r| z.item_of_rank(r)).collect();
    assert!(top[..10].iter().all(|(k, _)| ranks.contains(k)));
}

#[test]
fn hotspot_sends_its_share_to_the_hot_set() {
    let h = Hotspot::new(0, 9_999, 0.2, 0.8);
    let mut rng = Rng::new(3);
    let hot = (0..1_000_000).filter(|_| h.next(&mut rng) < 2_000).count();
    assert!((hot as f64 / 1e6 - 0.8).abs() < 0.005, "{hot}");
}
