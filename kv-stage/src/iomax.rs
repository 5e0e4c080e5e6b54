//! Per-volume limits in the key syntax of the Linux kernel's cgroup v2
//! `io.max` file: `rbps=.. wbps=.. riops=.. wiops=..`, where `max` means
//! unlimited and an absent key is unlimited too.
//!
//! The kernel wants plain integers (bytes per second, operations per
//! second); this parser also takes human units (`64MiB`, `64MiB/s`, `125M`,
//! `3k`), and keys may be separated by spaces or commas. [`IoMax`]'s
//! `Display` prints what the kernel accepts, so a parsed limit can be
//! written to `io.max` (after the device's `MAJ:MIN`) or to the cgroup v1
//! `blkio.throttle.*` files as is.
//!
//! ```
//! use kv_stage::iomax::{IoMax, Limit};
//! let l: IoMax = "wbps=4MiB riops=max".parse().unwrap();
//! assert_eq!(l.wbps, Some(Limit::PerSec(4 << 20)));
//! assert_eq!(l.riops, Some(Limit::Max));
//! assert_eq!(l.rbps, None); // not given
//! assert_eq!(l.to_string(), "rbps=max wbps=4194304 riops=max wiops=max");
//! assert_eq!(l.given().to_string(), "wbps=4194304 riops=max");
//! let e = "wbps=-1".parse::<IoMax>().unwrap_err();
//! assert!(e.to_string().starts_with("wbps:"), "{e}");
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::FieldError;
use crate::units::{Rate, RateUnit, UnitError, parse_bytes};

/// One `io.max` key's limit: `max`, or a positive whole number per second
/// (bytes for `rbps` and `wbps`, operations for `riops` and `wiops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// No limit.
    Max,
    /// At most this many bytes or operations per second (at least 1).
    PerSec(u64),
}

impl Limit {
    /// The number, `None` for `max`.
    pub fn per_sec(self) -> Option<u64> {
        match self {
            Limit::Max => None,
            Limit::PerSec(n) => Some(n),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Max => f.write_str("max"),
            Limit::PerSec(n) => write!(f, "{n}"),
        }
    }
}

/// Per-volume limits: the four `io.max` keys by name, each `None` where it
/// is not given. The one type for them everywhere: a volume's limits, an
/// `io.max` line ([`IoMaxLine`]), a QoS object's spec and its changes
/// ([`QosSpec`](crate::QosSpec)), a kernel throttle's settings.
///
/// As a volume's limits, a key not given is `max` (as in a fresh cgroup);
/// as a change, a key not given keeps its limit ([`then`](Self::then)), as
/// a write to the kernel's `io.max` does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IoMax {
    /// Read bytes per second.
    pub rbps: Option<Limit>,
    /// Written bytes per second.
    pub wbps: Option<Limit>,
    /// Read operations per second.
    pub riops: Option<Limit>,
    /// Write operations per second.
    pub wiops: Option<Limit>,
}

fn bad(key: &str, message: impl Into<String>) -> FieldError {
    FieldError::new(key, message)
}

/// A value: `max`, or a positive amount. Byte keys take size units and an
/// optional `/s`; iops keys take a count with an optional `k`/`M` and `/s`.
fn value(key: &str, v: &str, bytes: bool) -> Result<Limit, FieldError> {
    let v = v.trim();
    if v == "max" {
        return Ok(Limit::Max);
    }
    let per = v.strip_suffix("/s").unwrap_or(v);
    let parsed: Result<f64, UnitError> = if bytes {
        parse_bytes(per)
    } else {
        // A count: plain, or with an SI multiplier (3k = 3000).
        let (num, mult) = match per.char_indices().last() {
            Some((i, 'k' | 'K')) => (&per[..i], 1e3),
            Some((i, 'M')) => (&per[..i], 1e6),
            _ => (per, 1.0),
        };
        match num.trim().parse::<f64>() {
            Ok(n) if n.is_finite() && n >= 0.0 => Ok(n * mult),
            Ok(_) => Err(UnitError(format!("'{v}' is negative or not finite"))),
            Err(_) => Err(UnitError(format!("'{v}' is not a count of operations per second"))),
        }
    };
    let n = parsed.map_err(|e| {
        bad(key, format!("{e} (a {} or \"max\")", if bytes { "size such as 64MiB" } else { "count such as 3000" }))
    })?;
    if n < 1.0 {
        return Err(bad(key, format!("'{v}' is below 1; the kernel takes a positive limit or \"max\"")));
    }
    if n >= u64::MAX as f64 {
        return Err(bad(key, format!("'{v}' is too large")));
    }
    Ok(Limit::PerSec(n.round() as u64))
}

