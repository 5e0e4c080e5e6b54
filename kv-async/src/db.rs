//! The async handle over a [`StagedDb`].

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use arc_swap::ArcSwapOption;

use kv_stage::{Context, InstanceId, RequestContext, RequestType, Stage, object::BatchPlan};
use rocks_env::{ClientScope, StagedDb};
use rocksdb::{DB, Direction, IteratorMode, WriteBatch, WriteOptions};
use tokio::sync::{Notify, Semaphore};

use crate::batch::{BatchStats, Counters, Queue, Writer};

/// Entries a [`Scan`] reads per RocksDB call (and per enforcement).
pub const SCAN_CHUNK: usize = 256;

/// The default size of the blocking pool: RocksDB calls in flight at once.
pub const DEFAULT_BLOCKING_THREADS: usize = 8;

/// A single-key write a batch can hold.
pub(crate) enum WriteOp {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

/// The DB while it is open; empty once [`AsyncDb::close`] took it.
type Slot = Arc<ArcSwapOption<StagedDb>>;

/// Writes a batch of single-key writes as one RocksDB write batch.
pub(crate) struct DbWriter {
    db: Slot,
    options: WriteOptions,
}

impl Writer for DbWriter {
    type Op = WriteOp;
    fn write(&self, ops: &[WriteOp]) -> io::Result<()> {
        let db = self.db.load_full().ok_or_else(closed)?;
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                WriteOp::Put(k, v) => batch.put(k, v),
                WriteOp::Delete(k) => batch.delete(k),
            }
        }
        db.write_opt(batch, &self.options).map_err(rocksdb_error)
    }
}

/// Runs a close on a runtime of its own, for code outside one; inside a
/// runtime, an error (blocking there would stall its worker).
pub(crate) fn outside_a_runtime(close: impl Future<Output = io::Result<CloseReport>>) -> io::Result<CloseReport> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(io::Error::other("close_blocking inside an async runtime: use close().await"));
    }
    tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(close)
}

/// The error of a call made (or still waiting) once the handle is closing.
fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "the AsyncDb is closed (AsyncDb::close was called)")
}

struct Inner {
    db: Slot,
    stage: Arc<Stage>,
    instance: InstanceId,
    path: PathBuf,
    blocking_threads: usize,
    /// Set by `close`: calls waiting for admission fail, new ones too.
    closing: AtomicBool,
    close_notify: Notify,
    /// Calls that failed because the handle was closing.
    refused_closing: AtomicU64,
    writer: Arc<DbWriter>,
    pool: Arc<Semaphore>,
    /// One batching queue per batch object and request context; few, so a
    /// list is searched (by two integers, no hashing).
    queues: Mutex<Vec<Arc<Queue<DbWriter>>>>,
    counters: Arc<Counters>,
}

/// Builds an [`AsyncDb`].
pub struct AsyncDbBuilder {
    db: Arc<StagedDb>,
    blocking_threads: usize,
    sync: bool,
}

impl std::fmt::Debug for AsyncDbBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDbBuilder")
            .field("blocking_threads", &self.blocking_threads)
            .field("sync", &self.sync)
            .finish_non_exhaustive()
    }
}

impl AsyncDbBuilder {
    /// At most `n` RocksDB calls run at once, each on a thread of tokio's
    /// blocking pool (default [`DEFAULT_BLOCKING_THREADS`]). Callers beyond
    /// wait asynchronously for a turn.
    pub fn blocking_threads(mut self, n: usize) -> Self {
        self.blocking_threads = n.max(1);
        self
    }

    /// Writes are synced to the WAL before they complete (default `true`:
    /// a completed put survives a power cut).
    pub fn sync_writes(mut self, sync: bool) -> Self {
        self.sync = sync;
        self
    }

