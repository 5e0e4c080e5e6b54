//! YCSB's key and value generators, with YCSB's algorithms and constants:
//! zipfian (Gray et al., constant 0.99), scrambled zipfian (over 10^10 items
//! with YCSB's precomputed zeta, FNV-1a 64-bit hashing), skewed latest,
//! hotspot, uniform; `user<number>` keys, hashed or ordered.
//!
//! The random source is xoshiro256** seeded with SplitMix64 (YCSB uses
//! Java's `Random`; the distributions, not the exact streams, are what is
//! reproduced).

/// The zipfian constant YCSB uses.
pub const ZIPFIAN_CONSTANT: f64 = 0.99;
/// Items the scrambled zipfian draws from before hashing (YCSB's
/// `ScrambledZipfianGenerator.ITEM_COUNT` of the release whose zeta it
/// precomputed).
pub const SCRAMBLED_ITEM_COUNT: u64 = 10_000_000_000;
/// YCSB's precomputed zeta(10^10, 0.99).
pub const SCRAMBLED_ZETAN: f64 = 26.46902820178302;

const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
const FNV_PRIME_64: u64 = 1_099_511_628_211;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 little-endian bytes of the
/// value, made non-negative as Java's `Math.abs` does.
pub fn fnv_hash64(val: u64) -> u64 {
    let mut v = val;
    let mut h = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        h ^= v & 0xff;
        h = h.wrapping_mul(FNV_PRIME_64);
        v >>= 8;
    }
    (h as i64).unsigned_abs()
}

/// A fast, seedable PRNG (xoshiro256**).
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Seeds the state with SplitMix64.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    /// 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)` with 53 bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` (`n > 0`), without modulo bias.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// `zeta(n, theta) = sum_{i=1..n} 1 / i^theta`, continued from `(st, sum)`.
pub fn zeta_from(st: u64, n: u64, theta: f64, initial: f64) -> f64 {
    let mut sum = initial;
    for i in st..n {
        sum += 1.0 / ((i + 1) as f64).powf(theta);
    }
    sum
}

/// YCSB's `ZipfianGenerator`: item `base` is the most popular, then
/// `base + 1`, and so on.
#[derive(Debug, Clone)]
pub struct Zipfian {
    items: u64,
    base: u64,
    theta: f64,
    zetan: f64,
    zeta2theta: f64,
    alpha: f64,
    eta: f64,
    count_for_zeta: u64,
}

impl Zipfian {
    /// Items `min..=max` with YCSB's constant.
    pub fn new(min: u64, max: u64) -> Self {
        let items = max - min + 1;
        Self::with_zetan(min, max, ZIPFIAN_CONSTANT, zeta_from(0, items, ZIPFIAN_CONSTANT, 0.0))
    }

    /// Items `min..=max`, with a precomputed zeta.
    pub fn with_zetan(min: u64, max: u64, theta: f64, zetan: f64) -> Self {
        let items = max - min + 1;
        let zeta2theta = zeta_from(0, 2, theta, 0.0);
        let eta = (1.0 - (2.0 / items as f64).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan);
        Zipfian { items, base: min, theta, zetan, zeta2theta, alpha: 1.0 / (1.0 - theta), eta, count_for_zeta: items }
    }

    /// Number of items.
    pub fn items(&self) -> u64 {
        self.items
    }

