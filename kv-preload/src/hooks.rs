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
    if fd >= 0 && state::owns_table() {
        state::classify(fd);
    }
    fd
}

/// Copies the class of `from` to the descriptor a dup call returned.
#[inline]
fn duped(from: c_int, to: c_int) -> c_int {
    if to >= 0 && state::owns_table() {
        fdtable::copy(from, to);
    }
    to
}

/// Forgets descriptors `first..=last` (not in a `vfork` child: the table
/// is its parent's).
#[inline]
fn forget(first: u32, last: u32) {
    if state::owns_table() {
        fdtable::clear(first, last);
    }
}

/// Fails the current call with `errno` = `code`.
#[cold]
fn fail<T: From<i8>>(code: c_int) -> T {
    // SAFETY: errno is the calling thread's own.
    unsafe { *libc::__errno_location() = code };
    T::from(-1)
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

/// Data calls on a descriptor of a volume: a write or sync is enforced
/// first (a refusal is `EIO` and the call is not made), then made, and
/// what a short write did not move is given back; a read is made, then
/// charged what it read (a refusal is `EIO`).
macro_rules! data_hooks {
    ($($name:ident = $real:ident($fd:ident $(, $arg:ident: $ty:ty)*) -> $ret:ty, $t:ident [$($size:tt)+];)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            let Some(v) = fdtable::volume($fd) else {
                // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
                return unsafe { real::$real()($fd $(, $arg)*) };
            };
            let size = request_size!($($size)+);
            if RequestType::$t == RequestType::Read {
                // A read is charged what it read, once it has: a read that
                // asks 2 MiB of a 1-byte file costs 1 byte (charged before,
                // it would wait for 2 MiB of tokens first). The caller gets
                // its bytes only once they are paid for, so the rate holds.
                // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
                let r = unsafe { real::$real()($fd $(, $arg)*) };
                if r >= 0 && state::enforce($fd, v, RequestType::Read, (r as u64).min(size)).is_err() {
                    return refused();
                }
                return r;
            }
            let charged = match state::enforce($fd, v, RequestType::$t, size) {
                Ok(c) => c,
                Err(()) => return refused(),
            };
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            let r = unsafe { real::$real()($fd $(, $arg)*) };
            if let Some(v) = charged && size > 0 {
                // What a short write did not move is given back.
                state::settle(v, RequestType::$t, size, r as i64);
            }
            r
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
        forget(fd as u32, fd as u32);
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
        forget(first, last);
    }
    r
}

/// Hook for `closefrom` (glibc 2.34): every descriptor from `low` up.
#[unsafe(no_mangle)]
unsafe extern "C" fn closefrom(low: c_int) {
    // SAFETY: the caller's argument, passed on unchanged to libc's `closefrom`.
    unsafe { real::closefrom()(low) };
    forget(low.max(0) as u32, u32::MAX);
}

/// Hook for `closedir`: a stream of `opendir` or `fdopendir` closes its
/// descriptor.
#[unsafe(no_mangle)]
unsafe extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    if !dir.is_null() {
        // SAFETY: the caller's stream, valid until it is closed below.
        let fd = unsafe { libc::dirfd(dir) };
        if fd >= 0 {
            forget(fd as u32, fd as u32);
        }
    }
    // SAFETY: the caller's argument, passed on unchanged to libc's `closedir`.
    unsafe { real::closedir()(dir) }
}

/// `freopen`: the stream's old descriptor is closed and a file opened in
/// its place (usually under the same number): classified again.
macro_rules! freopen_hooks {
    ($($name:ident = $real:ident;)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char, stream: *mut FILE) -> *mut FILE {
            if !stream.is_null() {
                // SAFETY: the caller's stream, valid until reopened below.
                let fd = unsafe { libc::fileno(stream) };
                if fd >= 0 {
                    forget(fd as u32, fd as u32);
                }
            }
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            let r = unsafe { real::$real()(path, mode, stream) };
            if !r.is_null() {
                // SAFETY: the stream libc returned is valid.
                opened(unsafe { libc::fileno(r) });
            }
            r
        }
    )+};
}

freopen_hooks! {
    freopen = freopen;
    freopen64 = freopen64;
}

/// `fopen`: glibc opens the file inside libc, where the `open` hook does
/// not see it; the stream's descriptor is classified here, so calls on
/// `fileno(stream)` are enforced as after `freopen` (the stream's own
/// `fread`/`fwrite` are not: see the crate doc).
macro_rules! fopen_hooks {
    ($($name:ident = $real:ident;)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char) -> *mut FILE {
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            let r = unsafe { real::$real()(path, mode) };
            if !r.is_null() {
                // SAFETY: the stream libc returned is valid.
                opened(unsafe { libc::fileno(r) });
            }
            r
        }
    )+};
}

