//! The async handle over a [`StagedDb`].

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};

use kv_stage::{BatchPlan, Context, ContextScope, RequestContext, RequestType, Stage};
use rocks_env::StagedDb;
use rocksdb::{DB, Direction, IteratorMode, WriteBatch, WriteOptions};
use tokio::sync::Semaphore;

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

/// Writes a batch of single-key writes as one RocksDB write batch.
pub(crate) struct DbWriter {
    db: Arc<StagedDb>,
    options: WriteOptions,
}

impl Writer for DbWriter {
    type Op = WriteOp;
    fn write(&self, ops: &[WriteOp]) -> io::Result<()> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                WriteOp::Put(k, v) => batch.put(k, v),
                WriteOp::Delete(k) => batch.delete(k),
            }
        }
        self.db.write_opt(batch, &self.options).map_err(rocksdb_error)
    }
}

struct Inner {
    db: Arc<StagedDb>,
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
        AsyncDb {
            inner: Arc::new(Inner {
                writer: Arc::new(DbWriter { db: Arc::clone(&self.db), options }),
                db: self.db,
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
/// [`blocking_threads`](AsyncDbBuilder::blocking_threads) at once, with the
/// context set on that thread so the call's file I/O (WAL appends, table
/// reads) is tagged with it too.
///
/// Request sizes, as the stage sees them: a put costs key + value bytes, a
/// delete and a get their key's, a multi-get its keys', a write batch its
/// serialized size, each chunk of a scan 0 (its size is not known before
/// it runs).
///
/// Puts and deletes that reach a [`batch`](kv_stage::Batch) object are
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
        f.debug_struct("AsyncDb").field("path", &self.inner.db.path()).finish_non_exhaustive()
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

    /// The DB.
    pub fn db(&self) -> &Arc<StagedDb> {
        &self.inner.db
    }

    /// The stage the DB enforces through.
    pub fn stage(&self) -> &Arc<Stage> {
        self.inner.db.stage()
    }

    /// Batching statistics so far.
    pub fn batch_stats(&self) -> BatchStats {
        self.inner.counters.snapshot()
    }

    fn context(&self, t: RequestType, size: usize) -> Context {
        Context::new(t, size as u64).in_context(crate::current()).in_instance(self.inner.db.instance())
    }

    async fn admit(&self, ctx: Context) -> io::Result<Option<BatchPlan>> {
        let outcome = self.stage().enforce_async(ctx).await.map_err(io::Error::from)?;
        Ok(outcome.batch)
    }

    /// Runs `f` on the bounded blocking pool with `context` on the thread.
    async fn blocking<R, F>(&self, context: RequestContext, f: F) -> io::Result<R>
    where
        R: Send + 'static,
        F: FnOnce(&StagedDb) -> Result<R, rocksdb::Error> + Send + 'static,
    {
        let permit = Arc::clone(&self.inner.pool)
            .acquire_owned()
            .await
            .map_err(|_| io::Error::other("the blocking pool is closed"))?;
        let db = Arc::clone(&self.inner.db);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let _scope = ContextScope::enter(context);
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

    /// Reads a value.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> io::Result<Option<Vec<u8>>> {
        let key = key.into();
        let ctx = self.context(RequestType::Get, key.len());
        self.admit(ctx).await?;
        self.blocking(ctx.context, move |db| db.get(&key)).await
    }

    /// Reads several values in one RocksDB call; fails if any read fails.
    pub async fn multi_get(&self, keys: Vec<Vec<u8>>) -> io::Result<Vec<Option<Vec<u8>>>> {
        let ctx = self.context(RequestType::MultiGet, keys.iter().map(Vec::len).sum());
        self.admit(ctx).await?;
        self.blocking(ctx.context, move |db| db.multi_get(&keys).into_iter().collect()).await
    }

    /// The entries from `start` on, in key order, as a stream. Read
    /// [`SCAN_CHUNK`] entries per RocksDB call, each call enforced as a
    /// `scan` request of the calling task's context; not a snapshot (each
    /// chunk sees the DB as it is then).
    pub fn scan(&self, start: impl Into<Vec<u8>>) -> Scan {
        Scan {
            db: self.clone(),
            context: crate::current(),
            next: Some((start.into(), true)),
            buffered: VecDeque::new(),
            fetching: None,
        }
    }

    /// Reads one chunk: up to `SCAN_CHUNK` entries from `from` (inclusive or
    /// not); `None` as the next start when the chunk reached the end.
    async fn scan_chunk(self, context: RequestContext, from: Vec<u8>, inclusive: bool) -> io::Result<Chunk> {
        let ctx = Context::new(RequestType::Scan, 0).in_context(context).in_instance(self.inner.db.instance());
        self.admit(ctx).await?;
        self.blocking(context, move |db| read_chunk(db, &from, inclusive)).await
    }
}

type Entry = (Vec<u8>, Vec<u8>);
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

impl AsyncDb {
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
