//! The dynamic rate limiter (DRL): one token bucket, bytes/s or ops/s.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bucket::Bucket;
use super::{EnforcementObject, FieldError, ObjectChange, ObjectSpec, ObjectStats, Outcome, Settings, burst_for};
use crate::context::{Context, InstanceId};
use crate::error::Rejection;
use crate::units::{Amount, Rate};

fn unlimited() -> Rate {
    Rate::UNLIMITED
}

/// Spec of a [`Drl`].
///
/// ```toml
/// kind = "drl"
/// rate = "64MiB/s"        # or "1000ops/s", "unlimited" (default), 0 = closed
/// burst = "1MiB"          # optional; default rate x refill_period
/// refill_period = "10ms"  # optional; sizes the default burst
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrlSpec {
    /// Tokens per second: bytes/s, or ops/s when the rate is written in ops.
    #[serde(default = "unlimited")]
    pub rate: Rate,
    /// Largest number of unused tokens the bucket keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Amount>,
    /// Period whose worth of tokens is the burst when `burst` is not given
    /// (default [`DEFAULT_REFILL_PERIOD`](super::DEFAULT_REFILL_PERIOD)).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::units::opt_duration_str")]
    pub refill_period: Option<Duration>,
}

impl DrlSpec {
    /// A DRL at `rate` with the default burst.
    pub fn new(rate: Rate) -> Self {
        DrlSpec { rate, burst: None, refill_period: None }
    }

    /// Checks the spec.
    pub fn validate(&self) -> Result<(), FieldError> {
        if self.burst.is_some() && self.refill_period.is_some() {
            return Err(FieldError::new("burst", "give either `burst` or `refill_period`, not both"));
        }
        check_period(self.refill_period)
    }

    fn burst_tokens(&self) -> f64 {
        burst_for(self.rate, self.burst, self.refill_period)
    }

    /// The spec after a configuration change (assumed valid).
    fn merged(&self, c: &DrlSettings) -> DrlSpec {
        let mut s = self.clone();
        if let Some(r) = c.rate {
            s.rate = r;
        }
        if let Some(b) = c.burst {
            s.burst = Some(b);
            s.refill_period = None;
        }
        if let Some(p) = c.refill_period {
            s.refill_period = Some(p);
            s.burst = None;
        }
        s
    }
}

/// What a configuration change can set on a DRL.
///
/// ```toml
/// set = { rate = "32MiB/s" }        # or "1000ops/s", "unlimited", 0 (closed)
/// set = { burst = "1MiB" }          # or refill_period = "10ms" (burst = rate x period)
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrlSettings {
    /// New rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// New burst in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Amount>,
    /// New refill period (sets burst = rate x period).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "crate::units::opt_duration_str")]
    pub refill_period: Option<Duration>,
}

impl Settings for DrlSettings {
    const FIELDS: &'static [&'static str] = &["rate", "burst", "refill_period"];
}

impl DrlSettings {
    /// Reads and checks a DRL's settings from a change.
    pub fn from_config(c: &ObjectChange) -> Result<Self, FieldError> {
        let s: DrlSettings = c.parse("DRL")?;
        if s.burst.is_some() && s.refill_period.is_some() {
            return Err(FieldError::new("burst", "give either `burst` or `refill_period`, not both"));
        }
        check_period(s.refill_period)?;
        Ok(s)
    }
}

/// The refill period bounds every token bucket of the crate keeps.
pub(super) fn check_period(p: Option<Duration>) -> Result<(), FieldError> {
    match p {
        Some(p) if p.is_zero() => Err(FieldError::new("refill_period", "must be greater than zero")),
        Some(p) if p > Duration::from_secs(3600) => Err(FieldError::new("refill_period", "must be at most 1h")),
        _ => Ok(()),
    }
}

/// A token-bucket rate limiter.
///
/// Requests are admitted in arrival order at the configured rate; a request
/// larger than the burst waits until its whole cost has accrued (never
/// deadlocks); a rate change applies at once, to waiting requests too; rate 0
/// holds every request until the rate changes or the stage shuts down.
pub struct Drl {
    bucket: Bucket,
    spec: Mutex<DrlSpec>,
}

impl Drl {
    /// Builds a DRL from its spec.
    pub fn new(spec: DrlSpec) -> Result<Self, FieldError> {
        spec.validate()?;
        let bucket = Bucket::new(spec.rate.per_sec(), spec.rate.unit(), spec.burst_tokens());
        Ok(Drl { bucket, spec: Mutex::new(spec) })
    }

    /// The current rate.
    pub fn rate(&self) -> Rate {
        self.spec.lock().unwrap_or_else(|e| e.into_inner()).rate
    }

    /// The current burst in tokens.
    pub fn burst(&self) -> f64 {
        self.bucket.config().2
    }
}

