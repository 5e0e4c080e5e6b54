//! The per-DB handle RocksDB's I/O is handed to: it decides each request's
//! context, enforces it through the stage, keeps per-file-kind statistics,
//! and tracks the DB's flush and compaction jobs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kv_stage::{
    Context, EnforceError, InstanceId, Reason, RequestContext, Stage, WorkflowId,
    info::{Counter, CounterArray, JobCounts},
};
use serde::Serialize;

use crate::ffi::Sink;
use crate::tag::{self, JobTag};
use crate::wire::{Activity, Event, FileKind, FileOp, JobInfo, Request};

/// Per file kind: reads, writes, syncs, metadata, readahead.
const PER_KIND: usize = 5;
const CELLS: usize = FileKind::ALL.len() * PER_KIND;

fn cell(kind: FileKind, op: FileOp) -> usize {
    let i = match op {
        FileOp::Read => 0,
        FileOp::Write => 1,
        FileOp::Sync | FileOp::Fsync | FileOp::RangeSync => 2,
        FileOp::Prefetch => 4,
        _ => 3,
    };
    kind as usize * PER_KIND + i
}

/// What RocksDB read and wrote through the wrapper, per file kind (admitted
/// requests only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileIo {
    /// Reads.
    pub read: Counter,
    /// Writes (appends).
    pub write: Counter,
    /// Syncs.
    pub sync: Counter,
    /// Opens, closes, deletes, renames, truncates, links, preallocations,
    /// directory creations and locks.
    pub metadata: Counter,
    /// Readahead into the page cache (`Prefetch`): accounted here only. The
    /// reads that then take the data from the cache are the ones enforced
    /// and counted by the stage, so a byte is charged once.
    pub prefetch: Counter,
}

/// Per-file-kind I/O of one DB.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IoStats {
    /// `(kind, io)` for every kind.
    pub files: Vec<(FileKind, FileIo)>,
}

impl IoStats {
    /// One kind's I/O.
    pub fn kind(&self, kind: FileKind) -> FileIo {
        self.files.iter().find(|(k, _)| *k == kind).map_or_else(FileIo::default, |(_, io)| *io)
    }

    /// Bytes written to all files.
    pub fn bytes_written(&self) -> u64 {
        self.files.iter().map(|(_, io)| io.write.bytes).sum()
    }

    /// Bytes read from all files.
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(|(_, io)| io.read.bytes).sum()
    }
}

/// The file I/O a client's calls made (see [`ClientScope`](crate::ClientScope)):
/// what RocksDB read and wrote on the threads running them, enforced as
/// foreground.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ClientIo {
    /// The client (tenant) context.
    pub client: RequestContext,
    /// File reads (admitted requests).
    pub read: Counter,
    /// File writes (WAL appends, mostly).
    pub written: Counter,
}

/// Background jobs of one class as the event listener reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobClassStats {
    /// Jobs begun so far, jobs RocksDB reported as completed, and jobs
    /// running now (begun, and neither completed nor retired).
    #[serde(flatten)]
    pub counts: JobCounts,
    /// Jobs that ended without a completion report: failed or refused jobs,
    /// and jobs cut short when the DB closed.
    pub retired: u64,
    /// Bytes the completed jobs wrote (flush: SST size; compaction: output).
    pub bytes_written: u64,
    /// Bytes the completed compactions read.
    pub bytes_read: u64,
    /// Nanoseconds during which at least one job of the class ran.
    pub busy_ns: u64,
}

/// Flushes, L0 compactions (base input level 0) and LN compactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobStats {
    /// Memtable flushes.
    pub flush: JobClassStats,
    /// Compactions whose input starts at L0 (L0->L1, intra-L0).
    pub compaction_l0: JobClassStats,
    /// Compactions whose input starts at L1 or deeper.
    pub compaction_ln: JobClassStats,
}

/// The compactions of one per-level context (`bg_compaction_L2_L3`, ...):
/// what RocksDB reported for its jobs, and the bytes rocks-env tagged with
/// the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CompactionLevelStats {
    /// The context (`bg_compaction_L0_L0`, `bg_compaction_L0_L1`,
    /// `bg_compaction_L1_L2`, ..., or `bg_compaction_LN` beyond L10 and
    /// `bg_compaction` for compactions of unknown levels).
    pub context: RequestContext,
    /// Its jobs, as the listener reported them (bytes: RocksDB's job
    /// statistics, `total_output_bytes` and `total_input_bytes`).
    pub jobs: JobClassStats,
    /// Reads rocks-env tagged with the context (admitted requests).
    pub read: Counter,
    /// Writes rocks-env tagged with the context.
    pub written: Counter,
}

