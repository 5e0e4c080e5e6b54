//! The policies' parameters: what SILK, SILK with pressure, the default
//! controller and the fair-share policies take, with their defaults and
//! their TOML form. They live on the policy side so a policy needs nothing
//! of the controller's configuration file; `config` reads them from a file
//! and checks them (every error naming its key).

use std::time::Duration;

use kv_stage::units::{Bandwidth, Rate};
use serde::{Deserialize, Serialize};

/// SILK's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SilkConfig {
    /// `KVS_B`: the bandwidth the key-value store may use in total.
    #[serde(default = "SilkConfig::default_kvs")]
    pub kvs_bandwidth: Bandwidth,
    /// `min_B`: the floor every background flow keeps.
    #[serde(default = "SilkConfig::default_min")]
    pub min_bandwidth: Bandwidth,
    /// Rate changes smaller than this are skipped.
    #[serde(default = "SilkConfig::default_hysteresis")]
    pub hysteresis: Rate,
    /// SILK with pressure: the background budget slides between a calm
    /// level and SILK's `left_B` with the store's pressure (see
    /// [`PressureConfig`]). `None`: SILK as published.
    #[serde(default)]
    pub pressure: Option<PressureConfig>,
}

/// SILK with the store's pressure as an extra input.
///
/// SILK hands background work all the bandwidth clients leave over
/// (`left_B = KVS_B - client rate`), whether or not the store needs it
/// now. With pressure, the budget the branch hands out is
///
/// `budget = calm + (left_B - calm) * ramp(pressure)`,
///
/// capped at `left_B`, where `ramp` is 0 at or below `from`, 1 at or above
/// `to`, linear between: a store with no backlog gets `calm` (no more
/// background bursts than it needs, so clients keep headroom); one heading
/// for a write stall gets everything SILK would give. Which flows get the
/// budget (flushes and L0->L1 first, higher levels last) is SILK's.
/// Without a pressure reading (a handle that does not report it) the policy
/// is plain SILK.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PressureConfig {
    /// The background budget with no pressure.
    pub calm_bandwidth: Bandwidth,
    /// Pressure at which the budget starts to grow (default 0.25).
    #[serde(default = "PressureConfig::default_from")]
    pub from: f64,
    /// Pressure at which the budget is SILK's whole `left_B` (default 0.75).
    #[serde(default = "PressureConfig::default_to")]
    pub to: f64,
}

impl PressureConfig {
    fn default_from() -> f64 {
        0.25
    }
    fn default_to() -> f64 {
        0.75
    }

    /// `calm` with the default ramp (0.25 to 0.75).
    pub fn new(calm_bandwidth: Bandwidth) -> Self {
        PressureConfig { calm_bandwidth, from: Self::default_from(), to: Self::default_to() }
    }

    /// 0 at or below `from`, 1 at or above `to`.
    pub fn ramp(&self, pressure: f64) -> f64 {
        super::ramp(pressure, self.from, self.to)
    }
}

impl SilkConfig {
    fn default_kvs() -> Bandwidth {
        Bandwidth::new(200.0 * 1048576.0).expect("constant")
    }
    fn default_min() -> Bandwidth {
        Bandwidth::new(10.0 * 1048576.0).expect("constant")
    }
    fn default_hysteresis() -> Rate {
        Rate::from_bytes_per_sec(10.0 * 1048576.0).expect("constant")
    }
}

impl Default for SilkConfig {
    /// SILK's prototype values: `KVS_B` 200 MiB/s, `min_B` 10 MiB/s,
    /// changes under 10 MiB/s skipped.
    fn default() -> Self {
        SilkConfig {
            kvs_bandwidth: Self::default_kvs(),
            min_bandwidth: Self::default_min(),
            hysteresis: Self::default_hysteresis(),
            pressure: None,
        }
    }
}

