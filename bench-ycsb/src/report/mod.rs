//! Reports: the model of a run's results (`BenchReport` and what it is
//! made of, as `summary.json` holds it), the summary over repeats
//! (`summary`: medians and spreads per system) and the rendering
//! (`render`: the comparison table, YCSB-style text, the per-second CSV,
//! SVG plots, `figures.md`, and writing and reading a result directory).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::kernel::Charged;
use crate::profile::Profile;
use crate::runner::{OpStats, RunResult, histogram};
use crate::systems::SeenBytes;

mod render;
mod summary;

pub use render::{debt_table, figures_md, levels_table, read, svg_plot, table, timeseries_csv, write_all};
pub use summary::{Medians, medians};
pub(crate) use summary::{median, per_system, range};
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
    /// Kernel device: how long the disk took to be quiet before the run
    /// (writeback and discards of what came before it), ms.
    #[serde(default)]
    pub quiesce_ms: Option<u64>,
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
    /// What the disk gave a probe outside the system while the clock ran
    /// (see [`crate::disk_probe`]); `None` with the probe off.
    #[serde(default)]
    pub disk_probe: Option<crate::disk_probe::ProbeStats>,
    /// The load generator's own error: how late the clients issued the
    /// requests they had slept for (see [`crate::runner`]).
    #[serde(default)]
    pub issue_lateness: Option<IssueLateness>,
}

/// How late the clients issued the requests they slept for: part of every
/// such request's latency that no system caused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssueLateness {
    /// The client threads' timer slack, ns, as the kernel reported it.
    pub timer_slack_ns: Option<u64>,
    /// Requests a client slept for.
    pub requests: u64,
    /// Median lateness, µs.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Largest, µs.
    pub max_us: u64,
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
            quiesce_ms: None,
            byte_check: None,
            device_wait_us: 0,
            context_bytes: BTreeMap::new(),
            controller_cycles: 0,
            compaction_levels: Vec::new(),
            run_context_bytes: BTreeMap::new(),
            attribution: None,
            debt: None,
            disk_probe: None,
            issue_lateness: (!r.issue_late.is_empty()).then(|| IssueLateness {
                timer_slack_ns: r.timer_slack_ns,
                requests: r.issue_late.len(),
                p50_us: r.issue_late.value_at_quantile(0.5),
                p99_us: r.issue_late.value_at_quantile(0.99),
                max_us: r.issue_late.max(),
            }),
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

fn cold() -> String {
    "cold".into()
}
