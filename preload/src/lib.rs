//! `libkvsds_preload.so`: per-volume limits for unmodified programs.
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
//! * dup, dup2, dup3 and `fcntl(F_DUPFD, F_DUPFD_CLOEXEC)` copy the class;
//!   close, close_range and fclose clear it.
//!
//! Everything else passes through untouched, and a descriptor of no volume
//! costs one relaxed atomic load per call (no lock, no allocation). Not
//! enforced: stdio streams (glibc calls itself internally), `mmap`, and
//! asynchronous engines (io_uring, libaio).
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
