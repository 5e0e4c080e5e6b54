//! `max_background_request`: on direct-I/O files, flushes and compactions
//! reach the layer below the stage in pieces no larger than the bound,
//! the data they write reads back intact, and the stage still counts each
//! request once, whole.

mod common;

use std::sync::Arc;

use common::*;
use kv_stage::units::Bandwidth;
use rocks_env::{Device, FileKind, StagedDb};

const PIECE: u64 = 64 << 10;
const VALUES: u64 = 6_000;

/// Direct I/O for reads, flushes and compactions, with RocksDB's large
/// requests (1 MiB compaction readahead, 1 MiB write buffer), 4 MiB
/// memtables.
fn direct_options() -> rocksdb::Options {
    let mut o = small_lsm_options();
    o.set_use_direct_reads(true);
    o.set_use_direct_io_for_flush_and_compaction(true);
    o.set_compaction_readahead_size(1 << 20);
    o.set_writable_file_max_buffer_size(1 << 20);
    o.set_write_buffer_size(4 << 20);
    o
}

/// Loads, flushes and compacts everything, then reads every value back.
/// Returns the largest request the device below the stage saw, and the
/// SST bytes and write requests the stage counted.
fn run(max_background_request: u64) -> (u64, u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    // The device only watches: it is far faster than the load.
    let device = Device::new(Bandwidth::new(64.0 * 1024.0 * 1024.0 * 1024.0).unwrap());
    let db = StagedDb::builder(direct_options())
        .device(Arc::clone(&device))
        .max_background_request(max_background_request)
        .open(dir.path())
        .unwrap();
    assert_eq!(db.max_background_request(), max_background_request);
    for i in 0..VALUES {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    for i in (0..VALUES).step_by(2) {
        db.put(key(i), value(i + 1, 1024)).unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
    for i in 0..VALUES {
        let want = if i % 2 == 0 { value(i + 1, 1024) } else { value(i, 1024) };
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&want[..]), "key {i}");
    }
    let sst = db.io_stats().kind(FileKind::Sst).write;
    (device.stats().largest_background_request, sst.bytes, sst.ops)
}

#[test]
fn background_requests_reach_the_device_in_pieces_and_read_back_intact() {
    let (whole, whole_bytes, whole_requests) = run(0);
    // Without a bound, RocksDB's own requests are larger than a piece: the
    // check below would catch a bound that does nothing.
    assert!(whole > PIECE, "largest request without a bound: {whole}");
    let (pieced, pieced_bytes, pieced_requests) = run(PIECE);
    assert!(pieced <= PIECE, "largest request with a {PIECE}-byte bound: {pieced}");
    // The stage counts each request once, whole: about the same bytes and
    // requests either way (not one per piece; the runs' flushes may differ
    // by a few requests).
    assert!(whole_bytes > 4 << 20, "{whole_bytes}");
    let ratio = pieced_bytes as f64 / whole_bytes as f64;
    assert!((0.95..=1.05).contains(&ratio), "{pieced_bytes} vs {whole_bytes}");
    assert!(pieced_requests * 2 < whole_requests * 3, "{pieced_requests} vs {whole_requests} requests");
}

#[test]
fn the_bound_changes_while_the_db_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let device = Device::new(Bandwidth::new(64.0 * 1024.0 * 1024.0 * 1024.0).unwrap());
    let db = StagedDb::builder(direct_options()).device(Arc::clone(&device)).open(dir.path()).unwrap();
    assert_eq!(db.max_background_request(), 0);
    db.set_max_background_request(PIECE);
    assert_eq!(db.max_background_request(), PIECE);
    for i in 0..VALUES {
        db.put(key(i), value(i, 1024)).unwrap();
    }
    db.flush().unwrap();
    db.compact_range(None::<&[u8]>, None::<&[u8]>);
    assert!(device.stats().largest_background_request <= PIECE, "{:?}", device.stats());
    for i in 0..VALUES {
        assert_eq!(db.get(key(i)).unwrap().as_deref(), Some(&value(i, 1024)[..]), "key {i}");
    }
}
