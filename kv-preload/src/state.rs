//! The library's state: the rules, the in-process stage they build, the
//! file volumes descriptors are classified into, and what keeps them right
//! across reloads and forks.
//!
//! Its few messages go to stderr with [`say!`], not `tracing`: the
//! library runs inside an unmodified program (cp, fio, a database) that
//! installs no `tracing` subscriber, so a `tracing` event would be lost,
//! and installing a global subscriber into someone else's process could
//! clash with its own.
//!
//! The state is built once at load (or again in a forked child) and never
//! freed: a hook may hold a reference to it at any time, and a state left
//! behind by a fork may have a lock held by a thread that no longer exists.

use std::ffi::{OsStr, c_int};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// One line on stderr, prefixed `kv-preload: `, written with one `write(2)`.
///
/// `eprintln!` writes each formatted piece on its own, so the lines of
/// several processes sharing one stderr (fio's job processes do) came out
/// interleaved mid-line; a whole line under `PIPE_BUF` (4 KiB) written at
/// once stays whole on a pipe. Never on the I/O path: it allocates.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!("kv-preload: {}\n", format_args!($($arg)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

use kv_stage::iomax::DeviceNumber;
use kv_stage::volumes::VOLUME_OBJECT;
use kv_stage::{
    Context, RequestType, Rule, RuleSet, Stage,
    volumes::{Volume, VolumeSelector},
};

use crate::fdtable;

/// Exit status when the rules cannot be used and pass-through was not asked
/// for: `EX_CONFIG` of `sysexits.h`.
pub(crate) const EXIT_CONFIG: c_int = 78;

pub(crate) struct State {
    /// The stage every classified request goes through (reachable for a
    /// control plane: [`stage`]).
    stage: Arc<Stage>,
    /// Path and device volumes, 1-based slot = index + 1, with paths made
    /// canonical (the kernel's `/proc/self/fd` links are canonical).
    volumes: Vec<Volume>,
    /// Per volume: whether its requests go through the stage. A volume
    /// whose limits are all `max`, in a file of volumes only, is not
    /// enforced (nor counted): its descriptors cost what a descriptor of no
    /// volume costs. Recomputed whenever limits change.
    enforced: Vec<AtomicBool>,
    has_paths: bool,
    has_devices: bool,
    /// The rules as last applied, to rebuild the stage in a forked child.
    rules: Mutex<RuleSet>,
    /// The rules file.
    source: PathBuf,
    /// The rules file's fingerprint when the rules applied now were read:
    /// the reload watcher's starting point, so a change made before the
    /// watcher starts (it starts with the first classified request) is
    /// still seen.
    seen: Mutex<Option<(SystemTime, u64)>>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());
/// Set at load and in a forked child: the reload watcher is started by the
/// first classified request of the process.
static NEED_WATCHER: AtomicBool = AtomicBool::new(true);
/// Held while a reload applies and across `fork` (prepare to parent/child),
/// so a child never inherits a half-applied reload.
static RELOAD: AtomicBool = AtomicBool::new(false);
/// The process whose descriptor table [`fdtable`] describes: set at load
/// and in a forked child. A `vfork` child shares the parent's memory (and
/// so the table) but has a descriptor table of its own, and runs no fork
/// handler: its `close` or `dup2` must not change the parent's classes.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Whether this process owns [`fdtable`] (false in a `vfork` child before
/// it execs or exits). One `getpid` syscall: hooks that change the table
/// call it, data hooks do not.
pub(crate) fn owns_table() -> bool {
    // SAFETY: getpid cannot fail and has no preconditions.
    let pid = unsafe { libc::getpid() };
    let owner = OWNER_PID.load(Ordering::Relaxed);
    owner == 0 || owner == pid
}

fn state() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    // SAFETY: a non-null STATE points to a leaked Box<State> that is never
    // freed, so a 'static shared reference is valid.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The stage the library enforces through, once the rules loaded.
#[allow(dead_code)] // Kept reachable for a control plane (issue: remote controller).
pub(crate) fn stage() -> Option<Arc<Stage>> {
    state().map(|s| Arc::clone(&s.stage))
}

fn lock_reload() {
    while RELOAD.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::thread::yield_now();
    }
}

fn unlock_reload() {
    RELOAD.store(false, Ordering::Release);
}