/// Background errors RocksDB reported for the DB.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct BackgroundErrors {
    /// How many.
    pub count: u64,
    /// The last one's status message.
    pub last: Option<String>,
}

#[derive(Default)]
struct ClassState {
    stats: JobClassStats,
    busy_since: Option<Instant>,
}

impl ClassState {
    fn begin(&mut self) {
        if self.stats.counts.running == 0 {
            self.busy_since = Some(Instant::now());
        }
        self.stats.counts.running += 1;
        self.stats.counts.begun += 1;
    }

    fn end(&mut self, completed: Option<(u64, u64)>) {
        self.stats.counts.running = self.stats.counts.running.saturating_sub(1);
        match completed {
            Some((written, read)) => {
                self.stats.counts.completed += 1;
                self.stats.bytes_written += written;
                self.stats.bytes_read += read;
            }
            None => self.stats.retired += 1,
        }
        if self.stats.counts.running == 0
            && let Some(t) = self.busy_since.take()
        {
            self.stats.busy_ns += t.elapsed().as_nanos() as u64;
        }
    }

    fn snapshot(&self) -> JobClassStats {
        let mut s = self.stats;
        if let Some(t) = self.busy_since {
            s.busy_ns += t.elapsed().as_nanos() as u64;
        }
        s
    }
}

/// A job that began and has not ended.
#[derive(Debug, Clone, Copy)]
struct RunningJob {
    job_id: i32,
    context: RequestContext,
    /// The thread it began on.
    thread: WorkflowId,
}

/// Built-in contexts: per-context job and byte statistics cover these.
const BUILTIN_CONTEXTS: usize = RequestContext::BUILTINS.len();

#[derive(Default)]
struct Jobs {
    running: Vec<RunningJob>,
    flush: ClassState,
    l0: ClassState,
    ln: ClassState,
    /// Per built-in context (compactions only).
    by_context: [ClassState; BUILTIN_CONTEXTS],
}

impl Jobs {
    fn begin(&mut self, context: RequestContext) {
        self.class(context).begin();
        if is_compaction(context) {
            self.by_context[context.index()].begin();
        }
    }

    fn end(&mut self, context: RequestContext, completed: Option<(u64, u64)>) {
        self.class(context).end(completed);
        if is_compaction(context) {
            self.by_context[context.index()].end(completed);
        }
    }

    fn class(&mut self, context: RequestContext) -> &mut ClassState {
        if context == RequestContext::BG_FLUSH {
            &mut self.flush
        } else if RequestContext::BG_COMPACTION_L0_L1.covers(context) {
            &mut self.l0
        } else {
            &mut self.ln
        }
    }
}

/// The request context of a compaction, by its levels
/// ([`RequestContext::compaction`]), and its reason.
fn compaction_tag(job: &JobInfo) -> (RequestContext, Reason) {
    (RequestContext::compaction(job.base_input_level, job.output_level), Reason::from_rocksdb(job.reason))
}

/// The contexts [`DbIo::compaction_levels`] reports: every level pair, the
/// `LN` context itself (deeper than L10) and compactions of unknown levels.
#[inline]
fn is_compaction(c: RequestContext) -> bool {
    c.level_pair().is_some() || c == RequestContext::BG_COMPACTION_LN || c == RequestContext::BG_COMPACTION
}

static NEXT_DB_ID: AtomicU64 = AtomicU64::new(1);

