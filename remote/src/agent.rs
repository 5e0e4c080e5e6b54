//! The stage side: an agent that serves one stage's control calls.
//!
//! The agent runs on a tokio runtime of its own (one worker thread, named
//! `kvsds-agent`) or one it is given: control calls never run on the threads that enforce,
//! and the enforce path does not know the agent exists (it reads the same
//! counters any `collect` reads).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kv_stage::{ObjectConfig, ObjectSpec, Rate, Rule, RuleSet, RulesFormat, Stage};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::convert;
use crate::error::{Error, Result};
use crate::pb;
use crate::pb::stage_agent_server::{StageAgent as StageAgentService, StageAgentServer};
use crate::{PROTOCOL_VERSION, PROTOCOL_VERSION_KEY, STAGE_KEY, TOKEN_KEY};

/// Where an agent listens (or a controller connects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Unix domain socket (`unix:/run/kvsds/t1.sock`).
    Unix(PathBuf),
    /// A TCP address (`127.0.0.1:7401`, or `tcp://...`, `http://...`).
    Tcp(SocketAddr),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}

impl std::str::FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("unix://").or_else(|| s.strip_prefix("unix:")) {
            if p.is_empty() {
                return Err(Error::Endpoint { endpoint: s.to_owned(), message: "no socket path".into() });
            }
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        let addr = s.strip_prefix("tcp://").or_else(|| s.strip_prefix("http://")).unwrap_or(s);
        addr.parse::<SocketAddr>().map(Endpoint::Tcp).map_err(|e| Error::Endpoint {
            endpoint: s.to_owned(),
            message: format!("{e} (expected unix:/path or IP:port)"),
        })
    }
}

/// What a stage returns to when its lease runs out (no controller renewed
/// it in time).
#[derive(Debug, Clone, Default)]
pub enum Fallback {
    /// Every object a controller changed under a lease gets back the
    /// configuration it had before the first such change: the stage's own
    /// (from its rules file or the code that built it). The default.
    #[default]
    Restore,
    /// These rules are applied (all or nothing), e.g. a file of safe rates.
    Rules(RuleSet),
    /// The last configuration stays. A dead controller can then leave a
    /// tenant throttled for good: only for operators who want exactly that.
    Keep,
}

impl Fallback {
    fn name(&self) -> &'static str {
        match self {
            Fallback::Restore => "restore",
            Fallback::Rules(_) => "rules",
            Fallback::Keep => "keep",
        }
    }
}

/// What an agent counted since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Calls served (answered, with success or an error status).
    pub calls: u64,
    /// Calls refused for a missing or wrong token.
    pub refused_token: u64,
    /// Calls refused for a protocol version the agent does not speak.
    pub refused_version: u64,
    /// Calls refused because their content was invalid (bad rules, bad
    /// settings, an unknown object).
    pub refused_invalid: u64,
    /// Times the lease ran out and the stage fell back.
    pub fallbacks: u64,
    /// Whether a lease is held now.
    pub leased: bool,
}

/// Default cap on a message's size, either way (4 MiB: a stage's layout
/// with thousands of objects fits; a runaway client does not).
pub const DEFAULT_MAX_MESSAGE: usize = 4 << 20;
/// Default longest lease granted.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(60);

/// Builds a [`StageAgent`].
#[derive(Debug)]
pub struct AgentBuilder {
    stages: Vec<Arc<Stage>>,
    token: Option<String>,
    allow_remote: bool,
    max_message: usize,
    max_lease: Duration,
    fallback: Fallback,
    name: Option<String>,
    runtime: Option<tokio::runtime::Handle>,
}

impl AgentBuilder {
    /// Serves another stage on the same endpoint: calls name it in their
    /// `kvsds-stage` metadata, and `CollectAll` reads every stage in one
    /// call (see `Connector::connect_all`). Stage names must differ.
    pub fn stage(mut self, stage: Arc<Stage>) -> Self {
        self.stages.push(stage);
        self
    }

