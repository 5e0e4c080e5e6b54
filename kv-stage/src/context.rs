//! The context of one request: who issued it (workflow), what it is (request
//! type), why it happens (request context: foreground, flush, compaction, or an
//! application-defined context), which instance it belongs to, and its size.
//!
//! A [`Context`] is a small `Copy` value; building one allocates nothing. The
//! request context of the current thread can be set for a scope with
//! [`ContextScope`] (or [`with_context`]), which is how a layer propagates "this
//! I/O belongs to a flush" down to the code that builds contexts.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};

/// Identifies a workflow: by default the OS thread id of the thread that
/// issued the request; applications may set their own ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkflowId(pub u64);

thread_local! {
    /// The OS thread id, or 0 until first asked (a const initializer keeps
    /// the access a plain load).
    static THREAD_WORKFLOW: Cell<u64> = const { Cell::new(0) };
    static SCOPED_CONTEXT: Cell<RequestContext> = const { Cell::new(RequestContext::FOREGROUND) };
}

fn os_thread_id() -> u64 {
    rustix::thread::gettid().as_raw_nonzero().get() as u64
}

impl WorkflowId {
    /// The OS thread id of the calling thread (cached per thread).
    #[inline]
    pub fn current() -> Self {
        let w = THREAD_WORKFLOW.get();
        if w != 0 {
            return WorkflowId(w);
        }
        let w = os_thread_id();
        THREAD_WORKFLOW.set(w);
        WorkflowId(w)
    }
}

