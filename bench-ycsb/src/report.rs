//! Reports: YCSB-style summaries, the comparison table, `summary.json`, the
//! per-second time series (CSV) and SVG plots.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kernel::Charged;
use crate::profile::Profile;
use crate::runner::{OpStats, RunResult, histogram};
use crate::systems::SeenBytes;

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Samples.
    pub operations: u64,
    /// Mean.
    pub mean_us: f64,
    /// Minimum.
    pub min_us: u64,
    /// Maximum.
    pub max_us: u64,
    /// Median.
    pub p50_us: u64,
    /// 95th percentile.
    pub p95_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
}

impl Latency {
    /// From a histogram.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            operations: h.len(),
            mean_us: h.mean(),
            min_us: h.min(),
            max_us: h.max(),
            p50_us: h.value_at_quantile(0.5),
            p95_us: h.value_at_quantile(0.95),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
        }
    }
}

/// One operation type of a system.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpReport {
    /// From the scheduled time.
    pub intended: Latency,
    /// From issue.
    pub service: Latency,
    /// Failed operations.
    pub errors: u64,
}

impl OpReport {
    fn of(s: &OpStats) -> Self {
        OpReport { intended: Latency::of(&s.intended), service: Latency::of(&s.service), errors: s.errors }
    }
}

/// One second of a system's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SecondReport {
    /// Second since the start.
    pub t: usize,
    /// Operations completed in this second.
    pub throughput_ops: u64,
    /// Median latency, from the scheduled time, of the operations scheduled
    /// in this second.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
}

/// Latency over every second of one phase of the load profile (low, peak,
/// valley), from the scheduled time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    /// Phase name (`low`, `peak`, `valley`; `constant`; a schedule step's rate).
    pub phase: String,
    /// How many separate times the phase occurred.
    pub occurrences: usize,
    /// Seconds of schedule in the phase.
    pub seconds: usize,
    /// Operations scheduled in the phase.
    pub operations: u64,
    /// Median, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
}

/// One window of the schedule (10 s by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    /// First second.
    pub from_s: usize,
    /// One past the last second.
    pub to_s: usize,
    /// Completions per second in the window.
    pub throughput_ops: f64,
    /// 99th percentile of the operations scheduled in the window, µs.
    pub p99_us: u64,
}

/// Written and read bytes as the kernel charged them to the run's cgroup
/// against what the system saw, on a kernel-throttled device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ByteCheck {
    /// What the kernel charged (over the measured run).
    pub charged: Charged,
    /// What the system saw over the same time.
    pub seen: SeenBytes,
    /// `charged.write_bytes / seen.write_bytes`.
    pub write_ratio: f64,
    /// `charged.read_bytes / seen.read_bytes`.
    pub read_ratio: f64,
    /// The kernel saw less than [`ByteCheck::MIN_WRITE_RATIO`] of the
    /// written bytes: the page cache hid part of the writes from the
    /// throttle, so the device was less loaded than it looks.
    pub low: bool,
}

impl ByteCheck {
    /// Below this share of written bytes charged, a run is flagged.
    pub const MIN_WRITE_RATIO: f64 = 0.9;

    /// Compares `charged` with `seen`.
    pub fn new(charged: Charged, seen: SeenBytes) -> ByteCheck {
        let ratio = |a: u64, b: u64| if b == 0 { f64::NAN } else { a as f64 / b as f64 };
        let write_ratio = ratio(charged.write_bytes, seen.write_bytes);
        ByteCheck {
            charged,
            read_ratio: ratio(charged.read_bytes, seen.read_bytes),
            low: write_ratio < Self::MIN_WRITE_RATIO,
            write_ratio,
            seen,
        }
    }
}

