//! The `bench-ycsb` command line end to end, in a child process: a short
//! run of every system, then checks that the summary, time series and plots
//! exist and are well formed; bad input exits 2 naming what was wrong.
//!
//! The child is this test binary itself, re-run with the command line in an
//! environment variable: `bench_ycsb_child` then runs `bench_ycsb::cli::main`
//! (what the `bench-ycsb` binary runs) and exits with its status.

use std::process::Command;

const CHILD_ARGS: &str = "KV_SDS_BENCH_YCSB_ARGS";

/// The command line, when run as the child; a no-op otherwise.
#[test]
fn bench_ycsb_child() {
    let Ok(args) = std::env::var(CHILD_ARGS) else { return };
    let args = std::iter::once("bench-ycsb".to_owned()).chain(args.split('\n').map(str::to_owned));
    std::process::exit(i32::from(bench_ycsb::cli::main(args)));
}

/// A builder for one `bench-ycsb` command line run as a child process.
struct Bench {
    args: Vec<String>,
}

fn bench() -> Bench {
    Bench { args: Vec::new() }
}

impl Bench {
    fn arg(mut self, a: impl AsRef<std::ffi::OsStr>) -> Self {
        self.args.push(a.as_ref().to_string_lossy().into_owned());
        self
    }

    fn args<I: IntoIterator<Item = S>, S: AsRef<std::ffi::OsStr>>(mut self, args: I) -> Self {
        for a in args {
            self = self.arg(a);
        }
        self
    }

    fn command(&self) -> Command {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "bench_ycsb_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ARGS, self.args.join("\n"));
        c
    }

    fn status(&self) -> std::io::Result<std::process::ExitStatus> {
        self.command().status()
    }

    fn output(&self) -> std::io::Result<std::process::Output> {
        self.command().output()
    }
}

