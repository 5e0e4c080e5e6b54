//! The default controller for RocksDB: unlimited while the store is
//! healthy, SILK's priorities only while the device is contended, and
//! flushes and L0 compactions promoted as a write stall nears.
//!
//! Each cycle, per instance (a stage with the RocksDB layout):
//!
//! 1. **Healthy: no limit.** Unless the device is contended, every
//!    background DRL is unlimited: the store runs as plain RocksDB would,
//!    and a flush or compaction finishes as fast as the device lets it
//!    (stretching it under a limit makes more client requests meet it).
//! 2. **Contended: SILK's shares.** The device counts as contended while the
//!    clients are busy (foreground requests per second at least
//!    `busy_foreground_ops`) *and* the store's traffic (every context) is at
//!    least `busy_share` of the device budget `D`, and for `hold` after the
//!    last cycle that was. Then background work gets what clients leave,
//!    `left = max(D - Fg, min_B)`, flushes and L0->L1 compactions first
//!    (they split `left` when they run), deeper compactions `min_B` while
//!    they do and `left` when they do not: Algorithm 1.
//! 3. **A stall nears: promotion.** At a store pressure (L0 files toward the
//!    slowdown trigger, full memtables, pending compaction bytes; see
//!    [`Pressure`](super::Pressure)) of `promote_at` or more, flushes and
//!    L0 compactions are unlimited even while the device is contended, as
//!    RocksDB raises their I/O priority once its write controller delays
//!    writes: a stall costs clients more than the interference.
//! 4. **Debt is paid when clients leave.** Deep compactions are held back
//!    only while the device is contended; once it is not, they are
//!    unlimited again, so the backlog is paid in the next quiet moment.

use kv_stage::RequestContext as C;
use serde::Serialize;
use serde_json::json;

use super::{Decision, InstanceKey, InstanceView, ObjectRef, Observation, Policy, PolicyError, Setting};
use crate::config::AdaptiveConfig;

/// What the policy did for an instance in a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdaptiveMode {
    /// Not contended: every background DRL unlimited.
    Healthy,
    /// Contended: SILK's shares of what clients leave.
    Contended,
    /// Contended, and a stall nears: flushes and L0 compactions unlimited,
    /// deeper compactions at `min_B`.
    Promoted,
    /// Not contended but pressed: as healthy (every DRL unlimited).
    Draining,
}

/// The inputs and outputs of one decision for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AdaptiveInputs {
    /// Foreground bandwidth, bytes/s.
    pub fg_bps: f64,
    /// Foreground requests per second.
    pub fg_ops: f64,
    /// Every context's bandwidth together, bytes/s.
    pub total_bps: f64,
    /// The store's pressure level (0 when its handle does not report one).
    pub pressure: f64,
    /// This cycle counted as busy.
    pub busy: bool,
    /// What the policy did.
    pub mode: AdaptiveMode,
    /// `max(D - Fg, min_B)`.
    pub left_bps: f64,
    /// Flush rate set (`INFINITY`: unlimited).
    pub b_flush: f64,
    /// L0 rate set.
    pub b_l0: f64,
    /// LN rate set (before splitting across LN objects).
    pub b_ln: f64,
}

#[derive(Debug, Default, Clone)]
struct InstanceState {
    /// Seconds since the controller started, of the last busy cycle.
    last_busy_s: Option<f64>,
}

/// The default controller's policy (see the module documentation).
#[derive(Debug, Clone)]
pub struct Adaptive {
    config: AdaptiveConfig,
    state: Vec<(InstanceKey, InstanceState)>,
}

/// The DRLs that requests of `ctx` reach.
fn drls_for(info: &kv_stage::StageInfo, ctx: C) -> Vec<ObjectRef> {
    info.objects_for_context(ctx)
        .into_iter()
        .filter(|(c, o)| info.object(c, o).is_some_and(|x| x.kind == kv_stage::ObjectKind::Drl))
        .map(|(c, o)| ObjectRef::new(c, o))
        .collect()
}

impl Adaptive {
    /// The policy with validated parameters.
    pub fn new(config: &AdaptiveConfig) -> Self {
        Adaptive { config: config.clone(), state: Vec::new() }
    }

