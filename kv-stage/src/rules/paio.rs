//! Importer for the original Paio text rules, so existing Paio rule files
//! load into a stage.
//!
//! Lines (blank lines and `#` comments are skipped):
//!
//! ```text
//! <id> create_channel <channel> <context_type> <workflow> <type> <context>
//! <id> create_object <channel> <object> <context_type> <type> <context> <noop|drl> <refill_period_us> <rate>
//! <id> <channel> <object> drl init <refill_period_us> <rate>
//! <id> <channel> <object> drl rate <rate>
//! <id> <channel> <object> drl refill <refill_period_us>
//! ```
//!
//! `<context_type>` is `general`, `posix`, `lsm_kvs_simple`,
//! `lsm_kvs_detailed` or `kvs`; `<type>` and `<context>` are names (or their
//! numbers) from that vocabulary, translated to this crate's classifiers:
//!
//! * context-like words (`foreground`, `bg_flush`, `background`,
//!   `high_priority`, `bg_compaction_L1_L2`, ...) become a set of
//!   [`RequestContext`](crate::RequestContext)s: the detailed names `bg_compaction_L0_L0`,
//!   `bg_compaction_L0_L1`, `bg_compaction_L1_L2` and `bg_compaction_L2_L3`
//!   are the contexts of those names, `bg_compaction_LN` the class of every
//!   compaction from L1 down (so next to an `L2_L3` object it gets the
//!   compactions no other object names, as in Paio); the simple names
//!   `bg_compaction_high_priority` and `bg_compaction_low_priority` are the
//!   classes `bg_compaction_L0_L1` (L0->L0 and L0->L1) and
//!   `bg_compaction_LN` (the rest); `high_priority` is foreground, flush and
//!   L0 compactions; `background` is every background context;
//! * call-like words (`read`, `pwrite64`, `fsync`, `put`, `new_iterator`, ...)
//!   become a set of [`RequestType`](crate::RequestType)s;
//! * `no_op` constrains nothing.
//!
//! When `<type>` and `<context>` both constrain the same classifier they are
//! intersected. Rates are bytes per second (Paio's tokens); the refill period
//! sets the burst (`rate x period`, as Paio's bucket capacity). In
//! `create_object` and `drl init`, `0` stands for Paio's token-bucket default
//! (a period of 1 s, a rate of 50 000/s); in `drl rate`, `0` closes the DRL.
//!
//! Which classifiers a channel rule matches is a stage-wide setting in Paio;
//! here it is [`PaioOptions::channel_classifiers`] (by default the context
//! only; Paio's RocksDB set-up uses the workflow id). Objects are selected by
//! type and context, as in Paio. A channel whose pattern repeats an earlier
//! channel's is created without a route, with a warning (Paio would refuse
//! it; its shipped default file has two such channels under the context-only
//! setting). An object whose pattern repeats another's in the same channel is
//! an error, as in Paio.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{Rule, RuleEntry, RuleSet};
use crate::context::{RequestContext as C, RequestType as T, WorkflowId};
use crate::error::{Error, Location, Result};
use crate::matching::{FieldMatch, Match};
use crate::objects::{DrlSettings, DrlSpec, ObjectChange, ObjectSpec};
use crate::units::Rate;

/// Paio's token-bucket default period (its `m_refill_period`, 1 s).
pub const PAIO_DEFAULT_REFILL_PERIOD: Duration = Duration::from_secs(1);
/// Paio's token-bucket default capacity per period (its `m_capacity`).
pub const PAIO_DEFAULT_RATE: f64 = 50_000.0;

/// Which classifiers a Paio `create_channel` rule matches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelClassifiers {
    /// Match the `<workflow>` field.
    pub workflow: bool,
    /// Match the `<type>` field.
    pub request_type: bool,
    /// Match the `<context>` field.
    pub context: bool,
}

impl Default for ChannelClassifiers {
    fn default() -> Self {
        ChannelClassifiers { workflow: false, request_type: false, context: true }
    }
}