    /// The next item.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        self.sample(rng.next_f64(), self.items)
    }

    /// YCSB's mapping from a uniform `u` to an item, for `itemcount` items.
    #[inline]
    pub fn sample(&self, u: f64, itemcount: u64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return self.base;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return self.base + 1;
        }
        self.base + (itemcount as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
    }

    /// The next item out of `itemcount` (which may only grow; zeta is
    /// extended incrementally, as YCSB does).
    pub fn next_of(&mut self, rng: &mut Rng, itemcount: u64) -> u64 {
        if itemcount > self.count_for_zeta {
            self.zetan = zeta_from(self.count_for_zeta, itemcount, self.theta, self.zetan);
            self.count_for_zeta = itemcount;
            // YCSB keeps `items` (the constructor's count) in eta.
            self.eta = (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2theta / self.zetan);
        }
        self.sample(rng.next_f64(), itemcount)
    }

    /// Probability that [`sample`](Self::sample) returns `base + k` for
    /// `itemcount` items: the measure of the `u` that map to it.
    pub fn probability(&self, k: u64, itemcount: u64) -> f64 {
        let z = self.zetan;
        let t0 = 1.0 / z;
        let t1 = (1.0 + 0.5f64.powf(self.theta)) / z;
        match k {
            0 => t0.min(1.0),
            1 => (t1.min(1.0) - t0).max(0.0),
            _ => {
                // u maps to k when k <= n * g(u)^alpha < k + 1, with
                // g(u) = eta*u - eta + 1 increasing in u.
                let inv = |x: f64| {
                    let g = (x / itemcount as f64).powf(1.0 / self.alpha);
                    (g - 1.0 + self.eta) / self.eta
                };
                let lo = inv(k as f64).max(t1);
                let hi = inv((k + 1) as f64).min(1.0);
                (hi - lo).max(0.0)
            }
        }
    }
}

/// YCSB's `ScrambledZipfianGenerator`: zipfian popularity, with the popular
/// items scattered over `min..=max` by FNV hashing.
#[derive(Debug, Clone)]
pub struct ScrambledZipfian {
    min: u64,
    itemcount: u64,
    zipf: Zipfian,
}

impl ScrambledZipfian {
    /// Items `min..=max`.
    pub fn new(min: u64, max: u64) -> Self {
        ScrambledZipfian {
            min,
            itemcount: max - min + 1,
            zipf: Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN),
        }
    }

    /// The next item.
    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        self.min + fnv_hash64(self.zipf.next(rng)) % self.itemcount
    }

    /// The item that rank `r` of the underlying zipfian maps to.
    pub fn item_of_rank(&self, r: u64) -> u64 {
        self.min + fnv_hash64(r) % self.itemcount
    }

    /// Probability of rank `r` of the underlying zipfian.
    pub fn rank_probability(&self, r: u64) -> f64 {
        self.zipf.probability(r, self.zipf.items())
    }
}

/// YCSB's `HotspotIntegerGenerator`: a fraction of the operations go to a
/// fraction of the items (the lowest ones).
#[derive(Debug, Clone)]
pub struct Hotspot {
    lower: u64,
    hot: u64,
    cold: u64,
    hot_ops: f64,
}

impl Hotspot {
    /// Items `lower..=upper`; `hot_data` of them receive `hot_ops` of the
    /// operations.
    pub fn new(lower: u64, upper: u64, hot_data: f64, hot_ops: f64) -> Self {
        let interval = upper - lower + 1;
        let hot = ((interval as f64) * hot_data) as u64;
        Hotspot { lower, hot, cold: interval - hot, hot_ops }
    }

    /// The next item.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        if rng.next_f64() < self.hot_ops && self.hot > 0 {
            self.lower + rng.below(self.hot)
        } else if self.cold > 0 {
            self.lower + self.hot + rng.below(self.cold)
        } else {
            self.lower + rng.below(self.hot.max(1))
        }
    }
}

/// YCSB's `buildKeyName`: `user` followed by the key number (hashed unless
/// inserts are ordered), left-padded with zeros to `zeropadding` digits.
pub fn key_name(keynum: u64, zeropadding: usize, ordered: bool) -> String {
    let n = if ordered { keynum } else { fnv_hash64(keynum) };
    format!("user{n:0zeropadding$}")
}

