//! Rules files: Paio's shipped files load, TOML and JSON files load, and bad
//! files are rejected with the line and field named and nothing applied.

use std::path::{Path, PathBuf};

use kv_stage::paio::PaioOptions;
use kv_stage::{
    Context, InstanceId, ObjectSpec, Reason, RequestContext as C, RequestType as T, RuleSet, RulesFormat, Stage,
    WorkflowId,
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
        set.extend(RuleSet::load_as(f, RulesFormat::from_path(f).unwrap(), opts).unwrap_or_else(|e| panic!("{e}")));
    }
    set
}

/// Where a write of context `c` and reason `r` goes: `channel/object`.
fn routed(stage: &Stage, c: C, r: Reason) -> Option<String> {
    let ctx = Context::with(WorkflowId(1), T::Write, c, InstanceId(0), 4096).with_reason(r);
    stage.select(&ctx).1.map(|o| o.to_string())
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
        assert_eq!(c.objects[0].kind, kv_stage::object::ObjectKind::Noop);
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

    let stage = Stage::new("levels");
    stage.apply(&RuleSet::load(&example("compaction_levels.toml")).unwrap()).unwrap();
    let at = |c: C, r: Reason| routed(&stage, c, r);
    assert_eq!(at(C::BG_COMPACTION_L0_L0, Reason::L0Files).as_deref(), Some("compaction/l0"));
    assert_eq!(at(C::BG_COMPACTION_L1_L2, Reason::LevelSize).as_deref(), Some("compaction/deep"));
    assert_eq!(at(C::BG_COMPACTION_L2_L3, Reason::LevelSize).as_deref(), Some("compaction/l2_l3"));
    assert_eq!(at(C::BG_COMPACTION_L2_L3, Reason::Ttl).as_deref(), Some("compaction/aged"));
    assert_eq!(at(C::BG_COMPACTION_L4_L5, Reason::Periodic).as_deref(), Some("compaction/aged"));
    assert_eq!(at(C::BG_COMPACTION_L5_L6, Reason::Manual).as_deref(), Some("compaction/manual"));
    assert_eq!(drl_rate(&stage, "compaction", "l2_l3"), 16.0 * 1048576.0);

    let stage = Stage::new("volumes");
    stage.apply(&RuleSet::load(&example("volumes.json")).unwrap()).unwrap();
    let backup = C::lookup("backup").expect("declared by the file");
    let ctx = Context::with(WorkflowId(1), T::Write, backup, InstanceId(1), 10);
    assert_eq!(stage.select(&ctx).1.as_deref(), Some("vol1/backup"));
    assert_eq!(stage.select(&ctx.in_context(C::FOREGROUND)).1.as_deref(), Some("vol1/limits"));
    match stage.object("vol0", "limits").unwrap().spec() {
        Some(ObjectSpec::Qos(q)) => {
            assert_eq!(q.io_max().wbps, None, "the configure rule lifted the write limit");
            assert_eq!(q.limits.riops, Some(kv_stage::iomax::Limit::PerSec(200)));
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

/// The layout (routes and channels) a stage has after applying `set`, as
/// JSON.
fn layout_json(stage: &Stage) -> serde_json::Value {
    let info = stage.stage_info();
    serde_json::json!({
        "default_channel": info.default_channel,
        "routes": info.routes,
        "channels": info.channels,
    })
}

/// Every shipped Paio file builds the layout it built before the per-level
/// contexts existed: the JSON under `tests/paio/layouts` was written by
/// `check_rules` from the code of that time (commit 925162d).
#[test]
fn shipped_paio_files_keep_their_layouts() {
    let cases: [(&str, &[&str]); 5] = [
        ("default_both", &["default_housekeeping_rules_file", "default_enforcement_rules_file"]),
        ("default_housekeeping_rules_file", &["default_housekeeping_rules_file"]),
        ("posix_layer_test_housekeeping_rules", &["posix_layer_test_housekeeping_rules"]),
        ("rocksdb_housekeeping_rules", &["rocksdb_housekeeping_rules"]),
        ("tensorflow_housekeeping_rules", &["tensorflow_housekeeping_rules"]),
    ];
    for (golden, files) in cases {
        for mode in ["context", "workflow"] {
            let opts = PaioOptions { channel_classifiers: mode.parse().unwrap() };
            let files: Vec<PathBuf> = files.iter().map(|f| fixture(f)).collect();
            let stage = Stage::new("golden");
            stage.apply(&load(&files, &opts)).unwrap();
            let path = fixture("layouts").join(format!("{golden}.{mode}.json"));
            let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            assert_eq!(layout_json(&stage), want, "{golden} ({mode}) changed its layout");
        }
    }
}

/// Paio's detailed names each get their context: an L2->L3 object next to
/// an LN object in one channel loads (it was refused as "same
/// differentiation" when every deep compaction was LN), and the LN object
/// gets the compactions no other object names.
#[test]
fn paio_detailed_names_are_distinct_contexts() {
    let text = "1 create_channel 400 lsm_kvs_detailed 400 no_op bg_compaction\n\
                2 create_object 400 1 lsm_kvs_detailed bg_compaction bg_compaction_LN drl 5000 8000000\n\
                3 create_object 400 2 lsm_kvs_detailed bg_compaction bg_compaction_L2_L3 drl 5000 4000000\n\
                4 create_object 400 3 lsm_kvs_detailed bg_compaction bg_compaction_L0_L0 drl 5000 2000000\n\
                5 create_object 400 4 lsm_kvs_detailed bg_compaction bg_compaction_L0_L1 drl 5000 1000000\n\
                6 create_object 400 5 lsm_kvs_detailed bg_compaction bg_compaction_L1_L2 drl 5000 500000\n";
    let set = RuleSet::parse(text, RulesFormat::Paio, Some("detailed".into()), &PaioOptions::default()).unwrap();
    let stage = Stage::new("detailed");
    stage.apply(&set).unwrap();
    let object = |c: C| routed(&stage, c, Reason::None);
    assert_eq!(object(C::BG_COMPACTION_L2_L3).as_deref(), Some("400/2"));
    assert_eq!(object(C::BG_COMPACTION_L1_L2).as_deref(), Some("400/5"));
    assert_eq!(object(C::BG_COMPACTION_L0_L0).as_deref(), Some("400/3"));
    assert_eq!(object(C::BG_COMPACTION_L0_L1).as_deref(), Some("400/4"));
    for deep in [C::BG_COMPACTION_L3_L4, C::BG_COMPACTION_L5_L6, C::compaction(8, 9), C::BG_COMPACTION_LN] {
        assert_eq!(object(deep).as_deref(), Some("400/1"), "{deep}");
    }
    assert_eq!(drl_rate(&stage, "400", "2"), 4e6);
    // The layout shows the per-level contexts by name.
    let info = stage.stage_info();
    let cov = |c: C| info.objects_for_context(c);
    assert_eq!(cov(C::BG_COMPACTION_L2_L3), [("400".to_owned(), "2".to_owned())]);
    // A class reaches the objects of all its members.
    assert_eq!(cov(C::BG_COMPACTION_LN).len(), 3, "{:?}", cov(C::BG_COMPACTION_LN));
    assert_eq!(cov(C::BG_COMPACTION_L0_L1).len(), 2, "{:?}", cov(C::BG_COMPACTION_L0_L1));
}

/// Paio's simple names are the two classes: high priority is L0->L0 and
/// L0->L1, low priority every compaction from L1 down.
#[test]
fn paio_simple_priorities_cover_the_level_pairs() {
    let set = load(&[fixture("rocksdb_housekeeping_rules")], &workflow_mode());
    let stage = Stage::new("rocksdb");
    stage.apply(&set).unwrap();
    let at = |c: C| {
        let ctx = Context::with(WorkflowId(3002), T::Write, c, InstanceId(0), 4096);
        stage.select(&ctx).1.map(|o| o.to_string())
    };
    for c in [C::BG_COMPACTION_L0_L0, C::BG_COMPACTION_L0_L1] {
        assert_eq!(at(c).as_deref(), Some("3002/1"), "{c}");
    }
    for c in [C::BG_COMPACTION_L1_L2, C::BG_COMPACTION_L2_L3, C::compaction(9, 10), C::BG_COMPACTION_LN] {
        assert_eq!(at(c).as_deref(), Some("3002/2"), "{c}");
    }
}

/// TOML rules: a class, a member and a reason; the most specific wins.
#[test]
fn toml_rules_match_level_pairs_and_reasons() {
    let text = r#"
[[rules]]
op = "create_channel"
channel = "compaction"
match = { context = ["bg_compaction_L0_L1", "bg_compaction_LN", "bg_compaction"] }

[[rules]]
op = "create_object"
channel = "compaction"
object = "ln"
spec = { kind = "drl", rate = "40MiB/s" }
match = { context = "bg_compaction_LN" }

[[rules]]
op = "create_object"
channel = "compaction"
object = "l2_l3"
spec = { kind = "drl", rate = "5MB/s" }
match = { context = "bg_compaction_L2_L3" }

[[rules]]
op = "create_object"
channel = "compaction"
object = "ttl"
spec = { kind = "drl", rate = "1MB/s" }
match = { reason = ["ttl", "periodic"] }

[[rules]]
op = "create_object"
channel = "compaction"
object = "manual_deep"
spec = { kind = "drl", rate = "2MB/s" }
match = { context = "bg_compaction_LN", reason = "kManualCompaction" }
"#;
    let set = RuleSet::parse(text, RulesFormat::Toml, Some("levels.toml".into()), &PaioOptions::default()).unwrap();
    let stage = Stage::new("levels");
    stage.apply(&set).unwrap();
    let at = |c: C, r: Reason| routed(&stage, c, r);
    assert_eq!(at(C::BG_COMPACTION_L1_L2, Reason::LevelSize).as_deref(), Some("compaction/ln"));
    assert_eq!(at(C::BG_COMPACTION_L2_L3, Reason::LevelSize).as_deref(), Some("compaction/l2_l3"));
    // Context and reason pinned (score 4) beat the member alone (score 2).
    assert_eq!(at(C::BG_COMPACTION_L2_L3, Reason::Manual).as_deref(), Some("compaction/manual_deep"));
    assert_eq!(at(C::BG_COMPACTION_L4_L5, Reason::Manual).as_deref(), Some("compaction/manual_deep"));
    // One context (score 2) beats a set of reasons (score 1).
    assert_eq!(at(C::BG_COMPACTION_L2_L3, Reason::Ttl).as_deref(), Some("compaction/l2_l3"));
    // L0 compactions: no context object; the reason rule catches TTL ones.
    assert_eq!(at(C::BG_COMPACTION_L0_L1, Reason::Ttl).as_deref(), Some("compaction/ttl"));
    assert_eq!(at(C::BG_COMPACTION_L0_L0, Reason::Periodic).as_deref(), Some("compaction/ttl"));
    assert_eq!(at(C::BG_COMPACTION_L0_L1, Reason::L0Files), None);
    // The route of a reason shows in the layout.
    let info = stage.stage_info();
    let routes = serde_json::to_string(&info.channels).unwrap();
    assert!(routes.contains(r#""reason":["ttl","periodic"]"#), "{routes}");
    assert!(routes.contains(r#""reason":"manual""#), "{routes}");

    // A reason that does not exist is refused with its name and the line.
    let bad = text.replace("kManualCompaction", "by_hand");
    let e = RuleSet::parse(&bad, RulesFormat::Toml, Some("levels.toml".into()), &PaioOptions::default()).unwrap_err();
    assert!(e.to_string().contains("unknown compaction reason 'by_hand'"), "{e}");
    assert!(e.to_string().starts_with("levels.toml:28"), "the line of the rule: {e}");
}

#[test]
fn a_rules_file_format_follows_its_extension_and_an_unknown_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let toml = std::fs::read_to_string(example("rocksdb.toml")).unwrap();
    // The README's TOML under a YAML name: refused by name, not parsed as
    // Paio text (which failed with "field 'id': 'rules:' is not a
    // non-negative integer").
    let yaml = dir.path().join("rules.yaml");
    std::fs::write(&yaml, &toml).unwrap();
    let e = RuleSet::load(&yaml).unwrap_err().to_string();
    assert!(e.contains("rules.yaml") && e.contains("unknown rules file extension '.yaml'"), "{e}");
    // Named explicitly, it is read in that format.
    assert!(RuleSet::load_as(&yaml, RulesFormat::Toml, &PaioOptions::default()).is_ok());
    assert_eq!(RulesFormat::from_path(Path::new("a/rules.TOML")).unwrap(), RulesFormat::Toml);
    assert_eq!(RulesFormat::from_path(Path::new("a/rules.json")).unwrap(), RulesFormat::Json);
    for paio in ["rocksdb_housekeeping_rules", "r.paio", "r.txt", "r.rules"] {
        assert_eq!(RulesFormat::from_path(Path::new(paio)).unwrap(), RulesFormat::Paio, "{paio}");
    }
}
