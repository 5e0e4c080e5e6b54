//! Volumes: named sets of requests with per-volume limits in the kernel's
//! `io.max` syntax, as LINSTOR sets them (`sys/fs/blkio_throttle_*`).
//!
//! A rules file declares them in `[[volumes]]` tables:
//!
//! ```toml
//! [[volumes]]
//! name = "db"
//! path = "/srv/db"          # files under this directory (the POSIX layer)
//! limits = "wbps=4MiB riops=max"
//!
//! [[volumes]]
//! device = "254:0"          # files on this block device; the name is "254:0"
//! limits = "rbps=64MiB"
//!
//! [[volumes]]
//! name = "backups"
//! path = "/srv/backup"
//! tag = "backup"            # its requests carry this context (other rules can match it)
//!
//! [[volumes]]
//! name = "tenant-a"
//! context = "tenant_a"      # requests tagged with this context
//! limits = "rbps=8MiB wbps=8MiB"
//! ```
//!
//! Each volume becomes a channel of its name with one [`Qos`](crate::object::Qos)
//! object, [`VOLUME_OBJECT`], as its default object; a key the volume does
//! not set is `max`. Requests of no volume are untouched: they go where the
//! other rules send them. A limit changes live with a `configure` rule (or
//! [`Volume::limit_rule`]) that sets `limits` like a write to `io.max`: the
//! keys it names change, the others keep their limit.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::Rule;
use crate::context::{InstanceId, RequestContext};
use crate::error::{Error, Location, Result};
use crate::iomax::{DeviceNumber, IoMax, IoMaxLine, Target};
use crate::matching::Match;
use crate::objects::{ObjectChange, ObjectSpec, QosSpec};

/// The id of the QoS object each volume's channel has.
pub const VOLUME_OBJECT: &str = "limits";

/// Path and device volumes have no instance of their own: the layer that
/// classifies files tags their requests with instance
/// `FIRST_FILE_VOLUME_INSTANCE + n`, `n` the volume's position among the
/// file's path and device volumes.
pub const FIRST_FILE_VOLUME_INSTANCE: u16 = 0xF000;

/// Which requests a volume holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSelector {
    /// Files whose absolute path is this directory or below it (a whole
    /// path component: `/srv/db` holds `/srv/db/x`, not `/srv/dbx`).
    Path(PathBuf),
    /// Files on this block device (`st_dev` of the open file).
    Device(DeviceNumber),
    /// Requests of one instance (a DB or store the application numbers).
    Instance(InstanceId),
    /// Requests tagged with one request context (a tenant).
    Context(RequestContext),
}

/// One volume of a rules file.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// Its name: the channel id, and the target of `io.max` lines.
    pub name: String,
    /// Which requests it holds.
    pub selector: VolumeSelector,
    /// The instance its requests carry (`None` for a context volume).
    pub instance: Option<InstanceId>,
    /// Its limits (unset keys are `max`).
    pub limits: IoMax,
    /// Burst of each limit, as a period's worth of its rate (default 10 ms).
    pub refill_period: Option<Duration>,
    /// For a path or device volume: the request context the layer that
    /// classifies files tags its requests with (`tag = "backup"`), so other
    /// rules can tell them apart; `None` keeps the calling thread's context.
    pub tag: Option<RequestContext>,
    /// Where it was declared.
    pub location: Location,
}

impl Volume {
    /// The rules that build it: its channel, routed by its selector, and
    /// the QoS object with its limits.
    pub fn rules(&self) -> [Rule; 2] {
        let matches = match (&self.selector, self.instance) {
            (VolumeSelector::Context(c), _) => Match::context(*c),
            (_, Some(i)) => Match::instance(i),
            (_, None) => unreachable!("every non-context volume has an instance"),
        };
        [
            Rule::CreateChannel { channel: self.name.clone(), matches: Some(matches) },
            Rule::CreateObject {
                channel: self.name.clone(),
                object: VOLUME_OBJECT.to_owned(),
                spec: ObjectSpec::Qos(self.spec()),
                matches: None,
            },
        ]
    }

