//! SILK running next to a RocksDB opened through rocks-env, on an emulated
//! 64 MiB/s device: a write burst, then quiet. Prints how often each branch
//! of Algorithm 1 was taken and a few lines of the decision log.
//!
//! `cargo run --release -p bench-ycsb --example silk_embedded -- [decisions.jsonl]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, SilkConfig};
use kv_stage::{Stage, units::Rate};
use rocks_env::{Device, RocksLayout, StagedDb};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let stage = Arc::new(Stage::new("silk"));
    RocksLayout::new().install(&stage)?;
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts.set_write_buffer_size(4 << 20);
    opts.set_max_background_jobs(4);
    let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).device(Device::parse("64MiB/s")?).open(dir.path())?;

    let mut config = ControllerConfig::silk(SilkConfig {
        kvs_bandwidth: "48MiB/s".parse()?,
        min_bandwidth: "2MiB/s".parse()?,
        hysteresis: Rate::from_bytes_per_sec(1.0 * 1048576.0)?,
        pressure: None,
    });
    config.log = std::env::args().nth(1).map(Into::into);
    let silk = Controller::builder(config).instance("db", stage.clone()).start()?;

    let t = Instant::now();
    let mut i = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        db.put(format!("key{:08}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 100_000), [b'v'; 1000])?;
        i += 1;
    }
    std::thread::sleep(Duration::from_secs(2));
    let log = silk.stop();

    let mut branches = std::collections::BTreeMap::new();
    for r in &log {
        *branches.entry(r.notes[0]["branch"].as_str().unwrap_or("?").to_owned()).or_insert(0) += 1;
    }
    println!("{} puts in 3 s; {} controller cycles; branches: {branches:?}", i, log.len());
    for r in log.iter().filter(|r| !r.settings.is_empty()).take(5) {
        println!("{}", serde_json::to_string(r)?);
    }
    Ok(())
}