    /// The handle.
    pub fn build(self) -> AsyncDb {
        let mut options = WriteOptions::default();
        options.set_sync(self.sync);
        let (stage, instance, path) = (Arc::clone(self.db.stage()), self.db.instance(), self.db.path().to_owned());
        let db: Slot = Arc::new(ArcSwapOption::from(Some(self.db)));
        AsyncDb {
            inner: Arc::new(Inner {
                writer: Arc::new(DbWriter { db: Arc::clone(&db), options }),
                db,
                stage,
                instance,
                path,
                blocking_threads: self.blocking_threads,
                closing: AtomicBool::new(false),
                close_notify: Notify::new(),
                refused_closing: AtomicU64::new(0),
                pool: Arc::new(Semaphore::new(self.blocking_threads)),
                queues: Mutex::new(Vec::new()),
                counters: Arc::new(Counters::default()),
            }),
        }
    }
}

/// An async handle over a [`StagedDb`], for tokio services.
///
/// Every call is enforced first at the key-value layer, through the DB's
/// stage, with [`Stage::enforce_async`]: a throttled tenant's call waits as a
/// future and its worker thread serves other tasks meanwhile. The request's
/// context is the calling task's ([`scope`](crate::scope)). The RocksDB
/// call then runs on tokio's blocking pool, at most
/// [`blocking_threads`](AsyncDbBuilder::blocking_threads) at once.
///
/// **What a tenant's limit charges.** Each call is one request of its
/// tenant's context, charged once, at this layer: a put costs key + value
/// bytes, a delete its key's, a write batch its serialized size; a get and
/// a multi-get are admitted at their keys' bytes and each chunk of a scan
/// ([`SCAN_CHUNK`] entries) at its start key's (at least 1 byte), and then
/// charged the bytes they returned (values; keys and values for a scan),
/// so a bytes/s limit bounds reads too (a large read puts the bucket in
/// debt and the tenant's next request waits for it). The
/// file I/O RocksDB does for the call (its WAL append, its table reads) is
/// not the tenant's again: it is enforced as `foreground` (client work, as
/// SILK counts it) and counted per tenant in
/// [`StagedDb::client_io`](rocks_env::StagedDb::client_io).
///
/// Puts and deletes that reach a [`batch`](kv_stage::object::Batch) object are
/// grouped (see the crate documentation): a batch is one RocksDB write
/// batch with one WAL sync, each caller gets its batch's result.
///
/// Cancelling a call (dropping its future) while it waits for admission
/// gives its place back and nothing is done; once its RocksDB call has
/// started, or its write has joined a batch, the write is carried out
/// whether or not anyone waits for the result.
#[derive(Clone)]
pub struct AsyncDb {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AsyncDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncDb").field("path", &self.inner.path).finish_non_exhaustive()
    }
}

impl AsyncDb {
    /// A handle with the default settings (8 blocking threads, synced
    /// writes).
    pub fn new(db: Arc<StagedDb>) -> Self {
        Self::builder(db).build()
    }

    /// Starts building a handle.
    pub fn builder(db: Arc<StagedDb>) -> AsyncDbBuilder {
        AsyncDbBuilder { db, blocking_threads: DEFAULT_BLOCKING_THREADS, sync: true }
    }

    /// The DB; `None` once [`close`](Self::close) took it.
    pub fn db(&self) -> Option<Arc<StagedDb>> {
        self.inner.db.load_full()
    }

    /// The stage the DB enforces through.
    pub fn stage(&self) -> &Arc<Stage> {
        &self.inner.stage
    }

