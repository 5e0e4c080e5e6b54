//! The control loop.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kv_stage::{Collection, ObjectChange, RequestContext, info::StageInfo, units::Rate};
use serde::Serialize;

use crate::config::{ControllerConfig, PolicyKind};
use crate::error::{Error, Result};
use crate::handle::{IntoStageHandle, ObjectControl, StageHandle};
use crate::metrics::{ControllerMetrics, CycleStats};
use crate::policy::InstanceConfig;
use crate::policy::{
    Adaptive, Decision, FairShare, FairShareMode, InstanceKey, InstanceView, ObjectRef, Observation, Policy,
    PolicyError, Pressure, Silk,
};
use crate::signals::{ProcIoRates, ProcIoSampler};

/// No DRL is ever set below this (bytes/s): a policy asking for 0 or less
/// gets this floor instead, so nothing is closed by the controller.
pub const RATE_FLOOR: f64 = 1024.0;

/// A rate the controller set (or failed to set) in a cycle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppliedSetting {
    /// Instance name.
    pub instance: String,
    /// Channel.
    pub channel: String,
    /// Object.
    pub object: String,
    /// Bytes per second.
    pub rate_bps: f64,
    /// Why it was not applied, if it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Per-context rates of one instance in a cycle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceInputs {
    /// Instance name.
    pub instance: String,
    /// Bytes/s per request context with traffic.
    pub context_bps: Vec<(String, f64)>,
    /// Running jobs per request context that ever had one.
    pub running_jobs: Vec<(String, u64)>,
    /// The store's pressure, when the handle reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure: Option<Pressure>,
    /// Why the instance could not be read this cycle (it was left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One cycle of the control loop: what was observed, what was decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// Cycle number.
    pub cycle: u64,
    /// Milliseconds since the controller started.
    pub t_ms: f64,
    /// Milliseconds since the previous cycle.
    pub interval_ms: f64,
    /// Wall-clock time the cycle started, milliseconds since the Unix
    /// epoch (to line a cycle up with events in other processes).
    pub unix_ms: u64,
    /// How long the cycle took (collect, decide, apply), in milliseconds.
    pub cycle_ms: f64,
    /// The policy.
    pub policy: &'static str,
    /// Per-instance inputs.
    pub inputs: Vec<InstanceInputs>,
    /// `/proc/self/io` rates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proc_io: Option<ProcIoRates>,
    /// The policy's own notes (e.g. SILK's `left_B` and branch).
    pub notes: serde_json::Value,
    /// Rates set.
    pub settings: Vec<AppliedSetting>,
    /// The policy's error, when it failed (previous rates kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

struct Instance {
    key: InstanceKey,
    name: String,
    handle: Arc<dyn StageHandle>,
    previous: Option<Arc<Collection>>,
    /// The stage's layout, read again when its generation changes.
    info: Option<Arc<StageInfo>>,
    /// Handles on the objects the policy set, valid for `info`'s generation.
    objects: HashMap<ObjectRef, Arc<dyn ObjectControl>>,
    /// Rates set last.
    current: Vec<(ObjectRef, f64)>,
    /// While held, the stage wakes the loop when a job begins (`None`: the
    /// handle cannot, and the loop never sleeps past its interval).
    job_watch: Option<Box<dyn Send>>,
}

impl Instance {
    fn new(key: InstanceKey, name: String, handle: Arc<dyn StageHandle>, shared: &Arc<Shared>) -> Self {
        let weak = Arc::downgrade(shared);
        let job_watch = handle.watch_jobs(Arc::new(move || {
            if let Some(s) = weak.upgrade() {
                s.run_soon();
            }
        }));
        Instance {
            key,
            name,
            handle,
            previous: None,
            info: None,
            objects: HashMap::new(),
            current: Vec::new(),
            job_watch,
        }
    }
}

enum Change {
    Join(InstanceConfig, Arc<dyn StageHandle>),
    Leave(String),
}

struct Shared {
    /// Whether to stop; and, under the same lock, whether to run the next
    /// cycle now (`Controller::cycle_now`).
    stop: Mutex<bool>,
    soon: std::sync::atomic::AtomicBool,
    wake: Condvar,
    log: Mutex<VecDeque<DecisionRecord>>,
    changes: Mutex<Vec<Change>>,
    /// What the loop counted (cycles, policy errors, ...): what
    /// `cycles()`, `policy_errors()` and the metrics read, updated once per
    /// cycle.
    stats: Arc<Mutex<CycleStats>>,
}

