//! `libkv_preload.so`: per-volume limits for unmodified programs.
//!
//! Loaded with `LD_PRELOAD`, it reads the rules file named by
//! `KVSDS_RULES` (the TOML or JSON rules format of kv-stage, usually just
//! `[[volumes]]` tables with `io.max` limits), builds an in-process
//! [`kv_stage::Stage`] from it, and stands in front of libc's file calls:
//!
//! * open, openat, creat (and their 64-bit and fortified variants) classify
//!   each new descriptor once, by the canonical path of the file (longest
//!   path volume prefix) or else its device (device volumes), into that
//!   volume and the context its `tag` names (else the calling thread's);
//! * read, write, pread, pwrite, readv, writev, preadv, pwritev (and their
//!   64-bit, `v2` and fortified variants), fsync, fdatasync and
//!   sync_file_range on a classified descriptor are enforced by the
//!   volume's QoS object before they happen; a refusal is an `EIO`;
//!   A write is charged before it is made (a short one gets the rest
//!   back); a read is charged what it read, after it read it and before
//!   the caller gets it (a 2 MiB read of a 1-byte file costs 1 byte);
//! * POSIX AIO (`aio_read`, `aio_write`, `lio_listio`) is charged as it is
//!   submitted;
//! * `copy_file_range` (`ENOSYS`), `sendfile` and `splice` (`EINVAL`) on a
//!   limited descriptor are refused with the error that makes callers
//!   (coreutils `cp`, Python's `shutil`) fall back to read and write;
//! * a stream's descriptor is classified when `fopen` or `freopen` opens
//!   it (calls on `fileno(stream)` are enforced; the stream's own
//!   `fread`/`fwrite` are not, see below);
//! * dup, dup2, dup3 and `fcntl(F_DUPFD, F_DUPFD_CLOEXEC)` copy the class;
//!   close, close_range, closefrom, fclose, closedir and freopen clear it.
//!   A limited descriptor is also checked against the device and inode it
//!   was classified with before each charge, so a number closed behind the
//!   library's back (a raw syscall, `fcloseall`) and reused by a call it
//!   does not hook (`memfd_create`, `socket`) is classified again. In a
//!   `vfork` child (which shares its parent's memory) the class table is
//!   left alone.
//!
//! Everything else passes through untouched, and a descriptor of no volume
//! costs one relaxed atomic load per call (no lock, no allocation); one of
//! a limited volume adds an `fstat`. Not enforced: stdio streams (glibc
//! calls itself internally), `mmap`, and io_uring or libaio.
//!
//! A volume path that does not exist at load is matched as its deepest
//! existing ancestor (made canonical) plus the rest.
//!
//! Environment:
//! * `KVSDS_RULES`: the rules file. Unset: one line on stderr, nothing limited.
//! * `KVSDS_ON_ERROR=passthrough`: a rules file that cannot be used lets the
//!   program run without limits (after its one-line error). By default such
//!   a program is not started: it exits with status 78 (`EX_CONFIG`).
//! * `KVSDS_RELOAD_MS`: how often the file is checked for changed limits
//!   (default 10: a change is seen within one refill period; 0 turns live reload off).
//!
//! Limits are per process: a forked child gets its own stage with the same
//! limits (and its own reload watcher).
//!
//! This crate is the one place besides rocks-env with `unsafe` code: an
//! interposer is C ABI functions taking raw pointers, and every such site
//! says why it is sound.

#![allow(unsafe_code)]

mod fdtable;
mod hooks;
mod real;
mod state;

/// Runs when the library is loaded, before the program's `main`.
extern "C" fn load() {
    // A panic must not cross into the program's start-up code.
    let _ = std::panic::catch_unwind(state::init);
}

#[used]
#[unsafe(link_section = ".init_array")]
static LOAD: extern "C" fn() = load;
