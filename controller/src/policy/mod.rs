//! Policies: observed state in, enforcement decisions out.

mod adaptive;
mod fair;
mod params;
mod silk;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kv_stage::{
    Collection, InstanceId, Rates, RequestContext,
    info::{JobCounters, StageInfo},
};
use serde::Serialize;

pub use adaptive::{Adaptive, AdaptiveInputs, AdaptiveMode, Directions};
pub use fair::{FairShare, FairShareMode, FlowInput, water_fill};
pub use params::{AdaptiveConfig, InstanceConfig, PressureConfig, SilkConfig};
pub use silk::{Silk, SilkBranch, SilkInputs};

use crate::signals::ProcIoRates;

/// An instance the controller drives (a stage it was bound to, or that
/// joined): stable while the instance stays, never reused in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct InstanceKey(pub u32);

impl std::fmt::Display for InstanceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One object of a stage.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    /// Channel id.
    pub channel: String,
    /// Object id.
    pub object: String,
}

impl ObjectRef {
    /// `channel/object`.
    pub fn new(channel: impl Into<String>, object: impl Into<String>) -> Self {
        ObjectRef { channel: channel.into(), object: object.into() }
    }

    /// Whether this is `channel/object`.
    pub fn is(&self, channel: &str, object: &str) -> bool {
        self.channel == channel && self.object == object
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.channel, self.object)
    }
}

/// Why a policy made no decision in a cycle (the previous rates stay).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The policy could not decide (missing data, a bad state).
    #[error("{0}")]
    Failed(String),
    /// The policy panicked.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The policy asked for a rate that is not a number of bytes per second
    /// (NaN or -inf; only +inf means unlimited).
    #[error("rate {rate} for {object} of instance {instance} is not a number of bytes per second")]
    InvalidRate {
        /// The instance.
        instance: InstanceKey,
        /// The object.
        object: ObjectRef,
        /// The rate asked for.
        rate: f64,
    },
}

/// How hard a store is pressed by background work it has not done yet,
/// as its [`crate::StageHandle`] reports it. `level` is 0 when there is
/// nothing to do and 1 where the store starts to slow writes down (for
/// RocksDB: L0 files at the slowdown trigger, every spare memtable full, or
/// a write stall); it may exceed 1. The parts say where it comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pressure {
    /// The overall level: the largest part.
    pub level: f64,
    /// L0 files over the slowdown trigger.
    pub l0: f64,
    /// Immutable memtables over how many may wait before writes stall.
    pub memtables: f64,
    /// Pending compaction bytes over the reference the handle chose.
    pub pending: f64,
}

impl Pressure {
    /// From its parts; `level` is their maximum (NaN parts count as 0).
    pub fn new(l0: f64, memtables: f64, pending: f64) -> Self {
        let clean = |v: f64| if v.is_finite() { v.max(0.0) } else { 0.0 };
        let (l0, memtables, pending) = (clean(l0), clean(memtables), clean(pending));
        Pressure { level: l0.max(memtables).max(pending), l0, memtables, pending }
    }
}

/// What the controller saw of one instance (a stage) in a cycle.
#[derive(Debug, Clone)]
pub struct InstanceView {
    /// The instance's key (what a [`Setting`] names).
    pub key: InstanceKey,
    /// The instance's name.
    pub name: String,
    /// Its stage's layout.
    pub info: Arc<StageInfo>,
    /// Rates since the previous cycle.
    pub rates: Rates,
    /// Raw counters of this cycle.
    pub collection: Arc<Collection>,
    /// Jobs begun since the previous cycle, per instance of the stage (a DB
    /// sharing it) and request context.
    pub jobs_begun: HashMap<(InstanceId, RequestContext), u64>,
    /// Rates the controller set last on this instance's objects.
    pub current: Vec<(ObjectRef, f64)>,
    /// The store's pressure this cycle, when its handle reports it.
    pub pressure: Option<Pressure>,
}

impl InstanceView {
    /// Jobs of a context now, over the stage's instances (running, begun,
    /// completed since the start).
    pub fn jobs(&self, ctx: RequestContext) -> JobCounters {
        self.collection.jobs(ctx)
    }

    /// Whether a job of `ctx` is running now or ran since the previous
    /// cycle, in any of the stage's instances. Bytes in the last interval
    /// alone misjudge a throttled job, and a short one can begin and end
    /// between two cycles.
    pub fn job_active(&self, ctx: RequestContext) -> bool {
        !self.active_instances(ctx).is_empty()
    }

