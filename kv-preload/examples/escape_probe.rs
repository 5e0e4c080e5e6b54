//! Ways a program could slip out of its limits, tried one by one under the
//! preload library by the tests: descriptors closed behind the library's
//! back and reused (`closefrom`, a raw syscall, `closedir` of an
//! `fdopendir` stream, `freopen`, `fcloseall`), a `vfork` child closing its
//! copy, reads that find less than they ask, copies done inside the
//! kernel, POSIX AIO, and a volume directory made after the program
//! started.
//!
//! ```text
//! KVSDS_RULES=rules.toml LD_PRELOAD=target/release/libkv_preload.so \
//!     target/release/examples/escape_probe DIR
//! ```
//!
//! The rules must put `DIR/slow` in a volume with `rbps=1MiB wbps=1MiB`,
//! `DIR/link/later` in one with `wbps=1MiB`, where `DIR/link` is a
//! symlink to `DIR/real` and `DIR/real/later` does not exist yet, and
//! leave `DIR/fast` out of every volume. A limited case moves 3 MiB and
//! needs at least 2 s; an unlimited one takes milliseconds. Prints one
//! line per case and exits 1 if any case is on the wrong side of 1.5 s /
//! 1 s, or an in-kernel copy on a limited descriptor was not refused with
//! the error callers fall back on.

// Calling closefrom, raw syscalls, vfork and the copy calls is what this
// program is for.
#![allow(unsafe_code)]