fopen_hooks! {
    fopen = fopen;
    fopen64 = fopen64;
}

/// Copies done inside the kernel cannot be charged by the piece: on a
/// limited descriptor (either end) they are refused with the error that
/// makes callers fall back to `read` and `write`, which are charged.
/// `copy_file_range`: `ENOSYS` (what coreutils' `cp` and glibc callers take
/// as "not supported here"); `sendfile` and `splice`: `EINVAL` (what they
/// return where the file system cannot do them; Python's `shutil`, for
/// one, falls back on it).
macro_rules! range_copy_hooks {
    ($($name:ident = $real:ident, $errno:expr;)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "` (see above).")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(
            fd_in: c_int,
            off_in: *mut off64_t,
            fd_out: c_int,
            off_out: *mut off64_t,
            len: size_t,
            flags: c_uint,
        ) -> ssize_t {
            if state::limited(fd_in) || state::limited(fd_out) {
                return fail($errno);
            }
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            unsafe { real::$real()(fd_in, off_in, fd_out, off_out, len, flags) }
        }
    )+};
}

range_copy_hooks! {
    copy_file_range = copy_file_range, libc::ENOSYS;
    splice = splice, libc::EINVAL;
}

macro_rules! sendfile_hooks {
    ($($name:ident = $real:ident($off:ty);)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "` (see `copy_file_range`).")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(out_fd: c_int, in_fd: c_int, offset: *mut $off, count: size_t) -> ssize_t {
            if state::limited(in_fd) || state::limited(out_fd) {
                return fail(libc::EINVAL);
            }
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            unsafe { real::$real()(out_fd, in_fd, offset, count) }
        }
    )+};
}

sendfile_hooks! {
    sendfile = sendfile(off_t);
    sendfile64 = sendfile64(off64_t);
}

/// POSIX AIO: glibc's helper threads call `pread`/`pwrite` inside libc,
/// where no hook sees them, so a request is charged as it is submitted
/// (the submitting call waits for its tokens) and never refunded.
///
/// # Safety
/// `cb` is the caller's valid control block, or null.
unsafe fn aio_charge(cb: *const libc::aiocb, t: RequestType) -> Result<(), ()> {
    if cb.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's promise.
    let (fd, n) = unsafe { ((*cb).aio_fildes, (*cb).aio_nbytes as u64) };
    match fdtable::volume(fd) {
        Some(v) => state::enforce(fd, v, t, n).map(|_| ()),
        None => Ok(()),
    }
}

macro_rules! aio_hooks {
    ($($name:ident = $real:ident, $t:ident;)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "` (charged at submission).")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(cb: *mut libc::aiocb) -> c_int {
            // SAFETY: the caller's control block.
            if unsafe { aio_charge(cb, RequestType::$t) }.is_err() {
                return refused();
            }
            // SAFETY: the caller's argument, passed on unchanged to libc's own function.
            unsafe { real::$real()(cb) }
        }
    )+};
}

aio_hooks! {
    aio_read = aio_read, Read;
    aio_read64 = aio_read64, Read;
    aio_write = aio_write, Write;
    aio_write64 = aio_write64, Write;
}

macro_rules! lio_hooks {
    ($($name:ident = $real:ident;)+) => {$(
        #[doc = concat!("Hook for `", stringify!($name), "` (each read and write charged at submission).")]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name(
            mode: c_int,
            list: *const *mut libc::aiocb,
            nent: c_int,
            sig: *mut libc::sigevent,
        ) -> c_int {
            if !list.is_null() && nent > 0 {
                // SAFETY: the caller passes `nent` entries, as lio_listio requires.
                let entries = unsafe { std::slice::from_raw_parts(list, nent as usize) };
                for &cb in entries {
                    if cb.is_null() {
                        continue;
                    }
                    // SAFETY: a non-null entry is the caller's valid control block.
                    let t = match unsafe { (*cb).aio_lio_opcode } {
                        libc::LIO_READ => RequestType::Read,
                        libc::LIO_WRITE => RequestType::Write,
                        _ => continue,
                    };
                    // SAFETY: as above.
                    if unsafe { aio_charge(cb, t) }.is_err() {
                        return refused();
                    }
                }
            }
            // SAFETY: the caller's arguments, passed on unchanged to libc's own function.
            unsafe { real::$real()(mode, list, nent, sig) }
        }
    )+};
}

lio_hooks! {
    lio_listio = lio_listio;
    lio_listio64 = lio_listio64;
}

/// Hook for `fclose`: a stream's reads and writes are not enforced (stdio
/// calls libc internally), but its descriptor number must be forgotten.
#[unsafe(no_mangle)]
unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    if !stream.is_null() {
        // SAFETY: the caller's stream, valid until it is closed below.
        let fd = unsafe { libc::fileno(stream) };
        if fd >= 0 {
            forget(fd as u32, fd as u32);
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
