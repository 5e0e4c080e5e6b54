//! The exported hooks: each libc function this library stands in front of.
//!
//! A hook for a data call looks up its descriptor's volume (one relaxed load
//! of [`fdtable`]); a descriptor of no volume goes straight to libc. A
//! classified one is enforced first, and a refusal fails the call with
//! `EIO` without doing it. Open calls classify the new descriptor; dup calls
//! copy the class; close calls clear it.
//!
//! `open`, `openat` and `fcntl` are variadic in C. They are defined here with
//! their optional argument as a plain one, which on x86_64 and aarch64 Linux
//! is passed in the same register whether or not the caller wrote it, and
//! passed on unchanged; the callee reads it only when the flags say so.

use std::ffi::{c_char, c_int, c_uint, c_void};

use kv_stage::RequestType;
use libc::{FILE, iovec, mode_t, off_t, off64_t, size_t, ssize_t};

use crate::{fdtable, real, state};

/// Fails the current call with `EIO`.
#[cold]
fn refused<T: From<i8>>() -> T {
    // SAFETY: errno is the calling thread's own.
    unsafe { *libc::__errno_location() = libc::EIO };
    T::from(-1)
}

/// Enforces `size` bytes of `t` on `fd` if it belongs to a volume.
#[inline(always)]
fn admit(fd: c_int, t: RequestType, size: u64) -> bool {
    match fdtable::volume(fd) {
        None => true,
        Some(v) => state::enforce(v, t, size).is_ok(),
    }
}

/// The bytes an iovec array asks for.
///
/// # Safety
/// `iov` points to `cnt` valid iovecs (or `cnt` <= 0).
unsafe fn iov_len(iov: *const iovec, cnt: c_int) -> u64 {
    if iov.is_null() || cnt <= 0 {
        return 0;
    }
    // SAFETY: the caller's promise, as libc's own readv requires.
    let v = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    v.iter().map(|i| i.iov_len as u64).sum()
}

/// Classifies the descriptor an open call returned.
#[inline]
fn opened(fd: c_int) -> c_int {
    if fd >= 0 {
        state::classify(fd);
    }
    fd
}

/// Copies the class of `from` to the descriptor a dup call returned.
#[inline]
fn duped(from: c_int, to: c_int) -> c_int {
    if to >= 0 {
        fdtable::copy(from, to);
    }
    to
}

/// Hook for `open`.
#[unsafe(no_mangle)]
unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `open`.
    let r = unsafe { real::open()(path, flags, mode) };
    opened(r)
}

/// Hook for `open64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `open64`.
    let r = unsafe { real::open64()(path, flags, mode) };
    opened(r)
}

/// Hook for `openat`.
#[unsafe(no_mangle)]
unsafe extern "C" fn openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `openat`.
    let r = unsafe { real::openat()(dirfd, path, flags, mode) };
    opened(r)
}

/// Hook for `openat64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `openat64`.
    let r = unsafe { real::openat64()(dirfd, path, flags, mode) };
    opened(r)
}

/// Hook for `__open_2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__open_2`.
    let r = unsafe { real::open_2()(path, flags) };
    opened(r)
}

/// Hook for `__open64_2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__open64_2`.
    let r = unsafe { real::open64_2()(path, flags) };
    opened(r)
}

/// Hook for `__openat_2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__openat_2`.
    let r = unsafe { real::openat_2()(dirfd, path, flags) };
    opened(r)
}

/// Hook for `__openat64_2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__openat64_2`.
    let r = unsafe { real::openat64_2()(dirfd, path, flags) };
    opened(r)
}

/// Hook for `creat`.
#[unsafe(no_mangle)]
unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `creat`.
    let r = unsafe { real::creat()(path, mode) };
    opened(r)
}

/// Hook for `creat64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `creat64`.
    let r = unsafe { real::creat64()(path, mode) };
    opened(r)
}

/// Hook for `read`.
#[unsafe(no_mangle)]
unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `read`.
    unsafe { real::read()(fd, buf, count) }
}

/// Hook for `__read_chk`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__read_chk`.
    unsafe { real::read_chk()(fd, buf, count, buflen) }
}

/// Hook for `write`.
#[unsafe(no_mangle)]
unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    if !admit(fd, RequestType::Write, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `write`.
    unsafe { real::write()(fd, buf, count) }
}

/// Hook for `pread`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pread`.
    unsafe { real::pread()(fd, buf, count, offset) }
}

/// Hook for `pread64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pread64`.
    unsafe { real::pread64()(fd, buf, count, offset) }
}

/// Hook for `__pread_chk`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __pread_chk(fd: c_int, buf: *mut c_void, count: size_t, offset: off_t, buflen: size_t) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__pread_chk`.
    unsafe { real::pread_chk()(fd, buf, count, offset, buflen) }
}

/// Hook for `__pread64_chk`.
#[unsafe(no_mangle)]
unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    offset: off_t,
    buflen: size_t,
) -> ssize_t {
    if !admit(fd, RequestType::Read, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `__pread64_chk`.
    unsafe { real::pread64_chk()(fd, buf, count, offset, buflen) }
}

/// Hook for `pwrite`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    if !admit(fd, RequestType::Write, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwrite`.
    unsafe { real::pwrite()(fd, buf, count, offset) }
}