    /// The stage's instances (DBs) in which a job of `ctx` (of one of its
    /// members, when it is a class) runs now or ran since the previous
    /// cycle.
    pub fn active_instances(&self, ctx: RequestContext) -> Vec<InstanceId> {
        let mut v: Vec<InstanceId> = self
            .collection
            .jobs
            .iter()
            .filter(|j| ctx.covers(j.context) && j.counts.running > 0)
            .map(|j| j.instance)
            .chain(self.jobs_begun.iter().filter(|((_, c), n)| ctx.covers(*c) && **n > 0).map(|((i, _), _)| *i))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The rate the controller set last on `channel/object`, if any.
    pub fn current_rate(&self, channel: &str, object: &str) -> Option<f64> {
        self.current.iter().find(|(o, _)| o.is(channel, object)).map(|(_, r)| *r)
    }
}

/// Everything a policy sees in one cycle.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Cycle number, from 0.
    pub cycle: u64,
    /// Time since the controller started.
    pub elapsed: Duration,
    /// Time since the previous cycle.
    pub interval: Duration,
    /// The instances, in the order they were bound.
    pub instances: Vec<InstanceView>,
    /// `/proc/self/io` rates: the device-level view of this process.
    pub proc_io: Option<ProcIoRates>,
}

/// One rate to set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// The instance.
    pub instance: InstanceKey,
    /// The object (a DRL).
    pub object: ObjectRef,
    /// Bytes per second (`INFINITY`: unlimited).
    pub rate: f64,
}

/// A policy's decision: the rates to set, and what it based them on (for
/// the decision log).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Decision {
    /// Rates to set.
    pub settings: Vec<Setting>,
    /// Policy-specific inputs and intermediate values, per instance.
    pub notes: serde_json::Value,
    /// The branch the policy took per instance (a short, fixed name such as
    /// SILK's `flush_only` or the default controller's `healthy`), counted
    /// in the controller's metrics; empty for a policy without branches.
    #[serde(skip)]
    pub branches: Vec<(InstanceKey, &'static str)>,
}

/// The DRLs that requests of `ctx` reach, in a stage's layout (how SILK and
/// the default controller find their flush, L0 and LN objects).
/// For SILK and the policies built on it: the stage has a DRL that flush,
/// L0->L1 or higher-level compaction requests reach.
pub(crate) fn check_background_drls(policy: &str, info: &StageInfo) -> Result<(), String> {
    let any = [RequestContext::BG_FLUSH, RequestContext::BG_COMPACTION_L0_L1, RequestContext::BG_COMPACTION_LN]
        .into_iter()
        .any(|c| !drls_for(info, c).is_empty());
    if any {
        return Ok(());
    }
    Err(format!(
        "{policy} drives the DRLs that flushes and compactions reach, and stage '{}' has none (channels: {}): \
         install rocks_env::RocksLayout, or rules with a DRL for bg_flush, bg_compaction_L0_L1 or bg_compaction_LN",
        info.name,
        if info.channels.is_empty() {
            "none".to_owned()
        } else {
            info.channels.iter().map(|c| c.id.as_str()).collect::<Vec<_>>().join(", ")
        }
    ))
}

fn drls_for(info: &StageInfo, ctx: RequestContext) -> Vec<ObjectRef> {
    info.objects_for_context(ctx)
        .into_iter()
        .filter(|(c, o)| info.object(c, o).is_some_and(|x| x.kind == kv_stage::object::ObjectKind::Drl))
        .map(|(c, o)| ObjectRef::new(c, o))
        .collect()
}

/// 0 at or below `from`, 1 at or above `to`, linear between (+inf: 1;
/// NaN, -inf: 0): how far a pressure reading is along a ramp.
pub(crate) fn ramp(pressure: f64, from: f64, to: f64) -> f64 {
    if !pressure.is_finite() {
        return if pressure > 0.0 { 1.0 } else { 0.0 };
    }
    ((pressure - from) / (to - from)).clamp(0.0, 1.0)
}

/// A control policy.
pub trait Policy: Send {
    /// Name for logs.
    fn name(&self) -> &'static str;

    /// Decides the rates for this cycle. An error keeps the previous rates.
    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError>;

    /// Whether this policy finds something to drive on a stage: `Err`
    /// with the reason when it would run and change nothing (checked for
    /// every instance bound before the controller starts).
    fn check_stage(&self, _info: &StageInfo) -> Result<(), String> {
        Ok(())
    }

    /// An instance joined (fair-share policies add it to the share).
    fn instance_joined(&mut self, _config: &InstanceConfig) {}

    /// An instance left.
    fn instance_left(&mut self, _name: &str) {}

    /// After its last decision: how long the loop may wait for the next
    /// cycle, if that is longer than its interval, because nothing the
    /// policy limits can change before a background job begins. The loop
    /// waits that long only when every instance's handle wakes it at a
    /// job's start ([`StageHandle::watch_jobs`](crate::StageHandle::watch_jobs));
    /// otherwise it keeps its interval. `None` (the default): every cycle
    /// at the interval.
    fn idle_interval(&self) -> Option<std::time::Duration> {
        None
    }
}
