//! Volumes with `io.max` limits: the example file loads and routes, limits
//! are shown in `io.max` syntax, change live like a write to `io.max`, and
//! bad volumes are refused with their line and field, nothing applied.

use std::path::Path;

use kv_stage::iomax::{DeviceNumber, IoMax, IoMaxLine};
use kv_stage::paio::PaioOptions;
use kv_stage::volumes::FIRST_FILE_VOLUME_INSTANCE;
use kv_stage::{
    Context, InstanceId, ObjectChange, ObjectSpec, QosSpec, RequestContext as C, RequestType as T, RuleSet,
    RulesFormat, Stage, WorkflowId,
    volumes::{Volume, VolumeSelector},
};

fn example() -> RuleSet {
    RuleSet::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules/volumes.toml")).unwrap()
}

fn toml(text: &str) -> kv_stage::Result<RuleSet> {
    RuleSet::parse(text, RulesFormat::Toml, Some("v.toml".into()), &PaioOptions::default())
}

fn limits(stage: &Stage, volume: &str) -> IoMax {
    match stage.object(volume, "limits").and_then(|o| o.spec()) {
        Some(ObjectSpec::Qos(q)) => q.io_max(),
        other => panic!("{volume}: {other:?}"),
    }
}

#[test]
fn the_example_file_builds_one_channel_per_volume() {
    let rules = example();
    let names: Vec<&str> = rules.volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["db", "logs", "254:0", "orders", "tenant-a", "backups"]);
    assert!(rules.volumes[5].tag.is_some());
    assert_eq!(rules.volumes[0].selector, VolumeSelector::Path("/var/lib/kvsds/db".into()));
    assert_eq!(rules.volumes[2].selector, VolumeSelector::Device(DeviceNumber::new(254, 0)));
    // Path and device volumes get instances from the reserved range, in order.
    let inst: Vec<Option<u16>> = rules.volumes.iter().map(|v| v.instance.map(|i| i.0)).collect();
    let f = FIRST_FILE_VOLUME_INSTANCE;
    assert_eq!(inst, [Some(f), Some(f + 1), Some(f + 2), Some(2), None, Some(f + 3)]);

    let stage = Stage::new("volumes");
    stage.apply(&rules).unwrap();
    // The file declares `backup`; applying it registers the name (another
    // test in this binary may have done so first, so only now is the
    // lookup certain).
    assert_eq!(rules.volumes[5].tag, C::lookup("backup"));
    let at = |instance: u16, context: C| {
        let ctx = Context::with(WorkflowId(1), T::Write, context, InstanceId(instance), 4096);
        let (c, o) = stage.select(&ctx);
        o.map_or(format!("{c}/-"), |o| o.to_string())
    };
    assert_eq!(at(f, C::FOREGROUND), "db/limits");
    assert_eq!(at(f + 2, C::BG_FLUSH), "254:0/limits");
    assert_eq!(at(2, C::FOREGROUND), "orders/limits");
    assert_eq!(at(7, C::lookup("tenant_a").unwrap()), "tenant-a/limits");
    // A tagged path volume: its requests carry `backup`; the file's rule
    // sends its writes to the crawl DRL, the rest to the volume's limits.
    let backup = C::lookup("backup").unwrap();
    assert_eq!(at(f + 3, backup), "backups/crawl");
    let read = Context::with(WorkflowId(1), T::Read, backup, InstanceId(f + 3), 4096);
    assert_eq!(stage.select(&read).1.as_deref(), Some("backups/limits"));
    // A request of no volume is untouched: the default channel, no object.
    assert_eq!(at(7, C::FOREGROUND), "default/-");

    // Shown in io.max syntax, every key, max where unset.
    assert_eq!(limits(&stage, "db").to_string(), "rbps=max wbps=4194304 riops=max wiops=max");
    assert_eq!(limits(&stage, "orders").to_string(), "rbps=max wbps=max riops=3000 wiops=1500");
    let info = serde_json::to_string(&stage.stage_info()).unwrap();
    assert!(info.contains(r#""limits":"rbps=67108864 wbps=16777216 riops=max wiops=2000""#), "{info}");
}

#[test]
fn limits_change_live_like_a_write_to_io_max() {
    let stage = Stage::new("live");
    stage.apply(&example()).unwrap();
    let line: IoMaxLine = "db wbps=8MiB riops=100".parse().unwrap();
    stage.apply_rules([Volume::limit_rule(&line)]).unwrap();
    assert_eq!(limits(&stage, "db").to_string(), "rbps=max wbps=8388608 riops=100 wiops=max");
    // Keys the line leaves out keep their limit; `max` lifts one.
    stage.apply_rules([Volume::limit_rule(&"db riops=max".parse().unwrap())]).unwrap();
    assert_eq!(limits(&stage, "db").to_string(), "rbps=max wbps=8388608 riops=max wiops=max");
    // A device volume by its MAJ:MIN, as the kernel's io.max names it.
    stage.apply_rules([Volume::limit_rule(&"254:0 wbps=max wiops=50".parse().unwrap())]).unwrap();
    assert_eq!(limits(&stage, "254:0").to_string(), "rbps=209715200 wbps=max riops=max wiops=50");
    // The same change written in a rules file.
    let change = toml(
        "[[rules]]\nop = \"configure\"\nchannel = \"logs\"\nobject = \"limits\"\nset = { limits = \"wbps=1MiB\" }\n",
    )
    .unwrap();
    stage.apply(&change).unwrap();
    assert_eq!(limits(&stage, "logs").to_string(), "rbps=67108864 wbps=1048576 riops=max wiops=2000");
    // A bad change is refused and applies nothing.
    let before = limits(&stage, "db");
    let bad = stage.apply_rules([
        Volume::limit_rule(&"db wbps=1MiB".parse().unwrap()),
        Volume::limit_rule(&"nosuch wbps=1MiB".parse().unwrap()),
    ]);
    assert!(bad.unwrap_err().to_string().contains("nosuch"));
    assert_eq!(limits(&stage, "db"), before);
}

#[test]
fn bad_volumes_name_line_and_field() {
    let good = "[[volumes]]\nname = \"a\"\npath = \"/a\"\nlimits = \"wbps=1MiB\"\n\n";
    for (bad, field, words) in [
        ("[[volumes]]\nname = \"b\"\nlimits = \"wbps=1MiB\"\n", "volumes", "exactly one of"),
        ("[[volumes]]\nname = \"b\"\npath = \"/b\"\ninstance = 3\n", "volumes", "path, instance"),
        ("[[volumes]]\nname = \"b\"\npath = \"/b\"\nlimits = \"wbps=-1\"\n", "limits", "wbps: "),
        ("[[volumes]]\nname = \"b\"\npath = \"/b\"\nlimits = \"wxps=1\"\n", "limits", "unknown key"),
        ("[[volumes]]\nname = \"b\"\npath = \"b\"\n", "path", "not an absolute path"),
        ("[[volumes]]\nname = \"a\"\npath = \"/b\"\n", "name", "declared twice"),
        ("[[volumes]]\nname = \"b\"\ninstance = 65000\n", "instance", "reserved"),
        ("[[volumes]]\nname = \"b\"\ndevice = \"8-0\"\n", "device", "MAJ:MIN"),
        ("[[volumes]]\nname = \"b\"\ncontext = \"nobody\"\n", "context", "unknown request context"),
        ("[[volumes]]\npath = \"/b\"\n", "name", "needs a `name`"),
        ("[[volumes]]\nname = \"b c\"\npath = \"/b\"\n", "name", "not a volume name"),
        ("[[volumes]]\nname = \"b\"\ninstance = 3\ntag = \"foreground\"\n", "tag", "only path and device"),
        ("[[volumes]]\nname = \"b\"\npath = \"/b\"\ntag = \"nobody\"\n", "tag", "unknown request context"),
    ] {
        let e = toml(&format!("{good}{bad}")).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("v.toml:6"), "{bad}: {msg}");
        assert_eq!(e.field(), Some(field), "{bad}: {msg}");
        assert!(msg.contains(words), "{bad}: {msg}");
    }
    // The same volume in JSON, with its line.
    let e = RuleSet::parse(
        "{\n\"volumes\": [\n {\"name\": \"a\", \"path\": \"/a\"},\n {\"name\": \"b\", \"path\": \"/b\", \"limits\": \"rbps=0\"}\n]}",
        RulesFormat::Json,
        Some("v.json".into()),
        &PaioOptions::default(),
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("v.json:4"), "{e}");
    assert_eq!(e.field(), Some("limits"));
}

