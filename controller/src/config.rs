//! Controller configuration, in TOML with human units.
//!
//! ```toml
//! policy = "silk"            # adaptive | silk | max_min | proportional | static
//! interval = "10ms"          # default: 10ms for adaptive and silk, 1s for the others
//! log = "decisions.jsonl"    # optional: every cycle as a JSON line
//!
//! [silk]
//! kvs_bandwidth = "200MiB/s" # KVS_B: what the KV store may use in total
//! min_bandwidth = "10MiB/s"  # min_B: floor of every background flow
//! hysteresis = "10MiB/s"     # skip rate changes smaller than this
//!
//! [fair_share]               # for max_min, proportional and static
//! device_bandwidth = "1GiB/s"
//! [[fair_share.instance]]
//! name = "tf1"               # bound to a stage when the controller starts
//! demand = "256MiB/s"        # what the instance asks for ("unlimited": all it can get)
//! channel = "reads"          # the DRL that enforces the instance's rate
//! object = "drl"
//! ```
//!
//! Every value is checked when the controller starts; an invalid one is an
//! error naming its key (`silk.min_bandwidth`, `fair_share.instance[2].demand`).

use std::path::PathBuf;
use std::time::Duration;

use kv_stage::units::{Bandwidth, RateUnit};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::policy::{AdaptiveConfig, InstanceConfig, SilkConfig};

/// Which policy the controller runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// The default controller for RocksDB: unlimited while healthy, SILK's
    /// shares while the device is contended, flushes and L0 compactions
    /// promoted as a stall nears ([`crate::Adaptive`]).
    Adaptive,
    /// SILK's scheduling for LSM key-value stores (Paio Algorithm 1).
    Silk,
    /// Max-min fair share over instances (Paio Algorithm 2), work-conserving.
    MaxMin,
    /// Demands first, then leftover in proportion to demand.
    Proportional,
    /// Each instance at its demand, never redistributed (blkio-style).
    Static,
}

/// Parameters of the fair-share policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FairShareConfig {
    /// `Max_B`: the device's bandwidth.
    pub device_bandwidth: Bandwidth,
    /// The instances (more can join at run time).
    #[serde(default, rename = "instance")]
    pub instances: Vec<InstanceConfig>,
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// The policy.
    pub policy: PolicyKind,
    /// Time between cycles (default 10 ms for SILK, 1 s otherwise).
    #[serde(default, with = "kv_stage::units::opt_duration_str", skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Where to append the decision log as JSON lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<PathBuf>,
    /// SILK's parameters (used when `policy = "silk"`).
    #[serde(default)]
    pub silk: SilkConfig,
    /// The default controller's parameters (used when `policy = "adaptive"`).
    #[serde(default)]
    pub adaptive: AdaptiveConfig,
    /// Fair-share parameters (required for the other policies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<FairShareConfig>,
}

impl ControllerConfig {
    /// A SILK configuration with the given parameters.
    pub fn silk(silk: SilkConfig) -> Self {
        ControllerConfig {
            policy: PolicyKind::Silk,
            interval: None,
            log: None,
            silk,
            adaptive: AdaptiveConfig::default(),
            fair_share: None,
        }
    }

    /// The default controller with the given parameters.
    pub fn adaptive(adaptive: AdaptiveConfig) -> Self {
        ControllerConfig {
            policy: PolicyKind::Adaptive,
            interval: None,
            log: None,
            silk: SilkConfig::default(),
            adaptive,
            fair_share: None,
        }
    }

    /// Whether the policy drives one store's background flows (SILK, the
    /// default controller) rather than instances' shares of a device.
    pub fn is_store_policy(&self) -> bool {
        matches!(self.policy, PolicyKind::Silk | PolicyKind::Adaptive)
    }

    /// A fair-share configuration.
    pub fn fair_share(policy: PolicyKind, fair_share: FairShareConfig) -> Self {
        ControllerConfig {
            policy,
            interval: None,
            log: None,
            silk: SilkConfig::default(),
            adaptive: AdaptiveConfig::default(),
            fair_share: Some(fair_share),
        }
    }