/// What one system did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SystemReport {
    /// System name.
    pub name: String,
    /// Repeat number (from 1).
    pub repeat: usize,
    /// Wall time until the last completion, ms.
    pub runtime_ms: u64,
    /// Completed operations per second of wall time.
    pub throughput_ops: f64,
    /// Completed operations.
    pub operations: u64,
    /// Median latency over all operations, from the scheduled time, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Latency over all operations.
    pub overall: OpReport,
    /// Per operation type (YCSB labels).
    pub per_op: BTreeMap<String, OpReport>,
    /// Per second.
    pub seconds: Vec<SecondReport>,
    /// Requests never issued (past the drain limit).
    pub dropped: u64,
    /// Time RocksDB stalled writes (`rocksdb.stall.micros`), µs.
    pub stall_us: u64,
    /// The longest a write waited in a stall (`rocksdb.db.write.stall`'s
    /// maximum), µs.
    #[serde(default)]
    pub longest_stall_us: u64,
    /// Writes that waited in a stall.
    #[serde(default)]
    pub stalled_writes: u64,
    /// Latency per phase of the load profile.
    #[serde(default)]
    pub phases: Vec<PhaseReport>,
    /// Latency per 10 s window.
    #[serde(default)]
    pub windows: Vec<WindowReport>,
    /// Warm start: how long the DB took to settle before the clock started, ms.
    #[serde(default)]
    pub settle_ms: Option<u64>,
    /// Kernel device: charged against seen bytes.
    #[serde(default)]
    pub byte_check: Option<ByteCheck>,
    /// Time requests waited for the emulated device, µs.
    pub device_wait_us: u64,
    /// Bytes per request context the stage counted.
    pub context_bytes: BTreeMap<String, u64>,
    /// Controller cycles run (paio-silk).
    pub controller_cycles: u64,
    /// Compactions during the run per level pair (systems on the stage).
    #[serde(default)]
    pub compaction_levels: Vec<LevelReport>,
    /// Bytes per request context the stage counted while the clock ran
    /// (systems on the stage; between the attribution sampler's first and
    /// last readings, so the attribution's classes sum to it).
    #[serde(default)]
    pub run_context_bytes: BTreeMap<String, u64>,
    /// What the slowest 1% of requests met (see [`crate::attribution`]).
    #[serde(default)]
    pub attribution: Option<crate::attribution::Attribution>,
    /// The work left when the clock stopped, and the time to drain it.
    #[serde(default)]
    pub debt: Option<crate::debt::Debt>,
}

/// The compactions of one level pair during a run: RocksDB's job statistics
/// next to the bytes rocks-env tagged with the pair's context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelReport {
    /// The context: `bg_compaction_L0_L0`, `bg_compaction_L1_L2`, ...
    pub context: String,
    /// Jobs completed.
    pub jobs: u64,
    /// Output bytes RocksDB reported for those jobs.
    pub rocksdb_written: u64,
    /// Input bytes RocksDB reported for those jobs.
    pub rocksdb_read: u64,
    /// Bytes written with the pair's context (output files and the jobs'
    /// MANIFEST edits), including jobs still running at the end.
    pub tagged_written: u64,
    /// Bytes read with the pair's context.
    pub tagged_read: u64,
}

impl LevelReport {
    /// What happened between two snapshots of a DB's per-pair statistics
    /// (pairs with no activity in between are left out).
    pub fn between(start: &[rocks_env::CompactionLevelStats], end: &[rocks_env::CompactionLevelStats]) -> Vec<Self> {
        end.iter()
            .filter_map(|e| {
                let s = start.iter().find(|s| s.context == e.context);
                let before = |f: &dyn Fn(&rocks_env::CompactionLevelStats) -> u64| s.map_or(0, f);
                let r = LevelReport {
                    context: e.context.name().to_owned(),
                    jobs: e.jobs.counts.completed.saturating_sub(before(&|s| s.jobs.counts.completed)),
                    rocksdb_written: e.jobs.bytes_written.saturating_sub(before(&|s| s.jobs.bytes_written)),
                    rocksdb_read: e.jobs.bytes_read.saturating_sub(before(&|s| s.jobs.bytes_read)),
                    tagged_written: e.written.bytes.saturating_sub(before(&|s| s.written.bytes)),
                    tagged_read: e.read.bytes.saturating_sub(before(&|s| s.read.bytes)),
                };
                (r.jobs > 0 || r.tagged_written > 0 || r.tagged_read > 0).then_some(r)
            })
            .collect()
    }

    /// The short name of the pair (`L1_L2`).
    pub fn pair(&self) -> &str {
        self.context.strip_prefix("bg_compaction_").unwrap_or(&self.context)
    }
}