    /// Batching statistics so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.counters.snapshot()
    }

    fn context(&self, t: RequestType, size: usize) -> Context {
        Context::new(t, size as u64).in_context(crate::current()).in_instance(self.inner.instance)
    }

    /// Admits a call through the stage; fails at once, or while it waits,
    /// when the handle closes.
    async fn admit(&self, ctx: Context) -> io::Result<Option<BatchPlan>> {
        let refuse = || {
            self.inner.refused_closing.fetch_add(1, Ordering::Relaxed);
            Err(closed())
        };
        if self.inner.closing.load(Ordering::Acquire) {
            return refuse();
        }
        let mut enforce = std::pin::pin!(self.stage().enforce_async(ctx));
        // The common case, admitted at the first poll: nothing to wait for,
        // so no close to listen for (and no lock taken to listen).
        let first = std::future::poll_fn(|cx| Poll::Ready(enforce.as_mut().poll(cx))).await;
        if let Poll::Ready(outcome) = first {
            return Ok(outcome.map_err(io::Error::from)?.batch);
        }
        let notified = self.inner.close_notify.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the flag is read: a close in between is seen.
        notified.as_mut().enable();
        if self.inner.closing.load(Ordering::Acquire) {
            return refuse();
        }
        // The close first: closing the DB's instance on the stage (when the
        // DB drops) admits its waiters, and one admitted that way must not
        // go on as if the limit had let it through. Either way the
        // enforcement future dropped gives its place back, uncharged.
        tokio::select! {
            biased;
            () = notified => refuse(),
            outcome = enforce => Ok(outcome.map_err(io::Error::from)?.batch),
        }
    }

    /// Runs `f` on the bounded blocking pool, its file I/O done for client
    /// `context` ([`ClientScope`]: enforced as foreground, counted per
    /// client in [`StagedDb::client_io`]).
    async fn blocking<R, F>(&self, context: RequestContext, f: F) -> io::Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&StagedDb) -> Result<R, rocksdb::Error> + Send + 'static,
    {
        let permit = Arc::clone(&self.inner.pool).acquire_owned().await.map_err(|_| closed())?;
        let db = self.inner.db.load_full().ok_or_else(closed)?;
        tokio::task::spawn_blocking(move || {
            // Dropped in reverse order: the DB before the permit, so a close
            // that has every permit back holds the last reference.
            let _permit = permit;
            let db = db;
            let _client = ClientScope::enter(context);
            f(&db)
        })
        .await
        .map_err(|e| io::Error::other(format!("the RocksDB call did not complete: {e}")))?
        .map_err(rocksdb_error)
    }

    fn queue(&self, plan: BatchPlan, context: RequestContext) -> Arc<Queue<DbWriter>> {
        let mut queues = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = queues.iter().find(|q| q.object == plan.object && q.context == context) {
            return Arc::clone(q);
        }
        let q = Queue::new(
            plan,
            context,
            Arc::clone(&self.inner.writer),
            Arc::clone(&self.inner.pool),
            Arc::clone(&self.inner.counters),
        );
        queues.push(Arc::clone(&q));
        q
    }

    async fn single_write(&self, ctx: Context, op: WriteOp) -> io::Result<()> {
        match self.admit(ctx).await? {
            Some(plan) => self.queue(plan, ctx.context).submit(plan, op, ctx.size).await,
            None => {
                let writer = Arc::clone(&self.inner.writer);
                self.blocking(ctx.context, move |db| match op {
                    WriteOp::Put(k, v) => db.put_opt(k, v, &writer.options),
                    WriteOp::Delete(k) => db.delete_opt(k, &writer.options),
                })
                .await
            }
        }
    }

    /// Stores a value.
    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> io::Result<()> {
        let (key, value) = (key.into(), value.into());
        let ctx = self.context(RequestType::Put, key.len() + value.len());
        self.single_write(ctx, WriteOp::Put(key, value)).await
    }

    /// Deletes a key.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> io::Result<()> {
        let key = key.into();
        let ctx = self.context(RequestType::Delete, key.len());
        self.single_write(ctx, WriteOp::Delete(key)).await
    }

    /// Applies a write batch atomically (never grouped with others: it is a
    /// batch already).
    pub async fn write(&self, batch: WriteBatch) -> io::Result<()> {
        let ctx = self.context(RequestType::WriteBatch, batch.size_in_bytes());
        self.admit(ctx).await?;
        let writer = Arc::clone(&self.inner.writer);
        self.blocking(ctx.context, move |db| db.write_opt(batch, &writer.options)).await
    }

    /// Reads a value. Admitted at its key's size, then charged the value's
    /// bytes ([`Stage::charge`]).
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> io::Result<Option<Vec<u8>>> {
        let key = key.into();
        let ctx = self.context(RequestType::Get, read_size(key.len()));
        self.admit(ctx).await?;
        let value = self.blocking(ctx.context, move |db| db.get(&key)).await?;
        self.stage().charge(&ctx, value.as_ref().map_or(0, |v| v.len() as u64));
        Ok(value)
    }

    /// Reads several values in one RocksDB call; fails if any read fails.
    /// One request, admitted at its keys' size, then charged the values'
    /// bytes.
    pub async fn multi_get(&self, keys: Vec<Vec<u8>>) -> io::Result<Vec<Option<Vec<u8>>>> {
        let ctx = self.context(RequestType::MultiGet, read_size(keys.iter().map(Vec::len).sum()));
        self.admit(ctx).await?;
        let values: Vec<Option<Vec<u8>>> =
            self.blocking(ctx.context, move |db| db.multi_get(&keys).into_iter().collect()).await?;
        self.stage().charge(&ctx, values.iter().flatten().map(|v| v.len() as u64).sum());
        Ok(values)
    }

    /// The entries from `start` on, in key order, as a stream. Read
    /// [`SCAN_CHUNK`] entries per RocksDB call, each call enforced as a
    /// `scan` request of the calling task's context; not a snapshot (each
    /// chunk sees the DB as it is then).
    pub fn scan(&self, start: impl Into<Vec<u8>>) -> Scan {
        self.scan_as(crate::current(), start.into())
    }

    /// A scan whose chunks are `context`'s requests.
    pub(crate) fn scan_as(&self, context: RequestContext, start: Vec<u8>) -> Scan {
        Scan { db: self.clone(), context, next: Some((start, true)), buffered: VecDeque::new(), fetching: None }
    }

    /// Reads one chunk: up to `SCAN_CHUNK` entries from `from` (inclusive or
    /// not); `None` as the next start when the chunk reached the end.
    async fn scan_chunk(self, context: RequestContext, from: Vec<u8>, inclusive: bool) -> io::Result<Chunk> {
        let ctx = Context::new(RequestType::Scan, read_size(from.len()) as u64)
            .in_context(context)
            .in_instance(self.inner.instance);
        self.admit(ctx).await?;
        let chunk = self.blocking(context, move |db| read_chunk(db, &from, inclusive)).await?;
        self.stage().charge(&ctx, chunk.0.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum());
        Ok(chunk)
    }
}

