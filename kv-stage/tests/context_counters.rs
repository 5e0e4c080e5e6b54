//! Per-context counters: every request, its file data requests, and its
//! file writes; and the client write rate a controller reads from them.

use kv_stage::{Context, ContextScope, RequestContext, RequestType, Stage};

#[test]
fn file_writes_are_counted_per_context_and_client_writes_leave_out_background() {
    let stage = Stage::new("counters");
    let before = stage.collect();
    for _ in 0..3 {
        stage.enforce(&Context::new(RequestType::Write, 4096)).unwrap();
    }
    stage.enforce(&Context::new(RequestType::Read, 1000)).unwrap();
    stage.enforce(&Context::new(RequestType::Put, 500)).unwrap();
    {
        let _flush = ContextScope::enter(RequestContext::BG_FLUSH);
        stage.enforce(&Context::new(RequestType::Write, 8192)).unwrap();
    }
    let now = stage.collect();

    let fg = now.contexts.iter().find(|c| c.context == RequestContext::FOREGROUND).unwrap();
    assert_eq!((fg.counter.ops, fg.counter.bytes), (5, 3 * 4096 + 1000 + 500));
    assert_eq!((fg.file.ops, fg.file.bytes), (4, 3 * 4096 + 1000));
    assert_eq!((fg.file_writes.ops, fg.file_writes.bytes), (3, 3 * 4096));
    let flush = now.contexts.iter().find(|c| c.context == RequestContext::BG_FLUSH).unwrap();
    assert_eq!((flush.file_writes.ops, flush.file_writes.bytes), (1, 8192));

    let rates = now.rates_since(&before);
    let secs = rates.interval.as_secs_f64();
    let writes = rates.client_file_writes();
    assert!((writes.bytes_per_sec * secs - 3.0 * 4096.0).abs() < 1e-3, "{writes:?} over {secs} s");
    assert!((writes.ops_per_sec * secs - 3.0).abs() < 1e-6, "{writes:?} over {secs} s");
    let file = rates.client_file();
    assert!((file.bytes_per_sec * secs - (3.0 * 4096.0 + 1000.0)).abs() < 1e-3, "{file:?}");
}
