//! Rules: how a control plane (or a file) changes a stage.
//!
//! * **Housekeeping** rules create and remove channels and objects.
//! * **Differentiation** rules route requests to channels, and inside a
//!   channel to objects, by [`Match`] patterns.
//! * **Enforcement** rules change an object's state (a DRL's rate, a QoS
//!   limit) at run time.
//!
//! A batch of rules applies **all or nothing**. Rules are typed values with
//! serde; files are TOML or JSON with a version field (see [`RuleSet`]), or
//! the original Paio text format (see [`paio`]).

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::context::ContextReservation;
use crate::error::{Error, Location, Result};

mod files;
pub mod paio;
pub mod volumes;
use crate::matching::Match;
use crate::objects::{ObjectChange, ObjectSpec};

/// Version of the rules file format and of serialized rule batches.
pub const RULES_VERSION: u32 = 1;

/// One rule.
///
/// In files each rule is a table with an `op` field naming the variant, e.g.
/// `{ op = "configure", channel = "flush", object = "drl", set = { rate = "32MiB/s" } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Rule {
    /// Housekeeping: create a channel, optionally routing `match` to it.
    CreateChannel {
        /// New channel id.
        channel: String,
        /// Requests to route to the channel (none: add routes later).
        #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
        matches: Option<Match>,
    },
    /// Housekeeping: remove a channel, its objects and every route to it.
    RemoveChannel {
        /// Channel id.
        channel: String,
    },
    /// Housekeeping: create an object in a channel. With `match`, requests
    /// the pattern matches go to it; without, it becomes the channel's
    /// default object (the one used when no object route matches).
    CreateObject {
        /// Channel id.
        channel: String,
        /// New object id, unique in the channel.
        object: String,
        /// What to build.
        spec: ObjectSpec,
        /// Requests of the channel to send to this object.
        #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
        matches: Option<Match>,
    },
    /// Housekeeping: remove an object and its routes. Requests waiting in it
    /// are released.
    RemoveObject {
        /// Channel id.
        channel: String,
        /// Object id.
        object: String,
    },
    /// Differentiation: route requests matching the pattern to a channel
    /// (replaces an existing route with the same pattern).
    Route {
        /// Target channel.
        channel: String,
        /// Pattern.
        #[serde(rename = "match")]
        matches: Match,
    },
    /// Differentiation: remove the channel route with exactly this pattern.
    Unroute {
        /// Pattern.
        #[serde(rename = "match")]
        matches: Match,
    },
    /// Differentiation: inside a channel, route requests matching the
    /// pattern to an object (replaces an existing route with the same pattern).
    RouteObject {
        /// Channel id.
        channel: String,
        /// Target object.
        object: String,
        /// Pattern.
        #[serde(rename = "match")]
        matches: Match,
    },
    /// Differentiation: remove the object route with exactly this pattern.
    UnrouteObject {
        /// Channel id.
        channel: String,
        /// Pattern.
        #[serde(rename = "match")]
        matches: Match,
    },
    /// Differentiation: the channel for requests no route matches.
    SetDefaultChannel {
        /// Channel id.
        channel: String,
    },
    /// Differentiation: the object for requests of a channel that no object
    /// route matches (`None`: such requests pass through, counted).
    SetDefaultObject {
        /// Channel id.
        channel: String,
        /// Object id, or none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        object: Option<String>,
    },
    /// Enforcement: change an object's configuration.
    Configure {
        /// Channel id.
        channel: String,
        /// Object id.
        object: String,
        /// The settings to change.
        set: ObjectChange,
        /// When the object has none of these settings (a DRL rate sent to a
        /// noop), skip the rule with a warning instead of failing the batch.
        /// Paio behaves this way; the Paio importer sets it. Bad values for
        /// settings the object has still fail.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        ignore_unsupported: bool,
    },
}

/// The three kinds of rules of the Paio design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    /// Creates or removes channels and objects.
    Housekeeping,
    /// Maps requests to channels and objects.
    Differentiation,
    /// Changes an object's state.
    Enforcement,
}

impl Rule {
    /// Which kind of rule this is.
    pub fn kind(&self) -> RuleKind {
        match self {
            Rule::CreateChannel { .. }
            | Rule::RemoveChannel { .. }
            | Rule::CreateObject { .. }
            | Rule::RemoveObject { .. } => RuleKind::Housekeeping,
            Rule::Route { .. }
            | Rule::Unroute { .. }
            | Rule::RouteObject { .. }
            | Rule::UnrouteObject { .. }
            | Rule::SetDefaultChannel { .. }
            | Rule::SetDefaultObject { .. } => RuleKind::Differentiation,
            Rule::Configure { .. } => RuleKind::Enforcement,
        }
    }