    /// Runs on this tokio runtime instead of one of its own (a process
    /// with many stages, or a tokio service, shares one). Keep the runtime
    /// alive as long as the agent.
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Requires `authorization: Bearer <token>` on every call. Needed to
    /// listen beyond loopback.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Allows a TCP address that is not loopback (with a token only).
    pub fn allow_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }

    /// Caps a message's size either way (default [`DEFAULT_MAX_MESSAGE`]).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The longest lease granted (default [`DEFAULT_MAX_LEASE`]); a
    /// controller asking for more gets this.
    pub fn max_lease(mut self, lease: Duration) -> Self {
        self.max_lease = lease;
        self
    }

    /// What the stage returns to when its lease runs out (default
    /// [`Fallback::Restore`]).
    pub fn fallback(mut self, fallback: Fallback) -> Self {
        self.fallback = fallback;
        self
    }

    /// The name the agent logs under (default: the stage's name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Listens on `endpoint` and serves until the agent is dropped or shut
    /// down. A Unix socket is created with mode 0600 (a stale socket file
    /// nobody listens on is replaced); a TCP address must be loopback
    /// unless [`allow_remote`](Self::allow_remote) and a token are set.
    pub fn serve(self, endpoint: &Endpoint) -> Result<StageAgent> {
        if self.max_message < 1024 {
            return Err(Error::Agent(format!("max_message_size {} is below 1 KiB", self.max_message)));
        }
        if let Some(t) = &self.token
            && (t.is_empty() || t.bytes().any(|b| !(0x21..0x7f).contains(&b)))
        {
            return Err(Error::Agent("token: must be non-empty printable ASCII without spaces".into()));
        }
        if let Endpoint::Tcp(addr) = endpoint
            && !addr.ip().is_loopback()
        {
            if !self.allow_remote {
                return Err(Error::Agent(format!(
                    "{addr} is not a loopback address: listening there needs allow_remote and a token"
                )));
            }
            if self.token.is_none() {
                return Err(Error::Agent(format!("{addr} is not a loopback address: set a token to listen there")));
            }
        }
        let (runtime, handle) = match self.runtime {
            Some(h) => (None, h),
            None => {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("kvsds-agent")
                    .enable_all()
                    .build()
                    .map_err(|e| Error::Agent(format!("runtime: {e}")))?;
                let h = rt.handle().clone();
                (Some(rt), h)
            }
        };
        // Listeners are made in the runtime's context (works from inside
        // or outside an async context).
        let _entered = handle.enter();
        let label = self.name.clone().unwrap_or_else(|| self.stages[0].name().to_owned());
        let mut slots: Vec<Arc<Shared>> = Vec::with_capacity(self.stages.len());
        for stage in &self.stages {
            let name = stage.name().to_owned();
            if slots.iter().any(|s| s.name == name) {
                return Err(Error::Agent(format!("two stages are named '{name}': an agent needs distinct names")));
            }
            slots.push(Arc::new(Shared {
                stage: Arc::clone(stage),
                name: if self.stages.len() == 1 { label.clone() } else { name },
                max_lease: self.max_lease,
                fallback: self.fallback.clone(),
                lease: Mutex::new(Lease::default()),
                leased: tokio::sync::Notify::new(),
                refused_invalid: AtomicU64::new(0),
                fallbacks: AtomicU64::new(0),
            }));
        }
        let core = Arc::new(Core {
            token: self.token.clone(),
            slots,
            calls: AtomicU64::new(0),
            refused_token: AtomicU64::new(0),
            refused_version: AtomicU64::new(0),
            refused_stage: AtomicU64::new(0),
        });
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let service = Service { core: Arc::clone(&core) };
        let check = Arc::clone(&core);
        let server = tonic::service::interceptor::InterceptedService::new(
            StageAgentServer::new(service)
                .max_decoding_message_size(self.max_message)
                .max_encoding_message_size(self.max_message),
            move |req: Request<()>| check.admit(&req).map(|()| req),
        );
        let router = tonic::transport::Server::builder()
            .concurrency_limit_per_connection(64)
            .timeout(Duration::from_secs(10))
            .http2_max_header_list_size(16 * 1024)
            .add_service(server);
        let shutdown = async {
            let _ = stop_rx.await;
        };
        let (local, socket_path, server) = match endpoint {
            Endpoint::Unix(path) => {
                let listener = bind_unix(path)?;
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                let task = handle.spawn(router.serve_with_incoming_shutdown(incoming, shutdown));
                (endpoint.clone(), Some(path.clone()), task)
            }
            Endpoint::Tcp(addr) => {
                let listen = |addr| -> std::io::Result<tokio::net::TcpListener> {
                    let l = std::net::TcpListener::bind(addr)?;
                    l.set_nonblocking(true)?;
                    tokio::net::TcpListener::from_std(l)
                };
                let listener = listen(*addr).map_err(|e| Error::Agent(format!("listening on {addr}: {e}")))?;
                let local = listener.local_addr().map_err(|e| Error::Agent(format!("{addr}: {e}")))?;
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let task = handle.spawn(router.serve_with_incoming_shutdown(incoming, shutdown));
                (Endpoint::Tcp(local), None, task)
            }
        };
        let mut tasks = vec![server.abort_handle()];
        for slot in &core.slots {
            let watch = Arc::clone(slot);
            let watcher = handle.spawn(async move {
                // Sleeps until the lease's deadline (a renewal moves it later:
                // the task wakes, sees it, and sleeps again), or until a lease
                // is taken.
                loop {
                    let deadline = watch.lease.lock().unwrap_or_else(|e| e.into_inner()).deadline;
                    match deadline {
                        None => watch.leased.notified().await,
                        Some(d) => {
                            tokio::select! {
                                () = tokio::time::sleep_until(tokio::time::Instant::from_std(d)) => {}
                                () = watch.leased.notified() => {}
                            }
                        }
                    }
                    watch.check_lease(Instant::now());
                }
            });
            tasks.push(watcher.abort_handle());
        }
        Ok(StageAgent { runtime, tasks, stop: Some(stop_tx), core, endpoint: local, socket_path })
    }
}

