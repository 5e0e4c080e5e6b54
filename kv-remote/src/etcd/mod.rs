//! A fleet kept in etcd: agents register their stages under a key prefix
//! ([`Registration`]), `kvsds-controller` processes campaign for one
//! leadership ([`ElectedController`](crate::ElectedController)), and the
//! leader reads its policy from a key and watches the registrations.
//!
//! The layout under a prefix (default `/kvsds`):
//!
//! | key | value | bound to |
//! |---|---|---|
//! | `<prefix>/stages/<stage>` | [`Registered`] as JSON | the agent's etcd lease |
//! | `<prefix>/policy` | a fleet file's text (TOML; `[fleet]` optional, no stage list needed) | nothing |
//! | `<prefix>/leader/<lease id>` | the campaigner (etcd's election API) | the controller's etcd lease |
//!
//! A leader's term is its election key's creation revision: a later
//! leader always has a larger one, and every call it sends carries it
//! ([`TERM_KEY`](crate::TERM_KEY)), so agents refuse a deposed leader.

mod register;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub use register::Registration;

/// Where a fleet's coordination lives in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// etcd's client endpoints (`http://127.0.0.1:2379`, `127.0.0.1:2379`).
    pub endpoints: Vec<String>,
    /// The key prefix the fleet's keys live under (default `/kvsds`).
    pub prefix: String,
    /// The etcd lease's TTL: a registration vanishes, and a leader is
    /// replaced, this long after its process stops renewing it (default
    /// 2 s, etcd's shortest with its default election timeout; whole
    /// seconds).
    pub ttl: Duration,
    /// Deadline of one etcd call (default 1 s).
    pub timeout: Duration,
}

impl EtcdConfig {
    /// etcd at `endpoints`, under `/kvsds`, with a TTL of 2 s.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: "/kvsds".into(),
            ttl: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
        }
    }

    /// Reads a comma-separated endpoint list (`--etcd`), checking each.
    pub fn parse_endpoints(list: &str) -> Result<Vec<String>> {
        let err = |m: String| Error::Etcd { key: "--etcd".into(), message: m };
        let eps: Vec<String> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        if eps.is_empty() {
            return Err(err(format!("'{list}': no endpoint (give host:port or http://host:port)")));
        }
        for e in &eps {
            let hostport = e.strip_prefix("http://").unwrap_or(e);
            if e.starts_with("https://") {
                return Err(err(format!("'{e}': TLS to etcd is not supported yet; use http:// on a trusted network")));
            }
            match hostport.rsplit_once(':') {
                Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => {}
                _ => return Err(err(format!("'{e}': not host:port or http://host:port"))),
            }
        }
        Ok(eps)
    }

    /// Sets the prefix (no trailing `/`).
    #[must_use]
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().trim_end_matches('/').to_owned();
        self
    }

    /// Sets the TTL (rounded up to whole seconds, at least 1 s).
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Checks the settings: endpoints, a prefix that starts with `/`.
    pub fn validate(&self) -> Result<()> {
        let err = |key: &str, m: String| Error::Etcd { key: key.into(), message: m };
        if self.endpoints.is_empty() {
            return Err(err("etcd.endpoints", "no endpoint".into()));
        }
        Self::parse_endpoints(&self.endpoints.join(","))?;
        if !self.prefix.starts_with('/') || self.prefix.len() < 2 {
            return Err(err("etcd.prefix", format!("'{}': must start with '/' and name something", self.prefix)));
        }
        if self.ttl.is_zero() || self.ttl > Duration::from_secs(3600) {
            return Err(err("etcd.ttl", format!("{:?}: must be between 1 s and 1 h", self.ttl)));
        }
        Ok(())
    }

    /// The key a stage registers under.
    pub fn stage_key(&self, stage: &str) -> String {
        format!("{}/stages/{stage}", self.prefix)
    }

    /// The prefix of every registration.
    pub fn stages_prefix(&self) -> String {
        format!("{}/stages/", self.prefix)
    }

    /// The key holding the policy (a fleet file's text).
    pub fn policy_key(&self) -> String {
        format!("{}/policy", self.prefix)
    }

    /// The election's name (its keys live under it).
    pub fn election(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    /// The TTL in whole seconds, as etcd takes it.
    pub(crate) fn ttl_secs(&self) -> i64 {
        i64::try_from(self.ttl.as_millis().div_ceil(1000)).unwrap_or(3600).max(1)
    }

    pub(crate) async fn connect(&self) -> Result<etcd_client::Client> {
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.timeout)
            .with_keep_alive(Duration::from_secs(1), self.timeout);
        match tokio::time::timeout(self.timeout * 2, etcd_client::Client::connect(&self.endpoints, Some(opts))).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(self.error(format!("cannot connect: {e}"))),
            Err(_) => Err(self.error("cannot connect: no answer".into())),
        }
    }

    pub(crate) fn error(&self, message: String) -> Error {
        Error::Etcd { key: self.endpoints.join(","), message }
    }

    /// Runs an etcd call under the deadline.
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(format!("{what}: {e}"))),
            Err(_) => Err(self.error(format!("{what}: no answer in {:?}", self.timeout))),
        }
    }
}