    /// The `op` name.
    pub fn op(&self) -> &'static str {
        match self {
            Rule::CreateChannel { .. } => "create_channel",
            Rule::RemoveChannel { .. } => "remove_channel",
            Rule::CreateObject { .. } => "create_object",
            Rule::RemoveObject { .. } => "remove_object",
            Rule::Route { .. } => "route",
            Rule::Unroute { .. } => "unroute",
            Rule::RouteObject { .. } => "route_object",
            Rule::UnrouteObject { .. } => "unroute_object",
            Rule::SetDefaultChannel { .. } => "set_default_channel",
            Rule::SetDefaultObject { .. } => "set_default_object",
            Rule::Configure { .. } => "configure",
        }
    }

    /// Shorthand for a `configure` rule.
    pub fn configure(channel: &str, object: &str, set: ObjectChange) -> Self {
        Rule::Configure { channel: channel.to_owned(), object: object.to_owned(), set, ignore_unsupported: false }
    }
}

/// A rule with its id and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct RuleEntry {
    /// The rule.
    pub rule: Rule,
    /// Where it came from (file, line, position, id).
    pub location: Location,
}

/// A batch of rules, as loaded from a file or built in code, plus warnings the
/// loader produced (for example, Paio routes that duplicate earlier ones).
///
/// Application contexts a file declares (`contexts = [...]`) are reserved
/// while the set lives and registered only when it applies to a stage; a
/// set that never applies leaves the process-wide registry as it was.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    /// The rules, in order.
    pub rules: Vec<RuleEntry>,
    /// The volumes the files declared (their rules are in `rules`).
    pub volumes: Vec<volumes::Volume>,
    /// Non-fatal remarks.
    pub warnings: Vec<String>,
    /// Contexts declared by the files the rules came from.
    pub(crate) contexts: Vec<Arc<ContextReservation>>,
}

impl PartialEq for RuleSet {
    /// Rules and warnings; where their declared contexts are reserved does
    /// not matter.
    fn eq(&self, other: &Self) -> bool {
        self.rules == other.rules && self.volumes == other.volumes && self.warnings == other.warnings
    }
}

/// Formats a rules file can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulesFormat {
    /// TOML: `version`, `contexts`, `[[rules]]` tables.
    Toml,
    /// JSON: the same structure as TOML.
    Json,
    /// The original Paio text syntax (see [`paio`]).
    Paio,
}

impl RulesFormat {
    /// The format a file's extension names: `.toml`, `.json`; Paio text
    /// for no extension (Paio's own files have none), `.paio`, `.txt` or
    /// `.rules`. Any other extension (`rules.yaml`) is an error naming the
    /// file, rather than a guess that fails later with a confusing message;
    /// give the format explicitly ([`RuleSet::load_as`]) to read it anyway.
    pub fn from_path(path: &Path) -> Result<Self> {
        let ext = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("toml") => Ok(RulesFormat::Toml),
            Some("json") => Ok(RulesFormat::Json),
            None | Some("paio" | "txt" | "rules") => Ok(RulesFormat::Paio),
            Some(other) => Err(Error::invalid(format!(
                "{}: unknown rules file extension '.{other}' (.toml, .json; Paio text: no extension, .paio, .txt or .rules; or name the format)",
                path.display()
            ))),
        }
    }
}

impl std::str::FromStr for RulesFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "toml" => Ok(RulesFormat::Toml),
            "json" => Ok(RulesFormat::Json),
            "paio" | "text" => Ok(RulesFormat::Paio),
            _ => Err(Error::invalid(format!("unknown rules format '{s}' (toml, json, paio)"))),
        }
    }
}

impl RuleSet {
    /// A batch from rules built in code (locations are their positions).
    pub fn from_rules(rules: impl IntoIterator<Item = Rule>) -> Self {
        RuleSet {
            rules: rules
                .into_iter()
                .enumerate()
                .map(|(index, rule)| RuleEntry { rule, location: Location { index, ..Location::default() } })
                .collect(),
            volumes: Vec::new(),
            warnings: Vec::new(),
            contexts: Vec::new(),
        }
    }

    /// The application contexts applying this set would register: those
    /// its files declared that are not registered yet (an agent caps them,
    /// so a remote caller cannot take the ids the application needs).
    pub fn pending_contexts(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.contexts.iter().flat_map(|c| c.pending()).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The set applied: the contexts its files declared are registered.
    pub(crate) fn commit_contexts(&self) {
        for c in &self.contexts {
            c.commit();
        }
    }

    /// Appends another set (its rules keep their own locations).
    pub fn extend(&mut self, other: RuleSet) {
        let base = self.rules.len();
        self.rules.extend(other.rules.into_iter().map(|mut e| {
            e.location.index += base;
            e
        }));
        self.volumes.extend(other.volumes);
        self.warnings.extend(other.warnings);
        self.contexts.extend(other.contexts);
    }

    /// Loads a rules file, choosing the format from the extension.
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_as(path, RulesFormat::from_path(path)?, &paio::PaioOptions::default())
    }