/// Binds a Unix socket (in a runtime's context).
fn bind_unix(path: &std::path::Path) -> Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(Error::Agent(format!("{}: exists and is not a socket", path.display())));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(Error::Agent(format!("{}: another process listens there", path.display())));
        }
        std::fs::remove_file(path).map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| Error::Agent(format!("listening on {}: {e}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    Ok(listener)
}

/// A running agent: serves its stage's control calls until dropped (or
/// [`shutdown`](Self::shutdown)), then removes its socket file.
///
/// ```no_run
/// use std::sync::Arc;
/// use kv_remote::{Endpoint, StageAgent};
/// use kv_stage::Stage;
///
/// let stage = Arc::new(Stage::new("tenant-a"));
/// let agent = StageAgent::serve(Arc::clone(&stage), &"unix:/tmp/tenant-a.sock".parse()?)?;
/// // ... the service runs; a controller connects to the socket ...
/// drop(agent);
/// # Ok::<(), kv_remote::Error>(())
/// ```
#[derive(Debug)]
pub struct StageAgent {
    /// Its own runtime, unless it was given one.
    runtime: Option<tokio::runtime::Runtime>,
    /// The server and lease tasks (stopped when the agent stops, also on a
    /// runtime it shares).
    tasks: Vec<tokio::task::AbortHandle>,
    stop: Option<oneshot::Sender<()>>,
    core: Arc<Core>,
    endpoint: Endpoint,
    socket_path: Option<PathBuf>,
}

impl StageAgent {
    /// An agent with the defaults (no token, loopback or Unix socket only,
    /// 4 MiB messages, leases up to 60 s, fallback [`Fallback::Restore`]).
    pub fn serve(stage: Arc<Stage>, endpoint: &Endpoint) -> Result<StageAgent> {
        Self::builder(stage).serve(endpoint)
    }

    /// Starts building an agent for `stage`.
    pub fn builder(stage: Arc<Stage>) -> AgentBuilder {
        AgentBuilder {
            stages: vec![stage],
            token: None,
            allow_remote: false,
            max_message: DEFAULT_MAX_MESSAGE,
            max_lease: DEFAULT_MAX_LEASE,
            fallback: Fallback::default(),
            name: None,
            runtime: None,
        }
    }

    /// Where it listens (with the port the system chose for `:0`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// What it counted so far.
    pub fn stats(&self) -> AgentStats {
        let c = &self.core;
        let sum = |f: fn(&Shared) -> u64| c.slots.iter().map(|s| f(s)).sum::<u64>();
        AgentStats {
            calls: c.calls.load(Ordering::Relaxed),
            refused_token: c.refused_token.load(Ordering::Relaxed),
            refused_version: c.refused_version.load(Ordering::Relaxed),
            refused_invalid: sum(|s| s.refused_invalid.load(Ordering::Relaxed))
                + c.refused_stage.load(Ordering::Relaxed),
            fallbacks: sum(|s| s.fallbacks.load(Ordering::Relaxed)),
            leased: c.slots.iter().any(|s| s.lease.lock().unwrap_or_else(|e| e.into_inner()).deadline.is_some()),
        }
    }

    /// Stops serving (calls in flight are dropped) and removes the socket.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
        if let Some(p) = self.socket_path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for StageAgent {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The lease: when it ends, and what to restore then.
#[derive(Debug, Default)]
struct Lease {
    deadline: Option<Instant>,
    /// Objects changed under the lease and their configuration before.
    originals: Vec<(String, String, ObjectSpec)>,
}

/// What an agent shares across its stages: the token and the counters of
/// refused calls.
#[derive(Debug)]
struct Core {
    token: Option<String>,
    /// The stages served, the first being the default.
    slots: Vec<Arc<Shared>>,
    calls: AtomicU64,
    refused_token: AtomicU64,
    refused_version: AtomicU64,
    refused_stage: AtomicU64,
}

/// One stage an agent serves, with its lease.
#[derive(Debug)]
struct Shared {
    stage: Arc<Stage>,
    name: String,
    max_lease: Duration,
    fallback: Fallback,
    lease: Mutex<Lease>,
    /// Wakes the lease watcher when a lease is taken.
    leased: tokio::sync::Notify,
    refused_invalid: AtomicU64,
    fallbacks: AtomicU64,
}

/// Equal without an early exit (a token compared byte by byte would tell
/// how much of it a guess got right).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Core {
    /// Every call: the token, then the protocol version.
    fn admit(&self, req: &Request<()>) -> std::result::Result<(), Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(token) = &self.token {
            let given =
                req.metadata().get(TOKEN_KEY).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same(g.as_bytes(), token.as_bytes())) {
                self.refused_token.fetch_add(1, Ordering::Relaxed);
                return Err(Status::unauthenticated(if given.is_some() {
                    "wrong token"
                } else {
                    "this agent needs a token (authorization: Bearer <token>)"
                }));
            }
        }
        match req.metadata().get(PROTOCOL_VERSION_KEY).map(|v| v.to_str().map(str::parse::<u32>)) {
            Some(Ok(Ok(PROTOCOL_VERSION))) => Ok(()),
            Some(Ok(Ok(v))) => Err(self.version_refused(&v.to_string())),
            Some(_) => Err(self.version_refused("(unreadable)")),
            None => {
                self.refused_version.fetch_add(1, Ordering::Relaxed);
                Err(Status::failed_precondition(format!(
                    "no `{PROTOCOL_VERSION_KEY}` metadata: say which protocol version you speak (this agent speaks {PROTOCOL_VERSION})"
                )))
            }
        }
    }

    fn version_refused(&self, v: &str) -> Status {
        self.refused_version.fetch_add(1, Ordering::Relaxed);
        Status::failed_precondition(format!(
            "protocol version {v} is not supported: this agent speaks kvsds.control.v{PROTOCOL_VERSION}"
        ))
    }

    /// The stage a call is for: the one its `kvsds-stage` metadata names,
    /// or the agent's only stage.
    fn slot(&self, md: &tonic::metadata::MetadataMap) -> std::result::Result<&Arc<Shared>, Status> {
        match md.get(STAGE_KEY).map(|v| v.to_str()) {
            Some(Ok(name)) => self.slots.iter().find(|s| s.stage.name() == name).ok_or_else(|| {
                self.refused_stage.fetch_add(1, Ordering::Relaxed);
                Status::not_found(format!(
                    "this agent serves no stage '{name}' (it serves {})",
                    self.slots.iter().map(|s| s.stage.name()).collect::<Vec<_>>().join(", ")
                ))
            }),
            Some(Err(_)) => Err(Status::invalid_argument(format!("`{STAGE_KEY}` metadata: not text"))),
            None if self.slots.len() == 1 => Ok(&self.slots[0]),
            None => {
                self.refused_stage.fetch_add(1, Ordering::Relaxed);
                Err(Status::invalid_argument(format!(
                    "this agent serves {} stages: name one in `{STAGE_KEY}` metadata",
                    self.slots.len()
                )))
            }
        }
    }
}

