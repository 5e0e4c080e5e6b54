//! `kvsds-controller` processes that elect one leader through etcd: each
//! campaigns on etcd's election API under an etcd lease it keeps alive;
//! the leader runs the fleet (the policy from `<prefix>/policy`, the
//! stages registered under `<prefix>/stages/`), its calls carrying its
//! term, and the others wait.
//!
//! Losing the lease ends the leadership: when etcd says it expired, or when
//! no keep-alive was answered for a TTL (etcd away or partitioned: another
//! controller may lead on the other side by now). The leader then stops
//! driving its stages at once and campaigns again; the stages keep its
//! last rates until their agents' leases run out, and fall back. So a
//! controller never drives stages while another may lead for longer than
//! a TTL, and a deposed one that still sends is refused by term.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kv_stage::metrics::{counter, family, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::error::{Error, Result};
use crate::etcd::{EtcdConfig, Watch, Worker, keep_alive_once, runtime};
use crate::fleet::{Fleet, FleetCollector, FleetConfig};
use crate::metrics::MetricsServer;

/// How an elected controller runs.
#[derive(Debug, Clone)]
pub struct ElectedOptions {
    /// Where etcd is, the prefix, the TTL.
    pub etcd: EtcdConfig,
    /// This controller's decision log, in place of the policy's `log`
    /// (several controllers on one host would write one file otherwise).
    pub log: Option<PathBuf>,
    /// Where to serve Prometheus metrics: the leadership's
    /// (`kvsds_elected_*`) always, the controller's and the fleet's while
    /// leading. The policy's `fleet.metrics` is not used (one address in
    /// etcd for every controller).
    pub metrics: Option<SocketAddr>,
    /// Lets `metrics` be an address that is not loopback.
    pub metrics_allow_remote: bool,
}

impl ElectedOptions {
    /// Runs with `etcd`, and the policy's own log and metrics settings.
    pub fn new(etcd: EtcdConfig) -> Self {
        ElectedOptions { etcd, log: None, metrics: None, metrics_allow_remote: false }
    }
}

/// What an elected controller is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leadership {
    /// Whether it leads now (and drives the stages, once a policy is set).
    pub leading: bool,
    /// Its term while leading, else its last (0: never led).
    pub term: u64,
    /// Times it was elected.
    pub elections: u64,
    /// Times it lost the leadership (its etcd lease lapsed).
    pub lost: u64,
    /// Policy values refused (each logged, naming the key).
    pub policies_refused: u64,
    /// Policy values applied.
    pub policies_applied: u64,
}

/// A controller that campaigns for the leadership through etcd, on a
/// thread of its own, until [`stop`](Self::stop) (which hands the
/// leadership over at once by revoking its lease).
pub struct ElectedController {
    state: Arc<Mutex<Leadership>>,
    worker: Worker,
    metrics: Option<MetricsServer>,
}

impl std::fmt::Debug for ElectedController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectedController").field("leadership", &self.leadership()).finish_non_exhaustive()
    }
}

impl ElectedController {
    /// Starts campaigning. etcd need not be up yet.
    pub fn start(options: ElectedOptions) -> Result<ElectedController> {
        options.etcd.validate()?;
        let state = Arc::new(Mutex::new(Leadership::default()));
        let current = Current::default();
        let metrics = match options.metrics {
            Some(addr) => {
                let mut registry = prometheus_client::registry::Registry::default();
                registry.register_collector(Box::new(ElectedCollector { state: Arc::clone(&state) }));
                registry.register_collector(Box::new(current.controller.clone()));
                registry.register_collector(Box::new(current.members.clone()));
                Some(MetricsServer::serve(addr, options.metrics_allow_remote, Arc::new(registry))?)
            }
            None => None,
        };
        let cfg = &options.etcd;
        let rt = runtime()?;
        let registered = Watch::start(cfg.clone(), cfg.stages_prefix(), true)?;
        let policy = Watch::start(cfg.clone(), cfg.policy_key(), false)?;
        let st = Arc::clone(&state);
        let worker = Worker::spawn("kvsds-elected", "election".into(), move |stop| {
            session(&rt, &options, &registered, &policy, &st, &current, stop)
        })?;
        Ok(ElectedController { state, worker, metrics })
    }

