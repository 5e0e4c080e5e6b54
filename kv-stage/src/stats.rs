//! Monotonic statistics, counted per thread without shared cache lines.
//!
//! Every thread that enforces gets a process-wide *thread slot* (released
//! when the thread exits). Each stage keeps one shard of counters per thread
//! slot, allocated on the thread's first request; the thread is the only
//! writer of its shard, so a count is a plain load and store of a relaxed
//! atomic (no `lock` prefix, no shared line). Threads beyond
//! [`MAX_THREAD_SLOTS`] share one overflow shard and use `fetch_add`.
//!
//! Readers sum the shards. Counters never reset: a control plane computes
//! rates by differencing two collections, and any number of readers can do so
//! independently.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::Release};
use std::sync::{Mutex, OnceLock};

use crossbeam_utils::CachePadded;

use crate::context::{Context, RequestContext, RequestType};

/// Threads that get an exclusive shard; more threads share one.
pub const MAX_THREAD_SLOTS: usize = 256;
const SHARED_SLOT: usize = MAX_THREAD_SLOTS;

/// Counter slots per stage (channels and objects ever created).
pub const MAX_COUNTER_SLOTS: usize = INLINE_SLOTS + SEG * NSEG;
/// Slots every shard holds inline; later ones live in lazily allocated
/// segments.
const INLINE_SLOTS: usize = 256;
const SEG: usize = 64;
const NSEG: usize = 60;

/// Distinct workflows a thread tracks on its own; more go to "other".
const WORKFLOWS_PER_THREAD: usize = 4;

struct SlotPool {
    free: Vec<usize>,
    next: usize,
}

static POOL: Mutex<SlotPool> = Mutex::new(SlotPool { free: Vec::new(), next: 0 });

struct ThreadSlot(usize);

impl ThreadSlot {
    fn acquire() -> Self {
        let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = p.free.pop() {
            return ThreadSlot(s);
        }
        if p.next < MAX_THREAD_SLOTS {
            p.next += 1;
            return ThreadSlot(p.next - 1);
        }
        ThreadSlot(SHARED_SLOT)
    }
}

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        // Later counts on this thread (from other TLS destructors) must not
        // use the slot once another thread may own it.
        let _ = SLOT.try_with(|s| s.set(SHARED_SLOT));
        if self.0 != SHARED_SLOT {
            // The mutex orders this thread's last counts before the next
            // owner's first ones, so each shard keeps a single writer.
            POOL.lock().unwrap_or_else(|e| e.into_inner()).free.push(self.0);
        }
    }
}

const UNASSIGNED: usize = usize::MAX;

thread_local! {
    /// Owns the slot and gives it back when the thread exits.
    static SLOT_GUARD: ThreadSlot = ThreadSlot::acquire();
    /// The slot, readable without the lazy-init check of `SLOT_GUARD`.
    static SLOT: std::cell::Cell<usize> = const { std::cell::Cell::new(UNASSIGNED) };
}

#[inline]
fn thread_slot() -> usize {
    let s = SLOT.get();
    if s != UNASSIGNED {
        return s;
    }
    assign_slot()
}

#[cold]
fn assign_slot() -> usize {
    // If the guard is already destroyed (a TLS destructor enforcing during
    // thread exit), the slot may be reused: count through the shared shard.
    let s = SLOT_GUARD.try_with(|g| g.0).unwrap_or(SHARED_SLOT);
    SLOT.set(s);
    s
}

/// Operations and bytes.
#[derive(Default)]
struct Cell {
    ops: AtomicU64,
    bytes: AtomicU64,
}

impl Cell {
    /// Adds from the cell's only writer: a relaxed load and store cannot
    /// lose an update, and needs no locked instruction.
    #[inline(always)]
    fn add_exclusive(&self, bytes: u64) {
        self.ops.store(self.ops.load(Relaxed).wrapping_add(1), Relaxed);
        self.bytes.store(self.bytes.load(Relaxed).wrapping_add(bytes), Relaxed);
    }