impl Shared {
    /// Renews the lease (when held and asked) and reads the counters.
    fn collect(&self, r: &pb::CollectRequest) -> pb::CollectReply {
        let s = self;
        s.renew(r.lease_ms);
        let c = s.stage.collect();
        let settings = if r.with_settings {
            c.objects
                .iter()
                .filter_map(|o| {
                    let spec = s.stage.object(&o.channel, &o.object)?.spec()?;
                    Some(pb::ObjectSetting {
                        channel: o.channel.clone(),
                        object: o.object.clone(),
                        spec_json: convert::spec_json(Some(&spec)),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let lease = {
            let l = s.lease.lock().unwrap_or_else(|e| e.into_inner());
            pb::LeaseState {
                remaining_ms: l.deadline.map_or(0, |d| {
                    u64::try_from(d.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
                }),
                fallbacks: s.fallbacks.load(Ordering::Relaxed),
            }
        };
        pb::CollectReply { collection: Some(convert::collection(&c)), settings, lease: Some(lease) }
    }

    fn invalid(&self, status: Status) -> Status {
        self.refused_invalid.fetch_add(1, Ordering::Relaxed);
        status
    }

    fn clamp(&self, lease_ms: u64) -> Duration {
        Duration::from_millis(lease_ms).min(self.max_lease)
    }

    /// Renews a lease that is held.
    fn renew(&self, lease_ms: u64) {
        if lease_ms == 0 {
            return;
        }
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if lease.deadline.is_some() {
            lease.deadline = Some(Instant::now() + self.clamp(lease_ms));
        }
    }

    /// Remembers how `targets` are configured now (the first time each is
    /// changed under a lease) and takes the lease.
    fn take_lease(&self, lease: &mut Lease, lease_ms: u64, targets: &[(String, String)]) {
        for (c, o) in targets {
            if lease.originals.iter().any(|(x, y, _)| x == c && y == o) {
                continue;
            }
            if let Some(spec) = self.stage.object(c, o).and_then(|h| h.spec()) {
                lease.originals.push((c.clone(), o.clone(), spec));
            }
        }
        if lease.deadline.replace(Instant::now() + self.clamp(lease_ms)).is_none() {
            self.leased.notify_one();
        }
    }

    /// Falls back when the lease ran out.
    fn check_lease(&self, now: Instant) {
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        match lease.deadline {
            Some(d) if d <= now => {}
            _ => return,
        }
        lease.deadline = None;
        let originals = std::mem::take(&mut lease.originals);
        let what = match &self.fallback {
            Fallback::Keep => "kept the last configuration (fallback = keep)".to_owned(),
            Fallback::Rules(rules) => match self.stage.apply(rules) {
                Ok(r) => {
                    format!("applied the fallback rules ({} rules, generation {})", rules.rules.len(), r.generation)
                }
                Err(e) => format!("could not apply the fallback rules: {e}"),
            },
            Fallback::Restore => {
                let mut restored = Vec::new();
                let mut failed = Vec::new();
                for (c, o, spec) in &originals {
                    match (self.stage.object(c, o), restore_config(spec)) {
                        (Some(h), Some(set)) => match h.configure(&set) {
                            Ok(()) => restored.push(format!("{c}/{o} = {}", convert::spec_json(Some(spec)))),
                            Err(e) => failed.push(format!("{c}/{o}: {e}")),
                        },
                        (None, _) => failed.push(format!("{c}/{o}: removed")),
                        (_, None) => failed.push(format!("{c}/{o}: its configuration cannot be written back")),
                    }
                }
                let mut s = format!("restored {} object(s) to the stage's own configuration", restored.len());
                if !restored.is_empty() {
                    s += &format!(": {}", restored.join(", "));
                }
                if !failed.is_empty() {
                    s += &format!("; not restored: {}", failed.join(", "));
                }
                s
            }
        };
        drop(lease);
        let n = self.fallbacks.fetch_add(1, Ordering::Relaxed) + 1;
        let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
        eprintln!(
            "kvsds-agent {}: lease expired, no controller renewed it (fallback #{n} at unix ms {unix_ms}): {what}",
            self.name
        );
    }
}

/// The change that gives an object back the configuration `spec` describes.
fn restore_config(spec: &ObjectSpec) -> Option<ObjectConfig> {
    let serde_json::Value::Object(mut map) = serde_json::to_value(spec).ok()? else { return None };
    map.remove("kind");
    serde_json::from_value(serde_json::Value::Object(map)).ok()
}

struct Service {
    core: Arc<Core>,
}

fn stage_status(e: &kv_stage::Error) -> Status {
    Status::invalid_argument(e.to_string())
}

#[tonic::async_trait]
impl StageAgentService for Service {
    async fn handshake(
        &self,
        req: Request<pb::HandshakeRequest>,
    ) -> std::result::Result<Response<pb::HandshakeReply>, Status> {
        // A handshake naming no stage learns about the first (and the list).
        let s = match req.metadata().get(STAGE_KEY) {
            None => &self.core.slots[0],
            Some(_) => self.core.slot(req.metadata())?,
        };
        let r = req.into_inner();
        if r.protocol_version != PROTOCOL_VERSION {
            return Err(self.core.version_refused(&r.protocol_version.to_string()));
        }
        let info = s.stage.stage_info();
        Ok(Response::new(pb::HandshakeReply {
            protocol_version: PROTOCOL_VERSION,
            stage: info.name.clone(),
            stage_id: info.id,
            pid: info.pid,
            host: info.host.clone(),
            instances: info.instances.iter().map(convert::instance).collect(),
            capabilities: ["collect", "collect_all", "stage_info", "apply_rules", "configure", "lease", "stages"]
                .map(String::from)
                .to_vec(),
            max_lease_ms: u64::try_from(s.max_lease.as_millis()).unwrap_or(u64::MAX),
            fallback: s.fallback.name().to_owned(),
            stages: self.core.slots.iter().map(|s| s.stage.name().to_owned()).collect(),
        }))
    }

    async fn collect(
        &self,
        req: Request<pb::CollectRequest>,
    ) -> std::result::Result<Response<pb::CollectReply>, Status> {
        let s = self.core.slot(req.metadata())?;
        let r = req.into_inner();
        Ok(Response::new(s.collect(&r)))
    }

    async fn collect_all(
        &self,
        req: Request<pb::CollectRequest>,
    ) -> std::result::Result<Response<pb::CollectAllReply>, Status> {
        let r = req.into_inner();
        Ok(Response::new(pb::CollectAllReply {
            stages: self
                .core
                .slots
                .iter()
                .map(|s| pb::StageCollect { stage: s.stage.name().to_owned(), reply: Some(s.collect(&r)) })
                .collect(),
        }))
    }

    async fn get_stage_info(
        &self,
        req: Request<pb::StageInfoRequest>,
    ) -> std::result::Result<Response<pb::StageInfoReply>, Status> {
        let info = self.core.slot(req.metadata())?.stage.stage_info();
        Ok(Response::new(pb::StageInfoReply { info: Some(convert::stage_info(&info)) }))
    }

    async fn apply_rules(
        &self,
        req: Request<pb::ApplyRulesRequest>,
    ) -> std::result::Result<Response<pb::ApplyRulesReply>, Status> {
        let s = self.core.slot(req.metadata())?;
        let r = req.into_inner();
        let format = match pb::RulesFormat::try_from(r.format) {
            Ok(pb::RulesFormat::Toml) => RulesFormat::Toml,
            Ok(pb::RulesFormat::Json) => RulesFormat::Json,
            Ok(pb::RulesFormat::Paio) => RulesFormat::Paio,
            _ => {
                return Err(s.invalid(Status::invalid_argument(format!(
                    "field `format`: {} is not a rules format (TOML = 1, JSON = 2, PAIO = 3)",
                    r.format
                ))));
            }
        };
        let source: Arc<str> = if r.source.is_empty() { "remote rules".into() } else { r.source.as_str().into() };
        let rules = RuleSet::parse(&r.text, format, Some(source), &kv_stage::paio::PaioOptions::default())
            .map_err(|e| s.invalid(stage_status(&e)))?;
        let targets: Vec<(String, String)> = rules
            .rules
            .iter()
            .filter_map(|e| match &e.rule {
                Rule::Configure { channel, object, .. } => Some((channel.clone(), object.clone())),
                _ => None,
            })
            .collect();
        // The lease is taken under its lock, so a fallback cannot run
        // between the snapshot of the originals and the change.
        let mut lease = s.lease.lock().unwrap_or_else(|e| e.into_inner());
        let (before, deadline) = (lease.originals.clone(), lease.deadline);
        if r.lease_ms > 0 {
            s.take_lease(&mut lease, r.lease_ms, &targets);
        }
        match s.stage.apply(&rules) {
            Ok(report) => Ok(Response::new(pb::ApplyRulesReply {
                configured: report.configured as u64,
                generation: report.generation,
                warnings: report.warnings,
            })),
            Err(e) => {
                // Nothing was applied: the lease is as it was.
                lease.originals = before;
                lease.deadline = deadline;
                Err(s.invalid(stage_status(&e)))
            }
        }
    }

    async fn configure(
        &self,
        req: Request<pb::ConfigureRequest>,
    ) -> std::result::Result<Response<pb::ConfigureReply>, Status> {
        let s = self.core.slot(req.metadata())?;
        let r = req.into_inner();
        let Some(handle) = s.stage.object(&r.channel, &r.object) else {
            return Err(s.invalid(Status::not_found(format!(
                "stage '{}' has no object '{}/{}'",
                s.stage.name(),
                r.channel,
                r.object
            ))));
        };
        let set = match r.change {
            Some(pb::configure_request::Change::RateBps(bps)) if bps == f64::INFINITY => {
                ObjectConfig::rate(Rate::UNLIMITED)
            }
            Some(pb::configure_request::Change::RateBps(bps)) => ObjectConfig::rate(
                Rate::bytes_per_sec(bps)
                    .map_err(|e| s.invalid(Status::invalid_argument(format!("field `rate_bps`: {bps}: {e}"))))?,
            ),
            Some(pb::configure_request::Change::SettingsJson(json)) => serde_json::from_str::<ObjectConfig>(&json)
                .map_err(|e| s.invalid(Status::invalid_argument(format!("field `settings_json`: {e}"))))?,
            None => return Err(s.invalid(Status::invalid_argument("field `change`: give rate_bps or settings_json"))),
        };
        handle.check(&set).map_err(|e| s.invalid(stage_status(&e)))?;
        let mut lease = s.lease.lock().unwrap_or_else(|e| e.into_inner());
        if r.lease_ms > 0 {
            s.take_lease(&mut lease, r.lease_ms, &[(r.channel.clone(), r.object.clone())]);
        }
        handle.configure(&set).map_err(|e| s.invalid(stage_status(&e)))?;
        drop(lease);
        Ok(Response::new(pb::ConfigureReply {}))
    }
}
