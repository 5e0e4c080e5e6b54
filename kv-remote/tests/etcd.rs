//! A fleet kept in etcd, in real processes on one machine: an etcd server
//! of its own (Debian's `etcd-server`, on 127.0.0.1 ports chosen at run
//! time, in a temporary data directory), three `tenant` processes that
//! register their stages, and two `kvsds-controller --etcd` processes
//! electing a leader that runs max-min over 3 MiB/s. Leaders are
//! SIGKILLed and SIGSTOPped, a tenant is SIGKILLed, etcd itself is
//! stopped; the policy in etcd is changed, once to something invalid.
//!
//! Every process is bounded (`--duration`) and killed when the test ends,
//! also on failure; the temporary directory holds sockets, databases,
//! logs and etcd's data, and is removed with it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod support;

use kv_remote::etcd::EtcdConfig;
use support::{get, metrics_addr, promtool_check, tenant_exe};

const MIB: f64 = 1048576.0;
const INTERVAL_MS: u64 = 500;
const TTL_MS: u64 = 2000;
const LEASE_MS: u64 = 1500;
const SHARES: [(&str, f64); 3] = [("t1", 0.5 * MIB), ("t2", 1.25 * MIB), ("t3", 1.25 * MIB)];
const SHARES_WITHOUT_T2: [(&str, f64); 2] = [("t1", 0.5 * MIB), ("t3", 2.5 * MIB)];
/// After the policy's device bandwidth goes from 3 to 6 MiB/s.
const SHARES_AT_6: [(&str, f64); 3] = [("t1", 0.5 * MIB), ("t2", 2.75 * MIB), ("t3", 2.75 * MIB)];

/// One fleet at a time: each runs five processes and an etcd on 2 cores.
static ONE: Mutex<()> = Mutex::new(());

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn policy(device: &str) -> String {
    let inst = |t: &str, demand: &str| {
        format!(
            "[[fair_share.instance]]\nname = \"{t}\"\ndemand = \"{demand}\"\nchannel = \"foreground\"\nobject = \"drl\"\n"
        )
    };
    format!(
        "policy = \"max_min\"\ninterval = \"{INTERVAL_MS}ms\"\n\n[fair_share]\ndevice_bandwidth = \"{device}\"\n{}{}{}\n[fleet]\nlease = \"{LEASE_MS}ms\"\nreconnect_min = \"50ms\"\nreconnect_max = \"300ms\"\n",
        inst("t1", "512KiB/s"),
        inst("t2", "unlimited"),
        inst("t3", "unlimited"),
    )
}

/// The run's processes: etcd, tenants and controllers by name, killed
/// (and reaped) when it ends.
struct Run {
    dir: tempfile::TempDir,
    etcd_ports: (u16, u16),
    procs: Vec<(String, Child)>,
}

impl Drop for Run {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            // A stopped process dies of SIGKILL too.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Run {
    fn new() -> Run {
        let dir = tempfile::Builder::new().prefix("kvsds-etcd-test-").tempdir().unwrap();
        let mut run = Run { dir, etcd_ports: (free_port(), free_port()), procs: Vec::new() };
        run.start_etcd();
        run
    }

