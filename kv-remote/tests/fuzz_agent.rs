//! The agent's requests, fuzzed: random bytes as the body of every method
//! (decoded by the agent; the token challenge included), and well-formed messages with random fields
//! (rules text mutated from the shipped rules file, any format number,
//! any rate, settings JSON, leases). No input may panic the agent, stop it
//! serving, or leave a limit beyond its bounds: after every call each DRL
//! is unlimited or at least the agent's lowest rate. Real agent on a Unix
//! socket. Bounded: `FUZZ_CASES` cases per property (default 300).

mod support;

use std::sync::Arc;

use kv_remote::{ClientOptions, Connector, RemoteStage, StageAgent, pb};
use kv_stage::{ObjectSpec, Stage, units::RateUnit};
use proptest::prelude::*;

struct Rig {
    _dir: tempfile::TempDir,
    stage: Arc<Stage>,
    _agent: StageAgent,
    remote: RemoteStage,
    path: std::path::PathBuf,
}

fn rig() -> &'static Rig {
    static RIG: std::sync::OnceLock<Rig> = std::sync::OnceLock::new();
    RIG.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let stage = support::stage("fuzz");
        let path = dir.path().join("fuzz.sock");
        let endpoint = format!("unix:{}", path.display()).parse().unwrap();
        // With a token, so the challenge (which takes no token) is fuzzed
        // with the agent's keys at work.
        let agent = StageAgent::builder(Arc::clone(&stage)).token(TOKEN).serve(&endpoint).unwrap();
        let options = ClientOptions { token: Some(TOKEN.into()), ..ClientOptions::default() };
        let remote = Connector::new(options).unwrap().connect(agent.endpoint()).unwrap();
        Rig { _dir: dir, stage, _agent: agent, remote, path }
    })
}

/// Every DRL is unlimited or at the agent's lowest rate or above, and the
/// agent still answers.
fn still_sound(r: &Rig) {
    for c in r.stage.stage_info().channels {
        for o in c.objects {
            if let Some(ObjectSpec::Drl(d)) = o.spec {
                let floor = if d.rate.unit() == RateUnit::Bytes { 1024.0 } else { 1.0 };
                assert!(d.rate.is_unlimited() || d.rate.per_sec() >= floor, "{}/{}: rate {}", c.id, o.id, d.rate);
            }
        }
    }
    r.remote.collect_now().expect("the agent stopped answering");
}

/// Sends `body` as one gRPC message to `method`, over a fresh HTTP/2
/// connection on the Unix socket; returns the grpc-status.
fn raw(path: &std::path::Path, method: &str, body: &[u8]) -> Option<String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let stream = tokio::net::UnixStream::connect(path).await.unwrap();
        let path = format!("/kvsds.control.v1.{method}");
        support::grpc_raw(stream, &path, support::frame(body), Some(TOKEN)).await.0
    })
}

const TOKEN: &str = "fuzz-token";

const METHODS: [&str; 7] = [
    "StageAgent/Handshake",
    "StageAgent/Collect",
    "StageAgent/CollectAll",
    "StageAgent/GetStageInfo",
    "StageAgent/ApplyRules",
    "StageAgent/Configure",
    "AgentAuth/Challenge",
];

const RULES: &str = include_str!("../../kv-stage/examples/rules/rocksdb.toml");

fn cases() -> u32 {
    std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

fn mutated_rules() -> impl Strategy<Value = String> {
    (prop::collection::vec((any::<usize>(), 0usize..3, any::<u8>()), 0..8), "\\PC{0,40}").prop_map(|(edits, tail)| {
        let mut b = RULES.as_bytes().to_vec();
        for (at, op, byte) in edits {
            let i = at % (b.len() + 1);
            match op {
                0 if i < b.len() => {
                    b.remove(i);
                }
                1 => b.insert(i, byte),
                _ if i < b.len() => b[i] = byte,
                _ => {}
            }
        }
        let mut s = String::from_utf8_lossy(&b).into_owned();
        s.push_str(&tail);
        s
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_to_every_method(method in 0..METHODS.len(), body in prop::collection::vec(any::<u8>(), 0..512)) {
        let r = rig();
        let status = raw(&r.path, METHODS[method], &body);
        prop_assert!(status.is_some(), "{}: no grpc-status for {body:?}", METHODS[method]);
        still_sound(r);
    }

    #[test]
    fn well_formed_messages_with_random_fields(
        text in mutated_rules(),
        format in any::<i32>(),
        lease_ms in prop_oneof![Just(0u64), 1u64..200, Just(1000), any::<u64>()],
        rate in prop_oneof![any::<f64>(), Just(0.0), Just(-1.0), Just(f64::INFINITY), Just(f64::NAN), Just(1e300)],
        json in prop_oneof![
            Just(r#"{"rate":"0B/s"}"#.to_owned()),
            Just(r#"{"burst":1e300}"#.to_owned()),
            Just(r#"{"refill_period":"1h","rate":"1GiB/s"}"#.to_owned()),
            "\\PC{0,60}",
        ],
        channel in prop_oneof![Just("fg".to_owned()), "\\PC{0,10}"],
    ) {
        let r = rig();
        let mut client = r.remote.raw_client();
        let format = if format % 4 == 0 { format } else { format.rem_euclid(4) };
        let _ = r.remote.block_on(client.apply_rules(r.remote.raw_request(pb::ApplyRulesRequest {
            format,
            text,
            source: "fuzz.toml".into(),
            lease_ms,
        })));
        for change in [pb::configure_request::Change::RateBps(rate), pb::configure_request::Change::SettingsJson(json.clone())] {
            let _ = r.remote.block_on(client.configure(r.remote.raw_request(pb::ConfigureRequest {
                channel: channel.clone(),
                object: "drl".into(),
                change: Some(change),
                lease_ms,
            })));
        }
        still_sound(r);
    }
}