impl fmt::Display for WorkflowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identifies the instance (a DB, a volume, a tenant's store) a request
/// belongs to when several share one stage. `0` when there is only one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(pub u16);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

macro_rules! request_types {
    ($( $(#[$doc:meta])* $variant:ident = $n:literal => $name:literal ),+ $(,)?) => {
        /// What a request does. File-system calls and key-value calls share
        /// one vocabulary so a stage can sit under either layer.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum RequestType {
            $( $(#[$doc])* $variant = $n, )+
        }

        impl RequestType {
            /// Every request type, in discriminant order.
            pub const ALL: [RequestType; RequestType::COUNT] = [$(RequestType::$variant),+];

            /// The lower-case name used in rules and statistics.
            pub const fn as_str(self) -> &'static str {
                match self { $(RequestType::$variant => $name),+ }
            }
        }
    };
}

request_types! {
    /// A file read (`read`, `pread`, a RocksDB `Read`/`MultiRead`).
    Read = 0 => "read",
    /// A file write or append.
    Write = 1 => "write",
    /// `fsync`/`fdatasync`/range sync.
    Sync = 2 => "sync",
    /// Opening or creating a file.
    Open = 3 => "open",
    /// Closing a file.
    Close = 4 => "close",
    /// Deleting a file, or a key-value delete.
    Delete = 5 => "delete",
    /// Renaming a file.
    Rename = 6 => "rename",
    /// Truncating or pre-allocating a file.
    Truncate = 7 => "truncate",
    /// Other metadata calls: stat, directory listing, locks, links.
    Metadata = 8 => "metadata",
    /// A key-value put.
    Put = 9 => "put",
    /// A key-value point read.
    Get = 10 => "get",
    /// A key-value range scan or iterator step.
    Scan = 11 => "scan",
    /// A batched key-value point read.
    MultiGet = 12 => "multi_get",
    /// A key-value write batch.
    WriteBatch = 13 => "write_batch",
    /// A key-value merge.
    Merge = 14 => "merge",
    /// Anything else.
    Other = 15 => "other",
}

impl RequestType {
    /// Number of request types.
    pub const COUNT: usize = 16;

    /// Dense index in `0..COUNT`.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// True for file data requests: reads and writes of file contents
    /// (not metadata, not key-value requests). What a context moves to and
    /// from the device.
    #[inline]
    pub const fn is_file_data(self) -> bool {
        matches!(self, RequestType::Read | RequestType::Write)
    }

    /// True for requests that read data (file reads and key-value reads).
    pub const fn is_read(self) -> bool {
        matches!(self, RequestType::Read | RequestType::Get | RequestType::Scan | RequestType::MultiGet)
    }

    /// True for requests that write data or make it durable.
    pub const fn is_write(self) -> bool {
        matches!(
            self,
            RequestType::Write
                | RequestType::Sync
                | RequestType::Put
                | RequestType::WriteBatch
                | RequestType::Merge
                | RequestType::Delete
        )
    }
}

impl fmt::Display for RequestType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RequestType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.to_ascii_lowercase();
        RequestType::ALL.into_iter().find(|t| t.as_str() == lower || t.as_str().replace('_', "") == lower).ok_or_else(
            || {
                let names: Vec<&str> = RequestType::ALL.iter().map(|t| t.as_str()).collect();
                Error::invalid(format!("unknown request type '{s}' (one of: {})", names.join(", ")))
            },
        )
    }
}

impl Serialize for RequestType {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RequestType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

macro_rules! reasons {
    ($( $(#[$doc:meta])* $variant:ident = $n:literal => $name:literal / $rocks:literal ),+ $(,)?) => {
        /// Why a background job runs: RocksDB's `CompactionReason`, carried
        /// by every request of a compaction so a rule can match it
        /// (`reason = "ttl"`). Requests of anything else carry
        /// [`Reason::None`].
        ///
        /// Names are RocksDB's, in snake case (`l0_files` for
        /// `kLevelL0FilesNum`, `manual` for `kManualCompaction`, ...);
        /// RocksDB's own spelling (`LevelL0FilesNum`, `kManualCompaction`)
        /// parses too.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        #[repr(u8)]
        pub enum Reason {
            $( $(#[$doc])* $variant = $n, )+
        }

        impl Reason {
            /// Every reason, in discriminant order.
            pub const ALL: [Reason; Reason::COUNT] = [$(Reason::$variant),+];

            /// The snake-case name used in rules and statistics.
            pub const fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => $name),+ }
            }

            /// RocksDB's name (`GetCompactionReasonString`), or `"None"`.
            pub const fn rocksdb_name(self) -> &'static str {
                match self { $(Reason::$variant => $rocks),+ }
            }
        }
    };
}

reasons! {
    /// Not a compaction, or a request no job is known for.
    #[default]
    None = 0 => "none" / "None",
    /// `kUnknown`.
    Unknown = 1 => "unknown" / "Unknown",
    /// `kLevelL0FilesNum`: L0 has too many files.
    L0Files = 2 => "l0_files" / "LevelL0FilesNum",
    /// `kLevelMaxLevelSize`: a level is over its target size.
    LevelSize = 3 => "level_size" / "LevelMaxLevelSize",
    /// `kUniversalSizeAmplification`.
    UniversalSizeAmplification = 4 => "universal_size_amplification" / "UniversalSizeAmplification",
    /// `kUniversalSizeRatio`.
    UniversalSizeRatio = 5 => "universal_size_ratio" / "UniversalSizeRatio",
    /// `kUniversalSortedRunNum`.
    UniversalSortedRuns = 6 => "universal_sorted_runs" / "UniversalSortedRunNum",
    /// `kFIFOMaxSize`.
    FifoMaxSize = 7 => "fifo_max_size" / "FIFOMaxSize",
    /// `kFIFOReduceNumFiles`.
    FifoReduceFiles = 8 => "fifo_reduce_files" / "FIFOReduceNumFiles",
    /// `kFIFOTtl`.
    FifoTtl = 9 => "fifo_ttl" / "FIFOTtl",
    /// `kManualCompaction`: `CompactRange` or `CompactFiles`.
    Manual = 10 => "manual" / "ManualCompaction",
    /// `kFilesMarkedForCompaction`.
    MarkedFiles = 11 => "marked_files" / "FilesMarkedForCompaction",
    /// `kBottommostFiles`.
    BottommostFiles = 12 => "bottommost_files" / "BottommostFiles",
    /// `kTtl`: files older than the `ttl` option.
    Ttl = 13 => "ttl" / "Ttl",
    /// `kFlush`.
    Flush = 14 => "flush" / "Flush",
    /// `kExternalSstIngestion`.
    Ingestion = 15 => "external_sst_ingestion" / "ExternalSstIngestion",
    /// `kPeriodicCompaction`: `periodic_compaction_seconds`.
    Periodic = 16 => "periodic" / "PeriodicCompaction",
    /// `kChangeTemperature`.
    ChangeTemperature = 17 => "change_temperature" / "ChangeTemperature",
    /// `kForcedBlobGC`.
    ForcedBlobGc = 18 => "forced_blob_gc" / "ForcedBlobGC",
    /// `kRoundRobinTtl`.
    RoundRobinTtl = 19 => "round_robin_ttl" / "RoundRobinTtl",
    /// `kRefitLevel`.
    RefitLevel = 20 => "refit_level" / "RefitLevel",
    /// `kReadTriggered`.
    ReadTriggered = 21 => "read_triggered" / "ReadTriggered",
}

impl Reason {
    /// Number of reasons.
    pub const COUNT: usize = 22;

    /// Dense index in `0..COUNT`.
    #[inline]
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The reason of RocksDB's `CompactionReason` value `v` (its enum order,
    /// checked against RocksDB's header when rocks-env builds); a value this
    /// version does not know is [`Reason::Unknown`].
    pub const fn from_rocksdb(v: u8) -> Reason {
        let i = v as usize + 1;
        if i < Self::COUNT { Self::ALL[i] } else { Reason::Unknown }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reason {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let plain = s.strip_prefix('k').filter(|r| r.starts_with(|c: char| c.is_ascii_uppercase())).unwrap_or(s);
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(plain) || r.rocksdb_name().eq_ignore_ascii_case(plain))
            .ok_or_else(|| {
                let names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
                Error::invalid(format!("unknown compaction reason '{s}' (one of: {})", names.join(", ")))
            })
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Reason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Why a request happens: foreground client work, a flush, a compaction, or
/// an application-defined context such as `backup` or a tenant name.
///
/// Built-in contexts have fixed ids below [`RequestContext::FIRST_USER_ID`];
/// application contexts are registered once by name with
/// [`RequestContext::register`] and then travel as a small integer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestContext(u16);

const BUILTIN_NAMES: [&str; 16] = [
    "foreground",
    "bg_flush",
    "bg_compaction_L0_L1",
    "bg_compaction_LN",
    "bg_compaction",
    "background",
    "bg_compaction_L0_L0",
    "bg_compaction_L1_L2",
    "bg_compaction_L2_L3",
    "bg_compaction_L3_L4",
    "bg_compaction_L4_L5",
    "bg_compaction_L5_L6",
    "bg_compaction_L6_L7",
    "bg_compaction_L7_L8",
    "bg_compaction_L8_L9",
    "bg_compaction_L9_L10",
];

/// The id of `bg_compaction_L1_L2`; the pair into output level `n` has id
/// `FIRST_PAIR_ID + n - 2`.
const FIRST_PAIR_ID: u16 = 7;

/// The state of one application context id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Registered for good.
    Registered(&'static str),
    /// Reserved by rules that have not been applied yet; freed when the
    /// last reservation holding it is dropped (see [`ContextReservation`]).
    Reserved(&'static str, usize),
    /// Free for a new name.
    Free,
}

#[derive(Default)]
struct Registry {
    slots: Vec<Slot>,
    /// Every name ever stored, so a name reserved again and again is
    /// allocated once (a set: the lookup stays constant however many names
    /// failed batches declared).
    interned: std::collections::HashSet<&'static str>,
}

/// Most distinct context names a process stores (registered, or declared
/// by rules that may not apply): names live for the whole process, so
/// batches declaring ever new names would otherwise grow memory without
/// bound. 64 characters each at most: 256 KiB at the cap.
pub(crate) const MAX_INTERNED_NAMES: usize = 4096;

impl Registry {
    fn intern(&mut self, name: &str) -> Result<&'static str> {
        if let Some(n) = self.interned.get(name) {
            return Ok(n);
        }
        if self.interned.len() >= MAX_INTERNED_NAMES {
            return Err(Error::invalid(format!(
                "cannot store request context name '{name}': this process already holds {MAX_INTERNED_NAMES} distinct context names"
            )));
        }
        let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
        self.interned.insert(n);
        Ok(n)
    }

    fn find(&self, name: &str) -> Option<usize> {
        self.slots.iter().position(|s| matches!(s, Slot::Registered(n) | Slot::Reserved(n, _) if *n == name))
    }

    /// A slot for a new name: a free one, or a new one below the limit.
    fn new_slot(&mut self, name: &str) -> Result<usize> {
        if let Some(i) = self.slots.iter().position(|s| *s == Slot::Free) {
            return Ok(i);
        }
        if RequestContext::FIRST_USER_ID as usize + self.slots.len() >= RequestContext::MAX {
            return Err(Error::invalid(format!(
                "cannot register request context '{name}': all {} context ids are in use",
                RequestContext::MAX - RequestContext::FIRST_USER_ID as usize
            )));
        }
        self.slots.push(Slot::Free);
        Ok(self.slots.len() - 1)
    }
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(Registry::default())).lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// Reserved contexts the rules being parsed on this thread may name.
    static PARSING: RefCell<Vec<(&'static str, u16)>> = const { RefCell::new(Vec::new()) };
}

/// Contexts a batch of rules declared but that are not registered until the
/// batch applies: a rules file that fails to load, or to apply, leaves the
/// registry as it was (ids are process-wide and limited).
///
/// Shared by the clones of a [`RuleSet`](crate::RuleSet); when the last one
/// goes without having been applied, the reserved ids are freed.
#[derive(Debug, Default)]
pub(crate) struct ContextReservation {
    ids: Vec<u16>,
    committed: AtomicBool,
}

impl ContextReservation {
    /// Reserves `names` (all or none): names already registered need
    /// nothing, the others get an id that only rules parsed inside
    /// [`ContextReservation::scope`] can name.
    pub(crate) fn reserve(names: &[String]) -> Result<Self> {
        let mut reg = registry();
        let mut out = ContextReservation::default();
        if let Err(e) = out.reserve_locked(&mut reg, names) {
            // Given back here, under the lock this thread holds: the ids
            // are emptied first so that dropping `out` does not take the
            // lock again (a self-deadlock the fuzz harness found: a batch
            // declaring a new name, then a bad one).
            out.release(&mut reg);
            out.ids.clear();
            return Err(e);
        }
        drop(reg);
        Ok(out)
    }

    fn reserve_locked(&mut self, reg: &mut Registry, names: &[String]) -> Result<()> {
        for name in names {
            if RequestContext::builtin(name).is_some() {
                continue;
            }
            validate_name(name).map_err(|m| Error::invalid(format!("request context name '{name}': {m}")))?;
            let i = match reg.find(name) {
                Some(i) => i,
                None => {
                    let i = reg.new_slot(name)?;
                    let n = reg.intern(name)?;
                    reg.slots[i] = Slot::Reserved(n, 0);
                    i
                }
            };
            if let Slot::Reserved(n, count) = reg.slots[i]
                && !self.ids.contains(&(i as u16))
            {
                reg.slots[i] = Slot::Reserved(n, count + 1);
                self.ids.push(i as u16);
            }
        }
        Ok(())
    }

    /// Runs `f` with the reserved contexts nameable on this thread.
    pub(crate) fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let names: Vec<(&'static str, u16)> = {
            let reg = registry();
            self.ids
                .iter()
                .filter_map(|&i| match reg.slots[i as usize] {
                    Slot::Reserved(n, _) | Slot::Registered(n) => Some((n, i)),
                    Slot::Free => None,
                })
                .collect()
        };
        let before = PARSING.with(|p| std::mem::replace(&mut *p.borrow_mut(), names));
        let r = f();
        PARSING.with(|p| *p.borrow_mut() = before);
        r
    }

    /// The names this reservation holds that are not registered yet (the
    /// ones applying its batch would register).
    pub(crate) fn pending(&self) -> Vec<&'static str> {
        let reg = registry();
        self.ids
            .iter()
            .filter_map(|&i| match reg.slots[i as usize] {
                Slot::Reserved(n, _) => Some(n),
                _ => None,
            })
            .collect()
    }

    /// The batch applied: its contexts are registered for good.
    pub(crate) fn commit(&self) {
        if self.ids.is_empty() || self.committed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut reg = registry();
        for &i in &self.ids {
            if let Slot::Reserved(n, _) = reg.slots[i as usize] {
                reg.slots[i as usize] = Slot::Registered(n);
            }
        }
    }

    fn release(&self, reg: &mut Registry) {
        for &i in &self.ids {
            if let Slot::Reserved(n, count) = reg.slots[i as usize] {
                reg.slots[i as usize] = if count <= 1 { Slot::Free } else { Slot::Reserved(n, count - 1) };
            }
        }
    }
}

impl Drop for ContextReservation {
    fn drop(&mut self) {
        if !self.ids.is_empty() && !self.committed.load(Ordering::Acquire) {
            self.release(&mut registry());
        }
    }
}

impl RequestContext {
    /// Client (foreground) work. The default.
    pub const FOREGROUND: Self = Self(0);
    /// A memtable flush.
    pub const BG_FLUSH: Self = Self(1);
    /// A compaction from L0 into the base level (L1, or the first non-empty
    /// level when RocksDB sizes levels dynamically). Also the **class** of
    /// every compaction whose input starts at L0: it covers
    /// [`BG_COMPACTION_L0_L0`](Self::BG_COMPACTION_L0_L0) too, so a rule on
    /// it matches intra-L0 compactions unless a rule names those.
    pub const BG_COMPACTION_L0_L1: Self = Self(2);
    /// The **class** of every compaction whose input starts at L1 or deeper:
    /// it covers `bg_compaction_L1_L2` ... `bg_compaction_L9_L10`, and is
    /// itself the tag of such a compaction when its output level has no
    /// context of its own (deeper than L10).
    pub const BG_COMPACTION_LN: Self = Self(3);
    /// A compaction whose levels are not known.
    pub const BG_COMPACTION: Self = Self(4);
    /// Other background work.
    pub const BACKGROUND: Self = Self(5);
    /// An intra-L0 compaction (L0 files into one L0 file); a member of
    /// [`BG_COMPACTION_L0_L1`](Self::BG_COMPACTION_L0_L1).
    pub const BG_COMPACTION_L0_L0: Self = Self(6);
    /// A compaction into L2; a member of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const BG_COMPACTION_L1_L2: Self = Self(7);
    /// A compaction into L3; a member of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const BG_COMPACTION_L2_L3: Self = Self(8);
    /// A compaction into L4; a member of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const BG_COMPACTION_L3_L4: Self = Self(9);
    /// A compaction into L5; a member of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const BG_COMPACTION_L4_L5: Self = Self(10);
    /// A compaction into L6 (the last level of RocksDB's default seven); a
    /// member of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const BG_COMPACTION_L5_L6: Self = Self(11);

    /// Deepest output level with a context of its own (`bg_compaction_L9_L10`).
    pub const MAX_PAIR_LEVEL: u8 = 10;

    /// Built-in contexts, in id order.
    pub const BUILTINS: [RequestContext; 16] = [
        Self(0),
        Self(1),
        Self(2),
        Self(3),
        Self(4),
        Self(5),
        Self(6),
        Self(7),
        Self(8),
        Self(9),
        Self(10),
        Self(11),
        Self(12),
        Self(13),
        Self(14),
        Self(15),
    ];

    /// The per-level compaction contexts, shallowest first: `L0_L0`,
    /// `L0_L1`, `L1_L2`, ..., `L9_L10`.
    pub const COMPACTION_PAIRS: [RequestContext; 11] =
        [Self(6), Self(2), Self(7), Self(8), Self(9), Self(10), Self(11), Self(12), Self(13), Self(14), Self(15)];

    /// The members of [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    const LN_MEMBERS: [RequestContext; 9] =
        [Self(7), Self(8), Self(9), Self(10), Self(11), Self(12), Self(13), Self(14), Self(15)];
    /// The members of [`BG_COMPACTION_L0_L1`](Self::BG_COMPACTION_L0_L1).
    const L0_MEMBERS: [RequestContext; 1] = [Self(6)];

    /// The context of a compaction, by its levels (negative: unknown):
    /// from L0 into L0 is `L0_L0`, from L0 into any deeper level (the base
    /// level) `L0_L1`; from L1 or deeper, the pair ending at the output level
    /// (`L2_L3` for output level 3), or `LN` beyond
    /// [`MAX_PAIR_LEVEL`](Self::MAX_PAIR_LEVEL) or when the output level is
    /// not below the input's (universal compaction's sorted runs).
    pub const fn compaction(base_input_level: i32, output_level: i32) -> Self {
        if base_input_level < 0 || output_level < 0 {
            Self::BG_COMPACTION
        } else if base_input_level == 0 {
            if output_level == 0 { Self::BG_COMPACTION_L0_L0 } else { Self::BG_COMPACTION_L0_L1 }
        } else if output_level >= 2 && output_level <= Self::MAX_PAIR_LEVEL as i32 && output_level > base_input_level {
            Self(FIRST_PAIR_ID + output_level as u16 - 2)
        } else {
            Self::BG_COMPACTION_LN
        }
    }

    /// The levels of a per-level compaction context: `(input, output)`.
    /// `None` for every other context, the `LN` class included.
    pub const fn level_pair(self) -> Option<(u8, u8)> {
        match self.0 {
            2 => Some((0, 1)),
            6 => Some((0, 0)),
            7..=15 => {
                let out = (self.0 - FIRST_PAIR_ID) as u8 + 2;
                Some((out - 1, out))
            }
            _ => None,
        }
    }

    /// True for the two classes, [`BG_COMPACTION_L0_L1`](Self::BG_COMPACTION_L0_L1)
    /// and [`BG_COMPACTION_LN`](Self::BG_COMPACTION_LN).
    pub const fn is_class(self) -> bool {
        matches!(self.0, 2 | 3)
    }

    /// The contexts a class covers besides itself (empty for every other
    /// context).
    pub const fn members(self) -> &'static [RequestContext] {
        match self.0 {
            2 => &Self::L0_MEMBERS,
            3 => &Self::LN_MEMBERS,
            _ => &[],
        }
    }

    /// The class a per-level context belongs to, if any.
    pub const fn class(self) -> Option<Self> {
        match self.0 {
            6 => Some(Self::BG_COMPACTION_L0_L1),
            7..=15 => Some(Self::BG_COMPACTION_LN),
            _ => None,
        }
    }

    /// Whether a rule or a query naming `self` covers requests tagged
    /// `other`: the same context, or a member of the class `self` is.
    #[inline]
    pub const fn covers(self, other: Self) -> bool {
        self.0 == other.0
            || match other.class() {
                Some(c) => c.0 == self.0,
                None => false,
            }
    }

    /// The first id handed to an application-defined context.
    pub const FIRST_USER_ID: u16 = 16;
    /// Upper bound on context ids (built-in and registered), so per-thread
    /// statistics can use a fixed array.
    pub const MAX: usize = 256;

    /// Registers an application context by name, or returns the existing one.
    ///
    /// Names are 1 to 64 characters of `[A-Za-z0-9_.:-]`. A built-in name
    /// returns the built-in context. Fails when the name is invalid or all
    /// [`RequestContext::MAX`] ids are taken.
    pub fn register(name: &str) -> Result<Self> {
        if let Some(c) = Self::builtin(name) {
            return Ok(c);
        }
        validate_name(name).map_err(|m| Error::invalid(format!("request context name '{name}': {m}")))?;
        let mut reg = registry();
        let i = match reg.find(name) {
            Some(i) => i,
            None => reg.new_slot(name)?,
        };
        // Registered names live for the whole process: there are at most a few
        // hundred, and a `&'static str` keeps lookups lock-free for callers.
        // A name reserved by rules not yet applied is registered for good now.
        let n = reg.intern(name)?;
        reg.slots[i] = Slot::Registered(n);
        Ok(Self(Self::FIRST_USER_ID + i as u16))
    }

    /// How many application context ids are neither registered nor
    /// reserved by rules not yet applied: what [`register`](Self::register)
    /// can still hand out.
    pub fn free_ids() -> usize {
        let reg = registry();
        let cap = Self::MAX - Self::FIRST_USER_ID as usize;
        cap - reg.slots.iter().filter(|s| **s != Slot::Free).count()
    }

    fn builtin(name: &str) -> Option<Self> {
        BUILTIN_NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)).map(|i| Self(i as u16))
    }

    /// Finds a built-in or registered context by name, without registering.
    /// (While rules are parsed, the contexts they declare are found too.)
    pub fn lookup(name: &str) -> Option<Self> {
        if let Some(c) = Self::builtin(name) {
            return Some(c);
        }
        let parsing = PARSING.try_with(|p| p.borrow().iter().find(|(n, _)| *n == name).map(|&(_, i)| i)).ok().flatten();
        if let Some(i) = parsing {
            return Some(Self(Self::FIRST_USER_ID + i));
        }
        let reg = registry();
        reg.slots
            .iter()
            .position(|s| matches!(s, Slot::Registered(n) if *n == name))
            .map(|i| Self(Self::FIRST_USER_ID + i as u16))
    }

    /// The context with id `id`, if it is built in or registered.
    pub fn from_id(id: u16) -> Option<Self> {
        if (id as usize) < BUILTIN_NAMES.len() {
            return Some(Self(id));
        }
        let i = id.checked_sub(Self::FIRST_USER_ID)? as usize;
        matches!(registry().slots.get(i), Some(Slot::Registered(_))).then_some(Self(id))
    }

    /// Every context known now: the built-ins, then registered ones.
    pub fn all() -> Vec<RequestContext> {
        let reg = registry();
        let mut v = Self::BUILTINS.to_vec();
        v.extend(
            reg.slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s, Slot::Registered(_)))
                .map(|(i, _)| Self(Self::FIRST_USER_ID + i as u16)),
        );
        v
    }

    /// The numeric id.
    #[inline]
    pub const fn id(self) -> u16 {
        self.0
    }

    /// Dense index in `0..MAX`.
    #[inline]
    pub const fn index(self) -> usize {
        self.0 as usize
    }

    /// The context's name (`"bg_flush"`, `"backup"`, ...).
    pub fn name(self) -> &'static str {
        if let Some(n) = BUILTIN_NAMES.get(self.0 as usize) {
            return n;
        }
        let reg = registry();
        match self.0.checked_sub(Self::FIRST_USER_ID).and_then(|i| reg.slots.get(i as usize)) {
            Some(Slot::Registered(n) | Slot::Reserved(n, _)) => n,
            _ => "unknown",
        }
    }

    /// True for the built-in contexts.
    pub const fn is_builtin(self) -> bool {
        (self.0 as usize) < BUILTIN_NAMES.len()
    }

    /// True for flushes, compactions and other background work.
    pub const fn is_background(self) -> bool {
        matches!(self.0, 1..=15)
    }

    /// The context propagated to the calling thread by [`ContextScope`], or
    /// [`RequestContext::FOREGROUND`].
    #[inline]
    pub fn current() -> Self {
        SCOPED_CONTEXT.get()
    }
}

