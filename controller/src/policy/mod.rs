//! Policies: observed state in, enforcement decisions out.

mod fair;
mod silk;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kv_stage::{Collection, InstanceId, JobCounters, Rates, RequestContext, StageInfo};
use serde::Serialize;

pub use fair::{FairShare, FairShareMode, FlowInput, water_fill};
pub use silk::{Silk, SilkBranch, SilkInputs};

use crate::signals::ProcIoRates;

/// What the controller saw of one instance (a stage) in a cycle.
#[derive(Debug, Clone)]
pub struct InstanceView {
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

    /// The stage's instances (DBs) in which a job of `ctx` runs now or ran
    /// since the previous cycle.
    pub fn active_instances(&self, ctx: RequestContext) -> Vec<InstanceId> {
        let mut v: Vec<InstanceId> = self
            .collection
            .jobs
            .iter()
            .filter(|j| j.context == ctx && j.running > 0)
            .map(|j| j.instance)
            .chain(self.jobs_begun.iter().filter(|((_, c), n)| *c == ctx && **n > 0).map(|((i, _), _)| *i))
            .collect();
        v.sort();
        v.dedup();
        v
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
    /// Rates the controller applied last, per `(instance, channel, object)`.
    pub current: HashMap<(usize, String, String), f64>,
}

impl Observation {
    /// The rate last applied to an object, if any.
    pub fn current_rate(&self, instance: usize, channel: &str, object: &str) -> Option<f64> {
        self.current.get(&(instance, channel.to_owned(), object.to_owned())).copied()
    }
}

/// One rate to set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// Instance index.
    pub instance: usize,
    /// Channel of the object.
    pub channel: String,
    /// Object id.
    pub object: String,
    /// Bytes per second.
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
}

/// A control policy.
pub trait Policy: Send {
    /// Name for logs.
    fn name(&self) -> &'static str;

    /// Decides the rates for this cycle. An error keeps the previous rates.
    fn decide(&mut self, obs: &Observation) -> Result<Decision, String>;

    /// An instance joined (fair-share policies add it to the share).
    fn instance_joined(&mut self, _config: &crate::config::InstanceConfig) {}

    /// An instance left.
    fn instance_left(&mut self, _name: &str) {}
}