/// The default controller's parameters ([`crate::Adaptive`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveConfig {
    /// `D`: the bandwidth the store may use of its device in total (what
    /// SILK calls `KVS_B`); background work gets `D - Fg` while the device
    /// is contended.
    #[serde(default = "AdaptiveConfig::default_device")]
    pub device_bandwidth: Bandwidth,
    /// `min_B`: the floor of a held-back background flow.
    #[serde(default = "AdaptiveConfig::default_min")]
    pub min_bandwidth: Bandwidth,
    /// The device counts as busy when the store's traffic (every context)
    /// is at least this share of `device_bandwidth` ...
    #[serde(default = "AdaptiveConfig::default_busy_share")]
    pub busy_share: f64,
    /// ... while clients make at least this many foreground requests per
    /// second.
    #[serde(default = "AdaptiveConfig::default_busy_ops")]
    pub busy_foreground_ops: f64,
    /// Contention lasts this long after the last busy cycle.
    #[serde(default = "AdaptiveConfig::default_hold", with = "kv_stage::units::duration_str")]
    pub hold: Duration,
    /// While contended, background work gets `calm_share * device_bandwidth`
    /// when the store has no backlog ...
    #[serde(default = "AdaptiveConfig::default_calm_share")]
    pub calm_share: f64,
    /// ... and more from this store pressure on ...
    #[serde(default = "AdaptiveConfig::default_ramp_from")]
    pub ramp_from: f64,
    /// ... up to all that clients leave (`device_bandwidth - Fg`) at this
    /// pressure.
    #[serde(default = "AdaptiveConfig::default_ramp_to")]
    pub ramp_to: f64,
    /// Store pressure at which flushes and L0 compactions are unlimited even
    /// while the device is contended (1: RocksDB starts to slow writes).
    #[serde(default = "AdaptiveConfig::default_promote_at")]
    pub promote_at: f64,
    /// While contended, flushes and L0->L1 compactions get at least this
    /// many times the clients' file writes (in RocksDB, the write-ahead log:
    /// the bytes they must keep pace with), up to all that clients leave;
    /// 0 turns the floor off.
    #[serde(default = "AdaptiveConfig::default_ingest_pace")]
    pub ingest_pace: f64,
    /// For a device that limits reads on their own (a cgroup's `rbps`, a
    /// cloud volume's read cap): what the store may use of its reads.
    /// While contended, background work then gets no more than fits the
    /// read room clients leave, `read_bandwidth - Fg_read`, at the share of
    /// its bytes that are reads; and a cycle is busy when the store's
    /// reads reach `busy_share` of it. `None` (the default): the device
    /// serves reads and writes from `device_bandwidth` alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bandwidth: Option<Bandwidth>,
    /// The same for writes (a cgroup's `wbps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bandwidth: Option<Bandwidth>,
    /// How long the loop may sleep between cycles while every instance is
    /// healthy and runs no flush or compaction: the start of a job wakes
    /// it at once (on stages that report job starts to the controller, as
    /// a stage in its own process does), so nothing that needs a limit
    /// can begin unseen. At most one cycle per `idle_interval` reads the
    /// store in calm hours, instead of one per `interval`. Not below the
    /// controller's `interval` (a smaller value is the interval).
    #[serde(default = "AdaptiveConfig::default_idle_interval", with = "kv_stage::units::duration_str")]
    pub idle_interval: Duration,
    /// How long the clients' recent file traffic still counts as their
    /// demand when the policy sets what background work may use: the
    /// demand, per direction, is the larger of this cycle's traffic and the
    /// recent peak, decaying with this time constant. Clients that wait
    /// behind background I/O move fewer bytes; judged by this cycle's
    /// traffic alone, `D - Fg` would then grow and give background work
    /// more of the device, which stalls the clients further. `0s` (the
    /// default): this cycle's traffic only, as SILK measures it. Off by
    /// default: in its one side-by-side write-peaks run, 1 s did not bring
    /// the default nearer its target (results/write-peaks-kernel-2026-12-05d).
    #[serde(default = "AdaptiveConfig::default_demand_memory", with = "kv_stage::units::duration_str")]
    pub demand_memory: Duration,
    /// While contended, compactions below L1 stay at `min_bandwidth` even
    /// when no flush or L0 compaction runs: SILK's order taken further,
    /// the deepest work waits until the clients leave. Store pressure does
    /// not lift this floor, so the backlog it leaves is paid in quiet
    /// moments only. `false` (the default): while the ingest path is idle
    /// they get the contended budget.
    #[serde(default)]
    pub deep_at_floor: bool,
}

impl AdaptiveConfig {
    fn default_device() -> Bandwidth {
        Bandwidth::new(200.0 * 1048576.0).expect("constant")
    }
    fn default_min() -> Bandwidth {
        Bandwidth::new(10.0 * 1048576.0).expect("constant")
    }
    fn default_busy_share() -> f64 {
        0.75
    }
    fn default_busy_ops() -> f64 {
        2000.0
    }
    fn default_hold() -> Duration {
        Duration::from_millis(500)
    }
    fn default_idle_interval() -> Duration {
        Duration::from_millis(100)
    }
    fn default_demand_memory() -> Duration {
        Duration::ZERO
    }
    fn default_promote_at() -> f64 {
        0.9
    }
    fn default_ingest_pace() -> f64 {
        // Off: with 3 (a flush writes each byte once, an L0->L1
        // compaction reads it and writes it again) write-peaks measured no
        // gain side by side (results/write-peaks-ingest-pace-2026-12-03).
        0.0
    }
    fn default_calm_share() -> f64 {
        1.0 / 3.0
    }
    fn default_ramp_from() -> f64 {
        0.25
    }
    fn default_ramp_to() -> f64 {
        0.75
    }

    /// 0 at or below `ramp_from`, 1 at or above `ramp_to`, linear between.
    pub fn ramp(&self, pressure: f64) -> f64 {
        super::ramp(pressure, self.ramp_from, self.ramp_to)
    }
}

impl Default for AdaptiveConfig {
    /// A 200 MiB/s budget with a 10 MiB/s floor (SILK's prototype values);
    /// busy at 75% of it or with 2,000 client requests/s; 500 ms hold; a
    /// third of the budget with no backlog, all that clients leave from
    /// pressure 0.75; promotion at pressure 0.9; no ingest floor; no
    /// per-direction limits; 100 ms between cycles while healthy and idle;
    /// the clients' demand judged by each cycle's traffic alone.
    fn default() -> Self {
        AdaptiveConfig {
            device_bandwidth: Self::default_device(),
            min_bandwidth: Self::default_min(),
            busy_share: Self::default_busy_share(),
            busy_foreground_ops: Self::default_busy_ops(),
            hold: Self::default_hold(),
            calm_share: Self::default_calm_share(),
            ramp_from: Self::default_ramp_from(),
            ramp_to: Self::default_ramp_to(),
            promote_at: Self::default_promote_at(),
            ingest_pace: Self::default_ingest_pace(),
            read_bandwidth: None,
            write_bandwidth: None,
            idle_interval: Self::default_idle_interval(),
            demand_memory: Self::default_demand_memory(),
            deep_at_floor: false,
        }
    }
}

/// One instance of a fair-share policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceConfig {
    /// Name the instance is bound by when the controller starts.
    pub name: String,
    /// What it asks for (bytes/s); `"unlimited"` asks for all it can get.
    pub demand: Rate,
    /// Channel of the DRL that enforces the instance's rate.
    pub channel: String,
    /// That DRL's object id.
    pub object: String,
}