impl State {
    fn build(rules: RuleSet, source: PathBuf, seen: Option<(SystemTime, u64)>) -> Result<State, String> {
        let stage = Arc::new(Stage::new("kv-preload"));
        stage.apply(&rules).map_err(|e| e.to_string())?;
        let volumes: Vec<Volume> = rules
            .volumes
            .iter()
            .filter(|v| is_file_volume(v))
            .map(|v| {
                let mut v = v.clone();
                if let VolumeSelector::Path(p) = &v.selector {
                    v.selector = VolumeSelector::Path(canonical_or_planned(p));
                }
                v
            })
            .collect();
        if volumes.len() >= u16::MAX as usize {
            return Err(format!("{}: too many path and device volumes ({})", source.display(), volumes.len()));
        }
        let enforced = volumes.iter().map(|v| AtomicBool::new(needs_stage(v, &rules))).collect();
        Ok(State {
            enforced,
            stage,
            has_paths: volumes.iter().any(|v| matches!(v.selector, VolumeSelector::Path(_))),
            has_devices: volumes.iter().any(|v| matches!(v.selector, VolumeSelector::Device(_))),
            volumes,
            rules: Mutex::new(rules),
            source,
            seen: Mutex::new(seen),
        })
    }
}

/// The canonical form of a volume's path. One that does not exist yet
/// (a directory the program makes later) is its deepest existing ancestor,
/// made canonical, with the rest appended (lexically: none of the rest
/// exists to resolve a symlink through): what the kernel will show for
/// files made there, unless a symlink is made on the way.
fn canonical_or_planned(p: &Path) -> PathBuf {
    for base in p.ancestors() {
        let existing = if base.as_os_str().is_empty() { Path::new(".") } else { base };
        let Ok(mut out) = std::fs::canonicalize(existing) else { continue };
        let rest = p.strip_prefix(base).unwrap_or(Path::new(""));
        if rest.as_os_str().is_empty() {
            return out;
        }
        for c in rest.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::Normal(n) => out.push(n),
                _ => {}
            }
        }
        say!("volume path {} does not exist yet; files made there later are limited as {}", p.display(), out.display());
        return out;
    }
    p.to_path_buf()
}

/// Whether a volume's requests need the stage: it has a limit, or the file
/// has rules besides its volumes (any of which may match its requests).
fn needs_stage(v: &Volume, rules: &RuleSet) -> bool {
    !v.limits.is_unlimited() || rules.rules.len() > 2 * rules.volumes.len()
}

fn is_file_volume(v: &Volume) -> bool {
    matches!(v.selector, VolumeSelector::Path(_) | VolumeSelector::Device(_))
}

/// Loads `KVSDS_RULES` at library load. A file that cannot be used stops
/// the program with one line on stderr, unless `KVSDS_ON_ERROR=passthrough`.
pub(crate) fn init() {
    let Some(path) = std::env::var_os("KVSDS_RULES") else {
        say!("KVSDS_RULES is not set; no volume is limited");
        return;
    };
    let path = PathBuf::from(path);
    // Taken before the file is read: a change in between is reloaded.
    let seen = fingerprint(&path);
    let built =
        RuleSet::load(&path).map_err(|e| e.to_string()).and_then(|rules| State::build(rules, path.clone(), seen));
    match built {
        Ok(state) => {
            // SAFETY: getpid cannot fail and has no preconditions.
            OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
            STATE.store(Box::into_raw(Box::new(state)), Ordering::Release);
            // SAFETY: registers plain `extern "C" fn()` handlers that live as
            // long as the library (it is never unloaded: it is preloaded).
            unsafe { libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child)) };
            classify_open_descriptors();
        }
        Err(msg) => refuse(&msg),
    }
}

fn refuse(msg: &str) {
    if std::env::var_os("KVSDS_ON_ERROR").as_deref() == Some(OsStr::new("passthrough")) {
        say!("{msg}; KVSDS_ON_ERROR=passthrough: running WITHOUT limits");
        return;
    }
    say!("{msg} (not started: fix the rules, or set KVSDS_ON_ERROR=passthrough to run without limits)");
    // SAFETY: ends the process at once, before main; nothing to unwind.
    unsafe { libc::_exit(EXIT_CONFIG) };
}

/// Descriptors open before the library loaded (inherited through exec).
fn classify_open_descriptors() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<c_int> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    for fd in fds {
        classify(fd);
    }
}

