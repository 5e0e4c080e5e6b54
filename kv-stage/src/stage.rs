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

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use serde::Serialize;

use crate::context::{Context, InstanceId, RequestContext, RequestType, WorkflowId};
use crate::error::{EnforceError, Error, Location, Result};
use crate::matching::Match;
use crate::objects::{ConfigError, EnforcementObject, Object, ObjectConfig, ObjectSpec, ObjectStats, Outcome, now_ns};
use crate::route::{RouteError, RouteSpec, RouteTable};
use crate::rules::{Rule, RuleEntry, RuleSet};
use crate::stats::{Counters, MAX_COUNTER_SLOTS};

/// Id of the channel every stage starts with, which receives requests no
/// route matches until another default is set.
pub const DEFAULT_CHANNEL: &str = "default";

// ---------------------------------------------------------------------------
// Runtime layout (read by the data path).

struct ObjectRt {
    id: Arc<str>,
    label: Arc<str>,
    slot: u32,
    object: Arc<Object>,
}

struct ChannelRt {
    label: Arc<str>,
    slot: u32,
    objects: Box<[ObjectRt]>,
    routes: RouteTable,
    default_object: Option<u32>,
}

/// An immutable snapshot of the stage's channels and tables.
struct Layout {
    channels: Box<[ChannelRt]>,
    routes: RouteTable,
    default_channel: u32,
}

/// What a thread remembers of the stage it used last: the layout, tagged
/// with the stage and layout generation, and the route of the last request
/// classified (its classifiers and where they led).
///
/// Checking the stage's generation (a plain load of a line that changes only
/// when rules do) against the tag costs a few nanoseconds, where loading from
/// the `ArcSwap` costs atomic read-modify-writes on shared lines. A thread
/// mostly repeats the same kind of request (a client thread appending to the
/// WAL, a flush thread writing one table), so the remembered route usually
/// applies and the tables are not consulted at all; when it leads to a Noop
/// or to a channel without objects, the layout is not touched either. The
/// layout is taken out of its cell while in use and put back after, so a
/// nested `enforce` on the same thread (an object doing staged I/O) finds
/// the cell empty and loads its own. One entry per thread: a thread that
/// alternates between stages takes the slower path on every switch.
struct ThreadCache {
    stage_uid: Cell<u64>,
    generation: Cell<u64>,
    layout: Cell<Option<Arc<Layout>>>,
    /// `route_key` of the remembered request; 0 when there is none.
    memo_key: Cell<u64>,
    memo_workflow: Cell<u64>,
    memo: Cell<Route>,
}

/// Where a request goes, with the counter slots to charge.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Route {
    channel: u32,
    /// Object index in the channel, or `NO_OBJECT`.
    object: u32,
    channel_slot: u32,
    object_slot: u32,
    /// The object must be called (anything but a Noop).
    call: bool,
}

const NO_OBJECT: u32 = u32::MAX;

impl Route {
    const EMPTY: Route = Route { channel: 0, object: NO_OBJECT, channel_slot: 0, object_slot: 0, call: false };

    #[inline(always)]
    fn object_slot(self) -> Option<u32> {
        if self.object == NO_OBJECT { None } else { Some(self.object_slot) }
    }
}

/// The classifiers that decide a route, except the workflow, in one word
/// (bit 63 set so that 0 means "none").
#[inline(always)]
fn route_key(ctx: &Context) -> u64 {
    (1 << 63) | ctx.request_type as u64 | (u64::from(ctx.context.id()) << 8) | (u64::from(ctx.instance.0) << 24)
}

thread_local! {
    static LAYOUT_CACHE: ThreadCache = const {
        ThreadCache {
            stage_uid: Cell::new(0),
            generation: Cell::new(0),
            layout: Cell::new(None),
            memo_key: Cell::new(0),
            memo_workflow: Cell::new(0),
            memo: Cell::new(Route::EMPTY),
        }
    };
}

impl Layout {
    fn route(&self, ctx: &Context) -> Route {
        let ci = self.routes.lookup(ctx).unwrap_or(self.default_channel);
        let ch = &self.channels[ci as usize];
        match ch.routes.lookup(ctx).or(ch.default_object) {
            Some(oi) => {
                let o = &ch.objects[oi as usize];
                Route {
                    channel: ci,
                    object: oi,
                    channel_slot: ch.slot,
                    object_slot: o.slot,
                    call: !matches!(*o.object, Object::Noop(_)),
                }
            }
            None => Route { channel: ci, object: NO_OBJECT, channel_slot: ch.slot, object_slot: 0, call: false },
        }
    }
}

