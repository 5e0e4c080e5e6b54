//! Why were the slowest requests slow? A sampler thread records, every
//! [`SAMPLE_EVERY`], what the background was doing (bytes the stage
//! admitted per class of context, the flush and compaction jobs running,
//! what the kernel charged to the run's cgroup, the block cache's misses
//! and hits of data blocks); at the end, each request slower than the
//! run's p99 is set against the samples around its wait.
//!
//! The report ([`Attribution`], `attribution` in `summary.json`) compares
//! the slowest 1% with all requests: how often a flush, an L0 or a deeper
//! compaction ran while they waited, the background bytes per second and
//! the mean background request size in their windows, how much of their
//! latency was spent waiting to be issued (behind an earlier slow request
//! of the same client) and waiting for a CPU, how many block cache lookups
//! missed; and the p99 of the quiet requests, around which no job ran
//! ([`QUIET_MARGIN`]), as an estimate of the floor. With the disk probe
//! on ([`crate::disk_probe`]), it also counts the requests whose wait
//! overlapped a disk stall (a probe read of [`crate::disk_probe::DISK_STALL`]
//! or more, outside the system and its throttle), and gives the slowest
//! probe read of each second. For plain RocksDB,
//! which has no stage, the jobs come from RocksDB's properties (flushes and
//! compactions, not per level) and the bytes from the kernel's counters
//! only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kv_stage::{Collection, RequestContext as C, Stage};
use rocksdb::DB;
use serde::{Deserialize, Serialize};

use crate::disk_probe::ProbeRead;
use crate::kernel::Cgroup;
use crate::runner::RequestRecord;

/// How often the sampler reads the counters.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// A request is *quiet* when no flush or compaction ran from this long
/// before it was due until it completed: the margin covers a request that
/// queued behind an earlier one which a job slowed down.
pub const QUIET_MARGIN: Duration = Duration::from_millis(50);

/// Classes of request context the attribution tells apart.
pub const CLASSES: [&str; 5] = ["foreground", "flush", "l0", "ln", "other"];

const FG: usize = 0;
const FLUSH: usize = 1;
const L0: usize = 2;
const LN: usize = 3;
const OTHER: usize = 4;

fn class_of(ctx: C) -> usize {
    if ctx == C::FOREGROUND {
        FG
    } else if ctx == C::BG_FLUSH {
        FLUSH
    } else if C::BG_COMPACTION_L0_L1.covers(ctx) {
        L0
    } else if C::BG_COMPACTION_LN.covers(ctx) || ctx == C::BG_COMPACTION {
        LN
    } else {
        // `background` (purges, the info log) and application contexts.
        OTHER
    }
}

/// One reading.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    /// µs since the clients started (negative readings are clamped to 0).
    t_us: u64,
    /// Bytes admitted per class, cumulative.
    bytes: [u64; 5],
    /// Requests admitted per class, cumulative.
    ops: [u64; 5],
    /// Jobs running: flush, L0, LN (plain RocksDB: flushes in `[0]`, all
    /// compactions in `[2]`).
    jobs: [u8; 3],
    /// What the kernel charged: read, write bytes, cumulative.
    charged: [u64; 2],
    /// The machine's CPU time from `/proc/stat`, in clock ticks, cumulative:
    /// busy (user, nice, system, irq, softirq), stolen by the hypervisor,
    /// and all (busy, idle, iowait, steal).
    cpu: [u64; 3],
    /// RocksDB's block cache lookups of data blocks: misses, hits,
    /// cumulative (its statistics; zero without them).
    cache: [u64; 2],
}

/// Adds to each of `acc` what its cumulative counter rose by from `then`
/// to `now`.
fn add_rise<const N: usize>(acc: &mut [f64; N], now: &[u64; N], then: &[u64; N]) {
    for ((a, n), t) in acc.iter_mut().zip(now).zip(then) {
        *a += n.saturating_sub(*t) as f64;
    }
}

/// Reads the `cpu` line of `/proc/stat`.
struct CpuClock(crate::runner::ProcFile<256>);

impl CpuClock {
    fn open() -> Self {
        CpuClock(crate::runner::ProcFile::open("/proc/stat"))
    }

    fn read(&mut self) -> [u64; 3] {
        // user nice system idle iowait irq softirq steal
        let mut f = [0u64; 8];
        self.0.numbers(1, &mut f);
        let busy = f[0] + f[1] + f[2] + f[5] + f[6];
        [busy, f[7], busy + f[3] + f[4] + f[7]]
    }
}

