//! Prometheus metrics of a control loop.
//!
//! The loop counts once per cycle (never on a stage's enforce path) into
//! [`CycleStats`]; [`ControllerMetrics`] is a [`Collector`] that reads them at
//! scrape time. Register it with [`Controller::metrics`](crate::Controller::metrics):
//!
//! ```
//! # use std::sync::Arc;
//! use controller::{Controller, ControllerConfig, SilkConfig};
//! use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, Stage, units::Rate};
//! use prometheus_client::registry::Registry;
//!
//! let stage = Arc::new(Stage::new("db"));
//! stage.apply_rules([
//!     Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
//!     Rule::CreateObject {
//!         channel: "flush".into(),
//!         object: "drl".into(),
//!         spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
//!         matches: None,
//!     },
//! ]).unwrap();
//! let c = Controller::builder(ControllerConfig::silk(SilkConfig::default())).instance("db", stage).start().unwrap();
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(c.metrics()));
//! let text = kv_stage::metrics::encode_text(&registry);
//! assert!(text.contains("# TYPE kvsds_controller_cycles_total counter"));
//! ```
//!
//! Every metric is listed in `docs/monitoring.md`.

use std::sync::{Arc, Mutex};

use kv_stage::metrics::{counter, family, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

/// Upper bounds, in seconds, of the cycle-duration buckets.
pub const CYCLE_BUCKETS_SECONDS: [f64; 9] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0];

/// What the loop counted since it started (read by [`ControllerMetrics`]).
#[derive(Debug, Clone, Default)]
pub struct CycleStats {
    /// The policy's name.
    pub policy: &'static str,
    /// Cycles run.
    pub cycles: u64,
    /// Cycles whose policy failed (its previous rates were kept).
    pub policy_errors: u64,
    /// Cycle durations per bucket of [`CYCLE_BUCKETS_SECONDS`] (not
    /// cumulative; the last entry is longer than every bound).
    pub cycle_buckets: [u64; CYCLE_BUCKETS_SECONDS.len() + 1],
    /// Sum of the cycle durations, seconds.
    pub cycle_seconds: f64,
    /// `((instance, branch), cycles)`: the branch the policy took for an
    /// instance (SILK's `flush_and_l0`, ..., the default controller's
    /// `healthy`, `contended`, ...).
    pub branches: Vec<((String, &'static str), u64)>,
    /// Rates set and applied.
    pub settings_applied: u64,
    /// Rates the stage refused or could not be reached for.
    pub settings_failed: u64,
    /// `(instance, cycles)`: cycles the instance could not be read in (its
    /// stage unreachable: a remote agent down, a stage shut down).
    pub unreachable: Vec<(String, u64)>,
    /// `((instance, channel, object), bytes/s)`: the rate set last, per
    /// object (infinite while unlimited).
    pub rates: Vec<((String, String, String), f64)>,
    /// Instances bound now.
    pub instances: usize,
}

impl CycleStats {
    pub(crate) fn record_cycle(&mut self, seconds: f64) {
        self.cycles += 1;
        self.cycle_seconds += seconds;
        let i = CYCLE_BUCKETS_SECONDS.iter().position(|&b| seconds <= b).unwrap_or(CYCLE_BUCKETS_SECONDS.len());
        self.cycle_buckets[i] += 1;
    }

    pub(crate) fn record_branch(&mut self, instance: &str, branch: &'static str) {
        match self.branches.iter_mut().find(|((i, b), _)| i == instance && *b == branch) {
            Some(e) => e.1 += 1,
            None => self.branches.push(((instance.to_owned(), branch), 1)),
        }
    }

    pub(crate) fn record_unreachable(&mut self, instance: &str) {
        match self.unreachable.iter_mut().find(|(i, _)| i == instance) {
            Some(e) => e.1 += 1,
            None => self.unreachable.push((instance.to_owned(), 1)),
        }
    }

    pub(crate) fn record_rate(&mut self, instance: &str, channel: &str, object: &str, rate: f64) {
        match self.rates.iter_mut().find(|((i, c, o), _)| i == instance && c == channel && o == object) {
            Some(e) => e.1 = rate,
            None => self.rates.push(((instance.to_owned(), channel.to_owned(), object.to_owned()), rate)),
        }
    }

    /// An instance left: its rates are no longer the controller's.
    pub(crate) fn forget_instance(&mut self, instance: &str) {
        self.rates.retain(|((i, _, _), _)| i != instance);
    }
}

/// A control loop's metrics, read at scrape time (see the module
/// documentation). Cheap to clone; stays readable after the loop stopped.
#[derive(Clone)]
pub struct ControllerMetrics {
    pub(crate) stats: Arc<Mutex<CycleStats>>,
}

impl std::fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerMetrics").finish_non_exhaustive()
    }
}

impl ControllerMetrics {
    /// A copy of what the loop counted.
    pub fn snapshot(&self) -> CycleStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Collector for ControllerMetrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.snapshot();
        let policy = || ("policy", s.policy.to_owned());
        family(&mut e, "kvsds_controller_cycles", "Control cycles run.", MetricType::Counter, |m| {
            counter(m, &[policy()], s.cycles)
        })?;
        family(
            &mut e,
            "kvsds_controller_policy_errors",
            "Cycles whose policy failed or panicked (the previous rates were kept).",
            MetricType::Counter,
            |m| counter(m, &[policy()], s.policy_errors),
        )?;
        family(
            &mut e,
            "kvsds_controller_cycle_duration_seconds",
            "Time a control cycle took: collect, decide, apply.",
            MetricType::Histogram,
            |m| {
                let buckets: Vec<(f64, u64)> = s
                    .cycle_buckets
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| (CYCLE_BUCKETS_SECONDS.get(i).copied().unwrap_or(f64::INFINITY), n))
                    .collect();
                m.encode_family(&[policy()])?.encode_histogram::<NoLabelSet>(s.cycle_seconds, s.cycles, &buckets, None)
            },
        )?;
        family(
            &mut e,
            "kvsds_controller_decisions",
            "Decisions per instance and policy branch.",
            MetricType::Counter,
            |m| {
                for ((instance, branch), n) in &s.branches {
                    counter(m, &[policy(), ("kv_instance", instance.clone()), ("branch", (*branch).to_owned())], *n)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_controller_settings",
            "Rates the controller set, by result (applied, failed: refused by the stage or not delivered).",
            MetricType::Counter,
            |m| {
                counter(m, &[policy(), ("result", "applied".to_owned())], s.settings_applied)?;
                counter(m, &[policy(), ("result", "failed".to_owned())], s.settings_failed)
            },
        )?;
        family(
            &mut e,
            "kvsds_controller_unreachable",
            "Cycles an instance's stage could not be read in (left out of the cycle).",
            MetricType::Counter,
            |m| {
                for (instance, n) in &s.unreachable {
                    counter(m, &[policy(), ("kv_instance", instance.clone())], *n)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_controller_rate_bytes_per_second",
            "The rate the controller set last on an object (absent while unlimited).",
            MetricType::Gauge,
            |m| {
                for ((instance, channel, object), rate) in s.rates.iter().filter(|(_, r)| r.is_finite()) {
                    gauge(
                        m,
                        &[
                            policy(),
                            ("kv_instance", instance.clone()),
                            ("channel", channel.clone()),
                            ("object", object.clone()),
                        ],
                        *rate,
                    )?;
                }
                Ok(())
            },
        )?;
        family(&mut e, "kvsds_controller_instances", "Instances bound to the controller.", MetricType::Gauge, |m| {
            gauge(m, &[policy()], s.instances as f64)
        })?;
        Ok(())
    }
}
