//! The disk probe: how fast the disk itself was while a system ran.
//!
//! On a shared machine the disk's own latency moves by itself: on this
//! project's 2-core VM, repeats of plain RocksDB in calm load ranged from
//! 0.4 to 7.4 ms of p99 with no flush or compaction near their slowest
//! requests. A comparison of systems then needs to know, per repeat, what
//! the disk gave *anyone*. The probe is a thread that reads 4 KiB with
//! direct I/O (no page cache) at a random aligned offset of a 16 MiB file
//! of its own, next to the data, every `interval` (20 ms by default: 50
//! reads, 200 KiB a second, the same for every system), and keeps each
//! read's latency with the time it ended. The report takes the reads that
//! ended while a repeat's clock ran ([`DiskProbe::reads`]).
//!
//! On a kernel device the probe thread is kept out of the run's cgroup
//! (cgroup v1 moves single threads: [`crate::kernel::Cgroup::exempt_thread`]),
//! so its reads do not queue in the throttle behind the system's own; they
//! still share the disk with what the throttle let through. Under cgroup
//! v2 a thread cannot leave its process's cgroup, and the report says the
//! probe was inside the throttle (`outside_throttle: false`).
//!
//! A probe read that takes [`DISK_STALL`] or more is a *disk stall*: the
//! disk itself held a 4 KiB read of a file no system touches that long.
//! The report lists when they ended ([`ProbeStats::stalls`]), and the
//! attribution counts the slowest requests whose wait overlapped one
//! ([`crate::attribution::Around::with_disk_stall`]), so that "why was this
//! request slow?" can be answered "the disk was" where that is the case.
//!
//! The thread stops when the [`DiskProbe`] is dropped or after `max`, and
//! the file goes with it.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::generator::Rng;

/// Size of one probe read, and its alignment.
pub const READ_BYTES: usize = 4096;

/// Size of the probe's file.
pub const FILE_BYTES: u64 = 16 << 20;

/// A probe read this slow is a disk stall. Over the 135 repeats of the
/// calm runs of 2026-12-06 the probe's p99 was 0.07-0.95 ms (0.17 ms at the
/// median), and a system's own I/O does not queue in front of it (it reads
/// outside the throttle): 10 ms is the disk, or the host under it, not the
/// run.
pub const DISK_STALL: Duration = Duration::from_millis(10);

/// At most this many disk stalls are listed per repeat (all are counted).
pub const MAX_STALLS_LISTED: usize = 32;

/// One probe read in a repeat's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRead {
    /// When it ended, µs since the repeat's clients started.
    pub end_us: u64,
    /// How long it took, µs.
    pub latency_us: u32,
}

impl ProbeRead {
    /// When it was issued, µs since the repeat's clients started.
    pub fn start_us(&self) -> u64 {
        self.end_us.saturating_sub(u64::from(self.latency_us))
    }

    /// Whether it was a disk stall ([`DISK_STALL`] or more).
    pub fn is_stall(&self) -> bool {
        u128::from(self.latency_us) >= DISK_STALL.as_micros()
    }
}

/// One read: when it ended and how long it took.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    latency_us: u32,
}

struct Shared {
    stop: AtomicBool,
    /// The probe thread's id (0 until it runs).
    tid: AtomicU32,
    samples: Mutex<Vec<Sample>>,
    /// The first read error, if any (the thread stops there).
    error: Mutex<Option<String>>,
}

/// What the probe measured over one repeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeStats {
    /// Time between reads, ms.
    pub interval_ms: u64,
    /// Reads that ended in the window.
    pub reads: u64,
    /// Median read latency, µs.
    pub p50_us: u64,
    /// 99th percentile, µs (nearest rank).
    pub p99_us: u64,
    /// Slowest read, µs.
    pub max_us: u64,
    /// Reads that took 1 ms or more.
    pub reads_over_1ms: u64,
    /// Reads that took [`DISK_STALL`] or more: disk stalls.
    #[serde(default)]
    pub stall_reads: u64,
    /// The disk stalls, in time order, at most [`MAX_STALLS_LISTED`]: when
    /// each ended and how long it took, to set against the seconds in which
    /// the clients were slow.
    #[serde(default)]
    pub stalls: Vec<ProbeRead>,
    /// Whether the probe's reads bypassed the run's throttle (always for
    /// the emulated device; under a kernel device, when the thread could
    /// be kept out of the cgroup).
    pub outside_throttle: bool,
}

