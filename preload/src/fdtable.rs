//! Which volume each descriptor belongs to: one atomic slot per descriptor
//! number, set at open, copied by dup, cleared at close. Reading it is the
//! whole cost a descriptor of no volume pays: one relaxed load, no lock, no
//! allocation.

use std::ffi::c_int;
use std::sync::atomic::{AtomicU16, Ordering};

/// Descriptors below this are classified (the default hard limit of open
/// files on Linux is 2^20); a higher one is never limited. The table is
/// 2 MiB of zero pages, touched only where descriptors are used.
pub(crate) const SLOTS: usize = 1 << 20;

static TABLE: [AtomicU16; SLOTS] = [const { AtomicU16::new(0) }; SLOTS];

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
    set(to, volume(from).unwrap_or(0));
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
