//! Enforcement objects: the mechanisms a channel applies to its requests.
//!
//! Every object implements [`EnforcementObject`]: built from a typed spec
//! (*init*), re-configured live (*configure*, validated first so a batch of
//! rules applies all or nothing), and *enforce*, which may block the caller
//! until the request is admitted. The built-in objects are
//!
//! * [`Noop`]: admits everything; the stage counts its ops and bytes;
//! * [`Drl`]: a dynamic rate limiter (token bucket) in bytes/s or ops/s;
//! * [`Qos`]: per-volume limits in the LINSTOR/cgroup style (`rbps`, `wbps`,
//!   `riops`, `wiops`), each optional, all changeable live;
//! * [`Batch`]: i10-style batching thresholds (requests, bytes, timeout) a
//!   layer that can batch (the async DB of `kv-async`) applies to the
//!   requests it admits.
//!
//! Requests are admitted either blocking ([`EnforcementObject::enforce`]) or
//! as a future ([`EnforcementObject::poll_enforce`], which
//! [`Stage::enforce_async`](crate::Stage::enforce_async) drives); the
//! built-in objects keep both in one FIFO line.
//!
//! Applications add their own by implementing the trait and handing an
//! instance to [`Stage::create_custom_object`](crate::Stage::create_custom_object).

mod batch;
mod bucket;
mod drl;
mod qos;

use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use batch::{Batch, BatchPlan, BatchSettings, BatchSpec};
pub use bucket::BucketStats;
use bucket::BucketWait;
pub use drl::{Drl, DrlSettings, DrlSpec};
pub use qos::{Qos, QosSpec};

use crate::context::{Context, InstanceId};
pub(crate) use crate::error::FieldError;
use crate::error::Rejection;
use crate::units::{Amount, Rate};

/// The refill period used to size a bucket's burst (`burst = rate x period`)
/// when a spec gives neither a burst nor a period.
pub const DEFAULT_REFILL_PERIOD: Duration = Duration::from_millis(10);

/// What happened to an admitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// How long the request waited to be admitted.
    pub waited: Duration,
    /// Set when the request reached a [`Batch`] object: the thresholds a
    /// layer that can batch should group it by. A layer that cannot batch
    /// carries the request out alone.
    pub batch: Option<BatchPlan>,
}

impl Outcome {
    /// Admitted without waiting.
    pub const IMMEDIATE: Outcome = Outcome { waited: Duration::ZERO, batch: None };

    /// Admitted after waiting `waited`.
    pub const fn waited(waited: Duration) -> Outcome {
        Outcome { waited, batch: None }
    }
}

/// Where a request admitted asynchronously stands in its object, kept by
/// the future between polls (see [`EnforcementObject::poll_enforce`]).
///
/// Opaque: the built-in objects keep their place in line here. An
/// application object that implements `poll_enforce` keeps its own state
/// elsewhere and may use [`AsyncWait::user`] as a key to it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AsyncWait {
    bucket: BucketWait,
    /// Time waited in the steps before the current one, in nanoseconds.
    waited_ns: u64,
    /// Free for an application object's own use: 0 at the first poll; while
    /// it is not 0 the request counts as waiting, and a future dropped then
    /// calls [`EnforcementObject::cancel_enforce`].
    pub user: u64,
}

impl AsyncWait {
    /// True while the request holds a place in an object's line (a future
    /// dropped now must call [`EnforcementObject::cancel_enforce`]).
    pub fn is_waiting(&self) -> bool {
        self.bucket.is_waiting() || self.user != 0
    }
}

/// Object-specific statistics, reported by `Stage::collect` next to the
/// stage's own ops and bytes counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ObjectStats {
    /// Requests that waited.
    pub waits: u64,
    /// Total time requests waited, in nanoseconds.
    pub wait_ns: u64,
    /// Requests waiting right now.
    pub waiting: u64,
    /// How long the requests that waited waited, in fixed buckets
    /// ([`WAIT_BUCKETS_SECONDS`]); their sum is `waits`.
    pub wait_histogram: WaitHistogram,
}

impl ObjectStats {
    /// The sum of both (an object of several buckets reports one).
    pub fn plus(mut self, o: &ObjectStats) -> ObjectStats {
        self.waits += o.waits;
        self.wait_ns += o.wait_ns;
        self.waiting += o.waiting;
        self.wait_histogram = self.wait_histogram.plus(&o.wait_histogram);
        self
    }
}