/// A running disk probe; dropping it stops the thread and removes the file.
pub struct DiskProbe {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    dir: PathBuf,
    interval: Duration,
}

impl std::fmt::Debug for DiskProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskProbe").field("dir", &self.dir).field("interval", &self.interval).finish()
    }
}

/// Makes the probe's file: [`FILE_BYTES`] of random bytes, synced, so that
/// every read has blocks on the disk to read.
fn make_file(path: &Path) -> Result<()> {
    let mut f = File::create(path).map_err(Error::io(format!("creating the disk probe's file {}", path.display())))?;
    let mut rng = Rng::new(0x5eed_d15c);
    let mut chunk = vec![0u8; 1 << 20];
    for _ in 0..FILE_BYTES / chunk.len() as u64 {
        for w in chunk.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.next_u64().to_le_bytes());
        }
        f.write_all(&chunk).map_err(Error::io(format!("writing {}", path.display())))?;
    }
    f.sync_all().map_err(Error::io(format!("syncing {}", path.display())))
}

/// The calling thread's id, from `/proc/thread-self` (`PID/task/TID`).
fn thread_id() -> u32 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

impl DiskProbe {
    /// Starts a probe that reads a file in a new directory under `parent`
    /// every `interval`, for at most `max`. Fails, naming the directory,
    /// where it is not on a disk (a tmpfs) or does not take direct I/O.
    pub fn start(parent: &Path, interval: Duration, max: Duration) -> Result<DiskProbe> {
        if interval.is_zero() {
            return Err(Error::Usage("--disk-probe: the interval must be above 0 (or the probe off)".into()));
        }
        if let Some(ty) = crate::kernel::fs_type(parent).filter(|t| t == "tmpfs" || t == "ramfs") {
            return Err(Error::Usage(format!(
                "--disk-probe: {} is on a {ty}, not a disk; put --data on a disk, or --disk-probe 0s",
                parent.display()
            )));
        }
        let dir = parent.join(format!("disk-probe-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let opened = (|| {
            let path = dir.join("probe.dat");
            make_file(&path)?;
            OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).map_err(|e| {
                Error::Usage(format!(
                    "--disk-probe: {} does not take direct I/O ({e}); put --data on a disk, or --disk-probe 0s",
                    dir.display()
                ))
            })
        })();
        let file = match opened {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            tid: AtomicU32::new(0),
            samples: Mutex::new(Vec::new()),
            error: Mutex::new(None),
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("disk-probe".into())
                .spawn(move || probe_loop(&file, &shared, interval, max))
                .map_err(Error::io("starting the disk probe's thread"))?
        };
        // The thread id is what a cgroup needs to keep it out; wait for it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while shared.tid.load(Ordering::Acquire) == 0 && Instant::now() < deadline && !thread.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(DiskProbe { shared, thread: Some(thread), dir, interval })
    }

    /// The probe thread's id (for [`crate::kernel::Cgroup::exempt_thread`]),
    /// or `None` if it could not be read.
    pub fn thread_id(&self) -> Option<u32> {
        Some(self.shared.tid.load(Ordering::Acquire)).filter(|&t| t != 0)
    }

    /// The directory holding the probe's file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The first read error, if the probe stopped on one.
    pub fn error(&self) -> Option<String> {
        self.shared.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The reads that ended in `[from, to)`, in time order, their times
    /// counted from `from`.
    pub fn reads(&self, from: Instant, to: Instant) -> Vec<ProbeRead> {
        let s = self.shared.samples.lock().unwrap_or_else(|p| p.into_inner());
        s.iter()
            .filter(|x| x.at >= from && x.at < to)
            .map(|x| ProbeRead { end_us: (x.at - from).as_micros() as u64, latency_us: x.latency_us })
            .collect()
    }

    /// What `reads` (from [`DiskProbe::reads`]) measured; `None` when there
    /// are none.
    pub fn stats_of(&self, reads: &[ProbeRead], outside_throttle: bool) -> Option<ProbeStats> {
        stats(reads, self.interval, outside_throttle)
    }
}

