//! # controller: the control plane for kv-stage stages
//!
//! A [`Controller`] runs a control loop on its own thread: every interval it
//! collects each stage's monotonic counters through a [`StageHandle`],
//! turns them into rates by difference, lets a [`Policy`] decide, applies
//! the decision as enforcement rules, and records the cycle in a decision
//! log ([`DecisionRecord`], optionally appended to a JSON-lines file).
//!
//! Policies: [`Silk`] (SILK's scheduling for LSM stores, Paio Algorithm 1),
//! and [`FairShare`] in three modes: max-min (Algorithm 2, work-conserving),
//! proportional, and static (the blkio-style baseline). A policy that fails
//! or panics is reported in the log and the previous rates stay; the
//! controller never sets a rate below [`RATE_FLOOR`], so it never closes a
//! DRL.
//!
//! Running SILK next to a RocksDB opened through `rocks-env`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use controller::{Controller, ControllerConfig, SilkConfig};
//! use kv_stage::Stage;
//! use rocks_env::{RocksLayout, StagedDb};
//!
//! let stage = Arc::new(Stage::new("db"));
//! RocksLayout::new().install(&stage)?;
//! let mut opts = rocksdb::Options::default();
//! opts.create_if_missing(true);
//! let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open("/tmp/silk-db")?;
//!
//! // KVS_B 200 MiB/s, min_B 10 MiB/s, every 10 ms.
//! let silk = Controller::builder(ControllerConfig::silk(SilkConfig::default()))
//!     .instance("db", stage.clone())
//!     .start()?;
//! db.put(b"k", b"v")?;
//! let log = silk.stop(); // the decision log: inputs and rates of every cycle
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod config;
mod controller;
mod error;
mod policy;
mod signals;

pub use config::{ControllerConfig, FairShareConfig, InstanceConfig, PolicyKind, SilkConfig};
pub use controller::{
    AppliedSetting, Controller, ControllerBuilder, DecisionRecord, InstanceInputs, ObjectControl, RATE_FLOOR,
    StageHandle, context_rate,
};
pub use error::{Error, Result};
pub use policy::{
    Decision, FairShare, FairShareMode, FlowInput, InstanceKey, InstanceView, ObjectRef, Observation, Policy,
    PolicyError, Setting, Silk, SilkBranch, SilkInputs, water_fill,
};
pub use signals::{ProcIo, ProcIoRates};
