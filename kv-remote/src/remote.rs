//! The controller side: a stage reached over the network, behind the same
//! [`StageHandle`] every policy uses in-process.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use controller::{HandleError, ObjectControl, ObjectRef, StageHandle};
use kv_stage::{
    Collection, ObjectChange, ObjectSpec, RuleSet, RulesFormat,
    info::{ApplyReport, StageInfo},
    object::{DrlSettings, EnforcementObject as _, Object},
    rule::RULES_VERSION,
};
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::agent::Endpoint;
use crate::convert;
use crate::error::{Error, Result};
use crate::pb;
use crate::pb::agent_auth_client::AgentAuthClient;
use crate::pb::stage_agent_client::StageAgentClient;
use crate::{PROTOCOL_VERSION, PROTOCOL_VERSION_KEY, TOKEN_KEY};

/// How a controller talks to agents.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// The agent's token. Never sent: on connecting, the client checks
    /// that the agent knows it (a challenge with HMAC-SHA256 both ways)
    /// and refuses an endpoint that does not, before any other call; the
    /// calls then carry a session credential good at that agent process
    /// only.
    pub token: Option<String>,
    /// Deadline of one call (default 2 s).
    pub timeout: Duration,
    /// Deadline of connecting (default 1 s).
    pub connect_timeout: Duration,
    /// The lease every change carries and every collect renews (default
    /// 10 s; a controller sets a few control intervals). 0 sends changes
    /// without a lease, which an agent refuses unless it was built with
    /// `require_lease = false`; they then stay until changed again.
    pub lease: Duration,
    /// Caps a message's size either way (default 4 MiB).
    pub max_message: usize,
    /// The protocol version sent (tests set another to see it refused).
    pub protocol_version: u32,
    /// The leadership term every call carries (`kvsds-term`), for a
    /// controller elected through etcd; agents refuse a term older than
    /// the newest they have seen. `None`: calls carry no term.
    pub term: Option<u64>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            token: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            lease: Duration::from_secs(10),
            max_message: crate::agent::DEFAULT_MAX_MESSAGE,
            protocol_version: PROTOCOL_VERSION,
            term: None,
        }
    }
}

/// Connects to agents; owns the client runtime (two worker threads named
/// `kvsds-client`) every stage it connects shares.
#[derive(Debug, Clone)]
pub struct Connector {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    runtime: Option<tokio::runtime::Runtime>,
    options: ClientOptions,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Inner {
    fn rt(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives as long as Inner")
    }

    /// Runs a future to completion from a plain thread.
    fn block_on<F: std::future::Future>(&self, f: F) -> std::result::Result<F::Output, String> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err("a blocking remote-stage call was made from inside a tokio runtime \
                 (call it from tokio::task::spawn_blocking)"
                .into());
        }
        Ok(self.rt().block_on(f))
    }
}

