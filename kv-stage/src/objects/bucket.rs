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
//! A waiting request can give its place back ([`BucketCore::cancel`]): its
//! range becomes a *hole*, and every range after it counts as if the hole
//! were not there, so the requests behind it do not pay for it and the
//! tokens already provided towards it go to the next in line. Holes are
//! folded away whenever nothing waits. This is how a closing instance's
//! waiters leave without charging the instances that share the bucket.
//!
//! A change of unit (bytes/s to ops/s or back) starts a new *epoch*: the
//! accounting restarts from a full bucket in the new unit, and requests that
//! were waiting take a new place in it, priced in the new unit. (Their
//! order among themselves is the order in which they wake.)
//!
//! [`Bucket`] wraps the core in a mutex and a condition variable. The lock is
//! held only to reserve and to recompute a deadline; waiting happens in
//! `Condvar::wait_timeout`, which releases the lock while the thread sleeps.
//!
//! The async path ([`Bucket::poll_acquire`]) takes its place in the same
//! core, so blocking and async requests share one FIFO line. An async
//! waiter parks its waker in the bucket's *line* (in ticket order) and
//! asks the [timer](crate::timer) to wake it at its deadline. Whenever a
//! waiter leaves (admitted, failed or dropped), the first async waiter left
//! in line is woken to recompute its deadline: a place given back moves
//! the line up, and this wakes one waiter per event instead of all of them.
//! Rate changes, shutdown, retirement and closing instances wake every
//! waiter, as they wake every blocking one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use serde::Serialize;

use crate::clock::now_ns;
use crate::context::InstanceId;
use crate::error::Rejection;
use crate::units::RateUnit;

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
    /// Cancelled ranges still inside `issued`, as `(end, cost)` in order of
    /// their ends. Holes with no waiting ticket between them are merged, so
    /// there are at most one more than there are waiters, however many
    /// requests gave their places back.
    holes: Vec<(f64, f64)>,
    /// Sum of the holes' costs.
    hole_total: f64,
    /// Tickets of the requests waiting now (see [`wait`](Self::wait)), by
    /// their bits (positive floats order as their bits do), in order. A
    /// deque: requests mostly join at the back and leave at the front, and
    /// it keeps its capacity (no allocation per waiting request).
    waiting: VecDeque<u64>,
}

