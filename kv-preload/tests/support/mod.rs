//! Running real fio under the preload library (or in a blkio cgroup), for
//! the tests and the `fio_compare` example. Everything a run creates (temp
//! dirs, cgroups) is removed when its guard drops, also on failure.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use kv_stage::iomax::DeviceNumber;

/// `target/<profile>`: the directory of the running test or example's
/// profile (tests live in `deps/`, examples in `examples/`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps" | "examples") => dir.parent().unwrap().to_owned(),
        _ => dir.to_owned(),
    }
}

/// The preload library, built for this profile. Cargo does not build a
/// `cdylib` for the tests or examples of its own package (they cannot link
/// it), so the first call runs `cargo build --lib` into the same target
/// directory (fresh in a second when it is up to date).
pub fn library() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = profile_dir();
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "--lib", "-p", "kv-preload", "--target-dir"])
                .arg(dir.parent().expect("target dir"))
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("run cargo build for the preload library");
            assert!(status.success(), "cargo build -p kv-preload --lib: {status}");
            let p = dir.join("libkv_preload.so");
            assert!(p.exists(), "{} missing after the build", p.display());
            p
        })
        .clone()
}

/// Held by each test for its whole run: fio runs one test at a time, so
/// the tests do not share the two cores (or the disk) with each other.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// fio's path; a clear failure when it is missing (scripts/setup.sh installs it).
pub fn fio() -> PathBuf {
    for d in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let p = Path::new(d).join("fio");
        if p.exists() {
            return p;
        }
    }
    panic!("fio is not installed (apt-get install fio; scripts/setup.sh does it)")
}

/// A scratch directory on a real disk (O_DIRECT needs one; /dev/shm will
/// not do), removed on drop.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("kvsds-fio-").tempdir_in(std::env::temp_dir()).expect("temp dir")
}

/// Writes `mib` MiB of non-zero data and syncs it, so direct reads hit the
/// device (a hole would be read without any I/O).
pub fn data_file(path: &Path, mib: usize) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = File::create(path).unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 1) as u8).collect();
    for _ in 0..mib {
        f.write_all(&block).unwrap();
    }
    f.sync_all().unwrap();
}

/// One fio job.
#[derive(Clone, Debug)]
pub struct Job {
    pub name: String,
    pub file: PathBuf,
    /// `write`, `read`, `randread`, ...
    pub rw: &'static str,
    pub bs: &'static str,
    pub direct: bool,
    pub size_mib: usize,
}

impl Job {
    pub fn new(name: &str, file: &Path, rw: &'static str, bs: &'static str, direct: bool) -> Job {
        Job { name: name.into(), file: file.to_owned(), rw, bs, direct, size_mib: 64 }
    }

    fn args(&self) -> Vec<String> {
        vec![
            format!("--name={}", self.name),
            format!("--filename={}", self.file.display()),
            format!("--size={}M", self.size_mib),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--direct={}", u8::from(self.direct)),
            // Buffered jobs read what the page cache holds (fio would drop it first).
            format!("--invalidate={}", u8::from(self.direct)),
            "--ioengine=psync".into(),
        ]
    }
}

/// What fio measured for one job, in the direction it did.
#[derive(Clone, Debug)]
pub struct Measured {
    pub name: String,
    pub bw_bytes: f64,
    pub iops: f64,
    pub clat_p50_us: f64,
    pub clat_p99_us: f64,
    /// The per-second bandwidth log (KiB/s), when asked for.
    pub per_second_kib: Vec<f64>,
    /// What fio (and the library) wrote to stderr.
    pub stderr: String,
}

