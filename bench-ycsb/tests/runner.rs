//! The run phase against a DB that cannot keep up: every scheduled request
//! is measured (none silently dropped), reads of the latest keys never ask
//! for a key whose insert is not acknowledged, and field lengths follow the
//! distribution the workload names.

use std::sync::Arc;
use std::time::Duration;

use bench_ycsb::generator::Rng;
use bench_ycsb::profile::Profile;
use bench_ycsb::report::{BenchReport, SystemReport};
use bench_ycsb::runner::{self, RunParams};
use bench_ycsb::workload::{LengthDistribution, RecordBuilder, RequestDistribution, Workload};
use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, Stage};
use rocks_env::StagedDb;

/// A loaded DB reopened through a stage whose foreground requests go
/// through a DRL at `fg_rate`.
fn slow_db(dir: &std::path::Path, w: &Workload, fg_rate: &str) -> (StagedDb, Arc<Stage>) {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    drop(runner::load(dir, &opts, w, 2, 1).unwrap());
    let stage = Arc::new(Stage::new("slow"));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(fg_rate.parse().unwrap())),
                matches: None,
            },
        ])
        .unwrap();
    (StagedDb::builder(opts).stage(Arc::clone(&stage)).open(dir).unwrap(), stage)
}

/// A report of one system's run of 1 s of `mixture` at a constant rate
/// with 2 client threads, as `run` writes it.
fn one_system_report(sys: SystemReport, seed: u64) -> BenchReport {
    BenchReport {
        workload: "mixture".into(),
        workload_properties: serde_json::Value::Null,
        profile: "constant".into(),
        threads: 2,
        duration_s: 1.0,
        seed,
        device: "none".into(),
        start: "cold".into(),
        machine: String::new(),
        provenance: bench_ycsb::report::Provenance::now(),
        kvs_bandwidth: "-".into(),
        config: serde_json::Value::Null,
        systems: vec![sys],
    }
}

fn small(name: &str) -> Workload {
    let mut w = Workload::builtin(name).unwrap();
    w.recordcount = 2_000;
    w.fieldcount = 2;
    w.fieldlength = 50;
    w
}

/// 1 s of 1000 ops/s against a DB that does about 100 writes/s: most
/// requests cannot even be issued before the drain limit. Each of them is
/// still recorded, with the latency it would at least have had (end of run
/// minus its scheduled time), and the reports say how many were dropped.
#[test]
fn an_overloaded_run_records_every_scheduled_request() {
    let dir = tempfile::tempdir().unwrap();
    let w = small("mixture");
    let (db, _stage) = slow_db(dir.path(), &w, "100ops/s");
    let params = RunParams {
        threads: 2,
        duration: Duration::from_secs(1),
        profile: Profile::Constant { rate: 1000.0 },
        seed: 7,
        drain: Duration::from_millis(300),
        timer_slack_ns: runner::CLIENT_TIMER_SLACK_NS,
    };
    let r = runner::run(&db, &w, &params, &|_| {});
    eprintln!("completed {} of 1000, dropped {}, max latency {} µs", r.ops, r.dropped, r.overall.intended.max());
    assert!(r.dropped > 100, "the DB kept up; the test needs it not to ({} dropped)", r.dropped);
    assert_eq!(r.overall.intended.len(), 1000, "every scheduled request is in the latency histogram");
    assert_eq!(r.ops + r.dropped, 1000, "completed and dropped add up to the schedule");
    // A request dropped at the drain limit waited at least until then.
    assert!(r.overall.intended.max() >= 300_000, "max latency {} µs", r.overall.intended.max());

    let sys = SystemReport::new("slow", 1, &r, &Profile::Constant { rate: 1.0 });
    assert_eq!(sys.dropped, r.dropped);
    let json = serde_json::to_value(&sys).unwrap();
    assert_eq!(json["dropped"].as_u64(), Some(r.dropped), "summary.json has `dropped`");
    assert!(sys.ycsb_text().contains(&format!("[OVERALL], Dropped, {}", r.dropped)), "{}", sys.ycsb_text());
    let report = one_system_report(sys, 7);
    let table = bench_ycsb::report::table(&report);
    let header = table.lines().next().unwrap();
    let row = table.lines().nth(1).unwrap();
    let col = header.split_whitespace().position(|c| c == "dropped").expect("the table has a `dropped` column");
    // Header words and row cells line up except the two-word headers before it.
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(cells.contains(&r.dropped.to_string().as_str()), "row {row:?} (column {col}) lacks {}", r.dropped);

    // The files a run writes carry where they come from.
    let out = tempfile::tempdir().unwrap();
    bench_ycsb::report::write_all(&report, out.path()).unwrap();
    let text = std::fs::read_to_string(out.path().join("table.txt")).unwrap();
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("# commit ") && first.ends_with('Z'), "{first}");
    assert!(text.lines().any(|l| l.starts_with("# command: ") && l.contains("runner")), "{text}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    let commit = summary["provenance"]["commit"].as_str().unwrap();
    // Run from the checkout: a commit id (40 hex digits, maybe `-dirty`).
    assert!(commit.len() >= 40 && commit[..40].chars().all(|c| c.is_ascii_hexdigit()), "{commit}");
}

