//! Which volume each descriptor belongs to: one atomic slot per descriptor
//! number, set at open, copied by dup, cleared at close. Reading it is the
//! whole cost a descriptor of no volume pays: one relaxed load, no lock, no
//! allocation.
//!
//! A classified descriptor also keeps the identity of its file (device and
//! inode, mixed into one word). A number can be closed behind the library's
//! back (a raw `close` syscall, `closefrom`'s internal loop, `fcloseall`)
//! and handed out again by a call it does not hook (`memfd_create`,
//! `socket`, `pipe`, ...): the identity no longer matches, and the
//! descriptor is classified again before it is charged.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

/// Descriptors below this are classified (the default hard limit of open
/// files on Linux is 2^20); a higher one is never limited. The table is
/// 2 MiB of zero pages, touched only where descriptors are used.
pub(crate) const SLOTS: usize = 1 << 20;

static TABLE: [AtomicU16; SLOTS] = [const { AtomicU16::new(0) }; SLOTS];
/// The file identity of each classified descriptor (8 MiB of zero pages,
/// touched only where classified descriptors are).
static IDENTITY: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// One word for a file's device and inode (never 0).
#[inline]
pub(crate) fn identity(dev: u64, ino: u64) -> u64 {
    let mut z = dev.rotate_left(32) ^ ino ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

/// The identity recorded for `fd` when it was classified.
#[inline]
pub(crate) fn identity_of(fd: c_int) -> u64 {
    IDENTITY.get(fd as u32 as usize).map_or(0, |s| s.load(Ordering::Relaxed))
}

/// Records the volume of a new descriptor and its file's identity.
#[inline]
pub(crate) fn set_with_identity(fd: c_int, volume: u16, identity: u64) {
    if let Some(s) = IDENTITY.get(fd as u32 as usize) {
        s.store(identity, Ordering::Relaxed);
    }
    set(fd, volume);
}

#[inline(always)]
fn slot(fd: c_int) -> Option<&'static AtomicU16> {
    // A negative descriptor becomes a huge index and is out of range.
    TABLE.get(fd as u32 as usize)
}

/// The volume (1-based) `fd` belongs to, or `None`.
#[inline(always)]
pub(crate) fn volume(fd: c_int) -> Option<u16> {
    match slot(fd) {
        Some(s) => match s.load(Ordering::Relaxed) {
            0 => None,
            v => Some(v),
        },
        None => None,
    }
}

/// Records the volume of a new descriptor (0: none).
#[inline]
pub(crate) fn set(fd: c_int, volume: u16) {
    if let Some(s) = slot(fd) {
        s.store(volume, Ordering::Relaxed);
    }
}

/// A copy of `from` (dup, dup2, dup3, `F_DUPFD`) belongs to its volume.
#[inline]
pub(crate) fn copy(from: c_int, to: c_int) {
    set_with_identity(to, volume(from).unwrap_or(0), identity_of(from));
}

/// Forgets descriptors `first..=last` (close, close_range).
pub(crate) fn clear(first: u32, last: u32) {
    let end = (last as usize).min(SLOTS - 1);
    if first as usize > end {
        return;
    }
    for s in &TABLE[first as usize..=end] {
        if s.load(Ordering::Relaxed) != 0 {
            s.store(0, Ordering::Relaxed);
        }
    }
}
