//! The stage: channels of enforcement objects, the rules that pick them, the
//! statistics a control plane reads, and the instance interface layers call.
//!
//! **Data path.** [`Stage::enforce`] loads the current [`Layout`] snapshot
//! (lock-free, via `arc-swap`), picks the channel and the object from compiled
//! tables, enforces, and counts. It takes no lock of the stage's own; an
//! object may block (a DRL waiting for tokens) without holding one.
//!
//! **Control path.** [`Stage::apply`] runs a batch of rules against a copy of
//! the control model. If any rule fails, nothing changes. Otherwise
//! configuration changes are applied to the live objects, the new layout is
//! published atomically, and removed objects are retired (their waiters are
//! released). A request that already picked an object finishes on it, so no
//! request is lost or enforced twice when rules change under load.

mod info;
mod model;
mod snapshot;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;

use crate::clock::now_ns;
use crate::context::{Context, InstanceId, RequestContext, WorkflowId};
use crate::error::{EnforceError, Error, Location, Result};
use crate::matching::Match;
use crate::objects::{AsyncWait, EnforcementObject, Object, ObjectChange, ObjectKind, ObjectSpec, Outcome};
use crate::rules::{Rule, RuleSet};
use crate::stats::Counters;

use info::coverage;
pub use info::{
    ApplyReport, ChannelCounters, ChannelInfo, Collection, ContextCounters, Counter, Coverage, InstanceInfo,
    JobCounters, JobCounts, ObjectCounters, ObjectHandle, ObjectInfo, RatePair, Rates, RouteInfo, StageInfo,
    WorkflowCounters,
};
use model::{ChannelModel, Model, RouteModel, SlotUse, Txn};
use snapshot::{LAYOUT_CACHE, Layout, NO_OBJECT, Route, compile, route_key};

/// Id of the channel every stage starts with, which receives requests no
/// route matches until another default is set.
pub const DEFAULT_CHANNEL: &str = "default";

/// A stage's layout and object settings at one moment ([`Stage::checkpoint`]),
/// to bring back with [`Stage::restore`]; e.g. what an agent restores when
/// a controller's lease runs out.
#[derive(Clone)]
pub struct Checkpoint {
    stage: u64,
    generation: u64,
    model: Model,
    /// Each object's settings, in the model's order.
    specs: Vec<Option<crate::objects::ObjectSpec>>,
}

impl Checkpoint {
    /// The rules generation the stage had then.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("generation", &self.generation)
            .field("channels", &self.model.channels.len())
            .field("objects", &self.specs.len())
            .finish_non_exhaustive()
    }
}

/// A data plane stage.
///
/// Share it as `Arc<Stage>`; every method takes `&self`. Dropping the last
/// reference shuts it down.
///
/// ```
/// use kv_stage::{Context, Match, ObjectSpec, DrlSpec, RequestContext, RequestType, Rule, Stage};
///
/// let stage = Stage::new("example");
/// stage.apply_rules([
///     Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
///     Rule::CreateObject {
///         channel: "flush".into(),
///         object: "drl".into(),
///         spec: ObjectSpec::Drl(DrlSpec::new("64MiB/s".parse().unwrap())),
///         matches: None,
///     },
/// ]).unwrap();
/// let ctx = Context::new(RequestType::Write, 4096).in_context(RequestContext::BG_FLUSH);
/// stage.enforce(&ctx).unwrap();
/// let stats = stage.collect();
/// assert_eq!(stats.channel("flush").unwrap().bytes, 4096);
/// ```
pub struct Stage {
    name: String,
    id: u64,
    started_ns: u64,
    /// Process-unique key of this stage in the per-thread layout caches.
    uid: u64,
    layout: ArcSwap<Layout>,
    /// Bumped after every new layout is stored (Release); readers that see
    /// a generation see its layout.
    layout_generation: CachePadded<AtomicU64>,
    counters: Counters,
    control: Mutex<Model>,
    shut_down: AtomicBool,
    /// Jobs begun and completed per instance and request context (see
    /// `job_started`). Jobs are rare events: a mutex is cheap enough.
    jobs: Mutex<BTreeMap<(InstanceId, RequestContext), (u64, u64)>>,
    /// Who is told when a job begins ([`Stage::watch_jobs`]).
    job_watchers: Arc<JobWatchers>,
    /// What [`StageInfo::coverage`] says for the layout of a generation.
    coverage: Mutex<Option<(u64, Arc<[Coverage]>)>>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage").field("name", &self.name).field("id", &self.id).finish_non_exhaustive()
    }
}

