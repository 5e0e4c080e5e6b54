//! The C ABI of `cpp/shim.h`, and the trampolines RocksDB calls back into.
//!
//! Every function here that crosses the boundary is `extern "C"`, catches
//! panics (a panic must never unwind into C++), and turns failures into a
//! status code plus a message. What a callback means is decided behind the
//! [`Sink`] trait; raw structs are decoded by [`crate::wire`].

use std::ffi::{CStr, c_char, c_void};
use std::fmt::Write as _;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use kv_stage::{EnforceError, errors::EnforceErrorKind};

use crate::wire::{
    ENFORCE_OK, ENFORCE_PANIC, ENFORCE_REFUSED, ENFORCE_SHUT_DOWN, Event, FileOp, RawEvent, RawFaultReport,
    RawFaultRule, RawRequest, Request,
};

/// What a hook layer hands requests to and the Env and listener report
/// events to: the stage's per-DB handle, or a layer below it (the emulated
/// device).
pub(crate) trait Sink: Send + Sync + 'static {
    /// Decides one request before it happens; an error fails it in RocksDB
    /// with the error's message.
    fn enforce(&self, req: &Request) -> Result<(), EnforceError>;

    /// For a read or write `enforce` admitted: the size of the pieces the
    /// layer is to issue it in below, one after the other (0 or at least
    /// `req.size`: whole). Asked on the request's own thread.
    fn piece(&self, _req: &Request) -> u64 {
        0
    }

    /// A flush, compaction, task or background error (layers below the
    /// stage receive none).
    fn on_event(&self, _ev: Event) {}

    /// Whether to hold back the deletion of a table, blob or WAL file
    /// (`kind`, a `rocks_env_file_kind`) that has waited `waited_ms` since
    /// the DB deleted it (0: asked as it does). Asked on the deleting
    /// thread, then every 50 ms on the layer's own thread. Default: never.
    fn defer_delete(&self, _kind: u8, _waited_ms: u64) -> bool {
        false
    }

    /// Bytes the layer's own thread frees at a time when it deletes a
    /// table, blob or WAL file (0: the whole file at once, and only held-back
    /// files go to that thread). Asked on the deleting thread. Default: 0.
    fn delete_piece(&self) -> u64 {
        0
    }
}

type EnforceFn = extern "C" fn(*const c_void, *mut RawRequest, *mut c_char, usize) -> i32;
type EventFn = extern "C" fn(*const c_void, *const RawEvent);
type ReleaseFn = extern "C" fn(*const c_void);
type DeferDeleteFn = extern "C" fn(*const c_void, u8, u64) -> i32;
type DeletePieceFn = extern "C" fn(*const c_void) -> u64;

/// `rocks_env_callbacks` (shim.h). The shim copies it, so it only needs to
/// live for the call it is passed to.
#[repr(C)]
pub(crate) struct Callbacks {
    enforce: EnforceFn,
    event: EventFn,
    release: ReleaseFn,
    defer_delete: DeferDeleteFn,
    delete_piece: DeletePieceFn,
}

/// The callbacks for a handle of type `S`.
pub(crate) struct Vtable<S>(PhantomData<S>);

impl<S: Sink> Vtable<S> {
    pub(crate) const CALLBACKS: Callbacks = Callbacks {
        enforce: enforce_trampoline::<S>,
        event: event_trampoline::<S>,
        release: release_trampoline::<S>,
        defer_delete: defer_delete_trampoline::<S>,
        delete_piece: delete_piece_trampoline::<S>,
    };
}

/// Opaque `rocks_env_fs_t`.
#[repr(C)]
pub(crate) struct RawFs {
    _private: [u8; 0],
}

/// Opaque `rocks_env_fault_t`.
#[repr(C)]
pub(crate) struct RawFault {
    _private: [u8; 0],
}

#[expect(unsafe_code, reason = "declarations of the C++ shim's C ABI")]
unsafe extern "C" {
    pub(crate) fn rocks_env_fs_of_options(
        options: *const librocksdb_sys::rocksdb_options_t,
        is_staged: *mut i32,
    ) -> *mut RawFs;
    pub(crate) fn rocks_env_fs_hook(
        below: *const RawFs,
        handle: *const c_void,
        callbacks: *const Callbacks,
    ) -> *mut RawFs;
    pub(crate) fn rocks_env_fs_fault(below: *const RawFs, fault: *const RawFault) -> *mut RawFs;
    pub(crate) fn rocks_env_fs_destroy(fs: *mut RawFs);
    pub(crate) fn rocks_env_create(
        options: *const librocksdb_sys::rocksdb_options_t,
        fs: *const RawFs,
        handle: *const c_void,
        callbacks: *const Callbacks,
    ) -> *mut librocksdb_sys::rocksdb_env_t;
    pub(crate) fn rocks_env_add_listener(
        options: *mut librocksdb_sys::rocksdb_options_t,
        handle: *const c_void,
        callbacks: *const Callbacks,
    );
    pub(crate) fn rocks_env_fault_new() -> *mut RawFault;
    pub(crate) fn rocks_env_fault_free(fault: *mut RawFault);
    pub(crate) fn rocks_env_fault_set_rule(fault: *mut RawFault, rule: *const RawFaultRule);
    pub(crate) fn rocks_env_fault_injected(fault: *const RawFault) -> u64;
    pub(crate) fn rocks_env_fault_power_cut(fault: *mut RawFault);
    pub(crate) fn rocks_env_fault_recover(
        fault: *mut RawFault,
        report: *mut RawFaultReport,
        msg: *mut c_char,
        msg_len: usize,
    ) -> i32;
    pub(crate) fn rocks_env_probe_write_buffer_size(options: *const librocksdb_sys::rocksdb_options_t) -> u64;
    pub(crate) fn rocks_env_probe_listener_count(options: *const librocksdb_sys::rocksdb_options_t) -> usize;
    pub(crate) fn rocks_env_probe_env_is_default(env: *const librocksdb_sys::rocksdb_env_t) -> i32;
    pub(crate) fn rocks_env_probe_env_is_ours(env: *const librocksdb_sys::rocksdb_env_t) -> i32;
}

