//! The wire format of `cpp/shim.h`: the raw structs the shim passes, and
//! their decoding into Rust enums. Nothing else in the crate reads a raw
//! number; a test checks every number here against the header.

use kv_stage::RequestType;
use serde::Serialize;

/// `rocks_env_request` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRequest {
    pub(crate) size: u64,
    pub(crate) op: u8,
    pub(crate) file_kind: u8,
    pub(crate) io_activity: u8,
    /// Out: the pieces an admitted read or write is issued in (0: whole).
    pub(crate) piece: u64,
}

/// `rocks_env_event` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawEvent {
    pub(crate) kind: u8,
    pub(crate) reason: u8,
    pub(crate) job_id: i32,
    pub(crate) base_input_level: i32,
    pub(crate) output_level: i32,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_read: u64,
    pub(crate) message: *const std::ffi::c_char,
}

/// What a request does (`rocks_env_op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FileOp {
    /// A read.
    Read = 0,
    /// An append or positioned write.
    Write = 1,
    /// `Sync` (fdatasync).
    Sync = 2,
    /// `Fsync`, or a directory's fsync.
    Fsync = 3,
    /// `RangeSync` (sync_file_range).
    RangeSync = 4,
    /// Opening or creating a file or directory.
    Open = 5,
    /// Closing a file.
    Close = 6,
    /// Deleting a file or directory.
    Delete = 7,
    /// Renaming a file.
    Rename = 8,
    /// Truncating a file.
    Truncate = 9,
    /// Linking a file.
    Link = 10,
    /// Readahead into the page cache (`Prefetch`).
    Prefetch = 11,
    /// Reserving a file's space (`Allocate`, i.e. fallocate, which
    /// `PrepareWrite` calls as a file grows).
    Allocate = 12,
    /// Creating a directory (`CreateDir`, `CreateDirIfMissing`).
    CreateDir = 13,
    /// Taking or releasing a file lock (`LockFile`, `UnlockFile`).
    Lock = 14,
}

impl FileOp {
    /// Every op, in wire order.
    pub const ALL: [FileOp; 15] = [
        FileOp::Read,
        FileOp::Write,
        FileOp::Sync,
        FileOp::Fsync,
        FileOp::RangeSync,
        FileOp::Open,
        FileOp::Close,
        FileOp::Delete,
        FileOp::Rename,
        FileOp::Truncate,
        FileOp::Link,
        FileOp::Prefetch,
        FileOp::Allocate,
        FileOp::CreateDir,
        FileOp::Lock,
    ];

    /// The stage's request type for this op: data moves are reads and
    /// writes, the three syncs are syncs, the rest metadata of their kind.
    /// (Readahead is a read, but rocks-env accounts it without sending it
    /// to the stage: see `DbIo`.)
    pub fn request_type(self) -> RequestType {
        match self {
            FileOp::Read | FileOp::Prefetch => RequestType::Read,
            FileOp::Write => RequestType::Write,
            FileOp::Sync | FileOp::Fsync | FileOp::RangeSync => RequestType::Sync,
            FileOp::Open => RequestType::Open,
            FileOp::Close => RequestType::Close,
            FileOp::Delete => RequestType::Delete,
            FileOp::Rename => RequestType::Rename,
            FileOp::Truncate => RequestType::Truncate,
            FileOp::Link | FileOp::Allocate | FileOp::CreateDir | FileOp::Lock => RequestType::Metadata,
        }
    }
}

/// Which file a request was for (`rocks_env_file_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
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
    /// Directories.
    Directory = 6,
}

impl FileKind {
    /// Every kind, in wire order.
    pub const ALL: [FileKind; 7] = [
        FileKind::Other,
        FileKind::Wal,
        FileKind::Sst,
        FileKind::Blob,
        FileKind::Manifest,
        FileKind::InfoLog,
        FileKind::Directory,
    ];
}

/// What RocksDB said the I/O is for (`rocksdb::Env::IOActivity`), in the
/// cases rocks-env uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activity {
    Flush,
    Compaction,
    Other,
}

/// `IOActivity::kFlush` and `kCompaction` (rocksdb/env.h). Every other
/// value, `ROCKS_ENV_ACTIVITY_UNKNOWN` (no IOOptions) included, is "other".
const ACTIVITY_FLUSH: u8 = 0;
const ACTIVITY_COMPACTION: u8 = 1;