#[test]
fn results_are_dated_in_utc() {
    use bench_ycsb::report::utc_date;
    assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
    assert_eq!(utc_date(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(utc_date(1_796_172_245), "2026-12-02T00:44:05Z");
}

/// Workload D's shape (reads of the latest keys, inserts) with slow inserts:
/// a read must never pick a key whose insert has not been acknowledged yet
/// (YCSB's acknowledged-counter generator). Such a read finds nothing and
/// counts as an error.
#[test]
fn latest_reads_only_see_acknowledged_inserts() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = small("d");
    assert_eq!(w.requestdistribution, RequestDistribution::Latest);
    w.readproportion = 0.5;
    w.insertproportion = 0.5;
    // Inserts wait in the DRL (a WAL append each), reads rarely touch a file.
    let (db, _stage) = slow_db(dir.path(), &w, "400ops/s");
    let params = RunParams {
        threads: 4,
        duration: Duration::from_secs(1),
        profile: Profile::Constant { rate: 600.0 },
        seed: 11,
        drain: Duration::from_secs(5),
        timer_slack_ns: runner::CLIENT_TIMER_SLACK_NS,
    };
    let r = runner::run(&db, &w, &params, &|_| {});
    let read = r.per_op.iter().find(|(op, _)| op.label() == "READ").map(|(_, s)| s.clone()).unwrap();
    eprintln!("{} reads, {} found nothing", read.intended.len(), read.errors);
    assert!(read.intended.len() > 100);
    assert_eq!(read.errors, 0, "reads asked for keys whose inserts were not acknowledged");
}

/// `fieldlengthdistribution=zipfian` draws lengths from 1 to `fieldlength`
/// with the shortest the most popular, as YCSB's ZipfianGenerator(1, n).
#[test]
fn zipfian_field_lengths_favour_the_shortest() {
    let mut w = small("a");
    w.fieldcount = 1;
    w.fieldlength = 100;
    w.fieldlengthdistribution = LengthDistribution::Zipfian;
    let b = RecordBuilder::new(&w);
    let mut rng = Rng::new(3);
    let mut counts = vec![0u64; 101];
    let mut buf = Vec::new();
    let n = 100_000;
    for _ in 0..n {
        b.record(&mut rng, &mut buf);
        let value = &buf[buf.iter().position(|&c| c == b'=').unwrap() + 1..buf.len() - 1];
        counts[value.len()] += 1;
    }
    let share = |len: usize| counts[len] as f64 / n as f64;
    eprintln!("P(1) = {:.4}, P(2) = {:.4}, P(50) = {:.4}, P(100) = {:.4}", share(1), share(2), share(50), share(100));
    assert_eq!(counts[0], 0, "a field is never empty");
    // Zipf(0.99) over 100 items: rank 1 has about 19 %, rank 50 about 0.4 %.
    assert!(share(1) > 0.15, "length 1 drawn {:.4} of the time", share(1));
    assert!(share(1) > 20.0 * share(50), "lengths are not zipfian");
    assert!(share(2) < share(1));
}

/// Latency is also reported per phase of the load profile (low, peak,
/// valley, with how often each occurred) and per 10 s window.
#[test]
fn phases_and_windows_cover_the_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let w = small("mixture");
    let (db, _stage) = slow_db(dir.path(), &w, "unlimited");
    let profile = Profile::parse("silk:low=100,peak=400,valley=200,low-for=1s,period=4s").unwrap();
    let params = RunParams {
        threads: 2,
        duration: Duration::from_secs(7),
        profile: profile.clone(),
        seed: 3,
        drain: Duration::from_secs(1),
        timer_slack_ns: runner::CLIENT_TIMER_SLACK_NS,
    };
    let r = runner::run(&db, &w, &params, &|_| {});
    let rep = SystemReport::new("plain", 1, &r, &profile);
    let phase =
        |name: &str| rep.phases.iter().find(|p| p.phase == name).unwrap_or_else(|| panic!("{name}: {:?}", rep.phases));
    // low 0-1 s; peaks 1-3 and 5-7 s; a valley 3-5 s.
    assert_eq!((phase("low").occurrences, phase("low").seconds), (1, 1));
    assert_eq!((phase("peak").occurrences, phase("peak").seconds), (2, 4));
    assert_eq!((phase("valley").occurrences, phase("valley").seconds), (1, 2));
    for (name, ops) in [("low", 100), ("peak", 1600), ("valley", 400)] {
        let got = phase(name).operations as i64;
        assert!((got - ops).abs() <= 4, "{name}: {got} operations scheduled, expected about {ops}");
        assert!(phase(name).p99_us > 0 && phase(name).p50_us <= phase(name).p99_us);
    }
    assert_eq!(rep.phases.iter().map(|p| p.operations).sum::<u64>(), r.overall.intended.len());
    assert_eq!(rep.windows.len(), 1);
    assert_eq!((rep.windows[0].from_s, rep.windows[0].to_s), (0, 7));
    assert!((rep.windows[0].throughput_ops - 300.0).abs() < 10.0, "{:?}", rep.windows[0]);
    assert_eq!(rep.phase_p99("peak"), Some(phase("peak").p99_us));
}

