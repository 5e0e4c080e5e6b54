//! The monitoring page holds together with the code: every metric family the
//! collectors write (stages, RocksDB, controller, agent, fleet, elected
//! controller) has a row in
//! `docs/monitoring.md`, every row names a metric that exists, every PromQL
//! query on the page and in the Grafana dashboard uses only metrics that
//! exist, and the dashboard's queries are the page's.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, Stage, units::Rate};
use prometheus_client::registry::Registry;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

/// Every family the collectors describe (from the `# TYPE` lines), with
/// the names its samples may take.
fn families() -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let stage = Arc::new(Stage::new("docs"));
    rocks_env::RocksLayout::new().install(&stage).unwrap();
    let db = Arc::new(rocks_env::StagedDb::builder(opts).stage(Arc::clone(&stage)).open(dir.path()).unwrap());
    let c = controller::Controller::builder(controller::ControllerConfig::silk(controller::SilkConfig::default()))
        .instance("docs", Arc::clone(&stage))
        .start()
        .unwrap();
    let other = Arc::new(Stage::new("agent"));
    other
        .apply_rules([
            Rule::CreateChannel { channel: "c".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "c".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
                matches: None,
            },
        ])
        .unwrap();
    let sock = dir.path().join("a.sock");
    let agent = kv_remote::StageAgent::builder(other)
        .metrics("127.0.0.1:0".parse().unwrap())
        .serve(&format!("unix:{}", sock.display()).parse().unwrap())
        .unwrap();

    let mut registry = Registry::default();
    let stages = kv_stage::metrics::StageMetrics::new();
    stages.add(&stage);
    registry.register_collector(Box::new(stages));
    let dbs = rocks_env::metrics::DbMetrics::new();
    dbs.add(&db);
    registry.register_collector(Box::new(dbs));
    registry.register_collector(Box::new(c.metrics()));
    let mut text = kv_stage::metrics::encode_text(&registry);
    // The agent's own, over HTTP.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(agent.metrics_addr().unwrap()).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    s.read_to_string(&mut text).unwrap();

    // A fleet's, from kvsds-controller's endpoint (its controller's and
    // its members').
    let fleet_file = format!(
        "policy = \"static\"\ninterval = \"100ms\"\n[fair_share]\ndevice_bandwidth = \"2MiB/s\"\n\
         [[fair_share.instance]]\nname = \"agent\"\ndemand = \"1MiB/s\"\nchannel = \"c\"\nobject = \"drl\"\n\
         [fleet]\nmetrics = \"127.0.0.1:0\"\n[[fleet.stage]]\nname = \"agent\"\nendpoint = \"unix:{}\"\n",
        sock.display()
    );
    let fleet = kv_remote::Fleet::start(kv_remote::FleetConfig::parse(&fleet_file, "fleet.toml").unwrap()).unwrap();
    let mut s = std::net::TcpStream::connect(fleet.metrics_addr().unwrap()).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    s.read_to_string(&mut text).unwrap();
    drop(fleet.stop());

    // An elected controller's leadership (no etcd needed to serve them).
    let elected = kv_remote::ElectedController::start(kv_remote::ElectedOptions {
        metrics: Some("127.0.0.1:0".parse().unwrap()),
        ..kv_remote::ElectedOptions::new(kv_remote::etcd::EtcdConfig::new(["127.0.0.1:1"]))
    })
    .unwrap();
    let mut s = std::net::TcpStream::connect(elected.metrics_addr().unwrap()).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    s.read_to_string(&mut text).unwrap();
    elected.stop();

    let mut names = BTreeSet::new();
    let mut samples = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            let (name, kind) = (it.next().unwrap().to_owned(), it.next().unwrap());
            if kind == "histogram" {
                for s in ["_bucket", "_sum", "_count"] {
                    samples.insert(format!("{name}{s}"));
                }
            }
            samples.insert(name.clone());
            names.insert(name);
        }
    }
    (names, samples)
}

fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("kvsds_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        if start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_') {
            out.insert(text[start..end].to_owned());
        }
        i = end;
    }
    out
}

/// The ```promql blocks of the page.
fn page_queries(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = page.lines();
    while let Some(l) = it.next() {
        if l.trim() == "```promql" {
            let q: Vec<&str> = it.by_ref().take_while(|l| l.trim() != "```").collect();
            out.push(q.join("\n").trim().to_owned());
        }
    }
    out
}

#[test]
fn the_monitoring_page_lists_every_metric_and_its_queries_use_real_ones() {
    let page = std::fs::read_to_string(root().join("docs/monitoring.md")).unwrap();
    let (names, samples) = families();
    assert!(names.len() >= 40, "{names:?}");

    // Every family has a row; every row is a family.
    let rows: BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_owned))
        .filter(|n| n.starts_with("kvsds_"))
        .collect();
    let missing: Vec<_> = names.difference(&rows).collect();
    assert!(missing.is_empty(), "metrics without a row in docs/monitoring.md: {missing:?}");
    let stale: Vec<_> = rows.difference(&names).collect();
    assert!(stale.is_empty(), "rows in docs/monitoring.md for metrics no collector writes: {stale:?}");

    // Every query uses real names.
    let queries = page_queries(&page);
    assert!(queries.len() >= 10, "{queries:?}");
    for q in &queries {
        for n in metric_names(q) {
            assert!(samples.contains(&n), "docs/monitoring.md: query `{q}` uses `{n}`, which no collector writes");
        }
    }

    // The dashboard's queries are the page's.
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("docs/grafana/kvsds.json")).unwrap()).unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().map(|t| t["expr"].as_str().unwrap().to_owned()))
        .collect();
    assert!(exprs.len() >= 10);
    for e in &exprs {
        assert!(queries.contains(e), "the dashboard's query `{e}` is not on docs/monitoring.md");
    }
}
