//! The summary over repeats: per system, the median of each figure and
//! the lowest and highest repeat.

use serde::Serialize;

use super::{BenchReport, SystemReport};

/// Median of the systems' repeats, per system name.
pub(crate) fn per_system(report: &BenchReport) -> Vec<(String, Vec<&SystemReport>)> {
    let mut order: Vec<String> = Vec::new();
    for s in &report.systems {
        if !order.contains(&s.name) {
            order.push(s.name.clone());
        }
    }
    order.into_iter().map(|n| (n.clone(), report.systems.iter().filter(|s| s.name == n).collect())).collect()
}

/// The median of `v` (NaN when empty).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One system's medians over its repeats.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Medians {
    /// System name.
    pub name: String,
    /// Repeats.
    pub repeats: usize,
    /// Completions per second.
    pub throughput_ops: f64,
    /// p50, µs.
    pub p50_us: f64,
    /// p99, µs.
    pub p99_us: f64,
    /// The lowest and highest p99 over the repeats, µs.
    pub p99_range_us: (f64, f64),
    /// p99.9, µs.
    pub p999_us: f64,
    /// The lowest and highest p99.9 over the repeats, µs.
    pub p999_range_us: (f64, f64),
    /// p99 over the peaks, µs (NaN when the profile has none).
    pub peak_p99_us: f64,
    /// Total write stall, s.
    pub stall_s: f64,
    /// Longest single write stall, ms.
    pub longest_stall_ms: f64,
    /// Dropped requests.
    pub dropped: f64,
    /// Kernel-charged share of written bytes (NaN without a kernel device).
    pub write_charged: f64,
    /// Some repeat's byte check was low.
    pub low_charge: bool,
}

/// Medians per system, in run order.
pub fn medians(report: &BenchReport) -> Vec<Medians> {
    per_system(report)
        .into_iter()
        .map(|(name, rs)| {
            let m = |f: &dyn Fn(&SystemReport) -> f64| median(rs.iter().map(|r| f(r)).collect());
            Medians {
                repeats: rs.len(),
                throughput_ops: m(&|r| r.throughput_ops),
                p50_us: m(&|r| r.p50_us as f64),
                p99_us: m(&|r| r.p99_us as f64),
                p99_range_us: range(rs.iter().map(|r| r.p99_us as f64)),
                p999_us: m(&|r| r.p999_us as f64),
                p999_range_us: range(rs.iter().map(|r| r.p999_us as f64)),
                peak_p99_us: m(&|r| r.phase_p99("peak").map_or(f64::NAN, |v| v as f64)),
                stall_s: m(&|r| r.stall_us as f64 / 1e6),
                longest_stall_ms: m(&|r| r.longest_stall_us as f64 / 1e3),
                dropped: m(&|r| r.dropped as f64),
                write_charged: m(&|r| r.byte_check.as_ref().map_or(f64::NAN, |c| c.write_ratio)),
                low_charge: rs.iter().any(|r| r.byte_check.as_ref().is_some_and(|c| c.low)),
                name,
            }
        })
        .collect()
}

/// The lowest and the highest of `v` (NaN when empty).
pub(crate) fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::NAN, f64::NAN), |(lo, hi), x| (lo.min(x), hi.max(x)))
}