// ---------------------------------------------------------------------------
// Control model (guarded by the control mutex, cloned per batch).

/// A counter slot as one channel or object uses it: slots of removed
/// channels and objects are reused, so each use has its own incarnation and
/// counts from the totals the slot had when it was taken.
#[derive(Clone, Copy, Debug)]
struct SlotUse {
    slot: u32,
    incarnation: u64,
    base: (u64, u64),
}

impl SlotUse {
    fn total(&self, counters: &Counters) -> (u64, u64) {
        let (ops, bytes) = counters.slot_total(self.slot);
        (ops.wrapping_sub(self.base.0), bytes.wrapping_sub(self.base.1))
    }
}

#[derive(Clone)]
struct ObjectModel {
    id: Arc<str>,
    slot: SlotUse,
    object: Arc<Object>,
}

#[derive(Clone)]
struct RouteModel {
    matches: Match,
    target: Arc<str>,
    origin: Location,
}

#[derive(Clone)]
struct ChannelModel {
    id: Arc<str>,
    slot: SlotUse,
    objects: Vec<ObjectModel>,
    routes: Vec<RouteModel>,
    default_object: Option<Arc<str>>,
}

#[derive(Clone)]
struct Model {
    channels: Vec<ChannelModel>,
    routes: Vec<RouteModel>,
    default_channel: Arc<str>,
    /// Slots never used so far start here.
    next_slot: u32,
    /// Slots given back by removed channels and objects, oldest first.
    free_slots: VecDeque<u32>,
    next_incarnation: u64,
    generation: u64,
    /// Instances open on the stage, with who opened them.
    open_instances: Vec<(InstanceId, Arc<str>)>,
    /// Instances whose requests objects no longer hold (closing).
    closed_instances: Vec<InstanceId>,
}

impl Model {
    fn channel(&self, id: &str) -> Option<&ChannelModel> {
        self.channels.iter().find(|c| &*c.id == id)
    }

    fn channel_mut(&mut self, id: &str) -> Option<&mut ChannelModel> {
        self.channels.iter_mut().find(|c| &*c.id == id)
    }

    /// A counter slot for a new channel or object: a fresh one while any
    /// is left, else the one given back longest ago (so that a request
    /// still counting on a removed object, which finishes on the layout it
    /// started with, almost surely counts before its slot is reused).
    fn alloc_slot(&mut self, counters: &Counters, loc: &Location, field: &str) -> Result<SlotUse> {
        let slot = if (self.next_slot as usize) < MAX_COUNTER_SLOTS {
            self.next_slot += 1;
            self.next_slot - 1
        } else if let Some(s) = self.free_slots.pop_front() {
            s
        } else {
            return Err(Error::rule(
                loc,
                Some(field),
                format!("this stage has {MAX_COUNTER_SLOTS} channels and objects, its limit; remove some first"),
            ));
        };
        self.next_incarnation += 1;
        Ok(SlotUse { slot, incarnation: self.next_incarnation, base: counters.slot_total(slot) })
    }

    fn objects(&self) -> impl Iterator<Item = &Arc<Object>> {
        self.channels.iter().flat_map(|c| c.objects.iter().map(|o| &o.object))
    }
}

/// A batch in progress: the model copy plus what to do at commit.
struct Txn<'a> {
    model: Model,
    counters: &'a Counters,
    configs: Vec<(Arc<Object>, ObjectConfig)>,
    retired: Vec<Arc<Object>>,
    /// Objects created in this batch (closed instances apply to them).
    created: Vec<Arc<Object>>,
    /// Slots given back in this batch; reusable only after it commits.
    freed: Vec<u32>,
    warnings: Vec<String>,
    structural: bool,
    /// Patterns routed in this batch, to reject repeats within one batch.
    batch_routes: HashSet<(Option<Arc<str>>, Match)>,
}

fn validate_id(id: &str, loc: &Location, field: &str) -> Result<Arc<str>> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(id.into())
    } else {
        Err(Error::rule(loc, Some(field), format!("'{id}' is not a valid id (1-64 of [A-Za-z0-9_.:-])")))
    }
}

fn config_error(loc: &Location, label: &str, e: ConfigError) -> Error {
    Error::rule(loc, Some(e.field), format!("{label}: {}", e.message))
}