#[test]
fn a_short_run_produces_summary_series_and_plots() {
    let out = tempfile::tempdir().unwrap();
    let status = bench()
        .args([
            "run",
            "--recordcount",
            "5000",
            "--duration",
            "3s",
            "--profile",
            "constant:400",
            "--threads",
            "2",
            "--quiet",
        ])
        .arg("--out")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    let systems = summary["systems"].as_array().unwrap();
    let names: Vec<&str> = systems.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["rocksdb", "paio-passthrough", "paio-adaptive", "rocksdb-autotuned", "paio-silk", "paio-static"]
    );
    for s in systems {
        for key in ["throughput_ops", "p50_us", "p99_us", "p999_us"] {
            assert!(s[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {s}");
        }
        assert!(s["p50_us"].as_f64() <= s["p99_us"].as_f64() && s["p99_us"].as_f64() <= s["p999_us"].as_f64());
        for op in ["READ", "UPDATE"] {
            assert!(s["per_op"][op]["intended"]["p99_us"].as_u64().is_some(), "{op} in {}", s["name"]);
        }
        // About 400 ops/s for 3 s.
        let ops = s["operations"].as_u64().unwrap();
        assert!((1100..=1300).contains(&ops), "{ops}");
        assert!(!s["seconds"].as_array().unwrap().is_empty());
    }
    let csv = std::fs::read_to_string(out.path().join("timeseries.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("system,repeat,second,throughput_ops,p50_us,p99_us,p999_us"));
    assert!(lines.all(|l| l.split(',').count() == 7));
    for plot in ["throughput.svg", "p99.svg"] {
        let svg = std::fs::read_to_string(out.path().join(plot)).unwrap();
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"), "{plot}");
        assert_eq!(svg.matches("<polyline").count(), 6, "{plot}: one line per system");
        assert_well_formed(&svg, plot);
    }
    // Each run's end-of-run scrape, in the format promtool checks.
    for name in &names {
        let file = out.path().join(format!("metrics-{name}-1.prom"));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // On the emulated device every system's I/O passes a stage (plain
        // RocksDB's only counts); the paio systems run on rocks-env.
        assert!(text.contains("kvsds_context_file_bytes_total{"), "{name}: {text}");
        if name.starts_with("paio-") {
            assert!(text.contains("kvsds_rocksdb_l0_files{"), "{name}: {text}");
        }
        if ["paio-adaptive", "paio-silk"].contains(name) {
            assert!(text.contains("kvsds_controller_cycles_total{"), "{name}: {text}");
        }
        {
            let check = std::process::Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(std::fs::File::open(&file).unwrap())
                .output()
                .expect("promtool (scripts/setup.sh installs Debian's prometheus package)");
            let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
            assert!(check.status.success() && said.trim().is_empty(), "promtool on {}: {said}", file.display());
        }
    }
    let decisions = std::fs::read_to_string(out.path().join("decisions-paio-silk-1.jsonl")).unwrap();
    assert!(decisions.lines().count() > 100);
    for l in decisions.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["policy"], "silk");
    }

    // The default controller cycles every 10 ms while it watches and every
    // 100 ms while healthy and idle: at least 30 cycles in 3 s.
    let decisions = std::fs::read_to_string(out.path().join("decisions-paio-adaptive-1.jsonl")).unwrap();
    assert!(decisions.lines().count() >= 30, "{} cycles", decisions.lines().count());
    for l in decisions.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["policy"], "adaptive");
    }
    // Every system has the attribution of its slowest 1% and its debt.
    for s in systems {
        let a = &s["attribution"];
        assert_eq!(a["threshold_us"], s["p99_us"], "{}", s["name"]);
        assert_eq!(a["all"]["requests"], s["operations"], "{}", s["name"]);
        let slow = a["slowest"]["requests"].as_u64().unwrap();
        let ops = s["operations"].as_u64().unwrap();
        assert!(slow >= 1 && slow <= ops / 50, "{slow} of {ops} requests counted as the slowest 1%");
        // The quiet requests are some of all; their p99 is one of their
        // latencies, so 0 exactly when there are none.
        let quiet = a["quiet_requests"].as_u64().unwrap();
        let quiet_p99 = a["quiet_p99_us"].as_u64().unwrap();
        assert!(quiet <= ops, "{quiet} quiet of {ops}");
        assert_eq!(quiet == 0, quiet_p99 == 0, "{a}");
        // Every system's options enable RocksDB's statistics: the clients'
        // reads looked data blocks up in the block cache, second by second.
        let lookups: u64 = a["seconds"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|x| x["cache"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()))
            .sum();
        assert!(lookups > 0, "{}: no block cache lookups in {a}", s["name"]);
        let share = a["all"]["cache_miss_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{share}");
        // On the emulated device every system runs through a stage: the
        // classes sum to the bytes per context the stage counted meanwhile.
        assert_eq!(a["staged"], true);
        let classes: u64 = a["run_class_bytes"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
        let contexts: u64 = s["run_context_bytes"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(classes, contexts, "{}: {a}", s["name"]);
        assert!(contexts > 1_000_000, "{}: 600 updates of 1 KB at least: {contexts}", s["name"]);
        let d = &s["debt"];
        for key in ["pending_compaction_bytes", "l0_files", "immutable_memtables", "score_bytes"] {
            assert!(d[key].as_f64().is_some(), "{key} in {d}");
        }
        assert!(d["drain_ms"].as_u64().is_some(), "a 5,000-record DB drains within a minute: {d}");
    }
    let o = bench().arg("report").arg(out.path()).output().unwrap();
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(table.contains("end-of-run debt") && table.contains("slowest 1%"), "{table}");

    // `report` re-makes the table and plots from summary.json.
    std::fs::remove_file(out.path().join("p99.svg")).unwrap();
    let o = bench().arg("report").arg(out.path()).output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("paio-silk"));
    assert!(out.path().join("p99.svg").exists());
}