fn validate_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters long");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')) {
        return Err("may only contain letters, digits, '_', '.', ':' and '-'");
    }
    Ok(())
}

impl fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestContext({}={})", self.0, self.name())
    }
}

impl fmt::Display for RequestContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for RequestContext {
    type Err = Error;
    /// Parses a built-in or already-registered name; does not register.
    fn from_str(s: &str) -> Result<Self> {
        Self::lookup(s).ok_or_else(|| {
            Error::invalid(format!(
                "unknown request context '{s}' (built-in: {}; application contexts must be registered or declared first)",
                BUILTIN_NAMES.join(", ")
            ))
        })
    }
}

impl Serialize for RequestContext {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for RequestContext {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Everything the stage needs to classify and enforce one request.
///
/// `Copy`, 24 bytes, no allocation. [`Context::new`] fills the workflow with
/// the calling thread's id and the request context with the one propagated by
/// [`ContextScope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Context {
    /// Who issued the request.
    pub workflow: WorkflowId,
    /// Size in bytes (0 for metadata requests).
    pub size: u64,
    /// Which instance (DB, volume, tenant store) the request belongs to.
    pub instance: InstanceId,
    /// Why the request happens.
    pub context: RequestContext,
    /// What the request does.
    pub request_type: RequestType,
    /// Why the background job it belongs to runs ([`Reason::None`] for
    /// anything but a compaction).
    pub reason: Reason,
}

impl Context {
    /// A context for the calling thread: its workflow id, the request context
    /// propagated to it (foreground by default) and instance 0.
    #[inline]
    pub fn new(request_type: RequestType, size: u64) -> Self {
        Context {
            workflow: WorkflowId::current(),
            size,
            instance: InstanceId(0),
            context: RequestContext::current(),
            request_type,
            reason: Reason::None,
        }
    }