impl std::str::FromStr for ChannelClassifiers {
    type Err = Error;
    /// Parses a comma-separated list such as `workflow` or `type,context`.
    fn from_str(s: &str) -> Result<Self> {
        let mut c = ChannelClassifiers { workflow: false, request_type: false, context: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "workflow" => c.workflow = true,
                "type" => c.request_type = true,
                "context" => c.context = true,
                other => {
                    return Err(Error::invalid(format!(
                        "unknown channel classifier '{other}' (workflow, type, context)"
                    )));
                }
            }
        }
        Ok(c)
    }
}

/// Options of the Paio importer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PaioOptions {
    /// Classifiers a channel rule matches on.
    pub channel_classifiers: ChannelClassifiers,
}

/// What one vocabulary word constrains.
#[derive(Debug, Clone, PartialEq)]
enum Word {
    Nothing,
    Contexts(Vec<C>),
    Types(Vec<T>),
}

const BG_ALL: [C; 5] = [C::BG_FLUSH, C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN, C::BG_COMPACTION, C::BACKGROUND];

fn general(word: &str) -> Option<Word> {
    const NAMES: [&str; 5] = ["no_op", "foreground", "background", "high_priority", "low_priority"];
    Some(match resolve(word, &NAMES)? {
        "no_op" => Word::Nothing,
        "foreground" => Word::Contexts(vec![C::FOREGROUND]),
        "background" => Word::Contexts(BG_ALL.to_vec()),
        "high_priority" => Word::Contexts(vec![C::FOREGROUND, C::BG_FLUSH, C::BG_COMPACTION_L0_L1]),
        _ => Word::Contexts(vec![C::BG_COMPACTION_LN, C::BG_COMPACTION, C::BACKGROUND]),
    })
}

fn lsm_simple(word: &str) -> Option<Word> {
    const NAMES: [&str; 6] =
        ["no_op", "bg_flush", "bg_compaction_high_priority", "bg_compaction_low_priority", "foreground", "background"];
    Some(match resolve(word, &NAMES)? {
        "no_op" => Word::Nothing,
        "bg_flush" => Word::Contexts(vec![C::BG_FLUSH]),
        "bg_compaction_high_priority" => Word::Contexts(vec![C::BG_COMPACTION_L0_L1]),
        "bg_compaction_low_priority" => Word::Contexts(vec![C::BG_COMPACTION_LN]),
        "foreground" => Word::Contexts(vec![C::FOREGROUND]),
        _ => Word::Contexts(BG_ALL.to_vec()),
    })
}

fn lsm_detailed(word: &str) -> Option<Word> {
    const NAMES: [&str; 9] = [
        "no_op",
        "bg_flush",
        "bg_compaction",
        "bg_compaction_L0_L0",
        "bg_compaction_L0_L1",
        "bg_compaction_L1_L2",
        "bg_compaction_L2_L3",
        "bg_compaction_LN",
        "foreground",
    ];
    Some(match resolve(word, &NAMES)? {
        "no_op" => Word::Nothing,
        "bg_flush" => Word::Contexts(vec![C::BG_FLUSH]),
        "bg_compaction" => Word::Contexts(vec![C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN, C::BG_COMPACTION]),
        "bg_compaction_L0_L0" => Word::Contexts(vec![C::BG_COMPACTION_L0_L0]),
        "bg_compaction_L0_L1" => Word::Contexts(vec![C::BG_COMPACTION_L0_L1]),
        "bg_compaction_L1_L2" => Word::Contexts(vec![C::BG_COMPACTION_L1_L2]),
        "bg_compaction_L2_L3" => Word::Contexts(vec![C::BG_COMPACTION_L2_L3]),
        "bg_compaction_LN" => Word::Contexts(vec![C::BG_COMPACTION_LN]),
        _ => Word::Contexts(vec![C::FOREGROUND]),
    })
}