impl Txn<'_> {
    fn channel_mut<'a>(&'a mut self, id: &str, loc: &Location) -> Result<&'a mut ChannelModel> {
        self.model.channel_mut(id).ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{id}'")))
    }

    fn create_channel(&mut self, id: &str, matches: Option<&Match>, loc: &Location) -> Result<()> {
        let id = validate_id(id, loc, "channel")?;
        if self.model.channel(&id).is_some() {
            return Err(Error::rule(loc, Some("channel"), format!("channel '{id}' already exists")));
        }
        let slot = self.model.alloc_slot(self.counters, loc, "channel")?;
        self.model.channels.push(ChannelModel {
            id: Arc::clone(&id),
            slot,
            objects: Vec::new(),
            routes: Vec::new(),
            default_object: None,
        });
        self.structural = true;
        if let Some(m) = matches {
            self.route(&id, m, loc)?;
        }
        Ok(())
    }

    fn remove_channel(&mut self, id: &str, loc: &Location) -> Result<()> {
        if &*self.model.default_channel == id {
            return Err(Error::rule(
                loc,
                Some("channel"),
                format!("channel '{id}' is the default channel; set another default first"),
            ));
        }
        let pos = self
            .model
            .channels
            .iter()
            .position(|c| &*c.id == id)
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{id}'")))?;
        let ch = self.model.channels.remove(pos);
        self.freed.push(ch.slot.slot);
        self.freed.extend(ch.objects.iter().map(|o| o.slot.slot));
        self.retired.extend(ch.objects.into_iter().map(|o| o.object));
        self.model.routes.retain(|r| &*r.target != id);
        self.structural = true;
        Ok(())
    }

    fn add_object(
        &mut self,
        channel: &str,
        object: &str,
        obj: Object,
        matches: Option<&Match>,
        loc: &Location,
    ) -> Result<()> {
        let oid = validate_id(object, loc, "object")?;
        let slot = self.model.alloc_slot(self.counters, loc, "object")?;
        let ch = self.channel_mut(channel, loc)?;
        if ch.objects.iter().any(|o| o.id == oid) {
            return Err(Error::rule(
                loc,
                Some("object"),
                format!("object '{oid}' already exists in channel '{channel}'"),
            ));
        }
        if matches.is_none()
            && let Some(d) = &ch.default_object
        {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!(
                    "channel '{channel}' already has a default object '{d}'; give this object a `match`, or use set_default_object"
                ),
            ));
        }
        let obj = Arc::new(obj);
        ch.objects.push(ObjectModel { id: Arc::clone(&oid), slot, object: Arc::clone(&obj) });
        if matches.is_none() {
            ch.default_object = Some(Arc::clone(&oid));
        }
        self.created.push(obj);
        self.structural = true;
        if let Some(m) = matches {
            self.route_object(channel, object, m, loc)?;
        }
        Ok(())
    }

    fn remove_object(&mut self, channel: &str, object: &str, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let pos = ch.objects.iter().position(|o| &*o.id == object).ok_or_else(|| {
            Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
        })?;
        let o = ch.objects.remove(pos);
        ch.routes.retain(|r| &*r.target != object);
        if ch.default_object.as_deref() == Some(object) {
            ch.default_object = None;
        }
        self.freed.push(o.slot.slot);
        self.retired.push(o.object);
        self.structural = true;
        Ok(())
    }

    fn route(&mut self, channel: &str, m: &Match, loc: &Location) -> Result<()> {
        let target = self
            .model
            .channel(channel)
            .map(|c| Arc::clone(&c.id))
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{channel}'")))?;
        if !self.batch_routes.insert((None, m.clone())) {
            return Err(Error::rule(loc, Some("match"), format!("the channel route {m} is set twice in this batch")));
        }
        self.model.routes.retain(|r| r.matches != *m);
        self.model.routes.push(RouteModel { matches: m.clone(), target, origin: loc.clone() });
        self.structural = true;
        Ok(())
    }

    fn unroute(&mut self, m: &Match, loc: &Location) -> Result<()> {
        let before = self.model.routes.len();
        self.model.routes.retain(|r| r.matches != *m);
        if self.model.routes.len() == before {
            return Err(Error::rule(loc, Some("match"), format!("no channel route has the pattern {m}")));
        }
        self.structural = true;
        Ok(())
    }

    fn route_object(&mut self, channel: &str, object: &str, m: &Match, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let target = ch.objects.iter().find(|o| &*o.id == object).map(|o| Arc::clone(&o.id)).ok_or_else(|| {
            Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
        })?;
        let ch_id = Arc::clone(&ch.id);
        ch.routes.retain(|r| r.matches != *m);
        ch.routes.push(RouteModel { matches: m.clone(), target, origin: loc.clone() });
        if !self.batch_routes.insert((Some(ch_id), m.clone())) {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!("the object route {m} of channel '{channel}' is set twice in this batch"),
            ));
        }
        self.structural = true;
        Ok(())
    }

    fn unroute_object(&mut self, channel: &str, m: &Match, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let before = ch.routes.len();
        ch.routes.retain(|r| r.matches != *m);
        if ch.routes.len() == before {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!("no object route of channel '{channel}' has the pattern {m}"),
            ));
        }
        self.structural = true;
        Ok(())
    }

    fn set_default_channel(&mut self, channel: &str, loc: &Location) -> Result<()> {
        let id = self
            .model
            .channel(channel)
            .map(|c| Arc::clone(&c.id))
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{channel}'")))?;
        self.model.default_channel = id;
        self.structural = true;
        Ok(())
    }

    fn set_default_object(&mut self, channel: &str, object: Option<&str>, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        ch.default_object = match object {
            None => None,
            Some(o) => Some(ch.objects.iter().find(|x| &*x.id == o).map(|x| Arc::clone(&x.id)).ok_or_else(|| {
                Error::rule(loc, Some("object"), format!("unknown object '{o}' in channel '{channel}'"))
            })?),
        };
        self.structural = true;
        Ok(())
    }

    fn configure(
        &mut self,
        channel: &str,
        object: &str,
        set: &ObjectConfig,
        ignore_unsupported: bool,
        loc: &Location,
    ) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let o = Arc::clone(
            &ch.objects
                .iter()
                .find(|o| &*o.id == object)
                .ok_or_else(|| {
                    Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
                })?
                .object,
        );
        if set.set_fields().is_empty() {
            return Err(Error::rule(loc, Some("set"), "a configure rule must change at least one setting"));
        }
        match o.validate(set) {
            Ok(()) => {}
            Err(e) if e.unsupported && ignore_unsupported => {
                self.warnings.push(format!(
                    "{loc}: {channel}/{object} ({}) has no setting `{}`; rule skipped",
                    o.kind(),
                    e.field
                ));
                return Ok(());
            }
            Err(e) => return Err(config_error(loc, &format!("{channel}/{object}"), e)),
        }
        self.configs.push((o, set.clone()));
        Ok(())
    }

    fn apply(&mut self, entry: &RuleEntry) -> Result<()> {
        let loc = &entry.location;
        match &entry.rule {
            Rule::CreateChannel { channel, matches } => self.create_channel(channel, matches.as_ref(), loc),
            Rule::RemoveChannel { channel } => self.remove_channel(channel, loc),
            Rule::CreateObject { channel, object, spec, matches } => {
                let obj = spec.build().map_err(|e| config_error(loc, &format!("{channel}/{object}"), e))?;
                self.add_object(channel, object, obj, matches.as_ref(), loc)
            }
            Rule::RemoveObject { channel, object } => self.remove_object(channel, object, loc),
            Rule::Route { channel, matches } => self.route(channel, matches, loc),
            Rule::Unroute { matches } => self.unroute(matches, loc),
            Rule::RouteObject { channel, object, matches } => self.route_object(channel, object, matches, loc),
            Rule::UnrouteObject { channel, matches } => self.unroute_object(channel, matches, loc),
            Rule::SetDefaultChannel { channel } => self.set_default_channel(channel, loc),
            Rule::SetDefaultObject { channel, object } => self.set_default_object(channel, object.as_deref(), loc),
            Rule::Configure { channel, object, set, ignore_unsupported } => {
                self.configure(channel, object, set, *ignore_unsupported, loc)
            }
        }
    }
}

