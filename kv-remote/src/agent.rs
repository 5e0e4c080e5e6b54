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

use kv_stage::{
    ObjectChange, ObjectSpec, QosSpec, RequestContext, Rule, RuleSet, RulesFormat, Stage,
    info::Checkpoint,
    object::DrlSettings,
    units::{Rate, RateUnit},
};
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::auth::{self, AgentKeys, same};
use crate::convert;
use crate::error::{Error, Result};
use crate::lease::{FALLBACK_RETRY, Lease};
use crate::pb;
use crate::pb::agent_auth_server::{AgentAuth as AgentAuthService, AgentAuthServer};
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
    /// The whole stage model goes back to what it was when the lease was
    /// taken ([`Stage::checkpoint`] / [`Stage::restore`]): channels and
    /// objects made under the lease are removed, removed ones made again,
    /// routes, defaults and every object's settings as they were. Changes
    /// the application itself made to the stage's rules during the lease
    /// are undone too; its open instances are not. The default.
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
#[non_exhaustive]
pub struct AgentStats {
    /// Calls served (answered, with success or an error status).
    pub calls: u64,
    /// Calls refused for a missing or wrong token.
    pub refused_token: u64,
    /// Calls refused for a protocol version the agent does not speak.
    pub refused_version: u64,
    /// Calls refused because their content was invalid (bad rules, bad
    /// settings, an unknown object) or beyond the agent's bounds (a rate
    /// below `min_rate`, no lease where one is required, too many
    /// channels, ...).
    pub refused_invalid: u64,
    /// Connections refused: over `max_connections`, or a Unix peer whose
    /// uid is not allowed.
    pub refused_connections: u64,
    /// Connections closed after `idle_timeout` without a byte read.
    pub idle_closed: u64,
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
/// Default shortest lease accepted.
pub const DEFAULT_MIN_LEASE: Duration = Duration::from_millis(100);
/// Longest lease an agent can be set to grant.
const LEASE_CEILING: Duration = Duration::from_secs(24 * 3600);

/// What an agent accepts from a caller that passed its token (or, on a
/// Unix socket, its peer check): [`AgentBuilder::limits`].
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLimits {
    /// Every change must carry a lease (default true): a change with
    /// `lease_ms = 0` is refused, so no remote change outlives its
    /// controller. False lets a caller make lasting changes.
    pub require_lease: bool,
    /// The shortest lease accepted (default [`DEFAULT_MIN_LEASE`]); a
    /// shorter one is refused, not rounded up.
    pub min_lease: Duration,
    /// The lowest bandwidth a DRL or QoS limit may be set to, bytes/s
    /// (default 1024, the controller's own floor). Rate 0 is always below.
    pub min_bytes_per_sec: f64,
    /// The lowest operation rate, ops/s (default 1).
    pub min_ops_per_sec: f64,
    /// The largest burst, in tokens (bytes or operations; default 1 GiB),
    /// given as `burst` or as a rate times a `refill_period`.
    pub max_burst: f64,
    /// Application contexts a rules batch may declare that are not
    /// registered yet (default 4).
    pub max_new_contexts: usize,
    /// Context ids a batch must leave free for the application's own
    /// `RequestContext::register` (default 64 of the 240).
    pub reserved_contexts: usize,
    /// Channels a stage may have after a remote batch (default 64).
    pub max_channels: usize,
    /// Objects a stage may have after a remote batch, all channels
    /// together (default 256).
    pub max_objects: usize,
}

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            require_lease: true,
            min_lease: DEFAULT_MIN_LEASE,
            min_bytes_per_sec: 1024.0,
            min_ops_per_sec: 1.0,
            max_burst: f64::from(1u32 << 30),
            max_new_contexts: 4,
            reserved_contexts: 64,
            max_channels: 64,
            max_objects: 256,
        }
    }
}

/// Default cap on open control connections.
pub const DEFAULT_MAX_CONNECTIONS: usize = 32;
/// Default time a control connection may stay without a byte read.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

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
    limits: AgentLimits,
    max_connections: usize,
    idle_timeout: Duration,
    allowed_uids: Option<Vec<u32>>,
}

