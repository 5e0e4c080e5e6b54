//! A fleet in real processes on one machine: three `tenant` processes (each
//! a RocksDB behind a stage, a client load and an agent on a Unix socket)
//! and one `kvsds-controller` process running max-min over 3 MiB/s of
//! client I/O. Shares are checked in the controller's decision log; a tenant
//! is killed with SIGKILL and restarted; the controller is killed (every
//! stage must fall back within its lease) and restarted.
//!
//! Every process is bounded (`--duration`) and killed when the test ends,
//! also on failure; sockets and databases live in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod support;

use kv_remote::{ClientOptions, Connector, Endpoint};
use kv_stage::ObjectSpec;
use support::tenant_exe;

const MIB: f64 = 1048576.0;
const INTERVAL_MS: u64 = 300;
const LEASE_MS: u64 = 900;
/// Max-min shares of 3 MiB/s: t1 asks for 0.5 MiB/s, t2 and t3 for all
/// they can get.
const SHARES: [(&str, f64); 3] = [("t1", 0.5 * MIB), ("t2", 1.25 * MIB), ("t3", 1.25 * MIB)];
const SHARES_WITHOUT_T2: [(&str, f64); 2] = [("t1", 0.5 * MIB), ("t3", 2.5 * MIB)];

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The processes of a run, killed (and reaped) when it ends.
#[derive(Default)]
struct Procs(Vec<(String, Child)>);

