//! Embedding: open a RocksDB through a stage, tag your own requests, limit
//! deep compactions, and read the stage's statistics.
//!
//! `cargo run --release -p rocks-env --example embed`

use std::sync::Arc;

use kv_stage::{ObjectChange, RequestContext, Stage};
use rocks_env::{FileKind, RocksLayout, StagedDb, with_context};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;

    // The paper's RocksDB layout, with LN compactions limited to 32 MiB/s.
    let stage = Arc::new(Stage::new("embed"));
    let handles = RocksLayout::new().install(&stage)?;
    handles.compaction_ln.configure(&ObjectChange::rate("32MiB/s".parse()?))?;

    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_write_buffer_size(1 << 20);
    let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open(dir.path())?;

    for i in 0..20_000u32 {
        db.put(format!("user{i:08}"), [b'v'; 512])?;
    }
    // Work the application tags itself: its I/O carries `backup`.
    let backup = RequestContext::register("backup")?;
    with_context(backup, || db.put(b"backup-marker", b"1"))?;
    db.flush()?;

    let stats = stage.collect();
    for c in &stats.contexts {
        println!("{:>20}: {:>6} requests, {:>10} bytes", c.context.name(), c.counter.ops, c.counter.bytes);
    }
    let io = db.io_stats();
    println!(
        "WAL written: {} bytes, SSTs written: {} bytes",
        io.kind(FileKind::Wal).write.bytes,
        io.kind(FileKind::Sst).write.bytes
    );
    println!("jobs: {:?}", db.jobs());
    Ok(())
}