impl Connector {
    /// A connector with these options.
    pub fn new(options: ClientOptions) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kvsds-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Remote { endpoint: "-".into(), message: format!("client runtime: {e}") })?;
        Ok(Connector { inner: Arc::new(Inner { runtime: Some(runtime), options }) })
    }

    /// The options.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// Connects and shakes hands: the agent's stage, its instances and
    /// what it speaks. Refused versions and tokens are errors naming the
    /// agent's status. An agent serving several stages is refused here
    /// (use [`connect_all`](Self::connect_all) or
    /// [`connect_stage`](Self::connect_stage)).
    pub fn connect(&self, endpoint: &Endpoint) -> Result<RemoteStage> {
        let link = self.channel(endpoint)?;
        let stage = self.handshake(endpoint, link, None, None)?;
        if stage.hello.stages.len() > 1 {
            return Err(Error::Remote {
                endpoint: endpoint.to_string(),
                message: format!(
                    "the agent serves {} stages ({}): connect to one by name, or to all",
                    stage.hello.stages.len(),
                    stage.hello.stages.join(", ")
                ),
            });
        }
        Ok(stage)
    }

    /// Connects to one of the stages an agent serves, by name.
    pub fn connect_stage(&self, endpoint: &Endpoint, name: &str) -> Result<RemoteStage> {
        let link = self.channel(endpoint)?;
        self.handshake(endpoint, link, Some(name), None)
    }

    /// Connects to every stage an agent serves, over one connection. The
    /// stages read their counters together: in each control cycle the
    /// first of them to start asks for all (`CollectAll`), so a host with
    /// hundreds of stages costs one call per cycle, not hundreds.
    pub fn connect_all(&self, endpoint: &Endpoint) -> Result<Vec<RemoteStage>> {
        let link = self.channel(endpoint)?;
        let first = self.handshake(endpoint, link.clone(), None, None)?;
        let batch = Arc::new(Batch { state: Mutex::new(BatchState::default()) });
        let names = first.hello.stages.clone();
        if names.len() <= 1 {
            let mut only = first;
            only.batch = Some(Arc::clone(&batch));
            return Ok(vec![only]);
        }
        names.iter().map(|n| self.handshake(endpoint, link.clone(), Some(n), Some(Arc::clone(&batch)))).collect()
    }

    /// An HTTP/2 connection to an agent.
    fn channel(&self, endpoint: &Endpoint) -> Result<Link> {
        let inner = &self.inner;
        let remote = |message: String| Error::Remote { endpoint: endpoint.to_string(), message };
        let ep = endpoint.clone();
        let opts = inner.options.clone();
        let channel = inner
            .block_on(async move {
                let connect = async {
                    match &ep {
                        Endpoint::Tcp(addr) => tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                            .map_err(|e| e.to_string())?
                            .connect_timeout(opts.connect_timeout)
                            .tcp_nodelay(true)
                            .connect()
                            .await
                            .map_err(|e| transport_message(&e)),
                        Endpoint::Unix(path) => {
                            let path = path.clone();
                            tonic::transport::Endpoint::from_static("http://[::1]:1")
                                .connect_timeout(opts.connect_timeout)
                                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                                    let path = path.clone();
                                    async move {
                                        let s = tokio::net::UnixStream::connect(&path).await?;
                                        // The token goes only to an agent
                                        // run by us or by root.
                                        let peer = s.peer_cred()?.uid();
                                        let ours = crate::agent::own_uid().map_err(std::io::Error::other)?;
                                        if peer != ours && peer != 0 {
                                            return Err(std::io::Error::new(
                                                std::io::ErrorKind::PermissionDenied,
                                                format!(
                                                    "{} is served by uid {peer}, neither ours ({ours}) nor root: not sending it anything",
                                                    path.display()
                                                ),
                                            ));
                                        }
                                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
                                    }
                                }))
                                .await
                                .map_err(|e| transport_message(&e))
                        }
                    }
                };
                let channel = tokio::time::timeout(opts.connect_timeout, connect)
                    .await
                    .unwrap_or_else(|_| Err(format!("connecting timed out after {:?}", opts.connect_timeout)))?;
                let credential = match &opts.token {
                    Some(token) => challenge(&channel, &opts, token, matches!(ep, Endpoint::Unix(_))).await?,
                    None => None,
                };
                Ok::<_, String>((channel, credential))
            })
            .map_err(remote)?
            .map_err(remote)?;
        let (channel, credential) = channel;
        let client = StageAgentClient::new(channel)
            .max_decoding_message_size(inner.options.max_message)
            .max_encoding_message_size(inner.options.max_message);
        Ok(Link { client, credential })
    }

    fn handshake(
        &self,
        endpoint: &Endpoint,
        link: Link,
        name: Option<&str>,
        batch: Option<Arc<Batch>>,
    ) -> Result<RemoteStage> {
        let remote = |message: String| Error::Remote { endpoint: endpoint.to_string(), message };
        let stage_key = match name {
            Some(n) => Some(n.parse().map_err(|_| remote(format!("stage name '{n}' cannot be sent as metadata")))?),
            None => None,
        };
        let stage = RemoteStage {
            inner: Arc::clone(&self.inner),
            client: link.client,
            credential: link.credential,
            endpoint: endpoint.clone(),
            hello: pb::HandshakeReply::default(),
            stage_key,
            batch,
            batch_epoch: AtomicU64::new(0),
            pending_collect: Mutex::new(None),
            pending_configure: Arc::new(Mutex::new(Vec::new())),
            sent: Arc::new(Mutex::new(HashMap::new())),
            info: Mutex::new(None),
            failures: AtomicU64::new(0),
            last_ok: Mutex::new(Instant::now()),
            dropped_contexts: AtomicU64::new(0),
        };
        let hello = stage
            .call(
                |mut c, r| async move { c.handshake(r).await },
                pb::HandshakeRequest {
                    protocol_version: stage.inner.options.protocol_version,
                    client: format!("kvsds-controller pid {}", std::process::id()),
                },
            )
            .map_err(remote)?;
        Ok(RemoteStage { hello, ..stage })
    }
}

