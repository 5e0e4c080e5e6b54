//! Per-volume QoS limits after the LINSTOR / cgroup v2 `io.max` model: four
//! independent limits, `rbps`, `wbps`, `riops`, `wiops`; an unset limit is
//! unlimited. Unlike a cgroup limit, each one changes live.
//!
//! Reads are `read`, `get`, `scan` and `multi_get` requests; writes are
//! `write`, `sync`, `put`, `write_batch`, `merge` and `delete`. Other requests
//! (open, close, rename, metadata) pass. A request waits for its bandwidth
//! limit, then for its IOPS limit.

use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::bucket::Bucket;
use super::drl::check_period;
use super::{EnforcementObject, FieldError, ObjectChange, ObjectSpec, ObjectStats, Outcome, Settings, burst_for};
use crate::context::{Context, InstanceId};
use crate::error::Rejection;
use crate::iomax::{DeviceNumber, IoMax, IoMaxLine, Limit};
use crate::units::{Rate, RateUnit};

/// Spec of a [`Qos`] object.
///
/// Limits are written as in the kernel's `io.max` (`limits`), or one key
/// per field; `max` (or `"unlimited"`) is no limit, and a key not given is
/// no limit too:
///
/// ```toml
/// kind = "qos"
/// limits = "rbps=8MiB wbps=4194304 riops=200 wiops=max"
/// # the same, one field per key:
/// # rbps = "8Mi"; wbps = "4MiB/s"; riops = 200; wiops = "max"
/// refill_period = "10ms"  # burst of each limit: this period's worth (default 10 ms)
/// ```
///
/// A spec is shown (serialized) in `io.max` form, with the keys it sets:
/// `limits = "rbps=8388608 wbps=4194304 riops=200 wiops=max"`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "QosSpecFields", into = "QosSpecShown")]
pub struct QosSpec {
    /// The four limits. A key not given has no limit; in a change, a key
    /// not given keeps its limit and `max` lifts it.
    pub limits: IoMax,
    /// Burst of each limit, as a period's worth of its rate (default 10 ms).
    pub refill_period: Option<Duration>,
}

/// The fields a QoS spec or change may be written with.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QosSpecFields {
    #[serde(default, alias = "io_max")]
    limits: Option<String>,
    #[serde(default, deserialize_with = "crate::units::opt_per_second")]
    rbps: Option<Rate>,
    #[serde(default, deserialize_with = "crate::units::opt_per_second")]
    wbps: Option<Rate>,
    #[serde(default, deserialize_with = "crate::units::opt_per_second")]
    riops: Option<Rate>,
    #[serde(default, deserialize_with = "crate::units::opt_per_second")]
    wiops: Option<Rate>,
    #[serde(default, with = "crate::units::opt_duration_str")]
    refill_period: Option<Duration>,
}

/// A limit written as a rate: `max` when unlimited; a bandwidth in bytes
/// (an IOPS limit is a count whatever unit it is written in); at least 1
/// per second, rounded to a whole number as the kernel takes it.
fn limit_of(key: &str, r: Rate, bandwidth: bool) -> Result<Limit, String> {
    if r.is_unlimited() {
        return Ok(Limit::Max);
    }
    if bandwidth && r.unit() == RateUnit::Ops {
        return Err(format!("{key}: is a bandwidth limit; give bytes per second such as \"8Mi\""));
    }
    if r.per_sec() < 1.0 {
        return Err(format!("{key}: {} is below 1/s; a limit is at least 1 per second, or \"max\"", r.per_sec()));
    }
    Ok(Limit::PerSec(r.per_sec().round() as u64))
}

impl TryFrom<QosSpecFields> for QosSpec {
    type Error = String;
    fn try_from(f: QosSpecFields) -> Result<Self, String> {
        let mut limits = match &f.limits {
            Some(line) => IoMax::parse(line).map_err(|e| format!("limits: {e}"))?,
            None => IoMax::UNLIMITED,
        };
        for (key, slot, given, bandwidth) in [
            ("rbps", &mut limits.rbps, f.rbps, true),
            ("wbps", &mut limits.wbps, f.wbps, true),
            ("riops", &mut limits.riops, f.riops, false),
            ("wiops", &mut limits.wiops, f.wiops, false),
        ] {
            let Some(r) = given else { continue };
            if slot.is_some() {
                return Err(format!("{key}: given both in `limits` and as its own field"));
            }
            *slot = Some(limit_of(key, r, bandwidth)?);
        }
        Ok(QosSpec { limits, refill_period: f.refill_period })
    }
}