    /// Its QoS object's spec: every key (`max` where unset) and the refill
    /// period. As a change (`configure`), it sets the volume back to what
    /// the file says.
    pub fn spec(&self) -> QosSpec {
        QosSpec { refill_period: self.refill_period, ..QosSpec::from_io_max(self.limits) }
    }

    /// A live change of a volume's limits from an `io.max` line naming it
    /// (`db wbps=8MiB`, or `254:0 riops=max` for a device volume left with
    /// its default name): the keys the line sets change, the others keep
    /// their limit, as a write to `io.max` does.
    ///
    /// ```
    /// use kv_stage::{RuleSet, RulesFormat, Stage, ObjectSpec, paio::PaioOptions, volumes::Volume};
    /// let rules = RuleSet::parse(
    ///     "[[volumes]]\nname = \"db\"\ninstance = 1\nlimits = \"wbps=4MiB riops=200\"\n",
    ///     RulesFormat::Toml, None, &PaioOptions::default()).unwrap();
    /// let stage = Stage::new("volumes");
    /// stage.apply(&rules).unwrap();
    /// stage.apply_rules([Volume::limit_rule(&"db wbps=8MiB".parse().unwrap())]).unwrap();
    /// let Some(ObjectSpec::Qos(q)) = stage.object("db", "limits").unwrap().spec() else { panic!() };
    /// assert_eq!(q.io_max().to_string(), "rbps=max wbps=8388608 riops=200 wiops=max");
    /// ```
    pub fn limit_rule(line: &IoMaxLine) -> Rule {
        Rule::configure(&line.target.to_string(), VOLUME_OBJECT, ObjectChange::from_settings(&QosSpec::from_line(line)))
    }

    /// Whether a file at `path` (absolute, as the kernel reports it)
    /// belongs to this path volume. Compares bytes; never allocates.
    pub fn holds_path(&self, path: &[u8]) -> bool {
        let VolumeSelector::Path(prefix) = &self.selector else { return false };
        let prefix = prefix.as_os_str().as_encoded_bytes();
        let prefix = if prefix.len() > 1 { prefix.strip_suffix(b"/").unwrap_or(prefix) } else { prefix };
        match path.strip_prefix(prefix) {
            Some(rest) => rest.is_empty() || rest[0] == b'/' || prefix == b"/",
            None => false,
        }
    }

    /// Whether a file on device `dev` belongs to this device volume.
    pub fn holds_device(&self, dev: DeviceNumber) -> bool {
        self.selector == VolumeSelector::Device(dev)
    }
}

/// A `[[volumes]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct VolumeTable {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    instance: Option<u16>,
    #[serde(default)]
    context: Option<String>,
    #[serde(default, alias = "io_max")]
    limits: Option<String>,
    #[serde(default, with = "crate::units::opt_duration_str")]
    refill_period: Option<Duration>,
    #[serde(default)]
    tag: Option<String>,
}

