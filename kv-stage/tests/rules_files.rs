//! Rules files: Paio's shipped files load, TOML and JSON files load, and bad
//! files are rejected with the line and field named and nothing applied.

use std::path::{Path, PathBuf};

use kv_stage::paio::PaioOptions;
use kv_stage::{
    Context, InstanceId, ObjectSpec, RequestContext as C, RequestType as T, RuleSet, RulesFormat, Stage, WorkflowId,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/paio").join(name)
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules").join(name)
}

fn workflow_mode() -> PaioOptions {
    PaioOptions { channel_classifiers: "workflow".parse().unwrap() }
}

fn load(files: &[PathBuf], opts: &PaioOptions) -> RuleSet {
    let mut set = RuleSet::default();
    for f in files {
        set.extend(RuleSet::load_as(f, RulesFormat::from_path(f), opts).unwrap_or_else(|e| panic!("{e}")));
    }
    set
}

fn drl_rate(stage: &Stage, channel: &str, object: &str) -> f64 {
    match stage.object(channel, object).and_then(|o| o.spec()) {
        Some(ObjectSpec::Drl(d)) => d.rate.per_sec(),
        other => panic!("{channel}/{object} is not a DRL: {other:?}"),
    }
}

#[test]
fn paio_rocksdb_rules_build_foreground_flush_and_compaction_channels() {
    let set = load(&[fixture("rocksdb_housekeeping_rules")], &workflow_mode());
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    let stage = Stage::new("rocksdb");
    stage.apply(&set).unwrap();
    let info = stage.stage_info();
    assert_eq!(info.channels.len(), 1 + 8 + 1 + 7);
    for ch in 1000..1008 {
        let c = info.channels.iter().find(|c| c.id == ch.to_string()).unwrap();
        assert_eq!(c.objects.len(), 1);
        assert_eq!(c.objects[0].kind, kv_stage::ObjectKind::Noop);
    }
    assert_eq!(drl_rate(&stage, "2000", "1"), 12e6);
    for ch in 3000..3007 {
        assert_eq!(drl_rate(&stage, &ch.to_string(), "1"), 12e6);
        assert_eq!(drl_rate(&stage, &ch.to_string(), "2"), 6e6);
    }
    // Workflow 3002 doing an LN compaction lands on the low-priority DRL of
    // channel 3002; workflow 1005 doing client I/O on its Noop.
    let ln = Context::with(WorkflowId(3002), T::Write, C::BG_COMPACTION_LN, InstanceId(0), 4096);
    assert_eq!(stage.select(&ln).1.as_deref(), Some("3002/2"));
    let l0 = ln.in_context(C::BG_COMPACTION_L0_L1);
    assert_eq!(stage.select(&l0).1.as_deref(), Some("3002/1"));
    let fg = Context::with(WorkflowId(1005), T::Read, C::FOREGROUND, InstanceId(0), 4096);
    assert_eq!(stage.select(&fg).1.as_deref(), Some("1005/1"));
    // A workflow no rule names goes to the pass-through default channel.
    assert_eq!(&*stage.select(&fg.in_workflow(WorkflowId(42))).0, "default");
}

#[test]
fn paio_default_files_load_in_both_classifier_modes() {
    for opts in [PaioOptions::default(), workflow_mode()] {
        let set = load(&[fixture("default_housekeeping_rules_file"), fixture("default_enforcement_rules_file")], &opts);
        let stage = Stage::new("defaults");
        let report = stage.apply(&set).unwrap();
        // `drl 0 0` means Paio's defaults; the enforcement file then sets
        // 150 000 B/s with a 10 ms period on the DRLs. Its DRL rules for the
        // two Noop objects are skipped, as Paio ignores them.
        assert_eq!(drl_rate(&stage, "3000", "1"), 150_000.0);
        assert_eq!(drl_rate(&stage, "4000", "1"), 150_000.0);
        assert_eq!(report.warnings.len(), 4, "{:?}", report.warnings);
        assert!(report.warnings.iter().all(|w| w.contains("noop")));
    }
    // Under the context-only setting channels 3000 and 4000 have the same
    // (empty) differentiation: the second loads without a route, with a warning.
    let set = load(&[fixture("default_housekeeping_rules_file")], &PaioOptions::default());
    assert_eq!(set.warnings.len(), 1);
    assert!(set.warnings[0].contains("4000"));
}