/// How a QoS spec is shown: its keys in `io.max` syntax.
#[derive(Serialize)]
struct QosSpecShown {
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", with = "crate::units::opt_duration_str")]
    refill_period: Option<Duration>,
}

impl From<QosSpec> for QosSpecShown {
    fn from(s: QosSpec) -> Self {
        let limits = (s.limits != IoMax::UNLIMITED).then(|| s.limits.given().to_string());
        QosSpecShown { limits, refill_period: s.refill_period }
    }
}

impl QosSpec {
    /// A spec with every key set from a volume's limits (a key not given:
    /// `max`), so that it shows all four.
    pub fn from_io_max(limits: IoMax) -> QosSpec {
        QosSpec { limits: limits.every_key(), refill_period: None }
    }

    /// A change setting exactly the keys an `io.max` line sets (the others
    /// keep their limit, as in the kernel).
    pub fn from_line(line: &IoMaxLine) -> QosSpec {
        QosSpec { limits: line.limits, refill_period: None }
    }

    /// The limits in effect: `None` for a key with no limit (not given, or
    /// `max`).
    pub fn io_max(&self) -> IoMax {
        self.limits.in_effect()
    }

    /// Checks the spec: each limit at least 1 per second, or `max` (a spec
    /// built in code can say `Limit::PerSec(0)`; a parsed one cannot), and
    /// the refill period.
    pub fn validate(&self) -> Result<(), FieldError> {
        for (key, l) in self.limits.entries() {
            if l == Some(Limit::PerSec(0)) {
                return Err(FieldError::new(key, "0 is below 1/s; a limit is at least 1 per second, or \"max\""));
            }
        }
        check_period(self.refill_period)
    }

    /// The cgroup v2 `io.max` line for a device, e.g.
    /// `8:0 rbps=8388608 wbps=max riops=200 wiops=max`.
    pub fn io_max_line(&self, device: DeviceNumber) -> String {
        format!("{device} {}", self.io_max())
    }

    fn merged(&self, c: &QosSpec) -> QosSpec {
        QosSpec {
            limits: self.limits.then(c.limits).in_effect(),
            refill_period: c.refill_period.or(self.refill_period),
        }
    }
}

/// A configuration change of a QoS object has the spec's own fields: an
/// `io.max` line (`set = { limits = "wbps=8MiB riops=max" }`), or any of the
/// four limits as fields (`set = { wbps = "4Mi", riops = 200 }`), and the
/// refill period. As when writing to the kernel's `io.max`, a key the change
/// leaves out keeps its limit, and `max` removes one.
impl Settings for QosSpec {
    const FIELDS: &'static [&'static str] = &["limits", "io_max", "rbps", "wbps", "riops", "wiops", "refill_period"];
}

/// The rates of the four buckets, in the kernel's order (no limit where a
/// key has none).
fn rates(l: &IoMax) -> [Rate; 4] {
    // Every key given (`max` where there is no limit): each has its rate.
    l.every_key().rates().map(|(_, r)| r.unwrap_or(Rate::UNLIMITED))
}

fn bucket_for(r: Rate, period: Option<Duration>) -> Bucket {
    Bucket::new(r.per_sec(), r.unit(), burst_for(r, None, period))
}

/// Four independent limits on read/write bandwidth and IOPS.
pub struct Qos {
    rbps: Bucket,
    wbps: Bucket,
    riops: Bucket,
    wiops: Bucket,
    spec: Mutex<QosSpec>,
}

impl Qos {
    /// Builds the object from its spec.
    pub fn new(spec: QosSpec) -> Result<Self, FieldError> {
        spec.validate()?;
        let [rbps, wbps, riops, wiops] = rates(&spec.limits);
        let period = spec.refill_period;
        Ok(Qos {
            rbps: bucket_for(rbps, period),
            wbps: bucket_for(wbps, period),
            riops: bucket_for(riops, period),
            wiops: bucket_for(wiops, period),
            spec: Mutex::new(spec),
        })
    }