impl Procs {
    fn kill(&mut self, name: &str) {
        if let Some(i) = self.0.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.0.remove(i);
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Run {
    dir: tempfile::TempDir,
    procs: Procs,
}

impl Run {
    fn socket(&self, tenant: &str) -> PathBuf {
        self.dir.path().join(format!("{tenant}.sock"))
    }
    fn log(&self) -> PathBuf {
        self.dir.path().join("decisions.jsonl")
    }

    fn start_tenant(&mut self, name: &str) {
        let _ = std::fs::remove_file(self.socket(name));
        let out = std::fs::File::create(self.dir.path().join(format!("{name}.out"))).unwrap();
        let err = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.err")))
            .unwrap();
        // Its database lives in the run's directory (a SIGKILLed tenant
        // cannot remove a temporary one of its own).
        let db = self.dir.path().join(format!("{name}-db-{}", unix_ms()));
        let child = Command::new(tenant_exe())
            // A memtable larger than the run writes (t3 writes at most
            // 2.5 MiB/s for about 15 s): no flush, so the load never waits
            // behind a disk that a fresh machine is still writing its
            // build back to.
            .args(["--name", name, "--duration", "60s", "--records", "2000", "--write-buffer", "128MiB", "--listen"])
            .arg(format!("unix:{}", self.socket(name).display()))
            .arg("--db")
            .arg(db)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        self.procs.0.push((name.to_owned(), child));
    }

    /// Waits for a tenant's agent to listen; returns when it did.
    fn wait_listening(&self, name: &str) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(self.socket(name)).is_err() {
            assert!(Instant::now() < deadline, "{name} never listened: {}", self.stderr(name));
            std::thread::sleep(Duration::from_millis(10));
        }
        unix_ms()
    }

    fn stderr(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.err"))).unwrap_or_default()
    }

    fn start_controller(&mut self) {
        let cfg = self.dir.path().join("fleet.toml");
        let stage =
            |t: &str| format!("[[fleet.stage]]\nname = \"{t}\"\nendpoint = \"unix:{}\"\n", self.socket(t).display());
        let inst = |t: &str, demand: &str| {
            format!(
                "[[fair_share.instance]]\nname = \"{t}\"\ndemand = \"{demand}\"\nchannel = \"foreground\"\nobject = \"drl\"\n"
            )
        };
        std::fs::write(
            &cfg,
            format!(
                "policy = \"max_min\"\ninterval = \"{INTERVAL_MS}ms\"\nlog = \"{}\"\n\n[fair_share]\ndevice_bandwidth = \"3MiB/s\"\n{}{}{}\n[fleet]\nlease = \"{LEASE_MS}ms\"\nreconnect_min = \"50ms\"\nreconnect_max = \"300ms\"\n{}{}{}",
                self.log().display(),
                inst("t1", "512KiB/s"),
                inst("t2", "unlimited"),
                inst("t3", "unlimited"),
                stage("t1"),
                stage("t2"),
                stage("t3"),
            ),
        )
        .unwrap();
        let err =
            std::fs::File::options().create(true).append(true).open(self.dir.path().join("controller.err")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kvsds-controller"))
            .arg("--config")
            .arg(&cfg)
            .args(["--duration", "60s"])
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        self.procs.0.push(("controller".into(), child));
    }

    fn records(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Records of cycles that started after `t` (unix ms), waiting until
    /// there are at least `n`.
    fn cycles_after(&self, t: u64, n: usize) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r: Vec<_> = self.records().into_iter().filter(|r| r["unix_ms"].as_u64().unwrap() > t).collect();
            if r.len() >= n {
                return r;
            }
            assert!(Instant::now() < deadline, "only {} cycles after {t}: {}", r.len(), self.diagnostics());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn diagnostics(&self) -> String {
        let mut s = format!(
            "controller: {}",
            std::fs::read_to_string(self.dir.path().join("controller.err")).unwrap_or_default()
        );
        for t in ["t1", "t2", "t3"] {
            s += &format!("\n{t}: {}", self.stderr(t));
        }
        s
    }
}

/// The limit a record set for `tenant` (bytes/s), and the usage it saw.
fn limit(r: &serde_json::Value, tenant: &str) -> Option<f64> {
    r["settings"].as_array()?.iter().find(|s| s["instance"] == tenant && s["error"].is_null())?["rate_bps"].as_f64()
}

fn usage(r: &serde_json::Value, tenant: &str) -> Option<f64> {
    r["notes"]["instances"].as_array()?.iter().find(|n| n["instance"] == tenant)?["usage_bps"].as_f64()
}

fn within(v: Option<f64>, want: f64, tolerance: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() <= want * tolerance)
}

/// Whether a record's limits are all within 5% of `shares`, for exactly
/// the shares' tenants.
fn at_shares(r: &serde_json::Value, shares: &[(&str, f64)]) -> bool {
    let n = r["settings"].as_array().map_or(0, Vec::len);
    n == shares.len() && shares.iter().all(|(t, s)| within(limit(r, t), *s, 0.05))
}

/// The first of `records` from which every record's limits stay within 5%
/// of `shares` to the end; its position (1-based).
fn converged_at(records: &[serde_json::Value], shares: &[(&str, f64)]) -> Option<usize> {
    let last_off = records.iter().rposition(|r| !at_shares(r, shares));
    match last_off {
        None => Some(1),
        Some(i) if i + 1 < records.len() => Some(i + 2),
        Some(_) => None,
    }
}

/// Limits (MiB/s) per cycle, each with the usage the cycle saw in
/// brackets, for messages.
fn limits(records: &[serde_json::Value]) -> String {
    records
        .iter()
        .map(|r| {
            let l: Vec<String> = ["t1", "t2", "t3"]
                .iter()
                .map(|t| {
                    let u = usage(r, t).map_or("-".into(), |u| format!("{:.3}", u / MIB));
                    limit(r, t).map_or("-".into(), |v| format!("{:.3} [{u}]", v / MIB))
                })
                .collect();
            format!("cycle {}: {}", r["cycle"], l.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn drl_rate(c: &Connector, socket: &Path) -> Option<f64> {
    let endpoint: Endpoint = format!("unix:{}", socket.display()).parse().unwrap();
    let stage = c.connect(&endpoint).ok()?;
    let (settings, _) = stage.settings().ok()?;
    settings.into_iter().find_map(|(ch, o, spec)| match spec {
        ObjectSpec::Drl(d) if ch == "foreground" && o == "drl" => Some(d.rate.per_sec()),
        _ => None,
    })
}

#[test]
fn max_min_across_processes_with_kills_and_restarts() {
    // A fresh machine still writing back its build stalls the tenants'
    // writes for whole cycles (a CI run saw t3's usage fall to 0.37 MiB/s
    // for two cycles, and max-min rightly gave t1 the rest): flush first.
    let _ = std::process::Command::new("sync").status();
    let mut run =
        Run { dir: tempfile::Builder::new().prefix("kvsds-fleet-").tempdir().unwrap(), procs: Procs::default() };
    tenant_exe();
    for t in ["t1", "t2", "t3"] {
        run.start_tenant(t);
    }
    for t in ["t1", "t2", "t3"] {
        run.wait_listening(t);
    }
    let started = unix_ms();
    run.start_controller();

    // 1. Convergence: from the first cycle that sees all three tenants.
    run.cycles_after(started, 1);
    let all = |r: &serde_json::Value| {
        r["inputs"].as_array().is_some_and(|i| i.len() == 3 && i.iter().all(|x| x["error"].is_null()))
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        if let Some(r) = run.records().into_iter().find(all) {
            break r;
        }
        assert!(Instant::now() < deadline, "the three tenants never joined: {}", run.diagnostics());
        std::thread::sleep(Duration::from_millis(50));
    };
    let j = first["cycle"].as_u64().unwrap();
    let mut from_j: Vec<_> = run.cycles_after(first["unix_ms"].as_u64().unwrap() - 1, 7);
    from_j.truncate(7);
    let at = converged_at(&from_j, &SHARES).unwrap_or_else(|| panic!("no convergence: {}", limits(&from_j)));
    eprintln!(
        "all three joined in cycle {j}; limits at their max-min shares from its {at}th cycle on: {}",
        limits(&from_j)
    );
    assert!(at <= 3, "shares took {at} cycles: {}", limits(&from_j));
    // Usage follows: never over its share by more than 5% in a cycle (the
    // DRLs hold), and within 5% of it in the median cycle (the tenants could
    // use more). Not every cycle: a CI run saw t1 use 0.30 of its 0.5 MiB/s
    // in one cycle while the machine wrote its build back. Counted from the
    // second cycle after the limits were set: the first one's usage covers
    // the milliseconds between its collect and the change reaching the
    // tenants, when they were not limited yet (a CI run saw t1 at 0.541 of
    // 0.5 MiB/s there, and at 0.499-0.501 in every cycle after).
    for (t, s) in SHARES {
        let mut used: Vec<f64> = from_j[at + 1..].iter().map(|r| usage(r, t).unwrap_or(0.0)).collect();
        let per_cycle: Vec<String> = used.iter().map(|u| format!("{:.3}", u / MIB)).collect();
        assert!(used.iter().all(|u| *u <= s * 1.05), "{t}: usage {per_cycle:?} MiB/s, over its share {}", s / MIB);
        used.sort_by(f64::total_cmp);
        let median = used[used.len() / 2];
        assert!(within(Some(median), s, 0.05), "{t}: usage {per_cycle:?} MiB/s, median not its share {}", s / MIB);
    }

    // 2. t2 killed: its share goes to t3 within 2 cycles.
    let killed = unix_ms();
    run.procs.kill("t2");
    let mut after = run.cycles_after(killed, 5);
    after.truncate(5);
    let at =
        converged_at(&after, &SHARES_WITHOUT_T2).unwrap_or_else(|| panic!("not redistributed: {}", limits(&after)));
    eprintln!("t2 killed: shares redistributed from the {at}th cycle after on: {}", limits(&after));
    assert!(at <= 2, "redistribution took {at} cycles: {}", limits(&after));

    // 3. t2 restarted: it rejoins and the shares return within 3 cycles
    // of its agent listening.
    run.start_tenant("t2");
    let back = run.wait_listening("t2");
    // It rejoins within the supervisor's backoff (at most 300 ms here, one
    // interval), then the shares return within 3 cycles.
    let after = run.cycles_after(back, 10);
    let rejoin = after
        .iter()
        .position(|r| limit(r, "t2").is_some())
        .unwrap_or_else(|| panic!("t2 did not rejoin: {} {}", limits(&after), run.diagnostics()));
    assert!(rejoin <= 2, "t2 rejoined {} cycles after its agent listened: {}", rejoin + 1, limits(&after));
    let mut from = after[rejoin..].to_vec();
    from.truncate(6);
    let at = converged_at(&from, &SHARES).unwrap_or_else(|| panic!("shares did not return: {}", limits(&from)));
    eprintln!(
        "t2 restarted: rejoined in the {}th cycle after its agent listened, shares from the {at}th cycle after rejoining: {}",
        rejoin + 1,
        limits(&from)
    );
    assert!(at <= 3, "the shares took {at} cycles after rejoining: {}", limits(&from));

    // 4. The controller killed: every stage returns to its own rate
    // (unlimited) within its lease.
    let observer = Connector::new(ClientOptions { lease: Duration::ZERO, ..ClientOptions::default() }).unwrap();
    for t in ["t1", "t2", "t3"] {
        assert!(drl_rate(&observer, &run.socket(t)).is_some_and(f64::is_finite), "{t} is not under control");
    }
    let last_cycle = run.records().last().unwrap()["unix_ms"].as_u64().unwrap();
    let killed = unix_ms();
    run.procs.kill("controller");
    let mut fell_back = vec![None; 3];
    let deadline = Instant::now() + Duration::from_millis(LEASE_MS * 3);
    while fell_back.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, t) in ["t1", "t2", "t3"].into_iter().enumerate() {
            if fell_back[i].is_none() && drl_rate(&observer, &run.socket(t)).is_some_and(f64::is_infinite) {
                fell_back[i] = Some(unix_ms() - killed);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "controller killed {} ms after its last cycle began; fell back after {fell_back:?} ms",
        killed - last_cycle
    );
    for (i, f) in fell_back.iter().enumerate() {
        let f = f.unwrap_or_else(|| panic!("t{} never fell back: {}", i + 1, run.diagnostics()));
        assert!(f <= LEASE_MS + 150, "t{} fell back {f} ms after the kill (lease {LEASE_MS} ms)", i + 1);
    }
    // The agents' own log lines say when each fell back.
    let mut logged = Vec::new();
    for t in ["t1", "t2", "t3"] {
        let err = run.stderr(t);
        let line = err
            .lines()
            .rev()
            .find(|l| l.contains("lease expired"))
            .unwrap_or_else(|| panic!("{t} did not log its fallback: {err}"));
        let at: u64 =
            line.split("at unix ms ").nth(1).and_then(|r| r.split(')').next()).and_then(|v| v.parse().ok()).unwrap();
        logged.push(at as i64 - last_cycle as i64);
    }
    eprintln!("fallbacks logged {logged:?} ms after the controller's last cycle began (lease {LEASE_MS} ms)");

    // 5. The controller restarted: control resumes.
    let restarted = unix_ms();
    run.start_controller();
    // From its first cycle with stages (the supervisor connects to them
    // while the first cycle runs).
    let mut after: Vec<_> = run
        .cycles_after(restarted, 8)
        .into_iter()
        .skip_while(|r| r["settings"].as_array().is_none_or(Vec::is_empty))
        .collect();
    assert!(after.len() >= 6, "the restarted controller joined no stage: {}", run.diagnostics());
    after.truncate(6);
    let at = converged_at(&after, &SHARES).unwrap_or_else(|| panic!("control did not resume: {}", limits(&after)));
    eprintln!(
        "controller restarted: shares from its {at}th cycle on, {} ms after the start: {}",
        after[at - 1]["unix_ms"].as_u64().unwrap() - restarted,
        limits(&after)
    );
    assert!(at <= 3, "control took {at} cycles to resume: {}", limits(&after));
    for t in ["t1", "t2", "t3"] {
        assert!(drl_rate(&observer, &run.socket(t)).is_some_and(f64::is_finite), "{t} is not under control again");
    }
}