    /// One instance's decision from its inputs: `busy_now` is whether this
    /// cycle counts as busy, `since_busy` the seconds since the last busy
    /// cycle (this one included: 0 when busy), `jobs` whether flushes and
    /// L0 compactions run.
    pub fn compute(
        &self,
        fg_bps: f64,
        fg_ops: f64,
        total_bps: f64,
        pressure: f64,
        since_busy: Option<f64>,
        flush_active: bool,
        l0_active: bool,
    ) -> AdaptiveInputs {
        let c = &self.config;
        let d = c.device_bandwidth.bytes_per_sec();
        let min = c.min_bandwidth.bytes_per_sec();
        let busy = self.is_busy(fg_ops, total_bps);
        let contended = busy || since_busy.is_some_and(|s| s < c.hold.as_secs_f64());
        let left = (d - fg_bps).max(min);
        let inf = f64::INFINITY;
        let promote = pressure >= c.promote_at;
        let (mode, b_flush, b_l0, b_ln) = if !contended {
            (if promote { AdaptiveMode::Draining } else { AdaptiveMode::Healthy }, inf, inf, inf)
        } else if promote {
            (AdaptiveMode::Promoted, inf, inf, min)
        } else {
            let (f, l) = match (flush_active, l0_active) {
                (true, true) => (left / 2.0, left / 2.0),
                (true, false) => (left, min),
                (false, true) => (min, left),
                (false, false) => (min, min),
            };
            let ln = if flush_active || l0_active { min } else { left };
            (AdaptiveMode::Contended, f, l, ln)
        };
        AdaptiveInputs { fg_bps, fg_ops, total_bps, pressure, busy, mode, left_bps: left, b_flush, b_l0, b_ln }
    }

    /// Whether a cycle with these rates counts as busy.
    pub fn is_busy(&self, fg_ops: f64, total_bps: f64) -> bool {
        let c = &self.config;
        fg_ops >= c.busy_foreground_ops && total_bps >= c.busy_share * c.device_bandwidth.bytes_per_sec()
    }

    fn state(&mut self, key: InstanceKey) -> &mut InstanceState {
        if let Some(i) = self.state.iter().position(|(k, _)| *k == key) {
            return &mut self.state[i].1;
        }
        self.state.push((key, InstanceState::default()));
        &mut self.state.last_mut().expect("pushed").1
    }

    fn decide_one(&mut self, v: &InstanceView, now_s: f64, settings: &mut Vec<Setting>) -> serde_json::Value {
        let fg = v.rates.context(C::FOREGROUND);
        let total: f64 = v.rates.contexts.iter().map(|(_, r)| r.bytes_per_sec).sum();
        let pressure = v.pressure.map_or(0.0, |p| p.level);
        let busy = self.is_busy(fg.ops_per_sec, total);
        let st = self.state(v.key);
        if busy {
            st.last_busy_s = Some(now_s);
        }
        let since_busy = st.last_busy_s.map(|t| (now_s - t).max(0.0));
        let flush = drls_for(&v.info, C::BG_FLUSH);
        let l0 = drls_for(&v.info, C::BG_COMPACTION_L0_L1);
        let ln = drls_for(&v.info, C::BG_COMPACTION_LN);
        let x = self.compute(
            fg.bytes_per_sec,
            fg.ops_per_sec,
            total,
            pressure,
            since_busy,
            v.job_active(C::BG_FLUSH),
            v.job_active(C::BG_COMPACTION_L0_L1),
        );
        let hysteresis = self.config.min_bandwidth.bytes_per_sec() / 4.0;
        let mut push = |object: &ObjectRef, rate: f64| {
            let same = v.current_rate(&object.channel, &object.object).is_some_and(|cur| {
                (cur.is_infinite() && rate.is_infinite()) || (cur.is_finite() && (cur - rate).abs() < hysteresis)
            });
            if !same && !settings.iter().any(|s: &Setting| s.instance == v.key && s.object == *object) {
                settings.push(Setting { instance: v.key, object: object.clone(), rate });
            }
        };
        for d in &flush {
            push(d, x.b_flush);
        }
        for d in &l0 {
            push(d, x.b_l0);
        }
        let n_ln = ln.len().max(1) as f64;
        for d in &ln {
            push(d, x.b_ln / n_ln);
        }
        json!({
            "instance": v.name,
            "fg_bps": x.fg_bps,
            "fg_ops": x.fg_ops,
            "total_bps": x.total_bps,
            "pressure": v.pressure,
            "busy": x.busy,
            "since_busy_s": since_busy,
            "mode": x.mode,
            "left_bps": x.left_bps,
            "b_flush_bps": rate_note(x.b_flush),
            "b_l0_bps": rate_note(x.b_l0),
            "b_ln_bps": rate_note(x.b_ln),
            "running": {
                "flush": v.jobs(C::BG_FLUSH).running,
                "l0": v.jobs(C::BG_COMPACTION_L0_L1).running,
                "ln": v.jobs(C::BG_COMPACTION_LN).running,
            },
        })
    }
}