impl From<BucketStats> for ObjectStats {
    fn from(b: BucketStats) -> Self {
        ObjectStats { waits: b.waits, wait_ns: b.wait_ns, waiting: b.waiting, wait_histogram: b.wait_histogram }
    }
}

/// Upper bounds, in seconds, of the wait-time buckets every bucket-based
/// object counts its waits in (a last bucket takes longer waits): from
/// 100 µs, about a fast device's request, to 10 s.
pub const WAIT_BUCKETS_SECONDS: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 10.0];

/// Waits per bucket of [`WAIT_BUCKETS_SECONDS`] (not cumulative), the last
/// entry being waits longer than every bound. Counted only for requests that
/// waited, when they leave the line: a request admitted at once costs
/// nothing more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WaitHistogram(pub [u64; WAIT_BUCKETS_SECONDS.len() + 1]);

impl WaitHistogram {
    /// Counts one wait of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        let i = WAIT_BUCKETS_NS.iter().position(|&b| ns <= b).unwrap_or(WAIT_BUCKETS_SECONDS.len());
        self.0[i] += 1;
    }

    /// The sum of both.
    pub fn plus(mut self, o: &WaitHistogram) -> WaitHistogram {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a += b;
        }
        self
    }

    /// `(upper bound in seconds, waits in this bucket)`, not cumulative
    /// (the last bound is infinite).
    pub fn buckets(&self) -> [(f64, u64); WAIT_BUCKETS_SECONDS.len() + 1] {
        std::array::from_fn(|i| (WAIT_BUCKETS_SECONDS.get(i).copied().unwrap_or(f64::INFINITY), self.0[i]))
    }
}

const WAIT_BUCKETS_NS: [u64; WAIT_BUCKETS_SECONDS.len()] = [
    100_000,
    500_000,
    1_000_000,
    5_000_000,
    10_000_000,
    50_000_000,
    100_000_000,
    500_000_000,
    1_000_000_000,
    10_000_000_000,
];

/// A partial configuration change, as an enforcement rule carries it:
/// named settings, such as `{ rate = "32MiB/s" }`. Each object kind reads
/// its own: a DRL its [`DrlSettings`], a QoS object its [`QosSpec`] fields, an
/// application object whatever [`Settings`] it defines (with
/// [`ObjectChange::parse`]). A setting the object does not have is refused
/// by name.
///
/// A change made from typed settings ([`ObjectChange::from_settings`],
/// [`ObjectChange::rate`]) keeps them typed, so a control loop's changes
/// reach the object without being written out and read back.
#[derive(Debug, Clone, Default)]
pub struct ObjectChange(Repr);

#[derive(Debug, Clone)]
enum Repr {
    /// Named values, as read from a rules file or message.
    Fields(serde_json::Map<String, serde_json::Value>),
    /// Typed settings of some kind, and their field names.
    Typed(Arc<dyn TypedSettings>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::Fields(serde_json::Map::new())
    }
}

/// Typed settings behind a change, whatever their kind.
trait TypedSettings: std::fmt::Debug + Send + Sync {
    fn any(&self) -> &dyn std::any::Any;
    fn fields(&self) -> serde_json::Map<String, serde_json::Value>;
}

impl<S: Settings> TypedSettings for S {
    fn any(&self) -> &dyn std::any::Any {
        self
    }
    fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map.into_iter().filter(|(_, v)| !v.is_null()).collect(),
            _ => serde_json::Map::new(),
        }
    }
}

/// An object kind's typed settings, read from an [`ObjectChange`]: every
/// field optional (`#[serde(default)]`), named in [`FIELDS`](Self::FIELDS).
pub trait Settings: Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + Sync + 'static {
    /// The settings' names, for error messages and the unsupported check.
    const FIELDS: &'static [&'static str];
}

impl ObjectChange {
    /// No change yet.
    pub fn new() -> Self {
        ObjectChange::default()
    }

    /// A change of rate only (DRL).
    pub fn rate(rate: Rate) -> Self {
        Self::from_settings(&DrlSettings { rate: Some(rate), ..Default::default() })
    }

    /// The change typed settings describe (the fields they set).
    pub fn from_settings<S: Settings>(settings: &S) -> Self {
        ObjectChange(Repr::Typed(Arc::new(settings.clone())))
    }

