//! The batching object: i10's thresholds, for layers that can group requests.
//!
//! A `batch` object does not hold requests itself: a stage cannot carry out
//! a key-value write. It admits every request at once and hands the layer
//! that enforced it a [`BatchPlan`] (in [`Outcome::batch`]): the thresholds
//! at which to dispatch what it has collected. The async DB of `kv-async`
//! groups durable puts by it into one RocksDB write batch with one WAL sync;
//! a blocking caller, which cannot be grouped, carries its request out alone.
//!
//! The defaults are i10's: dispatch at 16 requests, 64 KiB, or 50 µs after
//! the first request of a batch; *adaptive*: when nothing is being written
//! and nothing else waits, dispatch at once instead of waiting for company.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{EnforcementObject, FieldError, ObjectChange, ObjectSpec, Outcome, Settings};
use crate::context::Context;
use crate::error::Rejection;
use crate::units::Amount;

const fn default_requests() -> u32 {
    16
}
fn default_bytes() -> Amount {
    Amount::new(64.0 * 1024.0).unwrap_or_else(|_| unreachable!())
}
const fn default_timeout() -> Duration {
    Duration::from_micros(50)
}
const fn yes() -> bool {
    true
}

/// Largest request threshold.
const MAX_REQUESTS: u32 = 65_536;
/// Longest timeout a batch may wait for company.
const MAX_TIMEOUT: Duration = Duration::from_secs(1);

/// Spec of a [`Batch`] object.
///
/// ```toml
/// kind = "batch"
/// requests = 16      # dispatch once this many are collected
/// bytes = "64KiB"    # ... or this many bytes
/// timeout = "50us"   # ... or this long after the first of the batch
/// adaptive = true    # a request that finds nothing in flight and nothing queued goes at once
/// ```
///
/// The thresholds trigger a dispatch; the batch dispatched holds what was
/// collected by then (under load, more than `requests`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Dispatch once this many requests are collected (1 to 65536).
    #[serde(default = "default_requests")]
    pub requests: u32,
    /// Dispatch once the collected requests reach this many bytes.
    #[serde(default = "default_bytes")]
    pub bytes: Amount,
    /// Dispatch this long after the first request of a batch arrived (at
    /// most 1 s).
    #[serde(default = "default_timeout", with = "crate::units::duration_str")]
    pub timeout: Duration,
    /// Dispatch at once when nothing is being written and nothing waits.
    #[serde(default = "yes")]
    pub adaptive: bool,
}

impl Default for BatchSpec {
    /// i10's defaults: 16 requests, 64 KiB, 50 µs, adaptive.
    fn default() -> Self {
        BatchSpec { requests: 16, bytes: default_bytes(), timeout: default_timeout(), adaptive: true }
    }
}

impl BatchSpec {
    /// Checks the spec (the field at fault is named).
    pub fn validate(&self) -> Result<(), FieldError> {
        check(Some(self.requests), Some(self.bytes), Some(self.timeout))
    }

    fn merged(&self, c: &BatchSettings) -> BatchSpec {
        BatchSpec {
            requests: c.requests.unwrap_or(self.requests),
            bytes: c.bytes.unwrap_or(self.bytes),
            timeout: c.timeout.unwrap_or(self.timeout),
            adaptive: c.adaptive.unwrap_or(self.adaptive),
        }
    }
}

fn check(requests: Option<u32>, bytes: Option<Amount>, timeout: Option<Duration>) -> Result<(), FieldError> {
    if let Some(n) = requests
        && !(1..=MAX_REQUESTS).contains(&n)
    {
        return Err(FieldError::new("requests", format!("must be 1 to {MAX_REQUESTS}, not {n}")));
    }
    if let Some(b) = bytes
        && b.get() < 1.0
    {
        return Err(FieldError::new("bytes", "must be at least 1 byte"));
    }
    if let Some(t) = timeout
        && t > MAX_TIMEOUT
    {
        return Err(FieldError::new("timeout", "must be at most 1s"));
    }
    Ok(())
}

/// What a configuration change can set on a batch object.
///
/// ```toml
/// set = { requests = 32, timeout = "100us" }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSettings {
    /// New request threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<u32>,
    /// New byte threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Amount>,
    /// New timeout.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::units::opt_duration_str")]
    pub timeout: Option<Duration>,
    /// Adaptive dispatch on or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<bool>,
}

impl Settings for BatchSettings {
    const FIELDS: &'static [&'static str] = &["requests", "bytes", "timeout", "adaptive"];
}

impl BatchSettings {
    /// Reads and checks a batch object's settings from a change.
    pub fn from_config(c: &ObjectChange) -> Result<Self, FieldError> {
        let s: BatchSettings = c.parse("batch")?;
        check(s.requests, s.bytes, s.timeout)?;
        Ok(s)
    }
}

/// The thresholds a layer groups a request by, as the [`Batch`] object it
/// reached had them when it was admitted.
///
/// Compact (it travels in every [`Outcome`]): the timeout is kept in
/// nanoseconds in a `u32` (it is at most 1 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPlan {
    /// Identifies the batch object (unique in the process): requests with
    /// the same id are grouped together.
    pub object: u32,
    /// Dispatch at this many requests.
    pub requests: u32,
    /// Dispatch at this many bytes.
    pub bytes: u64,
    /// Dispatch this many nanoseconds after the first request of a batch
    /// (see [`timeout`](Self::timeout)).
    pub timeout_ns: u32,
    /// Dispatch at once when nothing is in flight or queued.
    pub adaptive: bool,
}

