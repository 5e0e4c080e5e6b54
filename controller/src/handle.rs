//! The seam between the control loop and a stage: [`StageHandle`] (what
//! the loop asks of a stage each cycle), [`ObjectControl`] (re-configuring
//! one object), and [`HandleError`], the one error both return. A stage in
//! the controller's own process implements them here; `kv_remote` implements
//! them over gRPC; a test or an application may implement its own.

use std::sync::Arc;

use kv_stage::{
    Collection, ObjectChange, RuleSet, Stage,
    info::{ApplyReport, ObjectHandle, StageInfo},
};

use crate::policy::{ObjectRef, Pressure};

/// How the controller reaches a stage: in its own process ([`Stage`]
/// implements this), or over the network (`kv_remote::RemoteStage`).
///
/// Each cycle the loop calls [`begin_cycle`](Self::begin_cycle) on every
/// handle, then [`collect`](Self::collect) on each, decides, configures
/// objects with [`ObjectControl::configure_deferred`], and ends with
/// [`finish_cycle`](Self::finish_cycle) on every handle: a remote handle
/// sends its calls for all stages at once and waits for them together.
pub trait StageHandle: Send + Sync {
    /// Monotonic counters (see [`Stage::collect`]). An error (a stage that
    /// cannot be reached) leaves the instance out of this cycle.
    fn collect(&self) -> Result<Collection, HandleError>;
    /// Layout and identity (see [`Stage::stage_info`]). The loop asks again
    /// only when [`Collection::generation`] says the layout changed.
    fn stage_info(&self) -> Result<StageInfo, HandleError>;
    /// A cycle starts: a handle that can fetch its counters ahead (a
    /// remote one) starts now, so every stage is asked at once.
    fn begin_cycle(&self) {}
    /// The cycle's changes were all made: a handle that deferred them
    /// waits for them here and returns those that failed.
    fn finish_cycle(&self) -> Vec<(ObjectRef, HandleError)> {
        Vec::new()
    }
    /// Applies rules, all or nothing (see [`Stage::apply`]).
    fn apply(&self, rules: &RuleSet) -> Result<ApplyReport, HandleError>;
    /// A handle on one object, which the loop keeps (until the layout
    /// changes) and re-configures every cycle without a rules batch.
    fn object(&self, channel: &str, object: &str) -> Option<Arc<dyn ObjectControl>>;
    /// How hard the store behind the stage is pressed by background work
    /// it has not done yet (see [`Pressure`]), when the handle knows; a
    /// stage alone does not (it knows requests, not LSM trees), so the
    /// default is `None`. Policies that use it (SILK with
    /// [`crate::PressureConfig`]) fall back to plain SILK without it.
    fn pressure(&self) -> Option<Pressure> {
        None
    }
    /// Calls `wake` whenever a background job begins on the stage, until
    /// the returned guard is dropped (see [`Stage::watch_jobs`]); `None`
    /// when the handle cannot tell (the default, and a remote stage). The
    /// loop uses it to sleep between cycles while the policy says nothing
    /// needs watching ([`Policy::idle_interval`](crate::Policy::idle_interval)): a handle
    /// that cannot wake it is cycled at the normal interval.
    fn watch_jobs(&self, _wake: Arc<dyn Fn() + Send + Sync>) -> Option<Box<dyn Send>> {
        None
    }
}

/// Re-configuring one object of a stage (see [`StageHandle::object`]).
pub trait ObjectControl: Send + Sync {
    /// Checks a change without applying it.
    fn check(&self, set: &ObjectChange) -> Result<(), HandleError>;
    /// Applies a change (checking it first).
    fn configure(&self, set: &ObjectChange) -> Result<(), HandleError>;
    /// Applies a change, or starts to: a remote object sends it and its
    /// stage handle reports the outcome in [`StageHandle::finish_cycle`].
    /// By default the same as [`configure`](Self::configure).
    fn configure_deferred(&self, set: &ObjectChange) -> Result<(), HandleError> {
        self.configure(set)
    }
}

/// What a stage handle could not do: the one error of the seam. Its
/// message is the stage's (or the transport's) own, shown as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// The stage could not be reached, did not answer in time, or sent what
    /// could not be read: the instance sits out the cycle.
    #[error("{0}")]
    Unreachable(String),
    /// The stage (or the handle's own check, made as the stage would make
    /// it) refused the change or the rules: nothing of it was applied.
    #[error("{0}")]
    Refused(String),
}

