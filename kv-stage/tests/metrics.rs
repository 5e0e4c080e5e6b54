//! The stage's Prometheus metrics say what the stage counted: bytes and
//! requests per channel, object and context, the waits of a DRL that made
//! requests wait (count, sum and buckets), its configured rate, a QoS
//! object's io.max limits, jobs per instance, and nothing for a stage that
//! is gone.

use std::sync::Arc;

use kv_stage::iomax::IoMax;
use kv_stage::metrics::{StageMetrics, encode_text};
use kv_stage::{
    Context, DrlSpec, InstanceId, Match, ObjectSpec, QosSpec, RequestContext, RequestType, Rule, Stage, units::Rate,
};
use prometheus_client::registry::Registry;

/// The value of the sample `name{labels}` (labels exactly as encoded).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn registry(m: &StageMetrics) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(m.clone()));
    r
}

#[test]
fn a_scrape_reports_what_the_stage_counted() {
    let stage = Arc::new(Stage::new("db"));
    // 64 KiB/s with a 1 KiB burst: of five 4 KiB writes, the first goes
    // once the burst is spent and the others wait about 62 ms each.
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec {
                    rate: "64KiB/s".parse().unwrap(),
                    burst: Some("1KiB".parse().unwrap()),
                    refill_period: None,
                }),
                matches: None,
            },
            Rule::CreateChannel { channel: "vol".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
            Rule::CreateObject {
                channel: "vol".into(),
                object: "qos".into(),
                spec: ObjectSpec::Qos(QosSpec::from_io_max("rbps=1048576 wiops=200".parse::<IoMax>().unwrap())),
                matches: None,
            },
        ])
        .unwrap();
    stage.open_instance(InstanceId(3), "/data/db").unwrap();
    stage.job_started(InstanceId(3), RequestContext::BG_FLUSH);
    stage.job_started(InstanceId(3), RequestContext::BG_FLUSH);
    stage.job_finished(InstanceId(3), RequestContext::BG_FLUSH);
    for _ in 0..5 {
        stage.enforce(&Context::new(RequestType::Write, 4096)).unwrap();
    }
    stage.enforce(&Context::new(RequestType::Write, 100).in_context(RequestContext::BG_FLUSH)).unwrap();

    let m = StageMetrics::new();
    m.add(&stage);
    m.add(&stage); // once only
    let text = encode_text(&registry(&m));

    assert_eq!(sample(&text, r#"kvsds_channel_bytes_total{stage="db",channel="fg"}"#), Some(5.0 * 4096.0), "{text}");
    assert_eq!(sample(&text, r#"kvsds_channel_requests_total{stage="db",channel="fg"}"#), Some(5.0));
    assert_eq!(
        sample(&text, r#"kvsds_object_bytes_total{stage="db",channel="fg",object="drl",kind="drl"}"#),
        Some(20480.0)
    );
    assert_eq!(sample(&text, r#"kvsds_context_bytes_total{stage="db",context="foreground"}"#), Some(20480.0));
    assert_eq!(
        sample(&text, r#"kvsds_object_rate_bytes_per_second{stage="db",channel="fg",object="drl"}"#),
        Some(65536.0)
    );
    assert_eq!(
        sample(&text, r#"kvsds_object_iomax_bytes_per_second{stage="db",channel="vol",object="qos",direction="read"}"#),
        Some(1048576.0)
    );
    assert_eq!(
        sample(&text, r#"kvsds_object_iomax_ops_per_second{stage="db",channel="vol",object="qos",direction="write"}"#),
        Some(200.0)
    );
    assert_eq!(
        sample(&text, r#"kvsds_object_iomax_ops_per_second{stage="db",channel="vol",object="qos",direction="read"}"#),
        None
    );

    // Waits: every request that waited is in the histogram, with its time.
    let stats = stage.object("fg", "drl").unwrap().stats();
    assert!(stats.waits >= 4, "{stats:?}");
    let series = |s: &str| format!(r#"kvsds_object_wait_seconds_{s}{{stage="db",channel="fg",object="drl"}}"#);
    assert_eq!(sample(&text, &series("count")), Some(stats.waits as f64), "{text}");
    let sum = sample(&text, &series("sum")).unwrap();
    assert!((sum - stats.wait_ns as f64 * 1e-9).abs() < 1e-6 && sum > 0.15, "sum {sum} s, {stats:?}");
    let bucket = |le: &str| {
        sample(&text, &format!(r#"kvsds_object_wait_seconds_bucket{{stage="db",channel="fg",object="drl",le="{le}"}}"#))
    };
    // Each waited about 62 ms (more on a loaded machine): none within 10 ms.
    assert_eq!(bucket("0.01"), Some(0.0), "{text}");
    assert_eq!(bucket("+Inf"), Some(stats.waits as f64));
    assert!(bucket("1").unwrap() >= 1.0, "{text}");

    // Jobs per instance and the instance's owner.
    assert_eq!(sample(&text, r#"kvsds_jobs_started_total{stage="db",kv_instance="3",context="bg_flush"}"#), Some(2.0));
    assert_eq!(sample(&text, r#"kvsds_jobs_running{stage="db",kv_instance="3",context="bg_flush"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"kvsds_stage_instance_info{stage="db",kv_instance="3",owner="/data/db"}"#), Some(1.0));

    // Counters are typed and named as Prometheus expects.
    for family in ["kvsds_channel_bytes_total", "kvsds_object_requests_total", "kvsds_jobs_started_total"] {
        assert!(text.contains(&format!("# TYPE {family} counter")), "{family}: {text}");
    }
    assert!(text.contains("# TYPE kvsds_object_wait_seconds histogram"));

    // A rate change shows at the next scrape; an unlimited DRL has no rate.
    stage.configure("fg", "drl", kv_stage::ObjectChange::rate(Rate::UNLIMITED)).unwrap();
    let text = encode_text(&registry(&m));
    assert_eq!(sample(&text, r#"kvsds_object_rate_bytes_per_second{stage="db",channel="fg",object="drl"}"#), None);
    assert!(text.contains("# TYPE kvsds_object_rate_bytes_per_second gauge"), "the family is still described");

    // A stage that is dropped stops appearing.
    drop(stage);
    let text = encode_text(&registry(&m));
    assert!(!text.contains("stage=\"db\""), "{text}");
}

#[test]
fn many_stages_share_one_family_each() {
    let m = StageMetrics::new();
    let stages: Vec<Arc<Stage>> = (0..3).map(|i| Arc::new(Stage::new(format!("s{i}")))).collect();
    for s in &stages {
        s.apply_rules([Rule::CreateChannel { channel: "c".into(), matches: None }]).unwrap();
        s.enforce(&Context::new(RequestType::Read, 10)).unwrap();
        m.add(s);
    }
    let text = encode_text(&registry(&m));
    assert_eq!(text.matches("# TYPE kvsds_context_bytes_total counter").count(), 1, "{text}");
    for i in 0..3 {
        assert_eq!(
            sample(&text, &format!(r#"kvsds_context_bytes_total{{stage="s{i}",context="foreground"}}"#)),
            Some(10.0)
        );
    }
    m.remove(&stages[1]);
    let text = encode_text(&registry(&m));
    assert!(!text.contains("stage=\"s1\"") && text.contains("stage=\"s2\""), "{text}");
}
