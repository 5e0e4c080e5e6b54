//! The token bucket shared by the DRL and QoS objects.
//!
//! [`BucketCore`] is the accounting, a pure function of time (so it can be
//! property-tested on a simulated clock). It works in *cumulative* tokens:
//! `issued` is the sum of all reserved costs, and the *provision* `P(t)` is
//! the sum of all tokens the bucket has ever made available, growing at the
//! rate and capped so that at most `burst` tokens sit unused. A request
//! reserves the range `(issued, issued + cost]` on arrival and is admitted
//! once `P(t)` reaches the end of its range. Hence:
//!
//! * arrival order is service order (ranges are handed out in order), so a
//!   large request is never starved by small ones;
//! * a request larger than the burst is admitted when the bucket has provided
//!   its whole cost since it became the head (it is served "by pieces"
//!   without being split), never deadlocked;
//! * accrual is exact: no periodic refill, no reset to full;
//! * a rate change freezes `P` at the change and continues at the new rate,
//!   so it applies to requests already waiting;
//! * over any interval, admitted tokens never exceed `rate x elapsed + burst`.
//!
//! [`Bucket`] wraps the core in a mutex and a condition variable. The lock is
//! held only to reserve and to recompute a deadline; waiting happens in
//! `Condvar::wait_timeout`, which releases the lock while the thread sleeps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Rejection;
use crate::units::RateUnit;

/// Nanoseconds since a process-wide epoch.
#[inline]
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Cumulative numbers are rebased below this to keep `f64` exact enough.
const REBASE_ABOVE: f64 = 1e12;

/// Token accounting as a pure function of time (nanoseconds).
#[derive(Debug, Clone)]
pub(crate) struct BucketCore {
    /// Tokens per second; 0 = closed; infinity = unlimited.
    rate: f64,
    burst: f64,
    base_t: u64,
    base_p: f64,
    issued: f64,
}

impl BucketCore {
    /// A full bucket at `now`.
    pub(crate) fn new(now: u64, rate: f64, burst: f64) -> Self {
        BucketCore { rate, burst, base_t: now, base_p: burst, issued: 0.0 }
    }

    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    pub(crate) fn burst(&self) -> f64 {
        self.burst
    }

    pub(crate) fn is_unlimited(&self) -> bool {
        self.rate.is_infinite()
    }

    fn provision(&self, now: u64) -> f64 {
        if self.rate.is_infinite() {
            return f64::INFINITY;
        }
        self.base_p + self.rate * (now.saturating_sub(self.base_t) as f64) * 1e-9
    }

    /// Caps unused tokens at `burst` (only matters when nothing is waiting,
    /// since waiters keep `issued` above the provision).
    fn clamp(&mut self, now: u64) {
        if self.rate.is_infinite() {
            return;
        }
        let p = self.provision(now);
        if p > self.issued + self.burst {
            self.base_p = self.issued + self.burst;
            self.base_t = now;
        }
    }

    /// Reserves `cost` tokens at `now`; returns the end of the reserved range.
    pub(crate) fn reserve(&mut self, now: u64, cost: f64) -> f64 {
        self.clamp(now);
        self.issued += cost;
        self.issued
    }

    /// When the request whose range ends at `ticket` may go: a time in ns, or
    /// `None` while the bucket is closed.
    pub(crate) fn ready_at(&self, ticket: f64) -> Option<u64> {
        if self.rate.is_infinite() || ticket <= self.base_p {
            return Some(self.base_t);
        }
        if self.rate <= 0.0 {
            return None;
        }
        let wait = ((ticket - self.base_p) / self.rate * 1e9).ceil();
        Some(self.base_t.saturating_add(if wait >= u64::MAX as f64 { u64::MAX } else { wait as u64 }))
    }

    /// Changes rate and burst at `now`. Tokens provided so far are kept; from
    /// `now` on they accrue at the new rate.
    pub(crate) fn set(&mut self, now: u64, rate: f64, burst: f64) {
        if self.rate.is_infinite() {
            // Leaving "unlimited": start from a full bucket.
            self.base_p = self.issued + burst;
        } else {
            self.base_p = self.provision(now);
        }
        self.base_t = now;
        self.rate = rate;
        self.burst = burst;
        self.clamp(now);
    }

