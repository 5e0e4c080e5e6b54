//! Human units for configuration: byte quantities (`"8Mi"`, `"64MiB"`), rates
//! (`"200MiB/s"`, `"1000ops/s"`, `"unlimited"`) and durations (`"10ms"`).
//!
//! Configuration files speak in these units; everything inside the stage works
//! in machine units (tokens as `f64`, nanoseconds as `u64`). Parsing is strict:
//! a negative, non-finite or unit-less value where a unit is required is an
//! error that quotes the offending text.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// Why a unit string could not be parsed. The message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnitError(pub String);

fn err<T>(msg: String) -> Result<T, UnitError> {
    Err(UnitError(msg))
}

/// Splits `"12.5 MiB"` into `("12.5", "MiB")`.
fn split_number(s: &str) -> (&str, &str) {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == '_'))
        .map_or(s.len(), |(i, _)| i);
    // Allow an exponent such as `1e6` only when followed by digits.
    let (num, rest) = s.split_at(end);
    if let Some(exp) = rest.strip_prefix(['e', 'E']) {
        let digits = exp
            .char_indices()
            .find(|&(i, c)| !(c.is_ascii_digit() || (i == 0 && (c == '-' || c == '+'))))
            .map_or(exp.len(), |(i, _)| i);
        if digits > 0 && exp[..digits].chars().any(|c| c.is_ascii_digit()) {
            let cut = end + 1 + digits;
            return (s[..cut].trim(), s[cut..].trim());
        }
    }
    (num.trim(), rest.trim())
}

fn parse_number(num: &str, whole: &str) -> Result<f64, UnitError> {
    if num.is_empty() {
        return err(format!("'{whole}' does not start with a number"));
    }
    let cleaned: String = num.chars().filter(|&c| c != '_').collect();
    let v: f64 = cleaned.parse().map_err(|_| UnitError(format!("'{whole}' does not start with a valid number")))?;
    if !v.is_finite() {
        return err(format!("'{whole}' is not a finite number"));
    }
    if v < 0.0 {
        return err(format!("'{whole}' is negative"));
    }
    Ok(v)
}

/// Size prefixes as a rate must spell them (`k` is accepted for `K`):
/// SI (`K` = 1000) and binary (`Ki` = 1024).
const PREFIXES: [(&str, f64); 9] = [
    ("", 1.0),
    ("K", 1e3),
    ("M", 1e6),
    ("G", 1e9),
    ("T", 1e12),
    ("Ki", 1024.0),
    ("Mi", 1024.0 * 1024.0),
    ("Gi", 1024.0 * 1024.0 * 1024.0),
    ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
];

/// Multiplier of a byte-size suffix: one of [`PREFIXES`], with or without a
/// trailing `B`, case-insensitive.
fn byte_multiplier(suffix: &str) -> Option<f64> {
    let s = suffix.strip_suffix(['b', 'B']).unwrap_or(suffix);
    PREFIXES.iter().find(|(p, _)| p.eq_ignore_ascii_case(s)).map(|&(_, m)| m)
}

/// Parses a byte quantity such as `"8Mi"`, `"64MiB"`, `"1.5G"` or `"4096"`.
pub fn parse_bytes(s: &str) -> Result<f64, UnitError> {
    let (num, suffix) = split_number(s);
    let v = parse_number(num, s)?;
    match byte_multiplier(suffix) {
        Some(m) => Ok(v * m),
        None => err(format!(
            "'{s}' has an unknown size unit '{suffix}' (use B, K, M, G, T, Ki, Mi, Gi, Ti, optionally followed by B)"
        )),
    }
}

/// Formats a byte count with the largest unit that divides it exactly.
pub fn format_bytes(v: f64) -> String {
    if v.fract() == 0.0 && v >= 1.0 {
        for (unit, m) in [
            ("TiB", 1024f64.powi(4)),
            ("GiB", 1024f64.powi(3)),
            ("MiB", 1024f64.powi(2)),
            ("KiB", 1024.0),
            ("TB", 1e12),
            ("GB", 1e9),
            ("MB", 1e6),
            ("KB", 1e3),
        ] {
            if v >= m && (v / m).fract() == 0.0 {
                return format!("{}{unit}", v / m);
            }
        }
    }
    format!("{v}B")
}

/// What a rate counts: bytes or requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateUnit {
    /// Bytes per second: a request costs its size in bytes.
    Bytes,
    /// Operations per second: every request costs one token, whatever its size.
    Ops,
}