impl EnforcementObject for Drl {
    fn kind(&self) -> &'static str {
        "drl"
    }

    fn validate(&self, c: &ObjectChange) -> Result<(), FieldError> {
        DrlSettings::from_config(c).map(drop)
    }

    fn configure(&self, c: &ObjectChange) {
        // Validated before (a batch applies all or nothing); a change that
        // does not read is ignored rather than half-applied.
        let Ok(c) = DrlSettings::from_config(c) else { return };
        let mut spec = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        let new = spec.merged(&c);
        self.bucket.set(new.rate.per_sec(), new.rate.unit(), new.burst_tokens());
        *spec = new;
    }

    #[inline]
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        self.bucket.acquire(ctx.size, ctx.instance).map(Outcome::waited)
    }

    fn refund(&self, _ctx: &Context, unused: u64) {
        self.bucket.refund(unused);
    }

    fn charge(&self, _ctx: &Context, extra: u64) {
        self.bucket.charge(extra);
    }

    fn spec(&self) -> Option<ObjectSpec> {
        Some(ObjectSpec::Drl(self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone()))
    }

    fn stats(&self) -> ObjectStats {
        self.bucket.stats().into()
    }

    fn shutdown(&self) {
        self.bucket.shutdown();
    }

    fn retire(&self) {
        self.bucket.retire();
    }

    fn close_instance(&self, instance: InstanceId) {
        self.bucket.close_instance(instance);
    }

    fn open_instance(&self, instance: InstanceId) {
        self.bucket.open_instance(instance);
    }

    #[inline]
    fn poll_enforce(
        &self,
        ctx: &Context,
        wait: &mut super::AsyncWait,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Outcome, Rejection>> {
        self.bucket.poll_acquire(ctx.size, ctx.instance, &mut wait.bucket, cx).map(|r| r.map(Outcome::waited))
    }

    fn cancel_enforce(&self, ctx: &Context, wait: &mut super::AsyncWait) {
        self.bucket.cancel(ctx.size, &mut wait.bucket);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::RequestType;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn spec_from_toml() {
        let s: ObjectSpec = toml::from_str("kind = \"drl\"\nrate = \"64MiB/s\"\nburst = \"1MiB\"").unwrap();
        let ObjectSpec::Drl(d) = s else { panic!() };
        assert_eq!(d.rate.per_sec(), 64.0 * 1048576.0);
        assert_eq!(d.burst.unwrap().get(), 1048576.0);
        assert!(toml::from_str::<ObjectSpec>("kind = \"drl\"\nrat = 5").is_err());
        let d = DrlSpec {
            rate: Rate::UNLIMITED,
            burst: Some(Amount::new(1.0).unwrap()),
            refill_period: Some(Duration::from_millis(1)),
        };
        assert_eq!(d.validate().unwrap_err().field, "burst");
    }

    #[test]
    fn configure_merges_and_derives_burst() {
        let d = Drl::new(DrlSpec::new(Rate::from_bytes_per_sec(1000.0).unwrap())).unwrap();
        assert!((d.burst() - 10.0).abs() < 1e-9); // 1000 B/s x 10 ms
        d.configure(&ObjectChange::rate(Rate::from_bytes_per_sec(1e6).unwrap()));
        assert!((d.burst() - 10_000.0).abs() < 1e-6);
        let c = DrlSettings { refill_period: Some(Duration::from_secs(1)), ..Default::default() };
        d.configure(&c.into());
        assert!((d.burst() - 1e6).abs() < 1e-6);
        let bad = ObjectChange::new().with("rbps", Rate::UNLIMITED);
        let e = d.validate(&bad).unwrap_err();
        assert_eq!((e.field.as_str(), e.unsupported), ("rbps", true));
        let bad = ObjectChange::new().with("rate", "fast");
        let e = d.validate(&bad).unwrap_err();
        assert_eq!((e.field.as_str(), e.unsupported), ("rate", false));
        // The text form round-trips through a change.
        let c: ObjectChange = toml::from_str("rate = \"32MiB/s\"\nrefill_period = \"5ms\"").unwrap();
        let s = DrlSettings::from_config(&c).unwrap();
        assert_eq!(s.rate.unwrap().per_sec(), 32.0 * 1048576.0);
        assert_eq!(s.refill_period, Some(Duration::from_millis(5)));
    }

    #[test]
    fn ops_rate_paces_requests() {
        // 200 ops/s with a burst of 1: 20 requests take about 95 ms.
        let d = Drl::new(DrlSpec {
            rate: Rate::from_ops_per_sec(200.0).unwrap(),
            burst: Some(Amount::new(1.0).unwrap()),
            refill_period: None,
        })
        .unwrap();
        let ctx = Context::new(RequestType::Read, 0);
        let t = Instant::now();
        for _ in 0..20 {
            d.enforce(&ctx).unwrap();
        }
        // Lower bound only: the machine may be slow, never faster than the rate.
        assert!(t.elapsed() >= Duration::from_millis(94), "{:?}", t.elapsed());
    }

    #[test]
    fn large_request_is_not_starved_by_small_ones() {
        // 100 KB/s, burst 1 KB. A 20 KB request arrives first and needs 190 ms
        // more; small requests arriving 20 ms later must queue behind it, so
        // each of them waits at least until the large one's deadline.
        let d = Arc::new(
            Drl::new(DrlSpec {
                rate: Rate::from_bytes_per_sec(100_000.0).unwrap(),
                burst: Some(Amount::new(1000.0).unwrap()),
                refill_period: None,
            })
            .unwrap(),
        );
        let start = Instant::now();
        let big = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                d.enforce(&Context::new(RequestType::Write, 20_000)).unwrap();
                start.elapsed()
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        let smalls: Vec<_> = (0..4)
            .map(|_| {
                let d = Arc::clone(&d);
                std::thread::spawn(move || {
                    d.enforce(&Context::new(RequestType::Write, 100)).unwrap();
                    start.elapsed()
                })
            })
            .collect();
        assert!(big.join().unwrap() >= Duration::from_millis(189));
        for s in smalls {
            assert!(s.join().unwrap() >= Duration::from_millis(190));
        }
    }
}