impl BatchPlan {
    /// The timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(u64::from(self.timeout_ns))
    }
}

/// The batching object (see the module documentation): admits at once and
/// tells the layer how to group.
///
/// ```
/// use kv_stage::{Context, ObjectChange, RequestType, object::{Batch, BatchSpec, EnforcementObject}};
///
/// let b = Batch::new(BatchSpec::default()).unwrap();
/// let plan = b.enforce(&Context::new(RequestType::Put, 100)).unwrap().batch.unwrap();
/// assert_eq!((plan.requests, plan.bytes, plan.timeout().as_micros()), (16, 65536, 50));
/// b.configure(&ObjectChange::new().with("requests", 64));
/// assert_eq!(b.enforce(&Context::new(RequestType::Put, 100)).unwrap().batch.unwrap().requests, 64);
/// ```
pub struct Batch {
    id: u32,
    requests: AtomicU32,
    bytes: AtomicU64,
    timeout_ns: AtomicU32,
    adaptive: AtomicBool,
    spec: Mutex<BatchSpec>,
}

impl Batch {
    /// Builds a batch object from its spec.
    pub fn new(spec: BatchSpec) -> Result<Self, FieldError> {
        static NEXT_ID: AtomicU32 = AtomicU32::new(1);
        spec.validate()?;
        let b = Batch {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            requests: AtomicU32::new(0),
            bytes: AtomicU64::new(0),
            timeout_ns: AtomicU32::new(0),
            adaptive: AtomicBool::new(false),
            spec: Mutex::new(spec.clone()),
        };
        b.store(&spec);
        Ok(b)
    }

    fn store(&self, s: &BatchSpec) {
        self.requests.store(s.requests, Ordering::Relaxed);
        self.bytes.store(s.bytes.get().min(u64::MAX as f64) as u64, Ordering::Relaxed);
        // At most 1 s (validated): fits.
        self.timeout_ns.store(s.timeout.as_nanos().min(u128::from(u32::MAX)) as u32, Ordering::Relaxed);
        self.adaptive.store(s.adaptive, Ordering::Relaxed);
    }

    /// The current thresholds.
    #[inline]
    pub fn plan(&self) -> BatchPlan {
        BatchPlan {
            object: self.id,
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            timeout_ns: self.timeout_ns.load(Ordering::Relaxed),
            adaptive: self.adaptive.load(Ordering::Relaxed),
        }
    }
}

impl EnforcementObject for Batch {
    fn kind(&self) -> &'static str {
        "batch"
    }

    fn validate(&self, c: &ObjectChange) -> Result<(), FieldError> {
        BatchSettings::from_config(c).map(drop)
    }

    fn configure(&self, c: &ObjectChange) {
        // Validated before; a change that does not read is ignored rather
        // than half-applied.
        let Ok(c) = BatchSettings::from_config(c) else { return };
        let mut spec = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        let new = spec.merged(&c);
        self.store(&new);
        *spec = new;
    }

    #[inline]
    fn enforce(&self, _ctx: &Context) -> Result<Outcome, Rejection> {
        Ok(Outcome { waited: Duration::ZERO, batch: Some(self.plan()) })
    }

    fn spec(&self) -> Option<ObjectSpec> {
        Some(ObjectSpec::Batch(self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_i10s_and_bad_values_name_their_field() {
        let s: BatchSpec = toml::from_str("").unwrap();
        assert_eq!(s, BatchSpec::default());
        assert_eq!((s.requests, s.bytes.get(), s.timeout), (16, 65536.0, Duration::from_micros(50)));
        let s: BatchSpec = toml::from_str("bytes = \"1MiB\"\ntimeout = \"200us\"\nadaptive = false").unwrap();
        assert_eq!((s.bytes.get(), s.timeout, s.adaptive), (1048576.0, Duration::from_micros(200), false));
        let b = Batch::new(BatchSpec::default()).unwrap();
        for (field, value) in [
            ("requests", serde_json::json!(0)),
            ("requests", serde_json::json!(100_000)),
            ("bytes", serde_json::json!(0)),
            ("timeout", serde_json::json!("2s")),
        ] {
            let e = b.validate(&ObjectChange::new().with(field, value)).unwrap_err();
            assert_eq!(e.field, field);
        }
        let e = b.validate(&ObjectChange::new().with("rate", "1MiB/s")).unwrap_err();
        assert!(e.unsupported && e.field == "rate");
        // Nothing was applied by the refused changes.
        assert_eq!(b.plan().requests, 16);
    }

    #[test]
    fn a_change_keeps_the_fields_it_does_not_name_and_the_id() {
        let b = Batch::new(BatchSpec::default()).unwrap();
        let id = b.plan().object;
        b.configure(&ObjectChange::from_settings(&BatchSettings {
            timeout: Some(Duration::from_micros(10)),
            ..Default::default()
        }));
        let p = b.plan();
        assert_eq!((p.object, p.requests, p.bytes, p.timeout()), (id, 16, 65536, Duration::from_micros(10)));
        assert_ne!(Batch::new(BatchSpec::default()).unwrap().plan().object, id);
    }
}