    fn apply(&self, s: &QosSpec) {
        for (b, r) in self.buckets().into_iter().zip(rates(&s.limits)) {
            b.set(r.per_sec(), r.unit(), burst_for(r, None, s.refill_period));
        }
    }

    fn buckets(&self) -> [&Bucket; 4] {
        [&self.rbps, &self.wbps, &self.riops, &self.wiops]
    }

    /// The bandwidth and ops buckets a request is charged to, `None` for
    /// requests that are neither reads nor writes.
    fn buckets_for(&self, ctx: &Context) -> Option<(&Bucket, &Bucket)> {
        if ctx.request_type.is_read() {
            Some((&self.rbps, &self.riops))
        } else if ctx.request_type.is_write() {
            Some((&self.wbps, &self.wiops))
        } else {
            None
        }
    }
}

impl EnforcementObject for Qos {
    fn kind(&self) -> &'static str {
        "qos"
    }

    fn validate(&self, c: &ObjectChange) -> Result<(), FieldError> {
        let c: QosSpec = c.parse("QoS")?;
        let current = self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone();
        current.merged(&c).validate()
    }

    fn configure(&self, c: &ObjectChange) {
        // Validated before; a change that does not read is ignored rather
        // than half-applied.
        let Ok(c) = c.parse::<QosSpec>("QoS") else { return };
        let mut spec = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        let new = spec.merged(&c);
        self.apply(&new);
        *spec = new;
    }

    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        let Some((bw, ops)) = self.buckets_for(ctx) else { return Ok(Outcome::IMMEDIATE) };
        let a = bw.acquire(ctx.size, ctx.instance)?;
        let b = ops.acquire(ctx.size, ctx.instance)?;
        Ok(Outcome::waited(a + b))
    }

    /// Bandwidth bucket first (step 0), then the ops bucket (step 1), as
    /// the blocking path does.
    fn poll_enforce(
        &self,
        ctx: &Context,
        w: &mut super::AsyncWait,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Outcome, Rejection>> {
        use std::task::Poll;
        let Some((bw, ops)) = self.buckets_for(ctx) else { return Poll::Ready(Ok(Outcome::IMMEDIATE)) };
        if w.bucket.step == 0 {
            match bw.poll_acquire(ctx.size, ctx.instance, &mut w.bucket, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(d)) => {
                    w.waited_ns = d.as_nanos() as u64;
                    w.bucket.step = 1;
                }
            }
        }
        ops.poll_acquire(ctx.size, ctx.instance, &mut w.bucket, cx)
            .map(|r| r.map(|d| Outcome::waited(Duration::from_nanos(w.waited_ns) + d)))
    }

    /// Bytes come back to the bandwidth bucket; the operation stays
    /// charged to the IOPS bucket.
    fn refund(&self, ctx: &Context, unused: u64) {
        if let Some((bw, _)) = self.buckets_for(ctx) {
            bw.refund(unused);
        }
    }

    /// Bytes go to the direction's bandwidth bucket (the operation was
    /// charged when it was admitted).
    fn charge(&self, ctx: &Context, extra: u64) {
        if let Some((bw, _)) = self.buckets_for(ctx) {
            bw.charge(extra);
        }
    }

    /// Dropped while waiting: its place is given back, and when it waits at
    /// the IOPS step, the bandwidth it was already admitted for comes back
    /// too (a cancelled request is not charged at all).
    fn cancel_enforce(&self, ctx: &Context, w: &mut super::AsyncWait) {
        if let Some((bw, ops)) = self.buckets_for(ctx) {
            if w.bucket.step == 0 {
                bw.cancel(ctx.size, &mut w.bucket);
            } else {
                let waiting = w.bucket.is_waiting();
                ops.cancel(ctx.size, &mut w.bucket);
                if waiting {
                    bw.refund(ctx.size);
                }
            }
        }
    }

    /// Every key, `max` where there is no limit, as the kernel shows `io.max`.
    fn spec(&self) -> Option<ObjectSpec> {
        let s = self.spec.lock().unwrap_or_else(|e| e.into_inner());
        Some(ObjectSpec::Qos(QosSpec { refill_period: s.refill_period, ..QosSpec::from_io_max(s.io_max()) }))
    }

    fn stats(&self) -> ObjectStats {
        self.buckets().iter().fold(ObjectStats::default(), |acc, b| acc.plus(&b.stats().into()))
    }

    fn shutdown(&self) {
        self.buckets().iter().for_each(|b| b.shutdown());
    }

    fn retire(&self) {
        self.buckets().iter().for_each(|b| b.retire());
    }

    fn close_instance(&self, instance: InstanceId) {
        self.buckets().iter().for_each(|b| b.close_instance(instance));
    }

    fn open_instance(&self, instance: InstanceId) {
        self.buckets().iter().for_each(|b| b.open_instance(instance));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::RequestType;
    use std::time::Instant;

    #[test]
    fn a_read_cancelled_at_its_iops_step_gives_its_bandwidth_back() {
        // A second's burst: 100 KiB of bandwidth, 1 operation.
        let q = Qos::new(QosSpec {
            limits: "rbps=100KiB riops=1".parse().unwrap(),
            refill_period: Some(Duration::from_secs(1)),
        })
        .unwrap();
        // The one operation of the burst.
        q.enforce(&Context::new(RequestType::Read, 1)).unwrap();
        // 50 KiB: admitted by the bandwidth bucket at once, then waits
        // for an operation; dropped there.
        let ctx = Context::new(RequestType::Read, 50 << 10);
        let mut w = crate::objects::AsyncWait::default();
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        assert!(q.poll_enforce(&ctx, &mut w, &mut cx).is_pending());
        assert!(w.is_waiting());
        q.cancel_enforce(&ctx, &mut w);
        assert!(!w.is_waiting());
        assert_eq!(q.rbps.stats().admitted_tokens, 1.0, "the cancelled read's bytes stayed charged");
        assert_eq!(q.riops.stats().waiting, 0);
    }

    #[test]
    fn linstor_style_spec() {
        let s: ObjectSpec =
            toml::from_str("kind = \"qos\"\nrbps = \"8Mi\"\nwbps = \"4Mi\"\nriops = 200\nwiops = 100").unwrap();
        let ObjectSpec::Qos(q) = s else { panic!() };
        assert_eq!(q.io_max_line(DeviceNumber::new(8, 0)), "8:0 rbps=8388608 wbps=4194304 riops=200 wiops=100");
        let partial = QosSpec { limits: IoMax { wbps: q.limits.wbps, ..IoMax::UNLIMITED }, ..Default::default() };
        assert_eq!(partial.io_max_line(DeviceNumber::new(253, 1)), "253:1 rbps=max wbps=4194304 riops=max wiops=max");
        let e = toml::from_str::<ObjectSpec>("kind = \"qos\"\nrbps = \"100ops/s\"").unwrap_err();
        assert!(e.to_string().contains("is a bandwidth limit"), "{e}");
    }

    #[test]
    fn write_iops_limit_applies_to_writes_only_and_changes_live() {
        let q =
            Qos::new(QosSpec { limits: "wiops=100".parse().unwrap(), refill_period: Some(Duration::from_millis(10)) })
                .unwrap();
        // Reads are not limited: they never wait.
        for _ in 0..1000 {
            assert_eq!(q.enforce(&Context::new(RequestType::Read, 4096)).unwrap(), Outcome::IMMEDIATE);
        }
        // 100 writes/s with a burst of 1: 11 writes take at least 100 ms.
        let t = Instant::now();
        for _ in 0..11 {
            q.enforce(&Context::new(RequestType::Write, 4096)).unwrap();
        }
        assert!(t.elapsed() >= Duration::from_millis(99), "{:?}", t.elapsed());
        // Lift the limit live.
        q.configure(&QosSpec { limits: "wiops=max".parse().unwrap(), ..Default::default() }.into());
        let Some(ObjectSpec::Qos(shown)) = q.spec() else { panic!() };
        assert_eq!(shown.io_max(), IoMax::UNLIMITED);
        assert_eq!(
            toml::to_string(&ObjectSpec::Qos(shown)).unwrap(),
            "kind = \"qos\"\nlimits = \"rbps=max wbps=max riops=max wiops=max\"\nrefill_period = \"10ms\"\n"
        );
    }
}