#[test]
fn paio_posix_and_tensorflow_rules_load() {
    let set = load(&[fixture("posix_layer_test_housekeeping_rules")], &workflow_mode());
    let stage = Stage::new("posix");
    stage.apply(&set).unwrap();
    assert_eq!(drl_rate(&stage, "2000", "1"), 1073741824.0);
    // Object routes follow the call type.
    let write = Context::with(WorkflowId(2000), T::Write, C::FOREGROUND, InstanceId(0), 10);
    assert_eq!(stage.select(&write).1.as_deref(), Some("2000/1"));
    assert_eq!(stage.select(&Context { request_type: T::Read, ..write }).1, None);

    // By request type instead of workflow: one channel per call type.
    let set = load(
        &[fixture("posix_layer_test_housekeeping_rules")],
        &PaioOptions { channel_classifiers: "type".parse().unwrap() },
    );
    let stage = Stage::new("posix-by-type");
    stage.apply(&set).unwrap();
    assert_eq!(&*stage.select(&Context { workflow: WorkflowId(7), ..write }).0, "2000");

    let set = load(&[fixture("tensorflow_housekeeping_rules")], &workflow_mode());
    let stage = Stage::new("tf");
    stage.apply(&set).unwrap();
    assert_eq!(drl_rate(&stage, "1000", "1"), 52428800.0);
}

#[test]
fn example_rules_files_load() {
    let stage = Stage::new("examples");
    stage.apply(&RuleSet::load(&example("rocksdb.toml")).unwrap()).unwrap();
    assert_eq!(drl_rate(&stage, "compaction", "ln"), 10.0 * 1048576.0);
    assert!(stage.object("flush", "drl").is_some());
    // A controller finds the objects serving a context from the layout.
    let info = stage.stage_info();
    let pair = |c: &str, o: &str| (c.to_owned(), o.to_owned());
    assert_eq!(info.objects_for_context(C::BG_FLUSH), [pair("flush", "drl")]);
    assert_eq!(info.objects_for_context(C::BG_COMPACTION_L0_L1), [pair("compaction", "l0")]);
    assert_eq!(info.objects_for_context(C::BG_COMPACTION_LN), [pair("compaction", "ln")]);
    assert_eq!(info.objects_for_context(C::FOREGROUND), [pair("foreground", "noop")]);
    assert_eq!(info.object("compaction", "ln").map(|o| o.kind.as_str()), Some("drl"));
    assert!(info.object("compaction", "nope").is_none() && info.object("nope", "ln").is_none());

    let stage = Stage::new("volumes");
    stage.apply(&RuleSet::load(&example("volumes.json")).unwrap()).unwrap();
    let backup = C::lookup("backup").expect("declared by the file");
    let ctx = Context::with(WorkflowId(1), T::Write, backup, InstanceId(1), 10);
    assert_eq!(stage.select(&ctx).1.as_deref(), Some("vol1/backup"));
    assert_eq!(stage.select(&ctx.in_context(C::FOREGROUND)).1.as_deref(), Some("vol1/limits"));
    match stage.object("vol0", "limits").unwrap().spec() {
        Some(ObjectSpec::Qos(q)) => {
            assert!(q.wbps.is_none(), "the configure rule lifted the write limit");
            assert_eq!(q.riops.unwrap().per_sec(), 200.0);
        }
        other => panic!("{other:?}"),
    }
}

/// A TOML file of six good rules with a bad one spliced in at `line`.
fn toml_with(bad: &str) -> String {
    format!(
        r#"version = 1

[[rules]]
id = 1
op = "create_channel"
channel = "flush"
match = {{ context = "bg_flush" }}

[[rules]]
id = 2
op = "create_object"
channel = "flush"
object = "drl"
spec = {{ kind = "drl", rate = "64MiB/s" }}

{bad}
"#
    )
}

fn apply_toml(text: &str) -> (Stage, kv_stage::Error) {
    let stage = Stage::new("bad");
    let e = match RuleSet::parse(text, RulesFormat::Toml, Some("rules.toml".into()), &PaioOptions::default()) {
        Err(e) => e,
        Ok(set) => stage.apply(&set).err().unwrap_or_else(|| panic!("must be rejected: {text}")),
    };
    (stage, e)
}