fn sample_stage(c: &Collection, s: &mut Sample) {
    for x in &c.contexts {
        let k = class_of(x.context);
        s.bytes[k] += x.counter.bytes;
        s.ops[k] += x.counter.ops;
    }
    let running = |ctx| c.jobs(ctx).counts.running.min(255) as u8;
    s.jobs = [running(C::BG_FLUSH), running(C::BG_COMPACTION_L0_L1), running(C::BG_COMPACTION_LN)];
}

fn sample_plain(db: &DB, s: &mut Sample) {
    let prop = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0).min(255) as u8;
    s.jobs = [prop("rocksdb.num-running-flushes"), 0, prop("rocksdb.num-running-compactions")];
}

/// The sampler's readings of one run.
#[derive(Debug, Default)]
pub struct Samples {
    samples: Vec<Sample>,
    /// Whether per-level jobs and per-class bytes were seen (a stage).
    staged: bool,
    /// The stage's counters at the first and the last reading.
    first: Option<Collection>,
    last: Option<Collection>,
}

/// Reads the block cache's data-block misses and hits from the options'
/// statistics (a sum over per-core counters, under a lock that only
/// readers of the statistics take, not RocksDB's I/O path).
fn sample_cache(options: &rocksdb::Options) -> [u64; 2] {
    use rocksdb::statistics::Ticker;
    [options.get_ticker_count(Ticker::BlockCacheDataMiss), options.get_ticker_count(Ticker::BlockCacheDataHit)]
}

/// Samples every [`SAMPLE_EVERY`] until `stop` is set. `clock` is the
/// instant the clients count from (set when they start; readings before it
/// are at time 0). `statistics`: the DB's options, if they enable RocksDB's
/// statistics, for the block cache's misses and hits.
pub fn sample(
    stage: Option<&Stage>,
    db: &DB,
    statistics: Option<&rocksdb::Options>,
    cgroup: Option<&Cgroup>,
    clock: &std::sync::OnceLock<Instant>,
    stop: &AtomicBool,
) -> Samples {
    let mut cpu = CpuClock::open();
    let mut out = Samples { samples: Vec::with_capacity(1 << 16), staged: stage.is_some(), first: None, last: None };
    loop {
        let stopping = stop.load(Ordering::Acquire);
        if let Some(start) = clock.get() {
            let mut s = Sample { t_us: start.elapsed().as_micros() as u64, ..Sample::default() };
            match stage {
                Some(st) => {
                    let c = st.collect();
                    sample_stage(&c, &mut s);
                    if out.first.is_none() {
                        out.first = Some(c);
                    } else if stopping {
                        out.last = Some(c);
                    }
                }
                None => sample_plain(db, &mut s),
            }
            if let Some(c) = cgroup.and_then(|c| c.charged().ok()) {
                s.charged = [c.read_bytes, c.write_bytes];
            }
            s.cpu = cpu.read();
            if let Some(o) = statistics {
                s.cache = sample_cache(o);
            }
            out.samples.push(s);
        }
        if stopping {
            return out;
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
}

/// What the background did around a set of requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Around {
    /// Requests in the set.
    pub requests: u64,
    /// Their mean latency, µs.
    pub mean_latency_us: f64,
    /// Share of their latency spent before being issued (the client was
    /// still busy with an earlier request).
    pub queued_share: f64,
    /// Share of their service time the client thread waited for a CPU.
    pub cpu_wait_share: f64,
    /// Share of the requests during whose wait a flush ran.
    pub with_flush: f64,
    /// ... an L0->L1 (or intra-L0) compaction ran (plain RocksDB: 0, its
    /// compactions are all in `with_ln`).
    pub with_l0: f64,
    /// ... a compaction from L1 or deeper ran (plain RocksDB: any
    /// compaction).
    pub with_ln: f64,
    /// ... no background job ran.
    pub with_none: f64,
    /// Mean background bytes per second per class (`CLASSES` order) over
    /// their windows (stage counts; zero for plain RocksDB).
    pub class_bps: [f64; 5],
    /// Mean request size per class in their windows, bytes.
    pub class_request_bytes: [f64; 5],
    /// What the kernel charged over their windows: read, write bytes/s.
    pub charged_bps: [f64; 2],
    /// Share of the machine's CPU time that was busy over their windows
    /// (`/proc/stat`, clock ticks: coarse for short windows).
    #[serde(default)]
    pub machine_cpu_busy: f64,
    /// Share of the machine's CPU time the hypervisor took (steal).
    #[serde(default)]
    pub steal: f64,
    /// RocksDB's block cache misses of data blocks per second over their
    /// windows (0 without statistics).
    #[serde(default)]
    pub cache_misses_per_s: f64,
    /// Share of the data-block lookups over their windows that missed the
    /// block cache (0 without lookups).
    #[serde(default)]
    pub cache_miss_share: f64,
    /// Share of the requests whose wait (from due to done) overlapped a
    /// disk stall: a read of the disk probe that took
    /// [`crate::disk_probe::DISK_STALL`] or more (0 with the probe off; see
    /// [`Attribution::disk_reads`]).
    #[serde(default)]
    pub with_disk_stall: f64,
}

/// One second of the run: the background next to the clients' p99 (in
/// `SecondReport`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SecondBackground {
    /// Second since the start.
    pub t: usize,
    /// Bytes admitted per class in this second (`CLASSES` order).
    pub class_bytes: [u64; 5],
    /// Most jobs running at once: flush, L0, LN.
    pub max_jobs: [u8; 3],
    /// What the kernel charged in this second: read, write bytes.
    pub charged: [u64; 2],
    /// Block cache lookups of data blocks in this second: misses, hits.
    #[serde(default)]
    pub cache: [u64; 2],
    /// The slowest read of the disk probe that ended in this second, µs (0
    /// with the probe off).
    #[serde(default)]
    pub disk_max_us: u32,
}