fn compile_routes(routes: &[RouteModel], index_of: impl Fn(&str) -> u32, scope: &str) -> Result<RouteTable> {
    let specs: Vec<RouteSpec<'_>> =
        routes.iter().map(|r| RouteSpec { pattern: &r.matches, target: index_of(&r.target) }).collect();
    RouteTable::compile(&specs).map_err(|e| match e {
        RouteError::Ambiguous { first, second, example } => {
            let (a, b) = (&routes[first], &routes[second]);
            Error::rule(
                &b.origin,
                Some("match"),
                format!(
                    "{scope} route {} -> '{}' and route {} -> '{}' (from {}) both match requests such as {example} with equal specificity; make one more specific",
                    b.matches, b.target, a.matches, a.target, a.origin
                ),
            )
        }
        RouteError::TooLarge { cells } => Error::rule(
            &routes.last().map(|r| r.origin.clone()).unwrap_or_default(),
            Some("match"),
            format!(
                "{scope} routes need a table of {cells} cells (limit {}); pin fewer distinct workflows or instances",
                crate::route::MAX_CELLS
            ),
        ),
    })
}

fn compile(m: &Model) -> Result<Layout> {
    let index_of_channel =
        |id: &str| m.channels.iter().position(|c| &*c.id == id).expect("routes target live channels") as u32;
    let routes = compile_routes(&m.routes, index_of_channel, "channel")?;
    let mut channels = Vec::with_capacity(m.channels.len());
    for ch in &m.channels {
        let index_of_object =
            |id: &str| ch.objects.iter().position(|o| &*o.id == id).expect("routes target live objects") as u32;
        let table = compile_routes(&ch.routes, index_of_object, &format!("channel '{}' object", ch.id))?;
        channels.push(ChannelRt {
            label: Arc::clone(&ch.id),
            slot: ch.slot.slot,
            objects: ch
                .objects
                .iter()
                .map(|o| ObjectRt {
                    id: Arc::clone(&o.id),
                    label: format!("{}/{}", ch.id, o.id).into(),
                    slot: o.slot.slot,
                    object: Arc::clone(&o.object),
                })
                .collect(),
            routes: table,
            default_object: ch.default_object.as_deref().map(index_of_object),
        });
    }
    Ok(Layout { channels: channels.into_boxed_slice(), routes, default_channel: index_of_channel(&m.default_channel) })
}

