//! The default controller for RocksDB: unlimited while the store is
//! healthy, SILK's priorities only while the device or the clients are
//! busy, and flushes and L0 compactions promoted as a write stall nears.
//!
//! Each cycle, per instance (a stage with the RocksDB layout):
//!
//! 1. **Healthy: no limit.** Unless the instance is contended, every
//!    background DRL is unlimited: the store runs as plain RocksDB would,
//!    and a flush or compaction finishes as fast as the device lets it.
//! 2. **Contended: SILK's split of a budget.** A cycle is busy when the
//!    store's traffic (every context) is at least `busy_share` of the
//!    device budget `D`, or when clients make at least
//!    `busy_foreground_ops` requests per second (averaged over 200 ms), or
//!    when a limit it set binds (a background request waits in its DRL),
//!    but only while clients are there at all (see [`Adaptive::has_clients`]);
//!    the instance stays contended for `hold` after the last busy cycle. Then
//!    background work gets a budget between a calm share of `D`
//!    (`calm_share`, with no backlog) and all that clients leave,
//!    `left = max(D - Fg, min_B)` (as the store's pressure goes from
//!    `ramp_from` to `ramp_to`), split as Algorithm 1 splits `left_B`:
//!    flushes and L0->L1 compactions first, deeper compactions `min_B`
//!    while those run and the whole budget when they do not (with
//!    `deep_at_floor`, `min_B` then too, off by default). Flushes and
//!    L0 compactions get at least `ingest_pace` times the clients' file
//!    writes (in RocksDB, the write-ahead log), up to `left`: the pace they
//!    must keep so that memtables and L0 files do not pile up while
//!    clients write fast.
//! 3. **A stall nears: promotion.** When L0 files or full memtables reach
//!    `promote_at` of RocksDB's slowdown point (see
//!    [`Pressure`](super::Pressure)), flushes and L0 compactions get all
//!    that clients leave (`left`) and deep compactions the floor, whatever
//!    the backlog ramp says, as RocksDB raises their I/O priority once its
//!    write controller delays writes. Not unlimited: a cold start with 11
//!    L0 files and L0 compactions let loose filled the kernel's throttle and
//!    cost clients a p99 of about a second. Pending compaction bytes
//!    (deep-level debt) raise the budget instead.
//! 4. **Debt is paid when clients leave.** Background work is held back
//!    only while contended; once the instance is not, it is unlimited
//!    again, so the backlog is paid in the next quiet moment. With no
//!    clients a binding limit does not keep the instance contended: it
//!    would hold back the work of paying the debt for nobody's sake.
//! 5. **A new instance starts contended**, for `hold`: until its first
//!    rates the policy cannot tell a healthy store from a cold one whose
//!    compactions are about to fill the device.
//! 6. **A device that limits each direction.** With `read_bandwidth` or
//!    `write_bandwidth` set (a cgroup's `rbps` and `wbps`), a direction the
//!    store fills to `busy_share` makes a cycle busy, and while contended
//!    background work gets no more than fits the room clients leave in
//!    each direction, at the share of its bytes that go that way. `D`
//!    counts both directions; in a cold start clients' reads (cache misses)
//!    and an L0 compaction's reads fill the read side while `D - Fg` still
//!    looks roomy, and the kernel queues client reads behind compaction
//!    reads.
//! 7. **Idle while no job runs.** While no instance runs a flush or
//!    compaction, healthy or contended, no byte passes the DRLs the policy
//!    sets, and there is nothing to limit until a job begins, so the
//!    policy lets the loop sleep for `idle_interval` (100 ms) instead of
//!    cycling every 10 ms; the stage wakes the loop when a job starts
//!    ([`crate::StageHandle::watch_jobs`]), so a job is seen at least as
//!    soon as at the 10 ms interval. A store with no job is then read ten
//!    times a second, not a hundred: busy clients between jobs (warm
//!    mixture's peaks) no longer keep the loop waking every 10 ms.

use kv_stage::RequestContext as C;
use serde::Serialize;
use serde_json::json;

use super::params::AdaptiveConfig;
use super::{
    Decision, InstanceKey, InstanceView, ObjectRef, Observation, Policy, PolicyError, Pressure, Setting, drls_for,
};

/// The store's file traffic per direction, for a device that limits reads
/// and writes each on its own ([`AdaptiveConfig::read_bandwidth`],
/// [`AdaptiveConfig::write_bandwidth`]). Clients' traffic is the cycle's,
/// as `Fg` is; background traffic is averaged over about 200 ms (a 10 ms
/// cycle sees one 1 MiB compaction request as 100 MiB/s).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Directions {
    /// Client file reads this cycle, bytes/s.
    pub fg_read_bps: f64,
    /// Client file writes this cycle, bytes/s.
    pub fg_write_bps: f64,
    /// Background (flush and compaction) file reads, averaged, bytes/s.
    pub bg_read_bps: f64,
    /// Background file writes, averaged, bytes/s.
    pub bg_write_bps: f64,
    /// The share of background bytes that are reads: how a background
    /// budget splits between the directions (kept from the last traffic
    /// while there is none).
    pub bg_read_share: f64,
    /// The clients' read demand, bytes/s: the larger of this cycle's
    /// client reads and their recent peak, decaying with
    /// [`AdaptiveConfig::demand_memory`]. What background work may use is
    /// set from the demand, not from this cycle's traffic alone, which
    /// falls when clients wait behind background I/O.
    pub fg_read_demand_bps: f64,
    /// The clients' write demand, bytes/s (as `fg_read_demand_bps`).
    pub fg_write_demand_bps: f64,
}

