//! The default controller (`controller::Adaptive`) next to a RocksDB opened
//! through rocks-env, on an emulated 64 MiB/s device, with RocksDB's
//! backlog as its pressure: a write burst (the store's traffic crosses the
//! busy threshold and its background limits bind), then quiet (every limit
//! is lifted). Prints how many cycles each mode had and the rates it set.
//!
//! `cargo run --release -p bench-ycsb --example default_controller -- [decisions.jsonl]`

use std::sync::Arc;
use std::time::{Duration, Instant};

use bench_ycsb::systems::{DbOptions, pressure_source};
use controller::{AdaptiveConfig, Controller, ControllerConfig, StageHandle, WithPressure};
use kv_stage::Stage;
use rocks_env::{Device, RocksLayout, StagedDb};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let stage = Arc::new(Stage::new("db"));
    RocksLayout::new().install(&stage)?;
    let o = DbOptions { write_buffer_size: 4 << 20, ..DbOptions::default() };
    let db = Arc::new(
        StagedDb::builder(o.rocksdb()).stage(Arc::clone(&stage)).device(Device::parse("64MiB/s")?).open(dir.path())?,
    );

    // The store's pressure (L0 files, full memtables, pending compaction
    // bytes), read from RocksDB's properties on the controller's thread
    // when it cycles (every 10 ms while it watches, every 100 ms while the
    // store is healthy and runs no job).
    let handle: Arc<dyn StageHandle> = Arc::new(WithPressure::new(stage.clone(), pressure_source(&db, &o)));
    let mut config = ControllerConfig::adaptive(AdaptiveConfig {
        device_bandwidth: "56MiB/s".parse()?,
        min_bandwidth: "4MiB/s".parse()?,
        ..AdaptiveConfig::default()
    });
    config.log = std::env::args().nth(1).map(Into::into);
    let ctl = Controller::builder(config).instance("db", handle).start()?;

    let t = Instant::now();
    let mut puts = 0u64;
    while t.elapsed() < Duration::from_secs(3) {
        db.put(format!("key{:08}", puts.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 100_000), [b'v'; 1000])?;
        puts += 1;
    }
    std::thread::sleep(Duration::from_secs(2));
    let log = ctl.stop();

    let mut modes = std::collections::BTreeMap::new();
    for r in &log {
        *modes.entry(r.notes[0]["mode"].as_str().unwrap_or("?").to_owned()).or_insert(0) += 1;
    }
    println!("{puts} puts in 3 s; {} controller cycles; modes: {modes:?}", log.len());
    for r in log.iter().filter(|r| !r.settings.is_empty()).take(6) {
        let set: Vec<String> = r
            .settings
            .iter()
            .map(|s| {
                if s.rate_bps.is_finite() {
                    format!("{}/{} {:.1} MiB/s", s.channel, s.object, s.rate_bps / 1048576.0)
                } else {
                    format!("{}/{} unlimited", s.channel, s.object)
                }
            })
            .collect();
        println!("t={:>7.1} ms {}: {}", r.t_ms, r.notes[0]["mode"], set.join(", "));
    }
    Ok(())
}