/// Which objects the requests of each context reach, per instance class,
/// by looking every combination of classifier classes up in the compiled
/// layout: the request types, the workflows and instances the rules name
/// (plus one value no rule names), and `contexts`.
fn coverage(layout: &Layout, m: &Model, contexts: &[RequestContext]) -> Vec<Coverage> {
    let patterns = m.routes.iter().chain(m.channels.iter().flat_map(|c| c.routes.iter())).map(|r| &r.matches);
    let mut instances: Vec<InstanceId> = Vec::new();
    let mut workflows: Vec<u64> = Vec::new();
    for p in patterns {
        instances.extend(p.instance.values().iter().copied());
        workflows.extend(p.workflow.values().iter().map(|w| w.0));
    }
    instances.sort();
    instances.dedup();
    workflows.sort();
    workflows.dedup();
    let other_instance = (0..=u16::MAX).rev().map(InstanceId).find(|i| !instances.contains(i)).unwrap_or_default();
    let other_workflow = (0..=u64::MAX).rev().find(|w| !workflows.contains(w)).unwrap_or_default();
    workflows.push(other_workflow);
    let classes = instances.iter().map(|&i| (Some(i), i)).chain(std::iter::once((None, other_instance)));
    let mut out = Vec::new();
    for (class, instance) in classes {
        for &context in contexts {
            let mut objects: Vec<(String, String)> = Vec::new();
            for t in RequestType::ALL {
                for &w in &workflows {
                    let r = layout.route(&Context::with(WorkflowId(w), t, context, instance, 0));
                    if r.object == NO_OBJECT {
                        continue;
                    }
                    let ch = &layout.channels[r.channel as usize];
                    let o = &ch.objects[r.object as usize];
                    if !objects.iter().any(|(c, x)| **c == *ch.label && **x == *o.id) {
                        objects.push((ch.label.to_string(), o.id.to_string()));
                    }
                }
            }
            out.push(Coverage { context, instance: class, objects });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// The stage.

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
        let remembered = LAYOUT_CACHE
            .try_with(|c| {
                (c.stage_uid.get() == self.uid
                    && c.generation.get() == generation
                    && c.memo_key.get() == key
                    && c.memo_workflow.get() == ctx.workflow.0)
                    .then(|| c.memo.get())
            })
            .ok()
            .flatten();
        match remembered {
            // A Noop or a pass-through: nothing to call, only to count.
            Some(route) if !route.call => {
                self.counters.record(route.channel_slot, route.object_slot(), ctx);
                Ok(Outcome::IMMEDIATE)
            }
            _ => self.enforce_with_layout(ctx, generation, key, remembered),
        }
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
            let route = match remembered {
                Some(r) => r,
                None => {
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
            };
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

    /// Runs `f` on the layout of `generation` (or a newer one).
    #[inline(always)]
    fn with_layout<R>(&self, generation: u64, f: impl FnOnce(&Layout) -> R) -> R {
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
            let ci = layout.routes.lookup(ctx).unwrap_or(layout.default_channel);
            let ch = &layout.channels[ci as usize];
            let obj = ch.routes.lookup(ctx).or(ch.default_object).map(|oi| Arc::clone(&ch.objects[oi as usize].label));
            (Arc::clone(&ch.label), obj)
        })
    }

    pub(crate) fn bench_select_channel(&self, ctx: &Context) -> u32 {
        let generation = self.layout_generation.load(Ordering::Acquire);
        self.with_layout(generation, |layout| layout.routes.lookup(ctx).unwrap_or(layout.default_channel))
    }

    pub(crate) fn bench_select_object(&self, ctx: &Context) -> Option<u32> {
        let generation = self.layout_generation.load(Ordering::Acquire);
        self.with_layout(generation, |layout| {
            let ch = &layout.channels[layout.routes.lookup(ctx).unwrap_or(layout.default_channel) as usize];
            ch.routes.lookup(ctx).or(ch.default_object)
        })
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
    pub fn configure(&self, channel: &str, object: &str, set: ObjectConfig) -> Result<ApplyReport> {
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

    /// Identity and layout: name, id, pid, host, channels, objects with
    /// their current configuration, routes, and the workflows seen so far.
    pub fn stage_info(&self) -> StageInfo {
        let m = self.lock_control().clone();
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
                            kind: o.object.kind().to_owned(),
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
        let m = self.lock_control().clone();
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
                    kind: o.object.kind().to_owned(),
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
            .filter(|&(_, (ops, _))| ops > 0)
            .filter_map(|(i, (ops, bytes))| {
                RequestContext::from_id(i as u16)
                    .map(|context| ContextCounters { context, counter: Counter { ops, bytes } })
            })
            .collect();
        let (wf, (oo, ob)) = self.counters.workflow_totals();
        Collection {
            stage: self.name.clone(),
            stage_id: self.id,
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
                    JobCounters { context, instance, begun, completed, running: begun - completed }
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
    /// [`EnforceError::ShutDown`], and so does every later one. Idempotent.
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

/// What a successful batch did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// Configuration changes applied to objects.
    pub configured: usize,
    /// Layout generation after the batch (bumped by structural changes).
    pub generation: u64,
    /// Rules skipped with `ignore_unsupported`.
    pub warnings: Vec<String>,
}

/// A direct handle on one object, for control loops.
#[derive(Clone)]
pub struct ObjectHandle {
    label: Arc<str>,
    object: Arc<Object>,
}

impl std::fmt::Debug for ObjectHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ObjectHandle({})", self.label)
    }
}

impl ObjectHandle {
    /// `channel/object`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Validates and applies a configuration change.
    pub fn configure(&self, set: &ObjectConfig) -> Result<()> {
        self.object
            .validate(set)
            .map_err(|e| Error::invalid(format!("{}: field `{}`: {}", self.label, e.field, e.message)))?;
        self.object.configure(set);
        Ok(())
    }

    /// The object's current spec.
    pub fn spec(&self) -> Option<ObjectSpec> {
        self.object.spec()
    }

    /// The object's own statistics.
    pub fn stats(&self) -> ObjectStats {
        self.object.stats()
    }
}

// ---------------------------------------------------------------------------
// Control interface types.

/// A route as shown in [`StageInfo`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteInfo {
    /// Pattern.
    #[serde(rename = "match")]
    pub matches: Match,
    /// Channel (for channel routes) or object (for object routes).
    pub target: String,
}

/// An object as shown in [`StageInfo`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectInfo {
    /// Object id.
    pub id: String,
    /// Kind.
    pub kind: String,
    /// Current configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<ObjectSpec>,
}

/// A channel as shown in [`StageInfo`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelInfo {
    /// Channel id.
    pub id: String,
    /// Objects in creation order.
    pub objects: Vec<ObjectInfo>,
    /// Object routes.
    pub routes: Vec<RouteInfo>,
    /// Object for requests no object route matches.
    pub default_object: Option<String>,
}

