//! The README's example, kept compiling and passing.

use std::sync::Arc;

use kv_stage::{
    Context, ContextScope, DrlSpec, Match, ObjectChange, ObjectSpec, RequestContext, RequestType, Rule, Stage,
};

#[test]
fn readme_example() -> Result<(), Box<dyn std::error::Error>> {
    let stage = Arc::new(Stage::new("db"));
    stage.apply_rules([
        // Flushes go through a 64 MiB/s token bucket.
        Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
        Rule::CreateObject {
            channel: "flush".into(),
            object: "drl".into(),
            spec: ObjectSpec::Drl(DrlSpec::new("64MiB/s".parse()?)),
            matches: None, // the channel's default object
        },
    ])?;

    // A layer tags its requests (here: this thread is flushing) and enforces each
    // one before doing it. `enforce` blocks while the bucket is empty.
    let _scope = ContextScope::enter(RequestContext::BG_FLUSH);
    stage.enforce(&Context::new(RequestType::Write, 1 << 20))?;

    // A control plane reads monotonic counters and changes rates live.
    let before = stage.collect();
    stage.configure("flush", "drl", ObjectChange::rate("16MiB/s".parse()?))?;
    let rates = stage.collect().rates_since(&before);
    println!("flush: {:.0} B/s", rates.context(RequestContext::BG_FLUSH).bytes_per_sec);
    assert_eq!(stage.collect().context(RequestContext::BG_FLUSH).bytes, 1 << 20);
    Ok(())
}

/// The README's rules file (the TOML block that starts with `version`)
/// parses and applies to a fresh stage, with the volumes and the channel it
/// promises.
#[test]
fn readme_rules_file_applies() -> Result<(), Box<dyn std::error::Error>> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))?;
    let start = readme.find("```toml\nversion").ok_or("the README has no rules file")? + "```toml\n".len();
    let end = start + readme[start..].find("```").ok_or("the rules file's block is not closed")?;
    let rules = kv_stage::RuleSet::from_toml(&readme[start..end])?;
    let stage = Stage::new("readme");
    stage.apply(&rules)?;
    let info = stage.stage_info();
    for channel in ["db", "tenant-a", "aged"] {
        assert!(info.channels.iter().any(|c| c.id == channel), "channel {channel} missing: {info:?}");
    }
    Ok(())
}