/// Nearest-rank percentiles of the reads' latencies, and their stalls.
fn stats(reads: &[ProbeRead], interval: Duration, outside_throttle: bool) -> Option<ProbeStats> {
    if reads.is_empty() {
        return None;
    }
    let mut lat: Vec<u32> = reads.iter().map(|r| r.latency_us).collect();
    lat.sort_unstable();
    let rank = |q: f64| lat[((q * lat.len() as f64).ceil() as usize).clamp(1, lat.len()) - 1] as u64;
    Some(ProbeStats {
        interval_ms: interval.as_millis() as u64,
        reads: lat.len() as u64,
        p50_us: rank(0.50),
        p99_us: rank(0.99),
        max_us: lat[lat.len() - 1] as u64,
        reads_over_1ms: lat.iter().filter(|&&l| l >= 1000).count() as u64,
        stall_reads: reads.iter().filter(|r| r.is_stall()).count() as u64,
        stalls: reads.iter().filter(|r| r.is_stall()).take(MAX_STALLS_LISTED).copied().collect(),
        outside_throttle,
    })
}

fn probe_loop(file: &File, shared: &Shared, interval: Duration, max: Duration) {
    shared.tid.store(thread_id(), Ordering::Release);
    // A buffer aligned for direct I/O, inside a larger allocation.
    let mut raw = vec![0u8; 2 * READ_BYTES];
    let at = raw.as_ptr().align_offset(READ_BYTES);
    let buf = &mut raw[at..at + READ_BYTES];
    let blocks = FILE_BYTES / READ_BYTES as u64;
    let mut rng = Rng::new(u64::from(std::process::id()));
    let start = Instant::now();
    let mut next = start;
    while !shared.stop.load(Ordering::Relaxed) && start.elapsed() < max {
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Behind (a slow read): the next read goes now, not in a burst.
            next = now;
        }
        let offset = rng.below(blocks) * READ_BYTES as u64;
        let t0 = Instant::now();
        let r = file.read_at(buf, offset);
        let end = Instant::now();
        match r {
            Ok(n) if n == READ_BYTES => {
                let latency_us = (end - t0).as_micros().min(u128::from(u32::MAX)) as u32;
                shared.samples.lock().unwrap_or_else(|p| p.into_inner()).push(Sample { at: end, latency_us });
            }
            other => {
                let why = match other {
                    Ok(n) => format!("a read at {offset} returned {n} bytes, not {READ_BYTES}"),
                    Err(e) => format!("a read at {offset} failed: {e}"),
                };
                *shared.error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                return;
            }
        }
    }
}

impl Drop for DiskProbe {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads 20 ms apart with the given latencies.
    fn reads(lat: &[u32]) -> Vec<ProbeRead> {
        lat.iter().enumerate().map(|(i, &l)| ProbeRead { end_us: (i as u64 + 1) * 20_000, latency_us: l }).collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u32> = (1..=200).rev().collect();
        let s = stats(&reads(&v), Duration::from_millis(20), true).unwrap();
        assert_eq!((s.reads, s.p50_us, s.p99_us, s.max_us), (200, 100, 198, 200));
        assert_eq!((s.reads_over_1ms, s.stall_reads), (0, 0));
        assert!(s.stalls.is_empty());
        let s = stats(&reads(&[1500, 10, 20]), Duration::from_millis(20), false).unwrap();
        assert_eq!((s.p50_us, s.p99_us, s.max_us, s.reads_over_1ms), (20, 1500, 1500, 1));
        assert!(stats(&[], Duration::from_millis(20), true).is_none());
    }