    /// A context with every classifier given explicitly.
    #[inline]
    pub const fn with(
        workflow: WorkflowId,
        request_type: RequestType,
        context: RequestContext,
        instance: InstanceId,
        size: u64,
    ) -> Self {
        Context { workflow, size, instance, context, request_type, reason: Reason::None }
    }

    /// Replaces the request context.
    #[inline]
    pub const fn in_context(mut self, context: RequestContext) -> Self {
        self.context = context;
        self
    }

    /// Replaces the reason.
    #[inline]
    pub const fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = reason;
        self
    }

    /// Replaces the instance.
    #[inline]
    pub const fn in_instance(mut self, instance: InstanceId) -> Self {
        self.instance = instance;
        self
    }

    /// Replaces the workflow.
    #[inline]
    pub const fn in_workflow(mut self, workflow: WorkflowId) -> Self {
        self.workflow = workflow;
        self
    }
}

/// Sets the calling thread's request context until dropped, then restores the
/// previous one. Scopes nest.
///
/// ```
/// use kv_stage::{Context, ContextScope, RequestContext, RequestType};
/// let backup = RequestContext::register("backup").unwrap();
/// {
///     let _scope = ContextScope::enter(backup);
///     assert_eq!(Context::new(RequestType::Write, 4096).context, backup);
/// }
/// assert_eq!(Context::new(RequestType::Write, 4096).context, RequestContext::FOREGROUND);
/// ```
#[must_use = "the context is restored when the scope is dropped"]
pub struct ContextScope {
    previous: RequestContext,
    // A scope belongs to the thread that entered it.
    _not_send: PhantomData<*const ()>,
}

