//! The agent against what a controller (or anyone on the socket) may send:
//! refused versions and tokens, truncated and oversized frames, garbage
//! bytes, a rules set with one bad rule, and leases that run out. Real
//! agents on real sockets, in this process.

mod support;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use controller::StageHandle;
use kv_remote::{AgentLimits, ClientOptions, Connector, Endpoint, Fallback, StageAgent, pb};
use kv_stage::{ObjectChange, RequestContext, Rule, RuleSet, RulesFormat, Stage, units::Rate};
use support::{drl_rate, stage, wait_until};

fn loopback() -> Endpoint {
    "127.0.0.1:0".parse().unwrap()
}

/// The token the TCP agents of these tests take (a TCP listener needs one).
const TOKEN: &str = "test-token";

/// An agent on a loopback port, with [`TOKEN`].
fn tcp_agent(s: &Arc<Stage>) -> StageAgent {
    StageAgent::builder(Arc::clone(s)).token(TOKEN).serve(&loopback()).unwrap()
}

/// A connector sending [`TOKEN`] (unless `f` says otherwise).
fn connector(f: impl FnOnce(&mut ClientOptions)) -> Connector {
    let mut o = ClientOptions { token: Some(TOKEN.into()), ..ClientOptions::default() };
    f(&mut o);
    Connector::new(o).unwrap()
}

/// Runs `f` while a tenant thread enforces requests through `stage`;
/// asserts the tenant is served before and after `f` and that none of its
/// requests failed.
fn with_tenant(stage: &Arc<Stage>, f: impl FnOnce()) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tenant = {
        let (stage, stop, done, failed) =
            (Arc::clone(stage), Arc::clone(&stop), Arc::clone(&done), Arc::clone(&failed));
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                let ctx =
                    kv_stage::Context::new(kv_stage::RequestType::Write, 4096).in_context(RequestContext::FOREGROUND);
                match stage.enforce(&ctx) {
                    Ok(_) => done.fetch_add(1, Ordering::Relaxed),
                    Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                };
                std::thread::sleep(Duration::from_micros(100));
            }
        })
    };
    // Served before, during and after the bad input.
    let progress = |from: u64| {
        let t = Instant::now();
        while done.load(Ordering::Relaxed) <= from {
            assert!(t.elapsed() < Duration::from_secs(5), "the tenant is not served");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    progress(0);
    f();
    progress(done.load(Ordering::Relaxed));
    stop.store(true, Ordering::Relaxed);
    tenant.join().unwrap();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "the tenant's requests failed");
}

/// The agent still serves its stage: a fresh, well-behaved client reads it.
fn still_serves(agent: &StageAgent, token: Option<&str>) {
    let c = connector(|o| o.token = token.map(str::to_owned));
    let remote = c.connect(agent.endpoint()).expect("the agent still answers");
    remote.collect_now().expect("and collects");
}

#[test]
fn wrong_protocol_version_is_refused_by_name() {
    let s = stage("versions");
    let agent = tcp_agent(&s);
    let mut err = String::new();
    with_tenant(&s, || err = connector(|o| o.protocol_version = 2).connect(agent.endpoint()).unwrap_err().to_string());
    assert!(err.contains("FailedPrecondition") && err.contains("protocol version 2 is not supported"), "{err}");
    assert!(err.contains("kvsds.control.v1"), "{err}");
    assert_eq!(agent.stats().refused_version, 1);
    still_serves(&agent, Some(TOKEN));
}

#[test]
fn tokens_are_checked_and_refusals_counted() {
    let s = stage("tokens");
    let agent = StageAgent::builder(Arc::clone(&s)).token("s3cret-token").serve(&loopback()).unwrap();
    let mut wrong = String::new();
    with_tenant(&s, || {
        wrong = connector(|o| o.token = Some("guess".into())).connect(agent.endpoint()).unwrap_err().to_string();
    });
    // The client refuses an agent that does not know its token: no call.
    assert!(wrong.contains("does not know this client's token"), "{wrong}");
    assert_eq!(agent.stats().calls, 0);
    let none = connector(|o| o.token = None).connect(agent.endpoint()).unwrap_err().to_string();
    assert!(none.contains("Unauthenticated") && none.contains("needs a token"), "{none}");
    assert_eq!(agent.stats().refused_token, 1);
    still_serves(&agent, Some("s3cret-token"));
    assert_eq!(agent.stats().refused_token, 1);
}