    /// Reads of 10 ms or more are stalls, listed in time order with when
    /// they ended; the list is bounded, the count is not.
    #[test]
    fn stalls_are_counted_and_listed_in_order() {
        let s = stats(&reads(&[80, 9_999, 10_000, 90, 60_673]), Duration::from_millis(20), true).unwrap();
        assert_eq!(s.stall_reads, 2);
        assert_eq!(
            s.stalls,
            vec![ProbeRead { end_us: 60_000, latency_us: 10_000 }, ProbeRead { end_us: 100_000, latency_us: 60_673 }]
        );
        assert_eq!(s.stalls[1].start_us(), 100_000 - 60_673);
        let many = vec![20_000u32; MAX_STALLS_LISTED + 5];
        let s = stats(&reads(&many), Duration::from_millis(20), true).unwrap();
        assert_eq!(s.stall_reads, (MAX_STALLS_LISTED + 5) as u64);
        assert_eq!(s.stalls.len(), MAX_STALLS_LISTED);
        assert_eq!(s.stalls[0].end_us, 20_000);
    }

    /// A real probe on the disk (under the crate's directory): it reads at
    /// its interval, its window holds what ended in it, and dropping it
    /// removes its file.
    #[test]
    fn a_probe_reads_at_its_interval_and_cleans_up() {
        let parent = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let probe = match DiskProbe::start(parent.path(), Duration::from_millis(5), Duration::from_secs(30)) {
            Ok(p) => p,
            Err(e) => {
                // Only a file system that is no disk, or without direct I/O, may refuse.
                assert!(e.to_string().contains("direct I/O") || e.to_string().contains("not a disk"), "{e}");
                eprintln!("skipped: {e}");
                return;
            }
        };
        assert!(probe.thread_id().is_some());
        assert!(probe.dir().join("probe.dat").exists());
        let from = Instant::now();
        std::thread::sleep(Duration::from_millis(500));
        let to = Instant::now();
        assert_eq!(probe.error(), None);
        let s = probe.stats_of(&probe.reads(from, to), true).expect("reads in 500 ms");
        // 100 ticks of 5 ms; a slow disk or a busy CPU makes fewer.
        assert!(s.reads >= 10 && s.reads <= 101, "{s:?}");
        assert!(s.p50_us <= s.p99_us && s.p99_us <= s.max_us && s.p50_us > 0, "{s:?}");
        // The same reads, timed from `from`, in order, inside the window.
        let r = probe.reads(from, to);
        assert_eq!(r.len() as u64, s.reads);
        assert!(r.windows(2).all(|w| w[0].end_us <= w[1].end_us), "{r:?}");
        assert!(r.iter().all(|x| x.end_us < (to - from).as_micros() as u64), "{r:?}");
        assert_eq!(r.iter().map(|x| u64::from(x.latency_us)).max(), Some(s.max_us));
        let later = probe.reads(to + Duration::from_secs(60), to + Duration::from_secs(61));
        assert!(probe.stats_of(&later, true).is_none());
        let dir = probe.dir().to_path_buf();
        drop(probe);
        assert!(!dir.exists(), "the probe's directory is left: {}", dir.display());
    }

    #[test]
    fn a_tmpfs_is_refused_by_name() {
        let Ok(shm) = tempfile::tempdir_in("/dev/shm") else { return };
        let e = DiskProbe::start(shm.path(), Duration::from_millis(20), Duration::from_secs(1)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("not a disk") && msg.contains("--disk-probe"), "{msg}");
        assert_eq!(std::fs::read_dir(shm.path()).unwrap().count(), 0, "the refused probe left files");
    }
}
