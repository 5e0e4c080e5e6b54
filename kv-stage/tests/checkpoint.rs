//! `Stage::checkpoint` / `Stage::restore`: a stage brought back to an
//! earlier layout and settings, whatever was changed in between, and the
//! cap on all of a stage's route tables together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_stage::{
    Context, DrlSpec, InstanceId, Match, ObjectChange, ObjectSpec, QosSpec, RequestContext, RequestType, Rule, Stage,
    WorkflowId, rule::FieldMatch, units::Rate,
};

fn fg() -> Context {
    Context::new(RequestType::Write, 64 << 10).in_context(RequestContext::FOREGROUND)
}

fn wbps_8mib() -> QosSpec {
    QosSpec { limits: "wbps=8MiB".parse().unwrap(), ..QosSpec::default() }
}

fn tenant_stage() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("checkpoint"));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new("64MiB/s".parse().unwrap())),
                matches: None,
            },
            Rule::CreateChannel { channel: "flush".into(), matches: Some(Match::context(RequestContext::BG_FLUSH)) },
            Rule::CreateObject {
                channel: "flush".into(),
                object: "qos".into(),
                spec: ObjectSpec::Qos(wbps_8mib()),
                matches: None,
            },
        ])
        .unwrap();
    stage
}

#[test]
fn restore_undoes_structural_and_enforcement_changes_and_releases_the_jailed() {
    let stage = tenant_stage();
    let before = stage.stage_info();
    let fg_bytes = |s: &Stage| s.collect().channel("fg").map_or(0, |c| c.bytes);
    stage.enforce(&fg()).unwrap();
    let qos_before = stage.object("flush", "qos").unwrap().spec();
    let checkpoint = stage.checkpoint();
    // What a hostile or broken controller could do: drop the foreground
    // channel, send foreground requests to a channel of 1 KiB/s, change
    // the flush QoS and take its write limit off.
    stage
        .apply_rules([
            Rule::RemoveChannel { channel: "fg".into() },
            Rule::CreateChannel { channel: "jail".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "jail".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new("1KiB/s".parse().unwrap())),
                matches: None,
            },
            Rule::configure("flush", "qos", ObjectChange::new().with("wbps", "max").with("riops", 10)),
        ])
        .unwrap();
    assert_eq!(&*stage.select(&fg()).0, "jail");
    // A foreground request waits in the jail (64 KiB at 1 KiB/s: a minute).
    let jailed = {
        let stage = Arc::clone(&stage);
        std::thread::spawn(move || {
            let t = Instant::now();
            let r = stage.enforce(&fg());
            (r.is_ok(), t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let report = stage.restore(&checkpoint).unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    let (ok, waited) = jailed.join().unwrap();
    assert!(ok, "the jailed request must be admitted, not failed");
    assert!(waited < Duration::from_secs(10), "the jailed request waited {waited:?}");
    // The layout and every setting are the checkpoint's again.
    let after = stage.stage_info();
    assert_eq!(after.channels, before.channels);
    assert_eq!(after.routes, before.routes);
    assert_eq!(after.default_channel, before.default_channel);
    assert_eq!(stage.select(&fg()), ("fg".into(), Some("fg/drl".into())));
    // The foreground channel is a new incarnation: it counts from zero.
    let counted = fg_bytes(&stage);
    stage.enforce(&fg()).unwrap();
    assert_eq!(fg_bytes(&stage), counted + (64 << 10));
    // The flush QoS was rebuilt with its old limits, nothing else set.
    assert_eq!(stage.object("flush", "qos").unwrap().spec(), qos_before);
    // Restoring again changes nothing but the generation.
    stage.restore(&checkpoint).unwrap();
    assert_eq!(stage.stage_info().channels, before.channels);
}

#[test]
fn an_unchanged_object_is_kept_with_its_state_and_a_changed_rate_comes_back() {
    let stage = tenant_stage();
    let checkpoint = stage.checkpoint();
    stage.configure("fg", "drl", ObjectChange::rate("1MiB/s".parse().unwrap())).unwrap();
    let flush_qos = stage.object("flush", "qos").unwrap().stats();
    stage.restore(&checkpoint).unwrap();
    assert_eq!(
        stage.object("fg", "drl").unwrap().spec(),
        Some(ObjectSpec::Drl(DrlSpec::new("64MiB/s".parse().unwrap())))
    );
    // The QoS object was not changed: the same object, its counters kept.
    assert_eq!(stage.object("flush", "qos").unwrap().stats(), flush_qos);
}

#[test]
fn a_checkpoint_of_another_stage_is_refused() {
    let (a, b) = (tenant_stage(), tenant_stage());
    let err = b.restore(&a.checkpoint()).unwrap_err().to_string();
    assert!(err.contains("another stage"), "{err}");
}

#[test]
fn all_route_tables_of_a_stage_together_are_capped() {
    // One object route pinning 1023 workflows and 1023 instances needs
    // a table of 1024 x 1024 cells, just within the per-table cap.
    let mut wide = Match::any();
    wide.workflow = FieldMatch::set((1..=1023).map(WorkflowId));
    wide.instance = FieldMatch::set((1..=1023).map(InstanceId));
    let channel = |i: usize| {
        let c = format!("c{i}");
        [
            Rule::CreateChannel { channel: c.clone(), matches: None },
            Rule::CreateObject {
                channel: c,
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
                matches: Some(wide.clone()),
            },
        ]
    };
    let stage = Stage::new("cells");
    stage.apply_rules(channel(0)).unwrap();
    let generation = stage.collect().generation;
    // Thirty of them would be 30 Mi cells (120 MiB); the stage takes four
    // in all, so this batch fails, and whole.
    let err = stage.apply_rules((1..30).flat_map(channel)).unwrap_err().to_string();
    assert!(err.contains("for all of a stage's tables"), "{err}");
    assert_eq!(stage.collect().generation, generation);
    assert_eq!(stage.stage_info().channels.len(), 2, "default and c0 only");
}