/// One decoded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) op: FileOp,
    pub(crate) file: FileKind,
    pub(crate) activity: Activity,
    pub(crate) size: u64,
}

impl Request {
    /// Decodes a raw request; unknown numbers (a newer shim) are taken as
    /// the most conservative meaning: a metadata op on an "other" file.
    pub(crate) fn decode(raw: &RawRequest) -> Request {
        Request {
            op: FileOp::ALL.get(raw.op as usize).copied().unwrap_or(FileOp::Link),
            file: FileKind::ALL.get(raw.file_kind as usize).copied().unwrap_or(FileKind::Other),
            activity: match raw.io_activity {
                ACTIVITY_FLUSH => Activity::Flush,
                ACTIVITY_COMPACTION => Activity::Compaction,
                _ => Activity::Other,
            },
            size: raw.size,
        }
    }
}

/// `rocks_env_enforce_result` (shim.h).
pub(crate) const ENFORCE_OK: i32 = 0;
pub(crate) const ENFORCE_REFUSED: i32 = 1;
pub(crate) const ENFORCE_PANIC: i32 = 2;
pub(crate) const ENFORCE_SHUT_DOWN: i32 = 3;

/// A flush or compaction job as RocksDB identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobInfo {
    pub(crate) job_id: i32,
    pub(crate) base_input_level: i32,
    pub(crate) output_level: i32,
    /// `FlushReason` or `CompactionReason`.
    pub(crate) reason: u8,
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    FlushBegin(JobInfo),
    FlushCompleted {
        job: JobInfo,
        bytes_written: u64,
    },
    CompactionBegin(JobInfo),
    CompactionCompleted {
        job: JobInfo,
        bytes_written: u64,
        bytes_read: u64,
    },
    SubcompactionBegin(JobInfo),
    SubcompactionCompleted(JobInfo),
    TaskBegin,
    TaskEnd,
    /// `BackgroundErrorReason` and the status message.
    BackgroundError {
        reason: u8,
        message: String,
    },
    Unknown(u8),
}

const EVENT_FLUSH_BEGIN: u8 = 1;
const EVENT_FLUSH_COMPLETED: u8 = 2;
const EVENT_COMPACTION_BEGIN: u8 = 3;
const EVENT_COMPACTION_COMPLETED: u8 = 4;
const EVENT_SUBCOMPACTION_BEGIN: u8 = 5;
const EVENT_SUBCOMPACTION_COMPLETED: u8 = 6;
const EVENT_TASK_BEGIN: u8 = 7;
const EVENT_TASK_END: u8 = 8;
const EVENT_BACKGROUND_ERROR: u8 = 9;

impl Event {
    /// Decodes a raw event. `message` is the event's message, already read
    /// from its C string by the caller (the only pointer in the struct).
    pub(crate) fn decode(raw: &RawEvent, message: Option<String>) -> Event {
        let job = JobInfo {
            job_id: raw.job_id,
            base_input_level: raw.base_input_level,
            output_level: raw.output_level,
            reason: raw.reason,
        };
        match raw.kind {
            EVENT_FLUSH_BEGIN => Event::FlushBegin(job),
            EVENT_FLUSH_COMPLETED => Event::FlushCompleted { job, bytes_written: raw.bytes_written },
            EVENT_COMPACTION_BEGIN => Event::CompactionBegin(job),
            EVENT_COMPACTION_COMPLETED => {
                Event::CompactionCompleted { job, bytes_written: raw.bytes_written, bytes_read: raw.bytes_read }
            }
            EVENT_SUBCOMPACTION_BEGIN => Event::SubcompactionBegin(job),
            EVENT_SUBCOMPACTION_COMPLETED => Event::SubcompactionCompleted(job),
            EVENT_TASK_BEGIN => Event::TaskBegin,
            EVENT_TASK_END => Event::TaskEnd,
            EVENT_BACKGROUND_ERROR => {
                Event::BackgroundError { reason: raw.reason, message: message.unwrap_or_default() }
            }
            other => Event::Unknown(other),
        }
    }
}

/// `rocks_env_fault_rule` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawFaultRule {
    pub(crate) ops: u32,
    pub(crate) files: u32,
    pub(crate) activity: i32,
    pub(crate) skip: u64,
    pub(crate) count: u64,
}

/// `rocks_env_fault_report` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawFaultReport {
    pub(crate) files_truncated: u64,
    pub(crate) bytes_dropped: u64,
    pub(crate) files_removed: u64,
    pub(crate) renames_undone: u64,
}

