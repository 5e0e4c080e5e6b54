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

/// Why a request happens: foreground client work, a flush, a compaction, or
/// an application-defined context such as `backup` or a tenant name.
///
/// Built-in contexts have fixed ids below [`RequestContext::FIRST_USER_ID`];
/// application contexts are registered once by name with
/// [`RequestContext::register`] and then travel as a small integer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestContext(u16);

const BUILTIN_NAMES: [&str; 6] =
    ["foreground", "bg_flush", "bg_compaction_L0_L1", "bg_compaction_LN", "bg_compaction", "background"];

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
    /// allocated once.
    interned: Vec<&'static str>,
}

impl Registry {
    fn intern(&mut self, name: &str) -> &'static str {
        if let Some(n) = self.interned.iter().find(|n| **n == name) {
            return n;
        }
        let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
        self.interned.push(n);
        n
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
        for name in names {
            if RequestContext::builtin(name).is_some() {
                continue;
            }
            validate_name(name).map_err(|m| Error::invalid(format!("request context name '{name}': {m}")))?;
            let i = match reg.find(name) {
                Some(i) => i,
                None => match reg.new_slot(name) {
                    Ok(i) => {
                        let n = reg.intern(name);
                        reg.slots[i] = Slot::Reserved(n, 0);
                        i
                    }
                    Err(e) => {
                        out.release(&mut reg);
                        return Err(e);
                    }
                },
            };
            if let Slot::Reserved(n, count) = reg.slots[i]
                && !out.ids.contains(&(i as u16))
            {
                reg.slots[i] = Slot::Reserved(n, count + 1);
                out.ids.push(i as u16);
            }
        }
        Ok(out)
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
    /// A compaction whose input starts at L0 (L0->L1 and intra-L0): the
    /// compactions that unblock flushes.
    pub const BG_COMPACTION_L0_L1: Self = Self(2);
    /// A compaction whose input starts at L1 or deeper.
    pub const BG_COMPACTION_LN: Self = Self(3);
    /// A compaction whose levels are not known.
    pub const BG_COMPACTION: Self = Self(4);
    /// Other background work.
    pub const BACKGROUND: Self = Self(5);

    /// Built-in contexts, in id order.
    pub const BUILTINS: [RequestContext; 6] = [
        Self::FOREGROUND,
        Self::BG_FLUSH,
        Self::BG_COMPACTION_L0_L1,
        Self::BG_COMPACTION_LN,
        Self::BG_COMPACTION,
        Self::BACKGROUND,
    ];

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
        let n = reg.intern(name);
        reg.slots[i] = Slot::Registered(n);
        Ok(Self(Self::FIRST_USER_ID + i as u16))
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
        matches!(self.0, 1..=5)
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
        Context { workflow, size, instance, context, request_type }
    }

    /// Replaces the request context.
    #[inline]
    pub const fn in_context(mut self, context: RequestContext) -> Self {
        self.context = context;
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