#[test]
fn listening_beyond_loopback_needs_a_flag_and_a_token() {
    let s = stage("remote");
    let any: Endpoint = "0.0.0.0:0".parse().unwrap();
    let e = StageAgent::builder(Arc::clone(&s)).token(TOKEN).serve(&any).unwrap_err().to_string();
    assert!(e.contains("not a loopback address") && e.contains("allow_remote"), "{e}");
    let e = StageAgent::builder(Arc::clone(&s)).allow_remote(true).serve(&any).unwrap_err().to_string();
    assert!(e.contains("needs a token"), "{e}");
    assert!("nonsense".parse::<Endpoint>().unwrap_err().to_string().contains("endpoint 'nonsense'"));
}

#[test]
fn a_rules_set_with_one_bad_rule_applies_nothing() {
    let s = stage("rules");
    let agent = tcp_agent(&s);
    let remote = connector(|_| {}).connect(agent.endpoint()).unwrap();
    let generation = s.collect().generation;
    let text = r#"version = 1

[[rules]]
op = "create_channel"
channel = "backup"

[[rules]]
op = "configure"
channel = "fg"
object = "drl"
set = { rate = "8MiB/s" }

[[rules]]
op = "create_object"
channel = "backup"
object = "drl"
spec = { kind = "drl", rate = "-5MiB/s" }
"#;
    let mut err = String::new();
    with_tenant(&s, || err = remote.apply_text(text, RulesFormat::Toml, "tenant.toml").unwrap_err().to_string());
    assert!(err.contains("InvalidArgument") && err.contains("tenant.toml:13") && err.contains("negative"), "{err}");
    assert_eq!(s.collect().generation, generation, "nothing applied");
    assert!(s.stage_info().channels.iter().all(|c| c.id != "backup"));
    assert_eq!(drl_rate(&s), "64MiB/s".parse().unwrap(), "the good configure rule was not applied either");
    assert_eq!(agent.stats().refused_invalid, 1);
    // Through the StageHandle interface (a RuleSet built in code): the same.
    let bad = RuleSet::from_rules([
        Rule::configure("fg", "drl", ObjectChange::rate("1MiB/s".parse().unwrap())),
        Rule::configure("fg", "nope", ObjectChange::rate("1MiB/s".parse().unwrap())),
    ]);
    let err = StageHandle::apply(&remote, &bad).unwrap_err().to_string();
    assert!(err.contains("nope"), "{err}");
    assert_eq!(drl_rate(&s), "64MiB/s".parse().unwrap());
    // Unknown object, bad rate, no change: refused by name.
    let err = remote.configure("fg", "missing", &ObjectChange::rate("1MiB/s".parse().unwrap())).unwrap_err();
    assert!(err.to_string().contains("NotFound") && err.to_string().contains("fg/missing"), "{err}");
    let mut raw = remote.raw_client();
    let status = remote
        .block_on(raw.configure(remote.raw_request(pb::ConfigureRequest {
            channel: "fg".into(),
            object: "drl".into(),
            change: Some(pb::configure_request::Change::RateBps(f64::NAN)),
            lease_ms: 1000,
        })))
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("rate_bps"), "{status:?}");
    let status = remote
        .block_on(raw.configure(remote.raw_request(pb::ConfigureRequest {
            channel: "fg".into(),
            object: "drl".into(),
            change: None,
            lease_ms: 1000,
        })))
        .unwrap()
        .unwrap_err();
    assert!(status.message().contains("field `change`"), "{status:?}");
    assert_eq!(drl_rate(&s), "64MiB/s".parse().unwrap());
    // A good change goes through.
    remote.configure("fg", "drl", &ObjectChange::rate("8MiB/s".parse().unwrap())).unwrap();
    assert_eq!(drl_rate(&s), "8MiB/s".parse().unwrap());
}