/// The state behind one DB's file system layer, Env and listener.
pub(crate) struct DbIo {
    /// Process-unique id: thread tags name the DB they belong to.
    id: u64,
    stage: Arc<Stage>,
    instance: InstanceId,
    files: CounterArray<CELLS>,
    /// Reads (even cells) and writes (odd cells) per built-in compaction
    /// context (the other cells stay 0).
    contexts: CounterArray<{ 2 * BUILTIN_CONTEXTS }>,
    /// Reads (even cells) and writes (odd cells) per client context, of
    /// foreground file I/O done under a [`ClientScope`](crate::ClientScope).
    clients: CounterArray<{ 2 * RequestContext::MAX }>,
    jobs: Mutex<Jobs>,
    /// Set while the DB closes: requests are counted here but no longer
    /// enforced, so a closing DB never waits on a throttled stage.
    closing: AtomicBool,
    refused: AtomicU64,
    bg_errors: Mutex<BackgroundErrors>,
    /// The largest read or write a background context issues to the file
    /// system below at once (0: no limit); see
    /// [`StagedDbBuilder::max_background_request`](crate::StagedDbBuilder::max_background_request).
    max_background_request: AtomicU64,
    /// How long the deletion of an obsolete file may wait for a calm
    /// moment, in ms (0: never held back); see
    /// [`StagedDbBuilder::defer_deletions`](crate::StagedDbBuilder::defer_deletions).
    defer_deletions_ms: AtomicU64,
    /// Deletions held back so far, and done after waiting.
    deletions_deferred: AtomicU64,
    /// Bytes freed at a time when a file is deleted (0: at once); see
    /// [`StagedDbBuilder::delete_in_pieces`](crate::StagedDbBuilder::delete_in_pieces).
    delete_piece: AtomicU64,
}

impl DbIo {
    pub(crate) fn new(stage: Arc<Stage>, instance: InstanceId) -> Arc<Self> {
        Arc::new(DbIo {
            id: NEXT_DB_ID.fetch_add(1, Ordering::Relaxed),
            stage,
            instance,
            files: CounterArray::new(),
            contexts: CounterArray::new(),
            clients: CounterArray::new(),
            jobs: Mutex::new(Jobs::default()),
            closing: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            bg_errors: Mutex::new(BackgroundErrors::default()),
            max_background_request: AtomicU64::new(0),
            defer_deletions_ms: AtomicU64::new(0),
            deletions_deferred: AtomicU64::new(0),
            delete_piece: AtomicU64::new(0),
        })
    }