/// A rate for the decision log: a number, or `"unlimited"`.
fn rate_note(r: f64) -> serde_json::Value {
    if r.is_finite() { json!(r) } else { json!("unlimited") }
}

impl Policy for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        let now_s = obs.elapsed.as_secs_f64();
        let mut settings = Vec::new();
        let mut notes = Vec::new();
        for v in &obs.instances {
            notes.push(self.decide_one(v, now_s, &mut settings));
        }
        Ok(Decision { settings, notes: serde_json::Value::Array(notes) })
    }

    fn instance_left(&mut self, _name: &str) {
        // Keys are never reused; a left instance's state is small and goes
        // with the policy.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    fn policy() -> Adaptive {
        Adaptive::new(&AdaptiveConfig {
            device_bandwidth: kv_stage::Bandwidth::new(56.0 * MIB).unwrap(),
            min_bandwidth: kv_stage::Bandwidth::new(4.0 * MIB).unwrap(),
            ..AdaptiveConfig::default()
        })
    }

    /// A healthy store: clients light, the device far from its budget, no
    /// pressure: nothing is limited, whatever runs.
    #[test]
    fn healthy_store_sets_no_limit() {
        let p = policy();
        for (flush, l0) in [(false, false), (true, false), (false, true), (true, true)] {
            // Light clients, even with heavy background traffic.
            let x = p.compute(1.0 * MIB, 500.0, 60.0 * MIB, 0.1, None, flush, l0);
            assert_eq!(x.mode, AdaptiveMode::Healthy);
            assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite() && x.b_ln.is_infinite(), "{x:?}");
            // Busy clients, the device far below its budget.
            let x = p.compute(8.0 * MIB, 5000.0, 20.0 * MIB, 0.1, None, flush, l0);
            assert_eq!(x.mode, AdaptiveMode::Healthy, "{x:?}");
        }
    }

    /// Busy clients and a busy device: SILK's shares of what clients leave,
    /// for `hold` after the last busy cycle.
    #[test]
    fn contention_gives_silks_shares_and_holds() {
        let p = policy();
        let x = p.compute(16.0 * MIB, 5000.0, 56.0 * MIB, 0.1, Some(0.0), true, false);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert_eq!((x.b_flush / MIB, x.b_l0 / MIB, x.b_ln / MIB), (40.0, 4.0, 4.0));
        let x = p.compute(16.0 * MIB, 5000.0, 56.0 * MIB, 0.1, Some(0.0), true, true);
        assert_eq!((x.b_flush / MIB, x.b_l0 / MIB, x.b_ln / MIB), (20.0, 20.0, 4.0));
        let x = p.compute(16.0 * MIB, 5000.0, 56.0 * MIB, 0.1, Some(0.0), false, false);
        assert_eq!((x.b_flush / MIB, x.b_l0 / MIB, x.b_ln / MIB), (4.0, 4.0, 40.0));
        // A quiet cycle within `hold` of the last busy one stays contended ...
        let hold = AdaptiveConfig::default().hold.as_secs_f64();
        let x = p.compute(16.0 * MIB, 5000.0, 10.0 * MIB, 0.1, Some(hold / 2.0), false, false);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        // ... and one past it is healthy again.
        let x = p.compute(16.0 * MIB, 5000.0, 10.0 * MIB, 0.1, Some(hold * 2.0), false, false);
        assert_eq!(x.mode, AdaptiveMode::Healthy);
    }

    /// A stall precursor: flushes and L0 compactions get the device even
    /// while it is contended; deep compactions wait at the floor.
    #[test]
    fn stall_precursor_promotes_flush_and_l0() {
        let p = policy();
        let at = AdaptiveConfig::default().promote_at;
        let x = p.compute(16.0 * MIB, 5000.0, 56.0 * MIB, at, Some(0.0), true, true);
        assert_eq!(x.mode, AdaptiveMode::Promoted);
        assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite());
        assert_eq!(x.b_ln / MIB, 4.0);
        // Pressed but not contended: everything unlimited, the debt drains.
        let x = p.compute(1.0 * MIB, 100.0, 56.0 * MIB, at * 2.0, None, false, false);
        assert_eq!(x.mode, AdaptiveMode::Draining);
        assert!(x.b_ln.is_infinite());
    }
}
