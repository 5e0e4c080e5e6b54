//! The crate's one clock: nanoseconds since a process-wide epoch, read by
//! the token buckets, the timer wheel and the stage's uptime. A module of
//! its own so the objects and the timer both read it without importing
//! each other.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds since a process-wide epoch (the first call).
#[inline]
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