/// Hook for `pwrite64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t {
    if !admit(fd, RequestType::Write, count as u64) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwrite64`.
    unsafe { real::pwrite64()(fd, buf, count, offset) }
}

/// Hook for `readv`.
#[unsafe(no_mangle)]
unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `readv` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Read, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `readv`.
    unsafe { real::readv()(fd, iov, cnt) }
}

/// Hook for `writev`.
#[unsafe(no_mangle)]
unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `writev` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Write, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `writev`.
    unsafe { real::writev()(fd, iov, cnt) }
}

/// Hook for `preadv`.
#[unsafe(no_mangle)]
unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `preadv` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Read, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `preadv`.
    unsafe { real::preadv()(fd, iov, cnt, offset) }
}

/// Hook for `preadv64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `preadv64` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Read, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `preadv64`.
    unsafe { real::preadv64()(fd, iov, cnt, offset) }
}

/// Hook for `pwritev`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwritev(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `pwritev` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Write, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwritev`.
    unsafe { real::pwritev()(fd, iov, cnt, offset) }
}

/// Hook for `pwritev64`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `pwritev64` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Write, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwritev64`.
    unsafe { real::pwritev64()(fd, iov, cnt, offset) }
}

/// Hook for `preadv2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn preadv2(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `preadv2` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Read, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `preadv2`.
    unsafe { real::preadv2()(fd, iov, cnt, offset, flags) }
}

/// Hook for `preadv64v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn preadv64v2(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `preadv64v2` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Read, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `preadv64v2`.
    unsafe { real::preadv64v2()(fd, iov, cnt, offset, flags) }
}

/// Hook for `pwritev2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwritev2(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `pwritev2` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Write, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwritev2`.
    unsafe { real::pwritev2()(fd, iov, cnt, offset, flags) }
}

/// Hook for `pwritev64v2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn pwritev64v2(fd: c_int, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t {
    if let Some(v) = fdtable::volume(fd) {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc's `pwritev64v2` requires.
        let size = unsafe { iov_len(iov, cnt) };
        if state::enforce(v, RequestType::Write, size).is_err() {
            return refused();
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `pwritev64v2`.
    unsafe { real::pwritev64v2()(fd, iov, cnt, offset, flags) }
}

/// Hook for `fsync`.
#[unsafe(no_mangle)]
unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if !admit(fd, RequestType::Sync, 0) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `fsync`.
    unsafe { real::fsync()(fd) }
}

/// Hook for `fdatasync`.
#[unsafe(no_mangle)]
unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if !admit(fd, RequestType::Sync, 0) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `fdatasync`.
    unsafe { real::fdatasync()(fd) }
}

/// Hook for `sync_file_range`.
#[unsafe(no_mangle)]
unsafe extern "C" fn sync_file_range(fd: c_int, offset: off64_t, nbytes: off64_t, flags: c_uint) -> c_int {
    if !admit(fd, RequestType::Sync, 0) {
        return refused();
    }
    // SAFETY: the caller's arguments, passed on unchanged to libc's `sync_file_range`.
    unsafe { real::sync_file_range()(fd, offset, nbytes, flags) }
}

/// Hook for `close`: the descriptor's class is cleared first, so a number
/// the kernel hands out again is never taken for the old file.
#[unsafe(no_mangle)]
unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fd >= 0 {
        fdtable::clear(fd as u32, fd as u32);
    }
    // SAFETY: the caller's argument, passed on unchanged to libc's `close`.
    unsafe { real::close()(fd) }
}

/// Hook for `close_range`.
#[unsafe(no_mangle)]
unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `close_range`.
    let r = unsafe { real::close_range()(first, last, flags) };
    // CLOSE_RANGE_CLOEXEC only marks them; the descriptors stay open.
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        fdtable::clear(first, last);
    }
    r
}

/// Hook for `fclose`: a stream's reads and writes are not enforced (stdio
/// calls libc internally), but its descriptor number must be forgotten.
#[unsafe(no_mangle)]
unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    if !stream.is_null() {
        // SAFETY: the caller's stream, valid until it is closed below.
        let fd = unsafe { libc::fileno(stream) };
        if fd >= 0 {
            fdtable::clear(fd as u32, fd as u32);
        }
    }
    // SAFETY: the caller's argument, passed on unchanged to libc's `fclose`.
    unsafe { real::fclose()(stream) }
}

/// Hook for `dup`.
#[unsafe(no_mangle)]
unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's argument, passed on unchanged to libc's `dup`.
    duped(fd, unsafe { real::dup()(fd) })
}

/// Hook for `dup2`.
#[unsafe(no_mangle)]
unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `dup2`.
    duped(fd, unsafe { real::dup2()(fd, to) })
}

/// Hook for `dup3`.
#[unsafe(no_mangle)]
unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `dup3`.
    duped(fd, unsafe { real::dup3()(fd, to, flags) })
}

/// `F_DUPFD` and `F_DUPFD_CLOEXEC` make a copy of the descriptor.
#[inline]
fn fcntl_result(fd: c_int, cmd: c_int, r: c_int) -> c_int {
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC { duped(fd, r) } else { r }
}

/// Hook for `fcntl` (variadic in C; see the module's note).
#[unsafe(no_mangle)]
unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `fcntl`.
    fcntl_result(fd, cmd, unsafe { real::fcntl()(fd, cmd, arg) })
}

/// Hook for `fcntl64`, what glibc 2.28 and later compile `fcntl` calls to.
#[unsafe(no_mangle)]
unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged to libc's `fcntl64`.
    fcntl_result(fd, cmd, unsafe { real::fcntl64()(fd, cmd, arg) })
}