/// A rate: bytes/s or ops/s, finite and non-negative, or unlimited.
///
/// Text forms: `"64MiB/s"`, `"12MB/s"`, `"1000ops/s"`, `"1000iops"`,
/// `"unlimited"` (or `"max"`, as in `io.max`). A bare number (`4096`)
/// means bytes per second. Units are spelled exactly: a size without `/s`
/// (`"64MiB"`) and a lowercase `b` (`"64mb/s"`, bits elsewhere) are
/// refused with the accepted forms. (Where a key already says "per
/// second", as a QoS object's `rbps`, a size is read as that much per
/// second.) `0` is a valid rate and
/// means *closed*: requests wait until the rate changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_sec: f64,
    unit: RateUnit,
}

impl Rate {
    /// No limit (bytes).
    pub const UNLIMITED: Rate = Rate { per_sec: f64::INFINITY, unit: RateUnit::Bytes };

    /// A rate in bytes per second. Fails when negative or not finite.
    pub fn from_bytes_per_sec(v: f64) -> Result<Self, UnitError> {
        Self::new(v, RateUnit::Bytes)
    }

    /// A rate in operations per second. Fails when negative or not finite.
    pub fn from_ops_per_sec(v: f64) -> Result<Self, UnitError> {
        Self::new(v, RateUnit::Ops)
    }

    /// A rate of `v` tokens per second in `unit`.
    pub fn new(v: f64, unit: RateUnit) -> Result<Self, UnitError> {
        if v.is_nan() || v.is_infinite() {
            return err(format!("rate {v} is not finite (write \"unlimited\" for no limit)"));
        }
        if v < 0.0 {
            return err(format!("rate {v} is negative"));
        }
        Ok(Rate { per_sec: v, unit })
    }

    /// An unlimited rate in `unit`.
    pub const fn unlimited(unit: RateUnit) -> Self {
        Rate { per_sec: f64::INFINITY, unit }
    }

    /// Tokens per second (`f64::INFINITY` when unlimited).
    pub fn per_sec(self) -> f64 {
        self.per_sec
    }

    /// Whether the rate counts bytes or operations.
    pub fn unit(self) -> RateUnit {
        self.unit
    }

    /// True when there is no limit.
    pub fn is_unlimited(self) -> bool {
        self.per_sec.is_infinite()
    }
}

impl FromStr for Rate {
    type Err = UnitError;

    fn from_str(s: &str) -> Result<Self, UnitError> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("unlimited") || t == "max" {
            return Ok(Rate::UNLIMITED);
        }
        if t.eq_ignore_ascii_case("unlimited ops/s") || t.eq_ignore_ascii_case("unlimited_ops") {
            return Ok(Rate::unlimited(RateUnit::Ops));
        }
        let (num, suffix) = split_number(t);
        let v = parse_number(num, s)?;
        let unit = suffix.replace(' ', "");
        if matches!(unit.to_ascii_lowercase().as_str(), "ops/s" | "op/s" | "iops" | "ops") {
            return Rate::from_ops_per_sec(v);
        }
        // A bare number is bytes per second.
        if unit.is_empty() {
            return Rate::from_bytes_per_sec(v);
        }
        let size = match (unit.strip_suffix("/s"), unit.strip_suffix("Bps")) {
            (Some(size), _) => size.to_owned(),
            (None, Some(prefix)) => format!("{prefix}B"),
            (None, None) if rate_multiplier(&unit).is_ok() => {
                return err(format!("'{s}' is a size, not a rate: write '{num}{unit}/s' ({RATE_FORMS})"));
            }
            (None, None) => return err(format!("'{s}' is not a rate ({RATE_FORMS})")),
        };
        match rate_multiplier(&size) {
            Ok(m) => Rate::from_bytes_per_sec(v * m),
            Err(why) => err(format!("'{s}': {why} ({RATE_FORMS})")),
        }
    }
}

/// The forms a rate is written in, for error messages.
const RATE_FORMS: &str = "accepted: \"64MiB/s\" (2^20 B/s), \"12MB/s\" (10^6 B/s), \"512KiB/s\", \"4096\" (bytes/s), \"1000ops/s\", \"unlimited\"";