/// Key numbers for inserts during a run, as YCSB's
/// `AcknowledgedCounterGenerator`: [`next`](Self::next) hands out the next
/// number to insert; [`acknowledged`](Self::acknowledged) is how many
/// numbers from the start are all acknowledged (written, or given up), so
/// readers never ask for a key whose insert has not returned yet.
#[derive(Debug)]
pub struct AcknowledgedCounter {
    next: std::sync::atomic::AtomicU64,
    acknowledged: std::sync::atomic::AtomicU64,
    /// Numbers acknowledged ahead of a gap.
    ahead: std::sync::Mutex<std::collections::BTreeSet<u64>>,
}

impl AcknowledgedCounter {
    /// Starts at `start` (the loaded records `0..start` count as
    /// acknowledged).
    pub fn new(start: u64) -> Self {
        AcknowledgedCounter {
            next: std::sync::atomic::AtomicU64::new(start),
            acknowledged: std::sync::atomic::AtomicU64::new(start),
            ahead: std::sync::Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    /// The next number to insert.
    pub fn next(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// `n`'s insert returned (successfully or not: as in YCSB, a failed
    /// insert does not hold every later one back).
    pub fn acknowledge(&self, n: u64) {
        let mut ahead = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        ahead.insert(n);
        let mut upto = self.acknowledged.load(std::sync::atomic::Ordering::Relaxed);
        while ahead.remove(&upto) {
            upto += 1;
        }
        self.acknowledged.store(upto, std::sync::atomic::Ordering::Release);
    }

    /// Numbers `0..acknowledged()` are all acknowledged.
    pub fn acknowledged(&self) -> u64 {
        self.acknowledged.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acknowledged_counter_waits_for_gaps() {
        let c = AcknowledgedCounter::new(10);
        let (a, b, d) = (c.next(), c.next(), c.next());
        assert_eq!((a, b, d), (10, 11, 12));
        c.acknowledge(12);
        c.acknowledge(11);
        assert_eq!(c.acknowledged(), 10, "10 is not acknowledged yet");
        c.acknowledge(10);
        assert_eq!(c.acknowledged(), 13);
    }

    const FNV0: u64 = 6_284_781_860_667_377_211;
    const FNV1: u64 = 8_517_097_267_634_966_620;
    const FNV12345: u64 = 1_792_800_413_050_876_852;

    #[test]
    fn fnv_matches_known_values() {
        // FNV-1a 64 of eight zero bytes, and YCSB's abs().
        let mut h = FNV_OFFSET_BASIS_64;
        for _ in 0..8 {
            h = h.wrapping_mul(FNV_PRIME_64);
        }
        assert_eq!(fnv_hash64(0), (h as i64).unsigned_abs());
        // Values computed independently (Python) from YCSB's definition.
        assert_eq!(fnv_hash64(0), FNV0);
        assert_eq!(fnv_hash64(1), FNV1);
        assert_eq!(fnv_hash64(12345), FNV12345);
        assert!(key_name(1, 1, true) == "user1" && key_name(7, 5, true) == "user00007");
        assert_eq!(key_name(3, 1, false), format!("user{}", fnv_hash64(3)));
    }

    #[test]
    fn zeta_matches_ycsb_precomputed_constant_for_small_n() {
        // zeta grows by 1/(n^0.99); YCSB's 10^10 constant is 26.469...
        assert!((zeta_from(0, 2, 0.99, 0.0) - (1.0 + 0.5f64.powf(0.99))).abs() < 1e-12);
        let z = Zipfian::with_zetan(0, SCRAMBLED_ITEM_COUNT, ZIPFIAN_CONSTANT, SCRAMBLED_ZETAN);
        // Rank 0 of the scrambled generator: 1 / zeta.
        assert!((z.probability(0, SCRAMBLED_ITEM_COUNT) - 1.0 / SCRAMBLED_ZETAN).abs() < 1e-12);
    }

    #[test]
    fn analytic_probabilities_sum_to_one() {
        let z = Zipfian::new(0, 999);
        let total: f64 = (0..1000).map(|k| z.probability(k, 1000)).sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
    }

    #[test]
    fn rng_is_uniform_enough() {
        let mut r = Rng::new(42);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_500..10_500).contains(&c)), "{counts:?}");
    }
}