/// Writes a policy (a fleet file's text, checked by the caller with
/// [`FleetConfig::parse_policy`](crate::FleetConfig::parse_policy)) to
/// `<prefix>/policy`; the leader applies it from its next cycle on.
pub fn put_policy(cfg: &EtcdConfig, text: &str) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut client = cfg.connect().await?;
        cfg.call("put", client.put(cfg.policy_key(), text, None)).await.map(|_| ())
    })
}

/// The leader's campaign value (`pid@host`) and term, or `None` when no
/// controller leads.
pub fn leader(cfg: &EtcdConfig) -> Result<Option<(String, u64)>> {
    let rt = runtime()?;
    rt.block_on(async {
        let mut client = cfg.connect().await?;
        match client.leader(cfg.election()).await {
            Ok(r) => Ok(r.kv().map(|kv| {
                (String::from_utf8_lossy(kv.value()).into_owned(), u64::try_from(kv.create_revision()).unwrap_or(0))
            })),
            // etcd answers "election: no leader" as an error.
            Err(e) if e.to_string().contains("no leader") => Ok(None),
            Err(e) => Err(cfg.error(format!("leader: {e}"))),
        }
    })
}

/// What an agent registers for each stage it serves
/// (`<prefix>/stages/<stage>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    /// The stage's name: the policy's instance name.
    pub stage: String,
    /// The host it runs on.
    pub host: String,
    /// The agent's process.
    pub pid: u32,
    /// Where the agent listens (`unix:/path`, `tcp://127.0.0.1:7401`).
    pub endpoint: String,
    /// Labels (tenant, instance, ...), for operators and tools.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// The keys under a prefix (or one key), kept current by a watch on a
/// thread of its own; reconnects and lists again after an error. While
/// etcd is away it keeps the last it saw.
#[derive(Debug, Default)]
pub(crate) struct Watched {
    entries: Mutex<BTreeMap<String, Vec<u8>>>,
    generation: AtomicU64,
    synced: AtomicBool,
}

impl Watched {
    /// Changes every time the entries do.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the entries were read from etcd at least once.
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub(crate) fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn update(&self, f: impl FnOnce(&mut BTreeMap<String, Vec<u8>>)) {
        f(&mut self.entries.lock().unwrap_or_else(|e| e.into_inner()));
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// A thread that runs `attempt` until stopped, again 300 ms after each
/// error (logged once per distinct error, as "`what`: trying again");
/// stopped and joined when dropped. What the registration, the watches and
/// the election run on.
pub(crate) struct Worker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub(crate) fn spawn(
        name: &str,
        what: String,
        mut attempt: impl FnMut(&AtomicBool) -> Result<()> + Send + 'static,
    ) -> Result<Worker> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let mut last_error = String::new();
                while !s.load(Ordering::Relaxed) {
                    if let Err(e) = attempt(&s) {
                        let msg = e.to_string();
                        if msg != last_error {
                            tracing::warn!(error = msg.as_str(), "{what}: trying again");
                            last_error = msg;
                        }
                        sleep_unless(&s, Duration::from_millis(300));
                    }
                }
            })
            .map_err(|e| Error::Etcd { key: name.into(), message: e.to_string() })?;
        Ok(Worker { stop, thread: Some(thread) })
    }

    /// Stops it and waits for it to end.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread that keeps a [`Watched`] current.
pub(crate) struct Watch {
    pub(crate) watched: Arc<Watched>,
    _worker: Worker,
}

