//! Load and run phases.
//!
//! The run phase is **open loop**: every client has a schedule of arrival
//! times from the load profile and issues each request at its time, or at
//! once if it is late. Latency is measured from the *scheduled* time (so a
//! stalled DB is charged for every request that waited, with no coordinated
//! omission) and service time from when the request was issued; both go to
//! HdrHistograms in microseconds with 3 significant digits, per operation
//! type and per second of schedule. A request that still cannot be issued
//! when the drain time after the schedule is over is *dropped*: it is not
//! sent, but it is recorded with the latency it had at least, the time from
//! its schedule to the end of the run, so a system that falls far behind is
//! charged for every request it could not serve.
//!
//! Inserts take their key numbers from an [`AcknowledgedCounter`]: reads
//! pick among keys whose inserts have returned, as in YCSB.
//!
//! A client that is early sleeps until the request's time. Linux lets a
//! sleep run late by the thread's *timer slack* (50 µs by default), and on
//! this kind of VM a sleep of about a millisecond measured 75 µs late at
//! the median: latency the load generator would add to every request of a
//! calm run, whatever the system. Client threads therefore set their timer
//! slack to [`RunParams::timer_slack_ns`] ([`CLIENT_TIMER_SLACK_NS`] by
//! default); what lateness remains (the wake-up
//! itself) is measured for every request a client slept for and reported
//! ([`RunResult::issue_late`]), so a reader can tell the generator's error
//! from the system's latency.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rocksdb::DB;

use crate::error::Result;
use crate::generator::{AcknowledgedCounter, Rng};
use crate::profile::{Profile, Schedule};
use crate::workload::{Chosen, Op, OpChooser, RecordBuilder, Workload};

const MAX_US: u64 = 600_000_000;

/// The timer slack client threads ask for by default, ns (the kernel's
/// smallest).
pub const CLIENT_TIMER_SLACK_NS: u64 = 1;

/// Sets the calling thread's timer slack to `ns` (at least 1) and returns
/// the value the kernel then reports (`None` if it cannot say).
pub fn set_client_timer_slack(ns: u64) -> Option<u64> {
    if let Err(e) = nix::sys::prctl::set_timerslack(ns.max(1) as _) {
        tracing::warn!(error = %e, "could not set the client's timer slack; its sleeps may run up to 50 µs late");
    }
    nix::sys::prctl::get_timerslack().ok().and_then(|v| u64::try_from(v).ok())
}

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// Latencies of one operation type (or of all).
#[derive(Debug, Clone)]
pub struct OpStats {
    /// From the scheduled time to completion, µs; dropped requests are in
    /// it too, with the time from their schedule to the end of the run.
    pub intended: Histogram<u64>,
    /// From issue to completion, µs (issued requests only).
    pub service: Histogram<u64>,
    /// Operations that failed.
    pub errors: u64,
    /// Requests never issued (past the drain limit).
    pub dropped: u64,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats { intended: histogram(), service: histogram(), errors: 0, dropped: 0 }
    }
}

impl OpStats {
    fn add(&mut self, other: &OpStats) {
        let _ = self.intended.add(&other.intended);
        let _ = self.service.add(&other.service);
        self.errors += other.errors;
        self.dropped += other.dropped;
    }
}

/// One request as a client saw it, for the attribution of slow requests
/// ([`crate::attribution`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// Scheduled time, µs since the clients started.
    pub due_us: u64,
    /// From the scheduled time to completion, µs.
    pub latency_us: u32,
    /// From issue to completion, µs.
    pub service_us: u32,
    /// Time the client thread waited for a CPU while the request was in
    /// service (run-queue wait from `/proc/thread-self/schedstat`), µs; 0
    /// where the kernel does not report it.
    pub runq_us: u32,
    /// The operation.
    pub op: Op,
}

/// A `/proc` file kept open and read from its start with `pread`, into a
/// buffer of its own (no allocation per read): the run-queue clock here,
/// the CPU clock of [`crate::attribution`].
pub(crate) struct ProcFile<const N: usize> {
    file: Option<std::fs::File>,
    buf: [u8; N],
}

impl<const N: usize> ProcFile<N> {
    /// Opens `path`; a file that cannot be opened reads as empty.
    pub(crate) fn open(path: &str) -> Self {
        ProcFile { file: std::fs::File::open(path).ok(), buf: [0; N] }
    }