/// The multiplier of a rate's size unit, spelled exactly: an optional
/// prefix (`k` or `K` = 10^3, `M`, `G`, `T`; `Ki`, `Mi`, `Gi`, `Ti`) and an
/// optional `B`. Stricter than sizes: a lowercase `b` reads as bits and a
/// lowercase `m` as milli elsewhere, so both are refused, not guessed.
fn rate_multiplier(unit: &str) -> Result<f64, String> {
    if unit.ends_with('b') {
        return Err(format!("unit '{unit}': a lowercase b means bits; write B for bytes (MB = 10^6 B, MiB = 2^20 B)"));
    }
    let prefix = unit.strip_suffix('B').unwrap_or(unit);
    let prefix = if prefix == "k" { "K" } else { prefix };
    PREFIXES
        .iter()
        .find(|(p, _)| *p == prefix)
        .map(|&(_, m)| m)
        .ok_or_else(|| format!("unknown unit '{unit}' (prefixes k, K, M, G, T, Ki, Mi, Gi, Ti, then B)"))
}

/// A per-second limit where the key already says "per second" (a QoS
/// object's `rbps = "8Mi"`, as in `io.max`): a rate, or a size read as
/// that much per second.
pub(crate) fn per_second(s: &str) -> Result<Rate, UnitError> {
    s.parse::<Rate>().or_else(|e| parse_bytes(s).map_or(Err(e), Rate::from_bytes_per_sec))
}

