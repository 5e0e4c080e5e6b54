//! A rules batch that declares a new request context and then a bad one,
//! in a process of its own (context ids are process-wide: no other test
//! may register one meanwhile).

/// A batch that declares a new context and then a bad one is refused, and
/// gives the new one's id back. It used to deadlock (the reservation was
/// dropped while its own thread held the registry's lock), which the fuzz
/// harness found; run in a thread so a regression fails instead of hanging.
#[test]
fn a_batch_declaring_a_new_context_then_a_bad_one_is_refused_and_keeps_nothing() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let free = kv_stage::RequestContext::free_ids();
        let text = "version = 1\ncontexts = [\"fresh_then_bad\", \"no spaces allowed\"]\n";
        let e = kv_stage::RuleSet::from_toml(text).unwrap_err().to_string();
        let after = kv_stage::RequestContext::free_ids();
        // And the good name alone still parses (its id was given back).
        let ok = kv_stage::RuleSet::from_toml("version = 1\ncontexts = [\"fresh_then_bad\"]\n").is_ok();
        let _ = tx.send((e, free, after, ok));
    });
    let (e, free, after, ok) = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("parsing hung (deadlock)");
    assert!(e.contains("no spaces allowed"), "{e}");
    assert_eq!(free, after, "the new context's id was given back");
    assert!(ok);
}
