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

use kv_stage::{RuleSet, Stage};
use tokio::sync::oneshot;
use tonic::Request;

use crate::auth::AgentKeys;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::pb::agent_auth_server::AgentAuthServer;
use crate::pb::stage_agent_server::StageAgentServer;

mod collector;
mod endpoint;
mod service;
mod slot;

pub(crate) use endpoint::own_uid;
use endpoint::{Gate, bind_unix};
use service::{Auth, Service};
pub(crate) use slot::Core;
use slot::Shared;

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
    /// The newest leadership term a call carried (0: none carried one).
    pub term: u64,
    /// Calls refused because their term was older than `term` (a deposed
    /// controller's).
    pub refused_term: u64,
    /// The term of the last change applied (configure, rules), 0 when it
    /// carried none.
    pub change_term: u64,
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
    metrics: Option<SocketAddr>,
    metrics_allow_remote: bool,
    collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
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

    /// Also serves Prometheus metrics at `http://addr/metrics`: the stages'
    /// (`kvsds_channel_*`, `kvsds_object_*`, ... of
    /// [`kv_stage::metrics`]) and the agent's own (`kvsds_agent_*`). Off
    /// unless set; `addr` must be loopback unless
    /// [`metrics_allow_remote`](Self::metrics_allow_remote). Port 0 picks
    /// one ([`StageAgent::metrics_addr`]).
    pub fn metrics(mut self, addr: SocketAddr) -> Self {
        self.metrics = Some(addr);
        self
    }

    /// Serves `collector`'s metrics next to the agent's (for example a
    /// service's RocksDB, `rocks_env::metrics::DbMetrics`).
    pub fn collector(mut self, collector: Box<dyn prometheus_client::collector::Collector>) -> Self {
        self.collectors.push(collector);
        self
    }

    /// Lets [`metrics`](Self::metrics) listen on an address that is not
    /// loopback (default false).
    pub fn metrics_allow_remote(mut self, allow: bool) -> Self {
        self.metrics_allow_remote = allow;
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
        if let Some(addr) = self.metrics
            && !addr.ip().is_loopback()
            && !self.metrics_allow_remote
        {
            return Err(Error::Metrics(format!(
                "metrics address {addr} is not a loopback address: serving metrics there needs metrics_allow_remote"
            )));
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
            term: AtomicU64::new(0),
            refused_term: AtomicU64::new(0),
            change_term: AtomicU64::new(0),
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
                            tracing::warn!(
                                uid = %uid.map_or_else(|e| e.to_string(), |u| u.to_string()),
                                allowed = ?uids,
                                "agent: refused a connection from a uid not allowed"
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
        let metrics = match self.metrics {
            Some(addr) => {
                let stages = kv_stage::metrics::StageMetrics::new();
                for s in &self.stages {
                    stages.add(s);
                }
                let mut registry = prometheus_client::registry::Registry::default();
                registry.register_collector(Box::new(stages));
                registry.register_collector(Box::new(collector::AgentCollector {
                    name: label.clone(),
                    core: Arc::clone(&core),
                }));
                for c in self.collectors {
                    registry.register_collector(c);
                }
                match crate::metrics::MetricsServer::serve(addr, self.metrics_allow_remote, Arc::new(registry)) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        // Nothing is left running: the server and the lease
                        // watchers stop, the socket file goes.
                        let _ = stop_tx.send(());
                        for t in &tasks {
                            t.abort();
                        }
                        if let Some(p) = &socket_path {
                            let _ = std::fs::remove_file(p);
                        }
                        return Err(e);
                    }
                }
            }
            None => None,
        };
        tracing::info!(agent = label.as_str(), endpoint = %local, stages = self.stages.len(), "agent serving");
        Ok(StageAgent { runtime, tasks, stop: Some(stop_tx), core, endpoint: local, socket_path, metrics })
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
    metrics: Option<crate::metrics::MetricsServer>,
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
            metrics: None,
            metrics_allow_remote: false,
            collectors: Vec::new(),
        }
    }

    /// Where it listens (with the port the system chose for `:0`).
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Where it serves metrics, when [`AgentBuilder::metrics`] was set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(crate::metrics::MetricsServer::local_addr)
    }

    /// Registers every stage it serves in etcd, one key each under
    /// `<prefix>/stages/` (see [`crate::etcd`]), with `labels`, kept
    /// alive while the returned [`Registration`](crate::etcd::Registration)
    /// lives: a controller elected through etcd then finds the stages
    /// without a fleet file. Drop the registration before the agent (its
    /// keys vanish at once); a process that dies loses them within the TTL.
    pub fn register(
        &self,
        etcd: crate::etcd::EtcdConfig,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<crate::etcd::Registration> {
        let records = self
            .core
            .slots
            .iter()
            .map(|s| {
                let info = s.stage.stage_info();
                crate::etcd::Registered {
                    stage: info.name,
                    host: info.host,
                    pid: info.pid,
                    endpoint: self.endpoint.to_string(),
                    labels: labels.clone(),
                }
            })
            .collect();
        crate::etcd::Registration::start(etcd, records)
    }

    /// What it counted so far.
    pub fn stats(&self) -> AgentStats {
        stats_of(&self.core)
    }

    /// Stops serving (calls in flight are dropped) and removes the socket.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.metrics.take();
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

/// What an agent's core counted (see [`StageAgent::stats`]).
pub(crate) fn stats_of(c: &Core) -> AgentStats {
    let sum = |f: fn(&Shared) -> u64| c.slots.iter().map(|s| f(s)).sum::<u64>();
    AgentStats {
        calls: c.calls.load(Ordering::Relaxed),
        refused_token: c.refused_token.load(Ordering::Relaxed),
        refused_version: c.refused_version.load(Ordering::Relaxed),
        refused_invalid: sum(|s| s.refused_invalid.load(Ordering::Relaxed)) + c.refused_stage.load(Ordering::Relaxed),
        // Under each slot's lease lock: a fallback under way (its stage
        // already restored) is counted before the lock is released.
        fallbacks: sum(|s| {
            let _held = s.lease.lock().unwrap_or_else(|e| e.into_inner());
            s.fallbacks.load(Ordering::Relaxed)
        }),
        refused_connections: c.refused_connections.load(Ordering::Relaxed),
        idle_closed: c.idle_closed.load(Ordering::Relaxed),
        leased: c.slots.iter().any(|s| s.lease.lock().unwrap_or_else(|e| e.into_inner()).deadline().is_some()),
        term: c.term.load(Ordering::Relaxed),
        refused_term: c.refused_term.load(Ordering::Relaxed),
        change_term: c.change_term.load(Ordering::Relaxed),
    }
}