    /// Loads a rules file in a given format.
    pub fn load_as(path: &Path, format: RulesFormat, paio: &paio::PaioOptions) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        let source: Arc<str> = path.display().to_string().into();
        Self::parse(&text, format, Some(source), paio)
    }

    /// Parses TOML rules text (the common case of [`parse`](Self::parse)):
    ///
    /// ```
    /// let set = kv_stage::RuleSet::from_toml(
    ///     r#"
    /// version = 1
    /// [[rules]]
    /// op = "create_channel"
    /// channel = "flush"
    /// match = { context = "bg_flush" }
    /// "#,
    /// )?;
    /// assert_eq!(set.rules.len(), 1);
    /// # Ok::<(), kv_stage::Error>(())
    /// ```
    pub fn from_toml(text: &str) -> Result<Self> {
        Self::parse(text, RulesFormat::Toml, None, &paio::PaioOptions::default())
    }

    /// Parses rules text. `source` names the text in error messages.
    pub fn parse(text: &str, format: RulesFormat, source: Option<Arc<str>>, paio: &paio::PaioOptions) -> Result<Self> {
        match format {
            RulesFormat::Toml => files::parse_toml(text, source),
            RulesFormat::Json => files::parse_json(text, source),
            RulesFormat::Paio => paio::parse(text, source, paio),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::paio::PaioOptions;
    use super::*;

    fn toml(text: &str) -> Result<RuleSet> {
        RuleSet::parse(text, RulesFormat::Toml, Some("t.toml".into()), &PaioOptions::default())
    }

    #[test]
    fn toml_rules_parse_with_lines_and_ids() {
        let rs = toml(
            r#"version = 1

[[rules]]
id = 1
op = "create_channel"
channel = "flush"
match = { context = "bg_flush" }

[[rules]]
id = 2
op = "create_object"
channel = "flush"
object = "drl"
spec = { kind = "drl", rate = "64MiB/s" }

[[rules]]
op = "configure"
channel = "flush"
object = "drl"
set = { rate = "32MiB/s" }
"#,
        )
        .unwrap();
        assert_eq!(rs.rules.len(), 3);
        assert_eq!(rs.rules[0].location.line, Some(3));
        assert_eq!(rs.rules[1].location.id, Some(2));
        assert_eq!(rs.rules[2].rule.kind(), RuleKind::Enforcement);
    }

    #[test]
    fn toml_errors_name_line_and_field() {
        let e = toml("[[rules]]\nid = 1\nop = \"create_channel\"\nchannel = \"a\"\n\n[[rules]]\nid = 1\nop = \"create_channel\"\nchannel = \"b\"\n")
            .unwrap_err();
        assert_eq!(e.location().unwrap().line, Some(6));
        assert_eq!(e.field(), Some("id"));
        assert!(e.to_string().contains("duplicate rule id 1"), "{e}");

        let e = toml("[[rules]]\nop = \"create_object\"\nchannel = \"a\"\nobject = \"x\"\nspec = { kind = \"drl\", rate = \"-5MiB/s\" }\n")
            .unwrap_err();
        assert_eq!(e.location().unwrap().line, Some(1));
        assert!(e.to_string().contains("negative"), "{e}");

        let e = toml("[[rules]]\nop = \"frobnicate\"\n").unwrap_err();
        assert!(e.to_string().contains("t.toml:1"), "{e}");

        let e = toml("version = 9\n").unwrap_err();
        assert_eq!(e.field(), Some("version"));

        let e = toml("[[rules]\n").unwrap_err();
        assert_eq!(e.location().unwrap().line, Some(1));
    }

    #[test]
    fn json_rules_report_lines() {
        let text = r#"{
  "version": 1,
  "rules": [
    {"op": "create_channel", "channel": "fg"},
    {"op": "create_object", "channel": "fg", "object": "n",
     "spec": {"kind": "noop"}, "match": {"context": "no_such"}}
  ]
}"#;
        let e = RuleSet::parse(text, RulesFormat::Json, None, &PaioOptions::default()).unwrap_err();
        assert_eq!(e.location().unwrap().line, Some(5), "{e}");
        assert!(e.to_string().contains("no_such"), "{e}");
    }

    #[test]
    fn rules_round_trip_through_serde() {
        let r = Rule::configure("c", "o", ObjectChange::rate("10MiB/s".parse().unwrap()));
        let j = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Rule>(&j).unwrap(), r);
    }
}