/// How fio is run.
pub enum Under<'a> {
    /// Plain.
    Nothing,
    /// With the preload library and this rules file.
    Preload(&'a Path),
    /// In this blkio cgroup.
    Cgroup(&'a BlkioCgroup),
}

/// Runs the jobs at once for `runtime`, returns one result per job.
/// `bw_log` asks for a per-second bandwidth log in that directory.
pub fn run(jobs: &[Job], runtime: Duration, under: Under<'_>, bw_log: Option<&Path>) -> Vec<Measured> {
    run_with(jobs, runtime, under, bw_log, |_| {})
}

/// [`run`], calling `started` with fio's pid once fio is spawned (after the
/// `sync` before it, which on a fresh machine can take longer than a whole
/// run).
pub fn run_with(
    jobs: &[Job],
    runtime: Duration,
    under: Under<'_>,
    bw_log: Option<&Path>,
    started: impl FnOnce(u32),
) -> Vec<Measured> {
    let mut args: Vec<String> = vec![
        "--output-format=json".into(),
        "--time_based".into(),
        format!("--runtime={}ms", runtime.as_millis()),
        // Each job its own process (fio's default), all started together.
    ];
    if let Some(dir) = bw_log {
        args.push(format!("--write_bw_log={}", dir.join("fio").display()));
        args.push("--log_avg_msec=1000".into());
    }
    // Options after a --name belong to that job.
    for j in jobs {
        args.extend(j.args());
    }
    // A fresh machine has gigabytes of build output to write back, and the
    // direct writes measured here would wait behind it (a CI run saw both
    // volumes at 40% of their limits in the same second): flush it first.
    let _ = Command::new("sync").status();
    let mut cmd = match &under {
        Under::Cgroup(cg) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(format!("echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"", cg.path.display()));
            c.arg(fio());
            c
        }
        _ => Command::new(fio()),
    };
    cmd.args(&args).stdin(Stdio::null()).env_remove("LD_PRELOAD").env_remove("KVSDS_RULES");
    if let Under::Preload(rules) = under {
        cmd.env("LD_PRELOAD", library()).env("KVSDS_RULES", rules);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run fio");
    started(child.id());
    let out = child.wait_with_output().expect("wait for fio");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "fio failed ({}): {stderr}\n{stdout}", out.status);
    // fio may print notes before the JSON.
    let json = &stdout[stdout.find('{').unwrap_or_else(|| panic!("no JSON from fio: {stdout} {stderr}"))..];
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("fio JSON: {e}: {json}"));
    let results = v["jobs"].as_array().expect("jobs");
    jobs.iter()
        .enumerate()
        .map(|(i, j)| {
            let r = &results[i];
            assert_eq!(r["jobname"].as_str(), Some(j.name.as_str()));
            let dir = if j.rw.contains("write") { "write" } else { "read" };
            let d = &r[dir];
            let pct = |p: &str| d["clat_ns"]["percentile"][p].as_f64().unwrap_or(f64::NAN) / 1000.0;
            let per_second_kib =
                bw_log.map(|dir| read_bw_log(&dir.join(format!("fio_bw.{}.log", i + 1)))).unwrap_or_default();
            Measured {
                name: j.name.clone(),
                bw_bytes: d["bw_bytes"].as_f64().unwrap_or(0.0),
                iops: d["iops"].as_f64().unwrap_or(0.0),
                clat_p50_us: pct("50.000000"),
                clat_p99_us: pct("99.000000"),
                per_second_kib,
                stderr: stderr.clone().into_owned(),
            }
        })
        .collect()
}

fn read_bw_log(path: &Path) -> Vec<f64> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().filter_map(|l| l.split(',').nth(1)?.trim().parse().ok()).collect()
}

/// A cgroup v1 blkio child with throttle limits, removed on drop.
pub struct BlkioCgroup {
    pub path: PathBuf,
}

impl BlkioCgroup {
    /// Creates it with `file = "MAJ:MIN value"` lines, e.g.
    /// `("blkio.throttle.write_bps_device", 4194304)`.
    pub fn new(name: &str, device: DeviceNumber, limits: &[(&str, u64)]) -> std::io::Result<BlkioCgroup> {
        let path = Path::new("/sys/fs/cgroup/blkio").join(format!("{name}-{}", std::process::id()));
        fs::create_dir(&path)?;
        let cg = BlkioCgroup { path };
        for (file, v) in limits {
            fs::write(cg.path.join(file), format!("{device} {v}\n"))?;
        }
        Ok(cg)
    }
}

impl Drop for BlkioCgroup {
    fn drop(&mut self) {
        // Its processes have exited (fio was waited for); retry briefly.
        for _ in 0..50 {
            if fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.path.display());
    }
}

/// The block device under `path` (its whole disk, for the throttle).
pub fn device_of(path: &Path) -> DeviceNumber {
    let dev = DeviceNumber::of_dev(fs::metadata(path).unwrap().dev());
    let sys = PathBuf::from(format!("/sys/dev/block/{dev}"));
    if sys.join("partition").exists()
        && let Ok(parent) = fs::read_to_string(sys.join("../dev"))
    {
        return parent.parse().unwrap();
    }
    dev
}

/// Writes a rules file atomically (write then rename), so a reader never
/// sees half of it.
pub fn write_rules(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// `[[volumes]]` tables: (name, path, io.max limits).
pub fn volumes(v: &[(&str, &Path, &str)]) -> String {
    v.iter()
        .map(|(n, p, l)| format!("[[volumes]]\nname = \"{n}\"\npath = \"{}\"\nlimits = \"{l}\"\n\n", p.display()))
        .collect()
}

/// Waits until fio (`pid`) has `jobs` job processes that have each sent at
/// least `bytes` to storage (their `write_bytes` in `/proc`), or `limit`
/// passes; returns whether they did. fio's own clock starts in the job
/// processes, after a set-up that a fresh machine has seen take over 3 s.
pub fn wait_for_job_writes(pid: u32, jobs: usize, bytes: u64, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    let written = |child: &str| -> u64 {
        let io = fs::read_to_string(format!("/proc/{child}/io")).unwrap_or_default();
        io.lines().find_map(|l| l.strip_prefix("write_bytes: ")?.trim().parse().ok()).unwrap_or(0)
    };
    while std::time::Instant::now() < deadline {
        let children = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let started = children.split_whitespace().filter(|c| written(c) >= bytes).count();
        if started >= jobs {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Writes a rules file atomically and returns when, in Unix seconds.
pub fn write_rules_at(path: &Path, text: &str) -> f64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    write_rules(path, text);
    t
}

/// The Unix times the library reported applying reloaded limits.
pub fn applied_times(stderr: &str) -> Vec<f64> {
    stderr.lines().filter_map(|l| l.split("(applied at unix time ").nth(1)?.split(' ').next()?.parse().ok()).collect()
}

/// Relative error of `got` against `want`, in percent.
pub fn err_pct(got: f64, want: f64) -> f64 {
    (got - want) / want * 100.0
}