impl Directions {
    /// The clients' demand over both directions, bytes/s.
    pub fn fg_demand_bps(&self) -> f64 {
        self.fg_read_demand_bps + self.fg_write_demand_bps
    }

    /// The next cycle's traffic from the previous one (`None` for an
    /// instance's first cycle) and this cycle's bytes/s, `[client reads,
    /// client writes, background reads, background writes]`. Background
    /// traffic moves toward this cycle's by `smoothing` (0 to 1); the
    /// clients' demand is this cycle's traffic or, when that is less, the
    /// previous demand times `keep` (0 to 1: what a peak keeps over one
    /// cycle).
    pub fn next(prev: Option<Directions>, now: [f64; 4], smoothing: f64, keep: f64) -> Directions {
        let d = match prev {
            None => Directions {
                fg_read_bps: now[0],
                fg_write_bps: now[1],
                bg_read_bps: now[2],
                bg_write_bps: now[3],
                fg_read_demand_bps: now[0],
                fg_write_demand_bps: now[1],
                ..Directions::default()
            },
            Some(p) => {
                let avg = |prev: f64, x: f64| prev + smoothing * (x - prev);
                Directions {
                    fg_read_bps: now[0],
                    fg_write_bps: now[1],
                    bg_read_bps: avg(p.bg_read_bps, now[2]),
                    bg_write_bps: avg(p.bg_write_bps, now[3]),
                    bg_read_share: p.bg_read_share,
                    fg_read_demand_bps: now[0].max(keep * p.fg_read_demand_bps),
                    fg_write_demand_bps: now[1].max(keep * p.fg_write_demand_bps),
                }
            }
        };
        // Bytes-weighted: the share of the averaged background bytes.
        let bg = d.bg_read_bps + d.bg_write_bps;
        Directions { bg_read_share: if bg > 0.0 { d.bg_read_bps / bg } else { d.bg_read_share }, ..d }
    }
}

impl Directions {
    /// No traffic; background bytes assumed half reads (a compaction reads
    /// about what it writes).
    pub const NONE: Directions = Directions {
        fg_read_bps: 0.0,
        fg_write_bps: 0.0,
        bg_read_bps: 0.0,
        bg_write_bps: 0.0,
        bg_read_share: 0.5,
        fg_read_demand_bps: 0.0,
        fg_write_demand_bps: 0.0,
    };
}

impl Default for Directions {
    /// [`Directions::NONE`].
    fn default() -> Self {
        Directions::NONE
    }
}

/// Below this share of background bytes a direction does not bound the
/// background budget (dividing its room by a share near 0 says nothing).
const MIN_DIRECTION_SHARE: f64 = 0.05;

/// What the policy did for an instance in a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdaptiveMode {
    /// Not contended: every background DRL unlimited.
    Healthy,
    /// Contended: SILK's shares of what clients leave.
    Contended,
    /// Contended, and a stall nears: flushes and L0 compactions get all
    /// that clients leave, deeper compactions `min_B`.
    Promoted,
    /// Not contended but pressed: as healthy (every DRL unlimited).
    Draining,
}

impl AdaptiveMode {
    /// The mode's name, as the decision log and the metrics write it.
    pub fn as_str(self) -> &'static str {
        match self {
            AdaptiveMode::Healthy => "healthy",
            AdaptiveMode::Contended => "contended",
            AdaptiveMode::Promoted => "promoted",
            AdaptiveMode::Draining => "draining",
        }
    }
}

/// The inputs and outputs of one decision for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AdaptiveInputs {
    /// Foreground bandwidth, bytes/s.
    pub fg_bps: f64,
    /// The clients' file writes, bytes/s (what flushes and L0 compactions
    /// keep pace with).
    pub ingest_bps: f64,
    /// Foreground requests per second.
    pub fg_ops: f64,
    /// Every context's bandwidth together, bytes/s.
    pub total_bps: f64,
    /// The store's pressure (0 when its handle does not report one).
    pub pressure: Pressure,
    /// Traffic per direction (what bounds `left_bps` on a device that
    /// limits each direction).
    pub directions: Directions,
    /// The most background work may use so that it fits the room clients
    /// leave in each limited direction (`INFINITY` when no direction is
    /// limited).
    pub direction_left_bps: f64,
    /// This cycle counted as busy.
    pub busy: bool,
    /// What the policy did.
    pub mode: AdaptiveMode,
    /// `max(min(D - Fg, direction_left_bps), min_B)`.
    pub left_bps: f64,
    /// What background work gets while contended: from `calm_share * D`
    /// (no pressure) up to `left_bps` (pressure at `ramp_to`).
    pub budget_bps: f64,
    /// What flushes and L0 compactions get together while contended: the
    /// budget, or `ingest_pace` times the clients' writes when that is more
    /// (at most `left_bps`).
    pub ingest_budget_bps: f64,
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
    /// Foreground requests per second, averaged over about
    /// [`FG_OPS_SMOOTHING`] (one 10 ms window is too noisy to judge by).
    fg_ops: Option<f64>,
    /// Nanoseconds background requests had waited in their DRLs, at the
    /// last cycle.
    wait_ns: u64,
    /// The per-direction traffic (background's averaged like `fg_ops`).
    directions: Option<Directions>,
}

/// Clients count as gone below this share of `busy_foreground_ops` (20
/// file requests/s with the default 2,000) and with no file traffic.
const IDLE_SHARE: f64 = 0.01;

