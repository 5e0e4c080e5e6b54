//! Fleet files: what `kvsds-controller --config` accepts and how it names
//! what it refuses.

use kv_remote::FleetConfig;

const HEAD: &str = r#"policy = "max_min"
interval = "500ms"
[fair_share]
device_bandwidth = "6MiB/s"
[[fair_share.instance]]
name = "t1"
demand = "1MiB/s"
channel = "foreground"
object = "drl"
[[fair_share.instance]]
name = "t2"
demand = "unlimited"
channel = "foreground"
object = "drl"
"#;

fn parse(fleet: &str) -> Result<FleetConfig, String> {
    FleetConfig::parse(&format!("{HEAD}{fleet}"), "fleet.toml").map_err(|e| e.to_string())
}

#[test]
fn the_shipped_example_parses() {
    let c =
        FleetConfig::load(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/fleet.toml"))).unwrap();
    assert_eq!(c.units.len(), 3);
    assert_eq!(c.lease(), std::time::Duration::from_millis(1500));
}

#[test]
fn stages_and_hosts() {
    let c = parse(
        "[fleet]\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/tmp/t1.sock\"\n[[fleet.host]]\nendpoint = \"127.0.0.1:7400\"\nstages = [\"t2\"]\n",
    )
    .unwrap();
    assert_eq!(c.units.len(), 2);
    assert_eq!(c.lease(), std::time::Duration::from_millis(1500), "3 intervals by default");
    assert!(c.token.is_none());
}

#[test]
fn bad_fleet_files_name_the_key() {
    for (fleet, want) in [
        ("", "no [fleet] table"),
        ("[fleet]\n", "list at least one"),
        ("[fleet]\nbogus = 1\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n", "unknown field `bogus`"),
        ("[fleet]\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"nowhere\"\n", "fleet.stage[0].endpoint"),
        (
            "[fleet]\n[[fleet.stage]]\nname = \"zz\"\nendpoint = \"unix:/x\"\n",
            "fleet.stage[0].name: 'zz' is not a fair_share.instance",
        ),
        (
            "[fleet]\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/y\"\n",
            "fleet.stage[1].name: 't1' is listed twice",
        ),
        (
            "[fleet]\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n[[fleet.host]]\nendpoint = \"unix:/y\"\nstages = [\"t1\"]\n",
            "fleet.host[0].stages[0]: 't1' is listed twice",
        ),
        ("[fleet]\nlease = \"0s\"\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n", "fleet.lease"),
        (
            "[fleet]\nlease = \"900ms\"\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n",
            "fleet.lease: 900ms is shorter than two control intervals (500ms each)",
        ),
        (
            "[fleet]\ntoken = \"a\"\ntoken_file = \"/x\"\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n",
            "token or token_file",
        ),
    ] {
        let e = parse(fleet).unwrap_err();
        assert!(e.starts_with("fleet.toml: ") && e.contains(want), "{fleet:?}: {e}");
    }
    let e = FleetConfig::parse(
        "policy = \"max_min\"\n[fleet]\n[[fleet.stage]]\nname = \"t1\"\nendpoint = \"unix:/x\"\n",
        "f.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("fair_share"), "{e}");
}