#[test]
fn a_100_mib_message_is_refused_and_the_stage_keeps_serving() {
    let s = stage("big");
    let agent = tcp_agent(&s);
    let remote = connector(|o| {
        o.max_message = 200 << 20;
        o.timeout = Duration::from_secs(20);
    })
    .connect(agent.endpoint())
    .unwrap();
    let generation = s.collect().generation;
    let text = "#".repeat(100 << 20);
    let mut err = String::new();
    with_tenant(&s, || err = remote.apply_text(&text, RulesFormat::Toml, "huge").unwrap_err().to_string());
    assert!(err.contains("OutOfRange") || err.contains("ResourceExhausted"), "{err}");
    assert!(err.contains("too large"), "{err}");
    assert_eq!(s.collect().generation, generation);
    still_serves(&agent, Some(TOKEN));
}

/// A gRPC call by hand over loopback TCP, with a body of our choosing.
fn raw_call(addr: std::net::SocketAddr, path: &str, body: Vec<u8>) -> (Option<String>, Option<String>) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        support::grpc_raw(stream, path, body, Some(TOKEN)).await
    })
}

#[test]
fn truncated_and_malformed_frames_are_refused() {
    let s = stage("frames");
    let agent = tcp_agent(&s);
    let Endpoint::Tcp(addr) = agent.endpoint().clone() else { unreachable!() };
    let path = "/kvsds.control.v1.StageAgent/Configure";
    // The frame says 50 bytes follow; 2 do, then the stream ends.
    let mut answer = (None, None);
    with_tenant(&s, || answer = raw_call(addr, path, vec![0, 0, 0, 0, 50, 10, 2]));
    let (status, message) = answer;
    let status: i32 = status.expect("a grpc-status").parse().unwrap();
    assert_ne!(status, 0, "a truncated frame was accepted ({message:?})");
    // A whole frame that is not a ConfigureRequest (a field of wire type 7).
    let (status, message) = raw_call(addr, path, vec![0, 0, 0, 0, 3, 0x0f, 0xff, 0xff]);
    assert_eq!(status.as_deref(), Some("13"), "malformed protobuf: {message:?}");
    // Bytes that are not HTTP/2 at all: the connection is closed.
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage").unwrap();
    let mut buf = Vec::new();
    let _ = tcp.read_to_end(&mut buf);
    assert_eq!(drl_rate(&s), "64MiB/s".parse().unwrap());
    still_serves(&agent, Some(TOKEN));
}

#[test]
fn a_lease_that_runs_out_restores_the_stage_own_rates() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("lease");
    let endpoint: Endpoint = format!("unix:{}", dir.path().join("lease.sock").display()).parse().unwrap();
    let agent = StageAgent::serve(Arc::clone(&s), &endpoint).unwrap();
    let lease = Duration::from_millis(300);
    let controller = connector(|o| o.lease = lease).connect(agent.endpoint()).unwrap();
    assert_eq!(controller.hello().fallback, "restore");
    controller.configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap())).unwrap();
    assert_eq!(drl_rate(&s), "2MiB/s".parse().unwrap());
    // Renewed by collects for a while: the rate stays.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100));
        controller.collect_now().unwrap();
    }
    assert_eq!(drl_rate(&s), "2MiB/s".parse().unwrap(), "a renewed lease must hold");
    // An observer (no lease) does not renew it.
    let observer = connector(|o| o.lease = Duration::ZERO).connect(agent.endpoint()).unwrap();
    let stopped = Instant::now();
    let waited = wait_until(Duration::from_secs(3), || {
        observer.collect_now().unwrap();
        drl_rate(&s) == "64MiB/s".parse().unwrap()
    })
    .expect("the stage never fell back");
    let after = stopped.elapsed();
    // Not before the lease ran out (it runs from the controller's last
    // renewal, a little before `stopped`); the upper bound is loose: a
    // busy CI machine wakes the agent's watcher late.
    assert!(
        after >= lease - Duration::from_millis(110) && after <= lease + Duration::from_millis(1000),
        "{after:?} ({waited:?})"
    );
    assert_eq!(agent.stats().fallbacks, 1);
    assert!(!agent.stats().leased);
    // The controller comes back: its changes apply again.
    controller.configure("fg", "drl", &ObjectChange::rate("3MiB/s".parse().unwrap())).unwrap();
    assert_eq!(drl_rate(&s), "3MiB/s".parse().unwrap());
    drop(agent);
    assert!(!dir.path().join("lease.sock").exists(), "the socket file is removed");
}