/// Writes into a caller-provided C buffer, truncating, without allocating.
struct CBuf<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl std::fmt::Write for CBuf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        // Keep one byte for the terminator.
        let room = self.buf.len().saturating_sub(1 + self.len);
        let n = s.len().min(room);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes `msg` into the C buffer, truncated and NUL-terminated.
#[expect(unsafe_code, reason = "filling a caller-provided C buffer")]
fn write_message(buf: *mut c_char, len: usize, msg: &dyn std::fmt::Display) {
    if buf.is_null() || len == 0 {
        return;
    }
    // SAFETY: the shim passes a writable buffer of `len` bytes (a stack
    // array in Handle::Enforce) that nothing else uses during the call.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
    let mut w = CBuf { buf: bytes, len: 0 };
    let _ = write!(w, "{msg}");
    let end = w.len;
    w.buf[end] = 0;
}

/// Recovers the handle the shim holds a reference to.
///
/// The shim keeps the `Arc<S>` alive (one strong count per C++ owner, given
/// up in `release_trampoline`) for as long as it can call us.
#[expect(unsafe_code, reason = "dereferencing the handle the shim was given")]
fn handle<'a, S>(h: *const c_void) -> &'a S {
    // SAFETY: `h` came from `Arc::into_raw` on an `Arc<S>` (see
    // `raw_reference`), and the C++ owner holding it releases it only after
    // its last callback, so the pointee is alive here.
    unsafe { &*h.cast::<S>() }
}

/// One strong reference to `sink` for a C++ owner, given back through the
/// release callback.
pub(crate) fn raw_reference<S: Sink>(sink: &Arc<S>) -> *const c_void {
    Arc::into_raw(Arc::clone(sink)).cast()
}

/// Copies a struct the shim passed by pointer.
#[expect(unsafe_code, reason = "reading a struct the shim passed by pointer")]
fn read<T: Copy>(p: *const T) -> T {
    // SAFETY: the shim passes a pointer to a live, initialized struct on its
    // stack for the duration of the callback, and the layouts match (repr(C),
    // same field order and types as shim.h).
    unsafe { *p }
}

/// Copies a C string the shim passed (NULL: none).
#[expect(unsafe_code, reason = "reading a C string the shim passed")]
fn read_message(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-null message is a NUL-terminated string the shim keeps
    // alive for the duration of the callback.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Writes the piece size back into the request the shim passed.
#[expect(unsafe_code, reason = "writing the out field of a struct the shim passed by pointer")]
fn write_piece(req: *mut RawRequest, piece: u64) {
    // SAFETY: the shim passes a pointer to a live, initialized, writable
    // struct on its stack (Handle::Enforce) that nothing else touches during
    // the callback; the layouts match (see `read`).
    unsafe { (*req).piece = piece };
}

extern "C" fn enforce_trampoline<S: Sink>(h: *const c_void, req: *mut RawRequest, msg: *mut c_char, len: usize) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        let sink = handle::<S>(h);
        let request = Request::decode(&read(req.cast_const()));
        sink.enforce(&request)?;
        if matches!(request.op, FileOp::Read | FileOp::Write) {
            // The shim decides whether a piece this size splits anything.
            let piece = sink.piece(&request);
            if piece != 0 {
                write_piece(req, piece);
            }
        }
        Ok::<(), EnforceError>(())
    }));
    match result {
        Ok(Ok(())) => ENFORCE_OK,
        Ok(Err(e)) => {
            write_message(msg, len, &e);
            if e.kind() == EnforceErrorKind::ShutDown { ENFORCE_SHUT_DOWN } else { ENFORCE_REFUSED }
        }
        Err(_) => {
            write_message(msg, len, &"rocks-env: panic while enforcing a request");
            ENFORCE_PANIC
        }
    }
}

/// A panic deletes now (0): the file is obsolete either way.
extern "C" fn defer_delete_trampoline<S: Sink>(h: *const c_void, kind: u8, waited_ms: u64) -> i32 {
    catch_unwind(AssertUnwindSafe(|| i32::from(handle::<S>(h).defer_delete(kind, waited_ms)))).unwrap_or(0)
}

/// A panic deletes the whole file at once (0).
extern "C" fn delete_piece_trampoline<S: Sink>(h: *const c_void) -> u64 {
    catch_unwind(AssertUnwindSafe(|| handle::<S>(h).delete_piece())).unwrap_or(0)
}

extern "C" fn event_trampoline<S: Sink>(h: *const c_void, ev: *const RawEvent) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let raw = read(ev);
        handle::<S>(h).on_event(Event::decode(&raw, read_message(raw.message)));
    }));
}

#[expect(unsafe_code, reason = "giving back one reference held by the shim")]
extern "C" fn release_trampoline<S: Sink>(h: *const c_void) {
    let _ = catch_unwind(|| {
        // SAFETY: each C++ owner received one strong reference from
        // `raw_reference` and calls this exactly once, from its destructor.
        drop(unsafe { Arc::from_raw(h.cast::<S>()) });
    });
}
