//! # rocks-env: RocksDB's I/O, tagged and enforced by a kv-stage stage
//!
//! A C++ shim (`cpp/shim.cc`) puts a file-system layer over the file system
//! of the application's Env (RocksDB's default one when it set none), so
//! every read, append, sync, file creation, deletion and rename is handed to
//! Rust before it happens; an Env that reports every background task the DB
//! schedules; and an `EventListener` that reports flushes, compactions and
//! background errors. For each request rocks-env builds a
//! [`kv_stage::Context`]:
//!
//! * **request context**: info-log writes are `background`; else the job of
//!   this DB running on the calling thread (a flush, or a compaction by its
//!   levels: `bg_compaction_L0_L0`, `bg_compaction_L0_L1` from L0 into the
//!   base level, `bg_compaction_L1_L2` ... by output level; see
//!   [`RequestContext::compaction`](kv_stage::RequestContext::compaction));
//!   else RocksDB's
//!   `IOOptions::io_activity` (flush, compaction of unknown level); else
//!   `background` inside a task the DB scheduled (file purges); else
//!   whatever the application propagated on this thread with
//!   [`with_context`] (foreground by default);
//! * **reason**: a compaction's `CompactionReason`
//!   ([`kv_stage::Reason`]: `manual` for `CompactRange`, `ttl`, `periodic`,
//!   `level_size`, `l0_files`, ...); none for everything else;
//! * **workflow**: the OS thread id; **type**: read, write, sync, or a
//!   metadata request of size 0 (open, close, delete, rename, truncate);
//! * **instance**: the DB's [`InstanceId`], so DBs can share a stage.
//!
//! It enforces the request through the stage; a refusal becomes an
//! `IOStatus::IOError` that RocksDB returns to its caller (or reports as a
//! background error). Below the stage, a DB can have an emulated
//! [`Device`] (benchmarks) and a [`FaultInjection`] layer (tests). The
//! embedder keeps using the `rocksdb` crate.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kv_stage::{ObjectChange, RequestContext, Stage};
//! use rocks_env::{RocksLayout, StagedDb, with_context};
//!
//! // A stage with the paper's RocksDB layout; limit deep compactions.
//! let stage = Arc::new(Stage::new("app"));
//! let handles = RocksLayout::new().install(&stage)?;
//! handles.compaction_ln.configure(&ObjectChange::rate("20MiB/s".parse()?))?;
//!
//! let mut opts = rocksdb::Options::default();
//! opts.create_if_missing(true);
//! let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open("/tmp/staged-db")?;
//! db.put(b"user1", b"hello")?; // WAL append: foreground
//!
//! // Tag your own work: this put's I/O carries the `backup` context.
//! let backup = RequestContext::register("backup")?;
//! with_context(backup, || db.put(b"snapshot", b"..."))?;
//!
//! let stats = stage.collect();
//! println!("foreground bytes: {}", stats.context(RequestContext::FOREGROUND).bytes);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `unsafe` lives in this crate only (`ffi.rs`, `env.rs`), each site with a
//! `SAFETY` comment; no panic crosses into C++.

#![deny(unsafe_code)]

mod db;
mod device;
mod env;
mod error;
mod fault;
mod ffi;
mod io;
mod layout;
pub mod metrics;
mod tag;
mod wire;

/// The `rocksdb` crate this one is built with, so a service uses the same
/// types (`Options`, `WriteBatch`, `DB`) without a `rocksdb` line of its
/// own. A service that wants its own line must match it exactly, or cargo
/// builds RocksDB's C++ code a second time (about 15 minutes on 2 cores):
/// `rocksdb = { version = "=0.25.0", default-features = false, features =
/// ["raw-ptr", "lz4", "snappy", "zstd", "bindgen-runtime"] }`.
pub use rocksdb;

pub use db::{
    DEFAULT_DEFER_DELETIONS, DEFAULT_DELETE_PIECE, DEFAULT_MAX_BACKGROUND_REQUEST, DEFAULT_MAX_TRASH_RATIO,
    DEFERRED_SUFFIX, StagedDb, StagedDbBuilder,
};
pub use device::{DEVICE_CHUNK, Device, DeviceStats};
pub use env::{EnvProbe, OptionsProbe, probe_env, probe_options, probe_staged_env};
pub use error::{Error, Result};
pub use fault::{FaultInjection, FaultRule, IoActivity, PowerCutReport};
pub use io::{BackgroundErrors, ClientIo, CompactionLevelStats, FileIo, IoStats, JobClassStats, JobStats};
pub use kv_stage::{ContextScope, InstanceId, with_context};
pub use layout::{LayoutHandles, RocksLayout};
pub use tag::ClientScope;
pub use wire::{FileKind, FileOp};