static NEXT_STAGE_UID: AtomicU64 = AtomicU64::new(1);

fn new_stage_id() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    // splitmix64 over time, pid and a sequence number.
    let mut z = t ^ (u64::from(std::process::id()) << 32) ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Stage {
    /// A stage with only the pass-through [`DEFAULT_CHANNEL`].
    pub fn new(name: impl Into<String>) -> Self {
        let default: Arc<str> = DEFAULT_CHANNEL.into();
        let model = Model {
            channels: vec![ChannelModel {
                id: Arc::clone(&default),
                slot: SlotUse { slot: 0, incarnation: 0, base: (0, 0) },
                objects: Vec::new(),
                routes: Vec::new(),
                default_object: None,
            }],
            routes: Vec::new(),
            default_channel: default,
            next_slot: 1,
            free_slots: VecDeque::new(),
            next_incarnation: 0,
            generation: 0,
            open_instances: Vec::new(),
            closed_instances: Vec::new(),
        };
        let layout = compile(&model).expect("the initial layout compiles");
        Stage {
            name: name.into(),
            id: new_stage_id(),
            started_ns: now_ns(),
            uid: NEXT_STAGE_UID.fetch_add(1, Ordering::Relaxed),
            layout: ArcSwap::from_pointee(layout),
            layout_generation: CachePadded::new(AtomicU64::new(0)),
            counters: Counters::new(),
            control: Mutex::new(model),
            shut_down: AtomicBool::new(false),
            jobs: Mutex::new(BTreeMap::new()),
            job_watchers: Arc::default(),
            coverage: Mutex::new(None),
        }
    }

    /// The stage's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The stage's unique id.
    pub fn id(&self) -> u64 {
        self.id
    }

    // ----- instance interface --------------------------------------------

    /// Enforces one request: picks its channel and object, lets the object
    /// admit it (possibly waiting), and counts it.
    ///
    /// On `Err` the caller must not carry out the request; layers report the
    /// error to their own caller. Never allocates on success.
    #[inline]
    pub fn enforce(&self, ctx: &Context) -> Result<Outcome, EnforceError> {
        if self.shut_down.load(Ordering::Relaxed) {
            return Err(EnforceError::shut_down(None));
        }
        let generation = self.layout_generation.load(Ordering::Acquire);
        let key = route_key(ctx);
        let remembered = self.remembered(ctx, generation, key);
        match remembered {
            // A Noop or a pass-through: nothing to call, only to count.
            Some(route) if !route.call => {
                self.counters.record(route.channel_slot, route.object_slot(), ctx);
                Ok(Outcome::IMMEDIATE)
            }
            _ => self.enforce_with_layout(ctx, generation, key, remembered),
        }
    }

    /// The route this thread remembered for requests with `ctx`'s
    /// classifiers under this stage and layout generation.
    #[inline(always)]
    fn remembered(&self, ctx: &Context, generation: u64, key: u64) -> Option<Route> {
        LAYOUT_CACHE
            .try_with(|c| {
                (c.stage_uid.get() == self.uid
                    && c.generation.get() == generation
                    && c.memo_key.get() == key
                    && c.memo_workflow.get() == ctx.workflow.0)
                    .then(|| c.memo.get())
            })
            .ok()
            .flatten()
    }

    /// Looks `ctx`'s route up in `layout` and remembers it for the thread.
    #[inline(always)]
    fn route_and_remember(&self, layout: &Layout, ctx: &Context, generation: u64, key: u64) -> Route {
        let r = layout.route(ctx);
        let _ = LAYOUT_CACHE.try_with(|c| {
            if c.stage_uid.get() == self.uid && c.generation.get() == generation {
                c.memo_key.set(key);
                c.memo_workflow.set(ctx.workflow.0);
                c.memo.set(r);
            }
        });
        r
    }

    /// The path through the layout: the route is looked up (unless it was
    /// remembered) and the object called.
    #[inline(never)]
    fn enforce_with_layout(
        &self,
        ctx: &Context,
        generation: u64,
        key: u64,
        remembered: Option<Route>,
    ) -> Result<Outcome, EnforceError> {
        self.with_layout(generation, |layout| {
            let route = remembered.unwrap_or_else(|| self.route_and_remember(layout, ctx, generation, key));
            if route.object == NO_OBJECT {
                self.counters.record(route.channel_slot, None, ctx);
                return Ok(Outcome::IMMEDIATE);
            }
            let o = &layout.channels[route.channel as usize].objects[route.object as usize];
            match o.object.enforce(ctx) {
                Ok(outcome) => {
                    self.counters.record(route.channel_slot, Some(route.object_slot), ctx);
                    Ok(outcome)
                }
                Err(r) => Err(EnforceError::from_rejection(&o.label, r)),
            }
        })
    }

    /// Gives back what an admitted request did not use: it was enforced as
    /// `ctx` (same classifiers and size) and moved `ctx.size - unused`
    /// bytes, e.g. a read that reached the end of its file. The object it
    /// went to returns the unused bytes to its bandwidth bucket, so they do
    /// not delay the requests after it. Counters keep the size enforced.
    /// Should the rules have changed in between, the refund goes to the
    /// object the same request would go to now.
    pub fn refund(&self, ctx: &Context, unused: u64) {
        if unused == 0 || self.shut_down.load(Ordering::Relaxed) {
            return;
        }
        self.with_current_route(ctx, true, |layout, route| {
            if route.object != NO_OBJECT {
                layout.channels[route.channel as usize].objects[route.object as usize].object.refund(ctx, unused);
            }
        });
    }

    /// Calls `f` with the layout and the route a request like `ctx` takes
    /// now (the thread's remembered one, or looked up and remembered): for
    /// what is done to an admitted request afterwards. With `called_only`,
    /// a remembered route to no object to call skips `f` and the layout.
    fn with_current_route(&self, ctx: &Context, called_only: bool, f: impl FnOnce(&Layout, Route)) {
        let generation = self.layout_generation.load(Ordering::Acquire);
        let key = route_key(ctx);
        let remembered = self.remembered(ctx, generation, key);
        if called_only && remembered.is_some_and(|r| !r.call) {
            return;
        }
        self.with_layout(generation, |layout| {
            let route = remembered.unwrap_or_else(|| self.route_and_remember(layout, ctx, generation, key));
            f(layout, route);
        });
    }

    /// Charges an admitted request for `extra` bytes it turned out to move
    /// beyond `ctx.size` (it was enforced as `ctx`): a key-value read, whose
    /// size is known only once it returns, is admitted at its known size
    /// and then charged what it read. The object it went to takes the bytes
    /// without waiting (a DRL or QoS bandwidth bucket goes into debt, and
    /// the requests after it wait for them); its channel, object and
    /// context counters add the bytes (not another operation). Should the
    /// rules have changed in between, the charge goes to the object the
    /// same request would go to now.
    pub fn charge(&self, ctx: &Context, extra: u64) {
        if extra == 0 || self.shut_down.load(Ordering::Relaxed) {
            return;
        }
        self.with_current_route(ctx, false, |layout, route| {
            self.counters.record_bytes(route.channel_slot, route.object_slot(), ctx, extra);
            if route.call && route.object != NO_OBJECT {
                layout.channels[route.channel as usize].objects[route.object as usize].object.charge(ctx, extra);
            }
        });
    }

    /// Enforces one request as a future: the async form of
    /// [`enforce`](Self::enforce), for callers on an async runtime.
    ///
    /// The request takes its place in the same FIFO line as blocking
    /// callers of the same object (built-in objects: a DRL's or QoS
    /// object's token bucket), and while it waits the task yields instead
    /// of parking its thread. The future is cancel-safe: dropped while
    /// waiting, it gives its place back, is not charged, and the requests
    /// behind it move up. An unthrottled request completes in its first
    /// poll without allocating, as `enforce` does.
    ///
    /// It needs no particular runtime: deadlines are kept by kv-stage's own
    /// timer thread (see [`timer`](crate::timer)). Application objects that
    /// do not implement [`EnforcementObject::poll_enforce`] are called
    /// through their blocking `enforce`.
    ///
    /// ```
    /// use kv_stage::{Context, DrlSpec, ObjectSpec, RequestType, Rule, Stage};
    /// # fn block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     let waker = std::task::Waker::noop();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut f = std::pin::pin!(f);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; }
    /// #         std::thread::sleep(std::time::Duration::from_micros(50));
    /// #     }
    /// # }
    /// let stage = Stage::new("svc");
    /// stage.apply_rules([Rule::CreateObject {
    ///     channel: "default".into(),
    ///     object: "limit".into(),
    ///     spec: ObjectSpec::Drl(DrlSpec::new("100ops/s".parse().unwrap())),
    ///     matches: None,
    /// }]).unwrap();
    /// block_on(async {
    ///     // The burst (10 ms worth: one op) goes at once, the next after ~10 ms.
    ///     for _ in 0..3 {
    ///         stage.enforce_async(Context::new(RequestType::Put, 100)).await.unwrap();
    ///     }
    /// });
    /// assert_eq!(stage.collect().channel("default").unwrap().ops, 3);
    /// ```
    #[inline(always)]
    pub fn enforce_async(&self, ctx: Context) -> Enforce<'_> {
        Enforce { stage: self, ctx, phase: Phase::Start }
    }

    /// The first poll of [`Enforce`]: the path of `enforce`, with the
    /// object polled instead of called. `Pending` leaves the layout and
    /// route in `waiting`.
    #[inline]
    fn poll_enforce_first(
        &self,
        ctx: &Context,
        phase: &mut Phase,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<Outcome, EnforceError>> {
        if self.shut_down.load(Ordering::Relaxed) {
            return Poll::Ready(Err(EnforceError::shut_down(None)));
        }
        let generation = self.layout_generation.load(Ordering::Acquire);
        let key = route_key(ctx);
        let remembered = self.remembered(ctx, generation, key);
        if let Some(route) = remembered
            && !route.call
        {
            self.counters.record(route.channel_slot, route.object_slot(), ctx);
            return Poll::Ready(Ok(Outcome::IMMEDIATE));
        }
        self.with_layout(generation, |layout| {
            let route = remembered.unwrap_or_else(|| self.route_and_remember(layout, ctx, generation, key));
            if route.object == NO_OBJECT {
                self.counters.record(route.channel_slot, None, ctx);
                return Poll::Ready(Ok(Outcome::IMMEDIATE));
            }
            let o = &layout.channels[route.channel as usize].objects[route.object as usize];
            let mut wait = AsyncWait::default();
            match o.object.poll_enforce(ctx, &mut wait, cx) {
                Poll::Ready(r) => Poll::Ready(self.finish_async(ctx, route, &o.label, r)),
                Poll::Pending => {
                    *phase = Phase::Waiting(Waiting { layout: Arc::clone(layout), route, wait });
                    Poll::Pending
                }
            }
        })
    }

    #[inline(always)]
    fn finish_async(
        &self,
        ctx: &Context,
        route: Route,
        label: &Arc<str>,
        r: std::result::Result<Outcome, crate::error::Rejection>,
    ) -> Result<Outcome, EnforceError> {
        match r {
            Ok(outcome) => {
                self.counters.record(route.channel_slot, Some(route.object_slot), ctx);
                Ok(outcome)
            }
            Err(r) => Err(EnforceError::from_rejection(label, r)),
        }
    }

    /// Runs `f` on the layout of `generation` (or a newer one).
    #[inline(always)]
    fn with_layout<R>(&self, generation: u64, f: impl FnOnce(&Arc<Layout>) -> R) -> R {
        let uid = self.uid;
        let cached = LAYOUT_CACHE
            .try_with(
                |c| if c.stage_uid.get() == uid && c.generation.get() == generation { c.layout.take() } else { None },
            )
            .ok()
            .flatten();
        let layout = match cached {
            Some(l) => l,
            None => self.load_layout(generation),
        };
        let r = f(&layout);
        // Put it back unless a nested call re-tagged the entry meanwhile.
        let _ = LAYOUT_CACHE.try_with(|c| {
            if c.stage_uid.get() == uid && c.generation.get() == generation {
                c.layout.set(Some(layout));
            }
        });
        r
    }

    /// Loads the layout and re-tags the thread's cache for it (forgetting
    /// the remembered route).
    #[cold]
    fn load_layout(&self, generation: u64) -> Arc<Layout> {
        let layout = self.layout.load_full();
        let _ = LAYOUT_CACHE.try_with(|c| {
            c.stage_uid.set(self.uid);
            c.generation.set(generation);
            c.memo_key.set(0);
            c.layout.set(None);
        });
        layout
    }

    /// Which channel and object a request would go to, without enforcing
    /// it: `(channel, Some(object))`, or no object when it would pass
    /// through its channel.
    pub fn select(&self, ctx: &Context) -> (Arc<str>, Option<Arc<str>>) {
        let generation = self.layout_generation.load(Ordering::Acquire);
        self.with_layout(generation, |layout| {
            let (ci, oi) = layout.resolve(ctx);
            let ch = &layout.channels[ci as usize];
            (Arc::clone(&ch.label), oi.map(|oi| Arc::clone(&ch.objects[oi as usize].label)))
        })
    }

    pub(crate) fn bench_select_channel(&self, ctx: &Context) -> u32 {
        let generation = self.layout_generation.load(Ordering::Acquire);
        self.with_layout(generation, |layout| layout.channel_of(ctx))
    }

    pub(crate) fn bench_select_object(&self, ctx: &Context) -> Option<u32> {
        let generation = self.layout_generation.load(Ordering::Acquire);
        self.with_layout(generation, |layout| layout.resolve(ctx).1)
    }

    // ----- control interface ---------------------------------------------

    fn lock_control(&self) -> MutexGuard<'_, Model> {
        // Batches are applied to a copy and swapped in whole, so a panic
        // cannot leave the model half-updated.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a batch: `f` against a copy of the model; if it and the compile
    /// succeed, `on_commit` and the commit (which cannot fail).
    fn transact(&self, f: impl FnOnce(&mut Txn) -> Result<()>, on_commit: impl FnOnce()) -> Result<ApplyReport> {
        let mut guard = self.lock_control();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(Error::invalid(format!("stage '{}' is shut down", self.name)));
        }
        let mut txn = Txn {
            model: guard.clone(),
            counters: &self.counters,
            configs: Vec::new(),
            retired: Vec::new(),
            created: Vec::new(),
            freed: Vec::new(),
            warnings: Vec::new(),
            structural: false,
            batch_routes: HashSet::new(),
        };
        f(&mut txn)?;
        let layout = if txn.structural { Some(compile(&txn.model)?) } else { None };
        // Commit: nothing below can fail.
        on_commit();
        for (obj, set) in &txn.configs {
            obj.configure(set);
        }
        for obj in &txn.created {
            for &i in &txn.model.closed_instances {
                obj.close_instance(i);
            }
        }
        txn.model.free_slots.extend(txn.freed.drain(..));
        if let Some(l) = layout {
            txn.model.generation += 1;
            self.layout.store(Arc::new(l));
            self.layout_generation.store(txn.model.generation, Ordering::Release);
        }
        let report = ApplyReport {
            configured: txn.configs.len(),
            generation: txn.model.generation,
            warnings: std::mem::take(&mut txn.warnings),
        };
        *guard = txn.model;
        drop(guard);
        // New requests can no longer reach these; release the ones inside.
        for o in txn.retired {
            o.retire();
        }
        Ok(report)
    }

    /// Applies a batch of rules, all or nothing.
    pub fn apply(&self, rules: &RuleSet) -> Result<ApplyReport> {
        self.transact(|txn| rules.rules.iter().try_for_each(|e| txn.apply(e)), || rules.commit_contexts())
    }

    /// Applies rules built in code, all or nothing.
    pub fn apply_rules(&self, rules: impl IntoIterator<Item = Rule>) -> Result<ApplyReport> {
        self.apply(&RuleSet::from_rules(rules))
    }

    /// Changes one object's configuration (an enforcement rule).
    pub fn configure(&self, channel: &str, object: &str, set: ObjectChange) -> Result<ApplyReport> {
        self.apply_rules([Rule::configure(channel, object, set)])
    }

    /// Adds an application-defined object to a channel. With `matches`,
    /// requests it matches go to the object; without, it becomes the
    /// channel's default object.
    pub fn create_custom_object(
        &self,
        channel: &str,
        object: &str,
        custom: Arc<dyn EnforcementObject>,
        matches: Option<Match>,
    ) -> Result<ApplyReport> {
        let loc = Location::default();
        self.transact(|txn| txn.add_object(channel, object, Object::Custom(custom), matches.as_ref(), &loc), || ())
    }

    /// A handle to configure one object directly, for control loops that
    /// re-tune the same objects often.
    pub fn object(&self, channel: &str, object: &str) -> Option<ObjectHandle> {
        let m = self.lock_control();
        let ch = m.channel(channel)?;
        let o = ch.objects.iter().find(|o| &*o.id == object)?;
        Some(ObjectHandle { label: format!("{channel}/{object}").into(), object: Arc::clone(&o.object) })
    }

    /// The stage's channels, objects, routes, defaults and object settings
    /// as they are now, for [`restore`](Self::restore) to bring back.
    pub fn checkpoint(&self) -> Checkpoint {
        let m = self.lock_control();
        let specs = m.objects().map(|o| o.spec()).collect();
        Checkpoint { stage: self.uid, generation: m.generation, model: m.clone(), specs }
    }

    /// Makes the stage's channels, objects, routes, defaults and object
    /// settings what they were at `checkpoint`, in one batch (all or
    /// nothing): channels and objects made since are removed (their waiters
    /// released), those removed since are made again from their settings
    /// then, an object whose settings changed is rebuilt with the old ones
    /// (its waiters are released; it keeps its counters). Open instances
    /// are not part of a checkpoint and stay as they are. An application
    /// object ([`create_custom_object`](Self::create_custom_object)) is kept
    /// as it is; one removed since cannot be rebuilt, and the report warns.
    pub fn restore(&self, checkpoint: &Checkpoint) -> Result<ApplyReport> {
        if checkpoint.stage != self.uid {
            return Err(Error::invalid(format!("stage '{}': the checkpoint is another stage's", self.name)));
        }
        self.transact(|txn| txn.restore(&checkpoint.model, &checkpoint.specs), || ())
    }

    /// Identity and layout: name, id, pid, host, channels, objects with
    /// their current configuration, routes, and the workflows seen so far.
    pub fn stage_info(&self) -> StageInfo {
        // Read under the control lock, not copied: control calls only.
        let m = self.lock_control();
        let coverage = self.coverage_of(&m);
        let (workflows, _) = self.counters.workflow_totals();
        let route_info = |r: &RouteModel| RouteInfo { matches: r.matches.clone(), target: r.target.to_string() };
        StageInfo {
            name: self.name.clone(),
            id: self.id,
            pid: std::process::id(),
            host: hostname(),
            generation: m.generation,
            default_channel: m.default_channel.to_string(),
            routes: m.routes.iter().map(route_info).collect(),
            channels: m
                .channels
                .iter()
                .map(|c| ChannelInfo {
                    id: c.id.to_string(),
                    default_object: c.default_object.as_ref().map(|d| d.to_string()),
                    routes: c.routes.iter().map(route_info).collect(),
                    objects: c
                        .objects
                        .iter()
                        .map(|o| ObjectInfo {
                            id: o.id.to_string(),
                            kind: ObjectKind::of(o.object.kind()),
                            spec: o.object.spec(),
                        })
                        .collect(),
                })
                .collect(),
            workflows: workflows.into_iter().map(|(w, _, _)| WorkflowId(w)).collect(),
            instances: m
                .open_instances
                .iter()
                .map(|(id, owner)| InstanceInfo { id: *id, owner: owner.to_string() })
                .collect(),
            coverage: coverage.to_vec(),
        }
    }

    /// The coverage of the model's layout, computed once per generation.
    fn coverage_of(&self, m: &Model) -> Arc<[Coverage]> {
        let mut cache = self.coverage.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((g, c)) = cache.as_ref()
            && *g == m.generation
        {
            return Arc::clone(c);
        }
        let mut contexts = RequestContext::BUILTINS.to_vec();
        for r in m.routes.iter().chain(m.channels.iter().flat_map(|c| c.routes.iter())) {
            contexts.extend(r.matches.context.values().iter().copied());
        }
        contexts.sort();
        contexts.dedup();
        let layout = self.layout.load_full();
        let c: Arc<[Coverage]> = coverage(&layout, m, &contexts).into();
        *cache = Some((m.generation, Arc::clone(&c)));
        c
    }

    /// Monotonic counters since the stage started, with a timestamp. Rates
    /// come from the difference of two collections ([`Collection::rates_since`]);
    /// collecting resets nothing, so any number of readers can do this.
    pub fn collect(&self) -> Collection {
        // Read under the control lock, not copied: control calls only (the
        // data path never takes it).
        let m = self.lock_control();
        self.collect_under(&m)
    }

    /// What a metrics scrape reads, under one lock: the collection, each
    /// of its objects' current spec (in the collection's order), and the
    /// open instances with their owners.
    pub(crate) fn scrape(&self) -> (Collection, Vec<Option<ObjectSpec>>, Vec<(InstanceId, String)>) {
        let m = self.lock_control();
        let specs = m.channels.iter().flat_map(|c| c.objects.iter().map(|o| o.object.spec())).collect();
        let instances = m.open_instances.iter().map(|(id, owner)| (*id, owner.to_string())).collect();
        (self.collect_under(&m), specs, instances)
    }

    fn collect_under(&self, m: &Model) -> Collection {
        let elapsed_ns = now_ns().saturating_sub(self.started_ns);
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut channels = Vec::new();
        let mut objects = Vec::new();
        for c in &m.channels {
            let (ops, bytes) = c.slot.total(&self.counters);
            channels.push(ChannelCounters { channel: c.id.to_string(), counter: Counter { ops, bytes } });
            for o in &c.objects {
                let (ops, bytes) = o.slot.total(&self.counters);
                objects.push(ObjectCounters {
                    channel: c.id.to_string(),
                    object: o.id.to_string(),
                    kind: ObjectKind::of(o.object.kind()),
                    incarnation: o.slot.incarnation,
                    counter: Counter { ops, bytes },
                    stats: o.object.stats(),
                });
            }
        }
        let contexts = self
            .counters
            .context_totals()
            .into_iter()
            .enumerate()
            .filter(|(_, t)| t.all.0 > 0)
            .filter_map(|(i, t)| {
                let counter = |(ops, bytes): (u64, u64)| Counter { ops, bytes };
                RequestContext::from_id(i as u16).map(|context| ContextCounters {
                    context,
                    counter: counter(t.all),
                    file: counter(t.file),
                    file_writes: counter(t.writes),
                })
            })
            .collect();
        let (wf, (oo, ob)) = self.counters.workflow_totals();
        Collection {
            stage: self.name.clone(),
            stage_id: self.id,
            generation: m.generation,
            elapsed_ns,
            unix_ms,
            channels,
            objects,
            contexts,
            workflows: wf
                .into_iter()
                .map(|(w, ops, bytes)| WorkflowCounters { workflow: WorkflowId(w), counter: Counter { ops, bytes } })
                .collect(),
            other_workflows: Counter { ops: oo, bytes: ob },
            jobs: self
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|(&(instance, context), &(begun, completed))| {
                    let completed = completed.min(begun);
                    JobCounters {
                        context,
                        instance,
                        counts: JobCounts { begun, completed, running: begun - completed },
                    }
                })
                .collect(),
        }
    }

    /// Records that a job of `context` began in `instance` (a flush, a
    /// compaction, a backup run): layers that know when jobs run report it
    /// here, and control planes read running jobs from
    /// [`Collection::jobs`]. Jobs are counted, not timed; a job that begins
    /// and ends between two collections still shows in `begun`. Every
    /// `job_started` must be matched by one [`job_finished`](Self::job_finished),
    /// whether the job completed, failed or was cut short.
    pub fn job_started(&self, instance: InstanceId, context: RequestContext) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).entry((instance, context)).or_default().0 += 1;
        self.job_watchers.notify();
    }

    /// Calls `wake` each time a job begins ([`job_started`](Self::job_started)),
    /// until the returned [`JobWatch`] is dropped: for a control loop that
    /// sleeps while no job runs and must not miss the one that starts.
    /// `wake` runs on the thread that reports the job, inside that layer's
    /// bookkeeping (rocks-env: RocksDB's background thread, in the event
    /// listener, before the job's first I/O), so it must only signal (set a
    /// flag, notify a condition variable), never block or do the work
    /// itself. A panic in it is caught and dropped.
    #[must_use = "the watch ends when it is dropped"]
    pub fn watch_jobs(&self, wake: impl Fn() + Send + Sync + 'static) -> JobWatch {
        let mut w = self.job_watchers.list.lock().unwrap_or_else(|e| e.into_inner());
        let id = self.job_watchers.next.fetch_add(1, Ordering::Relaxed);
        w.push((id, Arc::new(wake)));
        JobWatch { watchers: Arc::clone(&self.job_watchers), id }
    }

    /// Records that a job of `context` in `instance` ended.
    pub fn job_finished(&self, instance: InstanceId, context: RequestContext) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).entry((instance, context)).or_default().1 += 1;
    }

    /// Opens `instance` on the stage for `owner` (a DB's path, a tenant's
    /// name): requests of a closed instance are subject to limits again.
    /// Fails if the instance is already open, so two DBs sharing a stage
    /// cannot silently share an instance id (and with it their counters,
    /// limits and closing).
    pub fn open_instance(&self, instance: InstanceId, owner: &str) -> Result<()> {
        let mut m = self.lock_control();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(Error::invalid(format!("stage '{}' is shut down", self.name)));
        }
        if let Some((_, by)) = m.open_instances.iter().find(|(i, _)| *i == instance) {
            return Err(Error::invalid(format!(
                "instance {instance} of stage '{}' is already open (by {by}); give each DB on a shared stage its own instance id",
                self.name
            )));
        }
        m.open_instances.push((instance, owner.into()));
        if let Some(pos) = m.closed_instances.iter().position(|&i| i == instance) {
            m.closed_instances.remove(pos);
            for o in m.objects() {
                o.open_instance(instance);
            }
        }
        Ok(())
    }

    /// Closes `instance` (a DB shutting down): every request of it that
    /// waits in any object is admitted at once, and its later requests are
    /// not held, until it is opened again. Idempotent.
    pub fn close_instance(&self, instance: InstanceId) {
        let mut m = self.lock_control();
        m.open_instances.retain(|(i, _)| *i != instance);
        if !m.closed_instances.contains(&instance) {
            m.closed_instances.push(instance);
        }
        for o in m.objects() {
            o.close_instance(instance);
        }
    }

    /// Shuts the stage down: every waiting request fails with
    /// [`EnforceErrorKind::ShutDown`](crate::errors::EnforceErrorKind::ShutDown), and so does every later one. Idempotent.
    pub fn shutdown(&self) {
        let m = self.lock_control();
        self.shut_down.store(true, Ordering::Release);
        for o in m.objects() {
            o.shutdown();
        }
    }

    /// Whether [`shutdown`](Self::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn hostname() -> String {
    rustix::system::uname().nodename().to_string_lossy().into_owned()
}