    fn fields(&self) -> std::borrow::Cow<'_, serde_json::Map<String, serde_json::Value>> {
        match &self.0 {
            Repr::Fields(map) => std::borrow::Cow::Borrowed(map),
            Repr::Typed(t) => std::borrow::Cow::Owned(t.fields()),
        }
    }

    /// Adds (or replaces) one setting.
    pub fn with(self, field: &str, value: impl Serialize) -> Self {
        let mut map = self.fields().into_owned();
        if let Ok(v) = serde_json::to_value(value) {
            map.insert(field.to_owned(), v);
        }
        ObjectChange(Repr::Fields(map))
    }

    /// Names of the settings the change sets.
    pub fn set_fields(&self) -> Vec<String> {
        self.fields().keys().cloned().collect()
    }

    /// True when the change sets nothing.
    pub fn is_empty(&self) -> bool {
        self.fields().is_empty()
    }

    /// The change as `kind`'s typed settings. A setting `S` does not have is
    /// an [`unsupported`](FieldError::unsupported) error naming it; a bad
    /// value is an error naming its setting.
    pub fn parse<S: Settings>(&self, kind: &str) -> Result<S, FieldError> {
        if let Repr::Typed(t) = &self.0
            && let Some(s) = t.any().downcast_ref::<S>()
        {
            return Ok(s.clone());
        }
        let map = self.fields();
        if let Some(f) = map.keys().find(|k| !S::FIELDS.contains(&k.as_str())) {
            return Err(FieldError::unsupported(f.clone(), format!("not a {kind} setting ({})", S::FIELDS.join(", "))));
        }
        // Field by field first, so a bad value names its setting.
        for (k, v) in map.iter() {
            let one = serde_json::Map::from_iter([(k.clone(), v.clone())]);
            if let Err(e) = serde_json::from_value::<S>(serde_json::Value::Object(one)) {
                // A message that names its field already does not name it twice.
                let m = e.to_string();
                let m = m.strip_prefix(k.as_str()).and_then(|m| m.strip_prefix(": ")).unwrap_or(&m);
                return Err(FieldError::new(k.clone(), m));
            }
        }
        serde_json::from_value(serde_json::Value::Object(map.into_owned()))
            .map_err(|e| FieldError::new("set", e.to_string()))
    }
}

impl PartialEq for ObjectChange {
    /// The same settings, however they were made.
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Serialize for ObjectChange {
    fn serialize<Ser: serde::Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        self.fields().serialize(s)
    }
}

impl<'de> Deserialize<'de> for ObjectChange {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ObjectChange(Repr::Fields(serde_json::Map::deserialize(d)?)))
    }
}

impl<S: Settings> From<S> for ObjectChange {
    fn from(settings: S) -> Self {
        ObjectChange::from_settings(&settings)
    }
}

/// What kind an object is: a built-in, or an application's own, by the
/// name its [`EnforcementObject::kind`] gives. In files and statistics, the
/// name (`"noop"`, `"drl"`, `"qos"`, `"batch"`, or the custom name).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// [`Noop`].
    Noop,
    /// [`Drl`], or an application object that calls itself `"drl"` (and so
    /// takes a DRL's settings).
    Drl,
    /// [`Qos`], or an application object that calls itself `"qos"`.
    Qos,
    /// [`Batch`], or an application object that calls itself `"batch"`.
    Batch,
    /// Any other application object.
    Custom(String),
}

impl ObjectKind {
    /// The kind of the name an object gives.
    pub fn of(name: &str) -> Self {
        match name {
            "noop" => ObjectKind::Noop,
            "drl" => ObjectKind::Drl,
            "qos" => ObjectKind::Qos,
            "batch" => ObjectKind::Batch,
            other => ObjectKind::Custom(other.to_owned()),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        match self {
            ObjectKind::Noop => "noop",
            ObjectKind::Drl => "drl",
            ObjectKind::Qos => "qos",
            ObjectKind::Batch => "batch",
            ObjectKind::Custom(n) => n,
        }
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ObjectKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ObjectKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ObjectKind::of(&String::deserialize(d)?))
    }
}

/// The typed spec an object is built from (*init*).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ObjectSpec {
    /// Admit everything, count.
    Noop,
    /// Dynamic rate limiter.
    Drl(DrlSpec),
    /// Per-volume QoS limits.
    Qos(QosSpec),
    /// i10-style batching thresholds.
    Batch(BatchSpec),
}