use std::ffi::c_int;
use std::fs::OpenOptions;
use std::os::fd::{IntoRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

unsafe extern "C" {
    /// glibc 2.34 and later.
    fn closefrom(lowfd: c_int);
    /// A GNU extension the libc crate does not declare.
    fn fcloseall() -> c_int;
}

fn open(path: &Path) -> RawFd {
    OpenOptions::new().create(true).read(true).write(true).truncate(false).open(path).expect("open").into_raw_fd()
}

/// Writes 3 MiB through `fd`, 1 MiB at a time.
fn write_3mib(fd: RawFd) -> Duration {
    let buf = vec![7u8; MIB];
    let t = Instant::now();
    for _ in 0..3 {
        // SAFETY: `buf` is valid for MIB bytes; `fd` is open.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), MIB) };
        assert_eq!(n, MIB as isize, "write on fd {fd}: {}", std::io::Error::last_os_error());
    }
    t.elapsed()
}

/// A descriptor with no file behind it, at the lowest free number.
fn memfd() -> RawFd {
    // SAFETY: a NUL-terminated name; flags 0.
    let fd = unsafe { libc::memfd_create(c"probe".as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    fd
}

/// The vfork child: closes its copy of the descriptor and exits.
extern "C" fn vfork_child(arg: *mut libc::c_void) -> c_int {
    // SAFETY: closes the child's own copy of the descriptor; _exit never
    // returns and runs no handler.
    unsafe {
        libc::close(arg as usize as c_int);
        libc::_exit(0)
    }
}

struct Report {
    failed: Vec<String>,
}

impl Report {
    fn timed(&mut self, case: &str, limited: bool, took: Duration) {
        let ok = if limited { took >= Duration::from_millis(1500) } else { took < Duration::from_secs(1) };
        self.line(
            case,
            &format!("{:<9} {:>8.1} ms", if limited { "limited" } else { "unlimited" }, took.as_secs_f64() * 1e3),
            ok,
        );
    }

    fn line(&mut self, case: &str, what: &str, ok: bool) {
        println!("{case:<52} {what} {}", if ok { "ok" } else { "WRONG" });
        if !ok {
            self.failed.push(case.to_owned());
        }
    }

    /// A call that must fail with `want`.
    fn refused(&mut self, case: &str, r: isize, want: c_int) {
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let ok = r == -1 && e == want;
        self.line(case, &format!("returned {r}, errno {e} (want {want})"), ok);
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: escape_probe DIR");
    let dir = Path::new(&dir);
    for d in ["slow", "fast"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    assert!(dir.join("link").is_symlink(), "DIR/link must be a symlink to DIR/real");
    assert!(!dir.join("real/later").exists(), "DIR/real/later must not exist when the program starts");
    let mut r = Report { failed: Vec::new() };

    // SAFETY: descriptor calls on descriptors this program owns, buffers
    // valid for the lengths given, a child stack that outlives the child;
    // results are checked.
    unsafe {
        // closefrom: the library forgets what it closed; the number comes
        // back as a memfd, which no volume holds.
        let fd = open(&dir.join("slow/a"));
        closefrom(fd);
        let m = memfd();
        assert_eq!(m, fd, "the memfd took another number");
        r.timed("closefrom, then memfd_create on the number", false, write_3mib(m));
        libc::close(m);

        // A raw close syscall the library never sees: the number is
        // checked against its file before it is charged.
        let fd = open(&dir.join("slow/b"));
        libc::syscall(libc::SYS_close, fd);
        let m = memfd();
        assert_eq!(m, fd, "the memfd took another number");
        r.timed("raw close syscall, then memfd_create on the number", false, write_3mib(m));
        libc::close(m);

        // A vfork child (clone with CLONE_VM | CLONE_VFORK, as vfork and
        // posix_spawn make it) shares our memory: its close must not
        // declassify our descriptor.
        let fd = open(&dir.join("slow/c"));
        let mut stack = vec![0u128; 8192];
        let top = stack.as_mut_ptr().add(stack.len()).cast::<libc::c_void>();
        let pid = libc::clone(
            vfork_child,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            fd as usize as *mut libc::c_void,
        );
        assert!(pid > 0, "clone: {}", std::io::Error::last_os_error());
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        r.timed("after a vfork child closed its copy", true, write_3mib(fd));
        libc::close(fd);

        // Reads that find 1 byte where they ask 2 MiB cost 1 byte each.
        let one = dir.join("slow/one");
        std::fs::write(&one, b"x").unwrap();
        let fd = open(&one);
        let mut buf = vec![0u8; 2 * MIB];
        let t = Instant::now();
        for _ in 0..4 {
            let n = libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            assert_eq!(n, 1);
        }
        r.timed("4 reads of 2 MiB from a 1-byte file", false, t.elapsed());
        // And the limit is still on for reads that do move bytes.
        let big = dir.join("slow/big");
        std::fs::write(&big, vec![1u8; 3 * MIB]).unwrap();
        let b = open(&big);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(libc::read(b, buf.as_mut_ptr().cast(), MIB), MIB as isize);
        }
        r.timed("3 reads of 1 MiB from a 3 MiB file", true, t.elapsed());

        // In-kernel copies on a limited descriptor: refused so the caller
        // falls back to read and write.
        let src = b;
        let dst = open(&dir.join("slow/copy"));
        let n = libc::copy_file_range(src, std::ptr::null_mut(), dst, std::ptr::null_mut(), MIB, 0);
        r.refused("copy_file_range from a limited file", n as isize, libc::ENOSYS);
        let n = libc::sendfile(dst, src, std::ptr::null_mut(), MIB);
        r.refused("sendfile from a limited file", n as isize, libc::EINVAL);
        let mut pipe = [0; 2];
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        let n = libc::splice(src, std::ptr::null_mut(), pipe[1], std::ptr::null_mut(), 4096, 0);
        r.refused("splice from a limited file", n as isize, libc::EINVAL);
        // Between files of no volume they still work.
        let f1 = open(&dir.join("fast/src"));
        assert_eq!(libc::write(f1, buf.as_ptr().cast(), 4096), 4096);
        let f2 = open(&dir.join("fast/dst"));
        let mut off: libc::off64_t = 0;
        let n = libc::copy_file_range(f1, &mut off, f2, std::ptr::null_mut(), 4096, 0);
        r.line("copy_file_range between unlimited files", &format!("copied {n}"), n == 4096);
        for fd in [src, dst, pipe[0], pipe[1], f1, f2, fd] {
            libc::close(fd);
        }

        // closedir of an fdopendir stream closes the directory's
        // descriptor; the number comes back as a memfd.
        let sub = dir.join("slow/sub");
        std::fs::create_dir_all(&sub).unwrap();
        let path = std::ffi::CString::new(sub.as_os_str().as_encoded_bytes()).unwrap();
        let dfd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(dfd >= 0, "open {}: {}", sub.display(), std::io::Error::last_os_error());
        let stream = libc::fdopendir(dfd);
        assert!(!stream.is_null(), "fdopendir: {}", std::io::Error::last_os_error());
        libc::closedir(stream);
        let m = memfd();
        assert_eq!(m, dfd, "the memfd took another number");
        r.timed("closedir of an fdopendir stream, then memfd_create", false, write_3mib(m));
        libc::close(m);

        // freopen closes the stream's descriptor and opens another file,
        // usually under the same number: classified again, both ways.
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let f = libc::fopen(c(&dir.join("slow/fr")).as_ptr(), c"w".as_ptr());
        assert!(!f.is_null(), "fopen: {}", std::io::Error::last_os_error());
        let f = libc::freopen(c(&dir.join("fast/fr")).as_ptr(), c"w".as_ptr(), f);
        assert!(!f.is_null(), "freopen: {}", std::io::Error::last_os_error());
        r.timed("freopen from a limited file to an unlimited one", false, write_3mib(libc::fileno(f)));
        let f = libc::freopen(c(&dir.join("slow/fr2")).as_ptr(), c"w".as_ptr(), f);
        assert!(!f.is_null(), "freopen: {}", std::io::Error::last_os_error());
        r.timed("freopen from an unlimited file to a limited one", true, write_3mib(libc::fileno(f)));
        libc::fclose(f);

        // fcloseall: glibc's flushes every stream; if it closed their
        // descriptors, the numbers that come back are checked as above.
        let f = libc::fopen(c(&dir.join("slow/fc")).as_ptr(), c"w".as_ptr());
        assert!(!f.is_null());
        let fd = libc::fileno(f);
        fcloseall();
        if libc::fcntl(fd, libc::F_GETFD) == -1 {
            let m = memfd();
            r.timed("fcloseall, then memfd_create on the number", false, write_3mib(m));
            libc::close(m);
        } else {
            // Still open (glibc leaves the descriptor to the caller): the
            // limit stays on it, as it should.
            r.timed("fcloseall left the descriptor open; still limited", true, write_3mib(fd));
            libc::close(fd);
        }

        // POSIX AIO: charged as each request is submitted.
        let fd = open(&dir.join("slow/aio"));
        let buf = vec![3u8; MIB];
        let mut cbs: Vec<libc::aiocb> = (0..3)
            .map(|i| {
                let mut cb: libc::aiocb = std::mem::zeroed();
                cb.aio_fildes = fd;
                cb.aio_buf = buf.as_ptr() as *mut libc::c_void;
                cb.aio_nbytes = MIB;
                cb.aio_offset = (i * MIB) as libc::off_t;
                cb.aio_lio_opcode = libc::LIO_WRITE;
                cb
            })
            .collect();
        let t = Instant::now();
        for cb in &mut cbs[..2] {
            assert_eq!(libc::aio_write(cb), 0, "aio_write: {}", std::io::Error::last_os_error());
        }
        // The third through lio_listio, waiting for it.
        let mut list = [&mut cbs[2] as *mut libc::aiocb];
        assert_eq!(libc::lio_listio(libc::LIO_WAIT, list.as_mut_ptr(), 1, std::ptr::null_mut()), 0);
        for cb in &cbs {
            while libc::aio_error(cb) == libc::EINPROGRESS {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(libc::aio_return(cb as *const _ as *mut _), MIB as isize);
        }
        r.timed("3 MiB by aio_write and lio_listio", true, t.elapsed());
        libc::close(fd);
    }

    // A volume directory made after the program started (named through a
    // symlink) is limited.
    let later = dir.join("link/later/made/now");
    std::fs::create_dir_all(&later).unwrap();
    let fd = open(&later.join("file"));
    r.timed("a file in a volume made after start", true, write_3mib(fd));

    if !r.failed.is_empty() {
        eprintln!("wrong: {}", r.failed.join("; "));
        std::process::exit(1);
    }
}