/// The attribution of one run (`summary.json`: `attribution`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    /// The classes of `class_bps` and `class_bytes`.
    pub classes: Vec<String>,
    /// Whether the figures come from a stage (per-level jobs, bytes per
    /// class) or only RocksDB's properties and the kernel.
    pub staged: bool,
    /// Readings taken.
    pub samples: u64,
    /// Requests at or above this latency are the slowest 1% (the run's p99), µs.
    pub threshold_us: u64,
    /// The slowest 1%.
    pub slowest: Around,
    /// Every request.
    pub all: Around,
    /// Bytes admitted per class over the run, from the first reading to the
    /// last (they sum to what the stage counted over that time).
    pub run_class_bytes: [u64; 5],
    /// Per second.
    pub seconds: Vec<SecondBackground>,
    /// Requests during which, and for [`QUIET_MARGIN`] before which, no
    /// flush or compaction ran.
    #[serde(default)]
    pub quiet_requests: u64,
    /// The p99 latency of the quiet requests, µs (0 without any): the
    /// clients' own tail with the background out of the way, an estimate of
    /// the floor a policy for background I/O works against (the quiet
    /// requests lean to the calmer parts of a run).
    #[serde(default)]
    pub quiet_p99_us: u64,
    /// Reads of the disk probe that ended while the clock ran, against
    /// which `with_disk_stall` and `disk_max_us` were set (0: the probe
    /// was off, and those say nothing).
    #[serde(default)]
    pub disk_reads: u64,
}

impl Samples {
    /// The index of the last reading at or before `t_us` (0 if none).
    fn at_or_before(&self, t_us: u64) -> usize {
        self.samples.partition_point(|s| s.t_us <= t_us).saturating_sub(1)
    }

    /// The index of the first reading at or after `t_us` (the last if none).
    fn at_or_after(&self, t_us: u64) -> usize {
        self.samples.partition_point(|s| s.t_us < t_us).min(self.samples.len().saturating_sub(1))
    }

