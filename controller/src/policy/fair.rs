//! Per-instance bandwidth shares of one device (Paio Algorithm 2 and the
//! baselines it is compared with).
//!
//! Every instance has a *demand* (the rate it asks for) and a DRL that
//! enforces its rate. Each cycle the policy sees, per instance, the rate it
//! used and the limit it had, and sets new limits:
//!
//! * **max-min** (Algorithm 2, work-conserving): demands are met up to the
//!   fair share (water-filling: an instance asking less than its share gets
//!   what it asks, the rest split what is left), then what is still left goes,
//!   again max-min, to instances that can use more than their demand. An
//!   instance that used under 97% of its limit, and under 97% of the
//!   largest share of its limit any instance used, is taken to want only
//!   what it used; it gets that plus 10%
//!   headroom (not reserved), and once it uses its whole limit again it is
//!   taken to want more.
//! * **proportional**: demands are met (scaled down in proportion when they
//!   exceed the device), then the leftover goes to instances that can use
//!   more, in proportion to their demands.
//! * **static** (the paper's "blkio" baseline): every instance is limited to
//!   its demand; nothing is redistributed.
//!
//! Limits never go below a floor (1% of the device), so an idle instance can
//! start again and no DRL is ever closed.

use serde::Serialize;
use serde_json::json;

use super::params::InstanceConfig;
use super::{Decision, ObjectRef, Observation, Policy, PolicyError, Setting};

/// Which fair-share variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FairShareMode {
    /// Max-min fair share, work-conserving.
    MaxMin,
    /// Demands first, leftover in proportion to demand.
    Proportional,
    /// Each at its demand, never redistributed.
    Static,
}

/// One instance's input to an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FlowInput {
    /// The rate it asks for (`INFINITY` for "all it can get").
    pub demand: f64,
    /// The rate it used in the last interval.
    pub usage: f64,
    /// The limit it had (`None` before the first decision).
    pub limit: Option<f64>,
}

/// Share of the capacity below which no limit goes.
const FLOOR: f64 = 0.01;
/// An instance is saturated when it used at least this share of its own
/// limit, or of the highest usage-to-limit ratio among the instances. The
/// relative test is for when the device itself is the bottleneck, and every
/// instance gets less than its limit in the same proportion; the absolute
/// one is so that a neighbour going over its limit for a cycle (a burst, or
/// the milliseconds before a new limit reached it) cannot make an instance
/// that used its whole limit look idle.
const SATURATED: f64 = 0.97;
/// Headroom given (not reserved) above an unsaturated instance's usage.
/// `1 / (1 + HEADROOM)` must stay below `SATURATED`, or an instance using
/// its whole headroom would flip between the two states.
const HEADROOM: f64 = 0.1;

/// Max-min allocation of `capacity` to `wants` (water-filling): an
/// instance wanting less than the current fair level gets its want, the
/// others split the rest. Wants may be infinite.
pub fn water_fill(capacity: f64, wants: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..wants.len()).collect();
    order.sort_by(|&a, &b| wants[a].total_cmp(&wants[b]));
    let mut out = vec![0.0; wants.len()];
    let mut remaining = capacity.max(0.0);
    let mut left = wants.len();
    for i in order {
        let level = remaining / left as f64;
        let give = wants[i].max(0.0).min(level);
        out[i] = give;
        remaining -= give;
        left -= 1;
    }
    out
}

/// Splits `capacity` in proportion to `weights`, capped by `wants`,
/// redistributing what capped instances cannot take.
fn proportional_fill(capacity: f64, wants: &[f64], weights: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; wants.len()];
    let mut remaining = capacity.max(0.0);
    let mut open: Vec<usize> = (0..wants.len()).filter(|&i| wants[i] > 0.0).collect();
    while remaining > 1e-9 && !open.is_empty() {
        let total_w: f64 = open.iter().map(|&i| weights[i].max(1e-12)).sum();
        let mut next = Vec::new();
        let mut given = 0.0;
        for &i in &open {
            let share = remaining * weights[i].max(1e-12) / total_w;
            let room = wants[i] - out[i];
            let g = share.min(room);
            out[i] += g;
            given += g;
            if room > share {
                next.push(i);
            }
        }
        remaining -= given;
        if next.len() == open.len() {
            break; // nobody was capped: everything was handed out
        }
        open = next;
    }
    out
}