    /// Shifts the cumulative counters down when no ticket is outstanding.
    pub(crate) fn rebase(&mut self) {
        if self.issued > REBASE_ABOVE && self.base_p.is_finite() {
            self.base_p -= self.issued;
            self.issued = 0.0;
        }
    }
}

/// Waiting statistics of one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct BucketStats {
    /// Requests that had to wait.
    pub waits: u64,
    /// Total time requests spent waiting, in nanoseconds.
    pub wait_ns: u64,
    /// Requests waiting right now.
    pub waiting: u64,
    /// Tokens admitted (bytes or ops, by the bucket's unit).
    pub admitted_tokens: f64,
}

struct State {
    core: BucketCore,
    unit: RateUnit,
    waiters: u64,
    shutdown: bool,
    retired: bool,
    stats: BucketStats,
}

/// A blocking, FIFO token bucket.
pub(crate) struct Bucket {
    state: Mutex<State>,
    cv: Condvar,
    /// Mirror of "rate is unlimited and the bucket is open" so that an
    /// unlimited bucket admits without taking the lock.
    open: AtomicBool,
}

impl Bucket {
    pub(crate) fn new(rate: f64, unit: RateUnit, burst: f64) -> Self {
        Bucket {
            state: Mutex::new(State {
                core: BucketCore::new(now_ns(), rate, burst),
                unit,
                waiters: 0,
                shutdown: false,
                retired: false,
                stats: BucketStats::default(),
            }),
            cv: Condvar::new(),
            open: AtomicBool::new(rate.is_infinite()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the core inconsistent
        // (every update is a few float assignments), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a request of `size` bytes, waiting as long as needed. Returns
    /// how long it waited.
    pub(crate) fn acquire(&self, size: u64) -> Result<Duration, Rejection> {
        if self.open.load(Ordering::Relaxed) {
            return Ok(Duration::ZERO);
        }
        let now = now_ns();
        let mut st = self.lock();
        if st.shutdown {
            return Err(Rejection::ShutDown);
        }
        let cost = match st.unit {
            RateUnit::Bytes => size as f64,
            RateUnit::Ops => 1.0,
        };
        if st.retired || st.core.is_unlimited() || cost == 0.0 {
            return Ok(Duration::ZERO);
        }
        if st.waiters == 0 {
            st.core.rebase();
        }
        let ticket = st.core.reserve(now, cost);
        st.stats.admitted_tokens += cost;
        if matches!(st.core.ready_at(ticket), Some(t) if t <= now) {
            return Ok(Duration::ZERO);
        }
        st.waiters += 1;
        st.stats.waiting = st.waiters;
        let result = loop {
            if st.shutdown {
                break Err(Rejection::ShutDown);
            }
            if st.retired {
                break Ok(());
            }
            let t = now_ns();
            match st.core.ready_at(ticket) {
                Some(at) if at <= t => break Ok(()),
                Some(at) => {
                    st = self.cv.wait_timeout(st, Duration::from_nanos(at - t)).unwrap_or_else(|e| e.into_inner()).0
                }
                None => st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            }
        };
        st.waiters -= 1;
        st.stats.waiting = st.waiters;
        let waited = now_ns().saturating_sub(now);
        st.stats.waits += 1;
        st.stats.wait_ns += waited;
        result.map(|()| Duration::from_nanos(waited))
    }

    /// Sets rate (tokens/s, `INFINITY` for unlimited), unit and burst, and
    /// wakes waiters so they recompute their deadlines.
    pub(crate) fn set(&self, rate: f64, unit: RateUnit, burst: f64) {
        let mut st = self.lock();
        st.core.set(now_ns(), rate, burst);
        st.unit = unit;
        self.open.store(rate.is_infinite() && !st.shutdown, Ordering::Relaxed);
        drop(st);
        self.cv.notify_all();
    }

    /// Current `(rate, unit, burst)`.
    pub(crate) fn config(&self) -> (f64, RateUnit, f64) {
        let st = self.lock();
        (st.core.rate(), st.unit, st.core.burst())
    }

    pub(crate) fn stats(&self) -> BucketStats {
        self.lock().stats
    }

    /// Fails every waiter and every later request.
    pub(crate) fn shutdown(&self) {
        let mut st = self.lock();
        st.shutdown = true;
        self.open.store(false, Ordering::Relaxed);
        drop(st);
        self.cv.notify_all();
    }

    /// Admits every waiter and every later request: the object left the
    /// stage, and requests that were already inside it must not be stranded.
    pub(crate) fn retire(&self) {
        let mut st = self.lock();
        st.retired = true;
        drop(st);
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn full_bucket_then_steady_rate() {
        let mut c = BucketCore::new(0, 1000.0, 100.0);
        let t = c.reserve(0, 100.0);
        assert_eq!(c.ready_at(t), Some(0));
        let t = c.reserve(0, 10.0);
        assert_eq!(c.ready_at(t), Some(10_000_000)); // 10 tokens at 1000/s = 10 ms
    }

    #[test]
    fn larger_than_burst_is_admitted_after_its_cost() {
        let mut c = BucketCore::new(0, 1000.0, 100.0);
        let t = c.reserve(0, 1100.0);
        assert_eq!(c.ready_at(t), Some(SEC)); // 100 in the bucket + 1000 at 1000/s
    }

    #[test]
    fn rate_change_applies_to_waiting_ticket() {
        let mut c = BucketCore::new(0, 100.0, 0.0);
        let t = c.reserve(0, 100.0);
        assert_eq!(c.ready_at(t), Some(SEC));
        c.set(SEC / 2, 1000.0, 0.0); // 50 provided, 50 left at 1000/s = 50 ms
        assert_eq!(c.ready_at(t), Some(SEC / 2 + 50_000_000));
        c.set(SEC / 2, 0.0, 0.0);
        assert_eq!(c.ready_at(t), None);
    }

    #[test]
    fn idle_tokens_are_capped_at_burst() {
        let mut c = BucketCore::new(0, 1000.0, 50.0);
        // Idle for 10 s: only 50 tokens are available, not 10 000.
        let t = c.reserve(10 * SEC, 60.0);
        assert_eq!(c.ready_at(t), Some(10 * SEC + 10_000_000));
    }

    /// One step of a simulated workload.
    #[derive(Debug, Clone)]
    enum Step {
        Request { gap_us: u64, cost: f64 },
        SetRate { gap_us: u64, rate: f64, burst: f64 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..20_000, 0.0f64..5_000.0).prop_map(|(gap_us, cost)| Step::Request { gap_us, cost }),
            1 => (0u64..50_000, prop_oneof![Just(0.0), 1.0f64..1e6], 0.0f64..10_000.0)
                .prop_map(|(gap_us, rate, burst)| Step::SetRate { gap_us, rate, burst }),
        ]
    }

    /// Simulates a step sequence; returns admissions `(arrival, admitted, cost)`,
    /// the rate history and the largest and smallest bursts used.
    type Simulation = (Vec<(u64, u64, f64)>, Vec<(u64, f64)>, f64, f64);

    fn simulate(rate0: f64, burst0: f64, steps: &[Step]) -> Simulation {
        let mut c = BucketCore::new(0, rate0, burst0);
        let mut now = 0u64;
        let mut rates = vec![(0u64, rate0)];
        let (mut max_burst, mut min_burst) = (burst0, burst0);
        let mut pending: std::collections::VecDeque<(u64, f64, f64)> = Default::default(); // (arrival, ticket, cost)
        let mut admitted = Vec::new();
        // Moves time to `target`, admitting pending requests at their exact deadlines.
        let advance = |c: &BucketCore,
                       now: &mut u64,
                       target: u64,
                       pending: &mut std::collections::VecDeque<(u64, f64, f64)>,
                       admitted: &mut Vec<(u64, u64, f64)>| {
            while let Some(&(arrival, ticket, cost)) = pending.front() {
                match c.ready_at(ticket) {
                    Some(at) if at <= target => {
                        *now = (*now).max(at);
                        admitted.push((arrival, *now, cost));
                        pending.pop_front();
                    }
                    _ => break,
                }
            }
            *now = target;
        };
        for s in steps {
            match *s {
                Step::Request { gap_us, cost } => {
                    let target = now + gap_us * 1000;
                    advance(&c, &mut now, target, &mut pending, &mut admitted);
                    let t = c.reserve(now, cost);
                    pending.push_back((now, t, cost));
                    let target = now;
                    advance(&c, &mut now, target, &mut pending, &mut admitted);
                }
                Step::SetRate { gap_us, rate, burst } => {
                    let target = now + gap_us * 1000;
                    advance(&c, &mut now, target, &mut pending, &mut admitted);
                    c.set(now, rate, burst);
                    rates.push((now, rate));
                    max_burst = max_burst.max(burst);
                    min_burst = min_burst.min(burst);
                    let target = now;
                    advance(&c, &mut now, target, &mut pending, &mut admitted);
                }
            }
        }
        (admitted, rates, max_burst, min_burst)
    }

    fn integral(rates: &[(u64, f64)], a: u64, b: u64) -> f64 {
        let mut total = 0.0;
        for (i, &(from, r)) in rates.iter().enumerate() {
            let to = rates.get(i + 1).map_or(u64::MAX, |x| x.0);
            let (lo, hi) = (from.max(a), to.min(b));
            if hi > lo {
                total += r * (hi - lo) as f64 * 1e-9;
            }
        }
        total
    }

    proptest! {
        /// Over any sequence of requests and rate changes, the tokens admitted
        /// in any window never exceed the integral of the rate over the window
        /// plus the burst. The window opens at the first request's admission
        /// when that request fits in the burst, and at its arrival when it is
        /// larger (it is served by pieces while it waits). Admission is FIFO.
        #[test]
        fn never_admits_more_than_rate_times_elapsed_plus_burst(
            rate0 in 1.0f64..1e6, burst0 in 0.0f64..10_000.0, steps in proptest::collection::vec(step(), 1..80)
        ) {
            let (admitted, rates, max_burst, min_burst) = simulate(rate0, burst0, &steps);
            for i in 0..admitted.len() {
                let (arrival_i, at_i, cost_i) = admitted[i];
                let open = if cost_i <= min_burst { at_i } else { arrival_i };
                let mut sum = 0.0;
                for &(_, at_j, cost_j) in &admitted[i..] {
                    sum += cost_j;
                    let allowed = integral(&rates, open, at_j) + max_burst;
                    prop_assert!(sum <= allowed * (1.0 + 1e-9) + 1e-6,
                        "admitted {} in [{}, {}] ns but only {} allowed", sum, open, at_j, allowed);
                }
            }
            prop_assert!(admitted.windows(2).all(|w| w[0].1 <= w[1].1 && w[0].0 <= w[1].0));
        }

        /// Every request is admitted once the bucket is open long enough.
        #[test]
        fn open_bucket_admits_everything_eventually(
            rate0 in 1.0f64..1e6, burst0 in 0.0f64..10_000.0, steps in proptest::collection::vec(step(), 1..40)
        ) {
            let mut steps = steps;
            let n = steps.iter().filter(|s| matches!(s, Step::Request { .. })).count();
            // Finish with the bucket open and a long idle period.
            steps.push(Step::SetRate { gap_us: 0, rate: 1000.0, burst: 0.0 });
            steps.push(Step::SetRate { gap_us: 1_000_000_000, rate: 1000.0, burst: 0.0 });
            let (admitted, ..) = simulate(rate0, burst0, &steps);
            prop_assert_eq!(admitted.len(), n);
        }
    }

    #[test]
    fn closed_bucket_waits_until_opened() {
        let b = Arc::new(Bucket::new(0.0, RateUnit::Bytes, 0.0));
        let b2 = Arc::clone(&b);
        let h = std::thread::spawn(move || b2.acquire(10));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished());
        b.set(1e9, RateUnit::Bytes, 1e6);
        assert!(h.join().unwrap().is_ok());
    }

    #[test]
    fn shutdown_fails_waiters() {
        let b = Arc::new(Bucket::new(0.0, RateUnit::Bytes, 0.0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || b.acquire(10))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        b.shutdown();
        for h in hs {
            assert_eq!(h.join().unwrap(), Err(Rejection::ShutDown));
        }
        assert_eq!(b.acquire(1), Err(Rejection::ShutDown));
    }

    #[test]
    fn retire_admits_waiters() {
        let b = Arc::new(Bucket::new(0.0, RateUnit::Ops, 0.0));
        let b2 = Arc::clone(&b);
        let h = std::thread::spawn(move || b2.acquire(0));
        std::thread::sleep(Duration::from_millis(20));
        b.retire();
        assert!(h.join().unwrap().is_ok());
    }
}