impl ObjectSpec {
    /// The kind name.
    pub fn kind(&self) -> &'static str {
        match self {
            ObjectSpec::Noop => "noop",
            ObjectSpec::Drl(_) => "drl",
            ObjectSpec::Qos(_) => "qos",
            ObjectSpec::Batch(_) => "batch",
        }
    }

    /// Checks the spec (the field at fault is named).
    pub fn validate(&self) -> Result<(), FieldError> {
        match self {
            ObjectSpec::Noop => Ok(()),
            ObjectSpec::Drl(s) => s.validate(),
            ObjectSpec::Qos(s) => s.validate(),
            ObjectSpec::Batch(s) => s.validate(),
        }
    }

    /// Builds the object.
    pub fn build(&self) -> Result<Object, FieldError> {
        self.validate()?;
        Ok(match self {
            ObjectSpec::Noop => Object::Noop(Noop),
            ObjectSpec::Drl(s) => Object::Drl(Drl::new(s.clone())?),
            ObjectSpec::Qos(s) => Object::Qos(Qos::new(s.clone())?),
            ObjectSpec::Batch(s) => Object::Batch(Batch::new(s.clone())?),
        })
    }
}

/// The interface every enforcement object implements.
///
/// `enforce` runs on the data path of every request that reaches the object:
/// it must not allocate, must not sleep while holding a lock, and must return
/// (with [`Rejection::ShutDown`]) once `shutdown` has been called.
pub trait EnforcementObject: Send + Sync + 'static {
    /// Short kind name for layouts and logs (`"noop"`, `"drl"`, ...).
    fn kind(&self) -> &'static str;

    /// Checks a configuration change without applying it.
    fn validate(&self, config: &ObjectChange) -> Result<(), FieldError>;

    /// Applies a configuration change that [`validate`](Self::validate)
    /// accepted. Must not fail.
    fn configure(&self, config: &ObjectChange);

    /// Enforces one request, blocking until it is admitted.
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection>;

    /// Enforces one request without blocking: `Ready` once it is admitted
    /// (or refused), `Pending` with `cx`'s waker registered to be woken
    /// when it may be. `wait` is the request's state between polls (default
    /// at the first); a future dropped while
    /// [`wait.is_waiting()`](AsyncWait::is_waiting) calls
    /// [`cancel_enforce`](Self::cancel_enforce).
    ///
    /// The default calls the blocking [`enforce`](Self::enforce): right for
    /// objects that never wait, and a stall of the polling thread for those
    /// that do. The built-in objects wait asynchronously, in the same FIFO
    /// line as blocking callers.
    fn poll_enforce(
        &self,
        ctx: &Context,
        wait: &mut AsyncWait,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<Outcome, Rejection>> {
        let _ = (wait, cx);
        Poll::Ready(self.enforce(ctx))
    }

    /// A request whose future was dropped while waiting gives its place
    /// back: no tokens are charged for it, and those behind it move up.
    fn cancel_enforce(&self, ctx: &Context, wait: &mut AsyncWait) {
        let _ = (ctx, wait);
    }

    /// The current configuration as a spec (`None` for objects that have no
    /// serializable spec).
    fn spec(&self) -> Option<ObjectSpec> {
        None
    }

    /// An admitted request used `unused` bytes fewer than `ctx.size` (a
    /// short read or write): an object that charged them may give them
    /// back. The default keeps the charge.
    fn refund(&self, ctx: &Context, unused: u64) {
        let _ = (ctx, unused);
    }

    /// An admitted request moved `extra` bytes more than `ctx.size` (a
    /// key-value read, whose size is known once it returns): an object that
    /// charges bytes takes them now, without waiting, and the requests after
    /// it wait for them. The default does not charge them.
    fn charge(&self, ctx: &Context, extra: u64) {
        let _ = (ctx, extra);
    }

    /// Object-specific statistics.
    fn stats(&self) -> ObjectStats {
        ObjectStats::default()
    }

    /// Fails every waiting and future request with [`Rejection::ShutDown`].
    fn shutdown(&self) {}

    /// The object was removed from its stage: requests already inside it
    /// must be released (admitted), not stranded.
    fn retire(&self) {}

    /// `instance` is closing (a DB shutting down): its requests waiting in
    /// the object must be admitted now, and its later ones without waiting,
    /// until [`open_instance`](Self::open_instance). An object that can hold
    /// requests must implement this, or a closing DB may wait on it.
    fn close_instance(&self, _instance: InstanceId) {}

    /// `instance` is open again: its requests are subject to the object.
    fn open_instance(&self, _instance: InstanceId) {}
}

/// Admits every request; the stage counts its ops and bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Noop;