    fn etcd(&self) -> EtcdConfig {
        EtcdConfig::new([format!("127.0.0.1:{}", self.etcd_ports.0)])
            .with_prefix("/kvsds-test")
            .with_ttl(Duration::from_millis(TTL_MS))
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn append(&self, name: &str) -> std::fs::File {
        std::fs::File::options().create(true).append(true).open(self.file(name)).unwrap()
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    fn start_etcd(&mut self) {
        let (client, peer) = self.etcd_ports;
        let child = Command::new("etcd")
            .args(["--name", "kvsds-test", "--data-dir"])
            .arg(self.file("etcd-data"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!("--initial-cluster=kvsds-test=http://127.0.0.1:{peer}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(self.append("etcd.err")))
            .spawn()
            .expect("etcd (Debian package etcd-server; scripts/setup.sh installs it)");
        self.procs.push(("etcd".into(), child));
        let cfg = self.etcd();
        let deadline = Instant::now() + Duration::from_secs(30);
        while kv_remote::etcd::leader(&cfg).is_err() {
            assert!(Instant::now() < deadline, "etcd never answered: {}", self.read("etcd.err"));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&mut self, name: &str, sig: &str) {
        let pid = self.pid(name);
        assert!(Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success());
    }

    fn kill(&mut self, name: &str) {
        if let Some(i) = self.procs.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.procs.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn pid(&self, name: &str) -> u32 {
        self.procs.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no process {name}")).1.id()
    }

    fn put_policy(&self, text: &str) -> std::process::Output {
        let file = self.file("policy.toml");
        std::fs::write(&file, text).unwrap();
        let cfg = self.etcd();
        Command::new(env!("CARGO_BIN_EXE_kvsds-controller"))
            .args(["--etcd", &cfg.endpoints[0], "--etcd-prefix", &cfg.prefix, "--put-policy"])
            .arg(&file)
            .output()
            .unwrap()
    }

    fn start_tenant(&mut self, name: &str) {
        let socket = self.file(&format!("{name}.sock"));
        let _ = std::fs::remove_file(&socket);
        let db = self.file(&format!("{name}-db-{}", unix_ms()));
        let cfg = self.etcd();
        let child = Command::new(tenant_exe())
            .args(["--name", name, "--duration", "120s", "--records", "2000", "--write-buffer", "128MiB"])
            .args(["--etcd", &cfg.endpoints[0], "--etcd-prefix", &cfg.prefix, "--etcd-ttl", "2s", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .arg("--db")
            .arg(db)
            .stdout(Stdio::from(self.append(&format!("{name}.out"))))
            .stderr(Stdio::from(self.append(&format!("{name}.err"))))
            .spawn()
            .unwrap();
        self.procs.push((name.to_owned(), child));
    }

    fn start_controller(&mut self, name: &str) {
        let cfg = self.etcd();
        let child = Command::new(env!("CARGO_BIN_EXE_kvsds-controller"))
            .args(["--etcd", &cfg.endpoints[0], "--etcd-prefix", &cfg.prefix, "--etcd-ttl", "2s", "--duration", "120s"])
            .args(["--metrics", "127.0.0.1:0"])
            .arg("--log")
            .arg(self.file(&format!("{name}.jsonl")))
            .env("RUST_LOG", "info")
            .stderr(Stdio::from(self.append(&format!("{name}.err"))))
            .spawn()
            .unwrap();
        self.procs.push((name.to_owned(), child));
    }

    /// The registered stages' names, from etcd.
    fn registered(&self) -> Vec<String> {
        let cfg = self.etcd();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let Ok(mut c) = etcd_client::Client::connect(&cfg.endpoints, None).await else { return Vec::new() };
            let opts = etcd_client::GetOptions::new().with_prefix().with_keys_only();
            match tokio::time::timeout(Duration::from_secs(1), c.get(cfg.stages_prefix(), Some(opts))).await {
                Ok(Ok(r)) => r
                    .kvs()
                    .iter()
                    .map(|kv| String::from_utf8_lossy(kv.key()).trim_start_matches(&cfg.stages_prefix()).to_owned())
                    .collect(),
                _ => Vec::new(),
            }
        })
    }

    fn wait_registered(&self, names: &[&str], limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.registered();
            if names.iter().all(|n| r.iter().any(|x| x == n)) {
                return unix_ms();
            }
            assert!(Instant::now() < deadline, "registered: {r:?}, want {names:?}: {}", self.diagnostics());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The controller leading now (by pid) and its term.
    fn leader(&self) -> Option<(String, u64)> {
        let (value, term) = kv_remote::etcd::leader(&self.etcd()).ok()??;
        let pid: u32 = value.split('@').next()?.parse().ok()?;
        let name = self.procs.iter().find(|(n, c)| n.starts_with('c') && c.id() == pid)?.0.clone();
        Some((name, term))
    }

    /// The times (unix ms) a controller logged its first cycle as leader.
    fn first_cycles(&self, controller: &str) -> Vec<u64> {
        self.read(&format!("{controller}.err"))
            .lines()
            .filter_map(|l| l.split("first cycle as leader at unix ms ").nth(1)?.split(' ').next()?.parse().ok())
            .collect()
    }

    fn wait_first_cycle_after(&self, controller: &str, t: u64, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(x) = self.first_cycles(controller).into_iter().find(|x| *x > t) {
                return x;
            }
            assert!(Instant::now() < deadline, "{controller} never led after {t}: {}", self.diagnostics());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn records(&self, controller: &str) -> Vec<serde_json::Value> {
        self.read(&format!("{controller}.jsonl")).lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// Waits until `n` records in a row of `controller`'s log, started
    /// after `t`, are at `shares`; returns when the first of them started.
    fn converged(&self, controller: &str, t: u64, shares: &[(&str, f64)], n: usize, limit: Duration) -> u64 {
        let deadline = Instant::now() + limit;
        loop {
            let r: Vec<_> =
                self.records(controller).into_iter().filter(|r| r["unix_ms"].as_u64().unwrap_or(0) > t).collect();
            if let Some(w) = r.windows(n).find(|w| w.iter().all(|r| at_shares(r, shares))) {
                return w[0]["unix_ms"].as_u64().unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "{controller}: not at {shares:?} after {t}; last records: {:?}\n{}",
                r.iter().rev().take(3).map(|r| &r["settings"]).collect::<Vec<_>>(),
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A tenant's last status line (its DRL's rate, the agent's terms).
    fn tenant_line(&self, name: &str) -> serde_json::Value {
        self.read(&format!("{name}.out"))
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    fn diagnostics(&self) -> String {
        let mut s = String::new();
        for n in ["c1", "c2", "t1", "t2", "t3"] {
            let text = self.read(&format!("{n}.err"));
            let tail: Vec<&str> = text.lines().rev().take(12).collect();
            s += &format!("\n--- {n}:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        s
    }

    /// etcd, three registered tenants, two controllers, the policy, and a
    /// leader at the shares.
    fn fleet() -> Run {
        let mut run = Run::new();
        let out = run.put_policy(&policy("3MiB/s"));
        assert!(out.status.success(), "--put-policy: {}", String::from_utf8_lossy(&out.stderr));
        for t in ["t1", "t2", "t3"] {
            run.start_tenant(t);
        }
        run.wait_registered(&["t1", "t2", "t3"], Duration::from_secs(60));
        run.start_controller("c1");
        run.start_controller("c2");
        let deadline = Instant::now() + Duration::from_secs(30);
        let leader = loop {
            if let Some((l, _)) = run.leader()
                && !run.first_cycles(&l).is_empty()
            {
                break l;
            }
            assert!(Instant::now() < deadline, "no leader: {}", run.diagnostics());
            std::thread::sleep(Duration::from_millis(20));
        };
        run.converged(&leader, 0, &SHARES, 3, Duration::from_secs(20));
        run
    }
}

fn limit(r: &serde_json::Value, tenant: &str) -> Option<f64> {
    r["settings"].as_array()?.iter().find(|s| s["instance"] == tenant && s["error"].is_null())?["rate_bps"].as_f64()
}

fn at_shares(r: &serde_json::Value, shares: &[(&str, f64)]) -> bool {
    let n = r["settings"].as_array().map_or(0, Vec::len);
    n == shares.len() && shares.iter().all(|(t, s)| limit(r, t).is_some_and(|v| (v - s).abs() <= s * 0.05))
}

/// The value of a series (name and labels as written) in a scrape.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn other(c: &str) -> &'static str {
    if c == "c1" { "c2" } else { "c1" }
}

#[test]
fn a_killed_leader_is_replaced_within_the_ttl_and_a_stopped_one_is_fenced() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Run::fleet();
    let target = TTL_MS + 2 * INTERVAL_MS;
    let mut failovers = Vec::new();
    let mut last_term = 0;
    for kill in 1..=5 {
        let (leader, term) = run.leader().expect("a leader");
        assert!(kill == 1 || term == last_term, "the leader is still the one of term {last_term}, not {term}");
        let next = other(&leader);
        let t_kill = unix_ms();
        run.kill(&leader);
        let first = run.wait_first_cycle_after(next, t_kill, Duration::from_secs(20));
        let (now_leading, new_term) = run.leader().expect("a new leader");
        assert_eq!(now_leading, next);
        assert!(new_term > term, "the new term {new_term} is newer than {term}");
        failovers.push(first - t_kill);
        eprintln!(
            "kill {kill}: {leader} (term {term}) killed, {next} (term {new_term}) first cycle {} ms later",
            first - t_kill
        );
        // The shares hold under the new leader.
        run.converged(next, t_kill, &SHARES, 3, Duration::from_secs(10));
        // The killed one comes back, and waits as a follower.
        let before = run.read(&format!("{leader}.err")).len();
        run.start_controller(&leader);
        let deadline = Instant::now() + Duration::from_secs(15);
        while !run.read(&format!("{leader}.err"))[before..].contains("campaigning") {
            assert!(Instant::now() < deadline, "{leader} never campaigned again: {}", run.diagnostics());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(run.leader().map(|l| l.0).as_deref(), Some(next), "the restarted one does not take over");
        last_term = new_term;
    }
    eprintln!("failover times (ms), SIGKILL to the new leader's first cycle: {failovers:?}; target {target} ms");
    for f in &failovers {
        assert!(*f <= target, "failover {f} ms > TTL + 2 intervals ({target} ms): {failovers:?}");
    }

    // A leader SIGSTOPped past its TTL is replaced; woken, it is refused.
    let (stopped, old_term) = run.leader().unwrap();
    let next = other(&stopped);
    let t_stop = unix_ms();
    run.signal(&stopped, "-STOP");
    let first = run.wait_first_cycle_after(next, t_stop, Duration::from_secs(20));
    let new_term = run.leader().unwrap().1;
    run.converged(next, first, &SHARES, 2, Duration::from_secs(10));
    eprintln!(
        "SIGSTOP: {stopped} (term {old_term}) stopped, {next} (term {new_term}) first cycle {} ms later",
        first - t_stop
    );
    std::thread::sleep(Duration::from_millis(TTL_MS));
    run.signal(&stopped, "-CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run.read(&format!("{stopped}.err")).contains("lost the leadership") {
        assert!(Instant::now() < deadline, "{stopped} never saw it lost the leadership: {}", run.diagnostics());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Two more seconds of both running: every change any agent applied is
    // the new leader's, and the rates are its.
    std::thread::sleep(Duration::from_millis(2000));
    let mut refused = 0;
    for t in ["t1", "t2", "t3"] {
        let line = run.tenant_line(t);
        assert_eq!(line["term"].as_u64(), Some(new_term), "{t}: {line}");
        assert_eq!(line["change_term"].as_u64(), Some(new_term), "{t}: {line}");
        refused += line["refused_term"].as_u64().unwrap_or(0);
    }
    run.converged(next, unix_ms() - 1500, &SHARES, 2, Duration::from_secs(5));
    assert_eq!(run.leader().map(|l| l.0).as_deref(), Some(next));
    eprintln!("fencing: calls refused by term across the tenants' agents (the woken leader's): {refused}");
}

#[test]
fn a_killed_tenant_leaves_and_rejoins_and_the_policy_changes_live() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Run::fleet();
    let (leader, _) = run.leader().unwrap();
    // A tenant dies: its key vanishes within the TTL, its share goes to t3.
    let t_kill = unix_ms();
    run.kill("t2");
    let deadline = Instant::now() + Duration::from_secs(10);
    while run.registered().iter().any(|n| n == "t2") {
        assert!(Instant::now() < deadline, "t2's key never vanished");
        std::thread::sleep(Duration::from_millis(10));
    }
    let vanished = unix_ms() - t_kill;
    let shared = run.converged(&leader, t_kill, &SHARES_WITHOUT_T2, 2, Duration::from_secs(10)) - t_kill;
    eprintln!("t2 SIGKILLed: key gone after {vanished} ms, share redistributed after {shared} ms");
    assert!(vanished <= TTL_MS + 600, "key vanished after {vanished} ms (TTL {TTL_MS} ms, etcd checks every 500 ms)");
    assert!(shared <= TTL_MS + INTERVAL_MS, "redistributed after {shared} ms > TTL + 1 interval");
    // It comes back: registered, then in the policy within 2 intervals.
    run.start_tenant("t2");
    let registered = run.wait_registered(&["t2"], Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(10);
    let joined = loop {
        if let Some(r) = run
            .records(&leader)
            .into_iter()
            .find(|r| r["unix_ms"].as_u64().unwrap_or(0) > registered && limit(r, "t2").is_some())
        {
            break r["unix_ms"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "t2 never joined again: {}", run.diagnostics());
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("t2 restarted: in the policy {} ms after it registered", joined - registered);
    assert!(joined - registered <= 2 * INTERVAL_MS, "joined {} ms after registering", joined - registered);
    run.converged(&leader, registered, &SHARES, 2, Duration::from_secs(10));

    // Each controller serves its leadership's metrics, the leader also its
    // controller's and its fleet's; promtool finds nothing to say.
    let follower = other(&leader);
    for (c, leading) in [(leader.as_str(), 1), (follower, 0)] {
        let addr = metrics_addr(&run.file(&format!("{c}.err")), c);
        promtool_check(addr, c);
        let (_, text) = get(addr, "/metrics").unwrap();
        assert_eq!(sample(&text, "kvsds_elected_leading"), Some(f64::from(leading)), "{c}: {text}");
        assert_eq!(text.contains("kvsds_controller_cycles_total"), leading == 1, "{c}: {text}");
        let joined = sample(&text, "kvsds_fleet_member_joined{member=\"t2\"}");
        assert_eq!(joined, (leading == 1).then_some(1.0), "{c}: {text}");
    }

    // A malformed policy is refused naming the key; the fleet keeps its own.
    let bad = policy("3MiB/s").replace("policy = \"max_min\"", "policy = \"fastest\"");
    let out = run.put_policy(&bad);
    assert!(!out.status.success(), "--put-policy checks the file first");
    let cfg = run.etcd();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect(&cfg.endpoints, None).await.unwrap();
        c.put(cfg.policy_key(), bad.as_str(), None).await.unwrap();
    });
    let t_bad = unix_ms();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !run.read(&format!("{leader}.err")).contains(&format!("refused the policy at {}", cfg.policy_key())) {
        assert!(Instant::now() < deadline, "the bad policy was not refused: {}", run.diagnostics());
        std::thread::sleep(Duration::from_millis(20));
    }
    run.converged(&leader, t_bad, &SHARES, 3, Duration::from_secs(10));
    // A good one applies from the next cycle on.
    let out = run.put_policy(&policy("6MiB/s"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t_good = unix_ms();
    let at = run.converged(&leader, t_good, &SHARES_AT_6, 2, Duration::from_secs(10));
    eprintln!("policy at 6 MiB/s: applied {} ms after it was written", at - t_good);
    let (_, text) = get(metrics_addr(&run.file(&format!("{leader}.err")), &leader), "/metrics").unwrap();
    assert_eq!(sample(&text, "kvsds_elected_policies_total{outcome=\"applied\"}"), Some(2.0), "{text}");
    assert_eq!(sample(&text, "kvsds_elected_policies_total{outcome=\"refused\"}"), Some(1.0), "{text}");
}

#[test]
fn an_etcd_outage_leaves_every_stage_bounded_and_the_fleet_recovers() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = Run::fleet();
    let t_down = unix_ms();
    run.kill("etcd");
    // The leader stops driving within its TTL; every stage falls back within
    // its lease after that (restore: the DRL unlimited again), and no
    // stage keeps a controller's rate past that bound.
    let bound = Duration::from_millis(TTL_MS + LEASE_MS + 1500);
    let deadline = Instant::now() + bound + Duration::from_secs(3);
    loop {
        let fell_back = ["t1", "t2", "t3"].iter().all(|t| {
            let line = run.tenant_line(t);
            line["drl_rate_bps"] == "unlimited" && line["t_s"].as_f64().is_some()
        });
        if fell_back {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stages not all fallen back {bound:?} after etcd went: {:?} {}",
            ["t1", "t2", "t3"].map(|t| run.tenant_line(t)),
            run.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let fell = unix_ms() - t_down;
    eprintln!("etcd down: every stage at its fallback {fell} ms later (lines once a second)");
    std::thread::sleep(Duration::from_millis(1000));
    // etcd back: a leader, the tenants registered again, the shares.
    let t_up = unix_ms();
    run.start_etcd();
    run.wait_registered(&["t1", "t2", "t3"], Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(30);
    let leader = loop {
        if let Some((l, _)) = run.leader()
            && run.first_cycles(&l).iter().any(|x| *x > t_up)
        {
            break l;
        }
        assert!(Instant::now() < deadline, "no leader after etcd came back: {}", run.diagnostics());
        std::thread::sleep(Duration::from_millis(50));
    };
    let at = run.converged(&leader, t_up, &SHARES, 3, Duration::from_secs(20));
    eprintln!("etcd back: {leader} at the shares {} ms later", at - t_up);
}
