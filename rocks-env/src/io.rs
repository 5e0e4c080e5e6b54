//! The per-DB handle RocksDB's I/O is handed to: it decides each request's
//! context, enforces it through the stage, charges the emulated device, and
//! keeps per-file-kind and per-job statistics.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kv_stage::{Context, CounterArray, InstanceId, RequestContext, RequestType, Stage, WorkflowId};
use serde::Serialize;

use crate::device::Device;
use crate::ffi::{RawEvent, RawRequest};

/// Which file a request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// CURRENT, OPTIONS, IDENTITY, LOCK, temporary files.
    Other = 0,
    /// Write-ahead log (`*.log`).
    Wal = 1,
    /// Table files (`*.sst`).
    Sst = 2,
    /// Blob files (`*.blob`).
    Blob = 3,
    /// `MANIFEST-*`.
    Manifest = 4,
    /// The info log (`LOG`).
    InfoLog = 5,
    /// Directories (fsync).
    Directory = 6,
}

impl FileKind {
    /// Every kind, in discriminant order.
    pub const ALL: [FileKind; 7] = [
        FileKind::Other,
        FileKind::Wal,
        FileKind::Sst,
        FileKind::Blob,
        FileKind::Manifest,
        FileKind::InfoLog,
        FileKind::Directory,
    ];

    fn from_raw(v: u8) -> FileKind {
        FileKind::ALL.get(v as usize).copied().unwrap_or(FileKind::Other)
    }
}

/// Per file kind: reads, writes, syncs, metadata.
const CELLS: usize = FileKind::ALL.len() * 4;

fn cell(kind: FileKind, t: RequestType) -> usize {
    let op = match t {
        RequestType::Read => 0,
        RequestType::Write => 1,
        RequestType::Sync => 2,
        _ => 3,
    };
    kind as usize * 4 + op
}

/// `(ops, bytes)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OpsBytes {
    /// Requests.
    pub ops: u64,
    /// Bytes.
    pub bytes: u64,
}

/// What RocksDB read and wrote through the wrapper, per file kind (admitted
/// requests only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileIo {
    /// Reads.
    pub read: OpsBytes,
    /// Writes (appends).
    pub write: OpsBytes,
    /// Syncs.
    pub sync: OpsBytes,
    /// Opens, closes, deletes, renames, truncates.
    pub metadata: OpsBytes,
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

/// Background jobs as the event listener reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobClassStats {
    /// Jobs running now (begun and not yet completed).
    pub running: u64,
    /// Jobs begun so far.
    pub begun: u64,
    /// Jobs completed so far.
    pub completed: u64,
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

#[derive(Default)]
struct ClassState {
    stats: JobClassStats,
    busy_since: Option<Instant>,
}

impl ClassState {
    fn begin(&mut self) {
        if self.stats.running == 0 {
            self.busy_since = Some(Instant::now());
        }
        self.stats.running += 1;
        self.stats.begun += 1;
    }