/// A read's admission size: its key bytes, at least 1, so that it waits
/// behind what earlier reads were charged (a request of 0 bytes passes a
/// bytes limiter at once, as file metadata requests must).
pub(crate) fn read_size(key_bytes: usize) -> usize {
    key_bytes.max(1)
}

/// A key and its value.
pub(crate) type Entry = (Vec<u8>, Vec<u8>);
type Chunk = (Vec<Entry>, bool);

fn read_chunk(db: &DB, from: &[u8], inclusive: bool) -> Result<Chunk, rocksdb::Error> {
    let mut out = Vec::with_capacity(SCAN_CHUNK);
    let mut it = db.iterator(IteratorMode::From(from, Direction::Forward));
    while out.len() < SCAN_CHUNK {
        match it.next() {
            None => return Ok((out, true)),
            Some(r) => {
                let (k, v) = r?;
                if !inclusive && out.is_empty() && &*k == from {
                    continue;
                }
                out.push((k.into_vec(), v.into_vec()));
            }
        }
    }
    Ok((out, false))
}

type ChunkFuture = Pin<Box<dyn Future<Output = io::Result<Chunk>> + Send>>;

/// The stream of [`AsyncDb::scan`]: `io::Result<(key, value)>` items in key
/// order; ends after the last entry or after the first error.
#[must_use = "a stream does nothing unless polled"]
pub struct Scan {
    db: AsyncDb,
    context: RequestContext,
    /// Where the next chunk starts, and whether that key is included;
    /// `None` once the end (or an error) was reached.
    next: Option<(Vec<u8>, bool)>,
    buffered: VecDeque<Entry>,
    fetching: Option<ChunkFuture>,
}

impl std::fmt::Debug for Scan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scan").field("buffered", &self.buffered.len()).finish_non_exhaustive()
    }
}