impl VolumeTable {
    /// Checks the table and builds the volume; `file_volumes` counts the
    /// path and device volumes before it (for their instance ids).
    pub(super) fn build(self, location: Location, file_volumes: &mut u16) -> Result<Volume> {
        let err = |field: &str, msg: String| Error::rule(&location, Some(field), msg);
        let given: Vec<&str> = [
            ("path", self.path.is_some()),
            ("device", self.device.is_some()),
            ("instance", self.instance.is_some()),
            ("context", self.context.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        if given.len() != 1 {
            return Err(err(
                "volumes",
                format!(
                    "a volume needs exactly one of `path`, `device`, `instance`, `context` (this one has {})",
                    if given.is_empty() { "none".to_owned() } else { given.join(", ") }
                ),
            ));
        }
        let mut file_instance = || {
            let i = InstanceId(FIRST_FILE_VOLUME_INSTANCE + *file_volumes);
            *file_volumes += 1;
            i
        };
        let (selector, instance, default_name) = if let Some(p) = self.path {
            if !Path::new(&p).is_absolute() {
                return Err(err("path", format!("'{p}' is not an absolute path")));
            }
            (VolumeSelector::Path(PathBuf::from(p)), Some(file_instance()), None)
        } else if let Some(d) = self.device {
            let Ok(Target::Device(dev)) = Target::parse(&d) else {
                return Err(err("device", format!("'{d}' is not MAJ:MIN (two numbers, such as 254:0)")));
            };
            (VolumeSelector::Device(dev), Some(file_instance()), Some(d))
        } else if let Some(i) = self.instance {
            if i >= FIRST_FILE_VOLUME_INSTANCE {
                return Err(err(
                    "instance",
                    format!(
                        "instance {i} is reserved for path and device volumes (use one below {FIRST_FILE_VOLUME_INSTANCE})"
                    ),
                ));
            }
            (VolumeSelector::Instance(InstanceId(i)), Some(InstanceId(i)), None)
        } else {
            let c = self.context.unwrap_or_default();
            let ctx = RequestContext::lookup(&c)
                .ok_or_else(|| err("context", format!("unknown request context '{c}' (declare it in `contexts`)")))?;
            (VolumeSelector::Context(ctx), None, None)
        };
        let name = match (self.name, default_name) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => {
                return Err(err("name", "a volume needs a `name` (only device volumes default to MAJ:MIN)".into()));
            }
        };
        match Target::parse(&name) {
            Ok(Target::Volume(_)) => {}
            Ok(Target::Device(_)) if matches!(selector, VolumeSelector::Device(_)) => {}
            _ => {
                return Err(err(
                    "name",
                    format!("'{name}' is not a volume name (letters, digits, '_', '-', '.', '/')"),
                ));
            }
        }
        let tag = match &self.tag {
            None => None,
            Some(_) if !matches!(selector, VolumeSelector::Path(_) | VolumeSelector::Device(_)) => {
                return Err(err("tag", "only path and device volumes tag their requests".into()));
            }
            Some(t) => Some(
                RequestContext::lookup(t)
                    .ok_or_else(|| err("tag", format!("unknown request context '{t}' (declare it in `contexts`)")))?,
            ),
        };
        let limits = match &self.limits {
            Some(l) => IoMax::parse(l).map_err(|e| err("limits", e.to_string()))?,
            None => IoMax::UNLIMITED,
        };
        let v = Volume { name, selector, instance, limits, refill_period: self.refill_period, tag, location };
        v.spec().validate().map_err(|e| Error::rule(&v.location, Some(&e.field), e.message))?;
        Ok(v)
    }
}

/// Checks names are unique and selectors do not overlap exactly.
pub(super) fn check_unique(volumes: &[Volume]) -> Result<()> {
    for (i, v) in volumes.iter().enumerate() {
        if let Some(first) = volumes[..i].iter().find(|w| w.name == v.name) {
            return Err(Error::rule(
                &v.location,
                Some("name"),
                format!("volume '{}' is declared twice (first at {})", v.name, first.location),
            ));
        }
        if let Some(first) = volumes[..i].iter().find(|w| w.selector == v.selector) {
            return Err(Error::rule(
                &v.location,
                None,
                format!("volume '{}' selects the same requests as '{}' (at {})", v.name, first.name, first.location),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(path: &str) -> Volume {
        Volume {
            name: "v".into(),
            selector: VolumeSelector::Path(path.into()),
            instance: Some(InstanceId(FIRST_FILE_VOLUME_INSTANCE)),
            limits: IoMax::UNLIMITED,
            refill_period: None,
            tag: None,
            location: Location::default(),
        }
    }

    #[test]
    fn path_prefix_is_whole_components() {
        let v = volume("/srv/db");
        assert!(v.holds_path(b"/srv/db"));
        assert!(v.holds_path(b"/srv/db/000001.sst"));
        assert!(!v.holds_path(b"/srv/dbx"));
        assert!(!v.holds_path(b"/srv/d"));
        assert!(volume("/srv/db/").holds_path(b"/srv/db/x"));
        assert!(volume("/").holds_path(b"/anything"));
    }
}
