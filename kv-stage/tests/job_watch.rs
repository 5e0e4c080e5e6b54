//! `Stage::watch_jobs`: a watcher is called once per job start, on the
//! thread that reports it, until its guard is dropped; a watcher that
//! panics neither fails the job's start nor stops the others.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kv_stage::{InstanceId, RequestContext, Stage};

#[test]
fn watchers_hear_each_job_start_until_dropped() {
    let stage = Stage::new("jobs");
    let heard = Arc::new(AtomicU64::new(0));
    let h = Arc::clone(&heard);
    let watch = stage.watch_jobs(move || {
        h.fetch_add(1, Ordering::Relaxed);
    });
    let _panicky = stage.watch_jobs(|| panic!("a watcher that fails"));
    stage.job_started(InstanceId(0), RequestContext::BG_FLUSH);
    stage.job_started(InstanceId(1), RequestContext::BG_COMPACTION_L0_L1);
    // Ends are not starts.
    stage.job_finished(InstanceId(0), RequestContext::BG_FLUSH);
    assert_eq!(heard.load(Ordering::Relaxed), 2);
    drop(watch);
    stage.job_started(InstanceId(0), RequestContext::BG_FLUSH);
    assert_eq!(heard.load(Ordering::Relaxed), 2, "a dropped watch was called");
    // The jobs were counted whatever the watchers did.
    let c = stage.collect();
    assert_eq!(c.jobs(RequestContext::BG_FLUSH).counts.begun, 2);
    assert_eq!(c.jobs(RequestContext::BG_FLUSH).counts.running, 1);
}