impl Shared {
    /// The next cycle runs now (`Controller::cycle_now`, a job's start).
    fn run_soon(&self) {
        let _held = self.stop.lock().unwrap_or_else(|e| e.into_inner());
        self.soon.store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_all();
    }
}

/// The policy a configuration names.
fn policy_for(config: &ControllerConfig) -> Box<dyn Policy> {
    match config.policy {
        PolicyKind::Silk => Box::new(Silk::new(&config.silk)),
        PolicyKind::Adaptive => Box::new(Adaptive::new(&config.adaptive)),
        kind => {
            let fs = config.fair_share.as_ref().expect("validated");
            let mode = match kind {
                PolicyKind::MaxMin => FairShareMode::MaxMin,
                PolicyKind::Proportional => FairShareMode::Proportional,
                _ => FairShareMode::Static,
            };
            Box::new(FairShare::new(mode, fs.device_bandwidth.bytes_per_sec(), fs.instances.clone()))
        }
    }
}

/// Cycles kept in memory unless [`ControllerBuilder::max_log_records`] says
/// otherwise: the last 10 s at SILK's 10 ms interval, a few MB at most (a
/// record of a busy cycle is a few KB). History goes to the log file.
pub const DEFAULT_MAX_LOG: usize = 1_000;

/// How often the decision-log file is flushed (and at stop).
const LOG_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Builds and starts a [`Controller`].
pub struct ControllerBuilder {
    config: ControllerConfig,
    instances: Vec<(String, Arc<dyn StageHandle>)>,
    policy: Option<Box<dyn Policy>>,
    proc_pid: Option<u32>,
    max_log: usize,
    late_instances: bool,
}

impl ControllerBuilder {
    /// Starts from a configuration.
    pub fn new(config: ControllerConfig) -> Self {
        ControllerBuilder {
            config,
            instances: Vec::new(),
            policy: None,
            proc_pid: None,
            max_log: DEFAULT_MAX_LOG,
            late_instances: false,
        }
    }

    /// Binds an instance name to a stage. For fair-share policies every
    /// configured instance must be bound, and only those.
    /// The handle is any `Arc` of a stage handle: `Arc<Stage>` as
    /// `Arc::clone(db.stage())` gives it, a `RemoteStage`, or an
    /// `Arc<dyn StageHandle>`.
    pub fn instance(mut self, name: impl Into<String>, handle: impl IntoStageHandle) -> Self {
        self.instances.push((name.into(), handle.into_stage_handle()));
        self
    }

    /// Lets configured instances join later ([`Controller::join`]), as
    /// remote stages do when they connect: the controller may start with
    /// none bound. Bind-time checks of a joining stage are the caller's
    /// ([`check_binding`]).
    pub fn late_instances(mut self) -> Self {
        self.late_instances = true;
        self
    }

