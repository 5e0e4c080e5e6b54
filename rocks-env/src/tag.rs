//! What the calling thread is doing for RocksDB: the one place that knows.
//!
//! RocksDB runs flushes and compactions on process-wide pool threads shared
//! by every DB. The shim reports, on the thread concerned, when a task a DB
//! scheduled starts and ends and when a job or subcompaction begins and
//! completes; [`DbIo`](crate::io::DbIo) records that here. Every tag carries
//! the id of the DB it belongs to, so a thread's tag never applies to
//! another DB's I/O, and a task's end clears whatever its jobs left behind
//! (RocksDB skips the completion callbacks of failed jobs and of every job
//! once shutdown starts).

use std::cell::Cell;

use kv_stage::{Reason, RequestContext};

/// The job running on a thread: its DB, RocksDB's job id, its context and
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct JobTag {
    pub(crate) db: u64,
    pub(crate) job_id: i32,
    pub(crate) context: RequestContext,
    pub(crate) reason: Reason,
}

struct ThreadTags {
    /// The DB whose scheduled task runs on this thread (0: none).
    task_db: Cell<u64>,
    job: Cell<Option<JobTag>>,
    /// A subcompaction on this thread (it may be a compaction's own thread).
    sub: Cell<Option<JobTag>>,
}

thread_local! {
    /// The client (tenant) this thread's foreground requests are done for,
    /// by context id (0: none); statistics only, see [`ClientScope`].
    static CLIENT: Cell<u16> = const { Cell::new(0) };
    static TAGS: ThreadTags = const {
        ThreadTags { task_db: Cell::new(0), job: Cell::new(None), sub: Cell::new(None) }
    };
}

/// The request context and reason of a job of `db` running on this thread,
/// if any (a subcompaction before the compaction it belongs to).
#[inline]
pub(crate) fn job_context(db: u64) -> Option<(RequestContext, Reason)> {
    TAGS.try_with(|t| {
        let mine = |j: Option<JobTag>| j.filter(|j| j.db == db).map(|j| (j.context, j.reason));
        mine(t.sub.get()).or_else(|| mine(t.job.get()))
    })
    .ok()
    .flatten()
}

/// Whether this thread runs a background task `db` scheduled.
#[inline]
pub(crate) fn in_task(db: u64) -> bool {
    TAGS.try_with(|t| t.task_db.get() == db).unwrap_or(false)
}

/// A job begins on this thread; returns the tag it replaces (a job whose
/// completion was never reported).
pub(crate) fn begin_job(tag: JobTag) -> Option<JobTag> {
    TAGS.try_with(|t| t.job.replace(Some(tag))).ok().flatten()
}

/// The job `job_id` of `db` completed on this thread.
pub(crate) fn end_job(db: u64, job_id: i32) {
    let _ = TAGS.try_with(|t| {
        if t.job.get().is_some_and(|j| j.db == db && j.job_id == job_id) {
            t.job.set(None);
        }
    });
}

/// Clears this thread's job tag if it is `db`'s; returns it.
pub(crate) fn take_job(db: u64) -> Option<JobTag> {
    TAGS.try_with(|t| match t.job.get() {
        Some(j) if j.db == db => t.job.take(),
        _ => None,
    })
    .ok()
    .flatten()
}

pub(crate) fn begin_subjob(tag: JobTag) {
    let _ = TAGS.try_with(|t| t.sub.set(Some(tag)));
}

pub(crate) fn end_subjob(db: u64) {
    let _ = TAGS.try_with(|t| {
        if t.sub.get().is_some_and(|j| j.db == db) {
            t.sub.set(None);
        }
    });
}

/// A task of `db` starts on this thread: whatever an earlier task left is
/// cleared.
pub(crate) fn begin_task(db: u64) {
    let _ = TAGS.try_with(|t| {
        t.task_db.set(db);
        t.job.set(None);
        t.sub.set(None);
    });
}

/// The task of `db` on this thread ended; returns the job tag it left
/// (a job whose completion was never reported).
pub(crate) fn end_task(db: u64) -> Option<JobTag> {
    TAGS.try_with(|t| {
        if t.task_db.get() == db {
            t.task_db.set(0);
        }
        t.sub.set(None);
        match t.job.get() {
            Some(j) if j.db == db => t.job.take(),
            _ => None,
        }
    })
    .ok()
    .flatten()
}

/// The client this thread's foreground file I/O is done for, if a
/// [`ClientScope`] set one.
#[inline]
pub(crate) fn client() -> Option<RequestContext> {
    match CLIENT.try_with(Cell::get) {
        Ok(0) | Err(_) => None,
        Ok(id) => RequestContext::from_id(id),
    }
}

/// Marks the calling thread's RocksDB calls as done for a client (a
/// tenant), for statistics: their file I/O keeps its context (foreground,
/// unless a [`ContextScope`](kv_stage::ContextScope) set another) for
/// enforcement, so a tenant's limit at the key-value layer is not charged
/// again for the WAL appends and table reads of its calls, and client
/// bandwidth stays foreground's for controllers such as SILK; and
/// [`StagedDb::client_io`](crate::StagedDb::client_io) counts that file I/O
/// by client. Restores the previous client on drop.
///
/// This is what kv-async's `AsyncDb` does on the blocking thread of each
/// call.
///
/// ```
/// use kv_stage::RequestContext;
/// use rocks_env::ClientScope;
/// let tenant = RequestContext::register("client_scope_doc").unwrap();
/// {
///     let _client = ClientScope::enter(tenant);
///     // RocksDB calls here: enforced as foreground, counted for `tenant`.
///     assert_eq!(RequestContext::current(), RequestContext::FOREGROUND);
/// }
/// ```
#[must_use = "the client is set until the scope is dropped"]
pub struct ClientScope {
    previous: u16,
    /// A thread's scope: not `Send`.
    _thread: std::marker::PhantomData<*const ()>,
}

impl ClientScope {
    /// Sets `client` on this thread until the scope drops.
    pub fn enter(client: RequestContext) -> ClientScope {
        let previous = CLIENT.try_with(|c| c.replace(client.id())).unwrap_or(0);
        ClientScope { previous, _thread: std::marker::PhantomData }
    }
}

impl Drop for ClientScope {
    fn drop(&mut self) {
        let _ = CLIENT.try_with(|c| c.set(self.previous));
    }
}

impl std::fmt::Debug for ClientScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientScope").field("client", &client()).finish()
    }
}