/// Client threads sleep with the kernel's smallest timer slack (else each
/// sleep may run 50 µs late, latency no system caused), and the run reports
/// how late the requests they slept for were issued.
#[test]
fn clients_sleep_with_the_smallest_timer_slack_and_report_their_lateness() {
    let dir = tempfile::tempdir().unwrap();
    let w = small("mixture");
    let (db, _stage) = slow_db(dir.path(), &w, "unlimited");
    let profile = Profile::Constant { rate: 200.0 };
    let params = RunParams {
        threads: 2,
        duration: Duration::from_secs(1),
        profile: profile.clone(),
        seed: 5,
        drain: Duration::from_secs(1),
        timer_slack_ns: runner::CLIENT_TIMER_SLACK_NS,
    };
    let r = runner::run(&db, &w, &params, &|_| {});
    assert_eq!(r.timer_slack_ns, Some(runner::CLIENT_TIMER_SLACK_NS), "the clients' timer slack");
    // At 100 requests/s per client against an unthrottled DB, clients are
    // early for most requests.
    let slept = r.issue_late.len();
    assert!(slept > r.ops / 2 && slept <= r.ops, "{slept} of {} requests slept for", r.ops);
    let rep = SystemReport::new("plain", 1, &r, &profile);
    let l = rep.issue_lateness.clone().expect("the report has the clients' lateness");
    assert_eq!((l.requests, l.timer_slack_ns), (slept, Some(1)));
    assert!(l.p50_us <= l.p99_us && l.p99_us <= l.max_us, "{l:?}");
    let json = serde_json::to_value(&rep).unwrap();
    assert_eq!(json["issue_lateness"]["requests"].as_u64(), Some(slept), "summary.json has `issue_lateness`");
    let report = one_system_report(rep, 5);
    let table = bench_ycsb::report::table(&report);
    let section = table.split("\nclients: ").nth(1).unwrap_or_else(|| panic!("no clients section:\n{table}"));
    assert!(section.starts_with("how late") && section.contains("timer slack 1 ns"), "{section}");
    let row = section.lines().find(|l| l.starts_with("plain")).unwrap();
    assert_eq!(row.split_whitespace().nth(1), Some(slept.to_string().as_str()), "{row}");
}