#[test]
fn bad_toml_rules_name_line_and_field_and_apply_nothing() {
    let cases = [
        (
            "[[rules]]\nid = 3\nop = \"configure\"\nchannel = \"nope\"\nobject = \"drl\"\nset = { rate = \"1MiB/s\" }",
            "channel",
            "unknown channel 'nope'",
        ),
        (
            "[[rules]]\nid = 3\nop = \"configure\"\nchannel = \"flush\"\nobject = \"nope\"\nset = { rate = \"1MiB/s\" }",
            "object",
            "unknown object 'nope'",
        ),
        (
            "[[rules]]\nid = 3\nop = \"configure\"\nchannel = \"flush\"\nobject = \"drl\"\nset = { rbps = \"1MiB/s\" }",
            "rbps",
            "not a DRL setting",
        ),
        (
            "[[rules]]\nid = 3\nop = \"configure\"\nchannel = \"flush\"\nobject = \"drl\"\nset = { refill_period = \"0ms\" }",
            "refill_period",
            "greater than zero",
        ),
        ("[[rules]]\nid = 2\nop = \"create_channel\"\nchannel = \"x\"", "id", "duplicate rule id 2"),
        ("[[rules]]\nid = 3\nop = \"create_channel\"\nchannel = \"flush\"", "channel", "already exists"),
        ("[[rules]]\nid = 3\nop = \"create_channel\"\nchannel = \"bad name\"", "channel", "not a valid id"),
        (
            "[[rules]]\nid = 3\nop = \"route\"\nchannel = \"flush\"\nmatch = { context = \"bg_flush\" }",
            "match",
            "set twice in this batch",
        ),
        (
            "[[rules]]\nid = 3\nop = \"create_channel\"\nchannel = \"other\"\nmatch = { context = [\"bg_flush\", \"foreground\"] }\n\n[[rules]]\nid = 4\nop = \"create_channel\"\nchannel = \"other2\"\nmatch = { context = [\"foreground\", \"background\"] }",
            "match",
            "equal specificity",
        ),
        ("[[rules]]\nid = 3\nop = \"remove_channel\"\nchannel = \"default\"", "channel", "default channel"),
        (
            "[[rules]]\nid = 3\nop = \"create_object\"\nchannel = \"flush\"\nobject = \"second\"\nspec = { kind = \"noop\" }",
            "match",
            "already has a default object",
        ),
    ];
    for (bad, field, msg) in cases {
        let text = toml_with(bad);
        let (stage, e) = apply_toml(&text);
        let line = e.location().and_then(|l| l.line).unwrap_or_else(|| panic!("no line in: {e}"));
        // The error points into the bad part, which starts at line 16.
        assert!(line >= 16, "{bad}: line {line}: {e}");
        assert_eq!(e.field(), Some(field), "{bad}: {e}");
        assert!(e.to_string().contains(msg), "{bad}: {e}");
        assert!(e.to_string().starts_with(&format!("rules.toml:{line}")), "{e}");
        // All or nothing: not even the good rules before it were applied.
        let info = stage.stage_info();
        assert_eq!(info.channels.len(), 1, "{bad}: rules were half-applied");
        assert_eq!(info.generation, 0);
    }
}

#[test]
fn a_failed_batch_leaves_live_objects_untouched() {
    let stage = Stage::new("live");
    stage.apply(&RuleSet::load(&example("rocksdb.toml")).unwrap()).unwrap();
    let before = stage.stage_info();
    // The first rule is valid and would lower a rate; the second is rejected
    // when applied (a burst and a refill period together).
    let text = r#"
[[rules]]
op = "configure"
channel = "flush"
object = "drl"
set = { rate = "1MiB/s" }

[[rules]]
op = "configure"
channel = "compaction"
object = "l0"
set = { burst = "1MiB", refill_period = "10ms" }
"#;
    let set = RuleSet::parse(text, RulesFormat::Toml, None, &PaioOptions::default()).unwrap();
    let e = stage.apply(&set).unwrap_err();
    assert_eq!(e.location().unwrap().line, Some(8), "{e}");
    assert_eq!(e.field(), Some("burst"), "{e}");
    assert_eq!(stage.stage_info(), before, "the first rule must not have been applied");
}

#[test]
fn json_errors_name_the_rule_line() {
    let text = "{\n  \"version\": 1,\n  \"rules\": [\n    {\"op\": \"create_channel\", \"channel\": \"a\"},\n\n    {\"op\": \"configure\", \"channel\": \"a\", \"object\": \"x\", \"set\": {\"rate\": \"1MiB/s\"}}\n  ]\n}";
    let set = RuleSet::parse(text, RulesFormat::Json, Some("r.json".into()), &PaioOptions::default()).unwrap();
    let e = Stage::new("j").apply(&set).unwrap_err();
    assert!(e.to_string().starts_with("r.json:6"), "{e}");
    assert_eq!(e.field(), Some("object"));
}
