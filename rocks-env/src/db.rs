//! Opening a RocksDB `DB` wired to a stage.

use std::io;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kv_stage::{InstanceId, Stage, layer::KvStore};
use rocksdb::{ColumnFamilyDescriptor, DB, IteratorMode};

use crate::device::{Device, DeviceStats};
use crate::env::{add_listener, set_delete_rate, staged_env};
use crate::error::{Error, Result};
use crate::fault::FaultInjection;
use crate::io::{BackgroundErrors, CompactionLevelStats, DbIo, IoStats, JobStats};
use crate::layout::RocksLayout;

/// The bound on a background request that the default controller's set-ups
/// use ([`StagedDbBuilder::max_background_request`]; `kv_async::ProtectedDb`
/// and bench-ycsb's `default` system): 64 KiB, about 1 ms at 64 MiB/s, the
/// size the emulated device serves requests in ([`crate::DEVICE_CHUNK`]).
/// Measured on a kernel-throttled disk (`results/figures-kernel-2026-12-04`).
pub const DEFAULT_MAX_BACKGROUND_REQUEST: u64 = 64 << 10;

/// How long a deletion may wait for a calm moment in the default
/// controller's set-ups ([`StagedDbBuilder::defer_deletions`];
/// `kv_async::ProtectedDb` and bench-ycsb's `default` system): 30 s.
/// Measured on a kernel-throttled disk mounted with online discard
/// (`results/write-peaks-kernel-2026-12-05d`).
pub const DEFAULT_DEFER_DELETIONS: std::time::Duration = std::time::Duration::from_secs(30);

/// The piece [`StagedDbBuilder::delete_in_pieces`] frees at a time in the
/// controller's set-ups (bench-ycsb's default system, `kv_async::ProtectedDb`):
/// 1 MiB. On this project's test machine (ext4 with online discard on a
/// virtual disk) unlinking a 64 MiB file waited 16-17 ms in its discard, and
/// each 1 MiB shortening of one at most 1.0 ms.
pub const DEFAULT_DELETE_PIECE: u64 = 1 << 20;

/// The default [`StagedDbBuilder::max_trash_ratio`]: RocksDB's own, a
/// quarter of the DB's size.
pub const DEFAULT_MAX_TRASH_RATIO: f64 = 0.25;

/// Builds a [`StagedDb`].
///
/// ```no_run
/// use std::sync::Arc;
/// use kv_stage::Stage;
/// use rocks_env::{RocksLayout, StagedDb};
///
/// let stage = Arc::new(Stage::new("app"));
/// let handles = RocksLayout::new().install(&stage).unwrap();
/// let mut opts = rocksdb::Options::default();
/// opts.create_if_missing(true);
/// let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open("/tmp/db").unwrap();
/// db.put(b"key", b"value").unwrap(); // the rocksdb API, through Deref
/// ```
pub struct StagedDbBuilder {
    options: rocksdb::Options,
    stage: Option<Arc<Stage>>,
    device: Option<Arc<Device>>,
    fault: Option<Arc<FaultInjection>>,
    instance: InstanceId,
    column_families: Vec<(String, rocksdb::Options)>,
    max_background_request: u64,
    delete_rate: u64,
    max_trash_ratio: f64,
    defer_deletions: std::time::Duration,
    delete_piece: u64,
}

impl StagedDbBuilder {
    /// Starts from RocksDB options (used as given; the builder only adds its
    /// Env and event listener to a copy). If the options carry an Env (say
    /// `rocksdb::Env::mem_env()`), the DB keeps using it: the stage wraps
    /// that Env's file system, and its threads and clock stay.
    pub fn new(options: rocksdb::Options) -> Self {
        StagedDbBuilder {
            options,
            stage: None,
            device: None,
            fault: None,
            instance: InstanceId(0),
            column_families: Vec::new(),
            max_background_request: 0,
            delete_rate: 0,
            max_trash_ratio: DEFAULT_MAX_TRASH_RATIO,
            defer_deletions: std::time::Duration::ZERO,
            delete_piece: 0,
        }
    }

    /// The stage to enforce through. Default: a new stage with the
    /// [`RocksLayout`] installed (every rate unlimited).
    pub fn stage(mut self, stage: Arc<Stage>) -> Self {
        self.stage = Some(stage);
        self
    }