/// A fair-share policy over a set of instances.
#[derive(Debug, Clone)]
pub struct FairShare {
    mode: FairShareMode,
    capacity: f64,
    instances: Vec<InstanceConfig>,
}

impl FairShare {
    /// A policy for `capacity` bytes/s shared by `instances` (validated
    /// configuration; instance `i` is the controller's instance `i`).
    pub fn new(mode: FairShareMode, capacity: f64, instances: Vec<InstanceConfig>) -> Self {
        FairShare { mode, capacity, instances }
    }

    /// The variant.
    pub fn mode(&self) -> FairShareMode {
        self.mode
    }

    /// What each instance is taken to want: everything when it is
    /// saturated (or new), else what it used.
    fn wants(inputs: &[FlowInput]) -> Vec<(f64, bool)> {
        let ratio = |f: &FlowInput| f.limit.filter(|l| *l > 0.0).map(|l| f.usage / l);
        let top = inputs.iter().filter_map(ratio).fold(0.0f64, f64::max);
        inputs
            .iter()
            .map(|f| match ratio(f) {
                // When nobody used anything, everyone keeps a full share so
                // whoever starts first is not held back.
                Some(r) if top > 0.0 && r < SATURATED * top && r < SATURATED => (f.usage, false),
                _ => (f64::INFINITY, true),
            })
            .collect()
    }

    /// New limits for `inputs` (one per active instance), in bytes/s.
    pub fn allocate(&self, inputs: &[FlowInput]) -> Vec<f64> {
        let n = inputs.len();
        if n == 0 {
            return Vec::new();
        }
        let cap = self.capacity;
        let floor = cap * FLOOR;
        let demand = |f: &FlowInput| if f.demand.is_finite() { f.demand } else { cap };
        let alloc: Vec<f64> = match self.mode {
            FairShareMode::Static => inputs.iter().map(demand).collect(),
            FairShareMode::MaxMin | FairShareMode::Proportional => {
                let wants = Self::wants(inputs);
                // Pass 1: demands (capped by what the instance wants).
                let first_wants: Vec<f64> = inputs.iter().zip(&wants).map(|(f, w)| w.0.min(demand(f))).collect();
                let first = if self.mode == FairShareMode::MaxMin {
                    water_fill(cap, &first_wants)
                } else {
                    let weights: Vec<f64> = inputs.iter().map(demand).collect();
                    proportional_fill(cap, &first_wants, &weights)
                };
                // Pass 2: the leftover to instances that want more.
                let used: f64 = first.iter().sum();
                let more: Vec<f64> = wants.iter().zip(&first).map(|(w, a)| (w.0 - a).max(0.0)).collect();
                let second = if self.mode == FairShareMode::MaxMin {
                    water_fill(cap - used, &more)
                } else {
                    let weights: Vec<f64> = inputs.iter().map(demand).collect();
                    proportional_fill(cap - used, &more, &weights)
                };
                first
                    .iter()
                    .zip(&second)
                    .zip(&wants)
                    .map(|((a, b), w)| if w.1 { a + b } else { (a + b) * (1.0 + HEADROOM) })
                    .collect()
            }
        };
        alloc.into_iter().map(|r: f64| r.max(floor)).collect()
    }
}