impl SystemReport {
    /// From a run that followed `profile`.
    pub fn new(name: &str, repeat: usize, r: &RunResult, profile: &Profile) -> Self {
        let overall = OpReport::of(&r.overall);
        let secs = r.elapsed.as_secs_f64().max(1e-9);
        SystemReport {
            name: name.to_owned(),
            repeat,
            runtime_ms: r.elapsed.as_millis() as u64,
            throughput_ops: r.ops as f64 / secs,
            operations: r.ops,
            p50_us: overall.intended.p50_us,
            p99_us: overall.intended.p99_us,
            p999_us: overall.intended.p999_us,
            overall,
            per_op: r.per_op.iter().map(|(op, s)| (op.label().to_owned(), OpReport::of(s))).collect(),
            seconds: r
                .seconds
                .iter()
                .enumerate()
                // Past the schedule, only seconds in which late requests completed.
                .take_while(|(t, s)| (*t as f64) < r.schedule_s || s.ops > 0)
                .map(|(t, s)| {
                    let l = Latency::of(&s.intended);
                    SecondReport { t, throughput_ops: s.ops, p50_us: l.p50_us, p99_us: l.p99_us, p999_us: l.p999_us }
                })
                .collect(),
            phases: phases(r, profile),
            windows: windows(r, WINDOW_S),
            dropped: r.dropped,
            stall_us: 0,
            longest_stall_us: 0,
            stalled_writes: 0,
            settle_ms: None,
            byte_check: None,
            device_wait_us: 0,
            context_bytes: BTreeMap::new(),
            controller_cycles: 0,
            compaction_levels: Vec::new(),
            run_context_bytes: BTreeMap::new(),
            attribution: None,
            debt: None,
        }
    }

    /// The p99 of one phase (`peak`, ...), if the profile has it.
    pub fn phase_p99(&self, phase: &str) -> Option<u64> {
        self.phases.iter().find(|p| p.phase == phase).map(|p| p.p99_us)
    }

    /// YCSB's text summary.
    pub fn ycsb_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "[OVERALL], RunTime(ms), {}", self.runtime_ms);
        let _ = writeln!(s, "[OVERALL], Throughput(ops/sec), {:.1}", self.throughput_ops);
        // Not a YCSB line: requests the schedule had but the system could
        // not take in time (their latencies are in the Intended-* lines).
        let _ = writeln!(s, "[OVERALL], Dropped, {}", self.dropped);
        for (label, r) in &self.per_op {
            for (prefix, l) in [(label.clone(), &r.service), (format!("Intended-{label}"), &r.intended)] {
                let _ = writeln!(s, "[{prefix}], Operations, {}", l.operations);
                let _ = writeln!(s, "[{prefix}], AverageLatency(us), {:.1}", l.mean_us);
                let _ = writeln!(s, "[{prefix}], MinLatency(us), {}", l.min_us);
                let _ = writeln!(s, "[{prefix}], MaxLatency(us), {}", l.max_us);
                let _ = writeln!(s, "[{prefix}], 95thPercentileLatency(us), {}", l.p95_us);
                let _ = writeln!(s, "[{prefix}], 99thPercentileLatency(us), {}", l.p99_us);
                let _ = writeln!(s, "[{prefix}], 99.9thPercentileLatency(us), {}", l.p999_us);
            }
            let _ = writeln!(s, "[{label}], Return=OK, {}", r.service.operations - r.errors.min(r.service.operations));
            if r.errors > 0 {
                let _ = writeln!(s, "[{label}], Return=ERROR, {}", r.errors);
            }
        }
        s
    }
}

/// Seconds per window in [`SystemReport::windows`].
pub const WINDOW_S: usize = 10;

/// Seconds of schedule (latencies are filed by scheduled second).
fn schedule_seconds(r: &RunResult) -> usize {
    (r.schedule_s.ceil() as usize).min(r.seconds.len())
}

fn phases(r: &RunResult, profile: &Profile) -> Vec<PhaseReport> {
    let mut acc: Vec<(String, usize, usize, Histogram<u64>)> = Vec::new();
    let mut last: Option<String> = None;
    for (t, sec) in r.seconds.iter().take(schedule_seconds(r)).enumerate() {
        let phase = profile.phase_at(t as f64 + 0.5);
        let i = match acc.iter().position(|a| a.0 == phase) {
            Some(i) => i,
            None => {
                acc.push((phase.clone(), 0, 0, histogram()));
                acc.len() - 1
            }
        };
        if last.as_deref() != Some(phase.as_str()) {
            acc[i].1 += 1;
        }
        acc[i].2 += 1;
        let _ = acc[i].3.add(&sec.intended);
        last = Some(phase);
    }
    acc.into_iter()
        .map(|(phase, occurrences, seconds, h)| {
            let l = Latency::of(&h);
            PhaseReport {
                phase,
                occurrences,
                seconds,
                operations: l.operations,
                p50_us: l.p50_us,
                p99_us: l.p99_us,
                p999_us: l.p999_us,
            }
        })
        .collect()
}