/// What `stage_info` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageInfo {
    /// Stage name.
    pub name: String,
    /// Unique stage id.
    pub id: u64,
    /// Process id.
    pub pid: u32,
    /// Host name.
    pub host: String,
    /// Layout generation.
    pub generation: u64,
    /// Channel for requests no route matches.
    pub default_channel: String,
    /// Channel routes.
    pub routes: Vec<RouteInfo>,
    /// Channels in creation order.
    pub channels: Vec<ChannelInfo>,
    /// Workflows that have sent requests.
    pub workflows: Vec<WorkflowId>,
    /// Instances open on the stage ([`Stage::open_instance`]).
    pub instances: Vec<InstanceInfo>,
    /// Which objects each request context reaches, per instance class,
    /// computed from the compiled layout.
    pub coverage: Vec<Coverage>,
}

/// An instance open on a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InstanceInfo {
    /// Its id.
    pub id: InstanceId,
    /// Who opened it (a DB's path, a tenant's name).
    pub owner: String,
}

/// The objects that requests of one context reach, for one instance or for
/// every instance no rule names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Coverage {
    /// The request context.
    pub context: RequestContext,
    /// The instance (`None`: every instance no route names).
    pub instance: Option<InstanceId>,
    /// `(channel, object)` reached by some request of this context and
    /// instance (of any type, from any workflow), in layout order. Requests
    /// that pass through a channel without an object reach none.
    pub objects: Vec<(String, String)>,
}