impl Policy for FairShare {
    fn name(&self) -> &'static str {
        match self.mode {
            FairShareMode::MaxMin => "max_min",
            FairShareMode::Proportional => "proportional",
            FairShareMode::Static => "static",
        }
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        // Instances are matched to the configured ones by name.
        let by_name: std::collections::HashMap<&str, &InstanceConfig> =
            self.instances.iter().map(|c| (c.name.as_str(), c)).collect();
        let mut active = Vec::new();
        for v in &obs.instances {
            let Some(&cfg) = by_name.get(v.name.as_str()) else { continue };
            let usage = v.rates.object(&cfg.channel, &cfg.object).bytes_per_sec;
            let limit = v.current_rate(&cfg.channel, &cfg.object);
            active.push((v.key, cfg, FlowInput { demand: cfg.demand.per_sec(), usage, limit }));
        }
        let inputs: Vec<FlowInput> = active.iter().map(|a| a.2).collect();
        let rates = self.allocate(&inputs);
        let mut settings = Vec::new();
        let mut notes = Vec::new();
        for ((i, cfg, input), rate) in active.iter().zip(rates) {
            settings.push(Setting { instance: *i, object: ObjectRef::new(&cfg.channel, &cfg.object), rate });
            notes.push(json!({
                "instance": cfg.name,
                "demand_bps": input.demand,
                "usage_bps": input.usage,
                "previous_limit_bps": input.limit,
                "limit_bps": rate,
            }));
        }
        // The notes move in (`json!` would serialize the vector again).
        let mut top = serde_json::Map::new();
        top.insert("capacity_bps".into(), json!(self.capacity));
        top.insert("instances".into(), serde_json::Value::Array(notes));
        let branch = match self.mode {
            FairShareMode::MaxMin => "max_min",
            FairShareMode::Proportional => "proportional",
            FairShareMode::Static => "static",
        };
        let branches = active.iter().map(|a| (a.0, branch)).collect();
        Ok(Decision { settings, notes: serde_json::Value::Object(top), branches })
    }

    fn instance_joined(&mut self, config: &InstanceConfig) {
        self.instances.retain(|c| c.name != config.name);
        self.instances.push(config.clone());
    }

    fn instance_left(&mut self, name: &str) {
        self.instances.retain(|c| c.name != name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_gives_small_wants_in_full_and_splits_the_rest() {
        assert_eq!(water_fill(100.0, &[10.0, 50.0, 50.0]), vec![10.0, 45.0, 45.0]);
        assert_eq!(water_fill(100.0, &[f64::INFINITY; 4]), vec![25.0; 4]);
        assert_eq!(water_fill(100.0, &[10.0, 20.0]), vec![10.0, 20.0]);
        assert!(water_fill(100.0, &[]).is_empty());
    }

    fn saturated(demands: &[f64]) -> Vec<FlowInput> {
        demands.iter().map(|&d| FlowInput { demand: d, usage: 0.0, limit: None }).collect()
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6)
    }

    /// The paper's scenarios: four instances with demands below and above
    /// the fair share; one leaves; one joins.
    #[test]
    fn max_min_scenarios() {
        let p = FairShare::new(FairShareMode::MaxMin, 1000.0, Vec::new());
        // Fair share 250: the two asking less get their demand, the two
        // asking more split what is left.
        assert!(close(&p.allocate(&saturated(&[100.0, 200.0, 400.0, 400.0])), &[100.0, 200.0, 350.0, 350.0]));
        // The first leaves: 1000 covers everyone's demand exactly.
        assert!(close(&p.allocate(&saturated(&[200.0, 400.0, 400.0])), &[200.0, 400.0, 400.0]));
        // An instance asking for everything joins: fair share 200.
        let r = p.allocate(&saturated(&[100.0, 200.0, 400.0, 400.0, f64::INFINITY]));
        assert!(close(&r, &[100.0, 200.0, 700.0 / 3.0, 700.0 / 3.0, 700.0 / 3.0]), "{r:?}");
        // Alone, an instance gets the whole device, beyond its demand.
        assert!(close(&p.allocate(&saturated(&[256.0])), &[1000.0]));
    }

    #[test]
    fn max_min_gives_unused_bandwidth_to_those_who_use_theirs() {
        let p = FairShare::new(FairShareMode::MaxMin, 1000.0, Vec::new());
        // Instance 0 had 250 and used 50; instances 1-3 used all of theirs.
        let inputs = [
            FlowInput { demand: 250.0, usage: 50.0, limit: Some(250.0) },
            FlowInput { demand: 250.0, usage: 250.0, limit: Some(250.0) },
            FlowInput { demand: 250.0, usage: 250.0, limit: Some(250.0) },
            FlowInput { demand: 250.0, usage: 250.0, limit: Some(250.0) },
        ];
        let r = p.allocate(&inputs);
        // 50 (+10% headroom) for the idle one, 950/3 for each of the others.
        assert!(close(&r, &[55.0, 950.0 / 3.0, 950.0 / 3.0, 950.0 / 3.0]), "{r:?}");
        // Static keeps everyone at the demand: 200 of the 1000 go unused.
        let s = FairShare::new(FairShareMode::Static, 1000.0, Vec::new());
        assert!(close(&s.allocate(&inputs), &[250.0; 4]));
    }

    /// A neighbour over its limit for a cycle does not make an instance
    /// that used its whole limit look idle (a fleet run in CI saw such an
    /// instance given its usage plus headroom for two cycles).
    #[test]
    fn a_neighbour_over_its_limit_does_not_demote_a_saturated_instance() {
        let p = FairShare::new(FairShareMode::MaxMin, 1000.0, Vec::new());
        let inputs = [
            FlowInput { demand: 200.0, usage: 199.0, limit: Some(200.0) },
            FlowInput { demand: f64::INFINITY, usage: 440.0, limit: Some(400.0) },
            FlowInput { demand: f64::INFINITY, usage: 400.0, limit: Some(400.0) },
        ];
        let r = p.allocate(&inputs);
        assert!(close(&r, &[200.0, 400.0, 400.0]), "{r:?}");
        // One that used less than 97% of its limit is still given its
        // usage plus headroom.
        let inputs = [FlowInput { usage: 150.0, ..inputs[0] }, inputs[1], inputs[2]];
        let r = p.allocate(&inputs);
        assert!(close(&r, &[165.0, 425.0, 425.0]), "{r:?}");
    }

    #[test]
    fn proportional_and_static_scenarios() {
        let p = FairShare::new(FairShareMode::Proportional, 1000.0, Vec::new());
        let r = p.allocate(&saturated(&[100.0, 200.0, 400.0, 400.0]));
        let k = 1000.0 / 1100.0;
        assert!(close(&r, &[100.0 * k, 200.0 * k, 400.0 * k, 400.0 * k]), "{r:?}");
        // Demands below the device: met, then the leftover in proportion.
        let r = p.allocate(&saturated(&[100.0, 300.0]));
        assert!(close(&r, &[250.0, 750.0]), "{r:?}");
        let s = FairShare::new(FairShareMode::Static, 1000.0, Vec::new());
        assert!(close(&s.allocate(&saturated(&[100.0, 200.0, 400.0, 400.0])), &[100.0, 200.0, 400.0, 400.0]));
        // No limit below the floor (1% of the device), even for an idle
        // instance next to a busy one.
        let idle = [
            FlowInput { demand: 100.0, usage: 0.0, limit: Some(100.0) },
            FlowInput { demand: 100.0, usage: 100.0, limit: Some(100.0) },
        ];
        assert!(close(&p.allocate(&idle), &[10.0, 1000.0]), "{:?}", p.allocate(&idle));
    }

    #[test]
    fn proportional_fill_respects_weights_and_caps() {
        let r = proportional_fill(100.0, &[f64::INFINITY, f64::INFINITY], &[1.0, 3.0]);
        assert!((r[0] - 25.0).abs() < 1e-9 && (r[1] - 75.0).abs() < 1e-9);
        let r = proportional_fill(100.0, &[10.0, f64::INFINITY], &[1.0, 1.0]);
        assert!((r[0] - 10.0).abs() < 1e-9 && (r[1] - 90.0).abs() < 1e-9);
    }
}
