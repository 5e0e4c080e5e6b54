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

/// Open calls: libc opens, then the new descriptor is classified.
macro_rules! open_hooks {
    ($($name:ident = $real:ident($($arg:ident: $ty:ty),+);)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name($($arg: $ty),+) -> c_int {
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            opened(unsafe { real::$real()($($arg),+) })
        }
    )+};
}

/// The bytes a data call asks for: a count, an iovec array, or none.
macro_rules! request_size {
    (count $n:ident) => {
        $n as u64
    };
    (iov $iov:ident $cnt:ident) => {
        // SAFETY: the caller passes `cnt` valid iovecs, as libc requires.
        unsafe { iov_len($iov, $cnt) }
    };
    (none) => {
        0
    };
}

/// Data calls: on a descriptor of a volume, enforced first (a refusal is
/// `EIO` and the call is not made); then libc.
macro_rules! data_hooks {
    ($($name:ident = $real:ident($fd:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty, $t:ident [$($size:tt)+];)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            if let Some(v) = fdtable::volume($fd)
                && state::enforce(v, RequestType::$t, request_size!($($size)+)).is_err()
            {
                return refused();
            }
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            unsafe { real::$real()($fd $(, $arg)*) }
        }
    )+};
}

open_hooks! {
    open = open(path: *const c_char, flags: c_int, mode: mode_t);
    open64 = open64(path: *const c_char, flags: c_int, mode: mode_t);
    openat = openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t);
    openat64 = openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t);
    __open_2 = open_2(path: *const c_char, flags: c_int);
    __open64_2 = open64_2(path: *const c_char, flags: c_int);
    __openat_2 = openat_2(dirfd: c_int, path: *const c_char, flags: c_int);
    __openat64_2 = openat64_2(dirfd: c_int, path: *const c_char, flags: c_int);
    creat = creat(path: *const c_char, mode: mode_t);
    creat64 = creat64(path: *const c_char, mode: mode_t);
}

data_hooks! {
    read = read(fd, buf: *mut c_void, count: size_t) -> ssize_t, Read [count count];
    __read_chk = read_chk(fd, buf: *mut c_void, count: size_t, buflen: size_t) -> ssize_t, Read [count count];
    write = write(fd, buf: *const c_void, count: size_t) -> ssize_t, Write [count count];
    pread = pread(fd, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t, Read [count count];
    pread64 = pread64(fd, buf: *mut c_void, count: size_t, offset: off_t) -> ssize_t, Read [count count];
    __pread_chk = pread_chk(fd, buf: *mut c_void, count: size_t, offset: off_t, buflen: size_t) -> ssize_t, Read [count count];
    __pread64_chk = pread64_chk(fd, buf: *mut c_void, count: size_t, offset: off_t, buflen: size_t) -> ssize_t, Read [count count];
    pwrite = pwrite(fd, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t, Write [count count];
    pwrite64 = pwrite64(fd, buf: *const c_void, count: size_t, offset: off_t) -> ssize_t, Write [count count];
    readv = readv(fd, iov: *const iovec, cnt: c_int) -> ssize_t, Read [iov iov cnt];
    writev = writev(fd, iov: *const iovec, cnt: c_int) -> ssize_t, Write [iov iov cnt];
    preadv = preadv(fd, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t, Read [iov iov cnt];
    preadv64 = preadv64(fd, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t, Read [iov iov cnt];
    pwritev = pwritev(fd, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t, Write [iov iov cnt];
    pwritev64 = pwritev64(fd, iov: *const iovec, cnt: c_int, offset: off_t) -> ssize_t, Write [iov iov cnt];
    preadv2 = preadv2(fd, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t, Read [iov iov cnt];
    preadv64v2 = preadv64v2(fd, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t, Read [iov iov cnt];
    pwritev2 = pwritev2(fd, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t, Write [iov iov cnt];
    pwritev64v2 = pwritev64v2(fd, iov: *const iovec, cnt: c_int, offset: off_t, flags: c_int) -> ssize_t, Write [iov iov cnt];
    fsync = fsync(fd) -> c_int, Sync [none];
    fdatasync = fdatasync(fd) -> c_int, Sync [none];
    sync_file_range = sync_file_range(fd, offset: off64_t, nbytes: off64_t, flags: c_uint) -> c_int, Sync [none];
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