impl ContextScope {
    /// Makes `context` the calling thread's request context.
    pub fn enter(context: RequestContext) -> Self {
        let previous = SCOPED_CONTEXT.replace(context);
        ContextScope { previous, _not_send: PhantomData }
    }
}

impl Drop for ContextScope {
    fn drop(&mut self) {
        SCOPED_CONTEXT.set(self.previous);
    }
}

/// Runs `f` with the calling thread's request context set to `context`.
pub fn with_context<R>(context: RequestContext, f: impl FnOnce() -> R) -> R {
    let _scope = ContextScope::enter(context);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_small_and_copy() {
        assert!(std::mem::size_of::<Context>() <= 24);
        let a = Context::new(RequestType::Read, 10);
        let b = a;
        assert_eq!(a, b);
    }

    #[test]
    fn workflow_is_os_thread_id_and_differs_per_thread() {
        let here = WorkflowId::current();
        assert_eq!(here, WorkflowId::current());
        let there = std::thread::spawn(WorkflowId::current).join().unwrap();
        assert_ne!(here, there);
        assert!(here.0 > 0);
    }

    #[test]
    fn builtin_names_round_trip() {
        for c in RequestContext::BUILTINS {
            assert_eq!(c.name().parse::<RequestContext>().unwrap(), c);
        }
        assert_eq!("BG_FLUSH".parse::<RequestContext>().unwrap(), RequestContext::BG_FLUSH);
        assert_eq!("bg_compaction_l0_l1".parse::<RequestContext>().unwrap(), RequestContext::BG_COMPACTION_L0_L1);
    }

    #[test]
    fn compactions_are_named_by_their_levels() {
        use RequestContext as C;
        assert_eq!(C::compaction(0, 0), C::BG_COMPACTION_L0_L0);
        assert_eq!(C::compaction(0, 1), C::BG_COMPACTION_L0_L1);
        // L0 into a dynamic base level is still the L0 compaction.
        assert_eq!(C::compaction(0, 5), C::BG_COMPACTION_L0_L1);
        assert_eq!(C::compaction(1, 2), C::BG_COMPACTION_L1_L2);
        assert_eq!(C::compaction(2, 3), C::BG_COMPACTION_L2_L3);
        assert_eq!(C::compaction(5, 6), C::BG_COMPACTION_L5_L6);
        assert_eq!(C::compaction(9, 10).name(), "bg_compaction_L9_L10");
        assert_eq!(C::compaction(10, 11), C::BG_COMPACTION_LN);
        assert_eq!(C::compaction(3, 3), C::BG_COMPACTION_LN);
        assert_eq!(C::compaction(-1, 2), C::BG_COMPACTION);
        for c in C::COMPACTION_PAIRS {
            let (a, b) = c.level_pair().unwrap();
            assert_eq!(c.name(), format!("bg_compaction_L{a}_L{b}"));
            assert_eq!(C::compaction(i32::from(a), i32::from(b)), c);
            assert!(c.is_background() && c.is_builtin());
            assert_eq!(c.name().parse::<C>().unwrap(), c);
        }
        assert_eq!(C::BG_COMPACTION_LN.level_pair(), None);
        assert!(C::BG_COMPACTION_LN.covers(C::BG_COMPACTION_L4_L5));
        assert!(C::BG_COMPACTION_L0_L1.covers(C::BG_COMPACTION_L0_L0));
        assert!(!C::BG_COMPACTION_L0_L1.covers(C::BG_COMPACTION_L1_L2));
        assert!(!C::BG_COMPACTION_L2_L3.covers(C::BG_COMPACTION_LN));
        assert!(!C::BG_COMPACTION.covers(C::BG_COMPACTION_L1_L2));
        assert_eq!(C::BG_COMPACTION_LN.members().len(), 9);
        assert!(!C::FOREGROUND.is_background());
    }

    #[test]
    fn reasons_parse_in_both_spellings() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>().unwrap(), r);
            assert_eq!(r.rocksdb_name().parse::<Reason>().unwrap(), r);
            assert_eq!(Reason::ALL[r.index()], r);
        }
        assert_eq!("kManualCompaction".parse::<Reason>().unwrap(), Reason::Manual);
        assert_eq!("TTL".parse::<Reason>().unwrap(), Reason::Ttl);
        assert_eq!("kPeriodicCompaction".parse::<Reason>().unwrap(), Reason::Periodic);
        assert!("soon".parse::<Reason>().unwrap_err().to_string().contains("unknown compaction reason 'soon'"));
        assert_eq!(Reason::from_rocksdb(9), Reason::Manual);
        assert_eq!(Reason::from_rocksdb(12), Reason::Ttl);
        assert_eq!(Reason::from_rocksdb(0), Reason::Unknown);
        assert_eq!(Reason::from_rocksdb(200), Reason::Unknown);
        assert_eq!(Reason::default(), Reason::None);
    }

    #[test]
    fn register_is_idempotent_and_validated() {
        let a = RequestContext::register("tenant-a").unwrap();
        let b = RequestContext::register("tenant-a").unwrap();
        assert_eq!(a, b);
        assert!(a.id() >= RequestContext::FIRST_USER_ID);
        assert_eq!(a.name(), "tenant-a");
        assert_eq!(RequestContext::register("bg_flush").unwrap(), RequestContext::BG_FLUSH);
        assert!(RequestContext::register("has space").is_err());
        assert!(RequestContext::register("").is_err());
        assert!("never-registered-xyz".parse::<RequestContext>().is_err());
    }

    #[test]
    fn scopes_nest_and_restore() {
        let x = RequestContext::register("scope-x").unwrap();
        assert_eq!(RequestContext::current(), RequestContext::FOREGROUND);
        with_context(RequestContext::BG_FLUSH, || {
            assert_eq!(RequestContext::current(), RequestContext::BG_FLUSH);
            with_context(x, || assert_eq!(RequestContext::current(), x));
            assert_eq!(RequestContext::current(), RequestContext::BG_FLUSH);
        });
        assert_eq!(RequestContext::current(), RequestContext::FOREGROUND);
    }

    #[test]
    fn request_type_names() {
        for t in RequestType::ALL {
            assert_eq!(t.as_str().parse::<RequestType>().unwrap(), t);
            assert_eq!(RequestType::ALL[t.index()], t);
        }
        assert_eq!("multiget".parse::<RequestType>().unwrap(), RequestType::MultiGet);
        assert!("frobnicate".parse::<RequestType>().is_err());
    }
}
