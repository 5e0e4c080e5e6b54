//! What an agent refuses and undoes: TCP without a token, Unix peers of
//! other uids, and (the client's side) agents that cannot prove they know
//! the token, changes without a lease or beyond its bounds, batches that
//! would take the application's context ids, structural changes that
//! outlive their lease, idle and surplus connections, leases shortened or
//! whose fallback fails. Real agents on real sockets, in this process.

mod support;

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kv_remote::{AgentLimits, ClientOptions, Connector, Endpoint, Fallback, StageAgent, pb};
use kv_stage::{
    Context, DrlSpec, ObjectChange, ObjectSpec, RequestContext, RequestType, Rule, RuleSet, RulesFormat, units::Rate,
};
use support::{drl_rate, stage, wait_until};

fn socket(dir: &tempfile::TempDir, name: &str) -> Endpoint {
    format!("unix:{}", dir.path().join(name).display()).parse().unwrap()
}

fn connector(lease: Duration) -> Connector {
    Connector::new(ClientOptions { lease, ..ClientOptions::default() }).unwrap()
}

#[test]
fn tcp_needs_a_token_and_a_unix_socket_checks_its_peer() {
    let s = stage("peers");
    let loopback: Endpoint = "127.0.0.1:0".parse().unwrap();
    let e = StageAgent::serve(Arc::clone(&s), &loopback).unwrap_err().to_string();
    assert!(e.contains("a TCP listener needs a token"), "{e}");

    let dir = tempfile::tempdir().unwrap();
    let ok = StageAgent::serve(Arc::clone(&s), &socket(&dir, "ok.sock")).unwrap();
    let mode = std::fs::metadata(dir.path().join("ok.sock")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| e.unwrap().file_name() == "ok.sock"),
        "the private directory the socket was bound in is gone"
    );
    connector(Duration::from_secs(1)).connect(ok.endpoint()).unwrap().collect_now().unwrap();

    // An agent that accepts only another uid: this process is refused.
    let strict =
        StageAgent::builder(Arc::clone(&s)).allowed_uids([54_321]).serve(&socket(&dir, "strict.sock")).unwrap();
    let err = connector(Duration::from_secs(1)).connect(strict.endpoint()).unwrap_err().to_string();
    assert!(strict.stats().refused_connections >= 1, "{err}");
    assert_eq!(strict.stats().calls, 0, "no call reached the service: {err}");
}

#[test]
fn the_client_sends_nothing_to_an_agent_that_cannot_prove_it_knows_the_token() {
    let s = stage("proof");
    let loopback: Endpoint = "127.0.0.1:0".parse().unwrap();
    let with = |token: &str| {
        Connector::new(ClientOptions { token: Some(token.into()), lease: Duration::from_secs(1), ..Default::default() })
            .unwrap()
    };
    // Something else on the port, knowing another token: refused before
    // any call, so neither the token nor a call reaches it (the client
    // used to send `Bearer <token>` with its first call: one refused call).
    let impostor = StageAgent::builder(Arc::clone(&s)).token("impostor-token").serve(&loopback).unwrap();
    let e = with("the-token").connect(impostor.endpoint()).unwrap_err().to_string();
    assert!(e.contains("does not know this client's token") && e.contains("not sending it anything"), "{e}");
    assert_eq!((impostor.stats().calls, impostor.stats().refused_token), (0, 0), "{e}");
    // A Unix agent without a token: its uid, checked on connecting, is its
    // proof; the calls carry no credential.
    let dir = tempfile::tempdir().unwrap();
    let open = StageAgent::serve(Arc::clone(&s), &socket(&dir, "open.sock")).unwrap();
    let plain = with("the-token").connect(open.endpoint()).unwrap();
    assert!(plain.raw_request(()).metadata().get("authorization").is_none());

    // The agent that knows it: every call carries a session, not the token.
    let a = StageAgent::builder(Arc::clone(&s)).token("the-token").serve(&loopback).unwrap();
    let remote = with("the-token").connect(a.endpoint()).unwrap();
    remote.collect_now().unwrap();
    let md = remote.raw_request(()).metadata().clone();
    let session = md.get("authorization").unwrap().to_str().unwrap().to_owned();
    assert!(session.starts_with("Session ") && !session.contains("the-token"), "{session}");
    // Seen on the wire, it opens that agent process and no other one with
    // the same token.
    let b = StageAgent::builder(Arc::clone(&s)).token("the-token").serve(&loopback).unwrap();
    let call = |agent: &StageAgent, credential: &str| {
        let Endpoint::Tcp(addr) = agent.endpoint().clone() else { unreachable!() };
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            support::grpc_raw(
                stream,
                "/kvsds.control.v1.StageAgent/GetStageInfo",
                support::frame(&[]),
                Some(credential),
            )
            .await
        })
    };
    assert_eq!(call(&a, &session).0.as_deref(), Some("0"));
    let (status, message) = call(&b, &session);
    assert_eq!(status.as_deref(), Some("16"), "{message:?}");
    // grpc-message is percent-encoded.
    let message = message.unwrap_or_default().replace("%20", " ");
    assert!(message.contains("unknown session"), "{message}");
    // A bearer token still works for hand tools.
    assert_eq!(call(&b, "the-token").0.as_deref(), Some("0"));
    assert_eq!(call(&b, "wrong").0.as_deref(), Some("16"));
}

