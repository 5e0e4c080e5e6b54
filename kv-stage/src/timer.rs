//! A timer for async waits that needs no async runtime.
//!
//! One thread per process (`kvsds-timer`, started on first use) keeps a heap
//! of `(deadline, waker)` entries and wakes each waker when its deadline
//! passes. It sleeps on a condition variable with 1 µs timer slack, so a
//! deadline is kept within tens of microseconds (tokio's own timer rounds
//! to milliseconds, too coarse for the 50 µs batching timeout of i10).
//!
//! Used by [`Stage::enforce_async`](crate::Stage::enforce_async) and by
//! [`sleep`]. An entry can be cancelled (a request admitted early, a future
//! dropped): its waker is dropped at once, so a timer entry never keeps a
//! task alive until a deadline that may be years away, and cancelled
//! entries are swept from the heap once they are half of it.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, OnceLock};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use crate::clock::now_ns;

struct Entry {
    at: u64,
    seq: u64,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so the heap's top is the earliest deadline.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Heap {
    entries: BinaryHeap<Entry>,
    /// The wakers of the entries not cancelled, by `seq`.
    wakers: HashMap<u64, Waker>,
    seq: u64,
    /// Entries in the heap whose waker was cancelled.
    cancelled: usize,
}

struct Timer {
    heap: Mutex<Heap>,
    cv: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer {
            heap: Mutex::new(Heap {
                entries: BinaryHeap::with_capacity(256),
                wakers: HashMap::with_capacity(256),
                seq: 0,
                cancelled: 0,
            }),
            cv: Condvar::new(),
        }));
        // If the thread cannot be started, waits fall back to being woken by
        // the bucket's own changes only; that cannot happen short of
        // resource exhaustion, and then the spawn error is the least of it.
        let _ = std::thread::Builder::new().name("kvsds-timer".into()).spawn(move || run(t));
        t
    })
}

fn lock(t: &Timer) -> std::sync::MutexGuard<'_, Heap> {
    // Entries are plain values: a panic elsewhere cannot leave them torn.
    t.heap.lock().unwrap_or_else(|e| e.into_inner())
}

fn run(t: &'static Timer) {
    let _ = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1_000));
    let mut due: Vec<Waker> = Vec::with_capacity(256);
    let mut heap = lock(t);
    loop {
        let now = now_ns();
        while heap.entries.peek().is_some_and(|e| e.at <= now) {
            if let Some(e) = heap.entries.pop() {
                match heap.wakers.remove(&e.seq) {
                    Some(w) => due.push(w),
                    None => heap.cancelled = heap.cancelled.saturating_sub(1),
                }
            }
        }
        if !due.is_empty() {
            drop(heap);
            for w in due.drain(..) {
                w.wake();
            }
            heap = lock(t);
            continue;
        }
        heap = match heap.entries.peek() {
            Some(e) => {
                let wait = Duration::from_nanos(e.at - now);
                t.cv.wait_timeout(heap, wait).unwrap_or_else(|e| e.into_inner()).0
            }
            None => t.cv.wait(heap).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// Wakes `waker` once the process clock (`now_ns`) reaches `at`; returns
/// the entry's key for [`cancel`] (never 0).
pub(crate) fn wake_at(at: u64, waker: &Waker) -> u64 {
    let t = timer();
    let mut heap = lock(t);
    heap.seq += 1;
    let seq = heap.seq;
    let earliest = heap.entries.peek().is_none_or(|e| at < e.at);
    heap.entries.push(Entry { at, seq });
    heap.wakers.insert(seq, waker.clone());
    drop(heap);
    if earliest {
        t.cv.notify_one();
    }
    seq
}

/// Cancels the entry `key` (0: none): its waker is dropped now. The heap
/// is swept when cancelled entries are more than half of it.
pub(crate) fn cancel(key: u64) {
    if key == 0 {
        return;
    }
    let mut heap = lock(timer());
    if heap.wakers.remove(&key).is_some() {
        heap.cancelled += 1;
        if heap.cancelled > 64 && heap.cancelled * 2 > heap.entries.len() {
            let Heap { entries, wakers, .. } = &mut *heap;
            entries.retain(|e| wakers.contains_key(&e.seq));
            heap.cancelled = 0;
        }
    }
}

/// A future that completes after a duration, timed by kv-stage's timer
/// thread (microsecond precision, any executor).
///
/// ```
/// # futures_lite_block_on(async {
/// kv_stage::timer::sleep(std::time::Duration::from_micros(50)).await;
/// # });
/// # fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     let waker = std::task::Waker::noop();
/// #     let mut cx = std::task::Context::from_waker(&waker);
/// #     let mut f = std::pin::pin!(f);
/// #     loop {
/// #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
/// #         std::thread::sleep(std::time::Duration::from_micros(10));
/// #     }
/// # }
/// ```
#[derive(Debug)]
#[must_use = "a future does nothing unless polled"]
pub struct Sleep {
    deadline: u64,
    /// The timer entry of the last poll (0: none).
    key: u64,
}

/// Sleeps for `d`.
pub fn sleep(d: Duration) -> Sleep {
    Sleep { deadline: now_ns().saturating_add(d.as_nanos().min(u64::MAX as u128) as u64), key: 0 }
}

impl Sleep {
    /// True once the deadline has passed.
    pub fn is_elapsed(&self) -> bool {
        now_ns() >= self.deadline
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.get_mut();
        cancel(std::mem::take(&mut this.key));
        if now_ns() >= this.deadline {
            return Poll::Ready(());
        }
        this.key = wake_at(this.deadline, cx.waker());
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        cancel(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_in_deadline_order_and_not_before() {
        let counts: Vec<_> = (0..3).map(|_| Arc::new(Count(AtomicUsize::new(0)))).collect();
        let now = now_ns();
        // Registered out of order.
        for (i, d) in [(2, 60_000_000u64), (0, 20_000_000), (1, 40_000_000)] {
            wake_at(now + d, &Waker::from(Arc::clone(&counts[i])));
        }
        std::thread::sleep(Duration::from_millis(10));
        assert!(counts.iter().all(|c| c.0.load(Ordering::SeqCst) == 0), "woken before its deadline");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while counts[2].0.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            assert!(counts[2].0.load(Ordering::SeqCst) == 0 || counts[1].0.load(Ordering::SeqCst) == 1);
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(counts.iter().all(|c| c.0.load(Ordering::SeqCst) == 1));
        assert!(now_ns() >= now + 60_000_000);
    }
}