impl IoMax {
    /// No key given: no limit at all.
    pub const UNLIMITED: IoMax = IoMax { rbps: None, wbps: None, riops: None, wiops: None };

    /// True when no key has a limit (each is not given or `max`).
    pub fn is_unlimited(&self) -> bool {
        self.entries().iter().all(|(_, l)| l.is_none_or(|l| l == Limit::Max))
    }

    /// The keys with their limits, in the kernel's order.
    pub fn entries(&self) -> [(&'static str, Option<Limit>); 4] {
        [("rbps", self.rbps), ("wbps", self.wbps), ("riops", self.riops), ("wiops", self.wiops)]
    }

    /// The keys as rates, in the kernel's order: bytes per second for
    /// `rbps` and `wbps`, operations per second for `riops` and `wiops`;
    /// unlimited for `max`, `None` where a key is not given.
    pub fn rates(&self) -> [(&'static str, Option<Rate>); 4] {
        let rate = |l: Option<Limit>, unit: RateUnit| {
            l.map(|l| match l {
                // A u64 as f64 is finite and non-negative: `new` cannot fail.
                Limit::PerSec(n) => Rate::new(n as f64, unit).unwrap_or(Rate::unlimited(unit)),
                Limit::Max => Rate::unlimited(unit),
            })
        };
        [
            ("rbps", rate(self.rbps, RateUnit::Bytes)),
            ("wbps", rate(self.wbps, RateUnit::Bytes)),
            ("riops", rate(self.riops, RateUnit::Ops)),
            ("wiops", rate(self.wiops, RateUnit::Ops)),
        ]
    }

    /// The limits in effect, one form for each: `None` for a key with no
    /// limit (not given, or `max`), so that equal limits compare equal.
    pub fn in_effect(self) -> IoMax {
        let f = |l: Option<Limit>| l.filter(|l| *l != Limit::Max);
        IoMax { rbps: f(self.rbps), wbps: f(self.wbps), riops: f(self.riops), wiops: f(self.wiops) }
    }

    /// Every key given: `max` for a key with no limit (as the kernel shows
    /// `io.max`, and as a change that sets all four).
    pub fn every_key(self) -> IoMax {
        let f = |l: Option<Limit>| Some(l.unwrap_or(Limit::Max));
        IoMax { rbps: f(self.rbps), wbps: f(self.wbps), riops: f(self.riops), wiops: f(self.wiops) }
    }

    /// These limits after a change: the keys `change` gives replace these,
    /// the others stay (the kernel's reading of a write to `io.max`).
    pub fn then(self, change: IoMax) -> IoMax {
        IoMax {
            rbps: change.rbps.or(self.rbps),
            wbps: change.wbps.or(self.wbps),
            riops: change.riops.or(self.riops),
            wiops: change.wiops.or(self.wiops),
        }
    }

    /// Only the keys given, as an `io.max` line writes them
    /// (`wbps=4194304 riops=max`); empty when none is.
    pub fn given(&self) -> impl fmt::Display + '_ {
        Given(self)
    }

    /// Parses `key=value` pairs separated by spaces or commas. Each key at
    /// most once; `max` is [`Limit::Max`]; a key left out is `None`.
    pub fn parse(s: &str) -> Result<IoMax, FieldError> {
        let mut out = IoMax::UNLIMITED;
        for token in s.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty()) {
            let (k, v) =
                token.split_once('=').ok_or_else(|| bad(token, "is not key=value (keys: rbps, wbps, riops, wiops)"))?;
            let k = k.trim();
            let (slot, bytes) = match k {
                "rbps" => (&mut out.rbps, true),
                "wbps" => (&mut out.wbps, true),
                "riops" => (&mut out.riops, false),
                "wiops" => (&mut out.wiops, false),
                _ => return Err(bad(k, "unknown key (keys: rbps, wbps, riops, wiops)")),
            };
            if slot.is_some() {
                return Err(bad(k, "given twice"));
            }
            *slot = Some(value(k, v, bytes)?);
        }
        Ok(out)
    }
}