    pub(crate) fn set_defer_deletions(&self, max_wait: std::time::Duration) {
        let ms = u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX);
        self.defer_deletions_ms.store(ms, Ordering::Relaxed);
    }

    pub(crate) fn set_delete_piece(&self, piece: u64) {
        self.delete_piece.store(piece, Ordering::Relaxed);
    }

    pub(crate) fn delete_piece_setting(&self) -> u64 {
        self.delete_piece.load(Ordering::Relaxed)
    }

    pub(crate) fn deletions_deferred(&self) -> u64 {
        self.deletions_deferred.load(Ordering::Relaxed)
    }

    /// Whether a limit holds this instance's flushes or compactions back
    /// now: a DRL serving one of their contexts with a finite rate (what a
    /// controller sets while clients need the device, and removes when the
    /// store is calm).
    pub(crate) fn background_limited(&self) -> bool {
        let info = self.stage.stage_info();
        [RequestContext::BG_FLUSH, RequestContext::BG_COMPACTION_L0_L1, RequestContext::BG_COMPACTION_LN]
            .into_iter()
            .flat_map(|c| info.objects_serving(c, self.instance))
            .any(|(ch, obj)| {
                matches!(info.object(&ch, &obj).and_then(|o| o.spec.as_ref()),
                    Some(kv_stage::ObjectSpec::Drl(d)) if !d.rate.is_unlimited())
            })
    }

    pub(crate) fn set_max_background_request(&self, bytes: u64) {
        self.max_background_request.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn max_background_request(&self) -> u64 {
        self.max_background_request.load(Ordering::Relaxed)
    }

    pub(crate) fn stage(&self) -> &Arc<Stage> {
        &self.stage
    }

    pub(crate) fn instance(&self) -> InstanceId {
        self.instance
    }

    /// The DB starts closing: its waiters in the stage are admitted now, and
    /// its later requests pass.
    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Release);
        self.stage.close_instance(self.instance);
    }

    /// The DB is closed: jobs RocksDB never reported as completed (it skips
    /// every completion once shutdown starts) are retired.
    pub(crate) fn closed(&self) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(j) = jobs.running.pop() {
            jobs.end(j.context, None);
            self.stage.job_finished(self.instance, j.context);
        }
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn background_errors(&self) -> BackgroundErrors {
        self.bg_errors.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The request context of a request. In order: info-log writes are
    /// `background` (RocksDB writes its log holding a mutex that foreground
    /// threads also take, so throttling them as a flush would stall
    /// clients); the job of this DB running on the thread; RocksDB's own
    /// `io_activity`; `background` inside a task this DB scheduled (file
    /// purges, ...); else what the application propagated on the thread
    /// (foreground by default).
    /// A compaction's requests carry its [`Reason`] too.
    #[inline]
    fn context_of(&self, req: &Request) -> (RequestContext, Reason) {
        if req.file == FileKind::InfoLog {
            return (RequestContext::BACKGROUND, Reason::None);
        }
        if let Some(c) = tag::job_context(self.id) {
            return c;
        }
        let c = match req.activity {
            Activity::Flush => RequestContext::BG_FLUSH,
            Activity::Compaction => RequestContext::BG_COMPACTION,
            Activity::Other if tag::in_task(self.id) => RequestContext::BACKGROUND,
            Activity::Other => RequestContext::current(),
        };
        (c, Reason::None)
    }

    fn job_begun(&self, job: &JobInfo, context: RequestContext, reason: Reason) {
        let thread = WorkflowId::current();
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        // A thread runs one job at a time: a job of this DB still tagged on
        // it ended without a report.
        if let Some(stale) = tag::begin_job(JobTag { db: self.id, job_id: job.job_id, context, reason })
            && stale.db == self.id
        {
            self.retire(&mut jobs, |j| j.thread == thread && j.job_id == stale.job_id);
        }
        jobs.running.push(RunningJob { job_id: job.job_id, context, thread });
        jobs.begin(context);
        self.stage.job_started(self.instance, context);
    }

    fn job_completed(&self, job: &JobInfo, context: RequestContext, written: u64, read: u64) {
        tag::end_job(self.id, job.job_id);
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = jobs.running.iter().position(|j| j.job_id == job.job_id && j.context == context) {
            jobs.running.remove(i);
            jobs.end(context, Some((written, read)));
            self.stage.job_finished(self.instance, context);
        }
    }

    /// Ends, without a completion, the running jobs `which` selects.
    fn retire(&self, jobs: &mut Jobs, which: impl Fn(&RunningJob) -> bool) {
        let mut i = 0;
        while i < jobs.running.len() {
            if which(&jobs.running[i]) {
                let j = jobs.running.remove(i);
                jobs.end(j.context, None);
                self.stage.job_finished(self.instance, j.context);
            } else {
                i += 1;
            }
        }
    }

    /// The job a thread was running is over (its task ended, or it failed).
    fn retire_thread_job(&self, left: Option<JobTag>) {
        if let Some(t) = left {
            let thread = WorkflowId::current();
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            self.retire(&mut jobs, |j| j.thread == thread && j.job_id == t.job_id && j.context == t.context);
        }
    }

    pub(crate) fn io_stats(&self) -> IoStats {
        let t = self.files.totals();
        let ob = |i: usize| Counter { ops: t[i].0, bytes: t[i].1 };
        IoStats {
            files: FileKind::ALL
                .iter()
                .map(|&k| {
                    let b = k as usize * PER_KIND;
                    let io = FileIo {
                        read: ob(b),
                        write: ob(b + 1),
                        sync: ob(b + 2),
                        metadata: ob(b + 3),
                        prefetch: ob(b + 4),
                    };
                    (k, io)
                })
                .collect(),
        }
    }

    /// Per client with file I/O, in context id order.
    pub(crate) fn client_io(&self) -> Vec<ClientIo> {
        let t = self.clients.totals();
        (0..RequestContext::MAX)
            .filter(|&i| t[2 * i].0 > 0 || t[2 * i + 1].0 > 0)
            .filter_map(|i| {
                Some(ClientIo {
                    client: RequestContext::from_id(i as u16)?,
                    read: Counter { ops: t[2 * i].0, bytes: t[2 * i].1 },
                    written: Counter { ops: t[2 * i + 1].0, bytes: t[2 * i + 1].1 },
                })
            })
            .collect()
    }

    pub(crate) fn job_stats(&self) -> JobStats {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        JobStats { flush: jobs.flush.snapshot(), compaction_l0: jobs.l0.snapshot(), compaction_ln: jobs.ln.snapshot() }
    }

    /// Per compaction context with a job or tagged bytes, shallowest level
    /// pair first.
    pub(crate) fn compaction_levels(&self) -> Vec<CompactionLevelStats> {
        let t = self.contexts.totals();
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        RequestContext::COMPACTION_PAIRS
            .into_iter()
            .chain([RequestContext::BG_COMPACTION_LN, RequestContext::BG_COMPACTION])
            .filter_map(|c| {
                let i = c.index();
                let s = CompactionLevelStats {
                    context: c,
                    jobs: jobs.by_context[i].snapshot(),
                    read: Counter { ops: t[2 * i].0, bytes: t[2 * i].1 },
                    written: Counter { ops: t[2 * i + 1].0, bytes: t[2 * i + 1].1 },
                };
                (s.jobs.counts.begun > 0 || s.read.ops > 0 || s.written.ops > 0).then_some(s)
            })
            .collect()
    }
}

