//! The C ABI of `cpp/shim.h`, and the trampolines RocksDB calls back into.
//!
//! Every function here that crosses the boundary is `extern "C"`, catches
//! panics (a panic must never unwind into C++), and turns failures into a
//! status code plus a message.

use std::ffi::{c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::io::DbIo;

/// `rocks_env_request` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawRequest {
    pub(crate) size: u64,
    pub(crate) kind: u8,
    pub(crate) file_kind: u8,
    pub(crate) io_activity: u8,
    pub(crate) job_ctx: u8,
}

/// `rocks_env_event` (shim.h).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawEvent {
    pub(crate) kind: u8,
    pub(crate) base_input_level: i32,
    pub(crate) bytes_written: u64,
    pub(crate) bytes_read: u64,
}

type EnforceFn = extern "C" fn(*const c_void, *const RawRequest, *mut c_char, usize) -> i32;
type EventFn = extern "C" fn(*const c_void, *const RawEvent);
type ReleaseFn = extern "C" fn(*const c_void);

/// `rocks_env_callbacks` (shim.h).
#[repr(C)]
pub(crate) struct Callbacks {
    enforce: EnforceFn,
    event: EventFn,
    release: ReleaseFn,
}

pub(crate) static CALLBACKS: Callbacks =
    Callbacks { enforce: enforce_trampoline, event: event_trampoline, release: release_trampoline };

#[expect(unsafe_code, reason = "declarations of the C++ shim's C ABI")]
unsafe extern "C" {
    pub(crate) fn rocks_env_create(
        handle: *const c_void,
        callbacks: *const Callbacks,
    ) -> *mut librocksdb_sys::rocksdb_env_t;
    pub(crate) fn rocks_env_add_listener(
        options: *mut librocksdb_sys::rocksdb_options_t,
        handle: *const c_void,
        callbacks: *const Callbacks,
    );
    pub(crate) fn rocks_env_probe_write_buffer_size(options: *const librocksdb_sys::rocksdb_options_t) -> u64;
    pub(crate) fn rocks_env_probe_listener_count(options: *const librocksdb_sys::rocksdb_options_t) -> usize;
    pub(crate) fn rocks_env_probe_env_is_default(env: *const librocksdb_sys::rocksdb_env_t) -> i32;
    pub(crate) fn rocks_env_probe_env_is_ours(env: *const librocksdb_sys::rocksdb_env_t) -> i32;
}

/// Writes `msg` into the C buffer, truncated and NUL-terminated.
#[expect(unsafe_code, reason = "filling a caller-provided C buffer")]
fn write_message(buf: *mut c_char, len: usize, msg: &str) {
    if buf.is_null() || len == 0 {
        return;
    }
    let n = msg.len().min(len - 1);
    // SAFETY: the shim passes a writable buffer of `len` bytes (a stack
    // array in Handle::Enforce); we write at most `len - 1` bytes plus the
    // terminator, and `msg` does not overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
}

/// Recovers the handle the shim holds a reference to.
///
/// The shim keeps the `Arc<DbIo>` alive (one strong count per C++ owner,
/// given up in `release_trampoline`) for as long as it can call us.
#[expect(unsafe_code, reason = "dereferencing the handle the shim was given")]
fn handle<'a>(h: *const c_void) -> &'a DbIo {
    // SAFETY: `h` came from `Arc::into_raw` on an `Arc<DbIo>` (see
    // `io::DbIo::raw_reference`), and the C++ owner holding it releases it
    // only after its last callback, so the pointee is alive here.
    unsafe { &*h.cast::<DbIo>() }
}

/// Copies a struct the shim passed by pointer.
#[expect(unsafe_code, reason = "reading a struct the shim passed by pointer")]
fn read<T: Copy>(p: *const T) -> T {
    // SAFETY: the shim passes a pointer to a live, initialized struct on its
    // stack for the duration of the callback, and the layouts match (repr(C),
    // same field order and types as shim.h).
    unsafe { *p }
}

extern "C" fn enforce_trampoline(h: *const c_void, req: *const RawRequest, msg: *mut c_char, len: usize) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| handle(h).enforce(&read(req))));
    match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            write_message(msg, len, &e);
            1
        }
        Err(_) => {
            write_message(msg, len, "rocks-env: panic while enforcing a request");
            2
        }
    }
}

extern "C" fn event_trampoline(h: *const c_void, ev: *const RawEvent) {
    let _ = catch_unwind(AssertUnwindSafe(|| handle(h).on_event(&read(ev))));
}

#[expect(unsafe_code, reason = "giving back one reference held by the shim")]
extern "C" fn release_trampoline(h: *const c_void) {
    let _ = catch_unwind(|| {
        // SAFETY: each C++ owner received one strong reference from
        // `Arc::into_raw` and calls this exactly once, from its destructor.
        drop(unsafe { Arc::from_raw(h.cast::<DbIo>()) });
    });
}
