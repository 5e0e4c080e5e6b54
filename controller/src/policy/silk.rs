//! SILK's I/O scheduling as a policy (Paio Algorithm 1).
//!
//! Each cycle, per instance: `Fg` is the client bandwidth the stage
//! measured: the file data (reads and writes of file contents) of every
//! context that is not background, so foreground, each tenant's and each
//! application context's device traffic counts, and key-value requests
//! (an `AsyncDb` tenant's puts and gets, whose file I/O is already counted
//! as foreground) do not count twice; `left_B = max(KVS_B - Fg, min_B)`. If flushes and L0
//! compactions both run, each gets `left_B / 2` and LN compactions `min_B`;
//! if only one runs, it gets `left_B` and the others `min_B`; if neither,
//! LN compactions get `left_B` and the others `min_B`. Flush objects get
//! `B_Fl`, L0 objects `B_L0`, and `B_LN` is split across all LN objects.
//! Objects are found from the stage's layout by the contexts their routes
//! cover (DRLs only), not by ids. Changes smaller than the hysteresis are
//! skipped.
//!
//! With [`PressureConfig`] (SILK with pressure), the budget the branch hands
//! out is not `left_B` but `calm + (left_B - calm) * ramp(pressure)` (at most
//! `left_B`), from the store's [`Pressure`](super::Pressure) as its handle
//! reports it; without a reading it is `left_B`, as published.

use kv_stage::RequestContext as C;
use serde::Serialize;
use serde_json::json;

use super::params::{PressureConfig, SilkConfig};
use super::{Decision, InstanceView, ObjectRef, Observation, Policy, PolicyError, Setting, drls_for};

/// Which branch of Algorithm 1 a cycle took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SilkBranch {
    /// Flushes and L0 compactions both run: they split `left_B`.
    FlushAndL0,
    /// Only flushes run: they get `left_B`.
    FlushOnly,
    /// Only L0 compactions run: they get `left_B`.
    L0Only,
    /// Neither runs: LN compactions get `left_B`.
    Neither,
}

impl SilkBranch {
    /// The branch's name, as the decision log and the metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            SilkBranch::FlushAndL0 => "flush_and_l0",
            SilkBranch::FlushOnly => "flush_only",
            SilkBranch::L0Only => "l0_only",
            SilkBranch::Neither => "neither",
        }
    }
}

/// The inputs and outputs of one SILK decision, for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SilkInputs {
    /// Foreground bandwidth (bytes/s).
    pub fg: f64,
    /// A flush runs (or ran since the last cycle).
    pub flush_active: bool,
    /// An L0 compaction runs (or ran since the last cycle).
    pub l0_active: bool,
    /// `left_B`.
    pub left: f64,
    /// The store's pressure level, when the policy uses it and the handle
    /// reported it.
    pub pressure: Option<f64>,
    /// What the branch hands out: `left_B`, or less with pressure.
    pub budget: f64,
    /// The branch taken.
    pub branch: SilkBranch,
    /// `B_Fl`.
    pub b_flush: f64,
    /// `B_L0`.
    pub b_l0: f64,
    /// `B_LN` (before splitting across LN objects).
    pub b_ln: f64,
}

/// The SILK policy.
#[derive(Debug, Clone)]
pub struct Silk {
    kvs: f64,
    min: f64,
    hysteresis: f64,
    pressure: Option<PressureConfig>,
}

impl Silk {
    /// A SILK policy with validated parameters (see
    /// [`ControllerConfig::validate`](crate::ControllerConfig::validate)).
    pub fn new(config: &SilkConfig) -> Self {
        Silk {
            kvs: config.kvs_bandwidth.bytes_per_sec(),
            min: config.min_bandwidth.bytes_per_sec(),
            hysteresis: config.hysteresis.per_sec(),
            pressure: config.pressure.clone(),
        }
    }

    /// Algorithm 1 for one instance.
    pub fn compute(&self, fg: f64, flush_active: bool, l0_active: bool) -> SilkInputs {
        self.compute_with_pressure(fg, flush_active, l0_active, None)
    }

    /// Algorithm 1 for one instance, with the store's pressure level when
    /// known (used only when the policy was configured with pressure).
    pub fn compute_with_pressure(
        &self,
        fg: f64,
        flush_active: bool,
        l0_active: bool,
        pressure: Option<f64>,
    ) -> SilkInputs {
        let left = (self.kvs - fg).max(self.min);
        let (pressure, budget) = match (&self.pressure, pressure) {
            (Some(cfg), Some(p)) => {
                let calm = cfg.calm_bandwidth.bytes_per_sec();
                let budget = (calm + (left - calm).max(0.0) * cfg.ramp(p)).min(left).max(self.min);
                (Some(p), budget)
            }
            _ => (None, left),
        };
        let (branch, b_flush, b_l0, b_ln) = match (flush_active, l0_active) {
            (true, true) => (SilkBranch::FlushAndL0, budget / 2.0, budget / 2.0, self.min),
            (true, false) => (SilkBranch::FlushOnly, budget, self.min, self.min),
            (false, true) => (SilkBranch::L0Only, self.min, budget, self.min),
            (false, false) => (SilkBranch::Neither, self.min, self.min, budget),
        };
        SilkInputs { fg, flush_active, l0_active, left, pressure, budget, branch, b_flush, b_l0, b_ln }
    }
}