/// A connection to an agent and what its calls carry to be admitted.
#[derive(Clone)]
struct Link {
    client: StageAgentClient<Channel>,
    /// `authorization: Session ..`, from the challenge.
    credential: Option<tonic::metadata::AsciiMetadataValue>,
}

/// Checks that the agent knows `token` (without sending it), and returns
/// what the calls that follow carry instead of it (see the `auth` module):
/// nothing for an agent on a Unix socket that has no token (its peer uid,
/// checked on connecting, is its proof).
async fn challenge(
    channel: &Channel,
    opts: &ClientOptions,
    token: &str,
    unix: bool,
) -> std::result::Result<Option<tonic::metadata::AsciiMetadataValue>, String> {
    let c = crate::auth::Challenge::new()?;
    let mut req = Request::new(pb::ChallengeRequest { client_nonce: c.nonce().to_vec() });
    req.set_timeout(opts.timeout);
    if let Ok(v) = opts.protocol_version.to_string().parse() {
        req.metadata_mut().insert(PROTOCOL_VERSION_KEY, v);
    }
    insert_term(opts, req.metadata_mut());
    let reply = AgentAuthClient::new(channel.clone()).challenge(req).await.map_err(|s| match s.code() {
        tonic::Code::Unimplemented => "the agent does not answer token challenges (it is older than this client, or not a kvsds agent): not sending it anything".to_owned(),
        _ => format!("token challenge: {}", status_message(&s)),
    })?;
    let reply = reply.into_inner();
    if !reply.has_token {
        if unix {
            return Ok(None);
        }
        return Err("the agent says it has no token, so it cannot prove who it is (a TCP agent always has one): not sending it anything".into());
    }
    let session = c
        .session(token, &reply.agent_nonce, &reply.proof)
        .ok_or("the agent does not know this client's token (another agent, or another program, on this endpoint): not sending it anything")?;
    session.parse().map(Some).map_err(|_| "session credential: not ASCII".to_owned())
}

/// The counters of all the stages of one agent, read in one call per
/// cycle (see [`Connector::connect_all`]).
#[derive(Debug)]
struct Batch {
    state: Mutex<BatchState>,
}

#[derive(Debug, Default)]
struct BatchState {
    /// The current batch's number.
    epoch: u64,
    pending: Option<Pending<pb::CollectAllReply>>,
    replies: HashMap<String, pb::CollectReply>,
    error: Option<String>,
}

fn transport_message(e: &tonic::transport::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s += &format!(": {x}");
        src = x.source();
    }
    s
}

