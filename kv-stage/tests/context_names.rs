//! Request context names live for the whole process (lookups hand out
//! `&'static str`), so the names a process stores are capped: batches that
//! declare ever new names and fail (or never apply) cannot grow memory
//! without bound. Its own test binary: it fills the process's name store.

use kv_stage::paio::PaioOptions;
use kv_stage::{RequestContext, RuleSet, RulesFormat};

fn declare(name: &str) -> Result<RuleSet, String> {
    let text = format!("version = 1\ncontexts = [\"{name}\"]\n");
    RuleSet::parse(&text, RulesFormat::Toml, Some("names.toml".into()), &PaioOptions::default())
        .map_err(|e| e.to_string())
}

#[test]
fn distinct_names_are_capped_and_ids_are_never_leaked() {
    let free = RequestContext::free_ids();
    RequestContext::register("app_before").unwrap();
    // Batches declaring distinct names that are never applied: each
    // reserves an id while it lives and gives it back when dropped.
    let mut stored = 0;
    let err = loop {
        match declare(&format!("never_applied_{stored}")) {
            Ok(set) => drop(set),
            Err(e) => break e,
        }
        stored += 1;
        assert!(stored <= 10_000, "no cap on stored names");
    };
    assert!(err.contains("distinct context names"), "{err}");
    assert!(stored >= 4000, "capped after only {stored} names");
    assert_eq!(RequestContext::free_ids(), free - 1, "a dropped batch kept its id");
    // Names stored before still work: declared again, or registered.
    assert!(declare("never_applied_7").is_ok());
    assert_eq!(RequestContext::register("app_before").unwrap(), RequestContext::lookup("app_before").unwrap());
    RequestContext::register("never_applied_8").unwrap();
    // A new name is refused with the same message, not a panic.
    let e = RequestContext::register("brand_new_name").unwrap_err().to_string();
    assert!(e.contains("distinct context names"), "{e}");
}