fn windows(r: &RunResult, len: usize) -> Vec<WindowReport> {
    let n = schedule_seconds(r);
    (0..n)
        .step_by(len)
        .map(|from| {
            let to = (from + len).min(n);
            let mut h = histogram();
            for s in &r.seconds[from..to] {
                let _ = h.add(&s.intended);
            }
            let ops: u64 = r.seconds[from..to].iter().map(|s| s.ops).sum();
            WindowReport {
                from_s: from,
                to_s: to,
                throughput_ops: ops as f64 / (to - from) as f64,
                p99_us: Latency::of(&h).p99_us,
            }
        })
        .collect()
}

/// A whole benchmark: how it was run and what each system did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    /// Workload name.
    pub workload: String,
    /// The workload's properties.
    pub workload_properties: serde_json::Value,
    /// The load profile.
    pub profile: String,
    /// Client threads.
    pub threads: usize,
    /// Schedule length, s.
    pub duration_s: f64,
    /// Seed.
    pub seed: u64,
    /// The device, described.
    pub device: String,
    /// `cold` (the clock starts right after the load's checkpoint is
    /// opened) or `warm` (after RocksDB reports no pending compaction).
    #[serde(default = "cold")]
    pub start: String,
    /// The machine the run was on.
    #[serde(default)]
    pub machine: String,
    /// Where the figures come from: the commit, the date and the command.
    #[serde(default)]
    pub provenance: Provenance,
    /// `KVS_B`.
    pub kvs_bandwidth: String,
    /// RocksDB options and system settings.
    pub config: serde_json::Value,
    /// Systems, in run order.
    pub systems: Vec<SystemReport>,
}

/// What a results file is stamped with, so a figure quoted anywhere can be
/// traced to the code and the command that measured it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// `git rev-parse HEAD` of the working tree the binary ran in, with
    /// `-dirty` when it had uncommitted changes to tracked files;
    /// `unknown` outside a git checkout.
    pub commit: String,
    /// When the run started, UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub date: String,
    /// The command line, as given.
    pub command: String,
}

impl Provenance {
    /// The stamp of a run starting now, in the current directory.
    pub fn now() -> Self {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        };
        let commit = match git(&["rev-parse", "HEAD"]) {
            Some(c) if !c.is_empty() => {
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
                if dirty { format!("{c}-dirty") } else { c }
            }
            _ => "unknown".into(),
        };
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        Provenance { commit, date: utc_date(secs), command }
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (the proleptic Gregorian calendar,
/// from the days-to-civil conversion).
pub fn utc_date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The stamp as the first lines of a text report.
fn stamp(report: &BenchReport) -> String {
    let p = &report.provenance;
    format!(
        "# commit {}, {}\n# machine: {}\n# command: {}\n\n",
        if p.commit.is_empty() { "unknown" } else { &p.commit },
        if p.date.is_empty() { "date unknown" } else { &p.date },
        report.machine,
        p.command
    )
}

fn cold() -> String {
    "cold".into()
}

/// Median of the systems' repeats, per system name.
fn per_system(report: &BenchReport) -> Vec<(String, Vec<&SystemReport>)> {
    let mut order: Vec<String> = Vec::new();
    for s in &report.systems {
        if !order.contains(&s.name) {
            order.push(s.name.clone());
        }
    }
    order.into_iter().map(|n| (n.clone(), report.systems.iter().filter(|s| s.name == n).collect())).collect()
}

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
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
fn range(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::NAN, f64::NAN), |(lo, hi), x| (lo.min(x), hi.max(x)))
}

