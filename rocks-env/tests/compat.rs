//! A DB written through the wrapper is an ordinary RocksDB DB.

mod common;

use common::*;
use rocks_env::StagedDb;

#[test]
fn plain_rocksdb_opens_a_staged_db_with_all_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = small_lsm_options();
    opts.create_missing_column_families(true);
    {
        let db = StagedDb::builder(opts.clone()).column_family("meta", small_lsm_options()).open(dir.path()).unwrap();
        let meta = db.cf_handle("meta").unwrap();
        for i in 0..20_000u64 {
            db.put(key(i), value(i, 256)).unwrap();
        }
        db.put_cf(&meta, b"version", b"7").unwrap();
        db.delete(key(3)).unwrap();
        db.flush().unwrap();
    }
    let db = rocksdb::DB::open_cf(&opts, dir.path(), ["default", "meta"]).unwrap();
    for i in 0..20_000u64 {
        let got = db.get(key(i)).unwrap();
        if i == 3 {
            assert!(got.is_none());
        } else {
            assert_eq!(got.as_deref(), Some(&value(i, 256)[..]), "key {i}");
        }
    }
    assert_eq!(db.get_cf(&db.cf_handle("meta").unwrap(), b"version").unwrap().as_deref(), Some(&b"7"[..]));
}
