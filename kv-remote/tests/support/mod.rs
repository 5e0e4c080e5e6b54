//! What the kv-remote tests share: the stage they serve, reading its DRL,
//! polling for a condition, and a gRPC call made by hand over HTTP/2 (a
//! body of the test's choosing, on any stream), and the `tenant` example
//! built for this profile.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kv_stage::{DrlSpec, Match, ObjectSpec, RequestContext, Rule, Stage, units::Rate};

/// A stage with `fg` (foreground) and its DRL at 64 MiB/s.
pub fn stage(name: &str) -> Arc<Stage> {
    let stage = Arc::new(Stage::new(name));
    stage
        .apply_rules([
            Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
            Rule::CreateObject {
                channel: "fg".into(),
                object: "drl".into(),
                spec: ObjectSpec::Drl(DrlSpec::new("64MiB/s".parse().unwrap())),
                matches: None,
            },
        ])
        .unwrap();
    stage
}

/// The rate of `fg/drl`.
pub fn drl_rate(stage: &Stage) -> Rate {
    match stage.object("fg", "drl").unwrap().spec() {
        Some(ObjectSpec::Drl(s)) => s.rate,
        other => panic!("not a drl: {other:?}"),
    }
}

/// Polls until `f` holds, at most `limit`; returns how long it took.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Posts `body` (already framed, or not: the caller's choice) to `path`
/// over HTTP/2 on `stream`, with protocol version 1 and `token` if given
/// (a bearer token, or a whole `Session ..` credential);
/// returns the `grpc-status` and `grpc-message`, from the headers or the
/// trailers.
pub async fn grpc_raw<S>(stream: S, path: &str, body: Vec<u8>, token: Option<&str>) -> (Option<String>, Option<String>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    use http_body_util::BodyExt;
    let Ok((mut send, conn)) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    else {
        return (None, None);
    };
    tokio::spawn(conn);
    let mut req = hyper::Request::post(format!("http://agent{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("kvsds-protocol", "1");
    if let Some(t) = token {
        // A session credential goes as it is, a token as a bearer.
        let v = if t.starts_with("Session ") { t.to_owned() } else { format!("Bearer {t}") };
        req = req.header("authorization", v);
    }
    let req = req.body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap();
    let Ok(resp) = send.send_request(req).await else { return (None, None) };
    let header = |h: &hyper::HeaderMap| {
        (
            h.get("grpc-status").map(|v| v.to_str().unwrap_or("?").to_owned()),
            h.get("grpc-message").map(|v| v.to_str().unwrap_or("?").to_owned()),
        )
    };
    let (status, message) = header(resp.headers());
    if status.is_some() {
        return (status, message);
    }
    match tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect()).await {
        Ok(Ok(collected)) => collected.trailers().map(header).unwrap_or((None, None)),
        _ => (None, None),
    }
}

/// A gRPC frame holding `msg`: uncompressed, length-prefixed.
pub fn frame(msg: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8];
    f.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    f.extend_from_slice(msg);
    f
}

/// The target directory of the profile the tests were built with.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("deps") => dir.parent().unwrap().to_owned(),
        _ => dir.to_owned(),
    }
}

/// The `tenant` example, built for this profile (cargo builds a package's
/// binaries for its tests, not its examples).
pub fn tenant_exe() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = profile_dir();
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", "kv-remote", "--example", "tenant", "--target-dir"])
                .arg(dir.parent().unwrap())
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
                cmd.arg("--release");
            }
            assert!(cmd.status().unwrap().success(), "cargo build --example tenant");
            dir.join("examples/tenant")
        })
        .clone()
}

/// A Debian tool in /usr/bin (prometheus, promtool), or a clear failure.
pub fn tool(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(p.exists(), "{} is missing: run scripts/setup.sh (it installs Debian's prometheus package)", p.display());
    p
}

/// Waits for `file` to hold a line with "metrics at http://ADDR/metrics".
pub fn metrics_addr(file: &Path, what: &str) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        if let Some(a) = text
            .lines()
            .find_map(|l| l.split("metrics at http://").nth(1))
            .and_then(|r| r.split("/metrics").next())
            .and_then(|a| a.parse().ok())
        {
            return a;
        }
        assert!(Instant::now() < deadline, "{what} never said where its metrics are: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A plain HTTP/1.0 GET (enough for a test): status and body.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Ok((status, body))
}

/// `promtool check metrics` on what an endpoint serves: no problem found.
pub fn promtool_check(addr: SocketAddr, what: &str) {
    let (status, text) = get(addr, "/metrics").unwrap();
    assert_eq!(status, 200, "{what}: {text}");
    let mut p = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics on {what}: {said}\n---\n{text}");
}
