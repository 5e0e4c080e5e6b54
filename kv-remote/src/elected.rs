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
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::etcd::{EtcdConfig, Watch, runtime, sleep_unless};
use crate::fleet::{Fleet, FleetConfig};

/// How an elected controller runs.
#[derive(Debug, Clone)]
pub struct ElectedOptions {
    /// Where etcd is, the prefix, the TTL.
    pub etcd: EtcdConfig,
    /// This controller's decision log, in place of the policy's `log`
    /// (several controllers on one host would write one file otherwise).
    pub log: Option<PathBuf>,
    /// Where to serve Prometheus metrics while leading, in place of the
    /// policy's `fleet.metrics`.
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
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
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
        if let Some(addr) = options.metrics
            && !addr.ip().is_loopback()
            && !options.metrics_allow_remote
        {
            return Err(Error::Metrics(format!(
                "{addr} is not a loopback address; allow remote metrics explicitly to serve them there"
            )));
        }
        let state = Arc::new(Mutex::new(Leadership::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, s) = (Arc::clone(&state), Arc::clone(&stop));
        let thread = std::thread::Builder::new()
            .name("kvsds-elected".into())
            .spawn(move || run(&options, &st, &s))
            .map_err(|e| Error::Etcd { key: "election".into(), message: e.to_string() })?;
        Ok(ElectedController { state, stop, thread: Some(thread) })
    }

    /// What it is doing now.
    pub fn leadership(&self) -> Leadership {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops driving, resigns (the lease is revoked: another controller
    /// leads at once) and returns.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ElectedController {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

fn run(options: &ElectedOptions, state: &Mutex<Leadership>, stop: &AtomicBool) {
    let cfg = &options.etcd;
    let started = runtime().and_then(|rt| {
        let registered = Watch::start(cfg.clone(), cfg.stages_prefix(), true)?;
        let policy = Watch::start(cfg.clone(), cfg.policy_key(), false)?;
        Ok((rt, registered, policy))
    });
    let (rt, registered, policy) = match started {
        Ok(v) => v,
        Err(e) => {
            tracing::error!("cannot start the election: {e}");
            return;
        }
    };
    let mut last_error = String::new();
    while !stop.load(Ordering::Relaxed) {
        if let Err(e) = session(&rt, options, &registered, &policy, state, stop) {
            let msg = e.to_string();
            if msg != last_error {
                tracing::warn!(error = msg.as_str(), "election: trying again");
                last_error = msg;
            }
            sleep_unless(stop, Duration::from_millis(300));
        }
    }
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
        let sent: std::result::Result<(), etcd_client::Error> = keeper.keep_alive().await;
        let answer = match sent {
            Ok(()) => tokio::time::timeout(cfg.timeout, answers.message()).await.ok().and_then(|r| r.ok()).flatten(),
            Err(_) => None,
        };
        match answer {
            Some(a) if a.ttl() > 0 => *alive.last_ok.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now(),
            Some(_) => {
                alive.expired.store(true, Ordering::Release);
                return;
            }
            None => stream = None,
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
    let mut current: Option<(Vec<u8>, FleetConfig)> = None;
    let mut seen = u64::MAX;
    let mut announced = false;
    // Once every registered stage has joined (or an interval passed), the
    // first cycle runs at once rather than up to an interval later.
    let mut kicked: Option<Instant> = None;
    let mut kick_from: Option<Instant> = None;
    let mut waiting_said = false;
    let outcome = loop {
        if stop.load(Ordering::Relaxed) {
            break "stopped";
        }
        if alive.lost(ttl) {
            break "lost";
        }
        let generation = policy.watched.generation();
        if generation != seen && policy.watched.synced() {
            seen = generation;
            match policy.watched.snapshot().remove(&policy_key) {
                None if current.is_none() && !waiting_said => {
                    waiting_said = true;
                    tracing::warn!(
                        key = policy_key.as_str(),
                        "no policy at {policy_key} yet: waiting for one (kvsds-controller --put-policy FILE)"
                    );
                }
                None => {}
                Some(text) if current.as_ref().is_some_and(|(t, _)| *t == text) => {}
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
                                fleet = Some(f);
                                current = Some((text, config));
                                announced = false;
                                kicked = None;
                                kick_from = None;
                                state.lock().unwrap_or_else(|e| e.into_inner()).policies_applied += 1;
                            }
                            Err(e) => {
                                state.lock().unwrap_or_else(|e| e.into_inner()).policies_refused += 1;
                                tracing::warn!(
                                    key = policy_key.as_str(),
                                    "cannot run the policy at {policy_key}: {e}; keeping the previous one"
                                );
                                fleet = current.as_ref().and_then(|(_, c)| {
                                    Fleet::start_with(c.clone(), Some(term), Some(Arc::clone(&registered.watched))).ok()
                                });
                            }
                        }
                    }
                },
            }
        }
        if let (Some(f), None) = (&fleet, kicked) {
            let started = *kick_from.get_or_insert_with(Instant::now);
            let joined = f.members().iter().filter(|m| m.joined).count();
            let registered = registered.watched.snapshot().len();
            let interval = current.as_ref().map_or(Duration::ZERO, |(_, c)| c.controller.effective_interval());
            if (joined > 0 && joined >= registered) || started.elapsed() >= interval {
                f.controller().cycle_now();
                kicked = Some(Instant::now());
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
        f.stop();
    }
    keeper.abort();
    {
        let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.leading = false;
        if outcome == "lost" {
            s.lost += 1;
        }
    }
    if outcome == "lost" {
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
    if let Some(addr) = options.metrics {
        config.metrics = Some(addr);
        config.fleet.metrics_allow_remote = options.metrics_allow_remote;
    }
    Ok(config)
}
