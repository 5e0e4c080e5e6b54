//! The read model: what a control plane reads of a stage ([`StageInfo`],
//! [`Collection`], [`Rates`], [`Coverage`]) and the handles it configures
//! objects through ([`ObjectHandle`]).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::context::{Context, InstanceId, Reason, RequestContext, RequestType, WorkflowId};
use crate::error::{Error, Result};
use crate::matching::Match;
use crate::objects::{EnforcementObject, Object, ObjectChange, ObjectKind, ObjectSpec, ObjectStats};

use super::model::Model;
use super::snapshot::{Layout, NO_OBJECT};

/// Which objects the requests of each context reach, per instance class,
/// by looking every combination of classifier classes up in the compiled
/// layout: the request types, the workflows, instances and reasons the
/// rules name (plus one value no rule names), and `contexts`.
pub(super) fn coverage(layout: &Layout, m: &Model, contexts: &[RequestContext]) -> Vec<Coverage> {
    let patterns = m.routes.iter().chain(m.channels.iter().flat_map(|c| c.routes.iter())).map(|r| &r.matches);
    let mut instances: Vec<InstanceId> = Vec::new();
    let mut workflows: Vec<u64> = Vec::new();
    let mut reasons: Vec<Reason> = vec![Reason::None];
    for p in patterns {
        instances.extend(p.instance.values().iter().copied());
        workflows.extend(p.workflow.values().iter().map(|w| w.0));
        reasons.extend(p.reason.values().iter().copied());
    }
    reasons.sort();
    reasons.dedup();
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
            for (t, &reason) in RequestType::ALL.into_iter().flat_map(|t| reasons.iter().map(move |r| (t, r))) {
                for &w in &workflows {
                    let r = layout.route(&Context::with(WorkflowId(w), t, context, instance, 0).with_reason(reason));
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
    pub(super) label: Arc<str>,
    pub(super) object: Arc<Object>,
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

    /// Checks a configuration change without applying it.
    pub fn check(&self, set: &ObjectChange) -> Result<()> {
        self.object
            .validate(set)
            .map_err(|e| Error::invalid(format!("{}: field `{}`: {}", self.label, e.field, e.message)))
    }

    /// Validates and applies a configuration change: straight to the live
    /// object, without a rules batch (no copy of the stage's model).
    pub fn configure(&self, set: &ObjectChange) -> Result<()> {
        self.check(set)?;
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
    pub kind: ObjectKind,
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
    /// Instances open on the stage ([`Stage::open_instance`](crate::Stage::open_instance)).
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

    /// Objects that requests of `ctx` (of its members too, when it is a
    /// class) reach, for any instance, as `(channel, object)`: how a
    /// controller finds "the flush objects" without magic ids.
    pub fn objects_for_context(&self, ctx: RequestContext) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for c in self.coverage.iter().filter(|c| ctx.covers(c.context)) {
            for o in &c.objects {
                if !out.contains(o) {
                    out.push(o.clone());
                }
            }
        }
        out
    }

    /// Objects that requests of `ctx` (of its members too, when it is a
    /// class) from `instance` reach.
    pub fn objects_serving(&self, ctx: RequestContext, instance: InstanceId) -> Vec<(String, String)> {
        // A context's row for this instance, else its row for "any other".
        let named = |c: RequestContext| self.coverage.iter().any(|r| r.context == c && r.instance == Some(instance));
        let mut out: Vec<(String, String)> = Vec::new();
        for row in self.coverage.iter().filter(|r| ctx.covers(r.context)) {
            let applies = match row.instance {
                Some(i) => i == instance,
                None => !named(row.context),
            };
            for o in row.objects.iter().filter(|_| applies) {
                if !out.contains(o) {
                    out.push(o.clone());
                }
            }
        }
        out
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
    pub kind: ObjectKind,
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
    /// The file data requests (reads and writes of file contents) among
    /// them: the context's device traffic, without key-value requests.
    pub file: Counter,
    /// The file writes among `file`: for a client context, the bytes it
    /// asks the store to take in (the write-ahead log's, in RocksDB).
    pub file_writes: Counter,
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
    /// Layout generation the counters were read under: when it differs from
    /// the last [`StageInfo::generation`] a reader saw, the layout changed.
    pub generation: u64,
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
    /// ([`Stage::job_started`](crate::Stage::job_started)); contexts that never had a job are omitted.
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
    /// Its jobs.
    #[serde(flatten)]
    pub counts: JobCounts,
}

/// How many jobs began, completed and run now: the counts every report of
/// background jobs shares (the stage's [`JobCounters`], rocks-env's per-class
/// job statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct JobCounts {
    /// Jobs begun.
    pub begun: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Jobs running now.
    pub running: u64,
}

impl JobCounts {
    /// The sum of both.
    pub fn plus(self, o: JobCounts) -> JobCounts {
        JobCounts {
            begun: self.begun + o.begun,
            completed: self.completed + o.completed,
            running: self.running + o.running,
        }
    }
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

    /// Jobs of a request context (with its members, when it is a class),
    /// summed over instances (zero when none were reported; the `instance`
    /// field is then meaningless).
    pub fn jobs(&self, ctx: RequestContext) -> JobCounters {
        let counts =
            self.jobs.iter().filter(|j| ctx.covers(j.context)).fold(JobCounts::default(), |a, j| a.plus(j.counts));
        JobCounters { context: ctx, instance: InstanceId(0), counts }
    }

    /// Jobs of a request context in one instance.
    pub fn instance_jobs(&self, instance: InstanceId, ctx: RequestContext) -> JobCounters {
        self.jobs.iter().find(|j| j.context == ctx && j.instance == instance).copied().unwrap_or(JobCounters {
            context: ctx,
            instance,
            counts: JobCounts::default(),
        })
    }

    /// A request context's counters (zero when it had no traffic); for a
    /// class, the sum over the class and its members.
    pub fn context(&self, ctx: RequestContext) -> Counter {
        self.contexts.iter().filter(|c| ctx.covers(c.context)).fold(Counter::default(), |acc, c| Counter {
            ops: acc.ops + c.counter.ops,
            bytes: acc.bytes + c.counter.bytes,
        })
    }

    /// One of a request context's own counters (`pick`), without its
    /// members; zero when it had no traffic.
    fn context_counter(&self, ctx: RequestContext, pick: fn(&ContextCounters) -> Counter) -> Counter {
        self.contexts.iter().find(|c| c.context == ctx).map_or_else(Counter::default, pick)
    }

    /// A request context's own counters, without its members.
    pub fn context_exact(&self, ctx: RequestContext) -> Counter {
        self.context_counter(ctx, |c| c.counter)
    }

    /// A request context's own file data counters, without its members.
    pub fn context_file_exact(&self, ctx: RequestContext) -> Counter {
        self.context_counter(ctx, |c| c.file)
    }

    /// Rates between an earlier collection and this one.
    pub fn rates_since(&self, earlier: &Collection) -> Rates {
        let dt = self.elapsed_ns.saturating_sub(earlier.elapsed_ns);
        let secs = (dt as f64 * 1e-9).max(1e-9);
        let rate = |now: Counter, then: Counter| RatePair {
            ops_per_sec: now.ops.saturating_sub(then.ops) as f64 / secs,
            bytes_per_sec: now.bytes.saturating_sub(then.bytes) as f64 / secs,
        };
        let per_context = |pick: fn(&ContextCounters) -> Counter| -> Vec<(RequestContext, RatePair)> {
            self.contexts.iter().map(|c| (c.context, rate(pick(c), earlier.context_counter(c.context, pick)))).collect()
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
            contexts: per_context(|c| c.counter),
            file_contexts: per_context(|c| c.file),
            file_write_contexts: per_context(|c| c.file_writes),
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

impl std::iter::Sum for RatePair {
    fn sum<I: Iterator<Item = RatePair>>(iter: I) -> RatePair {
        iter.fold(RatePair::default(), |acc, r| RatePair {
            ops_per_sec: acc.ops_per_sec + r.ops_per_sec,
            bytes_per_sec: acc.bytes_per_sec + r.bytes_per_sec,
        })
    }
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
    /// Per request context, file data requests (reads and writes of file
    /// contents) only.
    pub file_contexts: Vec<(RequestContext, RatePair)>,
    /// Per request context, file writes only.
    pub file_write_contexts: Vec<(RequestContext, RatePair)>,
}

impl Rates {
    /// A request context's rates (zero when it had no traffic); for a
    /// class, the sum over the class and its members.
    pub fn context(&self, ctx: RequestContext) -> RatePair {
        self.contexts.iter().filter(|c| ctx.covers(c.0)).map(|c| c.1).sum()
    }

    /// A request context's file data rates (reads and writes of file
    /// contents, no key-value requests); for a class, over its members too.
    pub fn context_file(&self, ctx: RequestContext) -> RatePair {
        self.file_contexts.iter().filter(|c| ctx.covers(c.0)).map(|c| c.1).sum()
    }

    /// The file data rates of client work: every context that is not
    /// background (foreground, tenants, application contexts).
    pub fn client_file(&self) -> RatePair {
        self.file_contexts.iter().filter(|c| !c.0.is_background()).map(|c| c.1).sum()
    }

    /// The file write rates of client work (every context that is not
    /// background): in RocksDB, the write-ahead log, i.e. what flushes and
    /// L0 compactions must keep pace with.
    pub fn client_file_writes(&self) -> RatePair {
        self.file_write_contexts.iter().filter(|c| !c.0.is_background()).map(|c| c.1).sum()
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
