//! Every parser that reads outside input, under mutated input: Paio rule
//! text, TOML and JSON rules files (volumes included) and `io.max` lines.
//! Each case starts from a real file of the repository (or a line the docs
//! show) and applies random edits: bytes deleted, inserted, replaced,
//! spans duplicated, tokens that parsers find hard (`1e308`, `-0`, `NaN`,
//! huge numbers, unbalanced quotes and brackets) spliced in. A parse must
//! return `Ok` or an error, never panic; what parses is applied to a fresh
//! stage, which must not panic either; no case may take more than a few
//! seconds (a hang detector, not a performance target). Inputs are capped
//! at 64 KiB, so nothing can allocate without bound.
//!
//! Bounded: `FUZZ_CASES` cases per parser (default 3000, about 1 s in
//! all on this machine's release build); failures proptest finds are kept
//! in `fuzz_parsers.proptest-regressions` and replayed first.

use std::time::{Duration, Instant};

use kv_stage::iomax::IoMaxLine;
use kv_stage::paio::PaioOptions;
use kv_stage::{RuleSet, RulesFormat, Stage};
use proptest::prelude::*;

const SEED_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/");

fn seed(path: &str) -> String {
    std::fs::read_to_string(format!("{SEED_DIR}{path}")).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Tokens spliced in by the `Splice` edit.
const TOKENS: &[&str] = &[
    "1e308",
    "-1e308",
    "1e-320",
    "-0",
    "NaN",
    "inf",
    "18446744073709551616",
    "4294967296",
    "0",
    "max",
    "\"",
    "'",
    "[",
    "]",
    "{",
    "}",
    "[[rules]]",
    "[[volumes]]",
    "=",
    ",",
    "\n",
    "\t",
    "\\",
    "\u{0}",
    "é",
    "#",
    "op = ",
    "match",
    "create_channel",
    "create_object",
    "drl",
    "qos",
    "noop",
    "batch",
    "rbps=",
    "wbps=max",
    "riops=",
    "8:0",
    "*",
    "/",
    "..",
    "KiB",
    "ops/s",
    "ms",
    "h",
    "context",
    "workflow",
    "instance",
    "foreground",
    "bg_compaction_L0_L1",
    "999999999999999999999999",
    "-",
    "+",
    "e",
    ".",
    ":",
];

#[derive(Debug, Clone)]
enum Edit {
    Delete { at: usize, len: usize },
    Insert { at: usize, byte: u8 },
    Replace { at: usize, byte: u8 },
    Duplicate { at: usize, len: usize },
    Splice { at: usize, token: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Edit::Delete { at, len }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Insert { at, byte }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Edit::Replace { at, byte }),
        (any::<usize>(), 1usize..256).prop_map(|(at, len)| Edit::Duplicate { at, len }),
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, token)| Edit::Splice { at, token }),
    ]
}

/// Applies `edits` to `text`; the result is cut at 64 KiB and made UTF-8
/// (lossily: the parsers take `&str`).
fn mutate(text: &str, edits: &[Edit]) -> String {
    let mut b = text.as_bytes().to_vec();
    for e in edits {
        let at = |i: usize| if b.is_empty() { 0 } else { i % (b.len() + 1) };
        match *e {
            Edit::Delete { at: i, len } => {
                let i = at(i).min(b.len());
                let end = (i + len).min(b.len());
                b.drain(i..end);
            }
            Edit::Insert { at: i, byte } => {
                let i = at(i);
                b.insert(i, byte);
            }
            Edit::Replace { at: i, byte } => {
                if !b.is_empty() {
                    let i = i % b.len();
                    b[i] = byte;
                }
            }
            Edit::Duplicate { at: i, len } => {
                let i = at(i).min(b.len());
                let end = (i + len).min(b.len());
                let span = b[i..end].to_vec();
                b.splice(i..i, span);
            }
            Edit::Splice { at: i, token } => {
                let i = at(i);
                b.splice(i..i, TOKENS[token].bytes());
            }
        }
        b.truncate(64 << 10);
    }
    String::from_utf8_lossy(&b).into_owned()
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

/// Parses `text` as `format` and applies what parses to a fresh stage.
fn parse_and_apply(text: &str, format: RulesFormat) {
    let t = Instant::now();
    if let Ok(set) = RuleSet::parse(text, format, Some("fuzz".into()), &PaioOptions::default()) {
        let _ = Stage::new("fuzz").apply(&set);
    }
    assert!(t.elapsed() < Duration::from_secs(5), "one input took {:?}", t.elapsed());
}

fn seeds(format: RulesFormat) -> Vec<String> {
    match format {
        RulesFormat::Toml => vec![
            seed("examples/rules/rocksdb.toml"),
            seed("examples/rules/compaction_levels.toml"),
            seed("examples/rules/volumes.toml"),
        ],
        RulesFormat::Json => {
            vec![
                seed("examples/rules/volumes.json"),
                seed("tests/paio/layouts/rocksdb_housekeeping_rules.context.json"),
            ]
        }
        RulesFormat::Paio => vec![
            seed("tests/paio/rocksdb_housekeeping_rules"),
            seed("tests/paio/default_enforcement_rules_file"),
            seed("tests/paio/tensorflow_housekeeping_rules"),
        ],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn toml_rules_never_panic(which in 0usize..3, edits in prop::collection::vec(edit(), 1..12)) {
        let s = seeds(RulesFormat::Toml);
        parse_and_apply(&mutate(&s[which % s.len()], &edits), RulesFormat::Toml);
    }

    #[test]
    fn json_rules_never_panic(which in 0usize..2, edits in prop::collection::vec(edit(), 1..12)) {
        let s = seeds(RulesFormat::Json);
        parse_and_apply(&mutate(&s[which % s.len()], &edits), RulesFormat::Json);
    }

    #[test]
    fn paio_rules_never_panic(which in 0usize..3, edits in prop::collection::vec(edit(), 1..12)) {
        let s = seeds(RulesFormat::Paio);
        parse_and_apply(&mutate(&s[which % s.len()], &edits), RulesFormat::Paio);
    }

    #[test]
    fn io_max_lines_never_panic(edits in prop::collection::vec(edit(), 1..8)) {
        let line = mutate("8:16 rbps=8MiB wbps=4194304 riops=200 wiops=max", &edits);
        let _ = line.parse::<IoMaxLine>();
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,400}") {
        for format in [RulesFormat::Toml, RulesFormat::Json, RulesFormat::Paio] {
            parse_and_apply(&text, format);
        }
        let _ = text.parse::<IoMaxLine>();
    }
}