    /// An emulated device, in a layer below the stage. Default: none (no
    /// such layer).
    pub fn device(mut self, device: Arc<Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// A fault injector, in a layer below the stage and the device, over
    /// the files. For tests. Default: none (no such layer).
    pub fn fault_injection(mut self, fault: Arc<FaultInjection>) -> Self {
        self.fault = Some(fault);
        self
    }

    /// The instance id this DB's requests carry. DBs that share a stage need
    /// distinct ids: opening a second DB under an id that is open on the
    /// stage fails. Default: 0.
    pub fn instance(mut self, instance: InstanceId) -> Self {
        self.instance = instance;
        self
    }

    /// The largest read or write, in bytes, a flush or compaction issues to
    /// the device at once ([`DEFAULT_MAX_BACKGROUND_REQUEST`] is what the
    /// default controller's set-ups use). RocksDB reads compaction input and writes table
    /// files in requests of a MiB or more under direct I/O (its compaction
    /// readahead, its writable-file buffer); a client read queued behind
    /// one at a 64 MiB/s device waits about 16 ms per MiB. With a limit, a larger
    /// background request on a file opened for direct I/O is issued in
    /// pieces of at most this size (rounded up to the file's alignment),
    /// one after the other, so a client request waits behind one piece. The
    /// request is still enforced and counted once, whole; client requests,
    /// buffered files and writes carrying checksum hand-off information are
    /// never split. Default: 0, no limit. [`StagedDb::set_max_background_request`]
    /// changes it while the DB is open.
    pub fn max_background_request(mut self, bytes: u64) -> Self {
        self.max_background_request = bytes;
        self
    }

    /// Paced deletion of obsolete files, in bytes per second (RocksDB's
    /// `SstFileManager` delete scheduler, on this DB's staged Env). A
    /// deleted table, blob or WAL file is renamed to `*.trash` at once and
    /// unlinked later by one background thread, one file after the other,
    /// so that the file system's work of freeing their blocks (on a file
    /// system mounted with online discard, a discard request the device
    /// serves before the I/O queued behind it) comes spread out instead of
    /// in bursts after every flush and compaction. Trash above
    /// [`Self::max_trash_ratio`] times the DB's size is deleted at once;
    /// trash a closed DB left is deleted when it is opened again with a
    /// rate. Default: 0, files are deleted at once.
    pub fn delete_rate(mut self, bytes_per_sec: u64) -> Self {
        self.delete_rate = bytes_per_sec;
        self
    }

    /// With a [`Self::delete_rate`]: the most trash waiting for deletion,
    /// as a share of the DB's size, above which a deleted file is removed
    /// at once (RocksDB's `max_trash_db_ratio`). Default:
    /// [`DEFAULT_MAX_TRASH_RATIO`].
    pub fn max_trash_ratio(mut self, ratio: f64) -> Self {
        self.max_trash_ratio = ratio;
        self
    }

    /// Deletions of obsolete files wait for a calm moment, for at most
    /// `max_wait`. While a limit holds this DB's flushes or compactions
    /// back (a DRL serving them has a finite rate: what a controller sets
    /// while clients need the device), a table, blob or WAL file RocksDB
    /// deletes is renamed to its name plus `.rocks-env-deferred` (a
    /// metadata change) and unlinked by the file system layer's own
    /// thread once no limit holds, or once it has waited `max_wait`, one
    /// file at a time, at most one every 50 ms. Freeing a file's blocks is
    /// device work: on a file system mounted with online discard (ext4
    /// `-o discard`) it sends the device a discard that the I/O queued
    /// behind it waits for. What still waits when the DB closes is unlinked
    /// then; what a crash left is unlinked when the DB opens again.
    /// Default: zero, files are deleted when RocksDB deletes them.
    pub fn defer_deletions(mut self, max_wait: std::time::Duration) -> Self {
        self.defer_deletions = max_wait;
        self
    }

    /// Deleted files are freed `piece` bytes at a time (0: at once, the
    /// default). Every table, blob or WAL file RocksDB deletes is then
    /// renamed as a held-back one is ([`Self::defer_deletions`]) and handed
    /// to the file system layer's own thread, which shortens it by `piece`
    /// bytes, pauses 10 ms, and so on, then unlinks it. On a file system
    /// mounted with online discard, freeing a 64 MiB table at once is one
    /// discard the I/O queued behind it waits for; in pieces, no wait is
    /// longer than one piece's. Neither RocksDB's threads nor the clients
    /// wait for a deletion; the cost is that a deleted file's space comes
    /// back over (size / piece) x 10 ms rather than at once.
    pub fn delete_in_pieces(mut self, piece: u64) -> Self {
        self.delete_piece = piece;
        self
    }

    /// A column family to open (all existing ones must be listed, as with
    /// `DB::open_cf_descriptors`; `default` may be omitted).
    pub fn column_family(mut self, name: impl Into<String>, options: rocksdb::Options) -> Self {
        self.column_families.push((name.into(), options));
        self
    }

    /// Opens the DB.
    pub fn open(self, path: impl AsRef<Path>) -> Result<StagedDb> {
        let path = path.as_ref().to_path_buf();
        remove_deferred(&path)?;
        let stage = match self.stage {
            Some(s) => s,
            None => {
                let s = Arc::new(Stage::new(path.display().to_string()));
                RocksLayout::new().install(&s)?;
                s
            }
        };
        stage.open_instance(self.instance, &path.display().to_string())?;
        let io = DbIo::new(stage, self.instance);
        io.set_max_background_request(self.max_background_request);
        io.set_defer_deletions(self.defer_deletions);
        io.set_delete_piece(self.delete_piece);
        // If anything below fails, the instance is given back.
        let guard = OpenGuard(&io);
        let mut options = self.options.clone();
        let env = staged_env(&options, &io, self.device.as_ref(), self.fault.as_deref())?;
        options.set_env(&env);
        if self.delete_rate > 0 {
            if !(self.max_trash_ratio.is_finite() && self.max_trash_ratio >= 0.0) {
                return Err(Error::Config(format!(
                    "max_trash_ratio must be a number of at least 0 (is {})",
                    self.max_trash_ratio
                )));
            }
            set_delete_rate(&mut options, &env, self.delete_rate, self.max_trash_ratio);
        }
        add_listener(&mut options, &io);
        let db = if self.column_families.is_empty() {
            DB::open(&options, &path)
        } else {
            let cfs = self.column_families.into_iter().map(|(name, o)| ColumnFamilyDescriptor::new(name, o));
            DB::open_cf_descriptors(&options, &path, cfs)
        }
        .map_err(|e| Error::opening(&path, e))?;
        std::mem::forget(guard);
        let statistics = options.get_statistics().is_some();
        Ok(StagedDb {
            statistics,
            db: Some(db),
            _options: options,
            _env: env,
            _user_options: self.options,
            device: self.device,
            io,
            path,
        })
    }
}

/// The name suffix of a file whose deletion waits
/// ([`StagedDbBuilder::defer_deletions`]).
pub const DEFERRED_SUFFIX: &str = ".rocks-env-deferred";

/// Unlinks what deferred deletions left in `dir` (a crash before they
/// were done). A missing directory has none.
fn remove_deferred(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::Config(format!("{}: listing deferred deletions: {e}", dir.display()))),
    };
    for e in entries {
        let e = e.map_err(|e| Error::Config(format!("{}: listing deferred deletions: {e}", dir.display())))?;
        if e.file_name().to_string_lossy().ends_with(DEFERRED_SUFFIX) {
            std::fs::remove_file(e.path())
                .map_err(|err| Error::Config(format!("{}: removing a deferred deletion: {err}", e.path().display())))?;
        }
    }
    Ok(())
}