impl AgentBuilder {
    /// What callers may set ([`AgentLimits`]; default its `Default`).
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Caps the control connections open at once (default
    /// [`DEFAULT_MAX_CONNECTIONS`]); one more is closed as it arrives.
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Closes a connection on which nothing was read this long (default
    /// [`DEFAULT_IDLE_TIMEOUT`]). A controller polling every second or so
    /// is never idle that long.
    pub fn idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = d;
        self
    }

    /// On a Unix socket, the peer uids accepted (checked with
    /// `SO_PEERCRED` as each connection arrives). Default: the agent's own
    /// effective uid and root.
    pub fn allowed_uids(mut self, uids: impl IntoIterator<Item = u32>) -> Self {
        self.allowed_uids = Some(uids.into_iter().collect());
        self
    }

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

    /// Requires a credential on every call: a session opened by an
    /// `AgentAuth` challenge (what [`Connector`](crate::Connector) does,
    /// never sending the token), or `authorization: Bearer <token>`. Needed to
    /// listen on TCP (loopback included: any local user can reach a
    /// loopback port); a Unix socket relies on the peer's uid instead,
    /// and takes a token too when one is set.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Allows a TCP address that is not loopback (with a token only; the
    /// token then crosses the network in clear text: put a TLS tunnel in
    /// front).
    pub fn allow_remote(mut self, allow: bool) -> Self {
        self.allow_remote = allow;
        self
    }

    /// Caps a message's size either way (default [`DEFAULT_MAX_MESSAGE`]).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The longest lease granted (default [`DEFAULT_MAX_LEASE`], at most a
    /// day); a controller asking for more gets this.
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
    /// down. A Unix socket is created with mode 0600 from the start (a
    /// stale socket file nobody listens on is replaced) and accepts peers
    /// of the allowed uids only; a TCP listener needs a token, and must be
    /// loopback unless [`allow_remote`](Self::allow_remote) is set.
    pub fn serve(self, endpoint: &Endpoint) -> Result<StageAgent> {
        if self.max_message < 1024 {
            return Err(Error::Agent(format!("max_message_size {} is below 1 KiB", self.max_message)));
        }
        let l = &self.limits;
        if self.max_lease > LEASE_CEILING || self.max_lease < l.min_lease || l.min_lease.is_zero() {
            return Err(Error::Agent(format!(
                "max_lease {:?} and min_lease {:?}: need 0 < min_lease <= max_lease <= 24h",
                self.max_lease, l.min_lease
            )));
        }
        if l.min_bytes_per_sec.is_nan()
            || l.min_ops_per_sec.is_nan()
            || l.min_bytes_per_sec <= 0.0
            || l.min_ops_per_sec <= 0.0
        {
            return Err(Error::Agent("limits: min_bytes_per_sec and min_ops_per_sec must be above 0".into()));
        }
        if l.max_burst.is_nan() || l.max_burst <= 0.0 {
            return Err(Error::Agent("limits: max_burst must be above 0".into()));
        }
        if self.max_connections == 0 || self.idle_timeout.is_zero() {
            return Err(Error::Agent("max_connections and idle_timeout must be above 0".into()));
        }
        if matches!(endpoint, Endpoint::Tcp(_)) && self.token.is_none() {
            return Err(Error::Agent(format!(
                "{endpoint}: a TCP listener needs a token (AgentBuilder::token), since any local user can connect to it; a Unix socket checks its peer's uid instead"
            )));
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
                limits: self.limits.clone(),
                fallback: self.fallback.clone(),
                lease: Mutex::new(Lease::default()),
                leased: tokio::sync::Notify::new(),
                refused_invalid: AtomicU64::new(0),
                fallbacks: AtomicU64::new(0),
            }));
        }
        let keys = match &self.token {
            Some(t) => Some(AgentKeys::new(t).map_err(Error::Agent)?),
            None => None,
        };
        let core = Arc::new(Core {
            token: self.token.clone(),
            keys,
            slots,
            calls: AtomicU64::new(0),
            refused_token: AtomicU64::new(0),
            refused_version: AtomicU64::new(0),
            refused_stage: AtomicU64::new(0),
            refused_connections: Arc::new(AtomicU64::new(0)),
            idle_closed: Arc::new(AtomicU64::new(0)),
        });
        let gate = Gate {
            permits: Arc::new(tokio::sync::Semaphore::new(self.max_connections)),
            idle: self.idle_timeout,
            refused: Arc::clone(&core.refused_connections),
            idle_closed: Arc::clone(&core.idle_closed),
        };
        let uids = match self.allowed_uids.clone() {
            Some(u) => u,
            None => vec![own_uid()?, 0],
        };
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
            .add_service(server)
            // Outside the token check: it is how a client checks the agent
            // before it sends anything that needs one.
            .add_service(AgentAuthServer::new(Auth { core: Arc::clone(&core) }).max_decoding_message_size(1024));
        let shutdown = async {
            let _ = stop_rx.await;
        };
        let (local, socket_path, server) = match endpoint {
            Endpoint::Unix(path) => {
                use tokio_stream::StreamExt;
                let listener = bind_unix(path)?;
                let refused = Arc::clone(&core.refused_connections);
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).filter_map(move |r| match r {
                    Ok(s) => {
                        let uid = s.peer_cred().map(|c| c.uid());
                        if uid.as_ref().is_ok_and(|u| uids.contains(u)) {
                            gate.admit(s).map(Ok)
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                            eprintln!(
                                "kvsds-agent: refused a connection from uid {} (allowed: {uids:?})",
                                uid.map_or_else(|e| e.to_string(), |u| u.to_string())
                            );
                            None
                        }
                    }
                    Err(e) => Some(Err(e)),
                });
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
                let incoming = {
                    use tokio_stream::StreamExt;
                    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |r| match r {
                        Ok(s) => gate.admit(s).map(Ok),
                        Err(e) => Some(Err(e)),
                    })
                };
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
                    let deadline = watch.lease.lock().unwrap_or_else(|e| e.into_inner()).deadline();
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
    // Bound in a private directory next to the path (mode 0700), made
    // 0600 there, then renamed into place: no moment where the socket
    // exists with the umask's permissions.
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    // tempfile makes the directory with mode 0700 and removes it (and the
    // staged socket, should the rename fail) when dropped.
    let private = tempfile::Builder::new()
        .prefix(".kvsds-agent-")
        .tempdir_in(parent)
        .map_err(|e| Error::Agent(format!("{}: {e}", parent.display())))?;
    let staged = private.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&staged)
        .map_err(|e| Error::Agent(format!("listening on {}: {e}", path.display())))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    std::fs::rename(&staged, path).map_err(|e| Error::Agent(format!("{}: {e}", path.display())))?;
    Ok(listener)
}