    /// The first line, whitespace-split numbers from field `skip` on, into
    /// `out` (missing or unreadable fields: 0).
    pub(crate) fn numbers(&mut self, skip: usize, out: &mut [u64]) {
        use std::os::unix::fs::FileExt as _;
        out.fill(0);
        let Some(f) = &self.file else { return };
        let n = f.read_at(&mut self.buf, 0).unwrap_or(0);
        let line = std::str::from_utf8(&self.buf[..n]).ok().and_then(|t| t.lines().next()).unwrap_or("");
        for (o, v) in out.iter_mut().zip(line.split_whitespace().skip(skip)) {
            *o = v.parse().unwrap_or(0);
        }
    }
}

/// The calling thread's run-queue wait (`/proc/thread-self/schedstat`,
/// second field, ns).
struct RunQueueClock(ProcFile<96>);

impl RunQueueClock {
    fn open() -> Self {
        RunQueueClock(ProcFile::open("/proc/thread-self/schedstat"))
    }

    fn wait_ns(&mut self) -> u64 {
        let mut v = [0u64; 1];
        self.0.numbers(1, &mut v);
        v[0]
    }
}

/// One second of a run.
#[derive(Debug, Clone)]
pub struct Second {
    /// Operations that completed in this second (wall clock).
    pub ops: u64,
    /// Latencies (from the scheduled time, µs) of the operations scheduled
    /// in this second.
    pub intended: Histogram<u64>,
}

/// What a run phase measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Wall time from start to the last completion.
    pub elapsed: Duration,
    /// Completed (issued) operations.
    pub ops: u64,
    /// All operations together.
    pub overall: OpStats,
    /// Per operation type.
    pub per_op: BTreeMap<Op, OpStats>,
    /// Per second of schedule.
    pub seconds: Vec<Second>,
    /// Requests scheduled before the end but not issued within the drain
    /// limit; each is in the latency histograms with the time from its
    /// schedule to the end of the run.
    pub dropped: u64,
    /// Length of the schedule, s.
    pub schedule_s: f64,
    /// Every issued request, in no particular order.
    pub requests: Vec<RequestRecord>,
    /// The load generator's own error: for each request a client slept
    /// for (it was early), how late it woke and issued it, µs. Requests a
    /// client issued at once because it was already late are not in it
    /// (their wait is the system's).
    pub issue_late: Histogram<u64>,
    /// The client threads' timer slack, ns, as the kernel reported it
    /// (the largest over the threads; `None` if a thread could not read it).
    pub timer_slack_ns: Option<u64>,
}

/// Parameters of a run phase.
#[derive(Debug, Clone)]
pub struct RunParams {
    /// Client threads.
    pub threads: usize,
    /// Length of the schedule.
    pub duration: Duration,
    /// Request rate over time.
    pub profile: Profile,
    /// Seed of the clients' random streams.
    pub seed: u64,
    /// How long after the schedule ends late requests may still be issued.
    pub drain: Duration,
    /// The client threads' timer slack, ns ([`CLIENT_TIMER_SLACK_NS`]
    /// unless comparing with runs made at Linux's default, 50,000).
    pub timer_slack_ns: u64,
}

/// What one client thread measured.
struct ClientResult {
    per_op: BTreeMap<Op, OpStats>,
    seconds: Vec<Second>,
    dropped: u64,
    elapsed: Duration,
    requests: Vec<RequestRecord>,
    /// How late requests the client slept for were issued, µs.
    late: Histogram<u64>,
    /// The client thread's timer slack as the kernel reported it, ns.
    timer_slack_ns: Option<u64>,
}

/// Does one operation. `Ok(false)` when the key read or updated was not
/// there.
fn execute(
    db: &DB,
    chooser: &OpChooser,
    records: &RecordBuilder,
    rng: &mut Rng,
    c: &Chosen,
    buf: &mut Vec<u8>,
) -> std::result::Result<bool, rocksdb::Error> {
    let key = chooser.key(c.keynum);
    match c.op {
        Op::Read => Ok(db.get_pinned(&key)?.is_some()),
        Op::Insert => {
            records.record(rng, buf);
            db.put(&key, &buf)?;
            Ok(true)
        }
        Op::Update if records.writes_all_fields() => {
            // Every field replaced: nothing of the old record is kept, so
            // the binding's read is skipped (a blind put, as db_bench's).
            records.record(rng, buf);
            db.put(&key, &buf)?;
            Ok(true)
        }
        Op::Update | Op::ReadModifyWrite => {
            // As YCSB's RocksDB binding: read the record, replace the field,
            // write it back.
            let existing = db.get_pinned(&key)?;
            match existing {
                Some(old) => records.update(rng, &old, c.field, buf),
                None => records.record(rng, buf),
            }
            db.put(&key, &buf)?;
            Ok(true)
        }
        Op::Scan => {
            let mut it = db.raw_iterator();
            it.seek(&key);
            let mut n = 0;
            while it.valid() && n < c.scan_len {
                std::hint::black_box(it.value());
                it.next();
                n += 1;
            }
            it.status()?;
            Ok(true)
        }
    }
}