/// Milliseconds from µs, with more digits for small values.
fn ms(us: f64) -> String {
    let v = us / 1e3;
    if v.is_nan() {
        "-".into()
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

/// `median [min-max]` in ms.
fn ms_spread(median: f64, (lo, hi): (f64, f64), repeats: usize) -> String {
    if repeats > 1 { format!("{} [{}-{}]", ms(median), ms(lo), ms(hi)) } else { ms(median) }
}

fn num(v: f64, prec: usize) -> String {
    if v.is_nan() { "-".into() } else { format!("{v:.prec$}") }
}

/// The comparison table (medians over repeats; ratios to `rocksdb`). A
/// kernel-device run whose written bytes the kernel saw less than 90% of
/// is marked `LOW` in the `kernel w` column.
pub fn table(report: &BenchReport) -> String {
    let meds = medians(report);
    let groups = per_system(report);
    let base = meds.iter().find(|g| g.name == "rocksdb");
    let kernel = meds.iter().any(|m| !m.write_charged.is_nan());
    let ops: Vec<String> = {
        let mut v: Vec<String> = report.systems.iter().flat_map(|s| s.per_op.keys().cloned()).collect();
        v.sort();
        v.dedup();
        v
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "{:<18} {:>9} {:>7} {:>9} {:>9} {:>10} {:>8} {:>10}",
        "system", "ops/s", "x base", "p50 µs", "p99 µs", "p99.9 µs", "p99 x", "peak p99"
    );
    for op in &ops {
        let _ = write!(s, " {:>12}", format!("{} p99", op.to_lowercase()));
    }
    let _ = write!(s, " {:>8} {:>10} {:>8}", "stall s", "max stall", "dropped");
    if kernel {
        let _ = write!(s, " {:>9}", "kernel w");
    }
    let spread = meds.iter().any(|m| m.repeats > 1);
    if spread {
        let _ = write!(s, "  {:<24}", "p99 ms [min-max]");
    }
    s.push('\n');
    for (m, (_, rs)) in meds.iter().zip(&groups) {
        let _ = write!(
            s,
            "{:<18} {:>9.0} {:>7} {:>9.0} {:>9.0} {:>10.0} {:>8} {:>10}",
            m.name,
            m.throughput_ops,
            base.map_or("-".into(), |b| format!("{:.3}", m.throughput_ops / b.throughput_ops)),
            m.p50_us,
            m.p99_us,
            m.p999_us,
            base.map_or("-".into(), |b| format!("{:.3}", m.p99_us / b.p99_us)),
            num(m.peak_p99_us, 0),
        );
        for op in &ops {
            let v =
                median(rs.iter().map(|r| r.per_op.get(op).map_or(f64::NAN, |o| o.intended.p99_us as f64)).collect());
            let _ = write!(s, " {:>12.0}", v);
        }
        let _ = write!(s, " {:>8.1} {:>8.0}ms {:>8.0}", m.stall_s, m.longest_stall_ms, m.dropped);
        if kernel {
            let flag = if m.low_charge { " LOW" } else { "" };
            let _ = write!(s, " {:>9}", format!("{}%{flag}", num(m.write_charged * 100.0, 0)));
        }
        if spread {
            let _ = write!(s, "  {:<24}", ms_spread(m.p99_us, m.p99_range_us, m.repeats));
        }
        s.push('\n');
    }
    s.push_str(&levels_table(report));
    s.push_str(&debt_table(report));
    let attributed: Vec<(String, usize, &crate::attribution::Attribution)> =
        report.systems.iter().filter_map(|r| Some((r.name.clone(), r.repeat, r.attribution.as_ref()?))).collect();
    if !attributed.is_empty() {
        s.push('\n');
        s.push_str(&crate::attribution::table(&attributed));
    }
    s
}

/// The work each system left when the clock stopped (medians over
/// repeats), the time RocksDB took to finish it, and `DEBT` where a
/// repeat's debt was above 1.25x plain RocksDB's in the same repeat.
pub fn debt_table(report: &BenchReport) -> String {
    if report.systems.iter().all(|r| r.debt.is_none()) {
        return String::new();
    }
    let mut s = String::from(
        "
end-of-run debt (median over repeats; drain: until RocksDB reports nothing pending)
",
    );
    let _ = writeln!(
        s,
        "{:<18} {:>12} {:>9} {:>10} {:>9} {:>10} {:>7}",
        "system", "pending MiB", "L0 files", "immutable", "drain s", "x rocksdb", "flag"
    );
    let plain_of =
        |r: usize| report.systems.iter().find(|x| x.name == "rocksdb" && x.repeat == r).and_then(|x| x.debt.clone());
    for (name, rs) in per_system(report) {
        let ds: Vec<&crate::debt::Debt> = rs.iter().filter_map(|r| r.debt.as_ref()).collect();
        if ds.is_empty() {
            continue;
        }
        let m = |f: &dyn Fn(&crate::debt::Debt) -> f64| median(ds.iter().map(|d| f(d)).collect());
        let ratio = median(
            rs.iter()
                .filter_map(|r| {
                    let (d, p) = (r.debt.as_ref()?, plain_of(r.repeat)?);
                    Some(d.score_bytes / p.score_bytes.max(d.memtable_bytes as f64))
                })
                .collect(),
        );
        let flagged = rs.iter().any(|r| match (&r.debt, plain_of(r.repeat)) {
            (Some(d), Some(p)) => d.flagged_against(&p),
            _ => false,
        });
        let drain = m(&|d| d.drain_ms.map_or(f64::NAN, |v| v as f64 / 1e3));
        let timed_out = ds.iter().any(|d| d.drain_ms.is_none() && d.drain_timeout_ms > 0);
        let _ = writeln!(
            s,
            "{:<18} {:>12.1} {:>9.0} {:>10.0} {:>9} {:>10} {:>7}",
            name,
            m(&|d| d.pending_compaction_bytes as f64 / 1048576.0),
            m(&|d| d.l0_files as f64),
            m(&|d| d.immutable_memtables as f64),
            if timed_out { format!(">{}", ds[0].drain_timeout_ms / 1000) } else { num(drain, 1) },
            num(ratio, 2),
            if flagged { "DEBT" } else { "" },
        );
    }
    s
}

/// Compaction MiB written per level pair during the run (median over
/// repeats), and the tagged bytes against what RocksDB reported for the
/// completed jobs. Empty when no system ran on the stage.
pub fn levels_table(report: &BenchReport) -> String {
    let mut pairs: Vec<(usize, String)> = Vec::new();
    for l in report.systems.iter().flat_map(|r| &r.compaction_levels) {
        if !pairs.iter().any(|(_, p)| *p == l.context) {
            let order = kv_stage::RequestContext::COMPACTION_PAIRS
                .iter()
                .position(|c| c.name() == l.context)
                .unwrap_or(usize::MAX);
            pairs.push((order, l.context.clone()));
        }
    }
    if pairs.is_empty() {
        return String::new();
    }
    pairs.sort();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let mut s = String::from("\ncompaction MiB written per level pair (tagged; median over repeats)\n");
    let _ = write!(s, "{:<18}", "system");
    for (_, p) in &pairs {
        let _ = write!(s, " {:>9}", p.strip_prefix("bg_compaction_").unwrap_or(p));
    }
    let _ = writeln!(s, " {:>12}", "vs RocksDB");
    for (name, rs) in per_system(report) {
        if rs.iter().all(|r| r.compaction_levels.is_empty()) {
            continue;
        }
        let _ = write!(s, "{name:<18}");
        for (_, p) in &pairs {
            let v = median(
                rs.iter()
                    .map(|r| {
                        r.compaction_levels.iter().find(|l| l.context == *p).map_or(0.0, |l| mib(l.tagged_written))
                    })
                    .collect(),
            );
            let _ = write!(s, " {v:>9.1}");
        }
        let ratio = median(
            rs.iter()
                .map(|r| {
                    let t: u64 = r.compaction_levels.iter().map(|l| l.tagged_written).sum();
                    let k: u64 = r.compaction_levels.iter().map(|l| l.rocksdb_written).sum();
                    if k == 0 { f64::NAN } else { t as f64 / k as f64 }
                })
                .collect(),
        );
        let _ = writeln!(s, " {:>12}", format!("{}%", num(ratio * 100.0, 1)));
    }
    s
}

/// The per-second time series as CSV.
pub fn timeseries_csv(report: &BenchReport) -> String {
    let mut s = String::from("system,repeat,second,throughput_ops,p50_us,p99_us,p999_us\n");
    for r in &report.systems {
        for sec in &r.seconds {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{}",
                r.name, r.repeat, sec.t, sec.throughput_ops, sec.p50_us, sec.p99_us, sec.p999_us
            );
        }
    }
    s
}

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// An SVG line plot of one per-second metric for every system (first
/// repeat of each). `log` plots the y axis on a log scale.
pub fn svg_plot(
    report: &BenchReport,
    title: &str,
    y_label: &str,
    log: bool,
    value: &dyn Fn(&SecondReport) -> f64,
) -> String {
    let (w, h, ml, mr, mt, mb) = (960.0, 420.0, 80.0, 190.0, 40.0, 50.0);
    let series: Vec<(String, Vec<(f64, f64)>)> = per_system(report)
        .into_iter()
        .filter_map(|(name, rs)| {
            let r = rs.first()?;
            let pts = r.seconds.iter().map(|s| (s.t as f64, value(s))).filter(|p| p.1.is_finite()).collect();
            Some((name, pts))
        })
        .collect();
    let x_max = series.iter().flat_map(|s| s.1.iter().map(|p| p.0)).fold(1.0, f64::max);
    let y_max_raw = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).fold(0.0, f64::max);
    let tr = |v: f64| if log { v.max(1.0).log10() } else { v };
    let y_max = if log { tr(y_max_raw).ceil().max(1.0) } else { (y_max_raw * 1.1).max(1.0) };
    let y_min = 0.0;
    let px = |x: f64| ml + (x / x_max) * (w - ml - mr);
    let py = |y: f64| mt + (1.0 - (tr(y) - y_min) / (y_max - y_min)) * (h - mt - mb);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        (w - mr + ml) / 2.0,
        escape(title)
    );
    // Axes and grid.
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#, h - mb, w - mr, h - mb);
    let _ = writeln!(s, r#"<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{}" stroke="black"/>"#, h - mb);
    let ticks: Vec<f64> = if log {
        (0..=y_max as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| y_max * i as f64 / 5.0).collect()
    };
    for t in ticks {
        let y = py(t);
        let _ = writeln!(s, r##"<line x1="{ml}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/>"##, w - mr);
        let label = if t >= 10_000.0 { format!("{:.0}k", t / 1000.0) } else { format!("{t:.0}") };
        let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{label}</text>"#, ml - 6.0, y + 4.0);
    }
    // Round steps (10 s, 20 s, ...), about ten ticks.
    let x_step = [1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0]
        .into_iter()
        .find(|&st| st >= x_max / 10.0)
        .unwrap_or((x_max / 10.0).ceil());
    let mut x = 0.0;
    while x <= x_max {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{}" text-anchor="middle">{x:.0}</text>"#, px(x), h - mb + 18.0);
        x += x_step;
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">time (s)</text>"#, (w - mr + ml) / 2.0, h - 10.0);
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        (h - mb + mt) / 2.0,
        (h - mb + mt) / 2.0,
        escape(y_label)
    );
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let _ =
            writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{}"/>"#, path.join(" "));
        let ly = mt + 10.0 + i as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            w - mr + 15.0,
            w - mr + 40.0
        );
        let _ = writeln!(s, r#"<text x="{}" y="{}">{}</text>"#, w - mr + 46.0, ly + 4.0, escape(name));
    }
    s.push_str("</svg>\n");
    s
}