/// Records which volume a descriptor just opened belongs to: the path
/// volume with the longest prefix of its canonical path, else the volume of
/// its device. No allocation: the path is read into a stack buffer.
pub(crate) fn classify(fd: c_int) {
    let Some(st) = state() else {
        fdtable::set(fd, 0);
        return;
    };
    if st.volumes.is_empty() {
        return;
    }
    let sb = fstat(fd);
    let identity = sb.as_ref().map_or(0, |sb| fdtable::identity(sb.st_dev, sb.st_ino));
    let mut found = 0u16;
    if st.has_paths {
        let mut link = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0";
        let mut digits = [0u8; 10];
        let mut n = fd.unsigned_abs();
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for (i, d) in digits[..len].iter().rev().enumerate() {
            link[14 + i] = *d;
        }
        let mut buf = [0u8; 4096];
        // SAFETY: `link` is NUL-terminated (its tail is zeros); `buf` is
        // writable for its length.
        let got = unsafe { libc::readlink(link.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
        if got > 0 {
            let path = &buf[..got as usize];
            let mut best = 0;
            for (i, v) in st.volumes.iter().enumerate() {
                if let VolumeSelector::Path(p) = &v.selector
                    && v.holds_path(path)
                    && p.as_os_str().len() >= best
                {
                    best = p.as_os_str().len();
                    found = i as u16 + 1;
                }
            }
        }
    }
    if found == 0
        && st.has_devices
        && let Some(sb) = sb
    {
        let dev = if sb.st_mode & libc::S_IFMT == libc::S_IFBLK { sb.st_rdev } else { sb.st_dev };
        let dev = DeviceNumber::of_dev(dev);
        if let Some(i) = st.volumes.iter().position(|v| v.holds_device(dev)) {
            found = i as u16 + 1;
        }
    }
    fdtable::set_with_identity(fd, found, identity);
}

/// The volume `fd` belongs to now, checked against the identity of the
/// file it was classified with (see [`fdtable`]): a number reused behind
/// the library's back is classified again. Only for descriptors of a
/// limited volume (one `fstat`).
fn checked_volume(fd: c_int, volume: u16) -> u16 {
    let now = fstat(fd).map_or(0, |sb| fdtable::identity(sb.st_dev, sb.st_ino));
    if now == fdtable::identity_of(fd) {
        return volume;
    }
    if owns_table() {
        classify(fd);
        fdtable::volume(fd).unwrap_or(0)
    } else {
        // A vfork child: decide without writing the parent's table.
        0
    }
}

/// `fstat` of `fd`, or `None` when it fails.
fn fstat(fd: c_int) -> Option<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value to be overwritten.
    let mut sb: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `sb` is a valid out-parameter.
    (unsafe { libc::fstat(fd, &mut sb) } == 0).then_some(sb)
}

impl State {
    /// Whether volume `v` (1-based; 0 is none) has a limit its requests
    /// must pass.
    fn enforced(&self, v: u16) -> bool {
        v > 0 && self.enforced.get(v as usize - 1).is_some_and(|e| e.load(Ordering::Relaxed))
    }
}

/// Whether requests of `fd` are limited (a classified descriptor of a
/// volume with a limit), after checking its identity.
pub(crate) fn limited(fd: c_int) -> bool {
    let Some(st) = state() else { return false };
    let Some(v) = fdtable::volume(fd) else { return false };
    st.enforced(v) && st.enforced(checked_volume(fd, v))
}

/// The request a volume's descriptor makes, as the stage sees it.
fn context_of(st: &State, volume: u16, t: RequestType, size: u64) -> Option<Context> {
    let v = st.volumes.get(volume as usize - 1)?;
    let mut ctx = Context::new(t, size).in_instance(v.instance?);
    if let Some(tag) = v.tag {
        ctx = ctx.in_context(tag);
    }
    Some(ctx)
}

/// Enforces one request of a classified descriptor: `Ok(Some(volume))`
/// when it was charged to `volume` (settle it with [`settle`] once done),
/// `Ok(None)` when it is not limited. `Err` means the stage refused it:
/// the hook fails the call with `EIO` and does not do it.
#[inline]
pub(crate) fn enforce(fd: c_int, volume: u16, t: RequestType, size: u64) -> Result<Option<u16>, ()> {
    let Some(st) = state() else { return Ok(None) };
    if NEED_WATCHER.load(Ordering::Relaxed) && NEED_WATCHER.swap(false, Ordering::Relaxed) {
        start_watcher();
    }
    if !st.enforced(volume) {
        return Ok(None);
    }
    let volume = checked_volume(fd, volume);
    if !st.enforced(volume) {
        return Ok(None);
    }
    let Some(ctx) = context_of(st, volume, t, size) else { return Ok(None) };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| st.stage.enforce(&ctx))) {
        Ok(Ok(_)) => Ok(Some(volume)),
        _ => Err(()),
    }
}