impl HandleError {
    /// The stage's message.
    pub fn message(&self) -> &str {
        match self {
            HandleError::Unreachable(m) | HandleError::Refused(m) => m,
        }
    }
}

impl From<kv_stage::Error> for HandleError {
    /// A local stage's refusal.
    fn from(e: kv_stage::Error) -> Self {
        HandleError::Refused(e.to_string())
    }
}

impl ObjectControl for ObjectHandle {
    fn check(&self, set: &ObjectChange) -> Result<(), HandleError> {
        Ok(ObjectHandle::check(self, set)?)
    }
    fn configure(&self, set: &ObjectChange) -> Result<(), HandleError> {
        Ok(ObjectHandle::configure(self, set)?)
    }
}

impl StageHandle for Stage {
    fn collect(&self) -> Result<Collection, HandleError> {
        Ok(Stage::collect(self))
    }
    fn watch_jobs(&self, wake: Arc<dyn Fn() + Send + Sync>) -> Option<Box<dyn Send>> {
        let watch: kv_stage::JobWatch = Stage::watch_jobs(self, move || wake());
        Some(Box::new(watch))
    }
    fn stage_info(&self) -> Result<StageInfo, HandleError> {
        Ok(Stage::stage_info(self))
    }
    fn apply(&self, rules: &RuleSet) -> Result<ApplyReport, HandleError> {
        Ok(Stage::apply(self, rules)?)
    }
    fn object(&self, channel: &str, object: &str) -> Option<Arc<dyn ObjectControl>> {
        Stage::object(self, channel, object).map(|h| Arc::new(h) as Arc<dyn ObjectControl>)
    }
}

/// A stage handle that also reports the store's pressure, read from
/// `source` once per cycle: how an application that knows its store (a
/// RocksDB's L0 files, memtables, pending compaction bytes) feeds SILK with
/// pressure ([`crate::PressureConfig`]). Everything else goes to `inner`.
pub struct WithPressure {
    inner: Arc<dyn StageHandle>,
    source: Box<dyn Fn() -> Pressure + Send + Sync>,
}

impl WithPressure {
    /// `inner`, with its pressure from `source` (called on the controller's
    /// thread every cycle: keep it cheap, e.g. a value a sampler stores).
    pub fn new(inner: Arc<dyn StageHandle>, source: impl Fn() -> Pressure + Send + Sync + 'static) -> Self {
        WithPressure { inner, source: Box::new(source) }
    }
}

impl StageHandle for WithPressure {
    fn collect(&self) -> Result<Collection, HandleError> {
        self.inner.collect()
    }
    fn stage_info(&self) -> Result<StageInfo, HandleError> {
        self.inner.stage_info()
    }
    fn begin_cycle(&self) {
        self.inner.begin_cycle();
    }
    fn finish_cycle(&self) -> Vec<(ObjectRef, HandleError)> {
        self.inner.finish_cycle()
    }
    fn apply(&self, rules: &RuleSet) -> Result<ApplyReport, HandleError> {
        self.inner.apply(rules)
    }
    fn object(&self, channel: &str, object: &str) -> Option<Arc<dyn ObjectControl>> {
        self.inner.object(channel, object)
    }
    fn pressure(&self) -> Option<Pressure> {
        Some((self.source)())
    }
    fn watch_jobs(&self, wake: Arc<dyn Fn() + Send + Sync>) -> Option<Box<dyn Send>> {
        self.inner.watch_jobs(wake)
    }
}

/// What [`ControllerBuilder::instance`](crate::ControllerBuilder::instance) takes: an `Arc` of any
/// [`StageHandle`], or an `Arc<dyn StageHandle>` already.
pub trait IntoStageHandle {
    /// As the trait object the controller keeps.
    fn into_stage_handle(self) -> Arc<dyn StageHandle>;
}

impl<T: StageHandle + 'static> IntoStageHandle for Arc<T> {
    fn into_stage_handle(self) -> Arc<dyn StageHandle> {
        self
    }
}

impl IntoStageHandle for Arc<dyn StageHandle> {
    fn into_stage_handle(self) -> Arc<dyn StageHandle> {
        self
    }
}