/// Writes every output file into `dir`.
pub fn write_all(report: &BenchReport, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(Error::io(format!("writing {}", dir.join(name).display())))
    };
    write("summary.json", &serde_json::to_string_pretty(report).expect("report serializes"))?;
    write("timeseries.csv", &timeseries_csv(report))?;
    write("table.txt", &format!("{}{}", stamp(report), table(report)))?;
    for r in &report.systems {
        write(&format!("ycsb-{}-{}.txt", r.name, r.repeat), &r.ycsb_text())?;
    }
    write(
        "throughput.svg",
        &svg_plot(report, &format!("{}: completions per second", report.workload), "ops/s", false, &|s| {
            s.throughput_ops as f64
        }),
    )?;
    write(
        "p99.svg",
        &svg_plot(
            report,
            &format!("{}: p99 latency per second (from scheduled time)", report.workload),
            "µs (log)",
            true,
            // Latencies are filed by scheduled second; a second with none
            // (e.g. one past the schedule holding only late completions)
            // has no point. Recorded latencies are at least 1 µs.
            &|s| {
                if s.p99_us == 0 { f64::NAN } else { s.p99_us as f64 }
            },
        ),
    )?;
    Ok(())
}

/// Reads `summary.json` from a result directory.
pub fn read(dir: &Path) -> Result<BenchReport> {
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{}: {e}", path.display())))
}

