//! Between the wire messages (`pb`) and kv-stage's read model.
//!
//! Request contexts travel by id and name: built-in contexts are matched by
//! id, application contexts by name (their ids are per process), and a
//! context this process never heard of is registered under its name. A
//! context that cannot be registered (the registry is full, the name is
//! not a valid context name) is dropped from the decoded counters and
//! counted in [`Decoded::dropped_contexts`].

use kv_stage::{
    Collection, InstanceId, Match, ObjectSpec, RequestContext, WorkflowId,
    info::{
        ChannelCounters, ChannelInfo, ContextCounters, Counter, Coverage, InstanceInfo, JobCounters, JobCounts,
        ObjectCounters, ObjectInfo, RouteInfo, StageInfo, WorkflowCounters,
    },
    object::{ObjectKind, ObjectStats, WaitHistogram},
};

use crate::pb;

/// A decoded message and what had to be left out of it.
#[derive(Debug, Clone)]
pub(crate) struct Decoded<T> {
    pub(crate) value: T,
    pub(crate) dropped_contexts: usize,
}

fn counter(c: Counter) -> Option<pb::Counter> {
    Some(pb::Counter { ops: c.ops, bytes: c.bytes })
}

fn from_counter(c: Option<pb::Counter>) -> Counter {
    c.map_or_else(Counter::default, |c| Counter { ops: c.ops, bytes: c.bytes })
}

fn context_ref(c: RequestContext) -> Option<pb::ContextRef> {
    Some(pb::ContextRef { id: u32::from(c.id()), name: c.name().to_owned() })
}

/// The local context a wire context names.
fn from_context(c: Option<&pb::ContextRef>) -> Option<RequestContext> {
    let c = c?;
    if let Ok(id) = u16::try_from(c.id)
        && id < RequestContext::FIRST_USER_ID
    {
        return RequestContext::from_id(id);
    }
    RequestContext::lookup(&c.name).or_else(|| RequestContext::register(&c.name).ok())
}

fn kind_of(name: &str) -> ObjectKind {
    ObjectKind::of(name)
}

/// A collection, for the wire.
pub(crate) fn collection(c: &Collection) -> pb::Collection {
    pb::Collection {
        stage: c.stage.clone(),
        stage_id: c.stage_id,
        generation: c.generation,
        elapsed_ns: c.elapsed_ns,
        unix_ms: c.unix_ms,
        channels: c
            .channels
            .iter()
            .map(|ch| pb::ChannelCounters { channel: ch.channel.clone(), counter: counter(ch.counter) })
            .collect(),
        objects: c
            .objects
            .iter()
            .map(|o| pb::ObjectCounters {
                channel: o.channel.clone(),
                object: o.object.clone(),
                kind: o.kind.as_str().to_owned(),
                incarnation: o.incarnation,
                counter: counter(o.counter),
                waits: o.stats.waits,
                wait_ns: o.stats.wait_ns,
                waiting: o.stats.waiting,
                wait_buckets: o.stats.wait_histogram.0.to_vec(),
            })
            .collect(),
        contexts: c
            .contexts
            .iter()
            .map(|x| pb::ContextCounters {
                context: context_ref(x.context),
                counter: counter(x.counter),
                file: counter(x.file),
                file_writes: counter(x.file_writes),
            })
            .collect(),
        workflows: c
            .workflows
            .iter()
            .map(|w| pb::WorkflowCounters { workflow: w.workflow.0, counter: counter(w.counter) })
            .collect(),
        other_workflows: counter(c.other_workflows),
        jobs: c
            .jobs
            .iter()
            .map(|j| pb::JobCounters {
                context: context_ref(j.context),
                instance: u32::from(j.instance.0),
                begun: j.counts.begun,
                completed: j.counts.completed,
                running: j.counts.running,
            })
            .collect(),
    }
}

/// A collection, from the wire.
pub(crate) fn from_collection(c: pb::Collection) -> Decoded<Collection> {
    let mut dropped = 0;
    let mut context = |r: Option<&pb::ContextRef>| {
        let c = from_context(r);
        if c.is_none() {
            dropped += 1;
        }
        c
    };
    let contexts = c
        .contexts
        .iter()
        .filter_map(|x| {
            Some(ContextCounters {
                context: context(x.context.as_ref())?,
                counter: from_counter(x.counter),
                file: from_counter(x.file),
                file_writes: from_counter(x.file_writes),
            })
        })
        .collect();
    let jobs = c
        .jobs
        .iter()
        .filter_map(|j| {
            Some(JobCounters {
                context: context(j.context.as_ref())?,
                instance: InstanceId(u16::try_from(j.instance).unwrap_or(u16::MAX)),
                counts: JobCounts { begun: j.begun, completed: j.completed, running: j.running },
            })
        })
        .collect();
    let value = Collection {
        stage: c.stage,
        stage_id: c.stage_id,
        generation: c.generation,
        elapsed_ns: c.elapsed_ns,
        unix_ms: c.unix_ms,
        channels: c
            .channels
            .into_iter()
            .map(|ch| ChannelCounters { channel: ch.channel, counter: from_counter(ch.counter) })
            .collect(),
        objects: c
            .objects
            .into_iter()
            .map(|o| ObjectCounters {
                kind: kind_of(&o.kind),
                channel: o.channel,
                object: o.object,
                incarnation: o.incarnation,
                counter: from_counter(o.counter),
                stats: ObjectStats {
                    waits: o.waits,
                    wait_ns: o.wait_ns,
                    waiting: o.waiting,
                    wait_histogram: wait_histogram(&o.wait_buckets),
                },
            })
            .collect(),
        contexts,
        workflows: c
            .workflows
            .into_iter()
            .map(|w| WorkflowCounters { workflow: WorkflowId(w.workflow), counter: from_counter(w.counter) })
            .collect(),
        other_workflows: from_counter(c.other_workflows),
        jobs,
    };
    Decoded { value, dropped_contexts: dropped }
}