/// Closes the instance again when an open fails half-way.
struct OpenGuard<'a>(&'a Arc<DbIo>);

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.set_closing();
        self.0.closed();
    }
}

/// A RocksDB `DB` whose every file-system request goes through a stage.
///
/// Derefs to [`rocksdb::DB`], so the whole rocksdb API is available. On
/// drop the DB's instance is closed on the stage first: its requests that
/// wait in any object are admitted at once and later ones are not held, so
/// closing never waits on a throttled limiter (not even at rate 0). Jobs
/// RocksDB never reported as completed are then retired.
pub struct StagedDb {
    // Dropped first: the DB closes before its options, Env and handle go.
    db: Option<DB>,
    _options: rocksdb::Options,
    _env: rocksdb::Env,
    /// The application's options as given: they keep its Env alive, which
    /// the staged Env runs on.
    _user_options: rocksdb::Options,
    device: Option<Arc<Device>>,
    io: Arc<DbIo>,
    path: PathBuf,
    /// The options enable RocksDB's statistics (its tickers count).
    statistics: bool,
}

impl StagedDb {
    /// Starts building.
    pub fn builder(options: rocksdb::Options) -> StagedDbBuilder {
        StagedDbBuilder::new(options)
    }

    /// Opens with a fresh stage holding the [`RocksLayout`].
    pub fn open(options: rocksdb::Options, path: impl AsRef<Path>) -> Result<StagedDb> {
        StagedDbBuilder::new(options).open(path)
    }