impl Watch {
    /// Watches `key` (every key under it when `prefix`).
    pub(crate) fn start(cfg: EtcdConfig, key: String, prefix: bool) -> Result<Watch> {
        let watched = Arc::new(Watched::default());
        let w = Arc::clone(&watched);
        let rt = runtime()?;
        let what = format!("etcd watch of {key}");
        let worker =
            Worker::spawn("kvsds-etcd-watch", what, move |stop| rt.block_on(watch_once(&cfg, &key, prefix, &w, stop)))?;
        Ok(Watch { watched, _worker: worker })
    }
}

/// Lists, then watches from the next revision, until an error or `stop`.
async fn watch_once(cfg: &EtcdConfig, key: &str, prefix: bool, w: &Watched, stop: &AtomicBool) -> Result<()> {
    use etcd_client::{EventType, GetOptions, WatchOptions};
    let mut client = cfg.connect().await?;
    let get = if prefix { Some(GetOptions::new().with_prefix()) } else { None };
    let listed = cfg.call("get", client.get(key, get)).await?;
    let revision = listed.header().map_or(0, |h| h.revision());
    let entries: BTreeMap<String, Vec<u8>> =
        listed.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value().to_vec())).collect();
    w.update(|m| *m = entries);
    w.synced.store(true, Ordering::Release);
    let mut opts = WatchOptions::new().with_start_revision(revision + 1);
    if prefix {
        opts = opts.with_prefix();
    }
    let mut stream = cfg.call("watch", client.watch(key, Some(opts))).await?;
    while !stop.load(Ordering::Relaxed) {
        let msg = match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
            Err(_) => continue,
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return Err(cfg.error("watch: the stream ended".into())),
            Ok(Err(e)) => return Err(cfg.error(format!("watch: {e}"))),
        };
        if msg.canceled() {
            return Err(cfg.error(format!("watch canceled: {}", msg.cancel_reason())));
        }
        if msg.events().is_empty() {
            continue;
        }
        w.update(|m| {
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                let k = String::from_utf8_lossy(kv.key()).into_owned();
                match ev.event_type() {
                    EventType::Put => {
                        m.insert(k, kv.value().to_vec());
                    }
                    EventType::Delete => {
                        m.remove(&k);
                    }
                }
            }
        });
    }
    Ok(())
}

/// One keep-alive of an etcd lease: `Ok(true)` while it lives,
/// `Ok(false)` when etcd says it expired, an error when etcd did not answer.
pub(crate) async fn keep_alive_once(
    cfg: &EtcdConfig,
    keeper: &mut etcd_client::LeaseKeeper,
    answers: &mut etcd_client::LeaseKeepAliveStream,
) -> Result<bool> {
    cfg.call("keep-alive", keeper.keep_alive()).await?;
    match tokio::time::timeout(cfg.timeout, answers.message()).await {
        Ok(Ok(Some(a))) => Ok(a.ttl() > 0),
        Ok(Ok(None)) => Err(cfg.error("keep-alive: the stream ended".into())),
        Ok(Err(e)) => Err(cfg.error(format!("keep-alive: {e}"))),
        Err(_) => Err(cfg.error(format!("keep-alive: no answer in {:?}", cfg.timeout))),
    }
}

/// A runtime for etcd calls: one worker, so that a task (a lease's
/// keep-alive) runs while the owning thread does other things.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("kvsds-etcd")
        .enable_all()
        .build()
        .map_err(|e| Error::Etcd { key: "runtime".into(), message: e.to_string() })
}

/// Sleeps `d`, in steps, returning early when `stop` is set.
pub(crate) fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let end = std::time::Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(20)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_and_keys() {
        assert_eq!(
            EtcdConfig::parse_endpoints("127.0.0.1:2379, http://h:1").unwrap(),
            ["127.0.0.1:2379", "http://h:1"]
        );
        for bad in ["", "h", "h:x", "https://h:1", ":1"] {
            let e = EtcdConfig::parse_endpoints(bad).unwrap_err().to_string();
            assert!(e.contains("--etcd"), "{bad}: {e}");
        }
        let c = EtcdConfig::new(["127.0.0.1:2379"]).with_prefix("/f/");
        assert_eq!(c.stage_key("t1"), "/f/stages/t1");
        assert_eq!(c.policy_key(), "/f/policy");
        assert!(c.validate().is_ok());
        assert_eq!(c.clone().with_ttl(Duration::from_millis(1500)).ttl_secs(), 2);
        let e = c.with_prefix("x").validate().unwrap_err().to_string();
        assert!(e.contains("etcd.prefix"), "{e}");
    }
}
