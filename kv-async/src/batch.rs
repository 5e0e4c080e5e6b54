//! Batching of writes, i10-style, behind a stage's `batch` object.
//!
//! One [`Queue`] per batch object and request context (requests of two
//! tenants are never written in one batch, so each batch's file I/O is
//! counted for one tenant). A request joins the queue's collecting batch; the
//! batch is dispatched
//!
//! * when it holds the plan's `requests` requests, or `bytes` bytes;
//! * `timeout` after its first request arrived (kv-stage's timer: tens of
//!   microseconds, where tokio's rounds to a millisecond);
//! * at once, when adaptive and the request found nothing in flight and
//!   nothing collected (a lone request does not wait for company).
//!
//! At most one batch per queue is in flight: that is what keeps a channel's
//! requests in order (batch *n+1* is written after batch *n* completed, and
//! a batch is written in arrival order). While one is written the next
//! collects; when it completes, the next goes if it met a threshold or its
//! timeout passed meanwhile, else its timer sends it.
//!
//! The thresholds are also caps: a batch holds at most `requests`
//! requests and at most `bytes` bytes (a single larger request goes
//! alone). Requests that arrived while one batch was in flight and do not
//! fit in the next stay collecting and go right after it, in order.
//!
//! A batch is one unit: written with one call (for RocksDB one write batch,
//! one WAL append and, for durable writes, one sync), and its result, success
//! or the error, reaches every request in it and no other.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kv_stage::{RequestContext, object::BatchPlan};
use rocks_env::ClientScope;
use tokio::sync::{Semaphore, oneshot};

/// What writes a dispatched batch (blocking; run on the bounded pool).
pub(crate) trait Writer: Send + Sync + 'static {
    /// One request of a batch.
    type Op: Send + 'static;
    /// Writes `ops` in order, as one unit.
    fn write(&self, ops: &[Self::Op]) -> io::Result<()>;
}

/// Why a batch was dispatched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Requests,
    Bytes,
    Timeout,
    Idle,
}

/// Batching statistics of an [`AsyncDb`](crate::AsyncDb), cumulative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Batches written (or failed).
    pub batches: u64,
    /// Requests in them.
    pub requests: u64,
    /// Dispatched because they reached the request threshold.
    pub by_requests: u64,
    /// ... the byte threshold.
    pub by_bytes: u64,
    /// ... their timeout.
    pub by_timeout: u64,
    /// ... at once, the queue being idle (adaptive).
    pub by_idle: u64,
    /// Batches whose write failed (every request in them got the error).
    pub failed: u64,
    /// Requests in failed batches.
    pub failed_requests: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    batches: AtomicU64,
    requests: AtomicU64,
    by: [AtomicU64; 4],
    failed: AtomicU64,
    failed_requests: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> BatchStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BatchStats {
            batches: l(&self.batches),
            requests: l(&self.requests),
            by_requests: l(&self.by[Trigger::Requests as usize]),
            by_bytes: l(&self.by[Trigger::Bytes as usize]),
            by_timeout: l(&self.by[Trigger::Timeout as usize]),
            by_idle: l(&self.by[Trigger::Idle as usize]),
            failed: l(&self.failed),
            failed_requests: l(&self.failed_requests),
        }
    }
}

struct Entry<Op> {
    op: Op,
    bytes: u64,
    done: oneshot::Sender<io::Result<()>>,
}

struct State<Op> {
    collecting: Vec<Entry<Op>>,
    bytes: u64,
    /// When the first of `collecting` arrived.
    first_at: Instant,
    /// Numbers the collecting batch, so a timer knows whether its batch
    /// is still the one collecting.
    seq: u64,
    in_flight: bool,
    /// The collecting batch's timeout passed while another was in flight.
    overdue: bool,
    plan: BatchPlan,
}

/// The batching queue of one batch object and request context.
pub(crate) struct Queue<W: Writer> {
    pub(crate) object: u32,
    pub(crate) context: RequestContext,
    writer: Arc<W>,
    pool: Arc<Semaphore>,
    counters: Arc<Counters>,
    state: Mutex<State<W::Op>>,
}