#[test]
fn qos_specs_read_io_max_and_fields_but_not_both_for_one_key() {
    let spec = |t: &str| toml::from_str::<ObjectSpec>(t);
    let Ok(ObjectSpec::Qos(a)) = spec("kind = \"qos\"\nlimits = \"rbps=8MiB wbps=max riops=200\"") else { panic!() };
    let Ok(ObjectSpec::Qos(b)) = spec("kind = \"qos\"\nrbps = \"8Mi\"\nwbps = \"max\"\nriops = 200") else { panic!() };
    assert_eq!(a, b);
    assert_eq!(a.io_max_line(DeviceNumber::new(254, 0)), "254:0 rbps=8388608 wbps=max riops=200 wiops=max");
    // Shown with the keys it sets, in io.max syntax, and read back the same.
    let shown = toml::to_string(&ObjectSpec::Qos(a.clone())).unwrap();
    assert_eq!(shown, "kind = \"qos\"\nlimits = \"rbps=8388608 wbps=max riops=200\"\n");
    assert_eq!(spec(&shown).unwrap(), ObjectSpec::Qos(a));
    let e = spec("kind = \"qos\"\nlimits = \"wbps=1MiB\"\nwbps = \"2MiB\"").unwrap_err().to_string();
    assert!(e.contains("wbps: given both"), "{e}");
    // A limit below 1/s is refused as it is read, naming its key.
    let e = spec("kind = \"qos\"\nriops = 0.5").unwrap_err().to_string();
    assert!(e.contains("riops: 0.5 is below 1/s"), "{e}");
    let e = ObjectChange::parse::<QosSpec>(&serde_json::from_str(r#"{"riops": 0.5}"#).unwrap(), "QoS").unwrap_err();
    assert_eq!((e.field.as_str(), e.message.starts_with("0.5 is below 1/s")), ("riops", true), "{e}");
}