/// Deserializes an optional [`per_second`] limit (a string, or a number of
/// bytes or operations per second).
pub(crate) fn opt_per_second<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Rate>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Text(String),
        Number(f64),
    }
    match Option::<Raw>::deserialize(d)? {
        None => Ok(None),
        Some(Raw::Text(t)) => per_second(&t).map(Some).map_err(de::Error::custom),
        Some(Raw::Number(n)) => Rate::from_bytes_per_sec(n).map(Some).map_err(de::Error::custom),
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.unit, self.is_unlimited()) {
            (RateUnit::Bytes, true) => f.write_str("unlimited"),
            (RateUnit::Ops, true) => f.write_str("unlimited ops/s"),
            (RateUnit::Bytes, false) => write!(f, "{}/s", format_bytes(self.per_sec)),
            (RateUnit::Ops, false) => write!(f, "{}ops/s", self.per_sec),
        }
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Rate;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a rate such as \"64MiB/s\", \"1000ops/s\", \"unlimited\", or bytes/s as a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Rate, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Rate, E> {
                Rate::from_bytes_per_sec(v as f64).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Rate, E> {
                Rate::from_bytes_per_sec(v as f64).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Rate, E> {
                Rate::from_bytes_per_sec(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// What a device or a budget can move: a positive, finite number of bytes
/// per second, such as `"64MiB/s"`. Checked once, when made; everything
/// that takes a bandwidth (the emulated device, SILK's `KVS_B` and `min_B`,
/// the fair-share capacity, the benchmark's flags) takes this type.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Bandwidth(f64);

impl Bandwidth {
    /// `bytes_per_sec` bytes per second; fails unless positive and finite.
    pub fn new(bytes_per_sec: f64) -> Result<Self, UnitError> {
        if bytes_per_sec.is_finite() && bytes_per_sec > 0.0 {
            Ok(Bandwidth(bytes_per_sec))
        } else {
            err(format!(
                "a bandwidth must be a positive, finite number of bytes per second (such as \"64MiB/s\"), not {bytes_per_sec}"
            ))
        }
    }

    /// Bytes per second.
    pub fn bytes_per_sec(self) -> f64 {
        self.0
    }

    /// The same, as a [`Rate`] in bytes.
    pub fn rate(self) -> Rate {
        Rate { per_sec: self.0, unit: RateUnit::Bytes }
    }
}

impl TryFrom<Rate> for Bandwidth {
    type Error = UnitError;
    fn try_from(r: Rate) -> Result<Self, UnitError> {
        if r.unit() != RateUnit::Bytes {
            return err(format!("a bandwidth counts bytes, not operations ({r})"));
        }
        if r.is_unlimited() {
            return err("a bandwidth must be finite, not \"unlimited\"".to_owned());
        }
        Bandwidth::new(r.per_sec())
    }
}

impl FromStr for Bandwidth {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        s.parse::<Rate>()?.try_into()
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.rate().fmt(f)
    }
}

impl Serialize for Bandwidth {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.rate().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Bandwidth {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Rate::deserialize(d)?.try_into().map_err(de::Error::custom)
    }
}

/// A non-negative amount of tokens: bytes (`"1MiB"`, `"8Mi"`, `4096`) or, for
/// ops-based limits, a plain count.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Amount(f64);

impl Amount {
    /// An amount; fails when negative or not finite.
    pub fn new(v: f64) -> Result<Self, UnitError> {
        if !v.is_finite() {
            return err(format!("amount {v} is not finite"));
        }
        if v < 0.0 {
            return err(format!("amount {v} is negative"));
        }
        Ok(Amount(v))
    }

    /// The amount in tokens (bytes or ops).
    pub fn get(self) -> f64 {
        self.0
    }
}

impl FromStr for Amount {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, UnitError> {
        let t = s.trim();
        let (num, suffix) = split_number(t);
        let lower = suffix.to_ascii_lowercase();
        if matches!(lower.as_str(), "ops" | "op" | "requests") {
            return Amount::new(parse_number(num, s)?);
        }
        Amount::new(parse_bytes(t)?)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.fract() == 0.0 && self.0 < 9.0e15 { s.serialize_u64(self.0 as u64) } else { s.serialize_f64(self.0) }
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Amount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an amount such as \"1MiB\", \"8Mi\" or a number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Amount, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Amount, E> {
                Amount::new(v as f64).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Amount, E> {
                Amount::new(v as f64).map_err(E::custom)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Amount, E> {
                Amount::new(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses a duration with a mandatory unit: `"250ns"`, `"50us"`, `"10ms"`,
/// `"1.5s"`, `"2m"`, `"1h"`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (num, suffix) = split_number(s);
    let v = parse_number(num, s)?;
    let nanos_per = match suffix.to_ascii_lowercase().as_str() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        "" => return err(format!("duration '{s}' needs a unit (ns, us, ms, s, m, h)")),
        other => return err(format!("duration '{s}' has an unknown unit '{other}' (ns, us, ms, s, m, h)")),
    };
    let nanos = v * nanos_per;
    if nanos > u64::MAX as f64 {
        return err(format!("duration '{s}' is too long"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Formats a duration in the largest unit that represents it exactly.
pub fn format_duration(d: Duration) -> String {
    let n = d.as_nanos();
    for (unit, m) in
        [("h", 3_600_000_000_000u128), ("m", 60_000_000_000), ("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)]
    {
        if n >= m && n.is_multiple_of(m) {
            return format!("{}{unit}", n / m);
        }
    }
    format!("{n}ns")
}

/// Serde adapter for [`Duration`] fields written as `"10ms"`.
pub mod duration_str {
    use super::*;

    /// Serializes a duration as text with a unit.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Deserializes a duration from text with a unit.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }
}

/// Serde adapter for `Option<Duration>` fields written as `"10ms"`.
pub mod opt_duration_str {
    use super::*;

    /// Serializes an optional duration as text with a unit.
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    /// Deserializes an optional duration from text with a unit.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| parse_duration(&s).map_err(de::Error::custom)).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidths_are_positive_finite_bytes() {
        let b: Bandwidth = "64MiB/s".parse().unwrap();
        assert_eq!(b.bytes_per_sec(), 64.0 * 1048576.0);
        assert_eq!(b.to_string(), "64MiB/s");
        assert_eq!(serde_json::to_string(&b).unwrap(), "\"64MiB/s\"");
        assert_eq!(serde_json::from_str::<Bandwidth>("1048576").unwrap().bytes_per_sec(), 1048576.0);
        for (bad, says) in [("0", "positive"), ("unlimited", "finite"), ("100ops/s", "bytes"), ("fast", "number")] {
            let e = bad.parse::<Bandwidth>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(Bandwidth::new(f64::NAN).is_err());
        assert!(Bandwidth::new(-1.0).is_err());
    }

    #[test]
    fn bytes_si_and_binary() {
        assert_eq!(parse_bytes("8Mi").unwrap(), 8.0 * 1024.0 * 1024.0);
        assert_eq!(parse_bytes("64MiB").unwrap(), 64.0 * 1024.0 * 1024.0);
        assert_eq!(parse_bytes("1.5K").unwrap(), 1500.0);
        assert_eq!(parse_bytes("4096").unwrap(), 4096.0);
        assert_eq!(parse_bytes("12 MB").unwrap(), 12e6);
        assert!(parse_bytes("-1K").unwrap_err().0.contains("negative"));
        assert!(parse_bytes("3 parsecs").unwrap_err().0.contains("unknown size unit"));
        assert!(parse_bytes("MiB").unwrap_err().0.contains("number"));
    }

    #[test]
    fn rates() {
        let r: Rate = "64MiB/s".parse().unwrap();
        assert_eq!(r.per_sec(), 64.0 * 1048576.0);
        assert_eq!(r.unit(), RateUnit::Bytes);
        let r: Rate = "1000ops/s".parse().unwrap();
        assert_eq!((r.per_sec(), r.unit()), (1000.0, RateUnit::Ops));
        let r: Rate = "250 iops".parse().unwrap();
        assert_eq!((r.per_sec(), r.unit()), (250.0, RateUnit::Ops));
        assert!("unlimited".parse::<Rate>().unwrap().is_unlimited());
        assert_eq!("0".parse::<Rate>().unwrap().per_sec(), 0.0);
        assert_eq!("1e6".parse::<Rate>().unwrap().per_sec(), 1e6);
        assert!("-5MiB/s".parse::<Rate>().is_err());
        assert!("nan".parse::<Rate>().is_err());
        assert!("inf".parse::<Rate>().is_err());
        assert!("5 furlongs/s".parse::<Rate>().is_err());
        assert!(Rate::from_bytes_per_sec(f64::NAN).is_err());
        assert!(Rate::from_bytes_per_sec(-1.0).is_err());
    }

    #[test]
    fn a_rate_is_spelled_exactly() {
        let per_sec = |t: &str| t.parse::<Rate>().map(Rate::per_sec);
        assert_eq!(per_sec("12MB/s"), Ok(12e6));
        assert_eq!(per_sec("12 MB/s"), Ok(12e6));
        assert_eq!(per_sec("512KiB/s"), Ok(512.0 * 1024.0));
        assert_eq!(per_sec("4kB/s"), Ok(4000.0));
        assert_eq!(per_sec("8Mi/s"), Ok(8.0 * 1048576.0));
        assert_eq!(per_sec("10MBps"), Ok(10e6));
        assert_eq!(per_sec("100B/s"), Ok(100.0));
        // A size where a rate is expected.
        let e = per_sec("64MiB").unwrap_err().0;
        assert!(e.contains("is a size, not a rate: write '64MiB/s'") && e.contains("accepted:"), "{e}");
        assert!(per_sec("8Mi").unwrap_err().0.contains("is a size"));
        // Bits and milli are refused, not read as bytes and mega.
        let e = per_sec("64mb/s").unwrap_err().0;
        assert!(e.contains("lowercase b means bits") && e.contains("accepted:"), "{e}");
        assert!(per_sec("64Mb/s").unwrap_err().0.contains("bits"));
        assert!(per_sec("64mbps").is_err());
        assert!(per_sec("64mB/s").unwrap_err().0.contains("unknown unit 'mB'"));
        assert!(per_sec("64 furlongs").unwrap_err().0.contains("is not a rate"));
        // Where the key says per second, a size is that much per second.
        assert_eq!(per_second("8Mi").map(Rate::per_sec), Ok(8.0 * 1048576.0));
        assert_eq!(per_second("4MiB/s").map(Rate::per_sec), Ok(4.0 * 1048576.0));
        assert!(per_second("64mb/s").is_err());
    }

    #[test]
    fn rate_display_round_trips() {
        for s in ["64MiB/s", "12MB/s", "1000ops/s", "unlimited", "1234B/s", "unlimited ops/s"] {
            let r: Rate = s.parse().unwrap();
            assert_eq!(r.to_string(), s);
            assert_eq!(r.to_string().parse::<Rate>().unwrap(), r);
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("50us").unwrap(), Duration::from_micros(50));
        assert!(parse_duration("10").unwrap_err().0.contains("needs a unit"));
        assert!(parse_duration("10 fortnights").is_err());
        assert_eq!(format_duration(Duration::from_millis(10)), "10ms");
        assert_eq!(format_duration(Duration::from_nanos(1500)), "1500ns");
    }

    #[test]
    fn amounts() {
        assert_eq!("1MiB".parse::<Amount>().unwrap().get(), 1048576.0);
        assert_eq!("100 ops".parse::<Amount>().unwrap().get(), 100.0);
        assert!("-1".parse::<Amount>().is_err());
    }
}