#[test]
fn changes_need_a_lease_and_stay_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("bounds");
    let agent = StageAgent::serve(Arc::clone(&s), &socket(&dir, "b.sock")).unwrap();
    let remote = connector(Duration::from_secs(2)).connect(agent.endpoint()).unwrap();
    let raw = remote.raw_client();
    let configure = |change: pb::configure_request::Change, lease_ms: u64| {
        let mut raw = raw.clone();
        remote
            .block_on(raw.configure(remote.raw_request(pb::ConfigureRequest {
                channel: "fg".into(),
                object: "drl".into(),
                change: Some(change),
                lease_ms,
            })))
            .unwrap()
    };
    use pb::configure_request::Change::{RateBps, SettingsJson};
    let e = configure(RateBps(1e6), 0).unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("only under a lease"), "{e:?}");
    let e = configure(RateBps(1e6), 50).unwrap_err();
    assert!(e.message().contains("below this agent's shortest lease"), "{e:?}");
    let e = configure(RateBps(0.0), 1000).unwrap_err();
    assert!(e.message().contains("below this agent's lowest rate"), "{e:?}");
    let e = configure(SettingsJson(r#"{"burst": 1e300}"#.into()), 1000).unwrap_err();
    assert!(e.message().contains("max_burst"), "{e:?}");
    let e = configure(SettingsJson(r#"{"rate": "1GiB/s", "refill_period": "1h"}"#.into()), 1000).unwrap_err();
    assert!(e.message().contains("max_burst"), "{e:?}");
    // The same bounds hold for objects a batch creates.
    let text = "version = 1\n[[rules]]\nop = \"create_channel\"\nchannel = \"zero\"\n\
                [[rules]]\nop = \"create_object\"\nchannel = \"zero\"\nobject = \"drl\"\n\
                spec = { kind = \"drl\", rate = \"0B/s\" }\n";
    let e = remote.apply_text(text, RulesFormat::Toml, "zero.toml").unwrap_err().to_string();
    assert!(e.contains("zero.toml:") && e.contains("below this agent's lowest rate"), "{e}");
    assert!(s.stage_info().channels.iter().all(|c| c.id != "zero"));
    assert_eq!(drl_rate(&s), "64MiB/s".parse().unwrap(), "nothing was applied");
    assert_eq!(agent.stats().refused_invalid, 6);
    // Within bounds and under a lease: applied.
    configure(RateBps(4096.0), 1000).unwrap();
    assert_eq!(drl_rate(&s), Rate::from_bytes_per_sec(4096.0).unwrap());

    // Bounds on the agent's own settings: refused at build, not a panic.
    let e = StageAgent::builder(Arc::clone(&s)).max_lease(Duration::MAX).serve(&socket(&dir, "m.sock")).unwrap_err();
    assert!(e.to_string().contains("max_lease"), "{e}");
}

#[test]
fn a_batch_cannot_take_the_context_ids_the_application_needs() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("contexts");
    let agent = StageAgent::serve(Arc::clone(&s), &socket(&dir, "c.sock")).unwrap();
    let remote = connector(Duration::from_secs(2)).connect(agent.endpoint()).unwrap();
    let free = RequestContext::free_ids();
    let names: Vec<String> = (0..5).map(|i| format!("\"hardening_ctx_{i}\"")).collect();
    let text = format!(
        "version = 1\ncontexts = [{}]\n[[rules]]\nop = \"create_channel\"\nchannel = \"t\"\nmatch = {{ context = \"hardening_ctx_0\" }}\n",
        names.join(", ")
    );
    let e = remote.apply_text(&text, RulesFormat::Toml, "ctx.toml").unwrap_err().to_string();
    assert!(e.contains("5 new request contexts") && e.contains("max_new_contexts 4"), "{e}");
    assert!(RequestContext::lookup("hardening_ctx_0").is_none(), "nothing was registered");
    // Batches that fail (here: a bad rule after the declaration) leave no
    // id reserved, however many distinct names they declared.
    for i in 0..300 {
        let text = format!(
            "version = 1\ncontexts = [\"hardening_fail_{i}\"]\n[[rules]]\nop = \"configure\"\nchannel = \"fg\"\nobject = \"nope\"\nset = {{ rate = \"1MiB/s\" }}\n"
        );
        assert!(remote.apply_text(&text, RulesFormat::Toml, "fail.toml").is_err());
    }
    assert_eq!(RequestContext::free_ids(), free, "failed batches reserved context ids");
    // An agent that keeps every id for the application takes no new one.
    let limits = AgentLimits { reserved_contexts: RequestContext::MAX, ..AgentLimits::default() };
    let keep = StageAgent::builder(Arc::clone(&s)).limits(limits).serve(&socket(&dir, "k.sock")).unwrap();
    let remote = connector(Duration::from_secs(2)).connect(keep.endpoint()).unwrap();
    let text = "version = 1\ncontexts = [\"hardening_one\"]\n[[rules]]\nop = \"create_channel\"\nchannel = \"t\"\nmatch = { context = \"hardening_one\" }\n";
    let e = remote.apply_text(text, RulesFormat::Toml, "one.toml").unwrap_err().to_string();
    assert!(e.contains("keeps for the application"), "{e}");
    assert_eq!(RequestContext::free_ids(), free);
    // The application registers its own.
    RequestContext::register("hardening_app").unwrap();
}

#[test]
fn a_lease_undoes_structural_changes_and_frees_a_jailed_request() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("jail");
    let agent = StageAgent::serve(Arc::clone(&s), &socket(&dir, "j.sock")).unwrap();
    let before = s.stage_info();
    let lease = Duration::from_millis(300);
    let controller = connector(lease).connect(agent.endpoint()).unwrap();
    // The controller removes the foreground channel and sends foreground
    // requests to a channel of 1 KiB/s (the lowest rate the agent takes).
    let text = "version = 1\n\
        [[rules]]\nop = \"remove_channel\"\nchannel = \"fg\"\n\
        [[rules]]\nop = \"create_channel\"\nchannel = \"jail\"\nmatch = { context = \"foreground\" }\n\
        [[rules]]\nop = \"create_object\"\nchannel = \"jail\"\nobject = \"drl\"\nspec = { kind = \"drl\", rate = \"1KiB/s\" }\n";
    controller.apply_text(text, RulesFormat::Toml, "jail.toml").unwrap();
    let taken = Instant::now();
    drop(controller);
    let write = Context::new(RequestType::Write, 64 << 10).in_context(RequestContext::FOREGROUND);
    assert_eq!(&*s.select(&write).0, "jail");
    // A foreground write of 64 KiB: about a minute at 1 KiB/s.
    let jailed = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || s.enforce(&write).map(|_| Instant::now()))
    };
    let released = jailed.join().unwrap().expect("the write completes, not fails");
    let after = released.duration_since(taken);
    eprintln!("the jailed write completed {after:?} after the structural change (lease {lease:?})");
    assert!(after < lease + Duration::from_secs(1), "the jailed write completed {after:?} after the change");
    let now = s.stage_info();
    assert_eq!(now.channels, before.channels, "the stage's own model is back");
    assert_eq!(now.routes, before.routes);
    assert_eq!(agent.stats().fallbacks, 1);
    assert!(!agent.stats().leased);
    // A foreground write now goes to the stage's own channel at once.
    let t = Instant::now();
    s.enforce(&Context::new(RequestType::Write, 4096).in_context(RequestContext::FOREGROUND)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_shortened_lease_is_kept_and_a_failed_fallback_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("short");
    let agent = StageAgent::serve(Arc::clone(&s), &socket(&dir, "s.sock")).unwrap();
    connector(Duration::from_secs(5))
        .connect(agent.endpoint())
        .unwrap()
        .configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap()))
        .unwrap();
    let short = connector(Duration::from_millis(200)).connect(agent.endpoint()).unwrap();
    short.configure("fg", "drl", &ObjectChange::rate("3MiB/s".parse().unwrap())).unwrap();
    let t = Instant::now();
    drop(short);
    wait_until(Duration::from_secs(4), || drl_rate(&s) == "64MiB/s".parse().unwrap())
        .expect("the stage did not fall back on the shortened lease");
    assert!(t.elapsed() < Duration::from_millis(1500), "fell back after {:?}, lease 200 ms", t.elapsed());

    // Fallback rules that cannot apply yet (their object does not exist):
    // tried again until they can.
    let s = stage("retry");
    let later = RuleSet::from_rules([Rule::configure("late", "drl", ObjectChange::rate("16MiB/s".parse().unwrap()))]);
    let agent =
        StageAgent::builder(Arc::clone(&s)).fallback(Fallback::Rules(later)).serve(&socket(&dir, "r.sock")).unwrap();
    connector(Duration::from_millis(150))
        .connect(agent.endpoint())
        .unwrap()
        .configure("fg", "drl", &ObjectChange::rate("2MiB/s".parse().unwrap()))
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(agent.stats().fallbacks, 0, "the fallback cannot have succeeded");
    s.apply_rules([
        Rule::CreateChannel { channel: "late".into(), matches: None },
        Rule::CreateObject {
            channel: "late".into(),
            object: "drl".into(),
            spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)),
            matches: None,
        },
    ])
    .unwrap();
    wait_until(Duration::from_secs(4), || agent.stats().fallbacks == 1).expect("the fallback was not tried again");
    assert!(
        matches!(s.object("late", "drl").unwrap().spec(), Some(ObjectSpec::Drl(d)) if d.rate == "16MiB/s".parse().unwrap())
    );
}

