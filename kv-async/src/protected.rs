//! A protected DB in a few lines: RocksDB with the paper's layout, tenants
//! with their own limits, and the default controller running next to it.

use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use controller::{AdaptiveConfig, Controller, ControllerConfig, Pressure, WithPressure};
use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, RuleSet, Stage, units::Rate};
use rocks_env::{RocksLayout, StagedDb};
use rocksdb::WriteBatch;

use kv_stage::RequestType;

use crate::db::{AsyncDb, CloseReport, Entry, Scan, read_size};

/// What [`ProtectedDb::open`] sets up: tenants and their limits, the
/// controller, the handle's settings.
///
/// ```
/// use kv_async::Protection;
/// let p = Protection::default().tenant("gold", "200ops/s").tenant("batch", "4MiB/s");
/// ```
#[derive(Debug, Clone)]
pub struct Protection {
    tenants: Vec<(String, String)>,
    controller: Option<ControllerConfig>,
    blocking_threads: usize,
    sync_writes: bool,
    pressure: PressureReference,
    max_background_request: u64,
    defer_deletions: std::time::Duration,
    delete_piece: u64,
}

/// What the default controller's store pressure is measured against: the
/// RocksDB options the DB was opened with, where they differ from RocksDB's
/// defaults (the `rocksdb` crate cannot read them back).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PressureReference {
    /// `level0_slowdown_writes_trigger` (RocksDB's default: 20).
    pub l0_slowdown_trigger: u32,
    /// `max_write_buffer_number` (default: 2).
    pub max_write_buffer_number: u32,
    /// `max_bytes_for_level_base` (default: 256 MiB); pending compaction
    /// bytes count as pressure 1 at four times this.
    pub max_bytes_for_level_base: u64,
}

impl Default for PressureReference {
    fn default() -> Self {
        PressureReference { l0_slowdown_trigger: 20, max_write_buffer_number: 2, max_bytes_for_level_base: 256 << 20 }
    }
}

impl Default for Protection {
    /// No tenants, the default controller ([`AdaptiveConfig::default`]),
    /// 8 blocking threads, synced writes, background requests on
    /// direct-I/O files in pieces of at most
    /// [`rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST`] (64 KiB).
    fn default() -> Self {
        Protection {
            tenants: Vec::new(),
            controller: Some(ControllerConfig::adaptive(AdaptiveConfig::default())),
            blocking_threads: crate::DEFAULT_BLOCKING_THREADS,
            sync_writes: true,
            pressure: PressureReference::default(),
            max_background_request: rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST,
            defer_deletions: rocks_env::DEFAULT_DEFER_DELETIONS,
            delete_piece: rocks_env::DEFAULT_DELETE_PIECE,
        }
    }
}

impl Protection {
    /// A tenant, by name, with a limit in human units: `"200ops/s"`,
    /// `"4MiB/s"`, `"unlimited"`. The limit charges the tenant's key-value
    /// requests once (see [`AsyncDb`]: puts by key + value, reads by what
    /// they return). Checked by [`ProtectedDb::open`].
    pub fn tenant(mut self, name: impl Into<String>, limit: impl Into<String>) -> Self {
        self.tenants.push((name.into(), limit.into()));
        self
    }

    /// Another controller configuration (SILK, say) instead of the default
    /// one.
    pub fn controller(mut self, config: ControllerConfig) -> Self {
        self.controller = Some(config);
        self
    }

    /// No controller: the layout's background limits stay unlimited.
    pub fn without_controller(mut self) -> Self {
        self.controller = None;
        self
    }

    /// RocksDB calls in flight at once (default 8).
    pub fn blocking_threads(mut self, n: usize) -> Self {
        self.blocking_threads = n.max(1);
        self
    }

    /// Whether writes are synced to the WAL before they complete (default
    /// `true`).
    pub fn sync_writes(mut self, sync: bool) -> Self {
        self.sync_writes = sync;
        self
    }

    /// The largest read or write a flush or compaction issues to the
    /// device at once, on files opened for direct I/O (see
    /// [`rocks_env::StagedDbBuilder::max_background_request`]; 0: no bound).
    pub fn max_background_request(mut self, bytes: u64) -> Self {
        self.max_background_request = bytes;
        self
    }