    /// The DB.
    pub fn db(&self) -> &DB {
        self.db.as_ref().expect("the DB is open until drop")
    }

    /// The stage this DB enforces through.
    pub fn stage(&self) -> &Arc<Stage> {
        self.io.stage()
    }

    /// The instance id its requests carry.
    pub fn instance(&self) -> InstanceId {
        self.io.instance()
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes and requests per file kind that went through the wrapper.
    pub fn io_stats(&self) -> IoStats {
        self.io.io_stats()
    }

    /// The file I/O of calls made for each client (a tenant), on threads
    /// that set a [`ClientScope`](crate::ClientScope) (as `kv_async::AsyncDb`
    /// does): enforced as foreground, counted here per client. Clients
    /// without file I/O are left out.
    pub fn client_io(&self) -> Vec<crate::io::ClientIo> {
        self.io.client_io()
    }

    /// Flushes and compactions as the event listener reported them.
    pub fn jobs(&self) -> JobStats {
        self.io.job_stats()
    }

    /// Compactions per level pair (`bg_compaction_L0_L0`,
    /// `bg_compaction_L0_L1`, `bg_compaction_L1_L2`, ...): RocksDB's job
    /// statistics next to the bytes rocks-env tagged with each context.
    /// Only contexts that had a job or a byte are listed.
    pub fn compaction_levels(&self) -> Vec<CompactionLevelStats> {
        self.io.compaction_levels()
    }

    /// The emulated device's statistics, when there is one.
    pub fn device_stats(&self) -> Option<DeviceStats> {
        self.device.as_ref().map(|d| d.stats())
    }

    /// Time RocksDB stalled writes so far (the `rocksdb.stall.micros`
    /// ticker), in microseconds; `None` unless the DB's options enable
    /// statistics (`Options::enable_statistics`).
    pub fn stall_micros(&self) -> Option<u64> {
        self.statistics.then(|| self._options.get_ticker_count(rocksdb::statistics::Ticker::StallMicros))
    }

    /// The largest request a flush or compaction issues at once (0: no
    /// limit); see [`StagedDbBuilder::max_background_request`].
    pub fn max_background_request(&self) -> u64 {
        self.io.max_background_request()
    }

    /// Bytes of a deleted file freed at a time (0: at once); see
    /// [`StagedDbBuilder::delete_in_pieces`].
    pub fn delete_piece(&self) -> u64 {
        self.io.delete_piece_setting()
    }

    /// Deletions of obsolete files held back so far
    /// ([`StagedDbBuilder::defer_deletions`]).
    pub fn deletions_deferred(&self) -> u64 {
        self.io.deletions_deferred()
    }

    /// Changes [`Self::max_background_request`]; requests that start after
    /// the call use it.
    pub fn set_max_background_request(&self, bytes: u64) {
        self.io.set_max_background_request(bytes);
    }

    /// Requests the stage refused (each became an I/O error in RocksDB).
    pub fn refused_requests(&self) -> u64 {
        self.io.refused()
    }

    /// Background errors RocksDB reported (failed flushes, compactions,
    /// MANIFEST or WAL writes).
    pub fn background_errors(&self) -> BackgroundErrors {
        self.io.background_errors()
    }
}

impl Deref for StagedDb {
    type Target = DB;
    fn deref(&self) -> &DB {
        self.db()
    }
}

impl Drop for StagedDb {
    fn drop(&mut self) {
        self.io.set_closing();
        drop(self.db.take());
        self.io.closed();
    }
}

fn to_io(e: rocksdb::Error) -> io::Error {
    io::Error::other(e)
}

impl KvStore for StagedDb {
    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        self.db().put(key, value).map_err(to_io)
    }

    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        self.db().get(key).map_err(to_io)
    }

    fn delete(&self, key: &[u8]) -> io::Result<()> {
        self.db().delete(key).map_err(to_io)
    }

    fn scan(&self, start: &[u8], limit: usize, visit: &mut dyn FnMut(&[u8], &[u8])) -> io::Result<usize> {
        let mut n = 0;
        for item in self.db().iterator(IteratorMode::From(start, rocksdb::Direction::Forward)).take(limit) {
            let (k, v) = item.map_err(to_io)?;
            visit(&k, &v);
            n += 1;
        }
        Ok(n)
    }
}