/// The effective uid of this process (the owner of `/proc/self`).
pub(crate) fn own_uid() -> Result<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid()).map_err(|e| Error::Agent(format!("/proc/self: {e}")))
}

/// Admits connections: at most `permits` open at once, each closed after
/// `idle` without a byte read.
#[derive(Clone)]
struct Gate {
    permits: Arc<tokio::sync::Semaphore>,
    idle: Duration,
    refused: Arc<AtomicU64>,
    idle_closed: Arc<AtomicU64>,
}

impl Gate {
    fn admit<S>(&self, io: S) -> Option<Guarded<S>> {
        match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => Some(Guarded {
                io,
                idle: self.idle,
                deadline: Box::pin(tokio::time::sleep(self.idle)),
                idle_closed: Arc::clone(&self.idle_closed),
                _permit: permit,
            }),
            Err(_) => {
                // Dropping the stream closes it.
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// A connection under the gate: holds its permit until it closes, and
/// fails its reads once nothing was read for `idle`.
struct Guarded<S> {
    io: S,
    idle: Duration,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    idle_closed: Arc<AtomicU64>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Guarded<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        let this = self.get_mut();
        let before = buf.filled().len();
        match std::pin::Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = tokio::time::Instant::now() + this.idle;
                    this.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    this.idle_closed.fetch_add(1, Ordering::Relaxed);
                    Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "idle control connection")))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Guarded<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
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
/// let agent = StageAgent::serve(Arc::clone(&stage), &"unix:/run/kvsds/tenant-a.sock".parse()?)?;
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
    /// An agent with the defaults: a Unix socket (TCP needs a token, see
    /// [`AgentBuilder::token`]), peers of this process's uid or root, 4 MiB
    /// messages, changes only under a lease of 100 ms to 60 s, the bounds
    /// of [`AgentLimits::default`], 32 connections idle at most 60 s,
    /// fallback [`Fallback::Restore`].
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
            limits: AgentLimits::default(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            allowed_uids: None,
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
            refused_connections: c.refused_connections.load(Ordering::Relaxed),
            idle_closed: c.idle_closed.load(Ordering::Relaxed),
            leased: c.slots.iter().any(|s| s.lease.lock().unwrap_or_else(|e| e.into_inner()).deadline().is_some()),
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

/// What an agent shares across its stages: the token and the counters of
/// refused calls.
#[derive(Debug)]
struct Core {
    token: Option<String>,
    /// Answers challenges and checks sessions (with a token only).
    keys: Option<AgentKeys>,
    /// The stages served, the first being the default.
    slots: Vec<Arc<Shared>>,
    calls: AtomicU64,
    refused_token: AtomicU64,
    refused_version: AtomicU64,
    refused_stage: AtomicU64,
    refused_connections: Arc<AtomicU64>,
    idle_closed: Arc<AtomicU64>,
}

/// One stage an agent serves, with its lease.
#[derive(Debug)]
struct Shared {
    stage: Arc<Stage>,
    name: String,
    max_lease: Duration,
    limits: AgentLimits,
    fallback: Fallback,
    lease: Mutex<Lease>,
    /// Wakes the lease watcher when a lease is taken.
    leased: tokio::sync::Notify,
    refused_invalid: AtomicU64,
    fallbacks: AtomicU64,
}

impl Core {
    /// Every call: the token, then the protocol version.
    fn admit(&self, req: &Request<()>) -> std::result::Result<(), Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let (Some(token), Some(keys)) = (&self.token, &self.keys) {
            let given = req.metadata().get(TOKEN_KEY).and_then(|v| v.to_str().ok());
            // A session from a challenge (what this crate's client sends),
            // or the token itself (hand tools such as grpcurl).
            let ok = match given {
                Some(v) if v.starts_with(auth::SCHEME) => keys.admits(&v[auth::SCHEME.len()..]),
                Some(v) => v.strip_prefix("Bearer ").is_some_and(|g| same(g.as_bytes(), token.as_bytes())),
                None => false,
            };
            if !ok {
                self.refused_token.fetch_add(1, Ordering::Relaxed);
                return Err(Status::unauthenticated(match given {
                    Some(v) if v.starts_with(auth::SCHEME) => {
                        "unknown session (the agent restarted, or the session is not one it opened)"
                    }
                    Some(_) => "wrong token",
                    None => "this agent needs a token (an AgentAuth challenge, or authorization: Bearer <token>)",
                }));
            }
        }
        self.speaks(req.metadata())
    }

    /// The protocol version a call asks for is ours.
    fn speaks(&self, md: &tonic::metadata::MetadataMap) -> std::result::Result<(), Status> {
        match md.get(PROTOCOL_VERSION_KEY).map(|v| v.to_str().map(str::parse::<u32>)) {
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
                remaining_ms: u64::try_from(l.remaining(Instant::now()).as_millis()).unwrap_or(u64::MAX),
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

    /// Renews a lease that is held (a shorter one wakes the watcher, so
    /// the new deadline is kept).
    fn renew(&self, lease_ms: u64) {
        if lease_ms == 0 {
            return;
        }
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if lease.renew(Instant::now(), self.clamp(lease_ms)) {
            self.leased.notify_one();
        }
    }

    /// Refuses a change this agent does not take: none without a lease
    /// (when one is required), none with a lease below the minimum.
    fn check_lease_ms(&self, lease_ms: u64) -> std::result::Result<(), Status> {
        let l = &self.limits;
        if lease_ms == 0 && l.require_lease {
            return Err(self.invalid(Status::failed_precondition(
                "field `lease_ms`: this agent takes changes only under a lease (give lease_ms > 0)",
            )));
        }
        if lease_ms > 0 && Duration::from_millis(lease_ms) < l.min_lease {
            return Err(self.invalid(Status::invalid_argument(format!(
                "field `lease_ms`: {lease_ms} ms is below this agent's shortest lease ({} ms)",
                l.min_lease.as_millis()
            ))));
        }
        Ok(())
    }

    /// The checkpoint a change under `lease_ms` needs, taken before the
    /// change: only when it takes a lease and none is held.
    fn checkpoint_for(&self, lease: &Lease, lease_ms: u64) -> Option<Checkpoint> {
        (lease_ms > 0 && lease.needs_checkpoint()).then(|| self.stage.checkpoint())
    }

    /// Takes (or extends) the lease after a change that succeeded; `taken`
    /// is the stage before it ([`checkpoint_for`](Self::checkpoint_for)),
    /// kept when no lease was held. The watcher is woken: the deadline may
    /// be earlier than the one it sleeps on.
    fn take_lease(&self, lease: &mut Lease, lease_ms: u64, taken: Option<Checkpoint>) {
        if lease_ms == 0 {
            return;
        }
        lease.take(Instant::now(), self.clamp(lease_ms), taken);
        self.leased.notify_one();
    }

    /// Falls back when the lease ran out; a fallback that fails is tried
    /// again every [`FALLBACK_RETRY`] until it succeeds or a controller
    /// takes the lease again.
    fn check_lease(&self, now: Instant) {
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if !lease.is_due(now) {
            return;
        }
        let attempt = if lease.is_retrying() { "again " } else { "" };
        let result: std::result::Result<String, String> = match &self.fallback {
            Fallback::Keep => Ok("kept the last configuration (fallback = keep)".to_owned()),
            Fallback::Rules(rules) => match self.stage.apply(rules) {
                Ok(r) => {
                    Ok(format!("applied the fallback rules ({} rules, generation {})", rules.rules.len(), r.generation))
                }
                Err(e) => Err(format!("could not apply the fallback rules: {e}")),
            },
            Fallback::Restore => match lease.checkpoint().map(|c| (c.generation(), self.stage.restore(c))) {
                None => Ok("nothing to restore".to_owned()),
                Some((from, Ok(r))) => {
                    let mut s = format!(
                        "restored the stage's layout and settings of generation {from}, from before the lease (now generation {})",
                        r.generation
                    );
                    if !r.warnings.is_empty() {
                        s += &format!("; {}", r.warnings.join("; "));
                    }
                    Ok(s)
                }
                Some((_, Err(e))) => Err(format!("could not restore the stage: {e}")),
            },
        };
        match result {
            Ok(what) => {
                lease.fell_back();
                drop(lease);
                let n = self.fallbacks.fetch_add(1, Ordering::Relaxed) + 1;
                eprintln!(
                    "kvsds-agent {}: lease expired, no controller renewed it (fallback #{n} {attempt}at unix ms {}): {what}",
                    self.name,
                    unix_ms()
                );
            }
            Err(why) => {
                lease.fallback_failed(now);
                drop(lease);
                eprintln!(
                    "kvsds-agent {}: lease expired at unix ms {}: {why}; trying again in {FALLBACK_RETRY:?}",
                    self.name,
                    unix_ms()
                );
            }
        }
    }

    /// Refuses a batch beyond the agent's bounds: rates, bursts, declared
    /// contexts, the number of channels and objects it would leave.
    fn check_rules(&self, rules: &RuleSet) -> std::result::Result<(), String> {
        let l = &self.limits;
        let pending = rules.pending_contexts();
        if pending.len() > l.max_new_contexts {
            return Err(format!(
                "the batch declares {} new request contexts ({}), over this agent's max_new_contexts {}",
                pending.len(),
                pending.join(", "),
                l.max_new_contexts
            ));
        }
        // The batch's new contexts are reserved already: what is free now
        // is what would be left.
        if !pending.is_empty() && RequestContext::free_ids() < l.reserved_contexts {
            return Err(format!(
                "declaring {} would leave {} request context ids free, fewer than the {} this agent keeps for the application",
                pending.join(", "),
                RequestContext::free_ids(),
                l.reserved_contexts
            ));
        }
        let info = self.stage.stage_info();
        let mut channels = info.channels.len();
        let mut objects: usize = info.channels.iter().map(|c| c.objects.len()).sum();
        for e in &rules.rules {
            let at = |m: String| format!("{}: {m}", e.location);
            match &e.rule {
                Rule::CreateChannel { .. } => channels += 1,
                Rule::RemoveChannel { channel } => {
                    channels = channels.saturating_sub(1);
                    let n = info.channels.iter().find(|c| c.id == *channel).map_or(0, |c| c.objects.len());
                    objects = objects.saturating_sub(n);
                }
                Rule::CreateObject { channel, object, spec, .. } => {
                    objects += 1;
                    self.check_spec(&format!("{channel}/{object}"), spec).map_err(at)?;
                }
                Rule::RemoveObject { .. } => objects = objects.saturating_sub(1),
                Rule::Configure { channel, object, set, .. } => {
                    let current = self.stage.object(channel, object).and_then(|h| h.spec());
                    self.check_config(&format!("{channel}/{object}"), current.as_ref(), set).map_err(at)?;
                }
                _ => {}
            }
        }
        if channels > l.max_channels {
            return Err(format!(
                "the batch would leave {channels} channels, over this agent's max_channels {}",
                l.max_channels
            ));
        }
        if objects > l.max_objects {
            return Err(format!(
                "the batch would leave {objects} objects, over this agent's max_objects {}",
                l.max_objects
            ));
        }
        Ok(())
    }

    fn check_rate(&self, what: &str, r: Rate) -> std::result::Result<(), String> {
        if r.is_unlimited() {
            return Ok(());
        }
        let (min, unit) = match r.unit() {
            RateUnit::Bytes => (self.limits.min_bytes_per_sec, "bytes/s"),
            RateUnit::Ops => (self.limits.min_ops_per_sec, "ops/s"),
        };
        if r.per_sec() < min {
            return Err(format!("{what}: {r} is below this agent's lowest rate, {min} {unit}"));
        }
        Ok(())
    }

    fn check_burst(&self, what: &str, tokens: f64) -> std::result::Result<(), String> {
        if tokens.is_nan() || tokens > self.limits.max_burst {
            return Err(format!(
                "{what}: a burst of {tokens} tokens is over this agent's max_burst {}",
                self.limits.max_burst
            ));
        }
        Ok(())
    }

    /// A rate and the burst its refill period makes.
    fn check_flow(&self, what: &str, rate: Option<Rate>, period: Option<Duration>) -> std::result::Result<(), String> {
        if let Some(r) = rate {
            self.check_rate(what, r)?;
            if let Some(p) = period
                && !r.is_unlimited()
            {
                self.check_burst(what, r.per_sec() * p.as_secs_f64())?;
            }
        }
        Ok(())
    }

    fn check_spec(&self, label: &str, spec: &ObjectSpec) -> std::result::Result<(), String> {
        match spec {
            ObjectSpec::Drl(d) => {
                self.check_flow(&format!("{label} rate"), Some(d.rate), d.refill_period)?;
                if let Some(b) = d.burst {
                    self.check_burst(&format!("{label} burst"), b.get())?;
                }
                Ok(())
            }
            ObjectSpec::Qos(q) => {
                for (k, r) in q.limits.rates() {
                    self.check_flow(&format!("{label} {k}"), r, q.refill_period)?;
                }
                Ok(())
            }
            ObjectSpec::Noop | ObjectSpec::Batch(_) => Ok(()),
        }
    }

    /// A change to an object now configured as `current`.
    fn check_config(
        &self,
        label: &str,
        current: Option<&ObjectSpec>,
        set: &ObjectChange,
    ) -> std::result::Result<(), String> {
        match current {
            Some(ObjectSpec::Drl(d)) => {
                let s: DrlSettings = set.parse("drl").map_err(|e| format!("{label}: {}: {}", e.field, e.message))?;
                let rate = s.rate.unwrap_or(d.rate);
                let period = s.refill_period.or(if s.rate.is_some() { d.refill_period } else { None });
                self.check_flow(&format!("{label} rate"), Some(rate), period)?;
                if let Some(b) = s.burst {
                    self.check_burst(&format!("{label} burst"), b.get())?;
                }
                Ok(())
            }
            Some(ObjectSpec::Qos(q)) => {
                let s: QosSpec = set.parse("qos").map_err(|e| format!("{label}: {}: {}", e.field, e.message))?;
                let period = s.refill_period.or(q.refill_period);
                for ((k, new), (_, old)) in s.limits.rates().into_iter().zip(q.limits.rates()) {
                    self.check_flow(&format!("{label} {k}"), new.or(old), period)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// `AgentAuth`: answers challenges, outside the token check.
struct Auth {
    core: Arc<Core>,
}

#[tonic::async_trait]
impl AgentAuthService for Auth {
    async fn challenge(
        &self,
        req: Request<pb::ChallengeRequest>,
    ) -> std::result::Result<Response<pb::ChallengeReply>, Status> {
        self.core.speaks(req.metadata())?;
        let Some(keys) = &self.core.keys else {
            return Ok(Response::new(pb::ChallengeReply::default()));
        };
        let (agent_nonce, proof) = keys.answer(&req.get_ref().client_nonce).map_err(Status::invalid_argument)?;
        Ok(Response::new(pb::ChallengeReply {
            has_token: true,
            agent_nonce: agent_nonce.to_vec(),
            proof: proof.to_vec(),
        }))
    }
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
        s.check_lease_ms(r.lease_ms)?;
        let source: Arc<str> = if r.source.is_empty() { "remote rules".into() } else { r.source.as_str().into() };
        let rules = RuleSet::parse(&r.text, format, Some(source), &kv_stage::paio::PaioOptions::default())
            .map_err(|e| s.invalid(stage_status(&e)))?;
        // The lease is taken under its lock, so a fallback cannot run
        // between the checkpoint and the change.
        let mut lease = s.lease.lock().unwrap_or_else(|e| e.into_inner());
        s.check_rules(&rules).map_err(|m| s.invalid(Status::invalid_argument(m)))?;
        let taken = s.checkpoint_for(&lease, r.lease_ms);
        // Nothing applied on an error: the lease stays as it was.
        let report = s.stage.apply(&rules).map_err(|e| s.invalid(stage_status(&e)))?;
        s.take_lease(&mut lease, r.lease_ms, taken);
        Ok(Response::new(pb::ApplyRulesReply {
            configured: report.configured as u64,
            generation: report.generation,
            warnings: report.warnings,
        }))
    }

    async fn configure(
        &self,
        req: Request<pb::ConfigureRequest>,
    ) -> std::result::Result<Response<pb::ConfigureReply>, Status> {
        let s = self.core.slot(req.metadata())?;
        let r = req.into_inner();
        s.check_lease_ms(r.lease_ms)?;
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
                ObjectChange::rate(Rate::UNLIMITED)
            }
            Some(pb::configure_request::Change::RateBps(bps)) => ObjectChange::rate(
                Rate::from_bytes_per_sec(bps)
                    .map_err(|e| s.invalid(Status::invalid_argument(format!("field `rate_bps`: {bps}: {e}"))))?,
            ),
            Some(pb::configure_request::Change::SettingsJson(json)) => serde_json::from_str::<ObjectChange>(&json)
                .map_err(|e| s.invalid(Status::invalid_argument(format!("field `settings_json`: {e}"))))?,
            None => return Err(s.invalid(Status::invalid_argument("field `change`: give rate_bps or settings_json"))),
        };
        handle.check(&set).map_err(|e| s.invalid(stage_status(&e)))?;
        s.check_config(&format!("{}/{}", r.channel, r.object), handle.spec().as_ref(), &set)
            .map_err(|m| s.invalid(Status::invalid_argument(m)))?;
        let mut lease = s.lease.lock().unwrap_or_else(|e| e.into_inner());
        let taken = s.checkpoint_for(&lease, r.lease_ms);
        handle.configure(&set).map_err(|e| s.invalid(stage_status(&e)))?;
        s.take_lease(&mut lease, r.lease_ms, taken);
        drop(lease);
        Ok(Response::new(pb::ConfigureReply {}))
    }
}