#[test]
fn bad_input_is_an_error_naming_what_was_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let props = dir.path().join("w.properties");
    std::fs::write(&props, "readproportion=2\n").unwrap();
    let o = bench().args(["run", "--workload"]).arg(&props).arg("--out").arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("readproportion"));
    let o = bench().args(["run", "--systems", "rocksdb,magic"]).arg("--out").arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("magic"));
    let o = bench().args(["run", "--profile", "silk:peak=5"]).arg("--out").arg(dir.path()).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("low"));
    for (device, words) in
        [("kernel:wbps=-1", "wbps: "), ("kernel:rbps=12XB", "rbps: "), ("kernel:rbps=1M,wbsp=2M", "wbsp: unknown key")]
    {
        let o = bench().args(["run", "--device", device]).arg("--out").arg(dir.path()).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{device}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(words), "{device}: {err}");
    }
    // A data directory the kernel cannot throttle is refused before loading.
    if kernel_throttle_available().is_ok() && std::fs::metadata("/dev/shm").is_ok() {
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let o = bench()
            .args(["run", "--device", "kernel:wbps=8MiB", "--data"])
            .arg(shm.path())
            .arg("--out")
            .arg(dir.path())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("tmpfs") && !err.contains("loading"), "{err}");
    }
}

/// `pool` over stored runs of one command prints and writes the pooled
/// table; runs of different commands, or a baseline a run lacks, exit 2
/// naming the directory and what differs.
#[test]
fn pool_pools_runs_of_one_command_and_refuses_others() {
    let results = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let calm = ["calm-light-kernel-2026-12-06k", "calm-light-kernel-2026-12-06l", "calm-light-kernel-2026-12-06m"]
        .map(|d| results.join(d));
    let out = tempfile::tempdir().unwrap();
    let o = bench().arg("pool").args(&calm).args(["--target", "1.1", "--out"]).arg(out.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("pooled: 3 runs") && stdout.contains("paio-adaptive"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("pool.json")).unwrap()).unwrap();
    let default = json["systems"].as_array().unwrap().iter().find(|s| s["name"] == "paio-adaptive").unwrap();
    assert_eq!(default["repeats"], 15);
    assert_eq!(default["paired_p99"]["pairs"], 15);
    assert_eq!(default["run_p99_ratios"].as_array().unwrap().len(), 3);
    assert!(default["paired_p99"]["interval"].is_array(), "3 runs: an interval");
    // pool.txt is the table printed.
    let txt = std::fs::read_to_string(out.path().join("pool.txt")).unwrap();
    assert!(txt.starts_with("pooled: 3 runs") && stdout.contains(&txt), "{txt}");
    // A calm run with the default's mechanisms off is another command.
    let off = results.join("calm-light-kernel-2026-12-07-mechanisms-off/first");
    let o = bench().arg("pool").arg(&calm[0]).arg(&off).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("mechanisms-off/first") && err.contains("config."), "{err}");
    let o = bench().arg("pool").arg(&calm[0]).args(["--baseline", "paio-static"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("paio-static"));
}

/// Whether this machine can throttle a disk with a cgroup: root, and
/// cgroup v1 blkio or v2 with the io controller. `Err` says what is missing.
fn kernel_throttle_available() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2));
    if uid != Some("0") {
        return Err("not root".into());
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let v1 = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "blkio")
    });
    let v2 = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2
            && f[2] == "cgroup2"
            && std::fs::read_to_string(format!("{}/cgroup.controllers", f[1]))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
    });
    if v1 || v2 { Ok(()) } else { Err("no cgroup v1 blkio or v2 io controller mounted".into()) }
}