/// The future of [`Stage::enforce_async`]: resolves to what
/// [`Stage::enforce`] returns. Dropping it while it waits gives the
/// request's place back (nothing is charged for it). Polling it again after
/// it completed panics.
#[must_use = "a request is enforced only when its future is awaited"]
pub struct Enforce<'a> {
    stage: &'a Stage,
    ctx: Context,
    phase: Phase,
}

/// Where an [`Enforce`] is. Kept small: the future is moved into every
/// `async` block that awaits it.
enum Phase {
    Start,
    Waiting(Waiting),
    Done,
}

/// A request waiting in an object: the layout it was routed on (kept alive
/// so the object is), its route, and its place in the object.
struct Waiting {
    layout: Arc<Layout>,
    route: Route,
    wait: AsyncWait,
}

impl std::fmt::Debug for Enforce<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let phase = match self.phase {
            Phase::Start => "start",
            Phase::Waiting(_) => "waiting",
            Phase::Done => "done",
        };
        f.debug_struct("Enforce").field("ctx", &self.ctx).field("phase", &phase).finish()
    }
}

impl Enforce<'_> {
    /// The request being enforced.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl std::future::Future for Enforce<'_> {
    type Output = Result<Outcome, EnforceError>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let r = match &mut this.phase {
            Phase::Start => this.stage.poll_enforce_first(&this.ctx, &mut this.phase, cx),
            Phase::Waiting(w) => {
                let o = &w.layout.channels[w.route.channel as usize].objects[w.route.object as usize];
                match o.object.poll_enforce(&this.ctx, &mut w.wait, cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(r) => Poll::Ready(this.stage.finish_async(&this.ctx, w.route, &o.label, r)),
                }
            }
            Phase::Done => panic!("Enforce polled after it completed"),
        };
        if r.is_ready() {
            this.phase = Phase::Done;
        }
        r
    }
}