    /// Parses TOML; errors name the key (`toml` reports line and column).
    pub fn from_toml(text: &str) -> Result<Self> {
        let c: ControllerConfig = toml::from_str(text).map_err(|e| {
            Error::Config(kv_stage::FieldError::new(
                e.span().map(|s| key_at(text, s.start)).unwrap_or_else(|| "config".into()),
                e.message(),
            ))
        })?;
        c.validate()?;
        Ok(c)
    }

    /// The interval in effect.
    pub fn effective_interval(&self) -> Duration {
        self.interval.unwrap_or(match self.policy {
            PolicyKind::Silk | PolicyKind::Adaptive => Duration::from_millis(10),
            _ => Duration::from_secs(1),
        })
    }

    /// Checks every value, naming the key of the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::config("interval", "must be greater than zero"));
        }
        match self.policy {
            PolicyKind::Adaptive => {
                let a = &self.adaptive;
                if a.min_bandwidth > a.device_bandwidth {
                    return Err(Error::config(
                        "adaptive.min_bandwidth",
                        format!("{} is above adaptive.device_bandwidth {}", a.min_bandwidth, a.device_bandwidth),
                    ));
                }
                if a.device_bandwidth.bytes_per_sec().is_infinite() {
                    return Err(Error::config("adaptive.device_bandwidth", "must be a finite bandwidth"));
                }
                if !(a.busy_share.is_finite() && a.busy_share > 0.0) {
                    return Err(Error::config("adaptive.busy_share", format!("must be above 0 (is {})", a.busy_share)));
                }
                if !(a.busy_foreground_ops.is_finite() && a.busy_foreground_ops >= 0.0) {
                    return Err(Error::config(
                        "adaptive.busy_foreground_ops",
                        format!("must be 0 or more (is {})", a.busy_foreground_ops),
                    ));
                }
                if !(a.calm_share.is_finite() && a.calm_share > 0.0 && a.calm_share <= 1.0) {
                    return Err(Error::config(
                        "adaptive.calm_share",
                        format!("must be above 0 and at most 1 (is {})", a.calm_share),
                    ));
                }
                if !(a.ramp_from.is_finite() && a.ramp_to.is_finite() && a.ramp_from >= 0.0 && a.ramp_from < a.ramp_to)
                {
                    return Err(Error::config(
                        "adaptive.ramp_from",
                        format!("needs 0 <= ramp_from < ramp_to (ramp_from {}, ramp_to {})", a.ramp_from, a.ramp_to),
                    ));
                }
                if !(a.ingest_pace.is_finite() && a.ingest_pace >= 0.0) {
                    return Err(Error::config(
                        "adaptive.ingest_pace",
                        format!("must be a number of at least 0 (is {})", a.ingest_pace),
                    ));
                }
                if !(a.promote_at.is_finite() && a.promote_at > 0.0) {
                    return Err(Error::config("adaptive.promote_at", format!("must be above 0 (is {})", a.promote_at)));
                }
            }
            PolicyKind::Silk => {
                if self.silk.min_bandwidth > self.silk.kvs_bandwidth {
                    return Err(Error::config(
                        "silk.min_bandwidth",
                        format!("{} is above silk.kvs_bandwidth {}", self.silk.min_bandwidth, self.silk.kvs_bandwidth),
                    ));
                }
                let h = self.silk.hysteresis;
                if h.unit() != RateUnit::Bytes || h.is_unlimited() {
                    return Err(Error::config("silk.hysteresis", "must be a finite bandwidth such as \"10MiB/s\""));
                }
                if let Some(p) = &self.silk.pressure {
                    if p.calm_bandwidth > self.silk.kvs_bandwidth {
                        return Err(Error::config(
                            "silk.pressure.calm_bandwidth",
                            format!("{} is above silk.kvs_bandwidth {}", p.calm_bandwidth, self.silk.kvs_bandwidth),
                        ));
                    }
                    if !(p.from.is_finite() && p.to.is_finite() && p.from >= 0.0 && p.from < p.to) {
                        return Err(Error::config(
                            "silk.pressure",
                            format!("needs 0 <= from < to (from {}, to {})", p.from, p.to),
                        ));
                    }
                }
            }
            _ => {
                let fs = self
                    .fair_share
                    .as_ref()
                    .ok_or_else(|| Error::config("fair_share", "is required by this policy"))?;
                let mut names = std::collections::HashSet::new();
                for (i, inst) in fs.instances.iter().enumerate() {
                    let key = |f: &str| format!("fair_share.instance[{i}].{f}");
                    if inst.name.is_empty() {
                        return Err(Error::config(&key("name"), "must not be empty"));
                    }
                    if !names.insert(inst.name.as_str()) {
                        return Err(Error::config(&key("name"), format!("'{}' is used twice", inst.name)));
                    }
                    if inst.demand.unit() != RateUnit::Bytes {
                        return Err(Error::config(&key("demand"), "must be a bandwidth in bytes per second"));
                    }
                    if !inst.demand.is_unlimited() && inst.demand.per_sec() <= 0.0 {
                        return Err(Error::config(&key("demand"), "must be greater than zero"));
                    }
                    if inst.channel.is_empty() || inst.object.is_empty() {
                        return Err(Error::config(&key("channel"), "channel and object must name the instance's DRL"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Names the key at byte `at` of a TOML text as `table.key (line N)`, from
/// the nearest table header above it and the `key =` on its line.
fn key_at(text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let line_no = text[..at].matches('\n').count() + 1;
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    let key = line.split_once('=').map(|(k, _)| k.trim().trim_matches('"').to_owned());
    let name = match (table, key) {
        (Some(t), Some(k)) if !line.trim_start().starts_with('[') => format!("{t}.{k}"),
        (None, Some(k)) => k,
        (Some(t), _) => t,
        (None, None) => "config".to_owned(),
    };
    format!("{name} (line {line_no})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silk_config_parses_with_units() {
        let c = ControllerConfig::from_toml(
            "policy = \"silk\"\ninterval = \"20ms\"\n[silk]\nkvs_bandwidth = \"100MiB/s\"\nmin_bandwidth = \"5MiB/s\"\nhysteresis = \"1MiB/s\"\n",
        )
        .unwrap();
        assert_eq!(c.effective_interval(), Duration::from_millis(20));
        assert_eq!(c.silk.kvs_bandwidth.bytes_per_sec(), 100.0 * 1048576.0);
        let d = ControllerConfig::from_toml("policy = \"silk\"\n").unwrap();
        assert_eq!(d.effective_interval(), Duration::from_millis(10));
        assert_eq!(d.silk, SilkConfig::default());
        let p = ControllerConfig::from_toml(
            "policy = \"silk\"\n[silk]\nkvs_bandwidth = \"60MiB/s\"\n[silk.pressure]\ncalm_bandwidth = \"20MiB/s\"\n",
        )
        .unwrap();
        let pc = p.silk.pressure.unwrap();
        assert_eq!((pc.calm_bandwidth.bytes_per_sec(), pc.from, pc.to), (20.0 * 1048576.0, 0.25, 0.75));
        for (toml, key) in [
            ("calm_bandwidth = \"90MiB/s\"", "silk.pressure.calm_bandwidth"),
            ("calm_bandwidth = \"9MiB/s\"\nfrom = 0.8\nto = 0.5", "silk.pressure"),
        ] {
            let e = ControllerConfig::from_toml(&format!(
                "policy = \"silk\"\n[silk]\nkvs_bandwidth = \"60MiB/s\"\n[silk.pressure]\n{toml}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn shipped_example_configs_parse() {
        let silk = ControllerConfig::from_toml(include_str!("../examples/configs/silk.toml")).unwrap();
        assert_eq!(silk.policy, PolicyKind::Silk);
        assert_eq!(silk.silk, SilkConfig::default());
        let adaptive = ControllerConfig::from_toml(include_str!("../examples/configs/adaptive.toml")).unwrap();
        assert_eq!(adaptive.policy, PolicyKind::Adaptive);
        assert_eq!(adaptive.adaptive, AdaptiveConfig::default());
        assert_eq!(adaptive.effective_interval(), Duration::from_millis(10));
        // The per-direction keys, commented out in the example.
        let directed = ControllerConfig::from_toml(
            "policy = \"adaptive\"\n[adaptive]\nread_bandwidth = \"56MiB/s\"\nwrite_bandwidth = \"28MiB/s\"\nidle_interval = \"1s\"\ndemand_memory = \"750ms\"\ndeep_at_floor = true\n",
        )
        .unwrap();
        assert!(directed.adaptive.deep_at_floor);
        assert_eq!(directed.adaptive.idle_interval, Duration::from_secs(1));
        assert_eq!(directed.adaptive.demand_memory, Duration::from_millis(750));
        assert_eq!(
            ControllerConfig::from_toml("policy = \"adaptive\"\n").unwrap().adaptive.demand_memory,
            Duration::ZERO
        );
        let mib = |b: Option<kv_stage::units::Bandwidth>| b.map(|b| b.bytes_per_sec() / 1048576.0);
        assert_eq!(mib(directed.adaptive.read_bandwidth), Some(56.0));
        assert_eq!(mib(directed.adaptive.write_bandwidth), Some(28.0));
        let fair = ControllerConfig::from_toml(include_str!("../examples/configs/fair_share.toml")).unwrap();
        assert_eq!(fair.policy, PolicyKind::MaxMin);
        assert_eq!(fair.effective_interval(), Duration::from_secs(1));
        let fs = fair.fair_share.unwrap();
        assert_eq!(fs.instances.len(), 3);
        assert!(fs.instances[2].demand.is_unlimited());
    }

    #[test]
    fn invalid_values_name_their_key() {
        let cases = [
            ("policy = \"silk\"\n[silk]\nkvs_bandwidth = 0\n", "silk.kvs_bandwidth"),
            (
                "policy = \"silk\"\n[silk]\nkvs_bandwidth = \"10MiB/s\"\nmin_bandwidth = \"20MiB/s\"\n",
                "silk.min_bandwidth",
            ),
            ("policy = \"silk\"\ninterval = \"0ms\"\n", "interval"),
            (
                "policy = \"adaptive\"\n[adaptive]\ndevice_bandwidth = \"10MiB/s\"\nmin_bandwidth = \"20MiB/s\"\n",
                "adaptive.min_bandwidth",
            ),
            ("policy = \"adaptive\"\n[adaptive]\ndevice_bandwidth = \"unlimited\"\n", "adaptive.device_bandwidth"),
            ("policy = \"adaptive\"\n[adaptive]\nbusy_share = -1.0\n", "adaptive.busy_share"),
            ("policy = \"adaptive\"\n[adaptive]\nbusy_foreground_ops = -3.0\n", "adaptive.busy_foreground_ops"),
            ("policy = \"adaptive\"\n[adaptive]\npromote_at = 0.0\n", "adaptive.promote_at"),
            ("policy = \"adaptive\"\n[adaptive]\ningest_pace = -1.0\n", "adaptive.ingest_pace"),
            ("policy = \"adaptive\"\n[adaptive]\nhold = \"soon\"\n", "adaptive.hold"),
            ("policy = \"max_min\"\n", "fair_share"),
            ("policy = \"max_min\"\n[fair_share]\ndevice_bandwidth = \"unlimited\"\n", "fair_share.device_bandwidth"),
            (
                "policy = \"static\"\n[fair_share]\ndevice_bandwidth = \"1GiB/s\"\n[[fair_share.instance]]\nname = \"a\"\ndemand = 0\nchannel = \"c\"\nobject = \"o\"\n",
                "fair_share.instance[0].demand",
            ),
            (
                "policy = \"static\"\n[fair_share]\ndevice_bandwidth = \"1GiB/s\"\n[[fair_share.instance]]\nname = \"a\"\ndemand = 1\nchannel = \"c\"\nobject = \"o\"\n[[fair_share.instance]]\nname = \"a\"\ndemand = 1\nchannel = \"c\"\nobject = \"o\"\n",
                "fair_share.instance[1].name",
            ),
        ];
        for (text, key) in cases {
            let e = ControllerConfig::from_toml(text).unwrap_err();
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let e = ControllerConfig::from_toml("policy = \"silk\"\n[silk]\nkvs = 1\n").unwrap_err();
        assert!(e.to_string().contains("kvs"), "{e}");
        // A value of the wrong form is reported at its key and line.
        let e = ControllerConfig::from_toml("policy = \"silk\"\n[silk]\nmin_bandwidth = \"fast\"\n").unwrap_err();
        assert!(e.to_string().contains("silk.min_bandwidth (line 3)"), "{e}");
        let e = ControllerConfig::from_toml("policy = \"fastest\"\n").unwrap_err();
        assert!(e.to_string().contains("policy (line 1)"), "{e}");
    }
}
