//! An emulated storage device for benchmarks: one FIFO token bucket that
//! every byte RocksDB reads or writes passes, in a file system layer of its
//! own *below* the stage's (see `cpp/shim.h`): a DB opened without a device
//! has no such layer, and its requests never meet this code.
//!
//! This machine's real disk is far faster than its CPUs can drive RocksDB,
//! so the contention SILK manages (flushes and compactions competing with
//! clients for disk bandwidth) is emulated: a device of, say, 128 MiB/s
//! makes every read and write wait its turn, in arrival order, exactly as
//! long as the transfer would take. It is off unless a DB is opened with
//! one, and several DBs may share one device (one disk).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kv_stage::{
    Context, DrlSpec, EnforceError, RequestType,
    object::{Drl, DrlSettings, EnforcementObject},
    units::Bandwidth,
};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::ffi::Sink;
use crate::wire::{Activity, FileOp, Request};

/// How much transfer time the device can bank while idle.
const BURST: Duration = Duration::from_millis(1);

/// Largest piece the device transfers at once. A large request (a 2 MiB
/// compaction read) is queued piece by piece, so a small request that
/// arrives meanwhile waits behind one piece, not the whole transfer, as on a
/// device that serves several queued requests in parallel.
pub const DEVICE_CHUNK: u64 = 64 * 1024;

/// Waiting caused by the emulated device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    /// Configured bandwidth in bytes/s.
    pub bandwidth: f64,
    /// Requests that had to wait for the device.
    pub waits: u64,
    /// Total time requests waited for the device, in nanoseconds.
    pub wait_ns: u64,
    /// Requests waiting right now.
    pub waiting: u64,
    /// The largest read or write of a flush or a compaction (as RocksDB
    /// marks its I/O) the device was handed, in bytes; the stage above may
    /// have split a larger one (see
    /// [`StagedDbBuilder::max_background_request`](crate::StagedDbBuilder::max_background_request)).
    pub largest_background_request: u64,
}

/// An emulated device of a given bandwidth.
pub struct Device {
    drl: Drl,
    bandwidth: Mutex<Bandwidth>,
    largest: AtomicU64,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.bandwidth())
    }
}

impl Device {
    /// A device of `bandwidth`, shared by reads and writes.
    pub fn new(bandwidth: Bandwidth) -> Arc<Device> {
        let spec = DrlSpec { rate: bandwidth.rate(), burst: None, refill_period: Some(BURST) };
        let drl = Drl::new(spec).expect("a positive bandwidth with a 1 ms burst is a valid DRL");
        Arc::new(Device { drl, bandwidth: Mutex::new(bandwidth), largest: AtomicU64::new(0) })
    }

    /// Parses a bandwidth such as `"128MiB/s"`.
    pub fn parse(bandwidth: &str) -> Result<Arc<Device>> {
        let b: Bandwidth = bandwidth.parse().map_err(|e| Error::Config(format!("device bandwidth: {e}")))?;
        Ok(Self::new(b))
    }

    /// The bandwidth.
    pub fn bandwidth(&self) -> Bandwidth {
        *self.bandwidth.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the bandwidth; requests already waiting see the change.
    pub fn set_bandwidth(&self, bandwidth: Bandwidth) {
        let mut b = self.bandwidth.lock().unwrap_or_else(|e| e.into_inner());
        self.drl
            .configure(&DrlSettings { rate: Some(bandwidth.rate()), refill_period: Some(BURST), burst: None }.into());
        *b = bandwidth;
    }

    /// Waits for the transfer of `size` bytes, in pieces of at most
    /// [`DEVICE_CHUNK`] bytes.
    fn transfer(&self, size: u64) {
        let mut left = size;
        while left > 0 {
            let piece = left.min(DEVICE_CHUNK);
            // The device's bucket is never shut down or closed, so it admits
            // every piece after its transfer time.
            let _ = self.drl.enforce(&Context::new(RequestType::Write, piece));
            left -= piece;
        }
    }

    /// Waiting statistics.
    pub fn stats(&self) -> DeviceStats {
        let s = self.drl.stats();
        DeviceStats {
            bandwidth: self.bandwidth().bytes_per_sec(),
            waits: s.waits,
            wait_ns: s.wait_ns,
            waiting: s.waiting,
            largest_background_request: self.largest.load(Ordering::Relaxed),
        }
    }
}

/// Reads and writes move data; syncs and metadata are free, and so is
/// readahead (the reads that consume it are charged).
impl Sink for Device {
    fn enforce(&self, req: &Request) -> std::result::Result<(), EnforceError> {
        if matches!(req.op, FileOp::Read | FileOp::Write) {
            // Read first: the line is written only when the maximum grows.
            if matches!(req.activity, Activity::Flush | Activity::Compaction)
                && req.size > self.largest.load(Ordering::Relaxed)
            {
                self.largest.fetch_max(req.size, Ordering::Relaxed);
            }
            self.transfer(req.size);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FileKind;
    use std::time::Instant;

    #[test]
    fn device_paces_transfers() {
        let d = Device::parse("10MB/s").unwrap();
        let t = Instant::now();
        // 1 MB beyond the 10 KB burst takes about 100 ms.
        let req = |op, size| Request { op, file: FileKind::Sst, activity: Activity::Other, size };
        for _ in 0..100 {
            d.enforce(&req(FileOp::Write, 10_000)).unwrap();
        }
        assert!(t.elapsed() >= Duration::from_millis(98), "{:?}", t.elapsed());
        assert!(d.stats().waits > 0);
        // Syncs and metadata are free: they never queue, whatever their size.
        let waits = d.stats().waits;
        d.enforce(&req(FileOp::Sync, 1 << 30)).unwrap();
        d.enforce(&req(FileOp::Open, 1 << 30)).unwrap();
        d.enforce(&req(FileOp::Prefetch, 1 << 30)).unwrap();
        assert_eq!(d.stats().waits, waits);
    }

    #[test]
    fn bad_bandwidths_are_rejected() {
        assert!(Device::parse("0").is_err());
        assert!(Device::parse("unlimited").is_err());
        assert!(Device::parse("100ops/s").is_err());
        assert!(Device::parse("fast").is_err());
    }
}