impl BucketCore {
    /// A full bucket at `now`.
    pub(crate) fn new(now: u64, rate: f64, burst: f64) -> Self {
        BucketCore {
            rate,
            burst,
            base_t: now,
            base_p: burst,
            issued: 0.0,
            holes: Vec::new(),
            hole_total: 0.0,
            waiting: VecDeque::new(),
        }
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

    /// Tokens reserved by requests that have not given their place back.
    fn live_issued(&self) -> f64 {
        self.issued - self.hole_total
    }

    /// Caps unused tokens at `burst` (only matters when nothing is waiting,
    /// since waiters keep `issued` above the provision).
    fn clamp(&mut self, now: u64) {
        if self.rate.is_infinite() {
            return;
        }
        let p = self.provision(now);
        let cap = self.live_issued() + self.burst;
        if p > cap {
            self.base_p = cap;
            self.base_t = now;
        }
    }

    /// Reserves `cost` tokens at `now`; returns the end of the reserved range
    /// (the request's ticket).
    pub(crate) fn reserve(&mut self, now: u64, cost: f64) -> f64 {
        self.clamp(now);
        self.issued += cost;
        self.issued
    }

    /// Where a ticket stands once the holes before it are taken out.
    fn effective(&self, ticket: f64) -> f64 {
        let before: f64 = self.holes.iter().take_while(|h| h.0 < ticket).map(|h| h.1).sum();
        ticket - before
    }

    /// When the request whose range ends at `ticket` may go: a time in ns, or
    /// `None` while the bucket is closed.
    pub(crate) fn ready_at(&self, ticket: f64) -> Option<u64> {
        let ticket = self.effective(ticket);
        if self.rate.is_infinite() || ticket <= self.base_p {
            return Some(self.base_t);
        }
        if self.rate <= 0.0 {
            return None;
        }
        let wait = ((ticket - self.base_p) / self.rate * 1e9).ceil();
        Some(self.base_t.saturating_add(if wait >= u64::MAX as f64 { u64::MAX } else { wait as u64 }))
    }

    /// The request whose range ends at `ticket` waits (idempotent).
    pub(crate) fn wait(&mut self, ticket: f64) {
        let bits = ticket.to_bits();
        if self.waiting.back().is_none_or(|&b| b < bits) {
            self.waiting.push_back(bits);
        } else if let Err(i) = self.waiting.binary_search(&bits) {
            self.waiting.insert(i, bits);
        }
    }

    /// The request whose range ends at `ticket` stopped waiting (admitted
    /// or failed).
    pub(crate) fn done(&mut self, ticket: f64) {
        if let Ok(i) = self.waiting.binary_search(&ticket.to_bits()) {
            self.waiting.remove(i);
        }
    }

    /// Whether a waiting ticket lies strictly between `lo` and `hi`.
    fn waiting_between(&self, lo: f64, hi: f64) -> bool {
        let (lo, hi) = (lo.to_bits(), hi.to_bits());
        let first_above = self.waiting.partition_point(|&b| b <= lo);
        self.waiting.get(first_above).is_some_and(|&b| b < hi)
    }

    /// Gives back the place of a waiting request (its range ends at `ticket`
    /// and is `cost` long): the requests behind it move up by `cost`.
    ///
    /// Two holes with no waiting ticket between them shift every ticket
    /// that matters (the waiting ones and those to come) by the same
    /// amount as one hole would, so they are merged: the holes stay fewer
    /// than the waiters plus two, and a ticket's place is computed in time
    /// proportional to them, not to the cancellations so far.
    pub(crate) fn cancel(&mut self, ticket: f64, cost: f64) {
        self.done(ticket);
        if ticket == self.issued {
            // The last range: simply shorten the line.
            self.issued -= cost;
        } else {
            let mut at = self.holes.partition_point(|h| h.0 < ticket);
            self.holes.insert(at, (ticket, cost));
            self.hole_total += cost;
            if at > 0 && !self.waiting_between(self.holes[at - 1].0, ticket) {
                let (_, before) = self.holes.remove(at - 1);
                at -= 1;
                self.holes[at].1 += before;
            }
            if at + 1 < self.holes.len() && !self.waiting_between(self.holes[at].0, self.holes[at + 1].0) {
                let (_, this) = self.holes.remove(at);
                self.holes[at].1 += this;
            }
        }
        // Holes below every waiting ticket are one hole.
        let first_waiting = self.waiting.front().map_or(f64::INFINITY, |&b| f64::from_bits(b));
        while self.holes.len() >= 2 && self.holes[1].0 < first_waiting {
            let (_, c) = self.holes.remove(0);
            self.holes[0].1 += c;
        }
    }

    /// Holes kept now (tests).
    #[cfg(test)]
    pub(crate) fn holes(&self) -> usize {
        self.holes.len()
    }

    /// Gives back `tokens` of an admitted request that it did not use (a
    /// read that found less than it asked for): they count as provided
    /// again, so the next requests do not wait for them. Unused tokens stay
    /// capped at the burst.
    pub(crate) fn refund(&mut self, now: u64, tokens: f64) {
        if self.rate.is_infinite() || tokens.is_nan() || tokens <= 0.0 {
            return;
        }
        self.base_p = self.provision(now) + tokens;
        self.base_t = now;
        self.clamp(now);
    }

    /// Changes rate and burst at `now`. Tokens provided so far are kept; from
    /// `now` on they accrue at the new rate.
    pub(crate) fn set(&mut self, now: u64, rate: f64, burst: f64) {
        if self.rate.is_infinite() {
            // Leaving "unlimited": start from a full bucket.
            self.base_p = self.live_issued() + burst;
        } else {
            self.base_p = self.provision(now);
        }
        self.base_t = now;
        self.rate = rate;
        self.burst = burst;
        self.clamp(now);
    }

    /// Folds the holes away and shifts the cumulative counters down; only
    /// when no ticket is outstanding.
    pub(crate) fn rebase(&mut self) {
        debug_assert!(self.waiting.is_empty(), "rebase with waiters");
        if !self.holes.is_empty() {
            self.issued -= self.hole_total;
            self.holes.clear();
            self.hole_total = 0.0;
        }
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
    /// How long the requests that waited waited.
    pub wait_histogram: super::WaitHistogram,
    /// Tokens reserved (bytes or ops, by the bucket's unit at the time).
    pub admitted_tokens: f64,
}

#[cfg_attr(test, derive(Clone))]
struct State {
    core: BucketCore,
    unit: RateUnit,
    /// Bumped when the unit changes (see the module documentation).
    epoch: u64,
    waiters: u64,
    shutdown: bool,
    retired: bool,
    /// Instances whose requests are admitted without waiting (closing).
    closed: Vec<InstanceId>,
    stats: BucketStats,
    /// Async waiters with the position they took, in that order; one that
    /// leaves is removed at once, so the line holds the waiters there are,
    /// however many left before. A deque: joins at the back, leaves mostly
    /// at the front, and keeps its capacity.
    line: VecDeque<(u64, Waker)>,
    /// The position the next async waiter takes.
    next_pos: u64,
}

/// What a request that holds a place does next: the one answer both the
/// blocking and the async driver act on (see [`State::next`]).
#[derive(Debug)]
enum Next {
    /// Admitted: its tokens are provided (or the bucket was retired, or
    /// became unlimited).
    Go,
    /// Failed: the bucket was shut down.
    Fail(Rejection),
    /// Its instance is closing: it gave its place back (the requests behind
    /// it move up) and goes without waiting.
    Left,
    /// Wait until this time (ns): its tokens are provided then, unless
    /// something changes first.
    WaitUntil(u64),
    /// Wait until something changes: the bucket is closed (rate 0).
    WaitClosed,
}

impl State {
    fn new(now: u64, rate: f64, unit: RateUnit, burst: f64) -> Self {
        State {
            core: BucketCore::new(now, rate, burst),
            unit,
            epoch: 0,
            waiters: 0,
            shutdown: false,
            retired: false,
            closed: Vec::new(),
            stats: BucketStats::default(),
            line: VecDeque::new(),
            next_pos: 0,
        }
    }

    /// A request of `size` from `instance` arrives at `now`. `Ok(None)`: it
    /// goes at once and holds no place (the bucket is retired or unlimited,
    /// the request costs nothing, its instance is closing, or its tokens are
    /// there); `Ok(Some((ticket, epoch)))`: it holds a place and asks
    /// [`next`](Self::next) what to do; `Err`: the bucket is shut down.
    fn arrive(&mut self, now: u64, size: u64, instance: InstanceId) -> Result<Option<(f64, u32)>, Rejection> {
        if self.shutdown {
            return Err(Rejection::ShutDown);
        }
        let cost = self.cost(size);
        if self.retired || self.core.is_unlimited() || cost == 0.0 || self.is_closed(instance) {
            return Ok(None);
        }
        if self.waiters == 0 {
            self.core.rebase();
        }
        let ticket = self.core.reserve(now, cost);
        self.stats.admitted_tokens += cost;
        if matches!(self.core.ready_at(ticket), Some(t) if t <= now) {
            return Ok(None);
        }
        self.waiters += 1;
        self.stats.waiting = self.waiters;
        Ok(Some((ticket, self.epoch as u32)))
    }

    /// What a request holding the place `ticket` (priced in `epoch`) does
    /// at the time `now()` reads, in this order: fail when shut down; go
    /// when retired; after a change of unit, take a place in the new epoch
    /// (and go if that is free); leave when its instance is closing; then
    /// go, or wait for its deadline, or wait while the bucket is closed. A
    /// request that waits is on the core's waiting list.
    fn next(&mut self, ticket: &mut f64, epoch: &mut u32, size: u64, instance: InstanceId, now: fn() -> u64) -> Next {
        loop {
            if self.shutdown {
                return Next::Fail(Rejection::ShutDown);
            }
            if self.retired {
                return Next::Go;
            }
            let cost = self.cost(size);
            if self.epoch as u32 != *epoch {
                // The unit changed: take a place in the new accounting.
                *epoch = self.epoch as u32;
                if self.core.is_unlimited() || cost == 0.0 {
                    return Next::Go;
                }
                *ticket = self.core.reserve(now(), cost);
                self.stats.admitted_tokens += cost;
                continue;
            }
            if self.is_closed(instance) {
                self.core.cancel(*ticket, cost);
                return Next::Left;
            }
            let t = now();
            return match self.core.ready_at(*ticket) {
                Some(at) if at <= t => Next::Go,
                Some(at) => {
                    self.core.wait(*ticket);
                    Next::WaitUntil(at)
                }
                None => {
                    self.core.wait(*ticket);
                    Next::WaitClosed
                }
            };
        }
    }

    /// New rate, unit and burst at `now`; a change of unit starts a new
    /// epoch (a full bucket in the new unit).
    fn set(&mut self, now: u64, rate: f64, unit: RateUnit, burst: f64) {
        if unit == self.unit {
            self.core.set(now, rate, burst);
        } else {
            self.core = BucketCore::new(now, rate, burst);
            self.unit = unit;
            self.epoch += 1;
        }
    }

    /// A request that holds a place gives it back unserved (an async
    /// request whose future was dropped): the requests behind it move up,
    /// and its tokens are not counted as admitted.
    fn give_back(&mut self, ticket: f64, epoch: u32, size: u64) {
        if self.epoch as u32 == epoch {
            if self.retired || self.shutdown {
                // Nothing is served any more: only off the waiting list.
                self.core.done(ticket);
            } else {
                let cost = self.cost(size);
                self.core.cancel(ticket, cost);
                self.stats.admitted_tokens -= cost;
            }
        }
        self.waiters -= 1;
        self.stats.waiting = self.waiters;
    }

    /// A request that held a place leaves it (it went, failed or left),
    /// having arrived at `start`; returns how long it waited.
    fn leave(&mut self, ticket: f64, epoch: u32, start: u64, now: u64) -> u64 {
        if self.epoch as u32 == epoch {
            self.core.done(ticket);
        }
        self.waiters -= 1;
        self.stats.waiting = self.waiters;
        let waited = now.saturating_sub(start);
        self.stats.waits += 1;
        self.stats.wait_ns += waited;
        self.stats.wait_histogram.record(waited);
        waited
    }

    fn cost(&self, size: u64) -> f64 {
        match self.unit {
            RateUnit::Bytes => size as f64,
            RateUnit::Ops => 1.0,
        }
    }

    fn is_closed(&self, instance: InstanceId) -> bool {
        !self.closed.is_empty() && self.closed.contains(&instance)
    }

    /// Puts an async waiter in line; returns its position.
    fn join_line(&mut self, waker: &Waker) -> u64 {
        let pos = self.next_pos;
        self.next_pos += 1;
        self.line.push_back((pos, waker.clone()));
        pos
    }

    fn line_index(&self, pos: u64) -> Option<usize> {
        self.line.binary_search_by_key(&pos, |(p, _)| *p).ok()
    }

    fn line_slot(&mut self, pos: u64) -> Option<&mut Waker> {
        let i = self.line_index(pos)?;
        self.line.get_mut(i).map(|(_, w)| w)
    }

    /// Takes an async waiter out of line and wakes the first one left, whose
    /// place may have moved up.
    fn leave_line(&mut self, pos: u64) {
        if let Some(i) = self.line_index(pos) {
            self.line.remove(i);
        }
        self.wake_first();
    }

    /// Wakes the first async waiter in line.
    fn wake_first(&self) {
        if let Some((_, w)) = self.line.front() {
            w.wake_by_ref();
        }
    }

    /// Wakes every async waiter (they recompute their deadlines).
    fn wake_line(&self) {
        self.line.iter().for_each(|(_, w)| w.wake_by_ref());
    }
}

/// Where an async request stands in a bucket: kept by its future between
/// polls, handed back to [`Bucket::cancel`] if the future is dropped.
///
/// Kept small (it lives in every `Enforce` future): the request's cost is
/// not stored, as it follows from its size and the bucket's unit, which
/// cannot change within an epoch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketWait {
    ticket: f64,
    start: u64,
    /// Position in the bucket's line.
    pos: u64,
    /// The deadline the timer was last asked to wake it at.
    timer_at: u64,
    /// The timer entry set for it (0: none), cancelled when it is done so
    /// the timer does not keep its waker (and the task) until the deadline.
    timer: u64,
    /// The bucket's epoch, truncated (a unit change every nanosecond would
    /// take 4 s to wrap it; they come from rules).
    epoch: u32,
    /// Waiting (a place is held) since `start`.
    active: bool,
    /// Free for the object: which of its buckets the request is at.
    pub(crate) step: u8,
}

impl Default for BucketWait {
    fn default() -> Self {
        BucketWait { ticket: 0.0, start: 0, pos: 0, timer_at: u64::MAX, timer: 0, epoch: 0, active: false, step: 0 }
    }
}

impl BucketWait {
    /// True while the request holds a place.
    pub(crate) fn is_waiting(&self) -> bool {
        self.active
    }
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
            state: Mutex::new(State::new(now_ns(), rate, unit, burst)),
            cv: Condvar::new(),
            open: AtomicBool::new(rate.is_infinite()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the core inconsistent
        // (every update is a few float assignments), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a request of `size` bytes from `instance`, waiting as long as
    /// needed. Returns how long it waited.
    pub(crate) fn acquire(&self, size: u64, instance: InstanceId) -> Result<Duration, Rejection> {
        if self.open.load(Ordering::Relaxed) {
            return Ok(Duration::ZERO);
        }
        let start = now_ns();
        let mut st = self.lock();
        let Some((mut ticket, mut epoch)) = st.arrive(start, size, instance)? else { return Ok(Duration::ZERO) };
        let result = loop {
            match st.next(&mut ticket, &mut epoch, size, instance, now_ns) {
                Next::Go => break Ok(()),
                Next::Fail(e) => break Err(e),
                Next::Left => {
                    st.wake_first();
                    self.cv.notify_all();
                    break Ok(());
                }
                Next::WaitUntil(at) => {
                    let d = Duration::from_nanos(at.saturating_sub(now_ns()));
                    st = self.cv.wait_timeout(st, d).unwrap_or_else(|e| e.into_inner()).0;
                }
                Next::WaitClosed => st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            }
        };
        let waited = st.leave(ticket, epoch, start, now_ns());
        result.map(|()| Duration::from_nanos(waited))
    }

    /// The async form of [`acquire`](Self::acquire): takes the same place in
    /// the same line, but instead of sleeping returns `Pending` with the
    /// task's waker parked in the line and a timer set for its deadline.
    /// `w` carries the request's place between polls; a future that is
    /// dropped while `w` is waiting must hand it to [`cancel`](Self::cancel).
    #[inline]
    pub(crate) fn poll_acquire(
        &self,
        size: u64,
        instance: InstanceId,
        w: &mut BucketWait,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<Duration, Rejection>> {
        if !w.active && self.open.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(Duration::ZERO));
        }
        self.poll_acquire_locked(size, instance, w, cx)
    }