impl futures_core::Stream for Scan {
    type Item = io::Result<Entry>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(e) = this.buffered.pop_front() {
                return Poll::Ready(Some(Ok(e)));
            }
            if let Some(f) = &mut this.fetching {
                let r = std::task::ready!(f.as_mut().poll(cx));
                this.fetching = None;
                match r {
                    Ok((entries, end)) => {
                        this.next = match (end, entries.last()) {
                            (false, Some((k, _))) => Some((k.clone(), false)),
                            _ => None,
                        };
                        this.buffered.extend(entries);
                        continue;
                    }
                    Err(e) => {
                        this.next = None;
                        return Poll::Ready(Some(Err(e)));
                    }
                }
            }
            let Some((from, inclusive)) = this.next.take() else { return Poll::Ready(None) };
            this.fetching = Some(Box::pin(this.db.clone().scan_chunk(this.context, from, inclusive)));
        }
    }
}

impl Scan {
    /// The next entry, without a stream helper crate (`StreamExt::next`
    /// does the same): `None` after the last entry or after an error.
    ///
    /// ```no_run
    /// # async fn f(db: kv_async::AsyncDb) -> std::io::Result<()> {
    /// let mut scan = db.scan(b"user".to_vec());
    /// while let Some(entry) = scan.next().await {
    ///     let (key, value) = entry?;
    ///     if !key.starts_with(b"user") {
    ///         break;
    ///     }
    ///     println!("{} bytes", value.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn next(&mut self) -> Option<io::Result<Entry>> {
        std::future::poll_fn(|cx| futures_core::Stream::poll_next(Pin::new(&mut *self), cx)).await
    }
}

/// What [`AsyncDb::close`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloseReport {
    /// Every call admitted before the close finished within the grace.
    pub drained: bool,
    /// Calls that failed because the handle was closing: those waiting
    /// for admission when it began (a tenant held at its limit), and any
    /// made after.
    pub refused: u64,
    /// RocksDB is closed: this close held the last reference to the DB.
    /// `false` when the application keeps an `Arc<StagedDb>` of its own, or
    /// a call still ran when the grace ended; RocksDB then closes when the
    /// last of them lets go.
    pub db_closed: bool,
}