struct Given<'a>(&'a IoMax);

impl fmt::Display for Given<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, l) in self.0.entries() {
            let Some(l) = l else { continue };
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{k}={l}")?;
        }
        Ok(())
    }
}

/// A block device's number, `MAJ:MIN`: what `io.max` lines, cgroup v1
/// `blkio.throttle.*` files, `/sys/dev/block/` and device volumes name a
/// device by. Shown and parsed as `254:0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceNumber {
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

impl DeviceNumber {
    /// `major:minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        DeviceNumber { major, minor }
    }

    /// The device of an `st_dev` (`MetadataExt::dev`), split as glibc's
    /// `major()` and `minor()` split it.
    pub const fn of_dev(dev: u64) -> Self {
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        DeviceNumber { major: major as u32, minor: minor as u32 }
    }
}

impl fmt::Display for DeviceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DeviceNumber {
    type Err = FieldError;
    /// `MAJ:MIN`, two numbers (surrounding spaces ignored).
    fn from_str(s: &str) -> Result<Self, FieldError> {
        let t = s.trim();
        t.split_once(':')
            .and_then(|(a, b)| Some(DeviceNumber::new(a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| bad(t, "is not MAJ:MIN (two numbers, such as 254:0)"))
    }
}

/// What an `io.max` line is about: a block device by `MAJ:MIN`, or a volume
/// by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A block device, `MAJ:MIN`.
    Device(DeviceNumber),
    /// A volume of a rules file, by name.
    Volume(String),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Device(d) => d.fmt(f),
            Target::Volume(v) => f.write_str(v),
        }
    }
}

impl Target {
    /// `MAJ:MIN` is a device; anything else that is a valid volume name
    /// (letters, digits, `_`, `-`, `.`, `/`) is a volume.
    pub fn parse(s: &str) -> Result<Target, FieldError> {
        if s.contains(':') {
            return s.parse().map(Target::Device);
        }
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c)) {
            return Err(bad(s, "is not a volume name (letters, digits, '_', '-', '.', '/') or MAJ:MIN"));
        }
        Ok(Target::Volume(s.to_owned()))
    }
}

/// One line of an `io.max` file: a target and the keys it sets, such as
/// `254:0 wbps=4194304` or `db rbps=max wbps=8MiB`. As in the kernel, keys a
/// line leaves out keep their current limit when the line is applied; the
/// line's `Display` prints only the keys it sets.
///
/// ```
/// use kv_stage::iomax::{IoMaxLine, Target};
/// let l: IoMaxLine = "254:0 wbps=4MiB riops=max".parse().unwrap();
/// assert_eq!(l.target, Target::Device("254:0".parse().unwrap()));
/// assert_eq!(l.to_string(), "254:0 wbps=4194304 riops=max");
/// assert!("db wbps=-1".parse::<IoMaxLine>().unwrap_err().to_string().starts_with("wbps:"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IoMaxLine {
    /// What the line limits.
    pub target: Target,
    /// The keys the line gives (those it leaves out are `None`).
    pub limits: IoMax,
}

