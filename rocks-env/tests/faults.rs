//! A failing enforcement object makes RocksDB return an error to the caller,
//! and the DB reopens cleanly with every acknowledged write.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;
use kv_stage::{
    Context, FieldError, Match, ObjectChange, RequestContext, RequestType, Rule, Stage,
    errors::Rejection,
    object::{EnforcementObject, Outcome},
};
use rocks_env::StagedDb;

/// Fails writes while armed (a disk that starts returning EIO).
struct FailWrites(AtomicBool);

impl EnforcementObject for FailWrites {
    fn kind(&self) -> &'static str {
        "fail-writes"
    }
    fn validate(&self, _: &ObjectChange) -> Result<(), FieldError> {
        Ok(())
    }
    fn configure(&self, _: &ObjectChange) {}
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        if self.0.load(Ordering::Relaxed) && ctx.request_type == RequestType::Write {
            Err(Rejection::Failed("injected write failure".into()))
        } else {
            Ok(Outcome::IMMEDIATE)
        }
    }
}

#[test]
fn a_refused_write_fails_the_put_and_the_db_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("faults"));
    stage
        .apply_rules([Rule::CreateChannel {
            channel: "fg".into(),
            matches: Some(Match::context(RequestContext::FOREGROUND)),
        }])
        .unwrap();
    let fault = Arc::new(FailWrites(AtomicBool::new(false)));
    stage.create_custom_object("fg", "fault", fault.clone(), None).unwrap();

    let mut acked = Vec::new();
    {
        let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
        let mut sync = rocksdb::WriteOptions::default();
        sync.set_sync(true);
        for i in 0..2_000u64 {
            db.put_opt(key(i), value(i, 512), &sync).unwrap();
            acked.push(i);
        }
        fault.0.store(true, Ordering::Relaxed);
        let err = db.put_opt(key(999_999), value(0, 512), &sync).unwrap_err();
        assert!(err.to_string().contains("injected write failure"), "{err}");
        assert!(db.refused_requests() >= 1);
        // Further writes fail too while the fault lasts (RocksDB may also
        // have stopped accepting writes after the WAL error).
        assert!(db.put_opt(key(1_000_000), value(0, 512), &sync).is_err());
        fault.0.store(false, Ordering::Relaxed);
    }
    // Reopen (through the wrapper, fault cleared): every acknowledged write
    // is there.
    let db = StagedDb::builder(small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    for i in acked {
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&value(i, 512)[..]), "acknowledged key {i} lost");
    }
    db.put(key(5), b"after recovery").unwrap();
    assert_eq!(db.get(key(5)).unwrap().as_deref(), Some(&b"after recovery"[..]));
}
