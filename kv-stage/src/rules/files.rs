//! The TOML and JSON rules files: `version`, `contexts`, and `[[rules]]`
//! tables, each rule located by line for error messages.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::volumes::{self, Volume, VolumeTable};
use super::{RULES_VERSION, Rule, RuleEntry, RuleSet};
use crate::context::ContextReservation;
use crate::error::{Error, Location, Result};

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

fn file_error(source: &Option<Arc<str>>, line: Option<usize>, field: Option<&str>, msg: impl Into<String>) -> Error {
    Error::Rule {
        location: Location { source: source.clone(), line, index: 0, id: None },
        field: field.map(str::to_owned),
        message: msg.into(),
    }
}

fn check_version(v: Option<u32>, source: &Option<Arc<str>>) -> Result<()> {
    match v {
        None => Ok(()),
        Some(RULES_VERSION) => Ok(()),
        Some(v) => Err(file_error(
            source,
            None,
            Some("version"),
            format!("rules format version {v} is not supported (this build reads version {RULES_VERSION})"),
        )),
    }
}

/// Reserves the contexts a file declares, so its rules can name them; they
/// are registered when the rules apply.
fn declare_contexts(contexts: &[String], source: &Option<Arc<str>>) -> Result<ContextReservation> {
    ContextReservation::reserve(contexts).map_err(|e| file_error(source, None, Some("contexts"), e.to_string()))
}

/// Turns one parsed rule (as a JSON object) into an entry, checking ids.
fn entry_from_map(
    mut map: serde_json::Map<String, serde_json::Value>,
    mut location: Location,
    seen: &mut HashMap<u64, Location>,
) -> Result<RuleEntry> {
    if let Some(id) = map.remove("id") {
        let id = id.as_u64().ok_or_else(|| {
            Error::rule(&location, Some("id"), format!("rule id must be a non-negative integer, not {id}"))
        })?;
        location.id = Some(id);
        if let Some(first) = seen.get(&id) {
            return Err(Error::rule(&location, Some("id"), format!("duplicate rule id {id} (first used at {first})")));
        }
        seen.insert(id, location.clone());
    }
    let rule: Rule = serde_json::from_value(serde_json::Value::Object(map))
        .map_err(|e| Error::rule(&location, None, e.to_string()))?;
    Ok(RuleEntry { rule, location })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlFile {
    version: Option<u32>,
    #[serde(default)]
    contexts: Vec<String>,
    #[serde(default)]
    volumes: Vec<toml::Spanned<toml::Table>>,
    #[serde(default)]
    rules: Vec<toml::Spanned<toml::Table>>,
}

/// Builds the volumes of a file and the rules that make them (which come
/// before the file's own rules, so those can refer to the volumes).
fn build_volumes(tables: Vec<(Location, serde_json::Value)>) -> Result<(Vec<Volume>, Vec<RuleEntry>)> {
    let mut volumes = Vec::with_capacity(tables.len());
    let mut file_volumes = 0u16;
    for (location, value) in tables {
        let table: VolumeTable =
            serde_json::from_value(value).map_err(|e| Error::rule(&location, Some("volumes"), e.to_string()))?;
        volumes.push(table.build(location, &mut file_volumes)?);
    }
    volumes::check_unique(&volumes)?;
    let rules =
        volumes.iter().flat_map(|v| v.rules().map(|rule| RuleEntry { rule, location: v.location.clone() })).collect();
    Ok((volumes, rules))
}

pub(super) fn parse_toml(text: &str, source: Option<Arc<str>>) -> Result<RuleSet> {
    let file: TomlFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        file_error(&source, line, None, e.message().to_owned())
    })?;
    check_version(file.version, &source)?;
    let declared = declare_contexts(&file.contexts, &source)?;
    let (volumes, rules) = declared.scope(|| -> Result<(Vec<Volume>, Vec<RuleEntry>)> {
        let mut tables = Vec::with_capacity(file.volumes.len());
        for (index, spanned) in file.volumes.into_iter().enumerate() {
            let location =
                Location { source: source.clone(), line: Some(line_of(text, spanned.span().start)), index, id: None };
            let json = serde_json::to_value(spanned.into_inner())
                .map_err(|e| Error::rule(&location, Some("volumes"), e.to_string()))?;
            tables.push((location, json));
        }
        let (volumes, mut rules) = build_volumes(tables)?;
        let mut seen = HashMap::new();
        for (index, spanned) in file.rules.into_iter().enumerate() {
            let line = line_of(text, spanned.span().start);
            let location = Location { source: source.clone(), line: Some(line), index, id: None };
            let table = spanned.into_inner();
            let json = serde_json::to_value(&table).map_err(|e| Error::rule(&location, None, e.to_string()))?;
            let serde_json::Value::Object(map) = json else { unreachable!("a TOML table is a JSON object") };
            rules.push(entry_from_map(map, location, &mut seen)?);
        }
        Ok((volumes, rules))
    })?;
    Ok(RuleSet { rules, volumes, warnings: Vec::new(), contexts: vec![Arc::new(declared)] })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonFile<'a> {
    version: Option<u32>,
    #[serde(default)]
    contexts: Vec<String>,
    #[serde(default, borrow)]
    volumes: Vec<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    rules: Vec<&'a serde_json::value::RawValue>,
}

pub(super) fn parse_json(text: &str, source: Option<Arc<str>>) -> Result<RuleSet> {
    let file: JsonFile<'_> =
        serde_json::from_str(text).map_err(|e| file_error(&source, Some(e.line()), None, e.to_string()))?;
    check_version(file.version, &source)?;
    let declared = declare_contexts(&file.contexts, &source)?;
    let base = text.as_ptr() as usize;
    let (volumes, rules) = declared.scope(|| -> Result<(Vec<Volume>, Vec<RuleEntry>)> {
        let mut tables = Vec::with_capacity(file.volumes.len());
        for (index, raw) in file.volumes.into_iter().enumerate() {
            let offset = (raw.get().as_ptr() as usize).saturating_sub(base);
            let location = Location { source: source.clone(), line: Some(line_of(text, offset)), index, id: None };
            let value: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(|e| Error::rule(&location, Some("volumes"), e.to_string()))?;
            tables.push((location, value));
        }
        let (volumes, mut rules) = build_volumes(tables)?;
        let mut seen = HashMap::new();
        for (index, raw) in file.rules.into_iter().enumerate() {
            // A borrowed RawValue is a slice of `text`: its address gives its line.
            let offset = (raw.get().as_ptr() as usize).saturating_sub(base);
            let location = Location { source: source.clone(), line: Some(line_of(text, offset)), index, id: None };
            let value: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(|e| Error::rule(&location, None, e.to_string()))?;
            let serde_json::Value::Object(map) = value else {
                return Err(Error::rule(&location, None, "a rule must be an object"));
            };
            rules.push(entry_from_map(map, location, &mut seen)?);
        }
        Ok((volumes, rules))
    })?;
    Ok(RuleSet { rules, volumes, warnings: Vec::new(), contexts: vec![Arc::new(declared)] })
}