/// The time constant of the foreground request rate's moving average.
const FG_OPS_SMOOTHING: std::time::Duration = std::time::Duration::from_millis(200);

/// The default controller's policy (see the module documentation).
#[derive(Debug, Clone)]
pub struct Adaptive {
    config: AdaptiveConfig,
    state: Vec<(InstanceKey, InstanceState)>,
    /// After the last decision: every instance healthy, no job running.
    idle: bool,
}

impl Adaptive {
    /// The policy with validated parameters.
    pub fn new(config: &AdaptiveConfig) -> Self {
        Adaptive { config: config.clone(), state: Vec::new(), idle: false }
    }

    /// One instance's decision from its inputs: `since_busy` is the
    /// seconds since the last busy cycle (0 when this one is), `flush_active`
    /// and `l0_active` whether flushes and L0 compactions run, `directions`
    /// the traffic per direction (it matters only with `read_bandwidth` or
    /// `write_bandwidth` set).
    #[allow(clippy::too_many_arguments)]
    pub fn compute(
        &self,
        fg_bps: f64,
        ingest_bps: f64,
        fg_ops: f64,
        total_bps: f64,
        pressure: Pressure,
        since_busy: Option<f64>,
        flush_active: bool,
        l0_active: bool,
        directions: Directions,
    ) -> AdaptiveInputs {
        let c = &self.config;
        let d = c.device_bandwidth.bytes_per_sec();
        let min = c.min_bandwidth.bytes_per_sec();
        let busy = self.has_clients(fg_ops, fg_bps) && self.is_busy(fg_ops, total_bps, &directions);
        let contended = busy || since_busy.is_some_and(|s| s < c.hold.as_secs_f64());
        let direction_left = self.direction_left(&directions);
        // What clients leave, judged by their demand (this cycle's traffic
        // or, when it fell, their recent peak): clients that wait behind
        // background I/O move fewer bytes, and must not make room for more.
        let left = (d - fg_bps.max(directions.fg_demand_bps())).min(direction_left).max(min);
        // What background work gets while contended: a calm share of D with
        // no backlog, all that clients leave as the backlog grows.
        let calm = (c.calm_share * d).min(left).max(min);
        let budget = (calm + (left - calm).max(0.0) * c.ramp(pressure.level)).min(left).max(min);
        // The ingest path keeps pace with the clients' writes: a flush
        // writes each byte once, an L0->L1 compaction reads it and writes it
        // again with L1's overlap; a budget below that lets memtables and L0
        // files pile up until RocksDB stalls writes.
        let ingest = budget.max((c.ingest_pace * ingest_bps).min(left));
        let inf = f64::INFINITY;
        // A stall nears when L0 files or full memtables approach RocksDB's
        // slowdown point; pending compaction bytes are deep-level debt,
        // which the budget (and quiet moments) pay, not a reason to let
        // flushes and L0 compactions take the device.
        let promote = pressure.l0.max(pressure.memtables) >= c.promote_at;
        let (mode, b_flush, b_l0, b_ln) = if !contended {
            (if promote { AdaptiveMode::Draining } else { AdaptiveMode::Healthy }, inf, inf, inf)
        } else if promote {
            // All that clients leave, SILK-style, whether or not the backlog
            // ramp has reached it; deep compactions wait at the floor.
            let (f, l) = match (flush_active, l0_active) {
                (true, false) => (left, min),
                (false, true) => (min, left),
                _ => (left / 2.0, left / 2.0),
            };
            (AdaptiveMode::Promoted, f, l, min)
        } else {
            let (f, l) = match (flush_active, l0_active) {
                (true, true) => (ingest / 2.0, ingest / 2.0),
                (true, false) => (ingest, min),
                (false, true) => (min, ingest),
                (false, false) => (min, min),
            };
            let ln = if c.deep_at_floor || flush_active || l0_active { min } else { budget };
            (AdaptiveMode::Contended, f, l, ln)
        };
        AdaptiveInputs {
            fg_bps,
            ingest_bps,
            fg_ops,
            total_bps,
            pressure,
            directions,
            direction_left_bps: direction_left,
            busy,
            mode,
            left_bps: left,
            budget_bps: budget,
            ingest_budget_bps: ingest,
            b_flush,
            b_l0,
            b_ln,
        }
    }

    /// Whether a cycle with these rates counts as busy: busy clients, the
    /// store's traffic at `busy_share` of `D`, or a limited direction
    /// filled to `busy_share` of its bandwidth.
    pub fn is_busy(&self, fg_ops: f64, total_bps: f64, directions: &Directions) -> bool {
        let c = &self.config;
        let full = |cap: Option<kv_stage::units::Bandwidth>, used: f64| {
            cap.is_some_and(|b| b.bytes_per_sec().is_finite() && used >= c.busy_share * b.bytes_per_sec())
        };
        fg_ops >= c.busy_foreground_ops
            || total_bps >= c.busy_share * c.device_bandwidth.bytes_per_sec()
            || full(c.read_bandwidth, directions.fg_read_bps + directions.bg_read_bps)
            || full(c.write_bandwidth, directions.fg_write_bps + directions.bg_write_bps)
    }