fn route(r: &RouteInfo) -> pb::Route {
    pb::Route { match_json: serde_json::to_string(&r.matches).unwrap_or_default(), target: r.target.clone() }
}

fn from_route(r: pb::Route) -> Result<RouteInfo, String> {
    let matches: Match = serde_json::from_str(&r.match_json).map_err(|e| format!("route to '{}': {e}", r.target))?;
    Ok(RouteInfo { matches, target: r.target })
}

/// An object's spec as JSON (empty when it has none).
pub(crate) fn spec_json(spec: Option<&ObjectSpec>) -> String {
    spec.and_then(|s| serde_json::to_string(s).ok()).unwrap_or_default()
}

/// A stage's layout, for the wire.
pub(crate) fn stage_info(i: &StageInfo) -> pb::StageInfo {
    pb::StageInfo {
        name: i.name.clone(),
        id: i.id,
        pid: i.pid,
        host: i.host.clone(),
        generation: i.generation,
        default_channel: i.default_channel.clone(),
        routes: i.routes.iter().map(route).collect(),
        channels: i
            .channels
            .iter()
            .map(|c| pb::ChannelInfo {
                id: c.id.clone(),
                objects: c
                    .objects
                    .iter()
                    .map(|o| pb::ObjectInfo {
                        id: o.id.clone(),
                        kind: o.kind.as_str().to_owned(),
                        spec_json: spec_json(o.spec.as_ref()),
                    })
                    .collect(),
                routes: c.routes.iter().map(route).collect(),
                default_object: c.default_object.clone(),
            })
            .collect(),
        workflows: i.workflows.iter().map(|w| w.0).collect(),
        instances: i.instances.iter().map(instance).collect(),
        coverage: i
            .coverage
            .iter()
            .map(|c| pb::CoverageRow {
                context: context_ref(c.context),
                instance: c.instance.map(|i| u32::from(i.0)),
                objects: c
                    .objects
                    .iter()
                    .map(|(ch, o)| pb::ObjectRef { channel: ch.clone(), object: o.clone() })
                    .collect(),
            })
            .collect(),
    }
}

pub(crate) fn instance(i: &InstanceInfo) -> pb::InstanceInfo {
    pb::InstanceInfo { id: u32::from(i.id.0), owner: i.owner.clone() }
}

/// A stage's layout, from the wire. A route or spec that does not parse is
/// an error (the layout would be wrong), a context that cannot be named
/// here drops its coverage row.
pub(crate) fn from_stage_info(i: pb::StageInfo) -> Result<Decoded<StageInfo>, String> {
    let mut dropped = 0;
    let mut channels = Vec::with_capacity(i.channels.len());
    for c in i.channels {
        let mut objects = Vec::with_capacity(c.objects.len());
        for o in c.objects {
            let spec = if o.spec_json.is_empty() {
                None
            } else {
                Some(
                    serde_json::from_str::<ObjectSpec>(&o.spec_json)
                        .map_err(|e| format!("object {}/{}: spec: {e}", c.id, o.id))?,
                )
            };
            objects.push(ObjectInfo { id: o.id, kind: kind_of(&o.kind), spec });
        }
        channels.push(ChannelInfo {
            id: c.id,
            objects,
            routes: c.routes.into_iter().map(from_route).collect::<Result<_, _>>()?,
            default_object: c.default_object,
        });
    }
    let mut coverage = Vec::with_capacity(i.coverage.len());
    for row in i.coverage {
        let Some(context) = from_context(row.context.as_ref()) else {
            dropped += 1;
            continue;
        };
        coverage.push(Coverage {
            context,
            instance: row.instance.map(|i| InstanceId(u16::try_from(i).unwrap_or(u16::MAX))),
            objects: row.objects.into_iter().map(|o| (o.channel, o.object)).collect(),
        });
    }
    let value = StageInfo {
        name: i.name,
        id: i.id,
        pid: i.pid,
        host: i.host,
        generation: i.generation,
        default_channel: i.default_channel,
        routes: i.routes.into_iter().map(from_route).collect::<Result<_, _>>()?,
        channels,
        workflows: i.workflows.into_iter().map(WorkflowId).collect(),
        instances: i
            .instances
            .into_iter()
            .map(|x| InstanceInfo { id: InstanceId(u16::try_from(x.id).unwrap_or(u16::MAX)), owner: x.owner })
            .collect(),
        coverage,
    };
    Ok(Decoded { value, dropped_contexts: dropped })
}

/// A wait histogram as sent: one count per bucket; an older agent sends
/// none (all zero), a count beyond the buckets this side knows goes to the
/// last one.
fn wait_histogram(counts: &[u64]) -> WaitHistogram {
    let mut h = WaitHistogram::default();
    let last = h.0.len() - 1;
    for (i, &n) in counts.iter().enumerate() {
        h.0[i.min(last)] += n;
    }
    h
}