/// Runs the clients against `db`.
pub fn run(db: &DB, workload: &Workload, params: &RunParams, progress: &(dyn Fn(f64) + Sync)) -> RunResult {
    run_with_clock(db, workload, params, progress, &std::sync::OnceLock::new())
}

/// [`run`], setting `clock` to the instant the clients start (what
/// [`RequestRecord::due_us`] counts from), for a sampler running beside.
pub fn run_with_clock(
    db: &DB,
    workload: &Workload,
    params: &RunParams,
    progress: &(dyn Fn(f64) + Sync),
    clock: &std::sync::OnceLock<Instant>,
) -> RunResult {
    let inserts = AcknowledgedCounter::new(workload.recordcount);
    let barrier = Barrier::new(params.threads + 1);
    // Completions may run past the schedule by up to the drain time.
    let seconds_n = ((params.duration + params.drain).as_secs_f64().ceil() as usize).max(1);
    let records = RecordBuilder::new(workload);
    let expected_per_thread =
        ((params.profile.max_rate() * params.duration.as_secs_f64()) as usize / params.threads.max(1)).min(4 << 20)
            + 16;
    let results: Vec<ClientResult> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..params.threads)
            .map(|t| {
                let (inserts, barrier, records) = (&inserts, &barrier, &records);
                s.spawn(move || {
                    let mut chooser = OpChooser::new(workload);
                    let mut rng = Rng::new(params.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    let mut schedule = Schedule::new(params.profile.clone(), params.threads, t);
                    let mut per_op: BTreeMap<Op, OpStats> = BTreeMap::new();
                    let mut seconds: Vec<Second> =
                        (0..seconds_n).map(|_| Second { ops: 0, intended: histogram() }).collect();
                    let mut buf = Vec::with_capacity(workload.record_bytes() as usize + 256);
                    let mut dropped = 0u64;
                    let mut requests = Vec::with_capacity(expected_per_thread);
                    let mut runq = RunQueueClock::open();
                    let timer_slack_ns = set_client_timer_slack(params.timer_slack_ns);
                    let mut late = histogram();
                    barrier.wait();
                    let start = Instant::now();
                    loop {
                        let due = schedule.next_arrival();
                        if due >= params.duration {
                            break;
                        }
                        let now = start.elapsed();
                        let slept = due > now;
                        if slept {
                            std::thread::sleep(due - now);
                        } else if now > params.duration + params.drain {
                            // Too late to issue: what is left of the
                            // schedule is dropped, each request recorded
                            // with the latency it has at least by now.
                            let mut due = due;
                            loop {
                                let c = chooser.next(&mut rng, inserts.acknowledged(), || u64::MAX);
                                let lat = (now.saturating_sub(due)).as_micros().clamp(1, MAX_US as u128) as u64;
                                let stats = per_op.entry(c.op).or_default();
                                stats.intended.saturating_record(lat);
                                stats.dropped += 1;
                                seconds[(due.as_secs() as usize).min(seconds_n - 1)].intended.saturating_record(lat);
                                dropped += 1;
                                due = schedule.next_arrival();
                                if due >= params.duration {
                                    break;
                                }
                            }
                            break;
                        }
                        let c = chooser.next(&mut rng, inserts.acknowledged(), || inserts.next());
                        let issued = start.elapsed();
                        if slept {
                            late.saturating_record(issued.saturating_sub(due).as_micros() as u64);
                        }
                        let waited0 = runq.wait_ns();
                        let ok = execute(db, &chooser, records, &mut rng, &c, &mut buf);
                        let done = start.elapsed();
                        let waited = runq.wait_ns().saturating_sub(waited0);
                        if c.op == Op::Insert {
                            inserts.acknowledge(c.keynum);
                        }
                        let stats = per_op.entry(c.op).or_default();
                        // A key that is not there is an error only where
                        // the workload loaded or inserted it.
                        if ok.is_err() || (matches!(ok, Ok(false)) && workload.must_exist(c.keynum)) {
                            stats.errors += 1;
                        }
                        let lat = (done - due).as_micros().clamp(1, MAX_US as u128) as u64;
                        let svc = (done - issued).as_micros().clamp(1, MAX_US as u128) as u64;
                        stats.intended.saturating_record(lat);
                        stats.service.saturating_record(svc);
                        seconds[(done.as_secs() as usize).min(seconds_n - 1)].ops += 1;
                        seconds[(due.as_secs() as usize).min(seconds_n - 1)].intended.saturating_record(lat);
                        requests.push(RequestRecord {
                            due_us: due.as_micros() as u64,
                            latency_us: lat.min(u64::from(u32::MAX)) as u32,
                            service_us: svc.min(u64::from(u32::MAX)) as u32,
                            runq_us: (waited / 1000).min(u64::from(u32::MAX)) as u32,
                            op: c.op,
                        });
                    }
                    ClientResult { per_op, seconds, dropped, elapsed: start.elapsed(), requests, late, timer_slack_ns }
                })
            })
            .collect();
        let start = Instant::now();
        let _ = clock.set(start);
        barrier.wait();
        while !handles.iter().all(|h| h.is_finished()) {
            progress((start.elapsed().as_secs_f64() / params.duration.as_secs_f64()).min(1.0));
            std::thread::sleep(Duration::from_millis(200));
        }
        progress(1.0);
        handles.into_iter().map(|h| h.join().expect("client thread")).collect()
    });
    let mut out = RunResult {
        elapsed: Duration::ZERO,
        ops: 0,
        overall: OpStats::default(),
        per_op: BTreeMap::new(),
        seconds: (0..seconds_n).map(|_| Second { ops: 0, intended: histogram() }).collect(),
        dropped: 0,
        schedule_s: params.duration.as_secs_f64(),
        requests: Vec::new(),
        issue_late: histogram(),
        timer_slack_ns: results.iter().map(|r| r.timer_slack_ns).try_fold(0, |m, v| v.map(|v| m.max(v))),
    };
    out.requests.reserve(results.iter().map(|r| r.requests.len()).sum());
    for r in &results {
        out.requests.extend_from_slice(&r.requests);
    }
    for ClientResult { per_op, seconds, dropped, late, .. } in &results {
        let _ = out.issue_late.add(late);
        for (op, s) in per_op {
            out.per_op.entry(*op).or_default().add(s);
            out.overall.add(s);
        }
        for (acc, s) in out.seconds.iter_mut().zip(seconds) {
            acc.ops += s.ops;
            let _ = acc.intended.add(&s.intended);
        }
        out.dropped += dropped;
    }
    out.ops = out.overall.service.len();
    // Until the last completion: the schedule's length, or longer when the
    // last requests ran late.
    out.elapsed = results.iter().map(|r| r.elapsed).max().unwrap_or(Duration::ZERO);
    out
}