    /// Adds from one of several writers.
    fn add_shared(&self, bytes: u64) {
        self.ops.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    #[inline(always)]
    fn add(&self, exclusive: bool, bytes: u64) {
        if exclusive { self.add_exclusive(bytes) } else { self.add_shared(bytes) }
    }

    /// Adds bytes without an operation (a charge after the request).
    fn add_bytes(&self, exclusive: bool, bytes: u64) {
        if exclusive {
            self.bytes.store(self.bytes.load(Relaxed).wrapping_add(bytes), Relaxed);
        } else {
            self.bytes.fetch_add(bytes, Relaxed);
        }
    }

    fn get(&self) -> (u64, u64) {
        (self.ops.load(Relaxed), self.bytes.load(Relaxed))
    }
}

struct WorkflowCell {
    /// Workflow id + 1; 0 while unused. Written once, by the shard's owner.
    id: AtomicU64,
    cell: Cell,
}

struct Shard {
    inline: [Cell; INLINE_SLOTS],
    segments: [OnceLock<Box<CachePadded<[Cell; SEG]>>>; NSEG],
    contexts: [Cell; RequestContext::MAX],
    /// The file data requests (reads and writes) among `contexts`.
    file_contexts: [Cell; RequestContext::MAX],
    /// The file writes among `file_contexts`.
    write_contexts: [Cell; RequestContext::MAX],
    workflows: [WorkflowCell; WORKFLOWS_PER_THREAD],
    other_workflows: Cell,
}

impl Shard {
    /// Counts a workflow other than the one in the first cell (owner only).
    #[inline(never)]
    fn record_workflow(&self, key: u64, size: u64) {
        if key != 0 {
            for w in &self.workflows {
                let id = w.id.load(Relaxed);
                if id == key {
                    return w.cell.add_exclusive(size);
                }
                if id == 0 {
                    w.id.store(key, Release);
                    return w.cell.add_exclusive(size);
                }
            }
        }
        self.other_workflows.add_exclusive(size);
    }

    fn new() -> Self {
        Shard {
            inline: std::array::from_fn(|_| Cell::default()),
            segments: std::array::from_fn(|_| OnceLock::new()),
            contexts: std::array::from_fn(|_| Cell::default()),
            file_contexts: std::array::from_fn(|_| Cell::default()),
            write_contexts: std::array::from_fn(|_| Cell::default()),
            workflows: std::array::from_fn(|_| WorkflowCell { id: AtomicU64::new(0), cell: Cell::default() }),
            other_workflows: Cell::default(),
        }
    }

    #[inline(always)]
    fn slot(&self, s: u32) -> &Cell {
        match self.inline.get(s as usize) {
            Some(c) => c,
            None => self.segment_slot(s as usize - INLINE_SLOTS),
        }
    }

    #[cold]
    fn segment_slot(&self, s: usize) -> &Cell {
        let seg =
            self.segments[s / SEG].get_or_init(|| Box::new(CachePadded::new(std::array::from_fn(|_| Cell::default()))));
        &seg[s % SEG]
    }

    fn peek_slot(&self, s: u32) -> (u64, u64) {
        let s = s as usize;
        if let Some(c) = self.inline.get(s) {
            return c.get();
        }
        let s = s - INLINE_SLOTS;
        self.segments[s / SEG].get().map_or((0, 0), |seg| seg[s % SEG].get())
    }
}

/// One `S` per thread slot, plus the shared overflow one, each on cache
/// lines of its own and made on the first use from its slot: the one
/// sharding mechanism behind every counter of the crate.
struct PerThread<S> {
    shards: Box<[OnceLock<Box<CachePadded<S>>>]>,
    make: fn() -> S,
}

impl<S> PerThread<S> {
    fn new(make: fn() -> S) -> Self {
        PerThread { shards: (0..=MAX_THREAD_SLOTS).map(|_| OnceLock::new()).collect(), make }
    }

    /// The calling thread's shard, and whether the thread is its only
    /// writer (false for the shared overflow shard).
    #[inline(always)]
    fn mine(&self) -> (&S, bool) {
        let slot = thread_slot();
        (self.shard(slot), slot != SHARED_SLOT)
    }

    #[inline(always)]
    fn shard(&self, slot: usize) -> &S {
        match self.shards[slot].get() {
            Some(s) => s,
            None => self.new_shard(slot),
        }
    }

    #[cold]
    fn new_shard(&self, slot: usize) -> &S {
        self.shards[slot].get_or_init(|| Box::new(CachePadded::new((self.make)())))
    }

