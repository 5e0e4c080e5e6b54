//! # bench-ycsb: YCSB against RocksDB, side by side
//!
//! Runs a YCSB workload with open-loop clients against several systems in
//! one invocation: plain RocksDB, RocksDB with its auto-tuned rate limiter,
//! RocksDB through a kv-stage stage with the SILK controller, and with
//! static limits. Every system gets the same RocksDB options, the same
//! emulated device, the same loaded data (a checkpoint of one load), the
//! same seed and schedule; only rate control differs. The report has
//! YCSB-style summaries, a comparison table, per-second time series and SVG
//! plots of throughput and p99 latency.
//!
//! The pieces are usable on their own: [`generator`] (YCSB's distributions),
//! [`workload`] (property files and built-ins), [`profile`] (load shapes),
//! [`runner`] (load and open-loop run phases), [`report`], and [`cli`], the
//! `bench-ycsb` command line.
//!
//! ```
//! use bench_ycsb::generator::{Rng, ScrambledZipfian};
//! use bench_ycsb::workload::Workload;
//!
//! let w = Workload::builtin("mixture").unwrap();
//! assert_eq!((w.readproportion, w.updateproportion), (0.5, 0.5));
//! let keys = ScrambledZipfian::new(0, w.recordcount - 1);
//! let mut rng = Rng::new(7);
//! assert!(keys.next(&mut rng) < w.recordcount);
//! ```

#![forbid(unsafe_code)]

pub mod attribution;
pub mod cli;
pub mod debt;
pub mod disk_probe;
mod error;
pub mod generator;
pub mod kernel;
pub mod pool;
pub mod profile;
pub mod report;
pub mod runner;
pub mod systems;
pub mod workload;

pub use error::{Error, Result};
