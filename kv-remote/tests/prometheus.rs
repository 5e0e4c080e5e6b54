//! A real Prometheus scrapes a tenant's stage agent and a `kvsds-controller`
//! while the tenant writes through a 2 MiB/s DRL the controller holds; its
//! HTTP API must then see that rate, and the controller's cycles growing.
//! `promtool check metrics` must accept both endpoints' output.
//!
//! Needs Debian's `prometheus` package (`prometheus` and `promtool`), which
//! `scripts/setup.sh` installs. Everything runs on 127.0.0.1 with ports
//! chosen at run time, in a temporary directory; every process is killed
//! and the directory removed at the end, also when the test fails.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{get, metrics_addr, promtool_check, tool};

use support::tenant_exe;

const MIB: f64 = 1048576.0;

/// Children killed on drop (also when an assertion fails).
struct Procs(Vec<(&'static str, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Prometheus's answer to an instant query, as (labels, value) pairs.
fn query(prom: SocketAddr, q: &str) -> Vec<(serde_json::Value, f64)> {
    let enc: String = q
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (status, body) = get(prom, &format!("/api/v1/query?query={enc}")).unwrap();
    assert_eq!(status, 200, "query {q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["metric"].clone(), r["value"][1].as_str().unwrap().parse::<f64>().unwrap()))
        .collect()
}

#[test]
fn prometheus_scrapes_an_agent_and_a_controller() {
    let prometheus = tool("prometheus");
    let dir = tempfile::Builder::new().prefix("kvsds-prom-").tempdir().unwrap();
    let mut procs = Procs(Vec::new());
    let socket = dir.path().join("t1.sock");

    // The tenant: RocksDB with a foreground DRL, its agent, and metrics.
    let tenant_err = dir.path().join("t1.err");
    let child = Command::new(tenant_exe())
        .args(["--name", "t1", "--duration", "90s", "--records", "2000", "--write-buffer", "128MiB"])
        .args(["--metrics", "127.0.0.1:0", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--db")
        .arg(dir.path().join("t1-db"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&tenant_err).unwrap())
        .spawn()
        .unwrap();
    procs.0.push(("tenant", child));
    let agent = metrics_addr(&tenant_err, "the tenant");

    // The controller holds the tenant's DRL at its demand, 2 MiB/s.
    let fleet = dir.path().join("fleet.toml");
    std::fs::write(
        &fleet,
        format!(
            "policy = \"static\"\ninterval = \"300ms\"\n\n[fair_share]\ndevice_bandwidth = \"2MiB/s\"\n\
             [[fair_share.instance]]\nname = \"t1\"\ndemand = \"2MiB/s\"\nchannel = \"foreground\"\nobject = \"drl\"\n\n\
             [fleet]\nlease = \"900ms\"\nmetrics = \"127.0.0.1:0\"\n\
             [[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:{}\"\n",
            socket.display()
        ),
    )
    .unwrap();
    let controller_err = dir.path().join("controller.err");
    let child = Command::new(env!("CARGO_BIN_EXE_kvsds-controller"))
        .arg("--config")
        .arg(&fleet)
        .args(["--duration", "90s"])
        .stderr(std::fs::File::create(&controller_err).unwrap())
        .spawn()
        .unwrap();
    procs.0.push(("controller", child));
    let controller = metrics_addr(&controller_err, "kvsds-controller");

    // Prometheus, scraping both every second.
    let prom: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: agent\n    static_configs:\n      - targets: ['{agent}']\n  \
             - job_name: controller\n    static_configs:\n      - targets: ['{controller}']\n"
        ),
    )
    .unwrap();
    let prom_log = dir.path().join("prometheus.log");
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&prom_log).unwrap())
        .spawn()
        .unwrap();
    procs.0.push(("prometheus", child));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !get(prom, "/-/ready").is_ok_and(|(s, _)| s == 200) {
        assert!(
            Instant::now() < deadline,
            "prometheus never became ready: {}",
            std::fs::read_to_string(&prom_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Both endpoints pass promtool's lint.
    promtool_check(agent, "the agent");
    promtool_check(controller, "kvsds-controller");

    // About 15 s of scrapes, then the last 10 s's rate.
    let cycles_query = "kvsds_controller_cycles_total";
    // The first scrapes land within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(30);
    let cycles_before = loop {
        let c = query(prom, cycles_query);
        if !c.is_empty() || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    std::thread::sleep(Duration::from_secs(12));
    let rate_q = "rate(kvsds_object_bytes_total{job=\"agent\",channel=\"foreground\",object=\"drl\"}[10s])";
    let rates = query(prom, rate_q);
    let cycles_after = query(prom, cycles_query);
    let limit = query(prom, "kvsds_object_rate_bytes_per_second{channel=\"foreground\",object=\"drl\"}");
    let targets = get(prom, "/api/v1/targets").map(|r| r.1).unwrap_or_default();
    let context = format!(
        "rate {rates:?}, limit {limit:?}, cycles {cycles_before:?} -> {cycles_after:?}\ntargets: {targets}\ncontroller: {}\ntenant: {}",
        std::fs::read_to_string(&controller_err).unwrap_or_default(),
        std::fs::read_to_string(&tenant_err).unwrap_or_default()
    );
    eprintln!("PromQL {rate_q} = {rates:?}");
    eprintln!("PromQL {cycles_query}: {cycles_before:?} then {cycles_after:?}");
    eprintln!("PromQL kvsds_object_rate_bytes_per_second = {limit:?}");

    assert_eq!(rates.len(), 1, "one DRL series: {context}");
    let achieved = rates[0].1;
    assert!(
        (achieved - 2.0 * MIB).abs() <= 0.05 * 2.0 * MIB,
        "the DRL's bytes rose at {:.3} MiB/s, not 2 MiB/s within 5%: {context}",
        achieved / MIB
    );
    assert_eq!(limit.first().map(|l| l.1), Some(2.0 * MIB), "the configured rate: {context}");
    let (b, a) = (cycles_before.first().map(|c| c.1), cycles_after.first().map(|c| c.1));
    assert!(matches!((b, a), (Some(b), Some(a)) if a > b), "the controller's cycles did not grow: {context}");

    // Every query of the Grafana dashboard (the same as docs/monitoring.md's)
    // is valid PromQL, and those over the tenant, the controller and the
    // RocksDB have data.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana/kvsds.json")).unwrap(),
    )
    .unwrap();
    let mut answered = 0;
    for target in dash["panels"].as_array().unwrap().iter().flat_map(|p| p["targets"].as_array().unwrap()) {
        let expr = target["expr"].as_str().unwrap();
        let result = query(prom, expr);
        eprintln!("dashboard: {expr} -> {} series", result.len());
        answered += usize::from(!result.is_empty());
    }
    for expr in [
        "sum by (stage, context) (rate(kvsds_context_file_bytes_total[1m]))",
        "sum by (kv_instance, branch) (rate(kvsds_controller_decisions_total[1m]))",
        "kvsds_rocksdb_l0_files",
    ] {
        assert!(!query(prom, expr).is_empty(), "no data for the dashboard's `{expr}`: {context}");
    }
    assert!(answered >= 6, "only {answered} of the dashboard's queries had data: {context}");
}

#[test]
fn a_metrics_address_that_is_not_loopback_is_refused() {
    // The agent.
    let stage = std::sync::Arc::new(kv_stage::Stage::new("s"));
    let dir = tempfile::tempdir().unwrap();
    let endpoint: kv_remote::Endpoint = format!("unix:{}", dir.path().join("a.sock").display()).parse().unwrap();
    let err = kv_remote::StageAgent::builder(std::sync::Arc::clone(&stage))
        .metrics("0.0.0.0:0".parse().unwrap())
        .serve(&endpoint)
        .unwrap_err()
        .to_string();
    assert!(err.contains("0.0.0.0:0") && err.contains("metrics_allow_remote"), "{err}");
    assert!(!dir.path().join("a.sock").exists(), "a refused agent left its socket");
    // Allowed explicitly, it serves.
    let agent = kv_remote::StageAgent::builder(stage)
        .metrics("0.0.0.0:0".parse().unwrap())
        .metrics_allow_remote(true)
        .serve(&endpoint)
        .unwrap();
    let port = agent.metrics_addr().unwrap().port();
    let (status, body) = get(format!("127.0.0.1:{port}").parse().unwrap(), "/metrics").unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("kvsds_agent_calls_total{agent=\"s\"}"), "{body}");
    let (status, _) = get(format!("127.0.0.1:{port}").parse().unwrap(), "/other").unwrap();
    assert_eq!(status, 404);

    // The fleet file names its key.
    let file = |metrics: &str| {
        format!(
            "policy = \"static\"\n[fair_share]\ndevice_bandwidth = \"2MiB/s\"\n[[fair_share.instance]]\nname = \"t1\"\n\
             demand = \"1MiB/s\"\nchannel = \"foreground\"\nobject = \"drl\"\n[fleet]\n{metrics}\n\
             [[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/tmp/none.sock\"\n"
        )
    };
    let err =
        kv_remote::FleetConfig::parse(&file("metrics = \"10.1.2.3:9465\""), "fleet.toml").unwrap_err().to_string();
    assert!(err.contains("fleet.toml") && err.contains("fleet.metrics") && err.contains("10.1.2.3:9465"), "{err}");
    let err = kv_remote::FleetConfig::parse(&file("metrics = \"localhost\""), "fleet.toml").unwrap_err().to_string();
    assert!(err.contains("fleet.metrics") && err.contains("localhost"), "{err}");
    let ok =
        kv_remote::FleetConfig::parse(&file("metrics = \"10.1.2.3:9465\"\nmetrics_allow_remote = true"), "fleet.toml")
            .unwrap();
    assert_eq!(ok.metrics, Some("10.1.2.3:9465".parse().unwrap()));

    // kvsds-controller's flag: refused before anything starts.
    let cfg = dir.path().join("fleet.toml");
    std::fs::write(&cfg, file("")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kvsds-controller"))
        .arg("--config")
        .arg(&cfg)
        .args(["--metrics", "0.0.0.0:9465", "--duration", "5s"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("--metrics") && said.contains("0.0.0.0:9465"), "{said}");
}
