//! libc's own functions, found once with `dlsym(RTLD_NEXT, ..)`: the ones
//! this library's hooks stand in front of.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{FILE, iovec, mode_t, off_t, off64_t, size_t, ssize_t};

/// The next definition of `name` (a NUL-terminated symbol) after this
/// library: libc's. A missing one is a broken libc; say so and abort (an
/// interposer cannot go on without the function it stands in front of).
fn resolve(name: &str) -> *mut c_void {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid pseudo-handle
    // in a shared object.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
    if p.is_null() {
        let msg = b"kv-preload: libc has no such function; aborting: ";
        // SAFETY: raw write(2) of valid buffers to stderr; not a hook, so no
        // recursion through this library.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::syscall(libc::SYS_write, 2, name.as_ptr(), name.len() - 1);
            libc::syscall(libc::SYS_write, 2, b"\n".as_ptr(), 1usize);
            libc::abort();
        }
    }
    p
}

macro_rules! next {
    ($($get:ident = $sym:literal : $ty:ty;)+) => {$(
        #[inline]
        pub(crate) fn $get() -> $ty {
            static P: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
            let mut p = P.load(Ordering::Relaxed);
            if p.is_null() {
                // Racing threads resolve the same address; storing it twice is harmless.
                p = resolve(concat!($sym, "\0"));
                P.store(p, Ordering::Relaxed);
            }
            // SAFETY: `p` is libc's own `$sym`, non-null, and `$ty` repeats
            // its C prototype (glibc, x86_64 and aarch64 Linux).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }
    )+};
}

type OpenFn = unsafe extern "C" fn(*const c_char, c_int, ...) -> c_int;
type OpenAtFn = unsafe extern "C" fn(c_int, *const c_char, c_int, ...) -> c_int;
type Open2Fn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type OpenAt2Fn = unsafe extern "C" fn(c_int, *const c_char, c_int) -> c_int;
type CreatFn = unsafe extern "C" fn(*const c_char, mode_t) -> c_int;
type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type ReadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type PreadFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
type PreadChkFn = unsafe extern "C" fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t;
type PwriteFn = unsafe extern "C" fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
type VecFn = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
type PVecFn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
type PVec2Fn = unsafe extern "C" fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t;
type FdFn = unsafe extern "C" fn(c_int) -> c_int;
type SyncRangeFn = unsafe extern "C" fn(c_int, off64_t, off64_t, c_uint) -> c_int;
type Dup2Fn = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Dup3Fn = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FcntlFn = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type CloseRangeFn = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type FcloseFn = unsafe extern "C" fn(*mut FILE) -> c_int;
type ClosefromFn = unsafe extern "C" fn(c_int);
type ClosedirFn = unsafe extern "C" fn(*mut libc::DIR) -> c_int;
type FreopenFn = unsafe extern "C" fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE;
type FopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut FILE;
type CopyRangeFn = unsafe extern "C" fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t;
type SendfileFn = unsafe extern "C" fn(c_int, c_int, *mut off_t, size_t) -> ssize_t;
type Sendfile64Fn = unsafe extern "C" fn(c_int, c_int, *mut off64_t, size_t) -> ssize_t;
type AioFn = unsafe extern "C" fn(*mut libc::aiocb) -> c_int;
type LioFn = unsafe extern "C" fn(c_int, *const *mut libc::aiocb, c_int, *mut libc::sigevent) -> c_int;

next! {
    open = "open": OpenFn;
    open64 = "open64": OpenFn;
    openat = "openat": OpenAtFn;
    openat64 = "openat64": OpenAtFn;
    open_2 = "__open_2": Open2Fn;
    open64_2 = "__open64_2": Open2Fn;
    openat_2 = "__openat_2": OpenAt2Fn;
    openat64_2 = "__openat64_2": OpenAt2Fn;
    creat = "creat": CreatFn;
    creat64 = "creat64": CreatFn;
    read = "read": ReadFn;
    read_chk = "__read_chk": ReadChkFn;
    write = "write": WriteFn;
    pread = "pread": PreadFn;
    pread64 = "pread64": PreadFn;
    pread_chk = "__pread_chk": PreadChkFn;
    pread64_chk = "__pread64_chk": PreadChkFn;
    pwrite = "pwrite": PwriteFn;
    pwrite64 = "pwrite64": PwriteFn;
    readv = "readv": VecFn;
    writev = "writev": VecFn;
    preadv = "preadv": PVecFn;
    preadv64 = "preadv64": PVecFn;
    pwritev = "pwritev": PVecFn;
    pwritev64 = "pwritev64": PVecFn;
    preadv2 = "preadv2": PVec2Fn;
    preadv64v2 = "preadv64v2": PVec2Fn;
    pwritev2 = "pwritev2": PVec2Fn;
    pwritev64v2 = "pwritev64v2": PVec2Fn;
    fsync = "fsync": FdFn;
    fdatasync = "fdatasync": FdFn;
    sync_file_range = "sync_file_range": SyncRangeFn;
    close = "close": FdFn;
    close_range = "close_range": CloseRangeFn;
    fclose = "fclose": FcloseFn;
    dup = "dup": FdFn;
    dup2 = "dup2": Dup2Fn;
    dup3 = "dup3": Dup3Fn;
    fcntl = "fcntl": FcntlFn;
    fcntl64 = "fcntl64": FcntlFn;
    closefrom = "closefrom": ClosefromFn;
    closedir = "closedir": ClosedirFn;
    freopen = "freopen": FreopenFn;
    freopen64 = "freopen64": FreopenFn;
    fopen = "fopen": FopenFn;
    fopen64 = "fopen64": FopenFn;
    copy_file_range = "copy_file_range": CopyRangeFn;
    sendfile = "sendfile": SendfileFn;
    sendfile64 = "sendfile64": Sendfile64Fn;
    splice = "splice": CopyRangeFn;
    aio_read = "aio_read": AioFn;
    aio_read64 = "aio_read64": AioFn;
    aio_write = "aio_write": AioFn;
    aio_write64 = "aio_write64": AioFn;
    lio_listio = "lio_listio": LioFn;
    lio_listio64 = "lio_listio64": LioFn;
}