impl StageInfo {
    /// The object `object` of channel `channel`, if both exist.
    pub fn object(&self, channel: &str, object: &str) -> Option<&ObjectInfo> {
        self.channels.iter().find(|c| c.id == channel)?.objects.iter().find(|o| o.id == object)
    }

    /// Objects that requests of `ctx` reach, for any instance, as
    /// `(channel, object)`: how a controller finds "the flush objects"
    /// without magic ids.
    pub fn objects_for_context(&self, ctx: RequestContext) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for c in self.coverage.iter().filter(|c| c.context == ctx) {
            for o in &c.objects {
                if !out.contains(o) {
                    out.push(o.clone());
                }
            }
        }
        out
    }

    /// Objects that requests of `ctx` from `instance` reach.
    pub fn objects_serving(&self, ctx: RequestContext, instance: InstanceId) -> &[(String, String)] {
        let find = |i: Option<InstanceId>| self.coverage.iter().find(|c| c.context == ctx && c.instance == i);
        find(Some(instance)).or_else(|| find(None)).map_or(&[], |c| &c.objects)
    }
}

/// Operations and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counter {
    /// Requests admitted.
    pub ops: u64,
    /// Bytes admitted.
    pub bytes: u64,
}

/// Counters of one channel.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelCounters {
    /// Channel id.
    pub channel: String,
    /// Totals.
    #[serde(flatten)]
    pub counter: Counter,
}

/// Counters of one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectCounters {
    /// Channel id.
    pub channel: String,
    /// Object id.
    pub object: String,
    /// Kind.
    pub kind: String,
    /// Changes when an object is removed and created again under the same
    /// id; counters then restart from zero.
    pub incarnation: u64,
    /// Totals.
    #[serde(flatten)]
    pub counter: Counter,
    /// The object's own statistics (waits).
    pub stats: ObjectStats,
}

/// Counters of one request context.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextCounters {
    /// Request context.
    pub context: RequestContext,
    /// Totals.
    #[serde(flatten)]
    pub counter: Counter,
}

/// Counters of one workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkflowCounters {
    /// Workflow id.
    pub workflow: WorkflowId,
    /// Totals.
    #[serde(flatten)]
    pub counter: Counter,
}

/// What `collect` reports: monotonic counters since the stage started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Collection {
    /// Stage name.
    pub stage: String,
    /// Stage id.
    pub stage_id: u64,
    /// Monotonic time since the stage started, in nanoseconds.
    pub elapsed_ns: u64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Per channel.
    pub channels: Vec<ChannelCounters>,
    /// Per object.
    pub objects: Vec<ObjectCounters>,
    /// Per request context (contexts with traffic only).
    pub contexts: Vec<ContextCounters>,
    /// Per workflow (a thread tracks a few workflows on its own).
    pub workflows: Vec<WorkflowCounters>,
    /// Workflows beyond those tracked per thread.
    pub other_workflows: Counter,
    /// Jobs per request context, as layers reported them
    /// ([`Stage::job_started`]); contexts that never had a job are omitted.
    pub jobs: Vec<JobCounters>,
}