impl FromStr for IoMaxLine {
    type Err = FieldError;
    fn from_str(s: &str) -> Result<Self, FieldError> {
        let s = s.trim();
        let (target, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        Ok(IoMaxLine { target: Target::parse(target)?, limits: IoMax::parse(rest)? })
    }
}

impl fmt::Display for IoMaxLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.target)?;
        if self.limits != IoMax::UNLIMITED {
            write!(f, " {}", self.limits.given())?;
        }
        Ok(())
    }
}

impl FromStr for IoMax {
    type Err = FieldError;
    fn from_str(s: &str) -> Result<Self, FieldError> {
        IoMax::parse(s)
    }
}

impl fmt::Display for IoMax {
    /// The kernel's own form: every key, `max` where there is no limit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = |l: Option<Limit>| Some(l.unwrap_or(Limit::Max));
        let all =
            IoMax { rbps: full(self.rbps), wbps: full(self.wbps), riops: full(self.riops), wiops: full(self.wiops) };
        all.given().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_syntax_and_human_units() {
        let l = IoMax::parse("rbps=125MiB/s wbps=max riops=3000 wiops=3k").unwrap();
        let n = |v| Some(Limit::PerSec(v));
        assert_eq!(l, IoMax { rbps: n(125 << 20), wbps: Some(Limit::Max), riops: n(3000), wiops: n(3000) });
        assert_eq!(l.to_string(), "rbps=131072000 wbps=max riops=3000 wiops=3000");
        assert_eq!(IoMax::parse(&l.to_string()).unwrap(), l);
        assert_eq!(IoMax::parse("wbps=64M,rbps=1048576").unwrap().rbps, n(1 << 20));
        assert_eq!(IoMax::parse("wbps=64M").unwrap().wbps, n(64_000_000));
        assert_eq!(
            IoMax::parse("wbps=64M").unwrap().then(IoMax::parse("rbps=1 wbps=max").unwrap()).to_string(),
            "rbps=1 wbps=max riops=max wiops=max"
        );
        assert!(IoMax::parse("").unwrap().is_unlimited());
    }

    #[test]
    fn dev_numbers_split_as_glibc() {
        let split = |dev| DeviceNumber::of_dev(dev);
        assert_eq!(split(0xfe00), DeviceNumber::new(254, 0));
        assert_eq!(split(0x0801), DeviceNumber::new(8, 1));
        // major 259 (NVMe), minor 3
        assert_eq!(split((259 << 8) & 0xfff00 | 3), DeviceNumber::new(259, 3));
        // a major above 4095 lives in the high bits
        assert_eq!(split((0x1234u64 & !0xfff) << 32 | (0x1234 & 0xfff) << 8 | 7), DeviceNumber::new(0x1234, 7));
        assert_eq!("254:0".parse::<DeviceNumber>().unwrap().to_string(), "254:0");
        assert_eq!("254:x".parse::<DeviceNumber>().unwrap_err().field, "254:x");
    }

    #[test]
    fn bad_input_names_the_key() {
        for (line, key, words) in [
            ("wbps=-1", "wbps", "negative"),
            ("rbps=12XB", "rbps", "unknown size unit"),
            ("rbps=64M wxps=1", "wxps", "unknown key"),
            ("riops=0", "riops", "below 1"),
            ("wiops=ten", "wiops", "not a count"),
            ("wbps=1M wbps=2M", "wbps", "twice"),
            ("rbps", "rbps", "not key=value"),
        ] {
            let e = IoMax::parse(line).unwrap_err();
            assert_eq!(e.field, key, "{line}: {e}");
            assert!(e.to_string().starts_with(&format!("{key}: ")), "{line}: {e}");
            assert!(e.message.contains(words), "{line}: {e}");
        }
    }
}
