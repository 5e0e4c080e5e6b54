//! Fault injection for tests: a file system layer at the bottom of a DB's
//! stack (below the stage and the emulated device, over the real files)
//! that fails chosen operations on command and emulates a power cut.
//!
//! The durability model, implemented in `cpp/fault.cc`: after a power cut,
//! a file keeps the bytes it had when a `Sync` or `Fsync` of it last
//! completed (`RangeSync` and `Close` make nothing durable), and a file
//! creation or a rename survives only if an fsync of its directory
//! completed after it; deletions are durable at once.
//!
//! ```no_run
//! use std::sync::Arc;
//! use rocks_env::{FaultInjection, FaultRule, FileKind, FileOp, StagedDb};
//!
//! let fault = Arc::new(FaultInjection::new());
//! let mut opts = rocksdb::Options::default();
//! opts.create_if_missing(true);
//! let db = StagedDb::builder(opts.clone()).fault_injection(Arc::clone(&fault)).open("/tmp/faulty")?;
//! // The next MANIFEST write fails.
//! fault.fail(FaultRule::new([FileOp::Write]).files([FileKind::Manifest]).count(1));
//! // ... or the machine loses power: nothing not synced survives.
//! fault.power_cut();
//! drop(db);
//! let lost = fault.recover()?;
//! println!("{} bytes were not durable", lost.bytes_dropped);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::c_char;

use crate::error::{Error, Result};
use crate::ffi::{self, RawFault};
use crate::wire::{Activity, FileKind, FileOp, RawFaultReport, RawFaultRule, activity_number};

/// Which operations a [`FaultInjection`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultRule {
    ops: u32,
    files: u32,
    activity: i32,
    skip: u64,
    count: u64,
}

/// RocksDB's own label for an I/O, as a fault rule can select it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoActivity {
    /// I/O of a flush.
    Flush,
    /// I/O of a compaction.
    Compaction,
}

impl FaultRule {
    /// Fails every operation of these kinds, on any file.
    pub fn new(ops: impl IntoIterator<Item = FileOp>) -> Self {
        FaultRule {
            ops: ops.into_iter().fold(0, |m, op| m | (1 << op as u32)),
            files: 0,
            activity: -1,
            skip: 0,
            count: u64::MAX,
        }
    }

    /// Only on files of these kinds.
    pub fn files(mut self, kinds: impl IntoIterator<Item = FileKind>) -> Self {
        self.files = kinds.into_iter().fold(0, |m, k| m | (1 << k as u32));
        self
    }

    /// Only I/O RocksDB labels with this activity.
    pub fn activity(mut self, activity: IoActivity) -> Self {
        self.activity = activity_number(match activity {
            IoActivity::Flush => Activity::Flush,
            IoActivity::Compaction => Activity::Compaction,
        });
        self
    }

    /// Lets the first `n` matching operations pass.
    pub fn skip(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Fails only `n` matching operations (default: all).
    pub fn count(mut self, n: u64) -> Self {
        self.count = n;
        self
    }
}

/// What [`FaultInjection::recover`] did to the files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerCutReport {
    /// Files cut back to their last synced length.
    pub files_truncated: u64,
    /// Bytes those files lost.
    pub bytes_dropped: u64,
    /// Files removed because their creation was never made durable.
    pub files_removed: u64,
    /// Renames undone because they were never made durable.
    pub renames_undone: u64,
}

/// A fault injector; give it to
/// [`StagedDbBuilder::fault_injection`](crate::StagedDbBuilder::fault_injection). One injector may serve
/// several opens of the same DB: it keeps what it learned about the files.
pub struct FaultInjection {
    raw: *mut RawFault,
}

// SAFETY: every entry point of the C++ fault state behind `raw` locks its
// own mutex, and the pointer is freed only in `Drop`.
#[expect(unsafe_code, reason = "the shim's fault state is internally synchronized")]
unsafe impl Send for FaultInjection {}
// SAFETY: as for `Send`.
#[expect(unsafe_code, reason = "the shim's fault state is internally synchronized")]
unsafe impl Sync for FaultInjection {}

impl std::fmt::Debug for FaultInjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjection").field("injected", &self.injected()).finish()
    }
}

impl Default for FaultInjection {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultInjection {
    /// An injector that fails nothing yet.
    #[expect(unsafe_code, reason = "creating the shim's fault state")]
    pub fn new() -> Self {
        // SAFETY: the constructor has no preconditions and never returns
        // null (it allocates with `new`).
        FaultInjection { raw: unsafe { ffi::rocks_env_fault_new() } }
    }

    pub(crate) fn raw(&self) -> *const RawFault {
        self.raw
    }

    /// Fails the operations `rule` selects, replacing any earlier rule.
    #[expect(unsafe_code, reason = "setting the shim's fault rule")]
    pub fn fail(&self, rule: FaultRule) {
        let raw = RawFaultRule {
            ops: rule.ops,
            files: rule.files,
            activity: rule.activity,
            skip: rule.skip,
            count: rule.count,
        };
        // SAFETY: `self.raw` is live until drop; the shim copies the rule.
        unsafe { ffi::rocks_env_fault_set_rule(self.raw, &raw) }
    }

    /// Fails nothing (a power cut stays in force until [`recover`](Self::recover)).
    #[expect(unsafe_code, reason = "clearing the shim's fault rule")]
    pub fn clear(&self) {
        // SAFETY: `self.raw` is live until drop; a null rule clears.
        unsafe { ffi::rocks_env_fault_set_rule(self.raw, std::ptr::null()) }
    }

    /// Operations failed so far.
    #[expect(unsafe_code, reason = "reading the shim's fault counter")]
    pub fn injected(&self) -> u64 {
        // SAFETY: `self.raw` is live until drop.
        unsafe { ffi::rocks_env_fault_injected(self.raw) }
    }

    /// The machine loses power: from now on every operation fails.
    #[expect(unsafe_code, reason = "cutting the shim's power")]
    pub fn power_cut(&self) {
        // SAFETY: `self.raw` is live until drop.
        unsafe { ffi::rocks_env_fault_power_cut(self.raw) }
    }

    /// The machine comes back: the files are put in the state the durability
    /// model says a reboot finds (see the module documentation), and
    /// operations go through again. Call it with every DB on the injector
    /// closed.
    #[expect(unsafe_code, reason = "applying a power cut to the files through the shim")]
    pub fn recover(&self) -> Result<PowerCutReport> {
        let mut report = RawFaultReport::default();
        let mut msg = [0 as c_char; 512];
        // SAFETY: `self.raw` is live; `report` and `msg` are writable for
        // the call, `msg` for its whole length.
        let rc = unsafe { ffi::rocks_env_fault_recover(self.raw, &mut report, msg.as_mut_ptr(), msg.len()) };
        if rc != 0 {
            let bytes: Vec<u8> = msg.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            return Err(Error::Config(format!("power-cut recovery: {}", String::from_utf8_lossy(&bytes))));
        }
        Ok(PowerCutReport {
            files_truncated: report.files_truncated,
            bytes_dropped: report.bytes_dropped,
            files_removed: report.files_removed,
            renames_undone: report.renames_undone,
        })
    }
}

impl Drop for FaultInjection {
    #[expect(unsafe_code, reason = "freeing the shim's fault handle")]
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from `rocks_env_fault_new` and is freed
        // once; layers built over it hold their own reference to the state.
        unsafe { ffi::rocks_env_fault_free(self.raw) }
    }
}
