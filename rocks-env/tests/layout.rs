//! Guards the private C-API layouts the shim repeats from RocksDB's
//! db/c.cc (`rocksdb_options_t`, `rocksdb_env_t`). If a RocksDB upgrade
//! changes them, these tests fail here rather than RocksDB misbehaving.

mod common;

use std::sync::Arc;

use rocks_env::{FileKind, StagedDb, probe_options, probe_staged_env};

#[test]
fn options_layout_matches_the_public_api() {
    let mut opts = rocksdb::Options::default();
    for size in [12_345_678usize, 64 << 20, 1] {
        opts.set_write_buffer_size(size);
        let p = probe_options(&opts);
        assert_eq!(
            p.write_buffer_size, size as u64,
            "the shim's rocksdb_options_t layout no longer matches RocksDB's db/c.cc"
        );
        assert_eq!(p.listeners, 0);
    }
}

#[test]
fn env_layout_matches_and_the_env_is_ours() {
    let p = probe_staged_env();
    assert!(!p.is_default, "the shim's rocksdb_env_t layout no longer matches RocksDB's db/c.cc");
    assert!(p.is_staged, "the Env built by the shim does not carry the staged file system");
    // RocksDB's own Env, made by its C API: the struct the shim repeats must
    // read `is_default = true` there, which the shim never writes itself.
    let default = rocks_env::probe_env(&rocksdb::Env::new().unwrap());
    assert!(default.is_default, "the shim's rocksdb_env_t layout does not read RocksDB's default Env right");
    assert!(!default.is_staged);
    let mem = rocks_env::probe_env(&rocksdb::Env::mem_env().unwrap());
    assert!(!mem.is_default && !mem.is_staged);
}

#[test]
fn the_wrapper_sees_the_bytes_rocksdb_writes() {
    let dir = tempfile::tempdir().unwrap();
    let stage = common::accounting_stage();
    let db = StagedDb::builder(common::small_lsm_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    for i in 0..1000u64 {
        db.put(common::key(i), common::value(i, 100)).unwrap();
    }
    db.flush().unwrap();
    let io = db.io_stats();
    assert!(io.kind(FileKind::Wal).write.bytes >= 100_000, "{io:?}");
    assert!(io.kind(FileKind::Sst).write.bytes > 0, "{io:?}");
    assert!(common::written(&stage, "fg") >= 100_000);
    assert!(common::written(&stage, "flush") > 0, "the listener did not tag the flush thread");
}

#[test]
fn installing_the_layout_on_the_stage_open_made_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = rocks_env::rocksdb::Options::default();
    opts.create_if_missing(true);
    let db = rocks_env::StagedDb::open(opts, dir.path()).unwrap();
    let e = rocks_env::RocksLayout::new().install(db.stage()).unwrap_err().to_string();
    assert!(e.contains("already exists") && e.contains("has a RocksDB layout already"), "{e}");
    assert!(e.contains("RocksLayout::handles"), "{e}");
    // What it points to works.
    rocks_env::RocksLayout::new().handles(db.stage()).unwrap();
}