/// Jobs of one request context in one instance (or, from
/// [`Collection::jobs`], in all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JobCounters {
    /// Request context.
    pub context: RequestContext,
    /// Instance.
    pub instance: InstanceId,
    /// Jobs begun.
    pub begun: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Jobs running now (`begun - completed`).
    pub running: u64,
}

impl Collection {
    /// A channel's counters.
    pub fn channel(&self, id: &str) -> Option<Counter> {
        self.channels.iter().find(|c| c.channel == id).map(|c| c.counter)
    }

    /// An object's counters.
    pub fn object(&self, channel: &str, object: &str) -> Option<&ObjectCounters> {
        self.objects.iter().find(|o| o.channel == channel && o.object == object)
    }

    /// Jobs of a request context, summed over instances (zero when none
    /// were reported; the `instance` field is then meaningless).
    pub fn jobs(&self, ctx: RequestContext) -> JobCounters {
        self.jobs.iter().filter(|j| j.context == ctx).fold(
            JobCounters { context: ctx, instance: InstanceId(0), begun: 0, completed: 0, running: 0 },
            |mut acc, j| {
                acc.begun += j.begun;
                acc.completed += j.completed;
                acc.running += j.running;
                acc
            },
        )
    }

    /// Jobs of a request context in one instance.
    pub fn instance_jobs(&self, instance: InstanceId, ctx: RequestContext) -> JobCounters {
        self.jobs.iter().find(|j| j.context == ctx && j.instance == instance).copied().unwrap_or(JobCounters {
            context: ctx,
            instance,
            begun: 0,
            completed: 0,
            running: 0,
        })
    }

    /// A request context's counters (zero when it had no traffic).
    pub fn context(&self, ctx: RequestContext) -> Counter {
        self.contexts.iter().find(|c| c.context == ctx).map_or_else(Counter::default, |c| c.counter)
    }

    /// Rates between an earlier collection and this one.
    pub fn rates_since(&self, earlier: &Collection) -> Rates {
        let dt = self.elapsed_ns.saturating_sub(earlier.elapsed_ns);
        let secs = (dt as f64 * 1e-9).max(1e-9);
        let rate = |now: Counter, then: Counter| RatePair {
            ops_per_sec: now.ops.saturating_sub(then.ops) as f64 / secs,
            bytes_per_sec: now.bytes.saturating_sub(then.bytes) as f64 / secs,
        };
        Rates {
            interval: Duration::from_nanos(dt),
            channels: self
                .channels
                .iter()
                .map(|c| (c.channel.clone(), rate(c.counter, earlier.channel(&c.channel).unwrap_or_default())))
                .collect(),
            objects: self
                .objects
                .iter()
                .map(|o| {
                    let then = earlier
                        .object(&o.channel, &o.object)
                        .filter(|e| e.incarnation == o.incarnation)
                        .map_or_else(Counter::default, |e| e.counter);
                    ((o.channel.clone(), o.object.clone()), rate(o.counter, then))
                })
                .collect(),
            contexts: self.contexts.iter().map(|c| (c.context, rate(c.counter, earlier.context(c.context)))).collect(),
        }
    }
}

/// Ops/s and bytes/s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RatePair {
    /// Requests per second.
    pub ops_per_sec: f64,
    /// Bytes per second.
    pub bytes_per_sec: f64,
}

/// Rates between two collections.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rates {
    /// Time between the two collections.
    pub interval: Duration,
    /// Per channel.
    pub channels: Vec<(String, RatePair)>,
    /// Per `(channel, object)`.
    pub objects: Vec<((String, String), RatePair)>,
    /// Per request context.
    pub contexts: Vec<(RequestContext, RatePair)>,
}

impl Rates {
    /// A request context's rates (zero when it had no traffic).
    pub fn context(&self, ctx: RequestContext) -> RatePair {
        self.contexts.iter().find(|c| c.0 == ctx).map_or_else(RatePair::default, |c| c.1)
    }

    /// A channel's rates.
    pub fn channel(&self, id: &str) -> RatePair {
        self.channels.iter().find(|c| c.0 == id).map_or_else(RatePair::default, |c| c.1)
    }

    /// An object's rates.
    pub fn object(&self, channel: &str, object: &str) -> RatePair {
        self.objects.iter().find(|o| o.0.0 == channel && o.0.1 == object).map_or_else(RatePair::default, |o| o.1)
    }
}