fn status_message(s: &Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

/// A status as the seam's error: the agent said no (a bad value, a stale
/// lease, a refused credential), or the call did not get through.
fn handle_error(s: &Status) -> HandleError {
    use tonic::Code;
    match s.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted | Code::Unknown => {
            HandleError::Unreachable(status_message(s))
        }
        _ => HandleError::Refused(status_message(s)),
    }
}

/// An object's configuration as [`RemoteStage::settings`] reads it:
/// channel, object, spec.
pub type ObjectSetting = (String, String, ObjectSpec);

type Pending<T> = JoinHandle<std::result::Result<T, Status>>;

/// A stage in another process (or host), reached through its agent.
///
/// Implements [`StageHandle`], so a [`controller::Controller`] drives it as
/// it drives a [`kv_stage::Stage`]: every cycle the counters of all remote
/// stages are fetched at once ([`StageHandle::begin_cycle`]), and the
/// cycle's changes are sent at once and awaited together
/// ([`StageHandle::finish_cycle`]). A change is checked here first, with
/// the same code the stage checks it with (a local copy of the object built
/// from its spec), so a bad value is refused before it is sent.
pub struct RemoteStage {
    inner: Arc<Inner>,
    client: StageAgentClient<Channel>,
    credential: Option<tonic::metadata::AsciiMetadataValue>,
    endpoint: Endpoint,
    hello: pb::HandshakeReply,
    /// The stage's name, sent with each call when its agent serves several.
    stage_key: Option<tonic::metadata::AsciiMetadataValue>,
    /// Shared with the other stages of the same agent (`connect_all`).
    batch: Option<Arc<Batch>>,
    /// The batch this stage joined last.
    batch_epoch: AtomicU64,
    pending_collect: Mutex<Option<Pending<pb::CollectReply>>>,
    pending_configure: PendingChanges,
    sent: SentChanges,
    info: Mutex<Option<Arc<StageInfo>>>,
    failures: AtomicU64,
    last_ok: Mutex<Instant>,
    dropped_contexts: AtomicU64,
}

impl std::fmt::Debug for RemoteStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteStage").field("endpoint", &self.endpoint).field("stage", &self.hello.stage).finish()
    }
}

impl RemoteStage {
    /// Where the agent is.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The stage's name, as its agent said in the handshake.
    pub fn name(&self) -> &str {
        &self.hello.stage
    }

    /// The stage's id (new for every process run).
    pub fn stage_id(&self) -> u64 {
        self.hello.stage_id
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.hello.pid
    }

    /// The handshake's answer (capabilities, lease, fallback).
    pub fn hello(&self) -> &pb::HandshakeReply {
        &self.hello
    }