/// The cgroups a process of this pid made, by name, under every I/O
/// controller mount.
fn cgroups_of(pid: u32) -> Vec<String> {
    let prefix = format!("kvsds-bench-{pid}-");
    ["/sys/fs/cgroup/blkio", "/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// An output directory on the disk (not a tmpfs) for a kernel-device test,
/// or `None` (with the reason printed) where the facility is missing.
fn kernel_test_dir() -> Option<tempfile::TempDir> {
    if let Err(why) = kernel_throttle_available() {
        eprintln!("skipped: the kernel device needs root and a cgroup I/O controller: {why}");
        return None;
    }
    Some(tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap())
}

/// Starts `bench-ycsb run` on a kernel device in a child process, with
/// 2 clients, 20,000 records, quiet, its output in `out` (on the disk),
/// and `args` (device, systems, workload, duration, profile).
fn spawn_kernel_run(out: &std::path::Path, args: &[&str]) -> std::process::Child {
    bench()
        .args(["run", "--recordcount", "20000", "--threads", "2", "--quiet"])
        .args(args)
        .arg("--out")
        .arg(out)
        .command()
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_kernel_device_run_is_charged_and_leaves_no_cgroup() {
    let Some(out) = kernel_test_dir() else { return };
    let mut child = spawn_kernel_run(
        out.path(),
        &[
            "--device",
            "kernel:rbps=64MiB,wbps=32MiB",
            "--systems",
            "rocksdb,passthrough,paio-silk",
            "--workload",
            "write-heavy",
            "--duration",
            "5s",
            "--profile",
            "constant:4000",
        ],
    );
    let pid = child.id();
    // While it runs, each system's cgroup appears (one at a time).
    let mut seen: Vec<String> = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let status = loop {
        for n in cgroups_of(pid) {
            if !seen.contains(&n) {
                seen.push(n);
            }
        }
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "the kernel-device run did not end in 300 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stdout = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    assert!(status.success(), "{stdout}");
    seen.sort();
    assert_eq!(
        seen,
        [
            format!("kvsds-bench-{pid}-paio-passthrough-1"),
            format!("kvsds-bench-{pid}-paio-silk-1"),
            format!("kvsds-bench-{pid}-rocksdb-1")
        ],
        "one cgroup per system run"
    );
    assert!(cgroups_of(pid).is_empty(), "cgroups left behind: {:?}", cgroups_of(pid));
    assert!(stdout.contains("kernel w") && stdout.contains("cgroup"), "{stdout}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    assert!(summary["device"].as_str().unwrap().contains("kernel-throttled"));
    // The default controller's settings on this device: 7/8 of each
    // direction's limit, background requests in 64 KiB pieces.
    let config = &summary["config"];
    assert_eq!(config["adaptive"]["read_bandwidth"], "56MiB/s", "{config}");
    assert_eq!(config["adaptive"]["write_bandwidth"], "28MiB/s", "{config}");
    assert_eq!(config["max_background_request"], 65536, "{config}");
    assert_eq!(config["delete_piece"], 1 << 20, "{config}");
    let systems = summary["systems"].as_array().unwrap();
    let names: Vec<&str> = systems.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["rocksdb", "paio-passthrough", "paio-silk"], "the alias names the pass-through system");
    for (s, source) in systems.iter().zip(["rocksdb-statistics", "stage", "stage"]) {
        let check = &s["byte_check"];
        assert_eq!(check["seen"]["source"], source, "{s}");
        let charged = check["charged"]["write_bytes"].as_u64().unwrap();
        let seen = check["seen"]["write_bytes"].as_u64().unwrap();
        // 90% of 4000 ops/s for 5 s are 1 KB updates: about 18 MB of WAL,
        // a flush; the kernel charged most of it to the cgroup.
        assert!(seen > 10_000_000, "{check}");
        assert!(charged > seen / 2, "the kernel charged {charged} of {seen} written bytes: {check}");
        let ratio = check["write_ratio"].as_f64().unwrap();
        assert!((ratio - charged as f64 / seen as f64).abs() < 1e-9);
        assert_eq!(check["low"].as_bool().unwrap(), ratio < 0.9);
        // The attribution saw the kernel's counters; plain RocksDB has no
        // stage, the others' classes sum to what their stage counted.
        let a = &s["attribution"];
        assert_eq!(a["staged"], source == "stage", "{a}");
        assert!(a["all"]["charged_bps"][1].as_f64().unwrap() > 0.0, "{a}");
        let classes: u64 = a["run_class_bytes"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).sum();
        let contexts: u64 = s["run_context_bytes"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(classes, contexts, "{a}");
        assert_eq!(classes > 0, source == "stage");
        assert!(s["debt"]["drain_timeout_ms"].as_u64().is_some());
        // The disk probe read every 20 ms of the 5 s clock, kept out of the
        // cgroup (this machine has cgroup v1); it was never charged there.
        let p = &s["disk_probe"];
        assert_eq!(p["interval_ms"], 20, "{p}");
        assert_eq!(p["outside_throttle"], cgroup_v1(), "{p}");
        let reads = p["reads"].as_u64().unwrap();
        assert!((100..=260).contains(&reads), "{p}");
        let (p50, p99, max) =
            (p["p50_us"].as_u64().unwrap(), p["p99_us"].as_u64().unwrap(), p["max_us"].as_u64().unwrap());
        assert!(0 < p50 && p50 <= p99 && p99 <= max, "{p}");
        // The attribution set the requests against the same reads: its
        // seconds' slowest probe reads top out at the probe's max, and
        // the listed stalls are the reads of 10 ms or more.
        assert_eq!(a["disk_reads"].as_u64(), Some(reads), "{a}");
        let seconds_max = a["seconds"].as_array().unwrap().iter().map(|x| x["disk_max_us"].as_u64().unwrap()).max();
        assert_eq!(seconds_max, Some(max), "{a}");
        let stalls = p["stalls"].as_array().unwrap();
        assert_eq!(p["stall_reads"].as_u64(), Some(stalls.len() as u64), "{p}");
        assert!(stalls.iter().all(|x| x["latency_us"].as_u64().unwrap() >= 10_000), "{p}");
        assert_eq!(max >= 10_000, !stalls.is_empty(), "{p}");
        // At 4,000 requests/s every stall (10 ms or more) overlaps some.
        let (slowest, all) =
            (a["slowest"]["with_disk_stall"].as_f64().unwrap(), a["all"]["with_disk_stall"].as_f64().unwrap());
        assert!((0.0..=1.0).contains(&slowest) && (0.0..=1.0).contains(&all), "{a}");
        assert_eq!(all > 0.0, !stalls.is_empty(), "{a}");
        assert!(slowest == 0.0 || all > 0.0, "{a}");
    }
    assert!(stdout.contains("disk probe: a 4 KiB direct read") && stdout.contains("worst second"), "{stdout}");
    let data = out.path().join("data");
    let probes: Vec<_> = std::fs::read_dir(&data)
        .map(|d| d.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with("disk-probe")).collect())
        .unwrap_or_default();
    assert!(probes.is_empty(), "the disk probe's file was left: {probes:?}");
}

/// Whether the bench's cgroups here are v1's blkio (which moves single
/// threads, so the disk probe can stay out of the throttle): as
/// `bench_ycsb::kernel` chooses, v2 wherever its `io` controller is there.
fn cgroup_v1() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    !mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2
            && f[2] == "cgroup2"
            && std::fs::read_to_string(format!("{}/cgroup.controllers", f[1]))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
    })
}

/// A small well-formedness check for the SVGs we write: every tag closes,
/// in order, attributes are quoted, text has no stray `<` or `&`.
fn assert_well_formed(xml: &str, what: &str) {
    let mut stack: Vec<&str> = Vec::new();
    let mut rest = xml;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(!text.contains('>'), "{what}: stray '>' in text {text:?}");
        for (i, _) in text.match_indices('&') {
            let entity = &text[i..];
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#"].iter().any(|e| entity.starts_with(e)),
                "{what}: bare '&' in text"
            );
        }
        let close = rest[open..].find('>').unwrap_or_else(|| panic!("{what}: unclosed '<'")) + open;
        let tag = &rest[open + 1..close];
        assert!(!tag.contains('<'), "{what}: '<' inside tag {tag:?}");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "{what}: mismatched </{name}>");
        } else if !tag.starts_with('?') && !tag.starts_with('!') {
            let name = tag.split_whitespace().next().unwrap_or("").trim_end_matches('/');
            assert!(!name.is_empty(), "{what}: empty tag");
            assert_eq!(tag.matches('"').count() % 2, 0, "{what}: unbalanced quotes in <{tag}>");
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &rest[close + 1..];
    }
    assert!(rest.trim().is_empty(), "{what}: text after the root element");
    assert!(stack.is_empty(), "{what}: unclosed elements {stack:?}");
}

