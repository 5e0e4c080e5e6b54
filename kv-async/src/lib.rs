//! # kv-async: a staged RocksDB for tokio services
//!
//! [`AsyncDb`] is an async handle over a [`rocks_env::StagedDb`]: get, put,
//! delete, write batch, multi-get and range scan (a stream). Each call is
//! admitted by the DB's stage at the key-value layer with
//! [`Stage::enforce_async`](kv_stage::Stage::enforce_async): a tenant over
//! its limit waits as a future, so one throttled tenant does not park the
//! runtime's worker threads and stall every other tenant on them. The
//! RocksDB call runs on a bounded blocking pool.
//!
//! The tenant is the task's request context ([`scope`], a task-local, so it
//! survives `.await` and moves with the task between worker threads); rules
//! give each tenant its own channel and limit.
//!
//! Writes that reach a stage's [`batch`](kv_stage::object::Batch) object are grouped
//! i10-style (16 requests, 64 KiB or 50 µs by default; at once when the
//! queue is idle) into one RocksDB write batch with one WAL sync. Every
//! caller gets its own result; a failed batch fails exactly its requests.
//!
//! ```no_run
//! use std::sync::Arc;
//! use kv_async::AsyncDb;
//! use kv_stage::{RequestContext, RuleSet, RulesFormat};
//! use rocks_env::StagedDb;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut opts = rocksdb::Options::default();
//! opts.create_if_missing(true);
//! let db = Arc::new(StagedDb::open(opts, "/tmp/svc")?);
//! // Tenant "batchy": puts grouped; tenant "light": 1,000 ops/s.
//! let rules = r#"
//! version = 1
//! [[rules]]
//! op = "create_channel"
//! channel = "batchy"
//! match = { context = "batchy", type = ["put", "delete"] }
//! [[rules]]
//! op = "create_object"
//! channel = "batchy"
//! object = "group"
//! spec = { kind = "batch" }
//! [[rules]]
//! op = "create_channel"
//! channel = "light"
//! match = { context = "light", type = ["put", "get"] }
//! [[rules]]
//! op = "create_object"
//! channel = "light"
//! object = "limit"
//! spec = { kind = "drl", rate = "1000ops/s" }
//! "#;
//! let (batchy, light) = (RequestContext::register("batchy")?, RequestContext::register("light")?);
//! db.stage().apply(&RuleSet::parse(rules, RulesFormat::Toml, None, &Default::default())?)?;
//!
//! let db = AsyncDb::new(db);
//! let d = db.clone();
//! tokio::spawn(kv_async::scope(batchy, async move { d.put(b"k".to_vec(), b"v".to_vec()).await })).await??;
//! kv_async::scope(light, async { db.get(b"k".to_vec()).await }).await?;
//! # Ok(()) }
//! ```

mod batch;
mod context;
mod db;
mod protected;

/// The `rocksdb` crate the DB is built with (see [`rocks_env::rocksdb`]).
pub use rocks_env::rocksdb;

pub use batch::BatchStats;
pub use context::{current, scope};
pub use db::{AsyncDb, AsyncDbBuilder, CloseReport, DEFAULT_BLOCKING_THREADS, SCAN_CHUNK, Scan};
pub use protected::{OpenError, PressureReference, ProtectedDb, Protection, Tenant};