#[test]
fn fallback_keep_and_fallback_rules() {
    let s = stage("keep");
    let agent = StageAgent::builder(Arc::clone(&s)).token(TOKEN).fallback(Fallback::Keep).serve(&loopback()).unwrap();
    let c = connector(|o| o.lease = Duration::from_millis(100)).connect(agent.endpoint()).unwrap();
    c.configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap())).unwrap();
    wait_until(Duration::from_secs(2), || agent.stats().fallbacks == 1).expect("lease ran out");
    assert_eq!(drl_rate(&s), "2MiB/s".parse().unwrap(), "keep keeps the last rate");

    let s = stage("rules");
    let safe = RuleSet::from_rules([Rule::configure("fg", "drl", ObjectChange::rate("16MiB/s".parse().unwrap()))]);
    let agent =
        StageAgent::builder(Arc::clone(&s)).token(TOKEN).fallback(Fallback::Rules(safe)).serve(&loopback()).unwrap();
    let c = connector(|o| o.lease = Duration::from_millis(100)).connect(agent.endpoint()).unwrap();
    c.configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap())).unwrap();
    wait_until(Duration::from_secs(2), || drl_rate(&s) == "16MiB/s".parse().unwrap()).expect("fallback rules applied");
    // Without a lease a change stays, on an agent that takes such changes.
    let s = stage("nolease");
    let limits = AgentLimits { require_lease: false, ..AgentLimits::default() };
    let agent = StageAgent::builder(Arc::clone(&s)).token(TOKEN).limits(limits).serve(&loopback()).unwrap();
    let c = connector(|o| o.lease = Duration::ZERO).connect(agent.endpoint()).unwrap();
    c.configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap())).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(drl_rate(&s), "2MiB/s".parse().unwrap());
    assert_eq!(agent.stats().fallbacks, 0);
}

#[test]
fn a_restarted_stage_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint: Endpoint = format!("unix:{}", dir.path().join("r.sock").display()).parse().unwrap();
    let agent = StageAgent::serve(stage("r"), &endpoint).unwrap();
    let c = connector(|_| {}).connect(&endpoint).unwrap();
    c.collect_now().unwrap();
    drop(agent);
    // Gone (refused, or the connection cancelled as the agent stopped).
    let err = c.collect_now().unwrap_err().to_string();
    assert!(["Unavailable", "Cancelled", "transport", "connect"].iter().any(|w| err.contains(w)), "{err}");
    assert!(c.failures() >= 1);
    let _agent = StageAgent::serve(stage("r"), &endpoint).unwrap();
    let err = wait_until(Duration::from_secs(3), || {
        c.collect_now().is_err_and(|e| e.to_string().contains("the stage was restarted"))
    });
    assert!(err.is_some(), "a new stage behind the same socket must not pass for the old one");
    // And it counts as a failure, so a supervisor drops it and connects
    // again (an answer from the wrong stage is no answer).
    let before = c.failures();
    assert!(before >= 1, "a restarted stage's reply reset the failure count");
    assert!(c.collect_now().is_err());
    assert_eq!(c.failures(), before + 1);
}