    fn complete(&mut self, written: u64, read: u64) {
        self.stats.running = self.stats.running.saturating_sub(1);
        self.stats.completed += 1;
        self.stats.bytes_written += written;
        self.stats.bytes_read += read;
        if self.stats.running == 0
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

#[derive(Default)]
struct Jobs {
    flush: ClassState,
    l0: ClassState,
    ln: ClassState,
}

// Shim constants (shim.h).
const JOB_FLUSH: u8 = 1;
const JOB_L0: u8 = 2;
const JOB_LN: u8 = 3;
const FILE_INFO_LOG: u8 = 5;
const ACTIVITY_FLUSH: u8 = 0;
const ACTIVITY_COMPACTION: u8 = 1;
const EVENT_FLUSH_BEGIN: u8 = 1;
const EVENT_FLUSH_COMPLETED: u8 = 2;
const EVENT_COMPACTION_BEGIN: u8 = 3;
const EVENT_COMPACTION_COMPLETED: u8 = 4;

/// The state behind one DB's file system wrapper and listener.
pub(crate) struct DbIo {
    stage: Arc<Stage>,
    instance: InstanceId,
    device: Option<Arc<Device>>,
    files: CounterArray<CELLS>,
    jobs: Mutex<Jobs>,
    /// Set while the DB closes: new requests are counted but not held, so a
    /// closing DB never waits on a throttled stage.
    closing: AtomicBool,
    refused: AtomicU64,
}

impl DbIo {
    pub(crate) fn new(stage: Arc<Stage>, instance: InstanceId, device: Option<Arc<Device>>) -> Arc<Self> {
        Arc::new(DbIo {
            stage,
            instance,
            device,
            files: CounterArray::new(),
            jobs: Mutex::new(Jobs::default()),
            closing: AtomicBool::new(false),
            refused: AtomicU64::new(0),
        })
    }

    /// One strong reference for a C++ owner (given back through the release
    /// callback).
    pub(crate) fn raw_reference(self: &Arc<Self>) -> *const c_void {
        Arc::into_raw(Arc::clone(self)).cast()
    }

    pub(crate) fn stage(&self) -> &Arc<Stage> {
        &self.stage
    }

    pub(crate) fn instance(&self) -> InstanceId {
        self.instance
    }

    pub(crate) fn device(&self) -> Option<&Arc<Device>> {
        self.device.as_ref()
    }

    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }

    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The request context of a request: the listener's job tag for this
    /// thread, else RocksDB's own `io_activity`, else what the application
    /// propagated on this thread (foreground by default). Info-log writes
    /// are always `background`: RocksDB writes its log holding a mutex that
    /// foreground threads also take, so throttling them as a flush would
    /// stall clients.
    fn context_of(req: &RawRequest) -> RequestContext {
        if req.file_kind == FILE_INFO_LOG {
            return RequestContext::BACKGROUND;
        }
        match req.job_ctx {
            JOB_FLUSH => RequestContext::BG_FLUSH,
            JOB_L0 => RequestContext::BG_COMPACTION_L0_L1,
            JOB_LN => RequestContext::BG_COMPACTION_LN,
            _ => match req.io_activity {
                ACTIVITY_FLUSH => RequestContext::BG_FLUSH,
                ACTIVITY_COMPACTION => RequestContext::BG_COMPACTION,
                _ => RequestContext::current(),
            },
        }
    }

    /// The shim sends kv-stage's `RequestType` discriminants; anything
    /// beyond the file types is taken as metadata.
    fn request_type(kind: u8) -> RequestType {
        match RequestType::ALL.get(kind as usize) {
            Some(&t) if t <= RequestType::Metadata => t,
            _ => RequestType::Metadata,
        }
    }

    /// Enforces one RocksDB request. `Err` carries the message RocksDB
    /// returns to its caller as an I/O error.
    pub(crate) fn enforce(&self, req: &RawRequest) -> Result<(), String> {
        let request_type = Self::request_type(req.kind);
        let ctx = Context::with(WorkflowId::current(), request_type, Self::context_of(req), self.instance, req.size);
        if !self.closing.load(Ordering::Relaxed)
            && let Err(e) = self.stage.enforce(&ctx)
        {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(e.to_string());
        }
        self.files.add(cell(FileKind::from_raw(req.file_kind), request_type), req.size);
        if let Some(d) = &self.device {
            d.charge(&ctx);
        }
        Ok(())
    }

    pub(crate) fn on_event(&self, ev: &RawEvent) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        // The stage's job counters are what control planes read; the DB's
        // own (with bytes and busy time) are for embedders and tests.
        let level_ctx = if ev.base_input_level == 0 {
            RequestContext::BG_COMPACTION_L0_L1
        } else {
            RequestContext::BG_COMPACTION_LN
        };
        match ev.kind {
            EVENT_FLUSH_BEGIN => {
                jobs.flush.begin();
                self.stage.job_started(RequestContext::BG_FLUSH);
            }
            EVENT_FLUSH_COMPLETED => {
                jobs.flush.complete(ev.bytes_written, 0);
                self.stage.job_finished(RequestContext::BG_FLUSH);
            }
            EVENT_COMPACTION_BEGIN | EVENT_COMPACTION_COMPLETED => {
                let class = if ev.base_input_level == 0 { &mut jobs.l0 } else { &mut jobs.ln };
                if ev.kind == EVENT_COMPACTION_BEGIN {
                    class.begin();
                    self.stage.job_started(level_ctx);
                } else {
                    class.complete(ev.bytes_written, ev.bytes_read);
                    self.stage.job_finished(level_ctx);
                }
            }
            _ => {}
        }
    }

    pub(crate) fn io_stats(&self) -> IoStats {
        let t = self.files.totals();
        let ob = |i: usize| OpsBytes { ops: t[i].0, bytes: t[i].1 };
        IoStats {
            files: FileKind::ALL
                .iter()
                .map(|&k| {
                    let b = k as usize * 4;
                    (k, FileIo { read: ob(b), write: ob(b + 1), sync: ob(b + 2), metadata: ob(b + 3) })
                })
                .collect(),
        }
    }

    pub(crate) fn job_stats(&self) -> JobStats {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        JobStats { flush: jobs.flush.snapshot(), compaction_l0: jobs.l0.snapshot(), compaction_ln: jobs.ln.snapshot() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_request_kinds_are_kv_stage_discriminants() {
        // shim.h: 0 read, 1 write, 2 sync, 3 open, 4 close, 5 delete,
        // 6 rename, 7 truncate, 8 metadata.
        let expected = [
            RequestType::Read,
            RequestType::Write,
            RequestType::Sync,
            RequestType::Open,
            RequestType::Close,
            RequestType::Delete,
            RequestType::Rename,
            RequestType::Truncate,
            RequestType::Metadata,
        ];
        for (k, t) in expected.iter().enumerate() {
            assert_eq!(DbIo::request_type(k as u8), *t);
        }
        // Key-value types and unknown values are metadata, never a put or get.
        assert_eq!(DbIo::request_type(RequestType::Put as u8), RequestType::Metadata);
        assert_eq!(DbIo::request_type(200), RequestType::Metadata);
    }
}