/// After a call [`enforce`] charged `size` to `volume`: gives back what it
/// did not move (`result` is the call's return value; below 0 it failed
/// and moved nothing), so a read that asked 2 MiB of a 1-byte file costs
/// 1 byte. `errno` is kept.
#[inline]
pub(crate) fn settle(volume: u16, t: RequestType, size: u64, result: i64) {
    let used = if result > 0 { (result as u64).min(size) } else { 0 };
    if used == size {
        return;
    }
    let Some(st) = state() else { return };
    let Some(ctx) = context_of(st, volume, t, size) else { return };
    // SAFETY: errno is the calling thread's own.
    let errno = unsafe { *libc::__errno_location() };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| st.stage.refund(&ctx, size - used)));
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

extern "C" fn before_fork() {
    lock_reload();
}

extern "C" fn after_fork_parent() {
    unlock_reload();
}

/// The child gets a stage of its own with the same rules (the parent's may
/// have a lock held by a thread the child does not have), and starts its own
/// reload watcher with its first classified request.
extern "C" fn after_fork_child() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(st) = state() {
            let rules = st.rules.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // SAFETY: getpid cannot fail and has no preconditions.
            OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
            let seen = *st.seen.lock().unwrap_or_else(|e| e.into_inner());
            match State::build(rules, st.source.clone(), seen) {
                Ok(new) => STATE.store(Box::into_raw(Box::new(new)), Ordering::Release),
                Err(e) => say!("forked child keeps its parent's stage: {e}"),
            }
            NEED_WATCHER.store(true, Ordering::Relaxed);
        }
    });
    unlock_reload();
}

/// How often the rules file is checked for changes: `KVSDS_RELOAD_MS`
/// (default 10, the refill period, so a change is seen within one; 0 turns live reload off).
fn reload_interval() -> Option<Duration> {
    let ms = std::env::var("KVSDS_RELOAD_MS").ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(10);
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn fingerprint(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn start_watcher() {
    let (Some(st), Some(every)) = (state(), reload_interval()) else { return };
    let path = st.source.clone();
    let mut last = *st.seen.lock().unwrap_or_else(|e| e.into_inner());
    let spawned = std::thread::Builder::new().name("kvsds-reload".into()).spawn(move || {
        loop {
            std::thread::sleep(every);
            let now = fingerprint(&path);
            if now.is_some() && now != last {
                last = now;
                lock_reload();
                // Under the reload lock, which fork waits for: a child never
                // finds this mutex held.
                if let Some(st) = state() {
                    *st.seen.lock().unwrap_or_else(|e| e.into_inner()) = now;
                }
                let r = std::panic::catch_unwind(|| reload(&path));
                unlock_reload();
                match r {
                    Ok(Ok(msg)) => {
                        let at = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
                        say!("{}: {msg} (applied at unix time {:.6} s)", path.display(), at.as_secs_f64());
                    }
                    Ok(Err(msg)) => {
                        say!("{}: not reloaded, limits unchanged: {msg}", path.display())
                    }
                    Err(_) => say!("{}: reload failed, limits unchanged", path.display()),
                }
            }
        }
    });
    if let Err(e) = spawned {
        say!("no live reload: cannot start its thread: {e}");
    }
}

/// Applies the limits of a changed rules file: all volumes at once or none.
/// Only limits change live; volumes added, removed or moved, or changed
/// rules, need a restart (descriptors are classified at open).
fn reload(path: &Path) -> Result<String, String> {
    let st = state().ok_or("no state")?;
    let new = RuleSet::load(path).map_err(|e| e.to_string())?;
    let mut current = st.rules.lock().unwrap_or_else(|e| e.into_inner());
    let same_volumes = new.volumes.len() == current.volumes.len()
        && new.volumes.iter().zip(&current.volumes).all(|(a, b)| a.name == b.name && a.selector == b.selector);
    if !same_volumes {
        return Err("volumes were added, removed or moved; restart the program to use them".into());
    }
    let skip = 2 * new.volumes.len();
    let rules_of = |s: &RuleSet| s.rules.iter().skip(skip).map(|e| e.rule.clone()).collect::<Vec<_>>();
    if rules_of(&new) != rules_of(&current) {
        return Err("rules other than volume limits changed; restart the program to use them".into());
    }
    let changes = new.volumes.iter().map(|v| Rule::configure(&v.name, VOLUME_OBJECT, v.spec().into()));
    st.stage.apply_rules(changes).map_err(|e| e.to_string())?;
    // Volumes keep their order (checked above): slot i is new.volumes' i-th
    // path or device volume.
    let file_volumes = new.volumes.iter().filter(|v| is_file_volume(v));
    for (flag, v) in st.enforced.iter().zip(file_volumes) {
        flag.store(needs_stage(v, &new), Ordering::Relaxed);
    }
    let shown: Vec<String> = new.volumes.iter().map(|v| format!("{} {}", v.name, v.limits)).collect();
    *current = new;
    Ok(format!("limits reloaded: {}", shown.join("; ")))
}
