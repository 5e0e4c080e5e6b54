//! # kv-stage: a software-defined storage data plane stage
//!
//! Every request a layer makes (a file read, a WAL append, a key-value put)
//! is described by a [`Context`] and handed to a [`Stage`]. The stage picks a
//! *channel* and, inside it, an *enforcement object* (a [`Noop`](object::Noop), a [`Drl`](object::Drl)
//! rate limiter, [`Qos`](object::Qos) limits, [`Batch`](object::Batch) thresholds, or your own), lets the
//! object admit the request, and counts it. Callers on an async runtime use
//! [`Stage::enforce_async`], whose wait is a cancel-safe future in the same
//! FIFO line. A control plane reads [`Stage::collect`] and
//! [`Stage::stage_info`], and changes the stage live with [`Rule`]s.
//!
//! This crate knows nothing about RocksDB; `rocks-env` wires RocksDB's file
//! system and event listener to a stage, and `controller` runs control loops.
//!
//! ```
//! use std::sync::Arc;
//! use kv_stage::{Context, ContextScope, RequestContext, RequestType, RuleSet, RulesFormat, Stage};
//!
//! // Flushes share 64 MiB/s; compactions from L1 down get 16 MiB/s.
//! let rules = r#"
//! version = 1
//! [[rules]]
//! op = "create_channel"
//! channel = "flush"
//! match = { context = "bg_flush" }
//! [[rules]]
//! op = "create_object"
//! channel = "flush"
//! object = "drl"
//! spec = { kind = "drl", rate = "64MiB/s" }
//! [[rules]]
//! op = "create_channel"
//! channel = "compaction"
//! match = { context = ["bg_compaction_L0_L1", "bg_compaction_LN"] }
//! [[rules]]
//! op = "create_object"
//! channel = "compaction"
//! object = "ln"
//! spec = { kind = "drl", rate = "16MiB/s" }
//! match = { context = "bg_compaction_LN" }
//! "#;
//! let stage = Arc::new(Stage::new("db"));
//! let set = RuleSet::parse(rules, RulesFormat::Toml, None, &Default::default()).unwrap();
//! stage.apply(&set).unwrap();
//!
//! // A flush thread tags its I/O; the stage routes it to the flush DRL.
//! let _flush = ContextScope::enter(RequestContext::BG_FLUSH);
//! stage.enforce(&Context::new(RequestType::Write, 1 << 20)).unwrap();
//! assert_eq!(stage.select(&Context::new(RequestType::Write, 0)).1.as_deref(), Some("flush/drl"));
//!
//! // A controller lowers the rate live.
//! stage.configure("flush", "drl", kv_stage::ObjectChange::rate("32MiB/s".parse().unwrap())).unwrap();
//! let stats = stage.collect();
//! assert_eq!(stats.context(RequestContext::BG_FLUSH).bytes, 1 << 20);
//! ```
//!
//! Invariants the code keeps (see `ARCHITECTURE.md`): nothing sleeps while
//! holding a lock on the enforce path; the enforce path allocates nothing and
//! hashes no strings; per-request counters are written by one thread each; a
//! batch of rules applies all or nothing.

#![forbid(unsafe_code)]

mod clock;
mod context;
mod error;
pub mod iomax;
mod layers;
mod matching;
pub mod metrics;
mod objects;
mod route;
mod rules;
mod stage;
mod stats;
pub mod timer;
pub mod units;

// The root: what an embedder needs to build a stage, tag requests, write
// rules and read statistics. Everything else has one path, in the modules
// below.
pub use context::{Context, ContextScope, InstanceId, Reason, RequestContext, RequestType, WorkflowId, with_context};
pub use error::{EnforceError, Error, FieldError, Result};
pub use matching::Match;
pub use objects::{DrlSpec, ObjectChange, ObjectSpec, QosSpec};
pub use rules::{Rule, RuleSet, RulesFormat};
pub use stage::{Collection, JobWatch, Rates, Stage};

/// The importer of the original Paio text rules.
pub use rules::paio;
pub use rules::volumes;

/// Enforcement objects: the trait an application object implements, the
/// built-in objects, their settings and what they return.
pub mod object {
    pub use crate::objects::{
        AsyncWait, Batch, BatchPlan, BatchSettings, BatchSpec, BucketStats, DEFAULT_REFILL_PERIOD, Drl, DrlSettings,
        EnforcementObject, Noop, Object, ObjectKind, ObjectStats, Outcome, Qos, Settings, WAIT_BUCKETS_SECONDS,
        WaitHistogram,
    };
}

/// What a stage reports: its layout ([`StageInfo`](info::StageInfo)),
/// its counters (the parts of a [`Collection`]), handles
/// on its objects, checkpoints, and the per-thread counters layers keep.
pub mod info {
    pub use crate::stage::{
        ApplyReport, ChannelCounters, ChannelInfo, Checkpoint, ContextCounters, Counter, Coverage, DEFAULT_CHANNEL,
        Enforce, InstanceInfo, JobCounters, JobCounts, ObjectCounters, ObjectHandle, ObjectInfo, RatePair, RouteInfo,
        StageInfo, WorkflowCounters,
    };
    pub use crate::stats::{CounterArray, MAX_COUNTER_SLOTS, MAX_THREAD_SLOTS};
}

/// Layers that put a stage in front of files and key-value stores.
pub mod layer {
    pub use crate::layers::{KvStore, MemKv, StagedFile, StagedKv, remove_file, rename};
}

/// The parts of rules beyond [`Rule`] and
/// [`RuleSet`]: the file format's version, entries with
/// their location, and the classifiers a [`Match`] pins.
pub mod rule {
    pub use crate::matching::{Classifier, FieldMatch};
    pub use crate::rules::{RULES_VERSION, RuleEntry, RuleKind};
}

/// The parts of errors beyond [`Error`],
/// [`EnforceError`] and [`FieldError`].
pub mod errors {
    pub use crate::error::{EnforceErrorKind, Location, Rejection};
}

/// Internals exposed for the criterion benchmarks only; not a stable API.
#[doc(hidden)]
pub mod __bench {
    use crate::{Context, Stage};

    /// Channel selection alone: the channel index a request goes to.
    pub fn select_channel(stage: &Stage, ctx: &Context) -> u32 {
        stage.bench_select_channel(ctx)
    }

    /// Object selection alone, inside the channel of the request.
    pub fn select_object(stage: &Stage, ctx: &Context) -> Option<u32> {
        stage.bench_select_object(ctx)
    }
}