    /// How long the deletion of an obsolete file may wait for a moment in
    /// which the controller limits no flush or compaction (see
    /// [`rocks_env::StagedDbBuilder::defer_deletions`]; zero: deleted at
    /// once). Default: [`rocks_env::DEFAULT_DEFER_DELETIONS`].
    pub fn defer_deletions(mut self, max_wait: std::time::Duration) -> Self {
        self.defer_deletions = max_wait;
        self
    }

    /// How many bytes of a deleted file are freed at a time, by the file
    /// system layer's thread (see [`rocks_env::StagedDbBuilder::delete_in_pieces`];
    /// 0: the whole file at once, by the thread that deletes it). Default:
    /// [`rocks_env::DEFAULT_DELETE_PIECE`].
    pub fn delete_in_pieces(mut self, piece: u64) -> Self {
        self.delete_piece = piece;
        self
    }

    /// The RocksDB options the default controller's pressure is measured
    /// against, when the DB's differ from RocksDB's defaults.
    pub fn pressure_reference(mut self, reference: PressureReference) -> Self {
        self.pressure = reference;
        self
    }
}

/// A RocksDB protected from its own background I/O: the paper's layout on
/// a stage of its own, the default controller running next to it, tenants
/// with limits, and one [`close`](Self::close).
///
/// Async code uses the [`Tenant`] handles' async calls and `close().await`;
/// code on threads of its own, outside a runtime, their `*_blocking` forms
/// (`put_blocking`, `get_blocking`, `delete_blocking`) and
/// [`close_blocking`](Self::close_blocking). Both are charged the same way.
///
/// ```no_run
/// use kv_async::{ProtectedDb, Protection};
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut opts = kv_async::rocksdb::Options::default();
/// opts.create_if_missing(true);
/// let db = ProtectedDb::open("/var/lib/svc/db", opts, Protection::default().tenant("gold", "200ops/s"))?;
/// let gold = db.tenant("gold").expect("declared");
/// gold.put(b"k".to_vec(), b"v".to_vec()).await?; // charged to gold, limited to 200 ops/s
/// let v = gold.get(b"k".to_vec()).await?;
/// db.close(std::time::Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
pub struct ProtectedDb {
    db: AsyncDb,
    tenants: Vec<Tenant>,
    controller: Mutex<Option<Controller>>,
    /// The controller's log as it stopped (`close`).
    stopped_log: Mutex<Vec<controller::DecisionRecord>>,
    /// The stage's, the DB's and the controller's metrics.
    metrics: (
        kv_stage::metrics::StageMetrics,
        rocks_env::metrics::DbMetrics,
        Option<controller::metrics::ControllerMetrics>,
    ),
}

impl std::fmt::Debug for ProtectedDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectedDb").field("db", &self.db).field("tenants", &self.tenants).finish_non_exhaustive()
    }
}

