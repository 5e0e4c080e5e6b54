//! # controller: the control plane for kv-stage stages
//!
//! A [`Controller`] runs a control loop on its own thread: every interval it
//! collects each stage's monotonic counters through a [`StageHandle`],
//! turns them into rates by difference, lets a [`Policy`] decide, applies
//! the decision as enforcement rules, and records the cycle in a decision
//! log ([`DecisionRecord`], optionally appended to a JSON-lines file).
//!
//! Policies: [`Adaptive`], the default controller for RocksDB (no limit
//! while the store is healthy, SILK's split of a backlog-dependent budget
//! while the device or the clients are busy, flushes and L0 compactions
//! promoted as a write stall nears), [`Silk`] (SILK's scheduling for LSM stores, Paio Algorithm 1;
//! with a [`PressureConfig`], SILK with the store's compaction
//! [`Pressure`] as an extra input, which a [`StageHandle`] that knows the
//! store reports), and [`FairShare`] in three modes: max-min (Algorithm 2, work-conserving),
//! proportional, and static (the blkio-style baseline). A policy that fails
//! or panics is reported in the log and the previous rates stay; the
//! controller never sets a rate below [`RATE_FLOOR`], so it never closes a
//! DRL.
//!
//! The controller knows stages, not RocksDB: anything that reports its
//! I/O to a [`kv_stage::Stage`] can be driven. SILK finds its DRLs by the
//! request contexts their routes cover:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use controller::{Controller, ControllerConfig, SilkConfig};
//! use kv_stage::{Context, DrlSpec, InstanceId, Match, ObjectSpec, RequestContext, RequestType, Rule, Stage, units::Rate};
//!
//! // A stage with a flush DRL (rocks-env's `RocksLayout` builds the whole
//! // RocksDB layout this way).
//! let stage = Arc::new(Stage::new("kv"));
//! stage.apply_rules([
//!     Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
//!     Rule::CreateObject {
//!         channel: "flush".into(),
//!         object: "drl".into(),
//!         spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
//!         matches: None,
//!     },
//! ])?;
//!
//! // SILK with KVS_B 200 MiB/s, min_B 10 MiB/s, every 10 ms.
//! let silk = Controller::builder(ControllerConfig::silk(SilkConfig::default()))
//!     .instance("kv", stage.clone())
//!     .start()?;
//! // A flush runs (a layer reports it), clients are idle: the flush gets all of KVS_B.
//! stage.job_started(InstanceId(0), RequestContext::BG_FLUSH);
//! stage.enforce(&Context::new(RequestType::Write, 4096).in_context(RequestContext::BG_FLUSH))?;
//! while silk.cycles() < 3 {
//!     std::thread::sleep(Duration::from_millis(5));
//! }
//! let log = silk.stop(); // the decision log: inputs and rates of every cycle
//! assert!(log.iter().any(|r| r.settings.iter().any(|s| s.channel == "flush" && s.rate_bps == 200.0 * 1048576.0)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With RocksDB: `cargo run --release -p bench-ycsb --example silk_embedded`.

#![forbid(unsafe_code)]

mod config;
mod controller;
mod error;
mod handle;
pub mod metrics;
mod policy;
mod signals;

pub use config::{ControllerConfig, FairShareConfig, PolicyKind};
pub use controller::{
    AppliedSetting, Controller, ControllerBuilder, ControllerHandle, DEFAULT_MAX_LOG, DecisionRecord, InstanceInputs,
    RATE_FLOOR, check_binding, context_rate,
};
pub use error::{Error, Result};
pub use handle::{HandleError, IntoStageHandle, ObjectControl, StageHandle, WithPressure};
pub use policy::{
    Adaptive, AdaptiveConfig, AdaptiveInputs, AdaptiveMode, Decision, Directions, FairShare, FairShareMode, FlowInput,
    InstanceConfig, InstanceKey, InstanceView, ObjectRef, Observation, Policy, PolicyError, Pressure, PressureConfig,
    Setting, Silk, SilkBranch, SilkConfig, SilkInputs, water_fill,
};
pub use signals::{ProcIo, ProcIoRates};