    /// Calls that failed in a row (0 after a success).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// When a call last succeeded.
    pub fn last_ok(&self) -> Instant {
        *self.last_ok.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Contexts the stage reported that could not be named here (see the
    /// `convert` module).
    pub fn dropped_contexts(&self) -> u64 {
        self.dropped_contexts.load(Ordering::Relaxed)
    }

    fn request<T>(&self, msg: T) -> Request<T> {
        request(&self.inner.options, self.credential.as_ref(), self.stage_key.as_ref(), msg)
    }

    fn note<T, E>(&self, r: std::result::Result<T, E>) -> std::result::Result<T, E> {
        match &r {
            Ok(_) => {
                self.failures.store(0, Ordering::Relaxed);
                *self.last_ok.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            }
            Err(_) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        r
    }

    /// One blocking call.
    fn call<T, R, F, Fut>(&self, f: F, msg: T) -> std::result::Result<R, String>
    where
        F: FnOnce(StageAgentClient<Channel>, Request<T>) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        let fut = f(self.client.clone(), self.request(msg));
        let r =
            self.inner.block_on(fut).and_then(|r| r.map(tonic::Response::into_inner).map_err(|s| status_message(&s)));
        self.note(r)
    }

    fn spawn_collect(&self, with_settings: bool) -> Pending<pb::CollectReply> {
        let mut client = self.client.clone();
        let req = self.request(pb::CollectRequest { lease_ms: millis(self.inner.options.lease), with_settings });
        self.inner.rt().spawn(async move { client.collect(req).await.map(tonic::Response::into_inner) })
    }

    /// Waits for a call; the caller notes the outcome (after decoding it:
    /// a reply from a restarted stage is a failure too).
    fn wait<T>(&self, p: Pending<T>) -> std::result::Result<T, String> {
        self.wait_for_handle(p).map_err(|e| e.message().to_owned())
    }

    /// [`wait`](Self::wait), telling a refusal from a call that did not get through.
    fn wait_for_handle<T>(&self, p: Pending<T>) -> std::result::Result<T, HandleError> {
        match self.inner.block_on(p) {
            Ok(Ok(r)) => r.map_err(|s| handle_error(&s)),
            Ok(Err(e)) => Err(HandleError::Unreachable(format!("call aborted: {e}"))),
            Err(m) => Err(HandleError::Unreachable(m)),
        }
    }

    fn decode_collection(&self, reply: pb::CollectReply) -> std::result::Result<Collection, String> {
        if reply.lease.is_none_or(|l| l.remaining_ms == 0) {
            // No lease held (never taken, or it ran out and the stage fell
            // back): changes made under the old one must be sent again.
            self.sent.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        let c = reply.collection.ok_or("the reply has no collection")?;
        if c.stage_id != self.hello.stage_id {
            return Err(format!(
                "the stage was restarted (id {} at the handshake, {} now): connect again",
                self.hello.stage_id, c.stage_id
            ));
        }
        let d = convert::from_collection(c);
        self.dropped_contexts.fetch_add(d.dropped_contexts as u64, Ordering::Relaxed);
        Ok(d.value)
    }

    /// This stage's reply from its agent's batch of this cycle, if it
    /// joined one.
    fn collect_batched(&self) -> Option<std::result::Result<pb::CollectReply, String>> {
        let batch = self.batch.as_ref()?;
        let mut st = batch.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.batch_epoch.load(Ordering::Relaxed) != st.epoch || st.epoch == 0 {
            return None;
        }
        if let Some(p) = st.pending.take() {
            match self.inner.block_on(p).and_then(|j| match j {
                Ok(r) => r.map_err(|s| status_message(&s)),
                Err(e) => Err(format!("call aborted: {e}")),
            }) {
                Ok(all) => {
                    st.replies = all.stages.into_iter().filter_map(|s| Some((s.stage, s.reply?))).collect();
                }
                Err(e) => st.error = Some(e),
            }
        }
        let name = self.hello.stage.as_str();
        let r = match (st.replies.remove(name), &st.error) {
            (Some(r), _) => Ok(r),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => Err(format!("the agent's reply has no stage '{name}'")),
        };
        drop(st);
        Some(r)
    }

    /// The stage's counters now (blocking).
    pub fn collect_now(&self) -> Result<Collection> {
        let p = self.spawn_collect(false);
        self.note(self.wait(p).and_then(|r| self.decode_collection(r))).map_err(|m| self.error(m))
    }

    /// Every object's configuration now (channel, object, spec), and the
    /// lease's state.
    pub fn settings(&self) -> Result<(Vec<ObjectSetting>, pb::LeaseState)> {
        let p = self.spawn_collect(true);
        let reply = self.note(self.wait(p)).map_err(|m| self.error(m))?;
        let mut out = Vec::new();
        for s in reply.settings {
            let spec: ObjectSpec = serde_json::from_str(&s.spec_json)
                .map_err(|e| self.error(format!("object {}/{}: spec: {e}", s.channel, s.object)))?;
            out.push((s.channel, s.object, spec));
        }
        Ok((out, reply.lease.unwrap_or_default()))
    }

    /// The stage's layout (blocking).
    pub fn stage_info_now(&self) -> Result<StageInfo> {
        let reply = self
            .call(|mut c, r| async move { c.get_stage_info(r).await }, pb::StageInfoRequest {})
            .map_err(|m| self.error(m))?;
        let info = reply.info.ok_or_else(|| self.error("the reply has no stage info".into()))?;
        let d = convert::from_stage_info(info).map_err(|m| self.error(m))?;
        self.dropped_contexts.fetch_add(d.dropped_contexts as u64, Ordering::Relaxed);
        *self.info.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(d.value.clone()));
        Ok(d.value)
    }

    /// Applies rules text (in a rules file's format), all or nothing.
    pub fn apply_text(&self, text: &str, format: RulesFormat, source: &str) -> Result<ApplyReport> {
        let format = match format {
            RulesFormat::Toml => pb::RulesFormat::Toml,
            RulesFormat::Json => pb::RulesFormat::Json,
            RulesFormat::Paio => pb::RulesFormat::Paio,
        };
        let reply = self
            .call(
                |mut c, r| async move { c.apply_rules(r).await },
                pb::ApplyRulesRequest {
                    format: format as i32,
                    text: text.to_owned(),
                    source: source.to_owned(),
                    lease_ms: millis(self.inner.options.lease),
                },
            )
            .map_err(|m| self.error(m))?;
        Ok(ApplyReport {
            configured: usize::try_from(reply.configured).unwrap_or(usize::MAX),
            generation: reply.generation,
            warnings: reply.warnings,
        })
    }

    /// Changes one object (blocking), under the connector's lease.
    pub fn configure(&self, channel: &str, object: &str, set: &ObjectChange) -> Result<()> {
        let req = configure_request(channel, object, set, self.inner.options.lease);
        self.call(|mut c, r| async move { c.configure(r).await }, req).map(|_| ()).map_err(|m| self.error(m))
    }

    fn error(&self, message: String) -> Error {
        Error::Remote { endpoint: self.endpoint.to_string(), message }
    }

    /// The wire client, with this connection's metadata added to each
    /// request by [`RemoteStage::raw_request`] (tests send what a
    /// well-behaved controller would not).
    pub fn raw_client(&self) -> StageAgentClient<Channel> {
        self.client.clone()
    }

    /// A request with this connection's metadata (version, token, deadline).
    pub fn raw_request<T>(&self, msg: T) -> Request<T> {
        self.request(msg)
    }

    /// Runs a future on the client runtime (with [`raw_client`](Self::raw_client)).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> Result<F::Output> {
        self.inner.block_on(f).map_err(|m| self.error(m))
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn request<T>(
    o: &ClientOptions,
    credential: Option<&tonic::metadata::AsciiMetadataValue>,
    stage: Option<&tonic::metadata::AsciiMetadataValue>,
    msg: T,
) -> Request<T> {
    let mut r = Request::new(msg);
    if let Some(s) = stage {
        r.metadata_mut().insert(crate::STAGE_KEY, s.clone());
    }
    r.set_timeout(o.timeout);
    let md = r.metadata_mut();
    if let Ok(v) = o.protocol_version.to_string().parse() {
        md.insert(PROTOCOL_VERSION_KEY, v);
    }
    if let Some(c) = credential {
        md.insert(TOKEN_KEY, c.clone());
    }
    insert_term(o, md);
    r
}

fn insert_term(o: &ClientOptions, md: &mut tonic::metadata::MetadataMap) {
    if let Some(v) = o.term.and_then(|t| t.to_string().parse().ok()) {
        md.insert(crate::TERM_KEY, v);
    }
}

/// A change on the wire: a DRL's rate alone goes as a number, anything
/// else as the rule's settings in JSON.
fn configure_request(channel: &str, object: &str, set: &ObjectChange, lease: Duration) -> pb::ConfigureRequest {
    pb::ConfigureRequest {
        channel: channel.to_owned(),
        object: object.to_owned(),
        change: Some(change_of(set)),
        lease_ms: millis(lease),
    }
}

/// A typed rate change (what a controller makes) parses back without
/// writing the settings out; anything else goes as the rule's JSON.
fn change_of(set: &ObjectChange) -> pb::configure_request::Change {
    match set.parse::<DrlSettings>("DRL") {
        Ok(DrlSettings { rate: Some(r), burst: None, refill_period: None })
            if r.unit() == kv_stage::units::RateUnit::Bytes =>
        {
            pb::configure_request::Change::RateBps(r.per_sec())
        }
        _ => pb::configure_request::Change::SettingsJson(serde_json::to_string(set).unwrap_or_default()),
    }
}

/// A rule set as a JSON rules file (the agent reads it as it reads files).
fn rules_json(rules: &RuleSet) -> String {
    let rules: Vec<&kv_stage::Rule> = rules.rules.iter().map(|e| &e.rule).collect();
    serde_json::json!({ "version": RULES_VERSION, "rules": rules }).to_string()
}

impl StageHandle for RemoteStage {
    fn collect(&self) -> std::result::Result<Collection, HandleError> {
        if let Some(r) = self.collect_batched() {
            return self.note(r.and_then(|r| self.decode_collection(r))).map_err(HandleError::Unreachable);
        }
        let pending = self.pending_collect.lock().unwrap_or_else(|e| e.into_inner()).take();
        let p = pending.unwrap_or_else(|| self.spawn_collect(false));
        self.note(self.wait(p).and_then(|r| self.decode_collection(r))).map_err(HandleError::Unreachable)
    }

    fn stage_info(&self) -> std::result::Result<StageInfo, HandleError> {
        self.stage_info_now().map_err(|e| HandleError::Unreachable(e.to_string()))
    }

    fn begin_cycle(&self) {
        if let Some(batch) = &self.batch {
            let mut st = batch.state.lock().unwrap_or_else(|e| e.into_inner());
            if self.batch_epoch.load(Ordering::Relaxed) >= st.epoch {
                // The first of the agent's stages this cycle: ask for all.
                st.epoch += 1;
                st.replies.clear();
                st.error = None;
                let mut client = self.client.clone();
                let req = request(
                    &self.inner.options,
                    self.credential.as_ref(),
                    None,
                    pb::CollectRequest { lease_ms: millis(self.inner.options.lease), with_settings: false },
                );
                let p = self
                    .inner
                    .rt()
                    .spawn(async move { client.collect_all(req).await.map(tonic::Response::into_inner) });
                if let Some(old) = st.pending.replace(p) {
                    old.abort();
                }
            }
            self.batch_epoch.store(st.epoch, Ordering::Relaxed);
            return;
        }
        let p = self.spawn_collect(false);
        if let Some(old) = self.pending_collect.lock().unwrap_or_else(|e| e.into_inner()).replace(p) {
            old.abort();
        }
    }

    fn finish_cycle(&self) -> Vec<(ObjectRef, HandleError)> {
        let pending = std::mem::take(&mut *self.pending_configure.lock().unwrap_or_else(|e| e.into_inner()));
        let mut failed = Vec::new();
        for (o, p) in pending {
            if let Err(e) = self.note(self.wait_for_handle(p)) {
                self.sent.lock().unwrap_or_else(|e| e.into_inner()).remove(&o);
                failed.push((o, e));
            }
        }
        failed
    }

    fn apply(&self, rules: &RuleSet) -> std::result::Result<ApplyReport, HandleError> {
        self.apply_text(&rules_json(rules), RulesFormat::Json, "controller")
            .map_err(|e| HandleError::Refused(e.to_string()))
    }

    fn object(&self, channel: &str, object: &str) -> Option<Arc<dyn ObjectControl>> {
        let info = self.info.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        let o = info.object(channel, object)?;
        Some(Arc::new(RemoteObject {
            inner: Arc::clone(&self.inner),
            client: self.client.clone(),
            credential: self.credential.clone(),
            target: ObjectRef::new(channel, object),
            label: format!("{channel}/{object}"),
            shadow: o.spec.as_ref().and_then(|s| s.build().ok()),
            pending: Arc::clone(&self.pending_configure),
            sent: Arc::clone(&self.sent),
            stage_key: self.stage_key.clone(),
        }))
    }
}

type PendingChanges = Arc<Mutex<Vec<(ObjectRef, Pending<pb::ConfigureReply>)>>>;

/// The change each object was last sent, while a lease holds it (a
/// controller re-deciding the same rate every cycle sends it once; the
/// lease is renewed by its collects).
type SentChanges = Arc<Mutex<HashMap<ObjectRef, pb::configure_request::Change>>>;

/// One object of a remote stage.
struct RemoteObject {
    inner: Arc<Inner>,
    client: StageAgentClient<Channel>,
    credential: Option<tonic::metadata::AsciiMetadataValue>,
    target: ObjectRef,
    label: String,
    /// A local object of the same kind and spec: checks a change as the
    /// stage would (`None` for kinds this process cannot build).
    shadow: Option<Object>,
    pending: PendingChanges,
    sent: SentChanges,
    stage_key: Option<tonic::metadata::AsciiMetadataValue>,
}

impl RemoteObject {
    /// Sends a change; `None` when the same change was sent under a lease
    /// that still holds.
    fn send(&self, set: &ObjectChange) -> Option<Pending<pb::ConfigureReply>> {
        let change = change_of(set);
        if !self.inner.options.lease.is_zero() {
            let mut sent = self.sent.lock().unwrap_or_else(|e| e.into_inner());
            if sent.get(&self.target) == Some(&change) {
                return None;
            }
            sent.insert(self.target.clone(), change.clone());
        }
        let req = pb::ConfigureRequest {
            channel: self.target.channel.clone(),
            object: self.target.object.clone(),
            change: Some(change),
            lease_ms: millis(self.inner.options.lease),
        };
        let mut client = self.client.clone();
        let req = request(&self.inner.options, self.credential.as_ref(), self.stage_key.as_ref(), req);
        Some(self.inner.rt().spawn(async move { client.configure(req).await.map(tonic::Response::into_inner) }))
    }

    fn forget(&self) {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.target);
    }
}

impl ObjectControl for RemoteObject {
    fn check(&self, set: &ObjectChange) -> std::result::Result<(), HandleError> {
        match &self.shadow {
            Some(o) => o
                .validate(set)
                .map_err(|e| HandleError::Refused(format!("{}: field `{}`: {}", self.label, e.field, e.message))),
            None => Ok(()),
        }
    }

    fn configure(&self, set: &ObjectChange) -> std::result::Result<(), HandleError> {
        self.check(set)?;
        let Some(p) = self.send(set) else { return Ok(()) };
        let r = self.inner.block_on(p);
        if !matches!(r, Ok(Ok(Ok(_)))) {
            self.forget();
        }
        match r {
            Ok(Ok(Ok(_))) => Ok(()),
            Ok(Ok(Err(s))) => Err(match handle_error(&s) {
                HandleError::Unreachable(m) => HandleError::Unreachable(format!("{}: {m}", self.label)),
                e => HandleError::Refused(format!("{}: {}", self.label, e.message())),
            }),
            Ok(Err(e)) => Err(HandleError::Unreachable(format!("{}: call aborted: {e}", self.label))),
            Err(m) => Err(HandleError::Unreachable(m)),
        }
    }

    fn configure_deferred(&self, set: &ObjectChange) -> std::result::Result<(), HandleError> {
        self.check(set)?;
        if let Some(p) = self.send(set) {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).push((self.target.clone(), p));
        }
        Ok(())
    }
}