#[test]
fn one_agent_serves_several_stages_and_reads_them_in_one_call() {
    use controller::{Controller, ControllerConfig, FairShareConfig, InstanceConfig, PolicyKind};
    let (a, b) = (stage("alpha"), stage("beta"));
    let e = StageAgent::builder(stage("same"))
        .stage(stage("same"))
        .token(TOKEN)
        .serve(&loopback())
        .unwrap_err()
        .to_string();
    assert!(e.contains("two stages are named 'same'"), "{e}");
    let agent = StageAgent::builder(Arc::clone(&a)).stage(Arc::clone(&b)).token(TOKEN).serve(&loopback()).unwrap();
    let c = connector(|o| o.lease = Duration::from_secs(5));
    let e = c.connect(agent.endpoint()).unwrap_err().to_string();
    assert!(e.contains("serves 2 stages (alpha, beta)"), "{e}");
    let e = c.connect_stage(agent.endpoint(), "gamma").unwrap_err().to_string();
    assert!(e.contains("NotFound") && e.contains("no stage 'gamma'"), "{e}");
    let only_b = c.connect_stage(agent.endpoint(), "beta").unwrap();
    assert_eq!(only_b.name(), "beta");
    only_b.configure("fg", "drl", &ObjectChange::rate("3MiB/s".parse().unwrap())).unwrap();
    assert_eq!(drl_rate(&b), "3MiB/s".parse().unwrap());
    assert_eq!(drl_rate(&a), "64MiB/s".parse().unwrap(), "the other stage is untouched");

    // A controller over both, through one connection: each cycle reads
    // both stages with one CollectAll.
    let stages = c.connect_all(agent.endpoint()).unwrap();
    assert_eq!(stages.iter().map(|s| s.name()).collect::<Vec<_>>(), ["alpha", "beta"]);
    let inst = |n: &str| InstanceConfig {
        name: n.into(),
        demand: Rate::UNLIMITED,
        channel: "fg".into(),
        object: "drl".into(),
    };
    let mut cfg = ControllerConfig::fair_share(
        PolicyKind::Static,
        FairShareConfig {
            device_bandwidth: kv_stage::units::Bandwidth::new(10.0 * 1048576.0).unwrap(),
            instances: vec![
                InstanceConfig { demand: "1MiB/s".parse().unwrap(), ..inst("alpha") },
                InstanceConfig { demand: "2MiB/s".parse().unwrap(), ..inst("beta") },
            ],
        },
    );
    cfg.interval = Some(Duration::from_millis(5));
    let mut builder = Controller::builder(cfg);
    for s in stages {
        let name = s.name().to_owned();
        builder = builder.instance(name, Arc::new(s) as Arc<dyn StageHandle>);
    }
    let calls = agent.stats().calls;
    let ctl = builder.start().unwrap();
    while ctl.cycles() < 20 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let log = ctl.stop();
    assert_eq!(drl_rate(&a), "1MiB/s".parse().unwrap());
    assert_eq!(drl_rate(&b), "2MiB/s".parse().unwrap());
    assert!(log.iter().all(|r| r.inputs.iter().all(|i| i.error.is_none())), "every cycle read both");
    // 20+ cycles of two stages: about one call per cycle (one CollectAll),
    // plus the layouts and the two changes, not two per cycle.
    let used = agent.stats().calls - calls;
    assert!(used < log.len() as u64 + 10, "{used} calls for {} cycles", log.len());
}

#[test]
fn a_call_with_an_older_term_is_refused_and_counted_and_changes_nothing() {
    let s = stage("fenced");
    let agent = tcp_agent(&s);
    let with_term = |t: Option<u64>| connector(|o| o.term = t).connect(agent.endpoint()).unwrap();
    let rate = |r: &str| ObjectChange::rate(r.parse().unwrap());
    // The old leader sets a rate, then the new one connects (its handshake
    // already raises the agent's term) and sets its own.
    let old = with_term(Some(5));
    old.configure("fg", "drl", &rate("2MiB/s")).unwrap();
    assert_eq!(agent.stats().change_term, 5);
    let new = with_term(Some(7));
    assert_eq!(agent.stats().term, 7);
    new.configure("fg", "drl", &rate("4MiB/s")).unwrap();
    assert_eq!((agent.stats().term, agent.stats().change_term), (7, 7));
    // The old one, woken: its change, its collects and its rules are refused.
    let e = old.configure("fg", "drl", &rate("1MiB/s")).unwrap_err().to_string();
    assert!(e.contains("term 5 is older than term 7"), "{e}");
    assert!(old.collect_now().is_err(), "a deposed leader's collect would renew its lease");
    let rules = "[[rules]]\nop = \"configure\"\nchannel = \"fg\"\nobject = \"drl\"\nset = { rate = \"1MiB/s\" }\n";
    assert!(old.apply_text(rules, RulesFormat::Toml, "old.toml").is_err());
    assert_eq!(drl_rate(&s), "4MiB/s".parse().unwrap(), "the new leader's rate stays");
    let st = agent.stats();
    assert_eq!((st.refused_term, st.term, st.change_term), (3, 7, 7), "{st:?}");
    // A call with no term (a fleet file's controller, a tool) is not fenced.
    let none = with_term(None);
    none.configure("fg", "drl", &rate("3MiB/s")).unwrap();
    assert_eq!(drl_rate(&s), "3MiB/s".parse().unwrap());
    // A term that is not a number is refused as such.
    let mut req = new.raw_request(pb::CollectRequest { lease_ms: 0, with_settings: false });
    req.metadata_mut().insert(kv_remote::TERM_KEY, "soon".parse().unwrap());
    let status = new.block_on(new.raw_client().collect(req)).unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}