    /// [`poll_acquire`](Self::poll_acquire) past the unlimited fast path.
    #[inline(never)]
    fn poll_acquire_locked(
        &self,
        size: u64,
        instance: InstanceId,
        w: &mut BucketWait,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<Duration, Rejection>> {
        let mut st = self.lock();
        if !w.active {
            let now = now_ns();
            let Some((ticket, epoch)) = st.arrive(now, size, instance)? else { return Poll::Ready(Ok(Duration::ZERO)) };
            let pos = st.join_line(cx.waker());
            *w =
                BucketWait { ticket, start: now, pos, timer_at: u64::MAX, timer: 0, epoch, active: true, step: w.step };
        } else if let Some(parked) = st.line_slot(w.pos)
            && !parked.will_wake(cx.waker())
        {
            parked.clone_from(cx.waker());
        }
        let epoch = w.epoch;
        let result = match st.next(&mut w.ticket, &mut w.epoch, size, instance, now_ns) {
            Next::Go => Ok(()),
            Next::Fail(e) => Err(e),
            Next::Left => {
                self.cv.notify_all();
                Ok(())
            }
            Next::WaitUntil(at) => {
                drop(st);
                // A new epoch is a new deadline, whatever the old one was.
                let t = now_ns();
                if at < w.timer_at || w.timer_at <= t || w.epoch != epoch {
                    w.timer_at = at;
                    crate::timer::cancel(w.timer);
                    w.timer = crate::timer::wake_at(at, cx.waker());
                }
                return Poll::Pending;
            }
            Next::WaitClosed => return Poll::Pending,
        };
        crate::timer::cancel(std::mem::take(&mut w.timer));
        w.active = false;
        st.leave_line(w.pos);
        let waited = st.leave(w.ticket, w.epoch, w.start, now_ns());
        Poll::Ready(result.map(|()| Duration::from_nanos(waited)))
    }

    /// Gives back the place of an async request whose future was dropped
    /// while waiting: the requests behind it move up, and its tokens are
    /// not counted as admitted.
    pub(crate) fn cancel(&self, size: u64, w: &mut BucketWait) {
        if !w.active {
            return;
        }
        w.active = false;
        crate::timer::cancel(std::mem::take(&mut w.timer));
        let mut st = self.lock();
        st.give_back(w.ticket, w.epoch, size);
        st.leave_line(w.pos);
        drop(st);
        self.cv.notify_all();
    }

    /// Sets rate (tokens/s, `INFINITY` for unlimited), unit and burst, and
    /// wakes waiters so they recompute their deadlines. A change of unit
    /// starts a new epoch (see the module documentation).
    pub(crate) fn set(&self, rate: f64, unit: RateUnit, burst: f64) {
        let mut st = self.lock();
        st.set(now_ns(), rate, unit, burst);
        self.open.store(rate.is_infinite() && !st.shutdown, Ordering::Relaxed);
        st.wake_line();
        drop(st);
        self.cv.notify_all();
    }

    /// Gives back the unused `bytes` of an admitted request (a bucket of
    /// operations keeps its charge: the operation took place). Waiters
    /// recompute their deadlines.
    pub(crate) fn refund(&self, bytes: u64) {
        if bytes == 0 || self.open.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        if st.unit != RateUnit::Bytes || st.core.is_unlimited() {
            return;
        }
        st.core.refund(now_ns(), bytes as f64);
        st.stats.admitted_tokens -= bytes as f64;
        st.wake_line();
        drop(st);
        self.cv.notify_all();
    }

    /// Takes `bytes` more for a request already admitted (a bucket of
    /// operations has charged it already), without waiting: they join the
    /// end of the line, so the requests after it wait for them.
    pub(crate) fn charge(&self, bytes: u64) {
        if bytes == 0 || self.open.load(Ordering::Relaxed) {
            return;
        }
        let mut st = self.lock();
        if st.unit != RateUnit::Bytes || st.core.is_unlimited() {
            return;
        }
        st.core.reserve(now_ns(), bytes as f64);
        st.stats.admitted_tokens += bytes as f64;
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
        st.wake_line();
        drop(st);
        self.cv.notify_all();
    }

    /// Admits every waiter and every later request: the object left the
    /// stage, and requests that were already inside it must not be stranded.
    pub(crate) fn retire(&self) {
        let mut st = self.lock();
        st.retired = true;
        st.wake_line();
        drop(st);
        self.cv.notify_all();
    }

    /// Admits the requests of `instance` that wait now, and later ones,
    /// without waiting; the places of the waiters go to those behind them.
    pub(crate) fn close_instance(&self, instance: InstanceId) {
        let mut st = self.lock();
        if !st.closed.contains(&instance) {
            st.closed.push(instance);
        }
        st.wake_line();
        drop(st);
        self.cv.notify_all();
    }

    /// Subjects `instance`'s requests to the bucket again.
    pub(crate) fn open_instance(&self, instance: InstanceId) {
        self.lock().closed.retain(|&i| i != instance);
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
    fn a_refund_moves_the_next_request_up_and_stays_capped_at_burst() {
        // 1000 tokens/s, burst 10: a request of 1000 empties the bucket
        // and puts it 990 tokens in debt.
        let mut c = BucketCore::new(0, 1000.0, 10.0);
        c.reserve(0, 1000.0);
        let next = c.reserve(0, 10.0);
        assert_eq!(c.ready_at(next), Some(1_000_000_000));
        // It used 1 token: 999 come back, the next request waits only for
        // the 1 token (1 ms), not for the whole 1000.
        c.refund(0, 999.0);
        assert_eq!(c.ready_at(next), Some(1_000_000));
        // A refund larger than anything charged leaves at most a burst.
        c.refund(0, 1e9);
        let after = c.reserve(0, 25.0);
        assert!(c.ready_at(after).unwrap() > 0, "more than a burst was kept");
    }

    #[test]
    fn cancellations_behind_a_head_that_never_leaves_keep_nothing() {
        // A closed bucket: the head waits for good; 300,000 requests
        // behind it take a place and give it back, one at a time.
        let b = Bucket::new(0.0, RateUnit::Bytes, 0.0);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut head = BucketWait::default();
        assert!(b.poll_acquire(10, InstanceId(0), &mut head, &mut cx).is_pending());
        // Each new request takes a place, then the one before it leaves
        // (not the last in line: its range becomes a hole).
        let mut before = BucketWait::default();
        assert!(b.poll_acquire(10, InstanceId(0), &mut before, &mut cx).is_pending());
        for _ in 0..300_000u64 {
            let mut w = BucketWait::default();
            assert!(b.poll_acquire(10, InstanceId(0), &mut w, &mut cx).is_pending());
            b.cancel(10, &mut before);
            before = w;
        }
        {
            let st = b.lock();
            assert!(st.core.holes() <= 2, "{} holes kept", st.core.holes());
            assert_eq!(st.line.len(), 2, "the line kept the waiters that left");
            assert_eq!(st.waiters, 2);
        }
        // With waiters between them, holes merge down to one per gap.
        let mut c = BucketCore::new(0, 0.0, 0.0);
        let tickets: Vec<f64> = (0..1000).map(|_| c.reserve(0, 1.0)).collect();
        for &t in &tickets {
            c.wait(t);
        }
        for (i, &t) in tickets.iter().enumerate() {
            if i % 10 != 0 {
                c.cancel(t, 1.0);
            }
        }
        assert!(c.holes() <= 101, "{} holes for 100 waiters", c.holes());
        // Every waiter is where the requests before it left it: ticket
        // 10k is the (k+1)th left, so it needs k + 1 tokens.
        c.set(0, 1e9, 0.0);
        for (k, &t) in tickets.iter().step_by(10).enumerate() {
            assert_eq!(c.effective(t), k as f64 + 1.0);
        }
    }

    #[test]
    fn idle_tokens_are_capped_at_burst() {
        let mut c = BucketCore::new(0, 1000.0, 50.0);
        // Idle for 10 s: only 50 tokens are available, not 10 000.
        let t = c.reserve(10 * SEC, 60.0);
        assert_eq!(c.ready_at(t), Some(10 * SEC + 10_000_000));
    }

    #[test]
    fn a_cancelled_waiter_gives_its_place_to_those_behind() {
        let mut c = BucketCore::new(0, 1000.0, 0.0);
        let a = c.reserve(0, 500.0);
        let b = c.reserve(0, 100.0);
        let z = c.reserve(0, 100.0);
        assert_eq!(c.ready_at(b), Some(600_000_000));
        // At 0.2 s, `a` leaves: the 200 tokens made for it go to `b`, which
        // goes at once, and `z` 0.1 s later.
        c.cancel(a, 500.0);
        assert_eq!(c.ready_at(b), Some(100_000_000));
        assert_eq!(c.ready_at(z), Some(200_000_000));
        // The last in line leaving shortens the line.
        c.cancel(z, 100.0);
        let d = c.reserve(0, 100.0);
        assert_eq!(c.ready_at(d), Some(200_000_000));
    }

    #[test]
    fn cancelling_in_a_closed_bucket_admits_nobody() {
        let mut c = BucketCore::new(0, 0.0, 0.0);
        let a = c.reserve(0, 50.0);
        let b = c.reserve(0, 100.0);
        c.cancel(b, 100.0);
        assert_eq!(c.ready_at(a), None);
        let b = c.reserve(0, 100.0);
        c.cancel(a, 50.0);
        assert_eq!(c.ready_at(b), None);
        c.set(0, 1000.0, 0.0);
        assert_eq!(c.ready_at(b), Some(100_000_000));
    }

    /// One step of a simulated workload.
    #[derive(Debug, Clone)]
    enum Step {
        Request {
            gap_us: u64,
            cost: f64,
        },
        SetRate {
            gap_us: u64,
            rate: f64,
            burst: f64,
        },
        /// A waiting request (chosen by `pick`) gives its place back.
        Cancel {
            gap_us: u64,
            pick: usize,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u64..20_000, 0.0f64..5_000.0).prop_map(|(gap_us, cost)| Step::Request { gap_us, cost }),
            1 => (0u64..50_000, prop_oneof![Just(0.0), 1.0f64..1e6], 0.0f64..10_000.0)
                .prop_map(|(gap_us, rate, burst)| Step::SetRate { gap_us, rate, burst }),
        ]
    }

    fn step_with_cancels() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => step(),
            1 => (0u64..20_000, 0usize..64).prop_map(|(gap_us, pick)| Step::Cancel { gap_us, pick }),
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
        let advance = |c: &mut BucketCore,
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
                        c.done(ticket);
                    }
                    _ => break,
                }
            }
            // The ones left wait (as the bucket records them).
            for &(_, ticket, _) in pending.iter() {
                c.wait(ticket);
            }
            *now = target;
        };
        for s in steps {
            match *s {
                Step::Request { gap_us, cost } => {
                    let target = now + gap_us * 1000;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
                    let t = c.reserve(now, cost);
                    pending.push_back((now, t, cost));
                    let target = now;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
                }
                Step::SetRate { gap_us, rate, burst } => {
                    let target = now + gap_us * 1000;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
                    c.set(now, rate, burst);
                    rates.push((now, rate));
                    max_burst = max_burst.max(burst);
                    min_burst = min_burst.min(burst);
                    let target = now;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
                }
                Step::Cancel { gap_us, pick } => {
                    let target = now + gap_us * 1000;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
                    if !pending.is_empty() {
                        let (_, ticket, cost) = pending.remove(pick % pending.len()).unwrap();
                        c.cancel(ticket, cost);
                    }
                    let target = now;
                    advance(&mut c, &mut now, target, &mut pending, &mut admitted);
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

        /// With requests leaving the line at random: what the remaining ones
        /// are admitted never exceeds what the bucket provided since the
        /// start (the initial burst plus the integral of the rate), they go
        /// in arrival order, and every one of them goes once the bucket
        /// is open long enough (no place is lost).
        #[test]
        fn cancellations_never_let_more_through_and_lose_no_place(
            rate0 in 1.0f64..1e6, burst0 in 0.0f64..10_000.0,
            steps in proptest::collection::vec(step_with_cancels(), 1..80)
        ) {
            let mut steps = steps;
            steps.push(Step::SetRate { gap_us: 0, rate: 1000.0, burst: 0.0 });
            steps.push(Step::SetRate { gap_us: 1_000_000_000, rate: 1000.0, burst: 0.0 });
            let (admitted, rates, ..) = simulate(rate0, burst0, &steps);
            let mut sum = 0.0;
            for &(_, at, cost) in &admitted {
                sum += cost;
                let allowed = integral(&rates, 0, at) + burst0;
                prop_assert!(sum <= allowed * (1.0 + 1e-9) + 1e-6, "admitted {} by {} ns, provided {}", sum, at, allowed);
            }
            prop_assert!(admitted.windows(2).all(|w| w[0].1 <= w[1].1 && w[0].0 <= w[1].0));
            let requests = steps.iter().filter(|s| matches!(s, Step::Request { .. })).count();
            let cancels_done = requests - admitted.len();
            let cancel_steps = steps.iter().filter(|s| matches!(s, Step::Cancel { .. })).count();
            prop_assert!(cancels_done <= cancel_steps, "{} requests never admitted, {} cancels", cancels_done, cancel_steps);
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
        let h = std::thread::spawn(move || b2.acquire(10, InstanceId(0)));
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
                std::thread::spawn(move || b.acquire(10, InstanceId(0)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        b.shutdown();
        for h in hs {
            assert_eq!(h.join().unwrap(), Err(Rejection::ShutDown));
        }
        assert_eq!(b.acquire(1, InstanceId(0)), Err(Rejection::ShutDown));
    }

    #[test]
    fn retire_admits_waiters() {
        let b = Arc::new(Bucket::new(0.0, RateUnit::Ops, 0.0));
        let b2 = Arc::clone(&b);
        let h = std::thread::spawn(move || b2.acquire(0, InstanceId(0)));
        std::thread::sleep(Duration::from_millis(20));
        b.retire();
        assert!(h.join().unwrap().is_ok());
    }

    /// Every interleaving, up to a depth, of three requests (a blocking one
    /// and two async ones, which may also be dropped while they wait) with
    /// the clock and one control event (a rate change, closing the bucket,
    /// a change of unit, an instance closing, retirement or shutdown),
    /// driven through the state machine the two drivers share
    /// (`arrive` / `next` / `give_back` / `leave`). At every step:
    /// the waiter count is the number of requests holding a place; a
    /// request that goes never overtakes an earlier one of the same epoch
    /// that could not go yet; while the rate holds, what went is at most
    /// `burst + rate x elapsed`. At the end, once the bucket is retired,
    /// every request still holding a place goes, and nothing waits.
    mod interleavings {
        use super::*;
        use std::cell::Cell;

        thread_local! {
            static NOW: Cell<u64> = const { Cell::new(0) };
        }
        fn sim_now() -> u64 {
            NOW.with(Cell::get)
        }

        const SIZE: u64 = 60;
        const RATE: f64 = 1000.0;
        const BURST: f64 = 100.0;
        const TICK: u64 = 30_000_000;
        const CLOSING: InstanceId = InstanceId(7);
        /// Request 0 blocks (it cannot be dropped); 1 and 2 are async.
        const ASYNC: [bool; 3] = [false, true, true];
        /// Request 1 belongs to the instance that may close.
        const INSTANCE: [InstanceId; 3] = [InstanceId(1), CLOSING, InstanceId(1)];

        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Req {
            Before,
            Holding { ticket: f64, epoch: u32, start: u64 },
            Went,
            Failed,
            Dropped,
        }

        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Control {
            Faster,
            Closed,
            Unit,
            CloseInstance,
            Retire,
            Shutdown,
        }

        #[derive(Clone)]
        struct World {
            st: State,
            reqs: [Req; 3],
            arrived: usize,
            control: Option<Control>,
            control_done: bool,
            /// Tokens of requests that went, with the rate unchanged.
            went_tokens: f64,
            /// Every place taken, in order: (epoch, request, still live).
            places: Vec<(u32, usize, bool)>,
        }

        impl World {
            /// A request's latest place stops counting (it gave it back).
            fn gave_back(&mut self, i: usize) {
                if let Some(p) = self.places.iter_mut().rev().find(|p| p.1 == i) {
                    p.2 = false;
                }
            }

            fn check(&self, trace: &[String]) {
                // A place counts what the live places up to it cost: the
                // requests behind one given back do not pay for it.
                for (i, r) in self.reqs.iter().enumerate() {
                    let Req::Holding { ticket, epoch, .. } = *r else { continue };
                    if epoch != self.st.epoch as u32 || self.st.retired || self.st.shutdown {
                        continue;
                    }
                    let cost = self.st.cost(SIZE);
                    let last = self.places.iter().rposition(|p| p.1 == i).expect("a holder has a place");
                    let ahead = self.places[..=last].iter().filter(|p| p.0 == epoch && p.2).count() as f64;
                    let at = self.st.core.effective(ticket);
                    assert!(
                        (at - ahead * cost).abs() < 1e-6,
                        "request {i} at {at}, not {}; trace {trace:?}",
                        ahead * cost
                    );
                }
                let holding = self.reqs.iter().filter(|r| matches!(r, Req::Holding { .. })).count() as u64;
                assert_eq!(self.st.waiters, holding, "waiter count; trace {trace:?}");
                assert_eq!(self.st.stats.waiting, holding, "waiting stat; trace {trace:?}");
                assert!(self.st.core.waiting.len() as u64 <= holding, "stale waiting tickets; trace {trace:?}");
                if !self.control_done || matches!(self.control, Some(Control::CloseInstance)) {
                    let bound = BURST + RATE * sim_now() as f64 * 1e-9 + 1e-6;
                    assert!(
                        self.went_tokens <= bound,
                        "{} tokens went, bound {bound}; trace {trace:?}",
                        self.went_tokens
                    );
                }
            }

            /// Request `i` asks what to do next.
            fn poll(&mut self, i: usize, trace: &[String]) {
                let Req::Holding { mut ticket, mut epoch, start } = self.reqs[i] else { unreachable!() };
                let before = epoch;
                let had = self.st.stats.admitted_tokens;
                let next = self.st.next(&mut ticket, &mut epoch, SIZE, INSTANCE[i], sim_now);
                if epoch != before && self.st.stats.admitted_tokens > had {
                    self.places.push((epoch, i, true));
                }
                match next {
                    Next::Go => {
                        // Nobody of the same epoch with an earlier place is still unable to go.
                        for (j, r) in self.reqs.iter().enumerate() {
                            if let Req::Holding { ticket: t, epoch: e, .. } = *r
                                && j != i
                                && e == epoch
                                && epoch == before
                                && t < ticket
                                && !self.st.retired
                            {
                                let ready = self.st.core.ready_at(t).is_some_and(|at| at <= sim_now());
                                assert!(
                                    ready || self.st.is_closed(INSTANCE[j]),
                                    "request {i} overtook {j}; trace {trace:?}"
                                );
                            }
                        }
                        if !self.st.retired && epoch == 0 {
                            self.went_tokens += SIZE as f64;
                        }
                        self.st.leave(ticket, epoch, start, sim_now());
                        self.reqs[i] = Req::Went;
                    }
                    Next::Left => {
                        self.gave_back(i);
                        self.st.leave(ticket, epoch, start, sim_now());
                        self.reqs[i] = Req::Went;
                    }
                    Next::Fail(_) => {
                        self.st.leave(ticket, epoch, start, sim_now());
                        self.reqs[i] = Req::Failed;
                    }
                    Next::WaitUntil(at) => {
                        assert!(at > sim_now(), "told to wait for a time that has come; trace {trace:?}");
                        self.reqs[i] = Req::Holding { ticket, epoch, start };
                    }
                    Next::WaitClosed => {
                        assert_eq!(self.st.core.rate(), 0.0, "waits for a change of an open bucket; trace {trace:?}");
                        self.reqs[i] = Req::Holding { ticket, epoch, start };
                    }
                }
            }

            fn arrive(&mut self) {
                let i = self.arrived;
                self.arrived += 1;
                let had = self.st.stats.admitted_tokens;
                let r = self.st.arrive(sim_now(), SIZE, INSTANCE[i]);
                if self.st.stats.admitted_tokens > had {
                    self.places.push((self.st.epoch as u32, i, true));
                }
                self.reqs[i] = match r {
                    Err(_) => Req::Failed,
                    Ok(None) => {
                        if self.st.stats.admitted_tokens > had && !self.st.retired && self.st.epoch == 0 {
                            self.went_tokens += SIZE as f64;
                        }
                        Req::Went
                    }
                    Ok(Some((ticket, epoch))) => Req::Holding { ticket, epoch, start: sim_now() },
                };
            }

            fn apply(&mut self, c: Control) {
                let now = sim_now();
                match c {
                    Control::Faster => self.st.set(now, RATE * 10.0, RateUnit::Bytes, BURST),
                    Control::Closed => self.st.set(now, 0.0, RateUnit::Bytes, BURST),
                    Control::Unit => self.st.set(now, 10.0, RateUnit::Ops, 1.0),
                    Control::CloseInstance => self.st.closed.push(CLOSING),
                    Control::Retire => self.st.retired = true,
                    Control::Shutdown => self.st.shutdown = true,
                }
                self.control_done = true;
            }
        }

        /// Explores every sequence of `depth` more events from `w`; returns
        /// how many complete sequences it checked.
        fn explore(w: &World, depth: usize, trace: &mut Vec<String>) -> u64 {
            w.check(trace);
            let holding: Vec<usize> = (0..3).filter(|&i| matches!(w.reqs[i], Req::Holding { .. })).collect();
            if depth == 0 || (w.arrived == 3 && holding.is_empty()) {
                finish(w.clone(), trace);
                return 1;
            }
            let mut n = 0;
            let mut step = |w2: World, what: String, trace: &mut Vec<String>| {
                trace.push(what);
                let t = sim_now();
                n += explore(&w2, depth - 1, trace);
                NOW.with(|c| c.set(t));
                trace.pop();
            };
            if w.arrived < 3 {
                let mut w2 = w.clone();
                w2.arrive();
                step(w2, format!("arrive {}", w.arrived), trace);
            }
            for &i in &holding {
                let mut w2 = w.clone();
                w2.poll(i, trace);
                step(w2, format!("poll {i}"), trace);
                if ASYNC[i] {
                    let mut w2 = w.clone();
                    let Req::Holding { ticket, epoch, .. } = w2.reqs[i] else { unreachable!() };
                    w2.st.give_back(ticket, epoch, SIZE);
                    w2.gave_back(i);
                    w2.reqs[i] = Req::Dropped;
                    step(w2, format!("drop {i}"), trace);
                }
            }
            NOW.with(|c| c.set(c.get() + TICK));
            step(w.clone(), "tick".into(), trace);
            NOW.with(|c| c.set(c.get() - TICK));
            if let (Some(c), false) = (w.control, w.control_done) {
                let mut w2 = w.clone();
                w2.apply(c);
                step(w2, format!("{c:?}"), trace);
            }
            n
        }

        /// Retires the bucket: every request that still holds a place goes
        /// (or fails, after a shutdown), and then nothing waits.
        fn finish(mut w: World, trace: &[String]) {
            w.st.retired = true;
            for i in 0..3 {
                if matches!(w.reqs[i], Req::Holding { .. }) {
                    w.poll(i, trace);
                    assert!(matches!(w.reqs[i], Req::Went | Req::Failed), "request {i} stranded; trace {trace:?}");
                }
            }
            assert_eq!(w.st.waiters, 0, "trace {trace:?}");
            assert!(w.st.core.waiting.is_empty(), "a ticket left on the waiting list; trace {trace:?}");
        }

        #[test]
        fn every_interleaving_keeps_the_line_and_strands_no_one() {
            let controls = [
                None,
                Some(Control::Faster),
                Some(Control::Closed),
                Some(Control::Unit),
                Some(Control::CloseInstance),
                Some(Control::Retire),
                Some(Control::Shutdown),
            ];
            let mut total = 0;
            for control in controls {
                NOW.with(|c| c.set(0));
                let w = World {
                    st: State::new(0, RATE, RateUnit::Bytes, BURST),
                    reqs: [Req::Before; 3],
                    arrived: 0,
                    control,
                    control_done: false,
                    went_tokens: 0.0,
                    places: Vec::new(),
                };
                total += explore(&w, 11, &mut Vec::new());
            }
            // Every scenario was explored to its depth (a broken search
            // would check a handful).
            assert!(total > 100_000, "{total} sequences");
        }
    }
}
