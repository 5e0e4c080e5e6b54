//! File system calls beyond reads, writes and opens go through the stage
//! too: creating directories, the LOCK file, space preallocation
//! (`Allocate`, which `PrepareWrite` calls as a file grows) and syncs by
//! name (`SyncFile`, what SST ingestion by link uses).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kv_stage::{
    Context, FieldError, Match, ObjectChange, RequestType, Rule, Stage,
    errors::Rejection,
    object::{EnforcementObject, Outcome},
};
use rocks_env::{FileKind, StagedDb};

/// Counts the metadata requests it sees; refuses them while armed.
#[derive(Default)]
struct Metadata {
    seen: AtomicU64,
    refuse: AtomicBool,
}

impl EnforcementObject for Metadata {
    fn kind(&self) -> &'static str {
        "metadata-probe"
    }
    fn validate(&self, _: &ObjectChange) -> Result<(), FieldError> {
        Ok(())
    }
    fn configure(&self, _: &ObjectChange) {}
    fn enforce(&self, _: &Context) -> Result<Outcome, Rejection> {
        self.seen.fetch_add(1, Ordering::Relaxed);
        if self.refuse.load(Ordering::Relaxed) {
            return Err(Rejection::Failed("metadata refused by the test".into()));
        }
        Ok(Outcome::IMMEDIATE)
    }
}

/// A stage whose `Metadata` requests (of every context) go to `probe`.
fn probing_stage() -> (Arc<Stage>, Arc<Metadata>) {
    let stage = Arc::new(Stage::new("fscalls"));
    stage.apply_rules([Rule::CreateChannel { channel: "meta".into(), matches: None }]).unwrap();
    stage
        .apply_rules([Rule::Route { channel: "meta".into(), matches: Match::request_type(RequestType::Metadata) }])
        .unwrap();
    let probe = Arc::new(Metadata::default());
    stage.create_custom_object("meta", "probe", probe.clone(), None).unwrap();
    (stage, probe)
}

fn options() -> rocksdb::Options {
    let mut o = common::small_lsm_options();
    o.create_if_missing(true);
    o
}

#[test]
fn creating_the_db_directory_and_its_lock_are_requests_a_stage_can_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, probe) = probing_stage();
    probe.refuse.store(true, Ordering::Relaxed);
    let err = match StagedDb::builder(options()).stage(Arc::clone(&stage)).open(dir.path().join("db")) {
        Ok(_) => panic!("the DB opened although every metadata request was refused"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("kv-stage refused") && err.contains("metadata refused by the test"), "{err}");
    assert!(probe.seen.load(Ordering::Relaxed) >= 1);
    // Allowed: the directory is made and locked through the stage.
    probe.refuse.store(false, Ordering::Relaxed);
    let before = probe.seen.load(Ordering::Relaxed);
    let db = StagedDb::builder(options()).stage(Arc::clone(&stage)).open(dir.path().join("db")).unwrap();
    let at_open = probe.seen.load(Ordering::Relaxed) - before;
    assert!(at_open >= 2, "{at_open} metadata requests at open (create dir, lock)");
    drop(db);
}

#[test]
fn preallocation_goes_through_the_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, probe) = probing_stage();
    let db = StagedDb::builder(options()).stage(Arc::clone(&stage)).open(dir.path().join("db")).unwrap();
    // WAL and table files grow: RocksDB preallocates them block by block.
    let before = probe.seen.load(Ordering::Relaxed);
    let value = vec![7u8; 4096];
    for i in 0..2048u32 {
        db.db().put(i.to_be_bytes(), &value).unwrap();
    }
    db.db().flush().unwrap();
    let allocations = probe.seen.load(Ordering::Relaxed) - before;
    assert!(allocations >= 2, "{allocations} preallocations for 8 MiB of WAL and tables");
}

#[test]
fn an_sst_ingested_by_link_is_synced_through_the_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (stage, _probe) = probing_stage();
    let db = StagedDb::builder(options()).stage(Arc::clone(&stage)).open(dir.path().join("db")).unwrap();
    // SST ingestion by link syncs the table by name (SyncFile).
    let sst = dir.path().join("ext.sst");
    let sst_options = options();
    let mut writer = rocksdb::SstFileWriter::create(&sst_options);
    writer.open(&sst).unwrap();
    writer.put(b"zz-ingested", b"v").unwrap();
    writer.finish().unwrap();
    let syncs = |db: &StagedDb| db.io_stats().kind(FileKind::Sst).sync.ops;
    let before = syncs(&db);
    let mut ingest = rocksdb::IngestExternalFileOptions::default();
    ingest.set_move_files(true);
    db.db().ingest_external_file_opts(&ingest, vec![&sst]).unwrap();
    assert_eq!(db.db().get(b"zz-ingested").unwrap().as_deref(), Some(&b"v"[..]));
    let synced = syncs(&db) - before;
    assert!(synced >= 1, "the ingested table's sync went around the stage");
}