    /// Where its metrics are served, when [`ElectedOptions::metrics`] is
    /// set.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// What it is doing now.
    pub fn leadership(&self) -> Leadership {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops driving, resigns (the lease is revoked: another controller
    /// leads at once) and returns, as dropping it does.
    pub fn stop(mut self) {
        self.worker.stop();
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The controller's etcd lease, as its keep-alive task sees it.
#[derive(Debug)]
struct Alive {
    last_ok: Mutex<Instant>,
    expired: AtomicBool,
}

impl Alive {
    /// The lease is gone, or may be: etcd said so, or no keep-alive was
    /// answered for a TTL.
    fn lost(&self, ttl: Duration) -> bool {
        self.expired.load(Ordering::Acquire) || self.last_ok.lock().unwrap_or_else(|e| e.into_inner()).elapsed() >= ttl
    }
}

/// Keeps `lease` alive every sixth of the TTL, reconnecting on errors, until
/// etcd says it expired.
async fn keep_alive(cfg: EtcdConfig, lease: i64, alive: Arc<Alive>) {
    let every = Duration::from_millis(u64::try_from(cfg.ttl_secs()).unwrap_or(1) * 1000 / 6);
    let mut stream = None;
    loop {
        tokio::time::sleep(every).await;
        if stream.is_none() {
            stream = match cfg.connect().await {
                Ok(mut c) => cfg.call("lease keep-alive", c.lease_keep_alive(lease)).await.ok(),
                Err(_) => None,
            };
        }
        let Some((keeper, answers)) = stream.as_mut() else { continue };
        match keep_alive_once(&cfg, keeper, answers).await {
            Ok(true) => *alive.last_ok.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now(),
            Ok(false) => {
                alive.expired.store(true, Ordering::Release);
                return;
            }
            Err(_) => stream = None,
        }
    }
}

/// One etcd lease: campaign with it, lead while it lives. Returns when it
/// is lost or on `stop`; an error when etcd cannot be used.
fn session(
    rt: &tokio::runtime::Runtime,
    options: &ElectedOptions,
    registered: &Watch,
    policy: &Watch,
    state: &Mutex<Leadership>,
    current: &Current,
    stop: &AtomicBool,
) -> Result<()> {
    let cfg = &options.etcd;
    let ttl = Duration::from_secs(u64::try_from(cfg.ttl_secs()).unwrap_or(1));
    let (mut client, lease) = rt.block_on(async {
        let mut client = cfg.connect().await?;
        let lease = cfg.call("lease grant", client.lease_grant(cfg.ttl_secs(), None)).await?.id();
        Ok::<_, Error>((client, lease))
    })?;
    let alive = Arc::new(Alive { last_ok: Mutex::new(Instant::now()), expired: AtomicBool::new(false) });
    let keeper = rt.spawn(keep_alive(cfg.clone(), lease, Arc::clone(&alive)));
    let revoke = |client: &mut etcd_client::Client| {
        let _ = rt.block_on(cfg.call("lease revoke", client.lease_revoke(lease)));
    };
    let host =
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "?".into(), |h| h.trim().to_owned());
    let me = format!("{}@{host}", std::process::id());
    tracing::info!(lease, ttl_s = cfg.ttl_secs(), "campaigning for {} as {me}", cfg.election());
    let mut election = client.election_client();
    let campaign = rt.block_on(async {
        tokio::select! {
            r = election.campaign(cfg.election(), me.clone(), lease) => Some(r),
            () = async {
                while !stop.load(Ordering::Relaxed) && !alive.lost(ttl) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            } => None,
        }
    });
    let key = match campaign {
        None => {
            keeper.abort();
            revoke(&mut client);
            return Ok(());
        }
        Some(Err(e)) => {
            keeper.abort();
            return Err(cfg.error(format!("campaign: {e}")));
        }
        Some(Ok(r)) => r.leader().cloned().ok_or_else(|| cfg.error("campaign: no leader key".into()))?,
    };
    let term = u64::try_from(key.rev()).unwrap_or(0);
    {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.leading = true;
        s.term = term;
        s.elections += 1;
    }
    tracing::info!(term, lease, "leading at unix ms {} (term {term})", unix_ms());
    let policy_key = cfg.policy_key();
    let mut fleet: Option<Fleet> = None;
    let mut policy_now: Option<(Vec<u8>, FleetConfig)> = None;
    let mut seen = u64::MAX;
    let mut announced = false;
    // Once every registered stage has joined (or an interval passed), the
    // first cycle runs at once rather than up to an interval later.
    let mut kicked = false;
    let mut kick_from: Option<Instant> = None;
    let mut waiting_said = false;
    let lost = loop {
        if stop.load(Ordering::Relaxed) {
            break false;
        }
        if alive.lost(ttl) {
            break true;
        }
        let generation = policy.watched.generation();
        if generation != seen && policy.watched.synced() {
            seen = generation;
            match policy.watched.snapshot().remove(&policy_key) {
                None if policy_now.is_none() && !waiting_said => {
                    waiting_said = true;
                    tracing::warn!(
                        key = policy_key.as_str(),
                        "no policy at {policy_key} yet: waiting for one (kvsds-controller --put-policy FILE)"
                    );
                }
                None => {}
                Some(text) if policy_now.as_ref().is_some_and(|(t, _)| *t == text) => {}
                Some(text) => match read_policy(&text, &policy_key, options) {
                    Err(e) => {
                        state.lock().unwrap_or_else(|e| e.into_inner()).policies_refused += 1;
                        tracing::warn!(
                            key = policy_key.as_str(),
                            "refused the policy at {e}; keeping the previous one"
                        );
                    }
                    Ok(config) => {
                        if let Some(f) = fleet.take() {
                            current.set(None);
                            f.stop();
                        }
                        match Fleet::start_with(config.clone(), Some(term), Some(Arc::clone(&registered.watched))) {
                            Ok(f) => {
                                tracing::info!(
                                    key = policy_key.as_str(),
                                    term,
                                    policy = ?config.controller.policy,
                                    interval = ?config.controller.effective_interval(),
                                    "applied the policy at {policy_key}"
                                );
                                current.set(Some(&f));
                                fleet = Some(f);
                                policy_now = Some((text, config));
                                announced = false;
                                kicked = false;
                                kick_from = None;
                                state.lock().unwrap_or_else(|e| e.into_inner()).policies_applied += 1;
                            }
                            Err(e) => {
                                state.lock().unwrap_or_else(|e| e.into_inner()).policies_refused += 1;
                                tracing::warn!(
                                    key = policy_key.as_str(),
                                    "cannot run the policy at {policy_key}: {e}; keeping the previous one"
                                );
                                fleet = policy_now.as_ref().and_then(|(_, c)| {
                                    Fleet::start_with(c.clone(), Some(term), Some(Arc::clone(&registered.watched))).ok()
                                });
                                if let Some(f) = &fleet {
                                    current.set(Some(f));
                                }
                            }
                        }
                    }
                },
            }
        }
        if let (Some(f), false) = (&fleet, kicked) {
            let started = *kick_from.get_or_insert_with(Instant::now);
            let joined = f.members().iter().filter(|m| m.joined).count();
            let registered = registered.watched.snapshot().len();
            let interval = policy_now.as_ref().map_or(Duration::ZERO, |(_, c)| c.controller.effective_interval());
            if (joined > 0 && joined >= registered) || started.elapsed() >= interval {
                f.controller().cycle_now();
                kicked = true;
            }
        }
        if !announced && let Some(f) = &fleet {
            let log = f.controller().log();
            if let Some(r) = log.iter().find(|r| !r.settings.is_empty()) {
                announced = true;
                tracing::info!(
                    term,
                    cycle = r.cycle,
                    "first cycle as leader at unix ms {} (term {term}, {} settings)",
                    r.unix_ms,
                    r.settings.len()
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(f) = fleet.take() {
        current.set(None);
        f.stop();
    }
    keeper.abort();
    {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.leading = false;
        if lost {
            s.lost += 1;
        }
    }
    if lost {
        tracing::warn!(
            term,
            "lost the leadership at unix ms {} (etcd lease lapsed): stopped driving the stages",
            unix_ms()
        );
    } else {
        revoke(&mut client);
        tracing::info!(term, "resigned");
    }
    Ok(())
}

/// A policy value, parsed and with this controller's overrides.
fn read_policy(text: &[u8], key: &str, options: &ElectedOptions) -> Result<FleetConfig> {
    let text = std::str::from_utf8(text)
        .map_err(|_| Error::Fleet { path: key.to_owned(), message: "not UTF-8 text".into() })?;
    let mut config = FleetConfig::parse_policy(text, key)?;
    if let Some(log) = &options.log {
        config.controller.log = Some(log.clone());
    }
    // The elected controller serves the metrics itself (see ElectedOptions).
    config.metrics = None;
    Ok(config)
}

/// The running fleet's collectors, there while leading, empty while
/// following: what the metrics registry reads them through.
#[derive(Debug, Default, Clone)]
struct Current {
    controller: WhileLeading<controller::metrics::ControllerMetrics>,
    members: WhileLeading<FleetCollector>,
}

impl Current {
    /// The fleet now leading (`None`: none).
    fn set(&self, fleet: Option<&Fleet>) {
        let (c, m) = fleet.map(Fleet::collectors).unzip();
        *self.controller.0.lock().unwrap_or_else(|e| e.into_inner()) = c;
        *self.members.0.lock().unwrap_or_else(|e| e.into_inner()) = m;
    }
}

/// A collector that writes its inner one's metrics while there is one.
#[derive(Debug)]
struct WhileLeading<T>(Arc<Mutex<Option<T>>>);

impl<T> Default for WhileLeading<T> {
    fn default() -> Self {
        WhileLeading(Arc::new(Mutex::new(None)))
    }
}

impl<T> Clone for WhileLeading<T> {
    fn clone(&self) -> Self {
        WhileLeading(Arc::clone(&self.0))
    }
}

impl<T: Collector> Collector for WhileLeading<T> {
    fn encode(&self, e: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        match &*self.0.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(c) => c.encode(e),
            None => Ok(()),
        }
    }
}

/// The leadership as metrics (`kvsds_elected_*`).
#[derive(Debug)]
struct ElectedCollector {
    state: Arc<Mutex<Leadership>>,
}

impl Collector for ElectedCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        family(&mut e, "kvsds_elected_leading", "1 while this controller leads the fleet.", MetricType::Gauge, |m| {
            gauge(m, &[], if s.leading { 1.0 } else { 0.0 })
        })?;
        family(
            &mut e,
            "kvsds_elected_term",
            "This controller's leadership term while it leads, else its last (0: never led).",
            MetricType::Gauge,
            |m| gauge(m, &[], s.term as f64),
        )?;
        family(&mut e, "kvsds_elected_elections", "Times this controller was elected.", MetricType::Counter, |m| {
            counter(m, &[], s.elections)
        })?;
        family(
            &mut e,
            "kvsds_elected_lost",
            "Times this controller lost the leadership (its etcd lease lapsed) and stopped driving.",
            MetricType::Counter,
            |m| counter(m, &[], s.lost),
        )?;
        family(
            &mut e,
            "kvsds_elected_policies",
            "Policy values read from etcd, by outcome (applied, refused).",
            MetricType::Counter,
            |m| {
                counter(m, &[("outcome", "applied".to_owned())], s.policies_applied)?;
                counter(m, &[("outcome", "refused".to_owned())], s.policies_refused)
            },
        )?;
        Ok(())
    }
}