impl Drop for Enforce<'_> {
    fn drop(&mut self) {
        if let Phase::Waiting(w) = &mut self.phase
            && w.wait.is_waiting()
        {
            let o = &w.layout.channels[w.route.channel as usize].objects[w.route.object as usize];
            o.object.cancel_enforce(&self.ctx, &mut w.wait);
        }
    }
}

/// A callback of [`Stage::watch_jobs`].
type JobWaker = Arc<dyn Fn() + Send + Sync>;

/// The callbacks [`Stage::watch_jobs`] registered, with their ids.
#[derive(Default)]
struct JobWatchers {
    next: AtomicU64,
    list: Mutex<Vec<(u64, JobWaker)>>,
}

impl JobWatchers {
    fn notify(&self) {
        // Cloned out of the lock: a callback may drop its own watch.
        let list: Vec<JobWaker> =
            self.list.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, f)| Arc::clone(f)).collect();
        for f in list {
            // A job's start must not fail because a watcher did.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f()));
        }
    }
}

/// A registration of [`Stage::watch_jobs`]: its callback is called until
/// this is dropped.
pub struct JobWatch {
    watchers: Arc<JobWatchers>,
    id: u64,
}

impl std::fmt::Debug for JobWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobWatch").field("id", &self.id).finish()
    }
}

impl Drop for JobWatch {
    fn drop(&mut self) {
        self.watchers.list.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, _)| *id != self.id);
    }
}