    /// Runs this policy instead of the configured one.
    pub fn policy(mut self, policy: Box<dyn Policy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Reads `/proc/<pid>/io` instead of `/proc/self/io`.
    pub fn proc_pid(mut self, pid: u32) -> Self {
        self.proc_pid = Some(pid);
        self
    }

    /// Keeps at most this many cycles in memory, dropping the oldest
    /// (default [`DEFAULT_MAX_LOG`], 1,000; 0 keeps none). The log file,
    /// when configured, has every cycle.
    pub fn max_log_records(mut self, n: usize) -> Self {
        self.max_log = n;
        self
    }

    /// Validates everything, then starts the loop on its own thread.
    pub fn start(self) -> Result<Controller> {
        self.config.validate()?;
        let mut seen = std::collections::HashSet::new();
        for (i, (name, _)) in self.instances.iter().enumerate() {
            if !seen.insert(name.as_str()) {
                return Err(Error::config(&format!("instance[{i}]"), format!("instance '{name}' is bound twice")));
            }
        }
        if self.instances.is_empty() && !self.late_instances {
            return Err(Error::config("instances", "bind at least one instance to a stage"));
        }
        if self.policy.is_none()
            && let Some(fs) = &self.config.fair_share
            && !self.config.is_store_policy()
        {
            for (i, inst) in fs.instances.iter().enumerate() {
                if !self.late_instances && !self.instances.iter().any(|(n, _)| n == &inst.name) {
                    return Err(Error::config(
                        &format!("fair_share.instance[{i}].name"),
                        format!("instance '{}' is not bound to a stage", inst.name),
                    ));
                }
            }
            for (name, _) in &self.instances {
                if !fs.instances.iter().any(|c| &c.name == name) {
                    return Err(Error::config("fair_share.instance", format!("unknown instance '{name}'")));
                }
            }
            for (i, inst) in fs.instances.iter().enumerate() {
                let Some((_, handle)) = self.instances.iter().find(|(n, _)| n == &inst.name) else { continue };
                let info = handle.stage_info().map_err(|e| {
                    Error::config(&format!("fair_share.instance[{i}]"), format!("stage of '{}': {e}", inst.name))
                })?;
                check_binding(inst, &info).map_err(|e| match e {
                    Error::Config(e) => Error::Config(kv_stage::FieldError::new(
                        format!("fair_share.instance[{i}].{}", e.field),
                        e.message,
                    )),
                    other => other,
                })?;
            }
        }
        let policy = self.policy.unwrap_or_else(|| policy_for(&self.config));
        for (name, handle) in &self.instances {
            let info = handle
                .stage_info()
                .map_err(|e| Error::config("instances", format!("instance '{name}': its stage: {e}")))?;
            policy.check_stage(&info).map_err(|e| Error::config("policy", format!("instance '{name}': {e}")))?;
        }
        let log_file = match &self.config.log {
            Some(path) => {
                Some(BufWriter::new(File::options().create(true).append(true).open(path).map_err(Error::Log)?))
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            soon: std::sync::atomic::AtomicBool::new(false),
            wake: Condvar::new(),
            log: Mutex::new(VecDeque::new()),
            changes: Mutex::new(Vec::new()),
            stats: Arc::new(Mutex::new(CycleStats {
                policy: policy.name(),
                instances: self.instances.len(),
                ..CycleStats::default()
            })),
        });
        let state = LoopState {
            interval: self.config.effective_interval(),
            next_key: self.instances.len() as u32,
            instances: self
                .instances
                .into_iter()
                .enumerate()
                .map(|(i, (name, handle))| Instance::new(InstanceKey(i as u32), name, handle, &shared))
                .collect(),
            policy,
            proc_io: ProcIoSampler::new(self.proc_pid),
            log_file,
            log_flushed: Instant::now(),
            max_log: self.max_log,
            started: Instant::now(),
            last_cycle: None,
            shared: Arc::clone(&shared),
        };
        let thread = std::thread::Builder::new()
            .name(format!("controller-{}", state.policy.name()))
            .spawn(move || state.run())
            .map_err(Error::Log)?;
        Ok(Controller { thread: Some(thread), shared })
    }
}

struct LoopState {
    interval: Duration,
    instances: Vec<Instance>,
    /// The key the next instance to join gets.
    next_key: u32,
    policy: Box<dyn Policy>,
    proc_io: ProcIoSampler,
    log_file: Option<BufWriter<File>>,
    /// When the log file was last flushed.
    log_flushed: Instant,
    max_log: usize,
    started: Instant,
    last_cycle: Option<Instant>,
    shared: Arc<Shared>,
}

impl LoopState {
    fn run(mut self) {
        let mut next = Instant::now();
        loop {
            {
                let mut stop = self.shared.stop.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if *stop {
                        if let Some(f) = &mut self.log_file {
                            let _ = f.flush();
                        }
                        return;
                    }
                    let now = Instant::now();
                    if now >= next || self.shared.soon.swap(false, std::sync::atomic::Ordering::AcqRel) {
                        next = now;
                        break;
                    }
                    stop = self.shared.wake.wait_timeout(stop, next - now).unwrap_or_else(|e| e.into_inner()).0;
                }
            }
            self.cycle();
            next += self.step();
            // After a long stall, do not run a burst of catch-up cycles.
            let now = Instant::now();
            if next < now {
                next = now;
            }
        }
    }