impl AsyncDb {
    /// Closes the handle, and RocksDB with it:
    ///
    /// 1. calls waiting for admission (a tenant held by its limiter, even at
    ///    rate 0) fail with `ConnectionAborted`, as does every later call,
    ///    on every clone of this handle;
    /// 2. calls already admitted (RocksDB calls running or queued for the
    ///    blocking pool, batches being written, blocking-API calls) finish,
    ///    for at most `grace` in all;
    /// 3. the DB is taken from the handle and dropped on a blocking thread,
    ///    not on the async worker calling this: RocksDB flushes nothing it
    ///    does not have to and closes, its own waiters in the stage are let
    ///    through (see [`StagedDb`]).
    ///
    /// Returns once that is done; a second call finds the handle closed and
    /// reports nothing more to do. Writes acknowledged before the close are
    /// in the WAL (synced, by default: see
    /// [`sync_writes`](AsyncDbBuilder::sync_writes)).
    ///
    /// ```no_run
    /// # async fn f(db: kv_async::AsyncDb) -> std::io::Result<()> {
    /// let report = db.close(std::time::Duration::from_secs(5)).await?;
    /// assert!(report.db_closed, "something else still holds the DB");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self, grace: Duration) -> io::Result<CloseReport> {
        let deadline = tokio::time::Instant::now() + grace;
        let inner = &self.inner;
        inner.closing.store(true, Ordering::Release);
        inner.close_notify.notify_waiters();
        // Every permit back: the calls admitted before (queued for the pool
        // in FIFO order, ahead of this) have finished.
        let n = u32::try_from(inner.blocking_threads).unwrap_or(u32::MAX);
        let drained = match tokio::time::timeout(grace, inner.pool.acquire_many(n)).await {
            Ok(Ok(permits)) => {
                permits.forget();
                true
            }
            Ok(Err(_)) => true, // closed by an earlier close
            Err(_) => false,
        };
        inner.pool.close();
        let db_closed = match inner.db.swap(None) {
            Some(db) => {
                // A blocking-API call still inside RocksDB holds the DB too:
                // let it finish, within the grace.
                while Arc::strong_count(&db) > 1 && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let last = Arc::strong_count(&db) == 1;
                tokio::task::spawn_blocking(move || drop(db))
                    .await
                    .map_err(|e| io::Error::other(format!("closing RocksDB did not complete: {e}")))?;
                last
            }
            None => false,
        };
        Ok(CloseReport { drained, refused: inner.refused_closing.load(Ordering::Relaxed), db_closed })
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }

    /// [`close`](Self::close) for code outside an async runtime: runs it on
    /// a runtime of its own. Inside a runtime, an error (use `close().await`).
    pub fn close_blocking(&self, grace: Duration) -> io::Result<CloseReport> {
        outside_a_runtime(self.close(grace))
    }

    /// A call of the blocking API ([`Tenant`](crate::Tenant)'s `*_blocking`
    /// methods): admission waits on the calling thread (a closing DB lets
    /// it go, and it fails), then `f` runs on it, its file I/O done for
    /// `ctx.context`; `charge` says what to charge after.
    pub(crate) fn call_blocking<R>(
        &self,
        ctx: Context,
        f: impl FnOnce(&StagedDb) -> Result<R, rocksdb::Error>,
        charge: impl FnOnce(&R) -> u64,
    ) -> io::Result<R> {
        let refuse = || {
            self.inner.refused_closing.fetch_add(1, Ordering::Relaxed);
            Err(closed())
        };
        if self.inner.closing.load(Ordering::Acquire) {
            return refuse();
        }
        self.stage().enforce(&ctx).map_err(io::Error::from)?;
        // Let go by the DB's close (its instance closed on the stage)?
        if self.inner.closing.load(Ordering::Acquire) {
            return refuse();
        }
        let db = self.inner.db.load_full().ok_or_else(closed)?;
        let r = {
            let _client = ClientScope::enter(ctx.context);
            f(&db).map_err(rocksdb_error)?
        };
        self.stage().charge(&ctx, charge(&r));
        Ok(r)
    }

    /// The context of a call of `context` (the blocking API's, which has no
    /// task-local).
    pub(crate) fn context_of(&self, context: RequestContext, t: RequestType, size: usize) -> Context {
        Context::new(t, size as u64).in_context(context).in_instance(self.inner.instance)
    }

    /// The write options of the handle's writes.
    pub(crate) fn write_options(&self) -> &WriteOptions {
        &self.inner.writer.options
    }

    /// Collects a whole [`scan`](Self::scan) of at most `limit` entries.
    pub async fn scan_collect(&self, start: impl Into<Vec<u8>>, limit: usize) -> io::Result<Vec<Entry>> {
        let mut scan = self.scan(start);
        let mut out = Vec::new();
        while out.len() < limit {
            match scan.next().await {
                Some(r) => out.push(r?),
                None => break,
            }
        }
        Ok(out)
    }
}

/// A RocksDB error as an I/O error of a kind a caller can match on (the
/// `rocksdb::Error` inside, for `downcast_ref`): `NotFound`,
/// `InvalidData` (corruption), `InvalidInput`, `Unsupported`, `TimedOut`,
/// `ResourceBusy` (busy, try again), `ConnectionAborted` (shutting down),
/// `Other` for the rest (an I/O error, an incomplete or aborted call).
pub(crate) fn rocksdb_error(e: rocksdb::Error) -> io::Error {
    use rocksdb::ErrorKind as R;
    let kind = match e.kind() {
        R::NotFound => io::ErrorKind::NotFound,
        R::Corruption => io::ErrorKind::InvalidData,
        R::InvalidArgument => io::ErrorKind::InvalidInput,
        R::NotSupported => io::ErrorKind::Unsupported,
        R::TimedOut => io::ErrorKind::TimedOut,
        R::Busy | R::TryAgain => io::ErrorKind::ResourceBusy,
        R::ShutdownInProgress => io::ErrorKind::ConnectionAborted,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}