/// Why [`ProtectedDb::open`] failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A tenant's declaration.
    #[error("tenant '{name}': {message}")]
    Tenant {
        /// The tenant.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Opening RocksDB, or installing the layout.
    #[error(transparent)]
    Db(#[from] rocks_env::Error),
    /// The stage refused the tenants' rules.
    #[error("the tenants' rules: {0}")]
    Rules(#[from] kv_stage::Error),
    /// The controller did not start.
    #[error("the controller: {0}")]
    Controller(#[from] controller::Error),
}

impl ProtectedDb {
    /// Opens (or creates, as `options` say) the DB at `path`, its stage with
    /// the [`RocksLayout`], one channel and DRL per tenant (channel and
    /// object `limit` named after the tenant), and starts the controller.
    /// Every tenant is checked before anything opens: a bad name or limit
    /// fails with the tenant named, and nothing is left behind.
    pub fn open(path: impl AsRef<Path>, options: rocksdb::Options, protection: Protection) -> Result<Self, OpenError> {
        let path = path.as_ref();
        let mut rules = Vec::new();
        let mut contexts = Vec::new();
        for (i, (name, limit)) in protection.tenants.iter().enumerate() {
            let bad = |message: String| OpenError::Tenant { name: name.clone(), message };
            if protection.tenants[..i].iter().any(|(n, _)| n == name) {
                return Err(bad("declared twice".into()));
            }
            let rate: Rate = limit.parse().map_err(|e| bad(format!("limit '{limit}': {e}")))?;
            let context = RequestContext::register(name).map_err(|e| bad(e.to_string()))?;
            if context.is_builtin() {
                return Err(bad("a built-in context's name (foreground, bg_flush, ...) cannot be a tenant's".into()));
            }
            rules.push(Rule::CreateChannel { channel: name.clone(), matches: Some(Match::context(context)) });
            rules.push(Rule::CreateObject {
                channel: name.clone(),
                object: "limit".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(rate)),
                matches: None,
            });
            contexts.push((name.clone(), context));
        }
        let stage = Arc::new(Stage::new(path.display().to_string()));
        RocksLayout::new().install(&stage)?;
        stage.apply(&RuleSet::from_rules(rules))?;
        let staged = Arc::new(
            StagedDb::builder(options)
                .stage(Arc::clone(&stage))
                .max_background_request(protection.max_background_request)
                .defer_deletions(protection.defer_deletions)
                .delete_in_pieces(protection.delete_piece)
                .open(path)?,
        );
        let controller = match protection.controller {
            Some(config) => {
                let weak: Weak<StagedDb> = Arc::downgrade(&staged);
                let reference = protection.pressure;
                let handle = WithPressure::new(Arc::clone(&stage) as Arc<dyn controller::StageHandle>, move || {
                    weak.upgrade().map_or_else(|| Pressure::new(0.0, 0.0, 0.0), |db| pressure(&db, &reference))
                });
                Some(
                    Controller::builder(config)
                        .instance("db", Arc::new(handle) as Arc<dyn controller::StageHandle>)
                        .start()?,
                )
            }
            None => None,
        };
        let stage_metrics = kv_stage::metrics::StageMetrics::new();
        stage_metrics.add(&stage);
        let db_metrics = rocks_env::metrics::DbMetrics::new();
        db_metrics.add(&staged);
        let metrics = (stage_metrics, db_metrics, controller.as_ref().map(Controller::metrics));
        let db = AsyncDb::builder(staged)
            .blocking_threads(protection.blocking_threads)
            .sync_writes(protection.sync_writes)
            .build();
        let tenants = contexts.into_iter().map(|(name, context)| Tenant { db: db.clone(), name, context }).collect();
        Ok(ProtectedDb {
            db,
            tenants,
            controller: Mutex::new(controller),
            stopped_log: Mutex::new(Vec::new()),
            metrics,
        })
    }

    /// A declared tenant's handle: every call it makes is that tenant's.
    pub fn tenant(&self, name: &str) -> Option<Tenant> {
        self.tenants.iter().find(|t| t.name == name).cloned()
    }

    /// The handle for untenanted (foreground) calls, and for what the
    /// tenants' handles do not offer.
    pub fn db(&self) -> &AsyncDb {
        &self.db
    }

    /// The stage: statistics (`stage().collect()`), and live changes to
    /// the tenants' limits (`configure(tenant, "limit", ...)`).
    pub fn stage(&self) -> &Arc<Stage> {
        self.db.stage()
    }

    /// Registers the DB's Prometheus metrics in `registry`: its stage's
    /// (`kvsds_channel_*`, `kvsds_object_*` per tenant and background
    /// channel, ...), its RocksDB's (`kvsds_rocksdb_*`) and its
    /// controller's (`kvsds_controller_*`), all read at scrape time (see
    /// `docs/monitoring.md`). After [`close`](Self::close) the DB's samples
    /// are gone; the stage's stay while this handle lives. Register one `ProtectedDb` per registry: a
    /// second would describe the same families again.
    pub fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register_collector(Box::new(self.metrics.0.clone()));
        registry.register_collector(Box::new(self.metrics.1.clone()));
        if let Some(c) = &self.metrics.2 {
            registry.register_collector(Box::new(c.clone()));
        }
    }

    /// The controller's decision log so far (the last cycles it keeps;
    /// after [`close`](Self::close), as the controller stopped).
    pub fn decisions(&self) -> Vec<controller::DecisionRecord> {
        let c = self.controller.lock().unwrap_or_else(|e| e.into_inner());
        match c.as_ref() {
            Some(c) => c.log(),
            None => self.stopped_log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Stops the controller (off the async workers), then closes the handle
    /// and RocksDB with [`AsyncDb::close`]: waiters fail, admitted calls
    /// finish within `grace`, RocksDB closes.
    pub async fn close(&self, grace: Duration) -> io::Result<CloseReport> {
        let controller = self.controller.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(c) = controller {
            let log = tokio::task::spawn_blocking(move || c.stop())
                .await
                .map_err(|e| io::Error::other(format!("stopping the controller did not complete: {e}")))?;
            *self.stopped_log.lock().unwrap_or_else(|e| e.into_inner()) = log;
        }
        self.db.close(grace).await
    }

    /// [`close`](Self::close) for code outside an async runtime.
    pub fn close_blocking(&self, grace: Duration) -> io::Result<CloseReport> {
        crate::db::outside_a_runtime(self.close(grace))
    }
}

/// The store's pressure from RocksDB's properties.
fn pressure(db: &StagedDb, r: &PressureReference) -> Pressure {
    let prop = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0) as f64;
    Pressure::new(
        prop("rocksdb.num-files-at-level0") / f64::from(r.l0_slowdown_trigger.max(1)),
        prop("rocksdb.num-immutable-mem-table") / f64::from(r.max_write_buffer_number.saturating_sub(1).max(1)),
        prop("rocksdb.estimate-pending-compaction-bytes") / (4.0 * r.max_bytes_for_level_base.max(1) as f64),
    )
}

/// One tenant's handle on a [`ProtectedDb`]: the calls of [`AsyncDb`], each
/// made as the tenant (no [`scope`](crate::scope) to remember, also in
/// tasks it spawns). Cheap to clone.
#[derive(Clone)]
pub struct Tenant {
    db: AsyncDb,
    name: String,
    context: RequestContext,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Tenant {
    /// The tenant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its request context.
    pub fn context(&self) -> RequestContext {
        self.context
    }

    /// [`AsyncDb::put`], as the tenant.
    pub async fn put(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> io::Result<()> {
        crate::scope(self.context, self.db.put(key, value)).await
    }

    /// [`AsyncDb::delete`], as the tenant.
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> io::Result<()> {
        crate::scope(self.context, self.db.delete(key)).await
    }

    /// [`AsyncDb::write`], as the tenant.
    pub async fn write(&self, batch: WriteBatch) -> io::Result<()> {
        crate::scope(self.context, self.db.write(batch)).await
    }

    /// [`AsyncDb::get`], as the tenant.
    pub async fn get(&self, key: impl Into<Vec<u8>>) -> io::Result<Option<Vec<u8>>> {
        crate::scope(self.context, self.db.get(key)).await
    }

    /// [`AsyncDb::multi_get`], as the tenant.
    pub async fn multi_get(&self, keys: Vec<Vec<u8>>) -> io::Result<Vec<Option<Vec<u8>>>> {
        crate::scope(self.context, self.db.multi_get(keys)).await
    }

    /// [`AsyncDb::scan`], as the tenant.
    pub fn scan(&self, start: impl Into<Vec<u8>>) -> Scan {
        self.db.scan_as(self.context, start.into())
    }

    /// A put as the tenant, for code outside an async runtime (its own
    /// threads): admission waits on the calling thread, and the write runs
    /// on it. Charged as [`put`](Self::put).
    pub fn put_blocking(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        let ctx = self.db.context_of(self.context, RequestType::Put, key.len() + value.len());
        let options = self.db.write_options();
        self.db.call_blocking(ctx, |db| db.put_opt(key, value, options), |_| 0)
    }

    /// A delete as the tenant, blocking (see [`put_blocking`](Self::put_blocking)).
    pub fn delete_blocking(&self, key: &[u8]) -> io::Result<()> {
        let ctx = self.db.context_of(self.context, RequestType::Delete, key.len());
        let options = self.db.write_options();
        self.db.call_blocking(ctx, |db| db.delete_opt(key, options), |_| 0)
    }

    /// A get as the tenant, blocking; charged its key, then the value.
    pub fn get_blocking(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let ctx = self.db.context_of(self.context, RequestType::Get, read_size(key.len()));
        self.db.call_blocking(ctx, |db| db.get(key), |v| v.as_ref().map_or(0, |v| v.len() as u64))
    }

    /// [`AsyncDb::scan_collect`], as the tenant.
    pub async fn scan_collect(&self, start: impl Into<Vec<u8>>, limit: usize) -> io::Result<Vec<Entry>> {
        crate::scope(self.context, self.db.scan_collect(start, limit)).await
    }
}