#[test]
fn surplus_and_idle_connections_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let s = stage("conns");
    let agent = StageAgent::builder(Arc::clone(&s))
        .max_connections(2)
        .idle_timeout(Duration::from_millis(300))
        .serve(&socket(&dir, "c.sock"))
        .unwrap();
    let path = dir.path().join("c.sock");
    let open = || {
        let c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c
    };
    let (mut a, mut b) = (open(), open());
    std::thread::sleep(Duration::from_millis(50));
    // Over the cap: closed as it arrives (a read sees the end at once).
    let mut c = open();
    let mut buf = [0u8; 64];
    let t = Instant::now();
    assert_eq!(c.read(&mut buf).unwrap_or(0), 0);
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(wait_until(Duration::from_secs(2), || agent.stats().refused_connections >= 1).is_some());
    // The two that never send a byte are closed after the idle timeout.
    let t = Instant::now();
    for s in [&mut a, &mut b] {
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
    }
    let closed = t.elapsed();
    assert!(closed < Duration::from_secs(3), "idle connections stayed open {closed:?}");
    assert_eq!(agent.stats().idle_closed, 2);
    // Their permits are back: a controller connects.
    connector(Duration::from_secs(1)).connect(agent.endpoint()).unwrap().collect_now().unwrap();
}