    /// The most background work may use so that, at its share of reads and
    /// writes, it fits the room clients leave in each limited direction:
    /// `min((R - Fg_read) / read_share, (W - Fg_write) / write_share)`, with
    /// the clients' demand per direction (the larger of this cycle's
    /// traffic and the remembered peak) as `Fg_read` and `Fg_write`.
    /// `INFINITY` with no limited direction.
    pub fn direction_left(&self, directions: &Directions) -> f64 {
        let c = &self.config;
        let share_r = directions.bg_read_share.clamp(0.0, 1.0);
        let room = |cap: Option<kv_stage::units::Bandwidth>, used: f64, share: f64| match cap {
            Some(b) if share >= MIN_DIRECTION_SHARE => (b.bytes_per_sec() - used).max(0.0) / share,
            _ => f64::INFINITY,
        };
        room(c.read_bandwidth, directions.fg_read_bps.max(directions.fg_read_demand_bps), share_r).min(room(
            c.write_bandwidth,
            directions.fg_write_bps.max(directions.fg_write_demand_bps),
            1.0 - share_r,
        ))
    }

    /// Whether clients are there at all: their file requests (averaged)
    /// reach 1% of `busy_foreground_ops`, or their file
    /// traffic this cycle is not zero.
    pub fn has_clients(&self, fg_ops: f64, fg_bps: f64) -> bool {
        fg_ops >= IDLE_SHARE * self.config.busy_foreground_ops || fg_bps > 0.0
    }

    fn state(&mut self, key: InstanceKey) -> &mut InstanceState {
        if let Some(i) = self.state.iter().position(|(k, _)| *k == key) {
            return &mut self.state[i].1;
        }
        self.state.push((key, InstanceState::default()));
        &mut self.state.last_mut().expect("pushed").1
    }