/// Paio's POSIX vocabulary, in its enum order (index = number).
const POSIX: [&str; 91] = [
    "no_op",
    "read",
    "write",
    "pread",
    "pwrite",
    "pread64",
    "pwrite64",
    "fread",
    "fwrite",
    "open",
    "open64",
    "creat",
    "creat64",
    "openat",
    "close",
    "fsync",
    "fdatasync",
    "sync",
    "syncfs",
    "truncate",
    "truncate64",
    "ftruncate",
    "ftruncate64",
    "xstat",
    "xstat64",
    "lxstat",
    "lxstat64",
    "fxstat",
    "fxstat64",
    "fxstatat",
    "fxstatat64",
    "statfs",
    "statfs64",
    "fstatfs",
    "fstatfs64",
    "link",
    "linkat",
    "unlink",
    "unlinkat",
    "rename",
    "renameat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",
    "fopen",
    "fopen64",
    "fdopen",
    "freopen",
    "freopen64",
    "fclose",
    "fflush",
    "access",
    "faccessat",
    "lseek",
    "lseek64",
    "fseek",
    "fseek64",
    "ftell",
    "fseeko",
    "fseeko64",
    "ftello",
    "ftello64",
    "mkdir",
    "mkdirat",
    "readdir",
    "readdir64",
    "opendir",
    "fdopendir",
    "closedir",
    "rmdir",
    "dirfd",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "chmod",
    "fchmod",
    "fchmodat",
    "chown",
    "lchown",
    "fchown",
    "fchownat",
];

fn posix(word: &str) -> Option<Word> {
    let w = resolve(word, &POSIX)?;
    let t = match w {
        "no_op" => return Some(Word::Nothing),
        "read" | "pread" | "pread64" | "fread" => T::Read,
        "write" | "pwrite" | "pwrite64" | "fwrite" => T::Write,
        "open" | "open64" | "creat" | "creat64" | "openat" | "fopen" | "fopen64" | "fdopen" | "freopen"
        | "freopen64" => T::Open,
        "close" | "fclose" => T::Close,
        "fsync" | "fdatasync" | "sync" | "syncfs" | "fflush" => T::Sync,
        "truncate" | "truncate64" | "ftruncate" | "ftruncate64" => T::Truncate,
        "unlink" | "unlinkat" | "rmdir" => T::Delete,
        "rename" | "renameat" => T::Rename,
        _ => T::Metadata,
    };
    Some(Word::Types(vec![t]))
}

fn kvs(word: &str) -> Option<Word> {
    const NAMES: [&str; 10] = [
        "no_op",
        "put",
        "get",
        "new_iterator",
        "delete",
        "write",
        "get_snapshot",
        "get_property",
        "get_approximate_size",
        "compact_range",
    ];
    let word = if word == "delete_" { "delete" } else { word };
    let t = match resolve(word, &NAMES)? {
        "no_op" => return Some(Word::Nothing),
        "put" => T::Put,
        "get" => T::Get,
        "new_iterator" => T::Scan,
        "delete" => T::Delete,
        "write" => T::WriteBatch,
        "compact_range" => T::Other,
        _ => T::Metadata,
    };
    Some(Word::Types(vec![t]))
}

/// A word by name (case-insensitive) or by its number in the vocabulary.
fn resolve<'a>(word: &str, names: &[&'a str]) -> Option<&'a str> {
    if let Ok(n) = word.parse::<usize>() {
        return names.get(n).copied();
    }
    names.iter().find(|n| n.eq_ignore_ascii_case(word)).copied()
}

type Vocabulary = fn(&str) -> Option<Word>;

fn vocabulary(context_type: &str) -> Option<(Vocabulary, &'static str)> {
    Some(match context_type {
        "general" => (general as Vocabulary, "general"),
        "posix" => (posix, "posix"),
        "lsm_kvs_simple" => (lsm_simple, "lsm_kvs_simple"),
        "lsm_kvs_detailed" => (lsm_detailed, "lsm_kvs_detailed"),
        "kvs" => (kvs, "kvs"),
        _ => return None,
    })
}

struct Line<'a> {
    tokens: Vec<&'a str>,
    location: Location,
}