/// `figures.md`: every workload's table and plots side by side, with the
/// device, options and machine. `done` holds each result directory (under
/// `root`) with its report.
pub fn figures_md(
    done: &[(std::path::PathBuf, BenchReport)],
    root: &Path,
    command: &str,
    elapsed: std::time::Duration,
) -> String {
    let mut s = String::new();
    let Some((_, first)) = done.first() else { return s };
    let meds: Vec<Vec<Medians>> = done.iter().map(|(_, r)| medians(r)).collect();
    let _ = writeln!(s, "# YCSB: the paper's workloads, side by side\n");
    let _ = writeln!(s, "- Command: `{command}` ({:.0} min so far)", elapsed.as_secs_f64() / 60.0);
    let _ = writeln!(s, "- Device: {}", first.device);
    let _ = writeln!(
        s,
        "- Load: {}; {} client threads; {:.0} s schedule per run",
        first.profile, first.threads, first.duration_s
    );
    let _ = writeln!(s, "- Machine: {}", first.machine);
    let _ = writeln!(s, "- Commit: {} (first run started {})", first.provenance.commit, first.provenance.date);
    let _ = writeln!(s, "- Settings and RocksDB options: {}", first.config);
    let _ = writeln!(
        s,
        "- Latency is measured from each request's scheduled time (open loop). Figures are medians over each system's repeats, with the lowest and highest repeat in brackets; plots show the first repeat.\n"
    );
    // One overview: p99 and throughput against plain RocksDB, per workload and start.
    let _ = writeln!(s, "## Overview: p99 (and throughput) as a ratio to plain `rocksdb`\n");
    let mut header = String::from("| system |");
    let mut rule = String::from("|---|");
    for (_, r) in done {
        let _ = write!(header, " {} {} |", r.workload, r.start);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{header}\n{rule}");
    let names: Vec<String> = {
        let mut v = Vec::new();
        for m in meds.iter().flatten() {
            if !v.contains(&m.name) {
                v.push(m.name.clone());
            }
        }
        v
    };
    for name in &names {
        let _ = write!(s, "| {name} |");
        for ms in &meds {
            let base = ms.iter().find(|m| m.name == "rocksdb");
            let cell = match (ms.iter().find(|m| &m.name == name), base) {
                (Some(m), Some(b)) => format!(
                    "{:.3}x p99 ({} ms), {:.3}x ops/s",
                    m.p99_us / b.p99_us,
                    ms_spread(m.p99_us, m.p99_range_us, m.repeats),
                    m.throughput_ops / b.throughput_ops
                ),
                (Some(m), None) => format!("{} ms p99", ms_spread(m.p99_us, m.p99_range_us, m.repeats)),
                _ => "-".into(),
            };
            let _ = write!(s, " {cell} |");
        }
        s.push('\n');
    }
    for (dir, r) in done {
        let rel = dir.strip_prefix(root).unwrap_or(dir).display().to_string();
        let _ = writeln!(s, "\n## {} ({} start)\n", r.workload, r.start);
        let _ = writeln!(s, "```\n{}```\n", table(r));
        let _ = writeln!(s, "p99 per phase of the load, µs (medians over repeats):\n");
        let phases: Vec<String> = {
            let mut v: Vec<String> = Vec::new();
            for sys in &r.systems {
                for p in &sys.phases {
                    if !v.contains(&p.phase) {
                        v.push(p.phase.clone());
                    }
                }
            }
            v
        };
        let _ = writeln!(s, "| system | {} |", phases.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(phases.len()));
        for (name, rs) in per_system(r) {
            let cells: Vec<String> = phases
                .iter()
                .map(|ph| num(median(rs.iter().filter_map(|x| x.phase_p99(ph)).map(|v| v as f64).collect()), 0))
                .collect();
            let _ = writeln!(s, "| {name} | {} |", cells.join(" | "));
        }
        let _ = writeln!(s, "\n![throughput]({rel}/throughput.svg)\n![p99]({rel}/p99.svg)");
    }
    s
}