    /// Every shard made so far.
    fn iter(&self) -> impl Iterator<Item = &S> {
        self.shards.iter().filter_map(|s| s.get().map(|b| &***b))
    }
}

/// `(ops, bytes)` of one request context: every request, its file data
/// requests (reads and writes of file contents), and its file writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ContextTotals {
    pub(crate) all: (u64, u64),
    pub(crate) file: (u64, u64),
    pub(crate) writes: (u64, u64),
}

/// `(id, ops, bytes)` per tracked workflow, and `(ops, bytes)` of the rest.
pub(crate) type WorkflowTotals = (Vec<(u64, u64, u64)>, (u64, u64));

/// A stage's counters.
pub(crate) struct Counters {
    shards: PerThread<Shard>,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters { shards: PerThread::new(Shard::new) }
    }

    /// Counts one admitted request on its channel, object (if any), request
    /// context and workflow.
    #[inline(always)]
    pub(crate) fn record(&self, channel_slot: u32, object_slot: Option<u32>, ctx: &Context) {
        let (shard, exclusive) = self.shards.mine();
        if !exclusive {
            return Self::record_shared(shard, channel_slot, object_slot, ctx);
        }
        // The common case, kept small: this thread is the shard's only writer.
        let size = ctx.size;
        shard.slot(channel_slot).add_exclusive(size);
        if let Some(o) = object_slot {
            shard.slot(o).add_exclusive(size);
        }
        shard.contexts[ctx.context.index()].add_exclusive(size);
        if ctx.request_type.is_file_data() {
            shard.file_contexts[ctx.context.index()].add_exclusive(size);
            if matches!(ctx.request_type, RequestType::Write) {
                shard.write_contexts[ctx.context.index()].add_exclusive(size);
            }
        }
        let key = ctx.workflow.0.wrapping_add(1);
        let first = &shard.workflows[0];
        if first.id.load(Relaxed) == key {
            return first.cell.add_exclusive(size);
        }
        shard.record_workflow(key, size);
    }

    /// Threads beyond [`MAX_THREAD_SLOTS`] share one shard.
    #[cold]
    #[inline(never)]
    fn record_shared(shard: &Shard, channel_slot: u32, object_slot: Option<u32>, ctx: &Context) {
        shard.slot(channel_slot).add_shared(ctx.size);
        if let Some(o) = object_slot {
            shard.slot(o).add_shared(ctx.size);
        }
        shard.contexts[ctx.context.index()].add_shared(ctx.size);
        if ctx.request_type.is_file_data() {
            shard.file_contexts[ctx.context.index()].add_shared(ctx.size);
            if matches!(ctx.request_type, RequestType::Write) {
                shard.write_contexts[ctx.context.index()].add_shared(ctx.size);
            }
        }
        shard.other_workflows.add_shared(ctx.size);
    }

    fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.iter()
    }

    /// Total `(ops, bytes)` of a counter slot.
    pub(crate) fn slot_total(&self, slot: u32) -> (u64, u64) {
        self.shards().map(|s| s.peek_slot(slot)).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Adds `bytes` (no operation) to a channel, object and request
    /// context: what a request turned out to cost after it was admitted.
    pub(crate) fn record_bytes(&self, channel_slot: u32, object_slot: Option<u32>, ctx: &Context, bytes: u64) {
        let (shard, exclusive) = self.shards.mine();
        shard.slot(channel_slot).add_bytes(exclusive, bytes);
        if let Some(o) = object_slot {
            shard.slot(o).add_bytes(exclusive, bytes);
        }
        shard.contexts[ctx.context.index()].add_bytes(exclusive, bytes);
    }

    /// Totals per request context id (index = context id): all requests,
    /// file data requests, and file writes.
    pub(crate) fn context_totals(&self) -> Vec<ContextTotals> {
        let mut v = vec![ContextTotals::default(); RequestContext::MAX];
        let add = |acc: &mut (u64, u64), c: &Cell| {
            let (o, b) = c.get();
            acc.0 += o;
            acc.1 += b;
        };
        for s in self.shards() {
            for (i, t) in v.iter_mut().enumerate() {
                add(&mut t.all, &s.contexts[i]);
                add(&mut t.file, &s.file_contexts[i]);
                add(&mut t.writes, &s.write_contexts[i]);
            }
        }
        v
    }

    /// Totals per workflow id (`(id, ops, bytes)`), plus the total of
    /// untracked workflows.
    pub(crate) fn workflow_totals(&self) -> WorkflowTotals {
        let mut map: std::collections::BTreeMap<u64, (u64, u64)> = std::collections::BTreeMap::new();
        let mut other = (0, 0);
        for s in self.shards() {
            for w in &s.workflows {
                let id = w.id.load(std::sync::atomic::Ordering::Acquire);
                if id != 0 {
                    let (o, b) = w.cell.get();
                    let e = map.entry(id - 1).or_default();
                    e.0 += o;
                    e.1 += b;
                }
            }
            let (o, b) = s.other_workflows.get();
            other.0 += o;
            other.1 += b;
        }
        (map.into_iter().map(|(k, (o, b))| (k, o, b)).collect(), other)
    }
}

