//! A program that opens, dups, closes, forks and writes from threads, run
//! under the preload library by the tests, to show that limits follow the
//! descriptor whatever the program does with it.
//!
//! ```text
//! KVSDS_RULES=rules.toml LD_PRELOAD=target/release/libkv_preload.so \
//!     target/release/examples/fd_probe DIR
//! ```
//!
//! The rules must put `DIR/slow` in a volume with `wiops=20` and leave
//! `DIR/fast` out of every volume. Each case writes 11 one-byte writes and
//! times them: at 20 writes/s a limited descriptor needs at least 0.5 s, an
//! unlimited one a few milliseconds. Prints one line per case and exits 1
//! if any case is on the wrong side of 0.4 s (limited) / 0.25 s (unlimited).

// Calling dup, dup2, dup3, fcntl and fork is what this program is for.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::{IntoRawFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

const WRITES: usize = 11;

fn open(path: &Path) -> RawFd {
    OpenOptions::new().create(true).append(true).open(path).expect("open").into_raw_fd()
}

/// Writes `WRITES` bytes one by one through `fd` (with `write(2)`).
fn burst(fd: RawFd) -> Duration {
    let t = Instant::now();
    for _ in 0..WRITES {
        // SAFETY: a one-byte buffer on the stack; `fd` is open.
        let n = unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) };
        assert_eq!(n, 1, "write on fd {fd}: {}", std::io::Error::last_os_error());
    }
    t.elapsed()
}

/// The same through `writev` and `pwrite`, alternating.
fn burst_vectored(fd: RawFd) -> Duration {
    let t = Instant::now();
    for i in 0..WRITES {
        let iov = libc::iovec { iov_base: b"y".as_ptr() as *mut _, iov_len: 1 };
        // SAFETY: one valid iovec / buffer; `fd` is open.
        let n = unsafe {
            if i % 2 == 0 { libc::writev(fd, &iov, 1) } else { libc::pwrite(fd, b"z".as_ptr().cast(), 1, 0) }
        };
        assert_eq!(n, 1, "writev/pwrite on fd {fd}: {}", std::io::Error::last_os_error());
    }
    t.elapsed()
}

struct Report {
    failed: Vec<String>,
}

impl Report {
    fn check(&mut self, case: &str, limited: bool, took: Duration) {
        let ok = if limited { took >= Duration::from_millis(400) } else { took < Duration::from_millis(250) };
        println!(
            "{case:<44} {:<9} {:>7.1} ms {}",
            if limited { "limited" } else { "unlimited" },
            took.as_secs_f64() * 1e3,
            if ok { "ok" } else { "WRONG" }
        );
        if !ok {
            self.failed.push(case.to_owned());
        }
    }
}

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fd_probe DIR");
    let dir = Path::new(&dir);
    let slow_path = dir.join("slow/file");
    let fast_path = dir.join("fast/file");
    std::fs::create_dir_all(slow_path.parent().unwrap()).unwrap();
    std::fs::create_dir_all(fast_path.parent().unwrap()).unwrap();
    let mut r = Report { failed: Vec::new() };

    let slow = open(&slow_path);
    let fast = open(&fast_path);
    r.check("open: file in the volume", true, burst(slow));
    r.check("open: file in no volume", false, burst(fast));
    r.check("writev/pwrite: file in the volume", true, burst_vectored(slow));

    // SAFETY: plain descriptor calls (dup, dup2, dup3, fcntl, close, write,
    // fork, waitpid) on descriptors this program owns; results are checked.
    unsafe {
        let d = libc::dup(slow);
        assert!(d >= 0);
        r.check("dup of a limited fd", true, burst(d));
        libc::close(slow);
        r.check("dup after the original is closed", true, burst(d));

        let target = libc::dup(fast);
        assert_eq!(libc::dup2(d, target), target);
        r.check("dup2 of a limited fd over an unlimited one", true, burst(target));
        assert_eq!(libc::dup3(fast, target, libc::O_CLOEXEC), target);
        r.check("dup3 of an unlimited fd over a limited one", false, burst(target));

        let f = libc::fcntl(d, libc::F_DUPFD, 100);
        assert!(f >= 100);
        r.check("fcntl(F_DUPFD) of a limited fd", true, burst(f));
        let g = libc::fcntl(fast, libc::F_DUPFD_CLOEXEC, 200);
        assert!(g >= 200);
        r.check("fcntl(F_DUPFD_CLOEXEC) of an unlimited fd", false, burst(g));

        // A closed limited number reused for an unlimited file.
        let num = f;
        libc::close(num);
        let reopened = open(&fast_path);
        let moved = libc::dup2(reopened, num);
        assert_eq!(moved, num);
        libc::close(reopened);
        r.check("a closed limited number reused by dup2", false, burst(num));

        // Writing to a closed descriptor is an ordinary EBADF.
        libc::close(num);
        let n = libc::write(num, b"x".as_ptr().cast(), 1);
        let e = std::io::Error::last_os_error().raw_os_error();
        println!(
            "{:<44} {}",
            "write on a closed fd",
            if n == -1 && e == Some(libc::EBADF) { "EBADF ok" } else { "WRONG" }
        );
        if !(n == -1 && e == Some(libc::EBADF)) {
            r.failed.push("closed fd".into());
        }

        // A forked child: its own stage, the same limits.
        let pid = libc::fork();
        if pid == 0 {
            let took = burst(d);
            let code = if took >= Duration::from_millis(400) { 0 } else { 1 };
            println!(
                "{:<44} {:<9} {:>7.1} ms",
                "forked child, inherited limited fd",
                "limited",
                took.as_secs_f64() * 1e3
            );
            std::io::stdout().flush().ok();
            libc::_exit(code);
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            r.failed.push("forked child".into());
            println!("forked child: WRONG (status {status})");
        }
    }

    // Four threads share the volume's limit: 4 x 11 writes at 20/s.
    let t = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let p = slow_path.clone();
            std::thread::spawn(move || burst(open(&p)))
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    let took = t.elapsed();
    let ok = took >= Duration::from_millis(4 * 500 - 100);
    println!(
        "{:<44} {:<9} {:>7.1} ms {}",
        "4 threads, 44 writes",
        "limited",
        took.as_secs_f64() * 1e3,
        if ok { "ok" } else { "WRONG" }
    );
    if !ok {
        r.failed.push("threads".into());
    }
    // SAFETY: `fast` is owned here and closed once.
    unsafe { libc::close(fast) };

    if !r.failed.is_empty() {
        eprintln!("fd_probe: wrong cases: {}", r.failed.join(", "));
        std::process::exit(1);
    }
}