/// The DRLs that requests of `ctx` from the instances with an active job of
/// `ctx` reach.
fn active_drls(v: &InstanceView, ctx: C, drls: &[ObjectRef]) -> Vec<ObjectRef> {
    let mut out: Vec<ObjectRef> = Vec::new();
    for i in v.active_instances(ctx) {
        for (c, o) in v.info.objects_serving(ctx, i) {
            if let Some(d) = drls.iter().find(|d| d.is(&c, &o))
                && !out.contains(d)
            {
                out.push(d.clone());
            }
        }
    }
    out
}

impl Policy for Silk {
    fn name(&self) -> &'static str {
        "silk"
    }

    fn check_stage(&self, info: &kv_stage::info::StageInfo) -> Result<(), String> {
        super::check_background_drls(self.name(), info)
    }

    /// Algorithm 1 for each stage the controller drives. Several DBs may
    /// share a stage, each with its own DRLs: the flush and L0 DRLs whose
    /// DBs have such a job active are the *claimants*, and they split
    /// `left_B` evenly (one DB with a flush and an L0 compaction: `left_B / 2`
    /// each, as in Algorithm 1); the other flush and L0 DRLs get `min_B`.
    /// With no claimant, the LN DRLs split `left_B`; otherwise they split
    /// `min_B`. Either way the stage's DRLs together never get more than
    /// `KVS_B` beyond their floors.
    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        let mut settings = Vec::new();
        let mut notes = Vec::new();
        let mut branches = Vec::new();
        for v in &obs.instances {
            let fg = v.rates.client_file().bytes_per_sec;
            let flush = drls_for(&v.info, C::BG_FLUSH);
            let l0 = drls_for(&v.info, C::BG_COMPACTION_L0_L1);
            let ln = drls_for(&v.info, C::BG_COMPACTION_LN);
            let active_flush = active_drls(v, C::BG_FLUSH, &flush);
            let active_l0 = active_drls(v, C::BG_COMPACTION_L0_L1, &l0);
            let mut claimants = active_flush.clone();
            for d in &active_l0 {
                if !claimants.contains(d) {
                    claimants.push(d.clone());
                }
            }
            let s = self.compute_with_pressure(
                fg,
                !active_flush.is_empty(),
                !active_l0.is_empty(),
                v.pressure.map(|p| p.level),
            );
            let share = if claimants.is_empty() { 0.0 } else { s.budget / claimants.len() as f64 };
            let mut push = |object: &ObjectRef, rate: f64| {
                let skip = v
                    .current_rate(&object.channel, &object.object)
                    .is_some_and(|cur| (cur - rate).abs() < self.hysteresis && cur.is_finite());
                if !skip && !settings.iter().any(|x: &Setting| x.instance == v.key && x.object == *object) {
                    settings.push(Setting { instance: v.key, object: object.clone(), rate });
                }
            };
            for d in flush.iter().chain(l0.iter()) {
                push(d, if claimants.contains(d) { share } else { self.min });
            }
            for d in &ln {
                push(d, s.b_ln / ln.len() as f64);
            }
            branches.push((v.key, s.branch.as_str()));
            notes.push(json!({
                "instance": v.name,
                "fg_bps": s.fg,
                "flush_bps": v.rates.context(C::BG_FLUSH).bytes_per_sec,
                "l0_bps": v.rates.context(C::BG_COMPACTION_L0_L1).bytes_per_sec,
                "ln_bps": v.rates.context(C::BG_COMPACTION_LN).bytes_per_sec + v.rates.context(C::BG_COMPACTION).bytes_per_sec,
                "running": {
                    "flush": v.jobs(C::BG_FLUSH).counts.running,
                    "l0": v.jobs(C::BG_COMPACTION_L0_L1).counts.running,
                    "ln": v.jobs(C::BG_COMPACTION_LN).counts.running,
                },
                "flush_active": s.flush_active,
                "l0_active": s.l0_active,
                "left_bps": s.left,
                "pressure": v.pressure,
                "budget_bps": s.budget,
                "branch": s.branch,
                "claimants": claimants.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "b_flush_bps": if s.flush_active { share } else { self.min },
                "b_l0_bps": if s.l0_active { share } else { self.min },
                "b_ln_bps": s.b_ln,
                "ln_objects": ln.len(),
            }));
        }
        Ok(Decision { settings, notes: serde_json::Value::Array(notes), branches })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv_stage::units::Rate;

    const MIB: f64 = 1048576.0;

    fn silk() -> Silk {
        Silk::new(&SilkConfig {
            kvs_bandwidth: kv_stage::units::Bandwidth::new(200.0 * MIB).unwrap(),
            min_bandwidth: kv_stage::units::Bandwidth::new(10.0 * MIB).unwrap(),
            hysteresis: Rate::from_bytes_per_sec(10.0 * MIB).unwrap(),
            pressure: None,
        })
    }

    /// Every branch of Algorithm 1, and the floor of `left_B`.
    #[test]
    fn algorithm_1_table() {
        struct Case {
            fg: f64,
            flush: bool,
            l0: bool,
            branch: SilkBranch,
            b: (f64, f64, f64),
        }
        let cases = [
            // Clients use 50: left = 150.
            Case { fg: 50.0, flush: true, l0: true, branch: SilkBranch::FlushAndL0, b: (75.0, 75.0, 10.0) },
            Case { fg: 50.0, flush: true, l0: false, branch: SilkBranch::FlushOnly, b: (150.0, 10.0, 10.0) },
            Case { fg: 50.0, flush: false, l0: true, branch: SilkBranch::L0Only, b: (10.0, 150.0, 10.0) },
            Case { fg: 50.0, flush: false, l0: false, branch: SilkBranch::Neither, b: (10.0, 10.0, 150.0) },
            // Clients use everything (or more): left is the floor min_B.
            Case { fg: 250.0, flush: false, l0: false, branch: SilkBranch::Neither, b: (10.0, 10.0, 10.0) },
            Case { fg: 195.0, flush: true, l0: true, branch: SilkBranch::FlushAndL0, b: (5.0, 5.0, 10.0) },
            // Idle clients: all of KVS_B is left.
            Case { fg: 0.0, flush: true, l0: false, branch: SilkBranch::FlushOnly, b: (200.0, 10.0, 10.0) },
        ];
        for c in cases {
            let s = silk().compute(c.fg * MIB, c.flush, c.l0);
            assert_eq!(s.branch, c.branch, "fg {}", c.fg);
            assert_eq!((s.b_flush / MIB, s.b_l0 / MIB, s.b_ln / MIB), c.b, "fg {} {:?}", c.fg, c.branch);
        }
    }

    /// With pressure the budget slides from `calm` (no pressure) to
    /// `left_B` (pressure at `to` or above); no reading means plain SILK.
    #[test]
    fn pressure_slides_the_budget_between_calm_and_left() {
        let mut cfg = SilkConfig {
            kvs_bandwidth: kv_stage::units::Bandwidth::new(200.0 * MIB).unwrap(),
            min_bandwidth: kv_stage::units::Bandwidth::new(10.0 * MIB).unwrap(),
            hysteresis: Rate::from_bytes_per_sec(10.0 * MIB).unwrap(),
            pressure: Some(PressureConfig::new(kv_stage::units::Bandwidth::new(40.0 * MIB).unwrap())),
        };
        let s = Silk::new(&cfg);
        // Clients use 50: left = 150; ramp 0.25 -> 0.75.
        for (p, budget) in [(0.0, 40.0), (0.25, 40.0), (0.5, 95.0), (0.75, 150.0), (3.0, 150.0)] {
            let x = s.compute_with_pressure(50.0 * MIB, false, false, Some(p));
            assert_eq!(x.budget / MIB, budget, "pressure {p}");
            assert_eq!((x.b_flush / MIB, x.b_l0 / MIB, x.b_ln / MIB), (10.0, 10.0, budget), "pressure {p}");
            let x = s.compute_with_pressure(50.0 * MIB, true, true, Some(p));
            assert_eq!((x.b_flush / MIB, x.b_l0 / MIB, x.b_ln / MIB), (budget / 2.0, budget / 2.0, 10.0));
        }
        // Never above left_B: clients use 180, left = 20 < calm.
        assert_eq!(s.compute_with_pressure(180.0 * MIB, false, false, Some(0.0)).budget / MIB, 20.0);
        // No reading: SILK as published.
        assert_eq!(s.compute_with_pressure(50.0 * MIB, false, false, None).budget / MIB, 150.0);
        // A pressure setting is ignored by plain SILK.
        cfg.pressure = None;
        assert_eq!(Silk::new(&cfg).compute_with_pressure(50.0 * MIB, false, false, Some(0.0)).budget / MIB, 150.0);
    }
}