#[test]
fn figures_runs_every_workload_and_start_and_writes_one_page() {
    let out = tempfile::tempdir().unwrap();
    let o = bench()
        .args([
            "figures",
            "--workloads",
            "mixture,write-heavy",
            "--starts",
            "cold,warm",
            "--systems",
            "rocksdb,paio-silk",
            "--repeats",
            "1",
            "--recordcount",
            "5000",
            "--duration",
            "3s",
            "--profile",
            "constant:400",
            "--threads",
            "2",
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // Not a terminal: progress is a line per phase, never a redrawn bar.
    assert!(!stderr.contains('\r'), "{stderr}");
    assert!(stderr.lines().count() < 40, "{stderr}");
    assert!(stderr.contains("write-heavy paio-silk #1: settling"), "{stderr}");
    let md = std::fs::read_to_string(out.path().join("figures.md")).unwrap();
    for (workload, start) in
        [("mixture", "cold"), ("mixture", "warm"), ("write-heavy", "cold"), ("write-heavy", "warm")]
    {
        assert!(md.contains(&format!("## {workload} ({start} start)")), "{md}");
        let dir = out.path().join(format!("{workload}-{start}"));
        for f in ["summary.json", "table.txt", "throughput.svg", "p99.svg"] {
            assert!(dir.join(f).exists(), "{}/{f}", dir.display());
        }
        assert!(md.contains(&format!("({workload}-{start}/p99.svg)")), "{md}");
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["start"], start);
        for s in summary["systems"].as_array().unwrap() {
            assert_eq!(s["settle_ms"].is_u64(), start == "warm", "{}", s["name"]);
            assert_eq!(s["phases"][0]["phase"], "constant");
            assert!(s["windows"].as_array().is_some_and(|w| !w.is_empty()));
        }
    }
    assert!(md.contains("| paio-silk |") && md.contains("Machine:"), "{md}");
    // The data copies and loaded bases are gone.
    assert!(!out.path().join("data").exists());
}

/// Ctrl-C during a kernel-device run: the process exits 130, and its
/// cgroup and data copies are gone.
#[test]
fn an_interrupted_kernel_device_run_removes_its_cgroup_and_data() {
    let Some(out) = kernel_test_dir() else { return };
    let mut child = spawn_kernel_run(
        out.path(),
        &["--device", "kernel:wbps=16MiB", "--systems", "paio-silk", "--duration", "60s", "--profile", "constant:500"],
    );
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while cgroups_of(pid).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its cgroup appeared");
        assert!(std::time::Instant::now() < deadline, "no cgroup within 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Let it get into the run, then interrupt it.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let kill = Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap();
    assert!(kill.success());
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the interrupted run did not exit");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(cgroups_of(pid).is_empty(), "cgroups left behind: {:?}", cgroups_of(pid));
    let data = out.path().join("data");
    let left: Vec<_> =
        std::fs::read_dir(&data).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "data left behind: {left:?}");
}