    /// Time to the next cycle: the interval, or the policy's idle interval
    /// when it asks for a longer one and every instance's stage wakes the
    /// loop at a job's start.
    fn step(&self) -> Duration {
        match self.policy.idle_interval() {
            Some(idle) if idle > self.interval && self.instances.iter().all(|i| i.job_watch.is_some()) => idle,
            _ => self.interval,
        }
    }

    fn apply_changes(&mut self) {
        let changes: Vec<Change> = std::mem::take(&mut *self.shared.changes.lock().unwrap_or_else(|e| e.into_inner()));
        for c in changes {
            match c {
                Change::Join(cfg, handle) => {
                    self.instances.retain(|i| i.name != cfg.name);
                    self.instances.push(Instance::new(
                        InstanceKey(self.next_key),
                        cfg.name.clone(),
                        handle,
                        &self.shared,
                    ));
                    self.next_key += 1;
                    self.policy.instance_joined(&cfg);
                }
                Change::Leave(name) => {
                    self.instances.retain(|i| i.name != name);
                    self.policy.instance_left(&name);
                    self.stats().forget_instance(&name);
                }
            }
        }
    }

    /// One control cycle, in three phases: observe every instance, let the
    /// policy decide, then apply what it decided and record the cycle.
    fn cycle(&mut self) {
        self.apply_changes();
        let now = Instant::now();
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let interval = self.last_cycle.map_or(Duration::ZERO, |t| now - t);
        self.last_cycle = Some(now);
        let cycle = self.stats().cycles;
        let span = tracing::debug_span!("control_cycle", cycle, policy = self.policy.name());
        let _entered = span.enter();

        let (obs, inputs) = self.observe(cycle, now, interval);
        let outcome = self.decide(&obs);
        let branches: Vec<(String, &'static str)> = match &outcome {
            Ok(d) => d
                .branches
                .iter()
                .filter_map(|(k, b)| obs.instances.iter().find(|v| v.key == *k).map(|v| (v.name.clone(), *b)))
                .collect(),
            Err(_) => Vec::new(),
        };
        let mut record = DecisionRecord {
            cycle,
            t_ms: obs.elapsed.as_secs_f64() * 1e3,
            interval_ms: interval.as_secs_f64() * 1e3,
            unix_ms,
            cycle_ms: 0.0,
            policy: self.policy.name(),
            inputs,
            proc_io: obs.proc_io,
            notes: serde_json::Value::Null,
            settings: Vec::new(),
            error: None,
        };
        match outcome {
            Err(e) => {
                // Keep the rates applied last: nothing is changed.
                self.stats().policy_errors += 1;
                let error = Error::Policy { policy: self.policy.name(), error: e }.to_string();
                tracing::warn!(%error, "policy failed; the previous rates stay");
                record.error = Some(error);
            }
            Ok(decision) => self.apply(decision, &mut record),
        }
        for (instance, branch) in &branches {
            let rates: Vec<(&str, &str, f64)> = record
                .settings
                .iter()
                .filter(|s| s.instance == *instance)
                .map(|s| (s.channel.as_str(), s.object.as_str(), s.rate_bps))
                .collect();
            tracing::debug!(instance = instance.as_str(), branch, ?rates, "decided");
        }
        self.record(record, now, &branches);
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, CycleStats> {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Observe: every handle starts its read, then each instance is
    /// collected (one that cannot be read is left out of the cycle, with
    /// its error in the inputs), its stage info read again when its layout
    /// changed, and its rates computed against its previous collection.
    fn observe(&mut self, cycle: u64, now: Instant, interval: Duration) -> (Observation, Vec<InstanceInputs>) {
        let mut views = Vec::with_capacity(self.instances.len());
        let mut inputs = Vec::with_capacity(self.instances.len());
        for inst in &self.instances {
            inst.handle.begin_cycle();
        }
        for inst in &mut self.instances {
            let fetched = inst.handle.collect().and_then(|c| {
                let info = match &inst.info {
                    Some(i) if i.generation == c.generation => Arc::clone(i),
                    _ => {
                        inst.objects.clear();
                        inst.info = None;
                        let i = Arc::new(inst.handle.stage_info()?);
                        inst.info = Some(Arc::clone(&i));
                        i
                    }
                };
                Ok((c, info))
            });
            let (collection, info) = match fetched {
                Ok((c, i)) => (Arc::new(c), i),
                Err(e) => {
                    // Left out of this cycle (a policy shares among those it
                    // sees). Its previous collection stays: counters are
                    // monotonic, so the next read gives the average rate
                    // over the gap, not a false zero.
                    inputs.push(InstanceInputs {
                        instance: inst.name.clone(),
                        context_bps: Vec::new(),
                        running_jobs: Vec::new(),
                        pressure: None,
                        error: Some(e.to_string()),
                    });
                    continue;
                }
            };
            let previous = inst.previous.replace(Arc::clone(&collection));
            let (rates, jobs_begun) = match &previous {
                Some(p) => {
                    let begun = collection
                        .jobs
                        .iter()
                        .map(|j| {
                            let before = p.instance_jobs(j.instance, j.context).counts.begun;
                            ((j.instance, j.context), j.counts.begun.saturating_sub(before))
                        })
                        .collect();
                    (collection.rates_since(p), begun)
                }
                None => (collection.rates_since(&collection), HashMap::new()),
            };
            let pressure = inst.handle.pressure();
            inputs.push(InstanceInputs {
                instance: inst.name.clone(),
                context_bps: rates.contexts.iter().map(|(c, r)| (c.name().to_owned(), r.bytes_per_sec)).collect(),
                running_jobs: {
                    let mut v: Vec<(String, u64)> = Vec::new();
                    for j in &collection.jobs {
                        match v.iter_mut().find(|(c, _)| c == j.context.name()) {
                            Some(e) => e.1 += j.counts.running,
                            None => v.push((j.context.name().to_owned(), j.counts.running)),
                        }
                    }
                    v
                },
                pressure,
                error: None,
            });
            views.push(InstanceView {
                pressure,
                key: inst.key,
                name: inst.name.clone(),
                info,
                rates,
                collection,
                jobs_begun,
                current: inst.current.clone(),
            });
        }
        let obs = Observation {
            cycle,
            elapsed: now - self.started,
            interval,
            instances: views,
            proc_io: self.proc_io.sample(),
        };

        (obs, inputs)
    }

    /// Decide: the policy, under `catch_unwind`, with its rates checked (a
    /// rate that is not a number fails the cycle).
    fn decide(&mut self, obs: &Observation) -> std::result::Result<Decision, PolicyError> {
        let policy = &mut self.policy;
        match catch_unwind(AssertUnwindSafe(|| policy.decide(obs))) {
            Ok(Ok(d)) => check_rates(&d).map(|()| d),
            Ok(Err(e)) => Err(e),
            Err(p) => Err(PolicyError::Panicked(
                p.downcast_ref::<&str>()
                    .copied()
                    .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("?")
                    .to_owned(),
            )),
        }
    }

    /// Record: the cycle's duration, the counters, the log file (flushed
    /// every `LOG_FLUSH_EVERY`) and the in-memory log.
    fn record(&mut self, mut record: DecisionRecord, now: Instant, branches: &[(String, &'static str)]) {
        let took = now.elapsed().as_secs_f64();
        record.cycle_ms = took * 1e3;
        {
            let mut st = self.stats();
            st.record_cycle(took);
            st.instances = self.instances.len();
            for (instance, branch) in branches {
                st.record_branch(instance, branch);
            }
            for i in record.inputs.iter().filter(|i| i.error.is_some()) {
                st.record_unreachable(&i.instance);
            }
            for s in &record.settings {
                if s.error.is_none() {
                    st.settings_applied += 1;
                    st.record_rate(&s.instance, &s.channel, &s.object, s.rate_bps);
                } else {
                    st.settings_failed += 1;
                }
            }
        }
        for i in &record.inputs {
            if let Some(error) = &i.error {
                tracing::warn!(instance = i.instance.as_str(), %error, "instance unreachable; left out of the cycle");
            }
        }
        for s in record.settings.iter().filter(|s| s.error.is_some()) {
            tracing::warn!(
                instance = s.instance.as_str(),
                channel = s.channel.as_str(),
                object = s.object.as_str(),
                rate_bps = s.rate_bps,
                error = s.error.as_deref().unwrap_or(""),
                "rate not applied"
            );
        }
        if let Some(f) = &mut self.log_file
            && let Ok(line) = serde_json::to_string(&record)
        {
            let _ = writeln!(f, "{line}");
            if now.duration_since(self.log_flushed) >= LOG_FLUSH_EVERY {
                let _ = f.flush();
                self.log_flushed = now;
            }
        }
        let mut log = self.shared.log.lock().unwrap_or_else(|e| e.into_inner());
        if self.max_log > 0 {
            while log.len() >= self.max_log {
                log.pop_front();
            }
            log.push_back(record);
        }
    }

    /// Sets the decided rates through object handles, instance by
    /// instance: every change of an instance is checked before any is
    /// applied, so an instance gets all of its rates or none.
    fn apply(&mut self, decision: Decision, record: &mut DecisionRecord) {
        record.notes = decision.notes;
        let mut by_instance: HashMap<InstanceKey, Vec<&crate::policy::Setting>> = HashMap::new();
        for s in &decision.settings {
            by_instance.entry(s.instance).or_default().push(s);
        }
        for inst in &mut self.instances {
            let mut changes: Vec<RateChange> = Vec::new();
            for s in by_instance.get(&inst.key).into_iter().flatten() {
                let rate = if s.rate.is_finite() { s.rate.max(RATE_FLOOR) } else { s.rate };
                let handle = match inst.objects.get(&s.object) {
                    Some(h) => Ok(Arc::clone(h)),
                    None => match inst.handle.object(&s.object.channel, &s.object.object) {
                        Some(h) => {
                            inst.objects.insert(s.object.clone(), Arc::clone(&h));
                            Ok(h)
                        }
                        None => Err(format!("stage has no object {}", s.object)),
                    },
                };
                changes.push((s.object.clone(), rate, handle));
            }
            if changes.is_empty() {
                continue;
            }
            let config = |rate: f64| {
                ObjectChange::rate(if rate.is_finite() {
                    Rate::from_bytes_per_sec(rate).unwrap_or(Rate::UNLIMITED)
                } else {
                    Rate::UNLIMITED
                })
            };
            let checked: std::result::Result<(), String> = changes.iter().try_for_each(|(o, rate, h)| match h {
                Ok(h) => h.check(&config(*rate)).map_err(|e| format!("{o}: {e}")),
                Err(e) => Err(e.clone()),
            });
            if checked.is_ok() {
                for (o, rate, h) in &changes {
                    if let Ok(h) = h
                        && h.configure_deferred(&config(*rate)).is_ok()
                    {
                        match inst.current.iter_mut().find(|(x, _)| x == o) {
                            Some(c) => c.1 = *rate,
                            None => inst.current.push((o.clone(), *rate)),
                        }
                    }
                }
            }
            for (o, rate, _) in changes {
                record.settings.push(AppliedSetting {
                    instance: inst.name.clone(),
                    channel: o.channel,
                    object: o.object,
                    rate_bps: rate,
                    error: checked.clone().err(),
                });
            }
        }
        // Deferred changes (remote stages) were sent to every stage at
        // once; those that failed are marked and not taken as set.
        for inst in &mut self.instances {
            for (o, e) in inst.handle.finish_cycle() {
                inst.current.retain(|(x, _)| *x != o);
                inst.objects.remove(&o);
                if let Some(s) = record
                    .settings
                    .iter_mut()
                    .find(|s| s.instance == inst.name && s.channel == o.channel && s.object == o.object)
                {
                    s.error = Some(e.to_string());
                }
            }
        }
    }
}

/// One rate to set on one object, with the handle to set it through (or
/// why there is none).
type RateChange = (ObjectRef, f64, std::result::Result<Arc<dyn ObjectControl>, String>);

/// Joins and removes instances of a running [`Controller`] from another
/// thread (see [`Controller::handle`]); does not keep the loop running.
#[derive(Clone)]
pub struct ControllerHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ControllerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerHandle").finish_non_exhaustive()
    }
}

impl ControllerHandle {
    /// See [`Controller::join`].
    pub fn join(&self, config: InstanceConfig, handle: Arc<dyn StageHandle>) {
        self.shared.changes.lock().unwrap_or_else(|e| e.into_inner()).push(Change::Join(config, handle));
    }

    /// See [`Controller::leave`].
    pub fn leave(&self, name: &str) {
        self.shared.changes.lock().unwrap_or_else(|e| e.into_inner()).push(Change::Leave(name.to_owned()));
    }

    /// Cycles run so far.
    pub fn cycles(&self) -> u64 {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).cycles
    }
}

/// A running control loop. Stops (and joins its thread) when dropped.
pub struct Controller {
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").field("cycles", &self.cycles()).finish_non_exhaustive()
    }
}