impl Line<'_> {
    fn err(&self, field: &str, msg: impl Into<String>) -> Error {
        Error::rule(&self.location, Some(field), msg)
    }

    fn token(&self, i: usize, field: &str) -> Result<&str> {
        self.tokens.get(i).copied().ok_or_else(|| self.err(field, format!("missing `{field}`")))
    }

    fn ident(&self, i: usize, field: &str) -> Result<String> {
        let t = self.token(i, field)?;
        if t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            Ok(t.to_owned())
        } else {
            Err(self.err(field, format!("'{t}' is not a valid id")))
        }
    }

    fn number(&self, i: usize, field: &str) -> Result<f64> {
        let t = self.token(i, field)?;
        let v: f64 = t.parse().map_err(|_| self.err(field, format!("'{t}' is not a number")))?;
        if !v.is_finite() {
            return Err(self.err(field, format!("'{t}' is not finite")));
        }
        if v < 0.0 {
            return Err(self.err(field, format!("'{t}' is negative")));
        }
        Ok(v)
    }

    fn integer(&self, i: usize, field: &str) -> Result<u64> {
        let t = self.token(i, field)?;
        t.parse().map_err(|_| self.err(field, format!("'{t}' is not a non-negative integer")))
    }

    fn expect_len(&self, n: usize, form: &str) -> Result<()> {
        if self.tokens.len() != n {
            return Err(self.err("line", format!("expected {n} fields ({form}), found {}", self.tokens.len())));
        }
        Ok(())
    }

    /// `(types, contexts)` constrained by the `<type>` and `<context>` words.
    fn classify(
        &self,
        vocab: (Vocabulary, &str),
        type_at: Option<usize>,
        context_at: Option<usize>,
    ) -> Result<(FieldMatch<T>, FieldMatch<C>)> {
        let mut types = FieldMatch::Any;
        let mut contexts = FieldMatch::Any;
        for (at, field) in [(type_at, "type"), (context_at, "context")] {
            let Some(at) = at else { continue };
            let word = self.token(at, field)?;
            let w = (vocab.0)(word)
                .ok_or_else(|| self.err(field, format!("'{word}' is not in the {} vocabulary", vocab.1)))?;
            let (t, c) = match w {
                Word::Nothing => continue,
                Word::Types(t) => (FieldMatch::set(t), FieldMatch::Any),
                Word::Contexts(c) => (FieldMatch::Any, FieldMatch::set(c)),
            };
            types = types
                .intersect(&t)
                .ok_or_else(|| self.err(field, format!("'{word}' excludes every request the other field selects")))?;
            contexts = contexts
                .intersect(&c)
                .ok_or_else(|| self.err(field, format!("'{word}' excludes every request the other field selects")))?;
        }
        Ok((types, contexts))
    }
}

fn drl_spec(period_us: f64, rate: f64) -> ObjectSpec {
    let period =
        if period_us == 0.0 { PAIO_DEFAULT_REFILL_PERIOD } else { Duration::from_nanos((period_us * 1e3) as u64) };
    let rate = if rate == 0.0 { PAIO_DEFAULT_RATE } else { rate };
    ObjectSpec::Drl(DrlSpec {
        rate: Rate::from_bytes_per_sec(rate).expect("validated by the parser"),
        burst: None,
        refill_period: Some(period),
    })
}