/// Loads the workload's records (`insertcount`, else `recordcount`) into a
/// new DB at `path` (no device: the load is set-up, not measured), then
/// flushes. Returns the open DB.
pub fn load(path: &Path, options: &rocksdb::Options, workload: &Workload, threads: usize, seed: u64) -> Result<DB> {
    let db = DB::open(options, path)?;
    let next = AtomicU64::new(0);
    let records = RecordBuilder::new(workload);
    let chooser = OpChooser::new(workload);
    let mut write = rocksdb::WriteOptions::default();
    write.disable_wal(true);
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|t| {
                let (db, next, records, chooser, write) = (&db, &next, &records, &chooser, &write);
                s.spawn(move || -> std::result::Result<(), rocksdb::Error> {
                    let mut rng = Rng::new(seed.wrapping_add(t as u64));
                    let mut buf = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= workload.loaded() {
                            return Ok(());
                        }
                        records.record(&mut rng, &mut buf);
                        db.put_opt(chooser.key(k), &buf, write)?;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("loader thread")?;
        }
        Ok(())
    })?;
    db.flush()?;
    Ok(db)
}

/// Whether RocksDB reports a pending or running flush or compaction (a
/// property it cannot read counts as work).
pub fn has_background_work(db: &DB) -> bool {
    [
        "rocksdb.compaction-pending",
        "rocksdb.num-running-compactions",
        "rocksdb.num-running-flushes",
        "rocksdb.mem-table-flush-pending",
    ]
    .iter()
    .any(|p| db.property_int_value(*p).ok().flatten().unwrap_or(1) != 0)
}

/// Waits until RocksDB reports no pending or running flush or compaction
/// (twice in a row, 200 ms apart), for a warm start. Returns how long that
/// took, or `None` when `timeout` passed first.
pub fn settle(db: &DB, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut quiet_checks = 0;
    loop {
        quiet_checks = if has_background_work(db) { 0 } else { quiet_checks + 1 };
        if quiet_checks >= 2 {
            return Some(start.elapsed());
        }
        if start.elapsed() >= timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