/// A fixed array of `N` monotonic (ops, bytes) counters that many threads
/// add to without sharing cache lines: each thread writes its own shard,
/// made the same way as the stage's (see the module documentation). For
/// layers that keep their own statistics next to the stage's, such as
/// per-file-kind I/O in rocks-env.
pub struct CounterArray<const N: usize> {
    shards: PerThread<[Cell; N]>,
}

impl<const N: usize> Default for CounterArray<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> std::fmt::Debug for CounterArray<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CounterArray").field("totals", &self.totals()).finish()
    }
}

impl<const N: usize> CounterArray<N> {
    /// All counters at zero.
    pub fn new() -> Self {
        CounterArray { shards: PerThread::new(|| std::array::from_fn(|_| Cell::default())) }
    }

    /// Adds one operation of `bytes` to counter `index` (ignored when
    /// `index >= N`).
    #[inline]
    pub fn add(&self, index: usize, bytes: u64) {
        let (shard, exclusive) = self.shards.mine();
        if let Some(c) = shard.get(index) {
            c.add(exclusive, bytes);
        }
    }

    /// `(ops, bytes)` of every counter.
    pub fn totals(&self) -> [(u64, u64); N] {
        let mut out = [(0u64, 0u64); N];
        for shard in self.shards.iter() {
            for (acc, c) in out.iter_mut().zip(shard.iter()) {
                let (o, b) = c.get();
                acc.0 += o;
                acc.1 += b;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{InstanceId, WorkflowId};
    use std::sync::Arc;

    #[test]
    fn counts_from_many_threads_add_up() {
        let c = Arc::new(Counters::new());
        // All eight threads are alive at once, so each has its own slot.
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let c = Arc::clone(&c);
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    barrier.wait();
                    let ctx =
                        Context::with(WorkflowId(t), RequestType::Write, RequestContext::BG_FLUSH, InstanceId(0), 10);
                    for _ in 0..10_000 {
                        c.record(1, Some(70), &ctx);
                    }
                    barrier.wait();
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.slot_total(1), (80_000, 800_000));
        assert_eq!(c.slot_total(70), (80_000, 800_000));
        assert_eq!(c.slot_total(2), (0, 0));
        assert_eq!(c.context_totals()[RequestContext::BG_FLUSH.index()].all, (80_000, 800_000));
        assert_eq!(c.context_totals()[RequestContext::BG_FLUSH.index()].writes, (80_000, 800_000));
        let (wf, other) = c.workflow_totals();
        assert_eq!(other, (0, 0));
        assert_eq!(wf.len(), 8);
        assert!(wf.iter().all(|&(_, o, b)| o == 10_000 && b == 100_000));
    }

    #[test]
    fn counter_array_sums_threads() {
        let a = Arc::new(CounterArray::<3>::new());
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let a = Arc::clone(&a);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        a.add(1, 10);
                    }
                    a.add(7, 1); // out of range: ignored
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(a.totals(), [(0, 0), (4000, 40_000), (0, 0)]);
    }

    #[test]
    fn many_workflows_on_one_thread_overflow_to_other() {
        let c = Counters::new();
        for w in 0..10 {
            let ctx = Context::with(WorkflowId(w), RequestType::Read, RequestContext::FOREGROUND, InstanceId(0), 1);
            c.record(0, None, &ctx);
        }
        let (wf, other) = c.workflow_totals();
        assert_eq!(wf.len(), WORKFLOWS_PER_THREAD);
        assert_eq!(other.0, 10 - WORKFLOWS_PER_THREAD as u64);
    }
}