    fn decide_one(
        &mut self,
        v: &InstanceView,
        now_s: f64,
        settings: &mut Vec<Setting>,
    ) -> (serde_json::Value, AdaptiveMode) {
        // Requests of foreground's context (an `AsyncDb` tenant's file I/O
        // is foreground's); bytes of the device traffic only: client file
        // data, and the file data of every context for the total, so a
        // tenant's key-value requests do not count a second time.
        let fg_ops_now = v.rates.context(C::FOREGROUND).ops_per_sec;
        let fg_bps = v.rates.client_file().bytes_per_sec;
        let ingest_bps = v.rates.client_file_writes().bytes_per_sec;
        let total: f64 = v.rates.file_contexts.iter().map(|(_, r)| r.bytes_per_sec).sum();
        let bg_write: f64 =
            v.rates.file_write_contexts.iter().filter(|(c, _)| c.is_background()).map(|(_, r)| r.bytes_per_sec).sum();
        let bg_total: f64 =
            v.rates.file_contexts.iter().filter(|(c, _)| c.is_background()).map(|(_, r)| r.bytes_per_sec).sum();
        let bg_read = (bg_total - bg_write).max(0.0);
        let pressure = v.pressure.unwrap_or_default();
        let a = (v.rates.interval.as_secs_f64() / FG_OPS_SMOOTHING.as_secs_f64()).clamp(0.0, 1.0);
        // The clients' demand: a peak that decays with `demand_memory`.
        let memory = self.config.demand_memory.as_secs_f64();
        let keep = if memory > 0.0 { (-v.rates.interval.as_secs_f64() / memory).exp() } else { 0.0 };
        let st = self.state(v.key);
        if st.fg_ops.is_none() {
            // A new instance starts contended (for `hold`): before its
            // first rates the policy cannot tell a healthy store from a
            // cold one whose compactions are about to fill the device.
            st.last_busy_s = Some(now_s);
        }
        let fg_ops = match st.fg_ops {
            Some(prev) => prev + a * (fg_ops_now - prev),
            None => fg_ops_now,
        };
        st.fg_ops = Some(fg_ops);
        let now = [(fg_bps - ingest_bps).max(0.0), ingest_bps, bg_read, bg_write];
        let directions = Directions::next(st.directions, now, a, keep);
        st.directions = Some(directions);
        let flush = drls_for(&v.info, C::BG_FLUSH);
        let l0 = drls_for(&v.info, C::BG_COMPACTION_L0_L1);
        let ln = drls_for(&v.info, C::BG_COMPACTION_LN);
        // A limit that binds (a background request waits, or waited since
        // the last cycle) keeps the instance contended: the limit, not a
        // lack of demand, is what keeps the traffic below the threshold.
        let (mut wait_ns, mut waiting) = (0u64, 0u64);
        for d in flush.iter().chain(&l0).chain(&ln) {
            if let Some(o) = v.collection.object(&d.channel, &d.object) {
                wait_ns += o.stats.wait_ns;
                waiting += o.stats.waiting;
            }
        }
        let st = self.state(v.key);
        let binding = waiting > 0 || wait_ns > st.wait_ns;
        st.wait_ns = wait_ns;
        // With no clients there is nobody to protect: background traffic
        // and a binding limit alone do not make a cycle busy, so the debt
        // is paid at the device's speed once clients leave (and `hold`
        // has passed).
        let clients = self.has_clients(fg_ops, fg_bps);
        let busy = clients && (binding || self.is_busy(fg_ops, total, &directions));
        let st = self.state(v.key);
        if busy {
            st.last_busy_s = Some(now_s);
        }
        let since_busy = st.last_busy_s.map(|t| (now_s - t).max(0.0));
        let mut x = self.compute(
            fg_bps,
            ingest_bps,
            fg_ops,
            total,
            pressure,
            since_busy,
            v.job_active(C::BG_FLUSH),
            v.job_active(C::BG_COMPACTION_L0_L1),
            directions,
        );
        x.busy = busy;
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
        let note = json!({
            "instance": v.name,
            "fg_bps": x.fg_bps,
            "ingest_bps": x.ingest_bps,
            "fg_ops": x.fg_ops,
            "total_bps": x.total_bps,
            "pressure": v.pressure,
            "busy": x.busy,
            "binding": binding,
            "since_busy_s": since_busy,
            "mode": x.mode,
            "fg_read_bps": x.directions.fg_read_bps,
            "fg_demand_bps": x.directions.fg_demand_bps(),
            "bg_read_bps": x.directions.bg_read_bps,
            "bg_write_bps": x.directions.bg_write_bps,
            "bg_read_share": x.directions.bg_read_share,
            "direction_left_bps": rate_note(x.direction_left_bps),
            "left_bps": x.left_bps,
            "budget_bps": x.budget_bps,
            "ingest_budget_bps": x.ingest_budget_bps,
            "b_flush_bps": rate_note(x.b_flush),
            "b_l0_bps": rate_note(x.b_l0),
            "b_ln_bps": rate_note(x.b_ln),
            "running": {
                "flush": v.jobs(C::BG_FLUSH).counts.running,
                "l0": v.jobs(C::BG_COMPACTION_L0_L1).counts.running,
                "ln": v.jobs(C::BG_COMPACTION_LN).counts.running,
            },
        });
        (note, x.mode)
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

    fn check_stage(&self, info: &kv_stage::info::StageInfo) -> Result<(), String> {
        super::check_background_drls(self.name(), info)
    }

    fn decide(&mut self, obs: &Observation) -> Result<Decision, PolicyError> {
        let now_s = obs.elapsed.as_secs_f64();
        let mut settings = Vec::new();
        let mut notes = Vec::new();
        let mut branches = Vec::new();
        let mut idle = !obs.instances.is_empty();
        for v in &obs.instances {
            let (note, mode) = self.decide_one(v, now_s, &mut settings);
            notes.push(note);
            branches.push((v.key, mode.as_str()));
            idle &= v.collection.jobs.iter().all(|j| j.counts.running == 0);
        }
        self.idle = idle;
        Ok(Decision { settings, notes: serde_json::Value::Array(notes), branches })
    }

    /// Item 7 of the module documentation: while no flush or compaction
    /// runs on any instance, healthy or contended, no byte passes the DRLs
    /// the policy sets, and nothing it limits can change before a job
    /// begins, so the loop may sleep up to `idle_interval`; a job's start
    /// wakes it, and its first cycle sets the job's limits.
    fn idle_interval(&self) -> Option<std::time::Duration> {
        self.idle.then_some(self.config.idle_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    /// No per-direction traffic (the policies here limit no direction).
    const NONE: Directions = Directions::NONE;

    /// Backlog only (pending compaction bytes).
    fn backlog(level: f64) -> Pressure {
        Pressure::new(0.0, 0.0, level)
    }

    /// L0 files toward the slowdown trigger.
    fn l0(level: f64) -> Pressure {
        Pressure::new(level, 0.0, 0.0)
    }

    fn mib(x: (f64, f64, f64)) -> (f64, f64, f64) {
        let r = |v: f64| (v / MIB * 1e6).round() / 1e6;
        (r(x.0), r(x.1), r(x.2))
    }

    /// `D` 60 MiB/s, floor 4: calm budget 20 MiB/s.
    fn policy() -> Adaptive {
        Adaptive::new(&AdaptiveConfig {
            device_bandwidth: kv_stage::units::Bandwidth::new(60.0 * MIB).unwrap(),
            min_bandwidth: kv_stage::units::Bandwidth::new(4.0 * MIB).unwrap(),
            ..AdaptiveConfig::default()
        })
    }

    /// A healthy store: clients light, the store's traffic far below the
    /// device budget, no pressure: no DRL is limited, whatever runs.
    #[test]
    fn healthy_store_sets_no_limit() {
        let p = policy();
        for (flush, l0) in [(false, false), (true, false), (false, true), (true, true)] {
            let x = p.compute(2.0 * MIB, 0.0, 1000.0, 10.0 * MIB, backlog(0.1), None, flush, l0, NONE);
            assert_eq!(x.mode, AdaptiveMode::Healthy, "{x:?}");
            assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite() && x.b_ln.is_infinite(), "{x:?}");
            // A busy cycle long past (beyond `hold`) changes nothing.
            let x = p.compute(2.0 * MIB, 0.0, 1000.0, 10.0 * MIB, backlog(0.1), Some(10.0), flush, l0, NONE);
            assert_eq!(x.mode, AdaptiveMode::Healthy, "{x:?}");
        }
    }

    /// Clients are there while their averaged file requests reach 1% of
    /// `busy_foreground_ops` or they moved bytes this cycle; a store with
    /// neither has nobody to protect (the loop test drives this end to end).
    #[test]
    fn clients_are_gone_below_the_idle_share_with_no_traffic() {
        let p = policy();
        let idle = IDLE_SHARE * AdaptiveConfig::default().busy_foreground_ops;
        assert!(p.has_clients(idle, 0.0));
        assert!(p.has_clients(0.0, 1.0));
        assert!(!p.has_clients(idle * 0.99, 0.0));
        assert!(!p.has_clients(0.0, 0.0));
        // The store's own traffic at 50 of 60 MiB/s (busy with clients):
        // with none, healthy and unlimited once `hold` has passed.
        let x = p.compute(0.0, 0.0, 0.0, 50.0 * MIB, backlog(0.5), Some(1.0), false, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Healthy, "{x:?}");
        assert!(!x.busy && x.b_l0.is_infinite() && x.b_ln.is_infinite(), "{x:?}");
        let x = p.compute(1.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(0.5), Some(1.0), false, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended, "{x:?}");
    }

    /// `deep_at_floor`: while contended, compactions below L1 stay at the
    /// floor even with the ingest path idle and the backlog at its ramp's
    /// top; flushes and L0 compactions are split as without it, and a
    /// healthy store is still unlimited.
    #[test]
    fn deep_at_floor_holds_deep_compactions_while_contended() {
        let p = policy();
        let floor = Adaptive::new(&AdaptiveConfig { deep_at_floor: true, ..p.config.clone() });
        for level in [0.0, 0.5, 0.8] {
            let x = p.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(level), Some(0.0), false, false, NONE);
            let y = floor.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(level), Some(0.0), false, false, NONE);
            assert!(x.b_ln / MIB >= 20.0 - 1e-6, "{x:?}");
            assert_eq!(y.mode, AdaptiveMode::Contended, "{y:?}");
            assert_eq!(mib((y.b_flush, y.b_l0, y.b_ln)), (4.0, 4.0, 4.0), "pressure {level}");
            let (x, y) = (
                p.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(level), Some(0.0), true, false, NONE),
                floor.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(level), Some(0.0), true, false, NONE),
            );
            assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), mib((y.b_flush, y.b_l0, y.b_ln)));
        }
        let y = floor.compute(2.0 * MIB, 0.0, 1000.0, 10.0 * MIB, backlog(0.5), None, false, false, NONE);
        assert_eq!(y.mode, AdaptiveMode::Healthy, "{y:?}");
        assert!(y.b_ln.is_infinite(), "{y:?}");
    }

    /// A busy device (the store's traffic at 75% of `D`) or busy clients:
    /// SILK's split of the calm budget (a third of `D`), and it holds for
    /// `hold` after the last busy cycle.
    #[test]
    fn contention_splits_the_calm_budget_silk_style_and_holds() {
        let p = policy();
        // The device: 50 of 60 MiB/s, light clients.
        let x = p.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(0.0), Some(0.0), true, false, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert!(x.busy);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (20.0, 4.0, 4.0));
        let x = p.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(0.0), Some(0.0), true, true, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (10.0, 10.0, 4.0));
        let x = p.compute(2.0 * MIB, 0.0, 1000.0, 50.0 * MIB, backlog(0.0), Some(0.0), false, false, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (4.0, 4.0, 20.0));
        // Busy clients on a quiet device.
        let x = p.compute(8.0 * MIB, 0.0, 5000.0, 8.0 * MIB, backlog(0.0), Some(0.0), false, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert!((x.b_l0 / MIB - 20.0).abs() < 1e-6);
        // A quiet cycle within `hold` of the last busy one stays contended.
        let hold = AdaptiveConfig::default().hold.as_secs_f64();
        let x = p.compute(2.0 * MIB, 0.0, 1000.0, 10.0 * MIB, backlog(0.0), Some(hold / 2.0), false, false, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert!(!x.busy);
    }

    /// The budget grows with the store's backlog from the calm third of `D`
    /// to all that clients leave, never above it.
    #[test]
    fn backlog_raises_the_budget_to_what_clients_leave() {
        let p = policy();
        // Clients use 10: left = 50; ramp from 0.25 to 0.75.
        for (pressure, budget) in [(0.0, 20.0), (0.25, 20.0), (0.5, 35.0), (0.75, 50.0), (0.85, 50.0)] {
            let x = p.compute(10.0 * MIB, 0.0, 5000.0, 60.0 * MIB, backlog(pressure), Some(0.0), false, true, NONE);
            assert_eq!(x.mode, AdaptiveMode::Contended, "{pressure}");
            assert!((x.budget_bps / MIB - budget).abs() < 1e-9, "pressure {pressure}: {x:?}");
            assert_eq!(x.b_l0, x.budget_bps);
        }
        // Clients take nearly all of D: the budget is the floor.
        let x = p.compute(58.0 * MIB, 0.0, 5000.0, 60.0 * MIB, backlog(0.0), Some(0.0), false, true, NONE);
        assert_eq!(x.budget_bps / MIB, 4.0);
    }

    /// A stall precursor (pressure at `promote_at`): flushes and L0
    /// compactions get all that clients leave even with no backlog; deep
    /// compactions wait at the floor. Pressed but not contended: everything
    /// unlimited.
    #[test]
    fn stall_precursor_promotes_flush_and_l0() {
        let p = policy();
        let at = AdaptiveConfig::default().promote_at;
        // Clients use 16: left = 44, all of it for flush and L0 (the calm
        // budget would be 20).
        let x = p.compute(16.0 * MIB, 0.0, 5000.0, 60.0 * MIB, l0(at), Some(0.0), true, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Promoted);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (22.0, 22.0, 4.0));
        let x = p.compute(16.0 * MIB, 0.0, 5000.0, 60.0 * MIB, l0(at), Some(0.0), false, true, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (4.0, 44.0, 4.0));
        let x = p.compute(16.0 * MIB, 0.0, 5000.0, 60.0 * MIB, l0(at * 0.99), Some(0.0), true, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        // Full memtables count as L0 files do ...
        let x =
            p.compute(16.0 * MIB, 0.0, 5000.0, 60.0 * MIB, Pressure::new(0.0, 1.0, 0.0), Some(0.0), true, false, NONE);
        assert_eq!(x.mode, AdaptiveMode::Promoted);
        // ... deep-level debt does not: it raises the budget instead.
        let x = p.compute(16.0 * MIB, 0.0, 5000.0, 60.0 * MIB, backlog(3.0), Some(0.0), true, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (22.0, 22.0, 4.0));
        let x = p.compute(1.0 * MIB, 0.0, 100.0, 10.0 * MIB, l0(at * 2.0), None, false, false, NONE);
        assert_eq!(x.mode, AdaptiveMode::Draining);
        assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite() && x.b_ln.is_infinite());
    }

    /// Heavy client writes: flushes and L0 compactions get `ingest_pace`
    /// times the write rate when the calm budget is less, never more than
    /// clients leave; deep compactions alone keep the calm budget, and light
    /// writes change nothing.
    #[test]
    fn heavy_writes_give_the_ingest_path_their_pace() {
        let p = Adaptive::new(&AdaptiveConfig { ingest_pace: 3.0, ..policy().config });
        // Clients: 14 MiB/s of traffic, 12 of it writes; left = 46, the
        // ingest path 36 (3 x 12) against a calm budget of 20.
        let x = p.compute(14.0 * MIB, 12.0 * MIB, 20000.0, 30.0 * MIB, backlog(0.0), Some(0.0), true, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Contended);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (18.0, 18.0, 4.0));
        let x = p.compute(14.0 * MIB, 12.0 * MIB, 20000.0, 30.0 * MIB, backlog(0.0), Some(0.0), true, false, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (36.0, 4.0, 4.0));
        // Only deep compactions run: the calm budget, not the ingest pace.
        let x = p.compute(14.0 * MIB, 12.0 * MIB, 20000.0, 30.0 * MIB, backlog(0.0), Some(0.0), false, false, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (4.0, 4.0, 20.0));
        // Capped at what clients leave: 20 MiB/s of writes, 40 left.
        let x = p.compute(20.0 * MIB, 20.0 * MIB, 20000.0, 30.0 * MIB, backlog(0.0), Some(0.0), false, true, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (4.0, 40.0, 4.0));
        // Light writes (2 MiB/s: 6 < 20): the calm budget.
        let x = p.compute(4.0 * MIB, 2.0 * MIB, 5000.0, 30.0 * MIB, backlog(0.0), Some(0.0), true, true, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (10.0, 10.0, 4.0));
        // Not contended: unlimited, whatever the writes.
        let x = p.compute(14.0 * MIB, 12.0 * MIB, 1000.0, 30.0 * MIB, backlog(0.0), None, true, true, NONE);
        assert_eq!(x.mode, AdaptiveMode::Healthy);
        assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite());
        // The pace off: the calm budget again.
        let off = Adaptive::new(&AdaptiveConfig { ingest_pace: 0.0, ..p.config.clone() });
        let x = off.compute(14.0 * MIB, 12.0 * MIB, 20000.0, 30.0 * MIB, backlog(0.0), Some(0.0), true, true, NONE);
        assert_eq!(mib((x.b_flush, x.b_l0, x.b_ln)), (10.0, 10.0, 4.0));
    }
    /// Clients that stall behind a deep compaction move fewer bytes: their
    /// demand (the remembered peak, decaying over `demand_memory`) still
    /// bounds what background work gets, so the compaction is not given
    /// the device that their stall seems to leave (on 2026-12-05 a
    /// write-peaks run had its clients move 2 MiB/s for 500 ms while an
    /// L5->L6 compaction was set 74 MiB/s of a 56 MiB/s read side).
    #[test]
    fn clients_that_stall_keep_their_demand() {
        let bw = |m: f64| kv_stage::units::Bandwidth::new(m * MIB).unwrap();
        let p = Adaptive::new(&AdaptiveConfig {
            device_bandwidth: bw(112.0),
            min_bandwidth: bw(4.0),
            read_bandwidth: Some(bw(56.0)),
            write_bandwidth: Some(bw(56.0)),
            demand_memory: std::time::Duration::from_secs(1),
            ..AdaptiveConfig::default()
        });
        let forget = Adaptive::new(&AdaptiveConfig { demand_memory: std::time::Duration::ZERO, ..p.config.clone() });
        let keep = (-0.01f64 / p.config.demand_memory.as_secs_f64()).exp();
        // 1 s of clients reading 30 and writing 10 MiB/s beside a deep
        // compaction (15 read, 15 written), then 500 ms in which they move
        // 1 MiB/s of each.
        let run = |keep: f64, cycles: usize| {
            let mut d = None;
            for cycle in 0..cycles {
                let fg = if cycle < 100 { [30.0, 10.0] } else { [1.0, 1.0] };
                let now = [fg[0] * MIB, fg[1] * MIB, 15.0 * MIB, 15.0 * MIB];
                d = Some(Directions::next(d, now, 0.05, keep));
            }
            d.unwrap()
        };
        let (before, stalled, forgotten) = (run(keep, 100), run(keep, 150), run(0.0, 150));
        // The demand decayed by e^-0.5 (to 61%), not to this cycle's 1 MiB/s.
        assert!((stalled.fg_read_demand_bps / MIB - 30.0 * (-0.5f64).exp()).abs() < 0.2, "{stalled:?}");
        assert!((stalled.fg_write_demand_bps / MIB - 10.0 * (-0.5f64).exp()).abs() < 0.1, "{stalled:?}");
        assert_eq!(stalled.fg_read_bps, MIB);
        // Pending bytes at 0.55 of RocksDB's soft limit, only the deep
        // compaction running.
        let x0 = p.compute(40.0 * MIB, 10.0 * MIB, 8000.0, 70.0 * MIB, backlog(0.55), Some(0.0), false, false, before);
        let x1 = p.compute(2.0 * MIB, 1.0 * MIB, 8000.0, 32.0 * MIB, backlog(0.55), Some(0.0), false, false, stalled);
        let x2 =
            forget.compute(2.0 * MIB, 1.0 * MIB, 8000.0, 32.0 * MIB, backlog(0.55), Some(0.0), false, false, forgotten);
        assert_eq!(
            (x0.mode, x1.mode, x2.mode),
            (AdaptiveMode::Contended, AdaptiveMode::Contended, AdaptiveMode::Contended)
        );
        // The budget: the calm third of D (37.3) and 60% of the way from it
        // to what clients leave (the ramp at pressure 0.55).
        let budget = |left: f64| 112.0 / 3.0 + 0.6 * (left - 112.0 / 3.0);
        // Before the stall clients leave the read room, (56 - 30) / 0.5 = 52.
        assert!((x0.b_ln / MIB - budget(52.0)).abs() < 1e-6, "{x0:?}");
        // In it, the room their remembered demand leaves, (56 - 18.2) / 0.5.
        let room = (56.0 - 30.0 * (-0.5f64).exp()) / 0.5;
        assert!((x1.b_ln / MIB - budget(room)).abs() < 0.5, "{x1:?}");
        // Judged by this cycle's traffic alone, the stall would hand the
        // compaction the budget of (56 - 1) / 0.5 = 110 MiB/s left.
        assert!((x2.b_ln / MIB - budget(110.0)).abs() < 1e-6, "{x2:?}");
    }

    /// A device that limits each direction (kernel `rbps` = `wbps`, 56 MiB/s
    /// of each for the store, `D` = 112): a cold start's client reads fill
    /// the read side with an L0 compaction (half reads). The read side
    /// makes the cycle busy though the total is below 75% of `D`, and the
    /// promoted L0 compaction gets what fits the read room clients leave
    /// (`(56 - 31) / 0.5` = 50), not `D - Fg` (80).
    #[test]
    fn a_limited_direction_bounds_the_budget_and_counts_as_busy() {
        let bw = |m: f64| kv_stage::units::Bandwidth::new(m * MIB).unwrap();
        let unbounded = Adaptive::new(&AdaptiveConfig {
            device_bandwidth: bw(112.0),
            min_bandwidth: bw(4.0),
            ..AdaptiveConfig::default()
        });
        let p = Adaptive::new(&AdaptiveConfig {
            read_bandwidth: Some(bw(56.0)),
            write_bandwidth: Some(bw(56.0)),
            ..unbounded.config.clone()
        });
        let cold = Directions {
            fg_read_bps: 31.0 * MIB,
            fg_write_bps: 1.0 * MIB,
            bg_read_bps: 14.0 * MIB,
            bg_write_bps: 14.0 * MIB,
            bg_read_share: 0.5,
            fg_read_demand_bps: 0.0,
            fg_write_demand_bps: 0.0,
        };
        let at = AdaptiveConfig::default().promote_at;
        // 60 of 112 MiB/s in total, 1,000 requests/s: busy only by its reads
        // (45 of 56).
        assert!(!unbounded.is_busy(1000.0, 60.0 * MIB, &cold));
        assert!(p.is_busy(1000.0, 60.0 * MIB, &cold));
        let x = p.compute(32.0 * MIB, 1.0 * MIB, 1000.0, 60.0 * MIB, l0(at), None, false, true, cold);
        assert!(x.busy && x.mode == AdaptiveMode::Promoted, "{x:?}");
        assert_eq!(mib((x.direction_left_bps, x.left_bps, x.b_l0)), (50.0, 50.0, 50.0));
        let x = unbounded.compute(32.0 * MIB, 1.0 * MIB, 1000.0, 60.0 * MIB, l0(at), Some(0.0), false, true, cold);
        assert!(x.direction_left_bps.is_infinite());
        assert_eq!(mib((x.left_bps, x.b_l0, x.b_ln)), (80.0, 80.0, 4.0));
        // Background that only writes (a flush): the read side does not
        // bound it; the write side does ((56 - 1) / 0.96).
        let flush = Directions { bg_read_share: 0.04, ..cold };
        let x = p.compute(32.0 * MIB, 1.0 * MIB, 1000.0, 60.0 * MIB, l0(at), Some(0.0), false, true, flush);
        assert!((x.direction_left_bps / MIB - 55.0 / 0.96).abs() < 1e-9, "{x:?}");
        // Clients fill the read side: the floor.
        let full = Directions { fg_read_bps: 60.0 * MIB, ..cold };
        let x = p.compute(61.0 * MIB, 1.0 * MIB, 1000.0, 90.0 * MIB, l0(at), Some(0.0), false, true, full);
        assert_eq!(mib((x.left_bps, x.b_l0, x.b_ln)), (4.0, 4.0, 4.0));
        // Quiet directions on a healthy store: no limit.
        let quiet = Directions { fg_read_bps: 2.0 * MIB, bg_read_bps: 5.0 * MIB, bg_write_bps: 5.0 * MIB, ..cold };
        let x = p.compute(3.0 * MIB, 1.0 * MIB, 1000.0, 13.0 * MIB, backlog(0.0), None, true, true, quiet);
        assert_eq!(x.mode, AdaptiveMode::Healthy, "{x:?}");
        assert!(x.b_flush.is_infinite() && x.b_l0.is_infinite() && x.b_ln.is_infinite());
    }
}