/// `IOActivity` values a fault rule can name.
pub(crate) const fn activity_number(a: Activity) -> i32 {
    match a {
        Activity::Flush => ACTIVITY_FLUSH as i32,
        Activity::Compaction => ACTIVITY_COMPACTION as i32,
        Activity::Other => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = include_str!("../cpp/shim.h");

    /// The value of `NAME = value` (or `#define NAME value`) in shim.h.
    fn constant(name: &str) -> i64 {
        for line in HEADER.lines() {
            let line = line.trim();
            let rest = line.strip_prefix("#define ").unwrap_or(line);
            if let Some(rest) = rest.strip_prefix(name) {
                let v = rest.trim_start_matches([' ', '=']).split([',', ' ', '/']).next().unwrap();
                if v.is_empty() {
                    continue;
                }
                return if let Some(hex) = v.strip_prefix("0x") {
                    i64::from_str_radix(hex, 16).unwrap()
                } else {
                    v.parse().unwrap_or_else(|_| panic!("{name}: {v}"))
                };
            }
        }
        panic!("{name} is not in shim.h")
    }

    #[test]
    fn the_header_and_the_decoder_agree() {
        let ops = [
            "READ",
            "WRITE",
            "SYNC",
            "FSYNC",
            "RANGE_SYNC",
            "OPEN",
            "CLOSE",
            "DELETE",
            "RENAME",
            "TRUNCATE",
            "LINK",
            "PREFETCH",
            "ALLOCATE",
            "CREATE_DIR",
            "LOCK",
        ];
        assert_eq!(ops.len(), FileOp::ALL.len());
        for (op, name) in FileOp::ALL.iter().zip(ops) {
            assert_eq!(*op as i64, constant(&format!("ROCKS_ENV_OP_{name} ")), "{name}");
        }
        let files = ["OTHER", "WAL", "SST", "BLOB", "MANIFEST", "INFO_LOG", "DIR"];
        for (kind, name) in FileKind::ALL.iter().zip(files) {
            assert_eq!(*kind as i64, constant(&format!("ROCKS_ENV_FILE_{name} ")), "{name}");
        }
        for (v, name) in [
            (ENFORCE_OK, "OK"),
            (ENFORCE_REFUSED, "REFUSED"),
            (ENFORCE_PANIC, "PANIC"),
            (ENFORCE_SHUT_DOWN, "SHUT_DOWN"),
        ] {
            assert_eq!(i64::from(v), constant(&format!("ROCKS_ENV_ENFORCE_{name} ")), "{name}");
        }
        // No IOActivity has this value, so it decodes as "other".
        assert_eq!(constant("ROCKS_ENV_ACTIVITY_UNKNOWN "), 0xFF);
        assert_eq!(
            Request::decode(&RawRequest { size: 0, op: 0, file_kind: 0, io_activity: 0xFF, piece: 0 }).activity,
            Activity::Other
        );
        for (v, name) in [
            (EVENT_FLUSH_BEGIN, "FLUSH_BEGIN"),
            (EVENT_FLUSH_COMPLETED, "FLUSH_COMPLETED"),
            (EVENT_COMPACTION_BEGIN, "COMPACTION_BEGIN"),
            (EVENT_COMPACTION_COMPLETED, "COMPACTION_COMPLETED"),
            (EVENT_SUBCOMPACTION_BEGIN, "SUBCOMPACTION_BEGIN"),
            (EVENT_SUBCOMPACTION_COMPLETED, "SUBCOMPACTION_COMPLETED"),
            (EVENT_TASK_BEGIN, "TASK_BEGIN"),
            (EVENT_TASK_END, "TASK_END"),
            (EVENT_BACKGROUND_ERROR, "BACKGROUND_ERROR"),
        ] {
            assert_eq!(i64::from(v), constant(&format!("ROCKS_ENV_EVENT_{name} ")), "{name}");
        }
    }

    #[test]
    fn unknown_numbers_decode_conservatively() {
        let r = Request::decode(&RawRequest { size: 5, op: 200, file_kind: 99, io_activity: 7, piece: 0 });
        assert_eq!(
            (r.op.request_type(), r.file, r.activity),
            (RequestType::Metadata, FileKind::Other, Activity::Other)
        );
        // Data ops never become key-value types.
        for op in FileOp::ALL {
            assert!(op.request_type() <= RequestType::Metadata, "{op:?}");
        }
    }
}