    /// `stalls`: the disk stalls' spans (issued, ended), µs.
    fn around<'a>(&self, reqs: impl Iterator<Item = &'a RequestRecord>, stalls: &[(u64, u64)]) -> Around {
        let mut a = Around::default();
        let (mut lat, mut queued, mut svc, mut cpu) = (0f64, 0f64, 0f64, 0f64);
        let (mut flush, mut l0, mut ln, mut none) = (0u64, 0u64, 0u64, 0u64);
        let mut bytes = [0f64; 5];
        let mut ops = [0f64; 5];
        let mut charged = [0f64; 2];
        let mut ticks = [0f64; 3];
        let mut cache = [0f64; 2];
        let mut window_s = 0f64;
        let mut disk = 0u64;
        for r in reqs {
            a.requests += 1;
            lat += f64::from(r.latency_us);
            queued += f64::from(r.latency_us.saturating_sub(r.service_us));
            svc += f64::from(r.service_us);
            cpu += f64::from(r.runq_us.min(r.service_us));
            let (from, to) = (r.due_us, r.due_us + u64::from(r.latency_us));
            disk += u64::from(stalls.iter().any(|&(a, b)| a <= to && b >= from));
            if self.samples.is_empty() {
                continue;
            }
            let (i, j) = (self.at_or_before(from), self.at_or_after(to));
            let mut jobs = [0u8; 3];
            for s in &self.samples[i..=j.max(i)] {
                for (m, v) in jobs.iter_mut().zip(s.jobs) {
                    *m = (*m).max(v);
                }
            }
            flush += u64::from(jobs[0] > 0);
            l0 += u64::from(jobs[1] > 0);
            ln += u64::from(jobs[2] > 0);
            none += u64::from(jobs == [0; 3]);
            let (si, sj) = (&self.samples[i], &self.samples[j.max(i)]);
            add_rise(&mut bytes, &sj.bytes, &si.bytes);
            add_rise(&mut ops, &sj.ops, &si.ops);
            add_rise(&mut charged, &sj.charged, &si.charged);
            add_rise(&mut ticks, &sj.cpu, &si.cpu);
            add_rise(&mut cache, &sj.cache, &si.cache);
            window_s += sj.t_us.saturating_sub(si.t_us).max(1) as f64 * 1e-6;
        }
        let n = a.requests.max(1) as f64;
        a.mean_latency_us = lat / n;
        a.queued_share = if lat > 0.0 { queued / lat } else { 0.0 };
        a.cpu_wait_share = if svc > 0.0 { cpu / svc } else { 0.0 };
        a.with_flush = flush as f64 / n;
        a.with_l0 = l0 as f64 / n;
        a.with_ln = ln as f64 / n;
        a.with_none = none as f64 / n;
        a.with_disk_stall = disk as f64 / n;
        for k in 0..5 {
            a.class_bps[k] = if window_s > 0.0 { bytes[k] / window_s } else { 0.0 };
            a.class_request_bytes[k] = if ops[k] > 0.0 { bytes[k] / ops[k] } else { 0.0 };
        }
        for (out, c) in a.charged_bps.iter_mut().zip(charged) {
            *out = if window_s > 0.0 { c / window_s } else { 0.0 };
        }
        if ticks[2] > 0.0 {
            a.machine_cpu_busy = ticks[0] / ticks[2];
            a.steal = ticks[1] / ticks[2];
        }
        if window_s > 0.0 {
            a.cache_misses_per_s = cache[0] / window_s;
        }
        if cache[0] + cache[1] > 0.0 {
            a.cache_miss_share = cache[0] / (cache[0] + cache[1]);
        }
        a
    }

    /// Sets the requests slower than the run's p99 (`threshold_us`) against
    /// the readings, and every request against the disk probe's reads of
    /// the run (`disk`, from [`crate::disk_probe::DiskProbe::reads`]; empty
    /// with the probe off).
    pub fn attribute(&self, requests: &[RequestRecord], threshold_us: u64, disk: &[ProbeRead]) -> Attribution {
        let slow = requests.iter().filter(|r| u64::from(r.latency_us) >= threshold_us);
        let stalls: Vec<(u64, u64)> = disk.iter().filter(|d| d.is_stall()).map(|d| (d.start_us(), d.end_us)).collect();
        let mut seconds: Vec<SecondBackground> = Vec::new();
        let second = |seconds: &mut Vec<SecondBackground>, t_us: u64| -> usize {
            let t = (t_us / 1_000_000) as usize;
            while seconds.len() <= t {
                seconds.push(SecondBackground { t: seconds.len(), ..SecondBackground::default() });
            }
            t
        };
        for d in disk {
            let t = second(&mut seconds, d.end_us);
            seconds[t].disk_max_us = seconds[t].disk_max_us.max(d.latency_us);
        }
        for w in self.samples.windows(2) {
            let t = second(&mut seconds, w[1].t_us);
            let s = &mut seconds[t];
            for k in 0..5 {
                s.class_bytes[k] += w[1].bytes[k].saturating_sub(w[0].bytes[k]);
            }
            for k in 0..2 {
                s.charged[k] += w[1].charged[k].saturating_sub(w[0].charged[k]);
                s.cache[k] += w[1].cache[k].saturating_sub(w[0].cache[k]);
            }
            for (m, v) in s.max_jobs.iter_mut().zip(w[1].jobs) {
                *m = (*m).max(v);
            }
        }
        let (quiet_requests, quiet_p99_us) = self.quiet_p99(requests);
        let run_class_bytes = match (self.samples.first(), self.samples.last()) {
            (Some(a), Some(b)) => std::array::from_fn(|k| b.bytes[k].saturating_sub(a.bytes[k])),
            _ => [0; 5],
        };
        Attribution {
            classes: CLASSES.iter().map(|c| (*c).to_owned()).collect(),
            staged: self.staged,
            samples: self.samples.len() as u64,
            threshold_us,
            slowest: self.around(slow, &stalls),
            all: self.around(requests.iter(), &stalls),
            run_class_bytes,
            seconds,
            quiet_requests,
            quiet_p99_us,
            disk_reads: disk.len() as u64,
        }
    }

    /// How many requests were quiet (see [`QUIET_MARGIN`]) and their p99,
    /// µs; `(0, 0)` without readings.
    fn quiet_p99(&self, requests: &[RequestRecord]) -> (u64, u64) {
        if self.samples.is_empty() {
            return (0, 0);
        }
        // busy[i]: readings 0..i that saw a job running.
        let mut busy = Vec::with_capacity(self.samples.len() + 1);
        busy.push(0u32);
        for s in &self.samples {
            busy.push(busy.last().copied().unwrap_or(0) + u32::from(s.jobs != [0; 3]));
        }
        let margin = QUIET_MARGIN.as_micros() as u64;
        // The same histogram, and so the same p99, as the run's own.
        let mut quiet = crate::runner::histogram();
        for r in requests {
            let i = self.at_or_before(r.due_us.saturating_sub(margin));
            let j = self.at_or_after(r.due_us + u64::from(r.latency_us)).max(i);
            if busy[j + 1] == busy[i] {
                quiet.saturating_record(u64::from(r.latency_us));
            }
        }
        if quiet.is_empty() {
            return (0, 0);
        }
        (quiet.len(), quiet.value_at_quantile(0.99))
    }

    /// Bytes per request context the stage admitted between the first and
    /// the last reading (what [`Attribution::run_class_bytes`] sums by
    /// class); empty without a stage.
    pub fn run_context_bytes(&self) -> std::collections::BTreeMap<String, u64> {
        let (Some(a), Some(b)) = (&self.first, self.last.as_ref().or(self.first.as_ref())) else {
            return Default::default();
        };
        b.contexts
            .iter()
            .map(|c| (c.context.name().to_owned(), c.counter.bytes.saturating_sub(a.context_exact(c.context).bytes)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }
}

/// The table printed under the comparison: per system, what ran while the
/// slowest 1% waited, against all requests.
pub fn table(systems: &[(String, usize, &Attribution)]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "slowest 1% (p99 and above) vs all requests: share with a flush / L0 / LN job running, background MiB/s (stage), kernel MiB/s r+w, queued / cpu-wait share of latency; quiet p99: of the requests with no job running from {} ms before they were due to their end",
        QUIET_MARGIN.as_millis()
    );
    let _ = writeln!(
        s,
        "{:<22} {:>8} {:>9}  {:>17} {:>17} {:>17}  {:>13} {:>13}  {:>11} {:>11}",
        "system #",
        "p99 µs",
        "quiet p99",
        "flush slow/all",
        "L0 slow/all",
        "LN slow/all",
        "bg MiB/s",
        "kernel MiB/s",
        "queued",
        "cpu wait"
    );
    let _ = writeln!(
        s,
        "{:>22} (then: the machine's CPU busy share and steal share, the share of data-block lookups that missed RocksDB's block cache, and the share of requests whose wait overlapped a disk stall, a disk probe read of {} ms or more, slow/all)",
        "",
        crate::disk_probe::DISK_STALL.as_millis()
    );
    let mib = 1048576.0;
    for (name, r, a) in systems {
        let bg = |x: &Around| (x.class_bps[FLUSH] + x.class_bps[L0] + x.class_bps[LN] + x.class_bps[OTHER]) / mib;
        let k = |x: &Around| (x.charged_bps[0] + x.charged_bps[1]) / mib;
        let _ = writeln!(
            s,
            "{:<22} {:>8} {:>9}  {:>8.2}/{:<8.2} {:>8.2}/{:<8.2} {:>8.2}/{:<8.2}  {:>6.1}/{:<6.1} {:>6.1}/{:<6.1}  {:>5.2}/{:<5.2} {:>5.2}/{:<5.2}  cpu {:.2}/{:.2} steal {:.3}/{:.3} cache miss {:.2}/{:.2}{}",
            format!("{name} #{r}"),
            a.threshold_us,
            a.quiet_p99_us,
            a.slowest.with_flush,
            a.all.with_flush,
            a.slowest.with_l0,
            a.all.with_l0,
            a.slowest.with_ln,
            a.all.with_ln,
            bg(&a.slowest),
            bg(&a.all),
            k(&a.slowest),
            k(&a.all),
            a.slowest.queued_share,
            a.all.queued_share,
            a.slowest.cpu_wait_share,
            a.all.cpu_wait_share,
            a.slowest.machine_cpu_busy,
            a.all.machine_cpu_busy,
            a.slowest.steal,
            a.all.steal,
            a.slowest.cache_miss_share,
            a.all.cache_miss_share,
            if a.disk_reads > 0 {
                format!(" disk stall {:.2}/{:.4}", a.slowest.with_disk_stall, a.all.with_disk_stall)
            } else {
                String::new()
            },
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Op;

    fn req(due_us: u64, latency_us: u32) -> RequestRecord {
        RequestRecord { due_us, latency_us, service_us: latency_us / 2, runq_us: latency_us / 4, op: Op::Read }
    }

    /// A flush runs from 10 to 20 ms writing 1 MiB per 2 ms; the slow
    /// requests fall in it, the fast ones outside.
    #[test]
    fn slow_requests_are_set_against_what_ran() {
        let mut samples = Samples { samples: Vec::new(), staged: true, first: None, last: None };
        let mut flushed = 0u64;
        for i in 0..=20u64 {
            let t_us = i * 2000;
            let running = (5..10).contains(&i);
            if running {
                flushed += 1 << 20;
            }
            let mut s = Sample { t_us, ..Sample::default() };
            s.bytes[FLUSH] = flushed;
            s.ops[FLUSH] = flushed >> 20;
            s.bytes[FG] = i * 4096;
            s.ops[FG] = i;
            s.jobs[0] = u8::from(running);
            // 30 cache hits per reading; 10 misses per reading during the flush.
            s.cache = [10 * i.clamp(5, 9).saturating_sub(5), 30 * i];
            samples.samples.push(s);
        }
        let mut reqs: Vec<RequestRecord> = (0..99).map(|i| req(30_000 + i * 50, 100)).collect();
        reqs.push(req(12_500, 5000));
        let a = samples.attribute(&reqs, 5000, &[]);
        assert_eq!(a.slowest.requests, 1);
        assert_eq!(a.slowest.with_flush, 1.0);
        assert_eq!(a.all.requests, 100);
        assert!((a.all.with_flush - 0.01).abs() < 1e-9, "{}", a.all.with_flush);
        // The slow request's window (12.5 to 17.5 ms) reads samples 6 to 9
        // (12 to 18 ms): 3 MiB in 6 ms, in 1 MiB requests.
        assert!((a.slowest.class_bps[FLUSH] - 3.0 * 1048576.0 / 0.006).abs() < 1.0, "{:?}", a.slowest.class_bps);
        assert_eq!(a.slowest.class_request_bytes[FLUSH], 1048576.0);
        assert!((a.slowest.queued_share - 0.5).abs() < 1e-9);
        assert!((a.slowest.cpu_wait_share - 0.5).abs() < 1e-9);
        // Its window saw 30 misses and 90 hits in 6 ms.
        assert!((a.slowest.cache_misses_per_s - 5000.0).abs() < 1e-6, "{}", a.slowest.cache_misses_per_s);
        assert!((a.slowest.cache_miss_share - 0.25).abs() < 1e-9, "{}", a.slowest.cache_miss_share);
        assert_eq!(a.run_class_bytes[FLUSH], 5 << 20);
        assert_eq!(a.run_class_bytes[FG], 20 * 4096);
        assert_eq!(a.seconds.len(), 1);
        assert_eq!(a.seconds[0].class_bytes[FLUSH], 5 << 20);
        assert_eq!(a.seconds[0].max_jobs, [1, 0, 0]);
        assert_eq!(a.seconds[0].cache, [40, 600]);
    }

    /// A flush runs from 10 to 18 ms. Quiet are the requests with no job
    /// from 50 ms before their due time to their end: not one in the
    /// flush, nor one due at 65 ms (its margin reaches back into the flush).
    #[test]
    fn quiet_requests_have_no_job_in_their_margin() {
        let mut samples = Samples { samples: Vec::new(), staged: true, first: None, last: None };
        for i in 0..=100u64 {
            let mut s = Sample { t_us: i * 2000, ..Sample::default() };
            s.jobs[0] = u8::from((5..10).contains(&i));
            samples.samples.push(s);
        }
        let mut reqs = vec![req(12_500, 5000), req(65_000, 300), req(70_000, 100)];
        reqs.extend((0..100u32).map(|k| req(100_000 + u64::from(k) * 500, 100 + k)));
        let a = samples.attribute(&reqs, 199, &[]);
        assert_eq!(a.quiet_requests, 101);
        // Latencies 100, 100, 101 ... 199: the 100th of 101 is 198.
        assert_eq!(a.quiet_p99_us, 198);
        let none = Samples::default().attribute(&reqs, 199, &[]);
        assert_eq!((none.quiet_requests, none.quiet_p99_us), (0, 0));
    }

    /// The disk probe stalled once, from 1.200 to 1.260 s (60 ms); the
    /// one slow request waited from 1.210 to 1.275 s, the fast ones after.
    /// Requests whose wait overlaps the stall are set against it; each
    /// second has its slowest probe read.
    #[test]
    fn requests_are_set_against_disk_stalls() {
        let samples = Samples {
            samples: (0..=1000u64).map(|i| Sample { t_us: i * 2000, ..Sample::default() }).collect(),
            staged: true,
            first: None,
            last: None,
        };
        let mut disk: Vec<ProbeRead> =
            (1..100u64).map(|i| ProbeRead { end_us: i * 20_000, latency_us: 80 + i as u32 }).collect();
        disk.push(ProbeRead { end_us: 1_260_000, latency_us: 60_000 });
        // A read of 9.999 ms is no stall.
        disk.push(ProbeRead { end_us: 1_500_000, latency_us: 9_999 });
        disk.sort_by_key(|d| d.end_us);
        let mut reqs = vec![req(1_210_000, 65_000)];
        // Due 1.261 s on, after the stall had ended: not with it.
        reqs.extend((0..99u64).map(|k| req(1_261_000 + k * 1000, 100)));
        let a = samples.attribute(&reqs, 65_000, &disk);
        assert_eq!(a.disk_reads, 101);
        assert_eq!(a.slowest.requests, 1);
        assert_eq!(a.slowest.with_disk_stall, 1.0);
        assert!((a.all.with_disk_stall - 0.01).abs() < 1e-9, "{}", a.all.with_disk_stall);
        // A request due at 1.259 s, in the stall's last ms, overlaps it.
        let b = samples.attribute(&[req(1_259_000, 100)], 100, &disk);
        assert_eq!(b.slowest.with_disk_stall, 1.0);
        assert_eq!(a.seconds[0].disk_max_us, 80 + 49);
        assert_eq!(a.seconds[1].disk_max_us, 60_000);
        // Without the probe, nothing is set against it.
        let c = samples.attribute(&reqs, 65_000, &[]);
        assert_eq!((c.disk_reads, c.slowest.with_disk_stall), (0, 0.0));
        assert!(c.seconds.iter().all(|s| s.disk_max_us == 0));
        let t = table(&[("x".into(), 1, &a), ("y".into(), 1, &c)]);
        assert!(t.contains("disk stall 1.00/0.0100"), "{t}");
        assert_eq!(t.matches("disk stall 1").count(), 1, "{t}");
    }

    #[test]
    fn contexts_fall_in_their_class() {
        assert_eq!(class_of(C::FOREGROUND), FG);
        assert_eq!(class_of(C::BG_FLUSH), FLUSH);
        assert_eq!(class_of(C::compaction(0, 1)), L0);
        assert_eq!(class_of(C::compaction(0, 0)), L0);
        assert_eq!(class_of(C::compaction(2, 3)), LN);
        assert_eq!(class_of(C::BG_COMPACTION), LN);
        assert_eq!(class_of(C::BACKGROUND), OTHER);
    }
}