impl Controller {
    /// Starts building.
    pub fn builder(config: ControllerConfig) -> ControllerBuilder {
        ControllerBuilder::new(config)
    }

    /// Cycles run so far.
    pub fn cycles(&self) -> u64 {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).cycles
    }

    /// Cycles in which the policy failed (its previous rates were kept).
    pub fn policy_errors(&self) -> u64 {
        self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()).policy_errors
    }

    /// The loop's Prometheus metrics, to register in a registry (see
    /// [`metrics`](crate::metrics)); they stay readable after the loop
    /// stopped.
    pub fn metrics(&self) -> ControllerMetrics {
        ControllerMetrics { stats: Arc::clone(&self.shared.stats) }
    }

    /// The decision log so far.
    pub fn log(&self) -> Vec<DecisionRecord> {
        self.shared.log.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }

    /// A handle other threads can join and remove instances through.
    pub fn handle(&self) -> ControllerHandle {
        ControllerHandle { shared: Arc::clone(&self.shared) }
    }

    /// An instance joins (fair-share policies start sharing with it at the
    /// next cycle).
    pub fn join(&self, config: InstanceConfig, handle: Arc<dyn StageHandle>) {
        self.shared.changes.lock().unwrap_or_else(|e| e.into_inner()).push(Change::Join(config, handle));
    }

    /// An instance leaves; its share is redistributed at the next cycle.
    pub fn leave(&self, name: &str) {
        self.shared.changes.lock().unwrap_or_else(|e| e.into_inner()).push(Change::Leave(name.to_owned()));
    }

    /// Runs the next cycle now instead of at its time (the schedule goes
    /// on from it): for a controller that just took over stages and should
    /// not leave them to their fallback for up to an interval more.
    pub fn cycle_now(&self) {
        self.shared.run_soon();
    }

    /// Stops the loop and returns the decision log. Rates stay as last set.
    pub fn stop(mut self) -> Vec<DecisionRecord> {
        self.shutdown();
        self.log()
    }

    fn shutdown(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A decision is applied only if every rate is a number or +inf
/// (unlimited): NaN or -inf is a policy bug, and applying it would fail
/// open (the rate would become unlimited).
fn check_rates(d: &Decision) -> std::result::Result<(), PolicyError> {
    match d.settings.iter().find(|s| s.rate.is_nan() || s.rate == f64::NEG_INFINITY) {
        Some(s) => Err(PolicyError::InvalidRate { instance: s.instance, object: s.object.clone(), rate: s.rate }),
        None => Ok(()),
    }
}

/// Rates of a request context in a record's inputs (0 when absent).
pub fn context_rate(inputs: &InstanceInputs, ctx: RequestContext) -> f64 {
    inputs.context_bps.iter().find(|(c, _)| c == ctx.name()).map_or(0.0, |(_, r)| *r)
}

/// Checks that a fair-share instance's channel and object exist on a stage
/// and that the object is a DRL (errors name `channel` or `object`).
pub fn check_binding(instance: &InstanceConfig, info: &StageInfo) -> Result<()> {
    let object = info
        .channels
        .iter()
        .find(|c| c.id == instance.channel)
        .ok_or_else(|| {
            Error::config("channel", format!("stage '{}' has no channel '{}'", info.name, instance.channel))
        })?
        .objects
        .iter()
        .find(|o| o.id == instance.object)
        .ok_or_else(|| {
            Error::config(
                "object",
                format!("channel '{}' of stage '{}' has no object '{}'", instance.channel, info.name, instance.object),
            )
        })?;
    if object.kind != kv_stage::object::ObjectKind::Drl {
        return Err(Error::config(
            "object",
            format!("'{}/{}' is a {}, not a drl", instance.channel, instance.object, object.kind),
        ));
    }
    Ok(())
}