impl Sink for DbIo {
    /// Enforces one RocksDB request through the stage.
    #[inline]
    fn enforce(&self, req: &Request) -> Result<(), EnforceError> {
        let request_type = req.op.request_type();
        if !self.closing.load(Ordering::Relaxed) && req.op != FileOp::Prefetch {
            let (context, reason) = self.context_of(req);
            let ctx = Context::with(WorkflowId::current(), request_type, context, self.instance, req.size)
                .with_reason(reason);
            if let Err(e) = self.stage.enforce(&ctx) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
            if matches!(req.op, FileOp::Read | FileOp::Write) {
                let write = usize::from(req.op == FileOp::Write);
                if is_compaction(context) {
                    self.contexts.add(2 * context.index() + write, req.size);
                } else if !context.is_background()
                    && let Some(client) = tag::client()
                {
                    self.clients.add(2 * client.index() + write, req.size);
                }
            }
        }
        self.files.add(cell(req.file, req.op), req.size);
        Ok(())
    }

    fn piece(&self, req: &Request) -> u64 {
        let max = self.max_background_request();
        // Only large requests pay for classifying twice.
        if max == 0 || req.size <= max || self.closing.load(Ordering::Relaxed) {
            return 0;
        }
        if self.context_of(req).0.is_background() { max } else { 0 }
    }

    /// Held back while a limit holds the instance's background work back,
    /// for at most the configured wait; never while the DB closes.
    fn defer_delete(&self, _kind: u8, waited_ms: u64) -> bool {
        let max = self.defer_deletions_ms.load(Ordering::Relaxed);
        if max == 0 || waited_ms >= max || self.closing.load(Ordering::Relaxed) {
            return false;
        }
        let hold = self.background_limited();
        if hold && waited_ms == 0 {
            self.deletions_deferred.fetch_add(1, Ordering::Relaxed);
        }
        hold
    }

    /// Never while the DB closes: what it deletes then goes at once.
    fn delete_piece(&self) -> u64 {
        if self.closing.load(Ordering::Relaxed) { 0 } else { self.delete_piece.load(Ordering::Relaxed) }
    }

    fn on_event(&self, ev: Event) {
        match ev {
            Event::FlushBegin(job) => self.job_begun(&job, RequestContext::BG_FLUSH, Reason::None),
            Event::FlushCompleted { job, bytes_written } => {
                self.job_completed(&job, RequestContext::BG_FLUSH, bytes_written, 0)
            }
            Event::CompactionBegin(job) => {
                let (context, reason) = compaction_tag(&job);
                self.job_begun(&job, context, reason)
            }
            Event::CompactionCompleted { job, bytes_written, bytes_read } => {
                self.job_completed(&job, compaction_tag(&job).0, bytes_written, bytes_read)
            }
            Event::SubcompactionBegin(job) => {
                let (context, reason) = compaction_tag(&job);
                tag::begin_subjob(JobTag { db: self.id, job_id: job.job_id, context, reason })
            }
            Event::SubcompactionCompleted(_) => tag::end_subjob(self.id),
            Event::TaskBegin => tag::begin_task(self.id),
            Event::TaskEnd => self.retire_thread_job(tag::end_task(self.id)),
            Event::BackgroundError { message, .. } => {
                // Reported on the thread whose job failed: that job is over.
                self.retire_thread_job(tag::take_job(self.id));
                tracing::warn!(db = self.id, error = message.as_str(), "RocksDB reported a background error");
                let mut e = self.bg_errors.lock().unwrap_or_else(|e| e.into_inner());
                e.count += 1;
                e.last = Some(message);
            }
            Event::Unknown(_) => {}
        }
    }
}