impl EnforcementObject for Noop {
    fn kind(&self) -> &'static str {
        "noop"
    }
    fn validate(&self, config: &ObjectChange) -> Result<(), FieldError> {
        match config.set_fields().first() {
            Some(f) => Err(FieldError::unsupported(f.clone(), "a noop object has no settings")),
            None => Ok(()),
        }
    }
    fn configure(&self, _config: &ObjectChange) {}
    #[inline]
    fn enforce(&self, _ctx: &Context) -> Result<Outcome, Rejection> {
        Ok(Outcome::IMMEDIATE)
    }
    fn spec(&self) -> Option<ObjectSpec> {
        Some(ObjectSpec::Noop)
    }
}

/// An enforcement object: the built-in kinds dispatched without a virtual
/// call, or an application's own behind the trait.
#[allow(
    clippy::large_enum_variant,
    reason = "objects live behind an Arc; boxing the DRL would add an indirection on the enforce path"
)]
pub enum Object {
    /// See [`Noop`].
    Noop(Noop),
    /// See [`Drl`].
    Drl(Drl),
    /// See [`Qos`].
    Qos(Qos),
    /// See [`Batch`].
    Batch(Batch),
    /// An application-defined object.
    Custom(Arc<dyn EnforcementObject>),
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Object({})", self.kind())
    }
}

macro_rules! dispatch {
    ($self:expr, $o:ident => $e:expr) => {
        match $self {
            Object::Noop($o) => $e,
            Object::Drl($o) => $e,
            Object::Qos($o) => $e,
            Object::Batch($o) => $e,
            Object::Custom($o) => $e,
        }
    };
}

impl EnforcementObject for Object {
    fn kind(&self) -> &'static str {
        dispatch!(self, o => o.kind())
    }
    fn validate(&self, config: &ObjectChange) -> Result<(), FieldError> {
        dispatch!(self, o => o.validate(config))
    }
    fn configure(&self, config: &ObjectChange) {
        dispatch!(self, o => o.configure(config))
    }
    #[inline]
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        match self {
            Object::Noop(_) => Ok(Outcome::IMMEDIATE),
            Object::Drl(o) => o.enforce(ctx),
            Object::Qos(o) => o.enforce(ctx),
            Object::Batch(o) => o.enforce(ctx),
            Object::Custom(o) => o.enforce(ctx),
        }
    }
    #[inline(always)]
    fn poll_enforce(
        &self,
        ctx: &Context,
        wait: &mut AsyncWait,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Result<Outcome, Rejection>> {
        match self {
            Object::Noop(_) => Poll::Ready(Ok(Outcome::IMMEDIATE)),
            Object::Drl(o) => o.poll_enforce(ctx, wait, cx),
            Object::Qos(o) => o.poll_enforce(ctx, wait, cx),
            Object::Batch(o) => Poll::Ready(o.enforce(ctx)),
            Object::Custom(o) => o.poll_enforce(ctx, wait, cx),
        }
    }
    fn cancel_enforce(&self, ctx: &Context, wait: &mut AsyncWait) {
        match self {
            Object::Drl(o) => o.cancel_enforce(ctx, wait),
            Object::Qos(o) => o.cancel_enforce(ctx, wait),
            Object::Custom(o) => o.cancel_enforce(ctx, wait),
            Object::Noop(_) | Object::Batch(_) => {}
        }
    }
    fn spec(&self) -> Option<ObjectSpec> {
        dispatch!(self, o => o.spec())
    }
    fn refund(&self, ctx: &Context, unused: u64) {
        dispatch!(self, o => o.refund(ctx, unused))
    }
    fn charge(&self, ctx: &Context, extra: u64) {
        dispatch!(self, o => o.charge(ctx, extra))
    }
    fn stats(&self) -> ObjectStats {
        dispatch!(self, o => o.stats())
    }
    fn shutdown(&self) {
        dispatch!(self, o => o.shutdown())
    }
    fn retire(&self) {
        dispatch!(self, o => o.retire())
    }
    fn close_instance(&self, instance: InstanceId) {
        dispatch!(self, o => o.close_instance(instance))
    }
    fn open_instance(&self, instance: InstanceId) {
        dispatch!(self, o => o.open_instance(instance))
    }
}

/// Effective burst for a rate: explicit, or `rate x period`.
pub(crate) fn burst_for(rate: Rate, burst: Option<Amount>, period: Option<Duration>) -> f64 {
    if let Some(b) = burst {
        return b.get();
    }
    if rate.is_unlimited() {
        return 0.0;
    }
    rate.per_sec() * period.unwrap_or(DEFAULT_REFILL_PERIOD).as_secs_f64()
}