/// Parses Paio text rules. See the module documentation.
pub fn parse(text: &str, source: Option<Arc<str>>, opts: &PaioOptions) -> Result<RuleSet> {
    let mut out = RuleSet::default();
    let mut ids: HashMap<u64, usize> = HashMap::new();
    // channel -> objects; channel patterns; (channel, object pattern) seen.
    let mut channels: HashMap<String, HashSet<String>> = HashMap::new();
    let mut channel_patterns: HashMap<Match, String> = HashMap::new();
    let mut object_patterns: HashMap<(String, Match), String> = HashMap::new();

    for (n, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let line_no = n + 1;
        let mut line = Line {
            tokens: content.split_whitespace().collect(),
            location: Location { source: source.clone(), line: Some(line_no), index: out.rules.len(), id: None },
        };
        let id = line.integer(0, "id")?;
        line.location.id = Some(id);
        if let Some(first) = ids.insert(id, line_no) {
            return Err(line.err("id", format!("duplicate rule id {id} (first used on line {first})")));
        }
        let verb = line.token(1, "operation")?;
        let mut push = |rule: Rule, line: &Line<'_>| {
            out.rules.push(RuleEntry { rule, location: line.location.clone() });
        };
        match verb {
            "create_channel" => {
                line.expect_len(7, "<id> create_channel <channel> <context_type> <workflow> <type> <context>")?;
                let channel = line.ident(2, "channel")?;
                let ct = line.token(3, "context_type")?;
                let vocab = vocabulary(ct).ok_or_else(|| {
                    line.err(
                        "context_type",
                        format!("unknown context type '{ct}' (general, posix, lsm_kvs_simple, lsm_kvs_detailed, kvs)"),
                    )
                })?;
                let workflow = line.integer(4, "workflow")?;
                let cls = opts.channel_classifiers;
                let (types, contexts) =
                    line.classify(vocab, cls.request_type.then_some(5), cls.context.then_some(6))?;
                // Validate the unused words too, so typos never pass silently.
                line.classify(vocab, Some(5), Some(6))?;
                let pattern = Match {
                    workflow: if cls.workflow { FieldMatch::one(WorkflowId(workflow)) } else { FieldMatch::Any },
                    request_type: types,
                    context: contexts,
                    ..Match::default()
                };
                if channels.contains_key(&channel) {
                    return Err(line.err("channel", format!("channel '{channel}' already exists")));
                }
                channels.insert(channel.clone(), HashSet::new());
                let matches = match channel_patterns.get(&pattern) {
                    Some(first) => {
                        out.warnings.push(format!(
                            "{}: channel '{channel}' has the same differentiation {pattern} as channel '{first}'; it is created without a route",
                            line.location
                        ));
                        None
                    }
                    None => {
                        channel_patterns.insert(pattern.clone(), channel.clone());
                        Some(pattern)
                    }
                };
                push(Rule::CreateChannel { channel, matches }, &line);
            }
            "create_object" => {
                line.expect_len(
                    10,
                    "<id> create_object <channel> <object> <context_type> <type> <context> <noop|drl> <refill_period_us> <rate>",
                )?;
                let channel = line.ident(2, "channel")?;
                let object = line.ident(3, "object")?;
                let ct = line.token(4, "context_type")?;
                let vocab = vocabulary(ct).ok_or_else(|| {
                    line.err(
                        "context_type",
                        format!("unknown context type '{ct}' (general, posix, lsm_kvs_simple, lsm_kvs_detailed, kvs)"),
                    )
                })?;
                let (types, contexts) = line.classify(vocab, Some(5), Some(6))?;
                let kind = line.token(7, "object_type")?;
                let period = line.number(8, "refill_period")?;
                let rate = line.number(9, "rate")?;
                let spec = match kind {
                    "noop" => ObjectSpec::Noop,
                    "drl" => drl_spec(period, rate),
                    other => return Err(line.err("object_type", format!("unknown object type '{other}' (noop, drl)"))),
                };
                // Channels and objects from other files (or already in the
                // stage) are checked when the rules are applied, which names
                // this line too.
                if let Some(objects) = channels.get_mut(&channel)
                    && !objects.insert(object.clone())
                {
                    return Err(line.err("object", format!("object '{object}' already exists in channel '{channel}'")));
                }
                let pattern = Match { request_type: types, context: contexts, ..Match::default() };
                let key = (channel.clone(), pattern.clone());
                if let Some(first) = object_patterns.get(&key) {
                    return Err(line.err(
                        "context",
                        format!("object '{object}' has the same differentiation {pattern} as object '{first}' of channel '{channel}'"),
                    ));
                }
                object_patterns.insert(key, object.clone());
                let matches = Some(pattern);
                push(Rule::CreateObject { channel, object, spec, matches }, &line);
            }
            _ => {
                // <id> <channel> <object> drl init|rate|refill ...
                let channel = line.ident(1, "channel")?;
                let object = line.ident(2, "object")?;
                let kind = line.token(3, "object_type")?;
                if kind != "drl" {
                    return Err(line.err(
                        "operation",
                        format!("unknown operation '{verb}' (create_channel, create_object, or `<channel> <object> drl init|rate|refill`)"),
                    ));
                }
                let op = line.token(4, "drl_operation")?;
                let set = match op {
                    "init" => {
                        line.expect_len(7, "<id> <channel> <object> drl init <refill_period_us> <rate>")?;
                        let period = line.number(5, "refill_period")?;
                        let rate = line.number(6, "rate")?;
                        let ObjectSpec::Drl(d) = drl_spec(period, rate) else { unreachable!() };
                        DrlSettings { rate: Some(d.rate), refill_period: d.refill_period, burst: None }.into()
                    }
                    "rate" => {
                        line.expect_len(6, "<id> <channel> <object> drl rate <rate>")?;
                        let rate = line.number(5, "rate")?;
                        ObjectChange::rate(Rate::from_bytes_per_sec(rate).expect("checked"))
                    }
                    "refill" => {
                        line.expect_len(6, "<id> <channel> <object> drl refill <refill_period_us>")?;
                        let period = line.number(5, "refill_period")?;
                        if period == 0.0 {
                            return Err(line.err("refill_period", "must be greater than zero"));
                        }
                        DrlSettings {
                            refill_period: Some(Duration::from_nanos((period * 1e3) as u64)),
                            ..Default::default()
                        }
                        .into()
                    }
                    other => {
                        return Err(
                            line.err("drl_operation", format!("unknown DRL operation '{other}' (init, rate, refill)"))
                        );
                    }
                };
                push(Rule::Configure { channel, object, set, ignore_unsupported: true }, &line);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str, opts: PaioOptions) -> Result<RuleSet> {
        parse(text, Some("rules".into()), &opts)
    }

    #[test]
    fn rocksdb_style_file() {
        let text = "1 create_channel 2000 lsm_kvs_simple 2000 background bg_flush\n\
                    2 create_channel 3000 lsm_kvs_simple 3000 background no_op\n\
                    3 create_object 2000 1 lsm_kvs_simple background bg_flush drl 10000 12000000\n\
                    4 create_object 3000 1 lsm_kvs_simple background bg_compaction_high_priority drl 10000 12000000\n\
                    5 create_object 3000 2 lsm_kvs_simple background bg_compaction_low_priority drl 10000 6000000\n";
        let opts = PaioOptions { channel_classifiers: "workflow".parse().unwrap() };
        let rs = parse_str(text, opts).unwrap();
        assert!(rs.warnings.is_empty(), "{:?}", rs.warnings);
        let Rule::CreateChannel { matches: Some(m), .. } = &rs.rules[0].rule else { panic!() };
        assert_eq!(*m, Match::workflow(WorkflowId(2000)));
        let Rule::CreateObject { spec: ObjectSpec::Drl(d), matches: Some(m), .. } = &rs.rules[4].rule else { panic!() };
        assert_eq!(d.rate.per_sec(), 6e6);
        assert_eq!(d.refill_period, Some(Duration::from_millis(10)));
        assert_eq!(*m, Match::context(C::BG_COMPACTION_LN));
    }

    #[test]
    fn numbers_name_vocabulary_entries() {
        // lsm_kvs_simple: 1 = bg_flush; posix: 1 = read.
        let rs = parse_str(
            "1 create_channel a lsm_kvs_simple 0 0 1\n2 create_channel b posix 0 1 0\n",
            PaioOptions { channel_classifiers: "type,context".parse().unwrap() },
        )
        .unwrap();
        let Rule::CreateChannel { matches: Some(m), .. } = &rs.rules[0].rule else { panic!() };
        assert_eq!(*m, Match::context(C::BG_FLUSH));
        let Rule::CreateChannel { matches: Some(m), .. } = &rs.rules[1].rule else { panic!() };
        assert_eq!(*m, Match::request_type(T::Read));
    }

    #[test]
    fn defaults_and_enforcement_lines() {
        let rs = parse_str(
            "1 create_channel 3000 general 3000 no_op no_op\n\
             2 create_object 3000 1 general no_op no_op drl 0 0\n\
             3 3000 1 drl init 10000 120000\n\
             4 3000 1 drl rate 150000\n\
             5 3000 1 drl refill 20000\n",
            PaioOptions::default(),
        )
        .unwrap();
        let Rule::CreateObject { spec: ObjectSpec::Drl(d), .. } = &rs.rules[1].rule else { panic!() };
        assert_eq!(d.rate.per_sec(), PAIO_DEFAULT_RATE);
        assert_eq!(d.refill_period, Some(PAIO_DEFAULT_REFILL_PERIOD));
        assert_eq!(
            rs.rules[3].rule,
            Rule::Configure {
                channel: "3000".into(),
                object: "1".into(),
                set: ObjectChange::rate(Rate::from_bytes_per_sec(150000.0).unwrap()),
                ignore_unsupported: true,
            }
        );
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        let cases: &[(&str, usize, &str, &str)] = &[
            (
                "1 create_channel a general 1 foreground foreground\n2 create_object b 1 general foreground foreground noop 0 0\n",
                2,
                "channel",
                "unknown channel 'b'",
            ),
            (
                "1 create_channel a general 1 foreground foreground\n2 a 9 drl rate 5\n",
                2,
                "object",
                "unknown object '9'",
            ),
            (
                "1 create_channel a general 1 foreground foreground\n2 create_object a 1 general foreground foreground drl 10000 -5\n",
                2,
                "rate",
                "negative",
            ),
            (
                "1 create_channel a general 1 foreground foreground\n2 create_object a 1 general foreground foreground drl 10000 nan\n",
                2,
                "rate",
                "not finite",
            ),
            (
                "1 create_channel a general 1 foreground foreground\n1 create_channel b general 2 foreground foreground\n",
                2,
                "id",
                "duplicate rule id 1",
            ),
            ("1 create_channel a general 1 foreground bg_flushh\n", 1, "context", "not in the general vocabulary"),
            ("1 create_channel a lsm_kvs_simple 1 foreground\n", 1, "line", "expected 7 fields"),
            ("\n\n1 create_channel a nosuch 1 foreground foreground\n", 3, "context_type", "unknown context type"),
            ("x create_channel a general 1 foreground foreground\n", 1, "id", "not a non-negative integer"),
            (
                "1 create_channel a general 1 foreground foreground\n2 create_object a 1 general foreground foreground lru 0 0\n",
                2,
                "object_type",
                "unknown object type",
            ),
            (
                "1 create_channel a general 1 foreground foreground\n2 create_object a 1 general foreground foreground noop 0 0\n3 a 1 drl bump 5\n",
                3,
                "drl_operation",
                "unknown DRL operation",
            ),
            ("1 create_channel a lsm_kvs_simple 1 foreground bg_flush\n", 1, "context", "excludes every request"),
        ];
        for (text, line, field, msg) in cases {
            // Some errors are found while parsing, the rest when the rules
            // meet a stage (unknown channels and objects); both name the line.
            let opts = PaioOptions { channel_classifiers: "type,context".parse().unwrap() };
            let e = match parse_str(text, opts) {
                Err(e) => e,
                Ok(rs) => crate::Stage::new("t").apply(&rs).expect_err("the rules must be rejected"),
            };
            assert_eq!(e.location().and_then(|l| l.line), Some(*line), "{text}: {e}");
            assert_eq!(e.field(), Some(*field), "{text}: {e}");
            assert!(e.to_string().contains(msg), "{text}: {e}");
            assert!(e.to_string().starts_with(&format!("rules:{line}")), "{e}");
        }
    }

    #[test]
    fn duplicate_object_pattern_is_an_error() {
        let e = parse_str(
            "1 create_channel c lsm_kvs_detailed 1 no_op no_op
             2 create_object c 1 lsm_kvs_simple no_op bg_compaction_high_priority drl 0 0
             3 create_object c 2 lsm_kvs_detailed no_op bg_compaction_L0_L1 drl 0 0
",
            PaioOptions::default(),
        )
        .unwrap_err();
        assert_eq!(e.location().unwrap().line, Some(3));
        assert!(e.to_string().contains("same differentiation"), "{e}");
    }

    #[test]
    fn duplicate_patterns_warn_and_keep_the_first_route() {
        let rs = parse_str(
            "3 create_channel 3000 general 3000 no_op no_op\n4 create_channel 4000 general 4000 no_op no_op\n",
            PaioOptions::default(),
        )
        .unwrap();
        assert_eq!(rs.warnings.len(), 1);
        assert!(rs.warnings[0].contains("4000"));
        assert!(matches!(&rs.rules[1].rule, Rule::CreateChannel { matches: None, .. }));
    }
}
