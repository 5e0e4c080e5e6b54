//! Device-level signals: the block I/O of a process from `/proc/<pid>/io`.

use std::time::Instant;

use serde::Serialize;

/// `read_bytes` and `write_bytes` of `/proc/<pid>/io`: bytes this process
/// caused to be fetched from or sent to the storage layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProcIo {
    /// Bytes read from storage.
    pub read_bytes: u64,
    /// Bytes written to storage.
    pub write_bytes: u64,
    /// Bytes passed to read(2) and friends.
    pub rchar: u64,
    /// Bytes passed to write(2) and friends.
    pub wchar: u64,
}

impl ProcIo {
    /// Reads `/proc/<pid>/io` (`None` for this process).
    pub fn read(pid: Option<u32>) -> Option<ProcIo> {
        let path = match pid {
            Some(p) => format!("/proc/{p}/io"),
            None => "/proc/self/io".to_owned(),
        };
        let text = std::fs::read_to_string(path).ok()?;
        let field = |name: &str| {
            text.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim_start_matches(':').trim().parse().ok())
        };
        Some(ProcIo {
            read_bytes: field("read_bytes")?,
            write_bytes: field("write_bytes")?,
            rchar: field("rchar")?,
            wchar: field("wchar")?,
        })
    }
}

/// Rates between two `/proc/<pid>/io` readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ProcIoRates {
    /// Storage reads, bytes/s.
    pub read_bps: f64,
    /// Storage writes, bytes/s.
    pub write_bps: f64,
    /// read(2) bytes/s.
    pub rchar_bps: f64,
    /// write(2) bytes/s.
    pub wchar_bps: f64,
}

/// Reads `/proc/<pid>/io` each cycle and turns it into rates.
#[derive(Debug)]
pub(crate) struct ProcIoSampler {
    pid: Option<u32>,
    last: Option<(Instant, ProcIo)>,
}

impl ProcIoSampler {
    pub(crate) fn new(pid: Option<u32>) -> Self {
        ProcIoSampler { pid, last: None }
    }

    pub(crate) fn sample(&mut self) -> Option<ProcIoRates> {
        let now = Instant::now();
        let cur = ProcIo::read(self.pid)?;
        let out = self.last.map(|(t, prev)| {
            let dt = (now - t).as_secs_f64().max(1e-9);
            let r = |a: u64, b: u64| a.saturating_sub(b) as f64 / dt;
            ProcIoRates {
                read_bps: r(cur.read_bytes, prev.read_bytes),
                write_bps: r(cur.write_bytes, prev.write_bytes),
                rchar_bps: r(cur.rchar, prev.rchar),
                wchar_bps: r(cur.wchar, prev.wchar),
            }
        });
        self.last = Some((now, cur));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let io = ProcIo::read(None).expect("/proc/self/io on Linux");
        std::fs::write(std::env::temp_dir().join("procio-probe"), vec![0u8; 4096]).unwrap();
        let after = ProcIo::read(None).unwrap();
        assert!(after.wchar >= io.wchar + 4096);
        let mut s = ProcIoSampler::new(None);
        assert!(s.sample().is_none());
        assert!(s.sample().is_some());
    }
}
