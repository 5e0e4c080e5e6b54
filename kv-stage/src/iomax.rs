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
//! use kv_stage::iomax::IoMax;
//! let l: IoMax = "wbps=4MiB riops=max".parse().unwrap();
//! assert_eq!(l.wbps, Some(4 << 20));
//! assert_eq!(l.riops, None);
//! assert_eq!(l.to_string(), "rbps=max wbps=4194304 riops=max wiops=max");
//! let e = "wbps=-1".parse::<IoMax>().unwrap_err();
//! assert!(e.to_string().starts_with("wbps:"), "{e}");
//! ```

use std::fmt;
use std::str::FromStr;

use crate::error::FieldError;
use crate::units::{UnitError, parse_bytes};

/// The four `io.max` keys, in the kernel's order.
pub const KEYS: [&str; 4] = ["rbps", "wbps", "riops", "wiops"];

/// Read and write limits of one volume; `None` is unlimited (`max`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct IoMax {
    /// Read bytes per second.
    pub rbps: Option<u64>,
    /// Written bytes per second.
    pub wbps: Option<u64>,
    /// Read operations per second.
    pub riops: Option<u64>,
    /// Write operations per second.
    pub wiops: Option<u64>,
}

fn bad(key: &str, message: impl Into<String>) -> FieldError {
    FieldError::new(key, message)
}

/// A value: `max`, or a positive amount. Byte keys take size units and an
/// optional `/s`; iops keys take a count with an optional `k`/`M` and `/s`.
fn value(key: &str, v: &str, bytes: bool) -> Result<Option<u64>, FieldError> {
    let v = v.trim();
    if v == "max" {
        return Ok(None);
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
    Ok(Some(n.round() as u64))
}

impl IoMax {
    /// No limit at all.
    pub const UNLIMITED: IoMax = IoMax { rbps: None, wbps: None, riops: None, wiops: None };

    /// True when no key has a limit.
    pub fn is_unlimited(&self) -> bool {
        *self == IoMax::UNLIMITED
    }

    /// The limits with their keys, in the kernel's order.
    pub fn entries(&self) -> [(&'static str, Option<u64>); 4] {
        [("rbps", self.rbps), ("wbps", self.wbps), ("riops", self.riops), ("wiops", self.wiops)]
    }

    /// Parses `key=value` pairs separated by spaces or commas. Each key at
    /// most once; an empty line is [`IoMax::UNLIMITED`].
    pub fn parse(s: &str) -> Result<IoMax, FieldError> {
        let [rbps, wbps, riops, wiops] = parse_keys(s)?.map(Option::flatten);
        Ok(IoMax { rbps, wbps, riops, wiops })
    }
}

/// The keys a line sets, in the kernel's order: `None` where the key is
/// absent, `Some(None)` where it is `max`. The kernel reads a write to
/// `io.max` this way: absent keys keep their limit.
pub(crate) fn parse_keys(s: &str) -> Result<[Option<Option<u64>>; 4], FieldError> {
    let mut out = [None; 4];
    for token in s.split(|c: char| c == ',' || c.is_whitespace()).filter(|t| !t.is_empty()) {
        let (k, v) =
            token.split_once('=').ok_or_else(|| bad(token, "is not key=value (keys: rbps, wbps, riops, wiops)"))?;
        let k = k.trim();
        let i = KEYS
            .iter()
            .position(|&key| key == k)
            .ok_or_else(|| bad(k, "unknown key (keys: rbps, wbps, riops, wiops)"))?;
        if out[i].is_some() {
            return Err(bad(k, "given twice"));
        }
        out[i] = Some(value(k, v, i < 2)?);
    }
    Ok(out)
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
    /// `rbps`, `wbps`, `riops`, `wiops`: `None` where the line leaves the
    /// key out, `Some(None)` where it says `max`.
    pub keys: [Option<Option<u64>>; 4],
}

impl FromStr for IoMaxLine {
    type Err = FieldError;
    fn from_str(s: &str) -> Result<Self, FieldError> {
        let s = s.trim();
        let (target, rest) = s.split_once(char::is_whitespace).unwrap_or((s, ""));
        Ok(IoMaxLine { target: Target::parse(target)?, keys: parse_keys(rest)? })
    }
}

impl fmt::Display for IoMaxLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.target)?;
        write_keys(f, &self.keys, true)
    }
}

/// Writes the keys that are set, each after a space (or the first without
/// one when `leading_space` is false).
pub(crate) fn write_keys(f: &mut impl fmt::Write, keys: &[Option<Option<u64>>; 4], leading_space: bool) -> fmt::Result {
    let mut first = !leading_space;
    for (k, v) in KEYS.iter().zip(keys) {
        let Some(v) = v else { continue };
        if !first {
            f.write_char(' ')?;
        }
        first = false;
        match v {
            Some(n) => write!(f, "{k}={n}")?,
            None => write!(f, "{k}=max")?,
        }
    }
    Ok(())
}

impl FromStr for IoMax {
    type Err = FieldError;
    fn from_str(s: &str) -> Result<Self, FieldError> {
        IoMax::parse(s)
    }
}

impl fmt::Display for IoMax {
    /// The kernel's own form: every key, `max` where unlimited.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_keys(f, &[Some(self.rbps), Some(self.wbps), Some(self.riops), Some(self.wiops)], false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_syntax_and_human_units() {
        let l = IoMax::parse("rbps=125MiB/s wbps=max riops=3000 wiops=3k").unwrap();
        assert_eq!(l, IoMax { rbps: Some(125 << 20), wbps: None, riops: Some(3000), wiops: Some(3000) });
        assert_eq!(l.to_string(), "rbps=131072000 wbps=max riops=3000 wiops=3000");
        assert_eq!(IoMax::parse(&l.to_string()).unwrap(), l);
        assert_eq!(IoMax::parse("wbps=64M,rbps=1048576").unwrap().rbps, Some(1 << 20));
        assert_eq!(IoMax::parse("wbps=64M").unwrap().wbps, Some(64_000_000));
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