impl<W: Writer> Queue<W> {
    pub(crate) fn new(
        plan: BatchPlan,
        context: RequestContext,
        writer: Arc<W>,
        pool: Arc<Semaphore>,
        counters: Arc<Counters>,
    ) -> Arc<Self> {
        Arc::new(Queue {
            object: plan.object,
            context,
            writer,
            pool,
            counters,
            state: Mutex::new(State {
                collecting: Vec::new(),
                bytes: 0,
                first_at: Instant::now(),
                seq: 0,
                in_flight: false,
                overdue: false,
                plan,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<W::Op>> {
        // The state is plain values updated under the lock without calling
        // out: a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds one request and waits for the result of the batch it is
    /// written in. Once submitted, the request is written even if the
    /// returned future is dropped.
    pub(crate) async fn submit(self: &Arc<Self>, plan: BatchPlan, op: W::Op, bytes: u64) -> io::Result<()> {
        let (done, result) = oneshot::channel();
        let (dispatch, arm) = {
            let mut st = self.lock();
            st.plan = plan;
            let first = st.collecting.is_empty();
            if first {
                st.first_at = Instant::now();
            }
            st.collecting.push(Entry { op, bytes, done });
            st.bytes += bytes;
            let trigger = if st.collecting.len() >= plan.requests as usize {
                Some(Trigger::Requests)
            } else if st.bytes >= plan.bytes {
                Some(Trigger::Bytes)
            } else if plan.adaptive && first && !st.in_flight {
                Some(Trigger::Idle)
            } else {
                None
            };
            match trigger {
                Some(t) if !st.in_flight => (Some(self.take(&mut st, t)), None),
                // In flight: the completion sends it.
                Some(_) => (None, None),
                None => (None, first.then_some((st.seq, plan.timeout()))),
            }
        };
        if let Some(batch) = dispatch {
            self.dispatch(batch);
        }
        if let Some((seq, timeout)) = arm {
            let queue = Arc::clone(self);
            tokio::spawn(async move {
                kv_stage::timer::sleep(timeout).await;
                queue.timed_out(seq);
            });
        }
        match result.await {
            Ok(r) => r,
            Err(_) => Err(io::Error::other("the batch was dropped before it was written (the runtime shut down)")),
        }
    }

    /// Takes the collecting batch for dispatch, at most the plan's
    /// `requests` requests and `bytes` bytes of it (at least one request;
    /// the caller holds the lock). What is left over is due: it goes when
    /// this batch completes.
    fn take(&self, st: &mut State<W::Op>, trigger: Trigger) -> Vec<Entry<W::Op>> {
        let (max_requests, max_bytes) = (st.plan.requests.max(1) as usize, st.plan.bytes);
        let (mut n, mut bytes) = (0usize, 0u64);
        for e in &st.collecting {
            if n == max_requests || (n > 0 && bytes.saturating_add(e.bytes) > max_bytes) {
                break;
            }
            n += 1;
            bytes = bytes.saturating_add(e.bytes);
        }
        let rest = st.collecting.split_off(n);
        let batch = std::mem::replace(&mut st.collecting, rest);
        st.in_flight = true;
        st.overdue = !st.collecting.is_empty();
        st.seq += 1;
        st.bytes -= bytes;
        self.counters.by[trigger as usize].fetch_add(1, Ordering::Relaxed);
        batch
    }

    fn timed_out(self: &Arc<Self>, seq: u64) {
        let batch = {
            let mut st = self.lock();
            if st.seq != seq || st.collecting.is_empty() {
                return;
            }
            if st.in_flight {
                st.overdue = true;
                return;
            }
            self.take(&mut st, Trigger::Timeout)
        };
        self.dispatch(batch);
    }

    /// The batch in flight completed: the next goes now if it is due.
    fn completed(self: &Arc<Self>) {
        let batch = {
            let mut st = self.lock();
            st.in_flight = false;
            if st.collecting.is_empty() {
                return;
            }
            let plan = st.plan;
            let trigger = if st.collecting.len() >= plan.requests as usize {
                Trigger::Requests
            } else if st.bytes >= plan.bytes {
                Trigger::Bytes
            } else if st.overdue || st.first_at.elapsed() >= plan.timeout() {
                Trigger::Timeout
            } else {
                return;
            };
            self.take(&mut st, trigger)
        };
        self.dispatch(batch);
    }

    /// Writes a batch on the bounded pool and hands every request its
    /// result; then lets the next batch go.
    fn dispatch(self: &Arc<Self>, batch: Vec<Entry<W::Op>>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime (only while one is being torn down): the requests
            // get "dropped before it was written".
            self.lock().in_flight = false;
            return;
        };
        let queue = Arc::clone(self);
        runtime.spawn(async move {
            // Whatever happens to this task, the queue does not stay "in
            // flight" (a panic or a runtime shutting down).
            struct Completion<W: Writer>(Arc<Queue<W>>);
            impl<W: Writer> Drop for Completion<W> {
                fn drop(&mut self) {
                    self.0.completed();
                }
            }
            let _completion = Completion(Arc::clone(&queue));
            let n = batch.len() as u64;
            let (ops, senders): (Vec<W::Op>, Vec<_>) = batch.into_iter().map(|e| (e.op, e.done)).unzip();
            let result = match Arc::clone(&queue.pool).acquire_owned().await {
                Ok(permit) => {
                    let (writer, context) = (Arc::clone(&queue.writer), queue.context);
                    tokio::task::spawn_blocking(move || {
                        let _permit = permit;
                        let _client = ClientScope::enter(context);
                        writer.write(&ops)
                    })
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(format!("the batch's write did not complete: {e}"))))
                }
                Err(_) => Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the AsyncDb is closed")),
            };
            queue.counters.batches.fetch_add(1, Ordering::Relaxed);
            queue.counters.requests.fetch_add(n, Ordering::Relaxed);
            match result {
                Ok(()) => senders.into_iter().for_each(|s| drop(s.send(Ok(())))),
                Err(e) => {
                    queue.counters.failed.fetch_add(1, Ordering::Relaxed);
                    queue.counters.failed_requests.fetch_add(n, Ordering::Relaxed);
                    for s in senders {
                        let _ = s.send(Err(io::Error::new(e.kind(), format!("a batch of {n} writes failed: {e}"))));
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    //! The queue against an in-memory writer: a mock of RocksDB, used here
    //! because RocksDB cannot fail one write batch alone (a failed WAL write
    //! stops all later writes too). The RocksDB path is tested in
    //! `tests/async_db.rs`.
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    struct Log {
        batches: Mutex<Vec<Vec<u32>>>,
        /// Fail the batch holding this op.
        fail_op: AtomicU64,
        slow: AtomicBool,
    }

    impl Default for Log {
        fn default() -> Self {
            Log { batches: Mutex::default(), fail_op: AtomicU64::new(u64::MAX), slow: AtomicBool::new(false) }
        }
    }

    impl Writer for Log {
        type Op = u32;
        fn write(&self, ops: &[u32]) -> io::Result<()> {
            if self.slow.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.batches.lock().unwrap().push(ops.to_vec());
            if ops.iter().any(|&o| u64::from(o) == self.fail_op.load(Ordering::Relaxed)) {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "no space"));
            }
            Ok(())
        }
    }

    fn plan(requests: u32, timeout: Duration, adaptive: bool) -> BatchPlan {
        BatchPlan { object: 1, requests, bytes: 1 << 20, timeout_ns: timeout.as_nanos() as u32, adaptive }
    }

    fn queue(log: &Arc<Log>, p: BatchPlan) -> (Arc<Queue<Log>>, Arc<Counters>) {
        let counters = Arc::new(Counters::default());
        let q = Queue::new(
            p,
            RequestContext::FOREGROUND,
            Arc::clone(log),
            Arc::new(Semaphore::new(4)),
            Arc::clone(&counters),
        );
        (q, counters)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    #[test]
    fn a_failed_batch_fails_its_requests_and_no_others() {
        let log = Arc::new(Log { fail_op: AtomicU64::new(40), slow: AtomicBool::new(true), ..Default::default() });
        let (q, counters) = queue(&log, plan(16, Duration::from_micros(50), true));
        let results: Vec<(u32, io::Result<()>)> = rt().block_on(async {
            let tasks: Vec<_> = (0..200u32)
                .map(|i| {
                    let q = Arc::clone(&q);
                    tokio::spawn(async move { (i, q.submit(plan(16, Duration::from_micros(50), true), i, 100).await) })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        });
        let batches = log.batches.lock().unwrap().clone();
        let failed: Vec<u32> = batches.iter().find(|b| b.contains(&40)).unwrap().clone();
        assert!(failed.len() > 1, "the failing batch held only {failed:?}: nothing was batched");
        for (i, r) in &results {
            match r {
                Err(e) => {
                    assert!(failed.contains(i), "{i} failed but was not in the failed batch");
                    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
                    assert!(
                        e.to_string().contains(&format!("a batch of {} writes failed: no space", failed.len())),
                        "{e}"
                    );
                }
                Ok(()) => assert!(!failed.contains(i), "{i} was in the failed batch but succeeded"),
            }
        }
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 200, "a request was written twice or never");
        let s = counters.snapshot();
        assert_eq!((s.requests, s.failed, s.failed_requests), (200, 1, failed.len() as u64));
        assert_eq!(s.batches as usize, batches.len());
    }

    #[test]
    fn batches_are_capped_at_the_thresholds_and_the_rest_follows_in_order() {
        // A 2 ms write and 2,000 submitters: without the cap the second
        // batch held everything that arrived during the first.
        let log = Arc::new(Log { slow: AtomicBool::new(true), ..Default::default() });
        let p = BatchPlan { bytes: 4096, ..plan(16, Duration::from_micros(50), true) };
        let (q, counters) = queue(&log, p);
        rt().block_on(async {
            let tasks: Vec<_> = (0..2000u32)
                .map(|i| {
                    let q = Arc::clone(&q);
                    // Every tenth request is 1 KiB, the others 100 bytes.
                    tokio::spawn(async move { q.submit(p, i, if i % 10 == 0 { 1024 } else { 100 }).await })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().unwrap();
            }
        });
        let batches = log.batches.lock().unwrap().clone();
        let size = |b: &[u32]| b.iter().map(|&i| if i % 10 == 0 { 1024u64 } else { 100 }).sum::<u64>();
        for b in &batches {
            assert!(b.len() <= 16, "a batch of {} requests (cap 16)", b.len());
            assert!(size(b) <= 4096, "a batch of {} bytes (cap 4096)", size(b));
        }
        let mut written: Vec<u32> = batches.iter().flatten().copied().collect();
        assert_eq!(written.len(), 2000, "a request was written twice or never");
        written.sort_unstable();
        written.dedup();
        assert_eq!(written.len(), 2000);
        assert!(batches.iter().map(Vec::len).max().unwrap() > 4, "nothing was batched");
        assert_eq!(counters.snapshot().requests, 2000);
        // A request larger than the byte cap goes alone.
        let log = Arc::new(Log::default());
        let (q, _) = queue(&log, p);
        rt().block_on(q.submit(p, 1, 10_000)).unwrap();
        assert_eq!(*log.batches.lock().unwrap(), vec![vec![1]]);
    }

    #[test]
    fn requests_are_written_in_the_order_they_arrived() {
        let log = Arc::new(Log { slow: AtomicBool::new(true), ..Default::default() });
        let p = plan(8, Duration::from_micros(50), true);
        let (q, _) = queue(&log, p);
        rt().block_on(async {
            // Submitted one after another from one task, without waiting
            // for the results: the arrival order is 0, 1, 2, ...
            let mut pending = Vec::new();
            for i in 0..500u32 {
                let q = Arc::clone(&q);
                let mut f = Box::pin(async move { q.submit(p, i, 10).await });
                // One poll puts the request in the queue.
                assert!(futures_poll_once(f.as_mut()).await.is_none());
                pending.push(f);
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            for f in pending {
                f.await.unwrap();
            }
        });
        let written: Vec<u32> = log.batches.lock().unwrap().iter().flatten().copied().collect();
        assert_eq!(written, (0..500).collect::<Vec<_>>());
        assert!(log.batches.lock().unwrap().len() < 500, "nothing was batched");
    }

    /// Polls a future once.
    async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    #[test]
    fn the_timeout_sends_a_lone_request_when_not_adaptive() {
        let log = Arc::new(Log::default());
        let p = plan(16, Duration::from_millis(30), false);
        let (q, counters) = queue(&log, p);
        let t0 = Instant::now();
        rt().block_on(q.submit(p, 7, 10)).unwrap();
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(30), "written after {took:?}, before its timeout");
        assert!(took < Duration::from_secs(2), "{took:?}");
        assert_eq!(*log.batches.lock().unwrap(), vec![vec![7]]);
        assert_eq!(counters.snapshot().by_timeout, 1);
        // Adaptive: a lone request on an idle queue goes at once.
        let p = plan(16, Duration::from_secs(1), true);
        let t0 = Instant::now();
        rt().block_on(q.submit(p, 8, 10)).unwrap();
        assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
        assert_eq!(counters.snapshot().by_idle, 1);
    }
}
