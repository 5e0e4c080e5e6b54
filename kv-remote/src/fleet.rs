//! A fleet: one controller, the remote stages a file lists.
//!
//! ```toml
//! policy = "max_min"              # the controller's own keys (controller::ControllerConfig)
//! interval = "500ms"
//! log = "decisions.jsonl"
//!
//! [fair_share]
//! device_bandwidth = "6MiB/s"
//! [[fair_share.instance]]
//! name = "t1"
//! demand = "1MiB/s"
//! channel = "foreground"
//! object = "drl"
//!
//! [fleet]
//! lease = "1500ms"                # default: 3 intervals, at least 100ms
//! token_file = "/etc/kvsds/token" # or token = "..."; every agent must prove it knows it
//! [[fleet.stage]]
//! name = "t1"                     # the policy's instance name
//! endpoint = "unix:/run/kvsds/t1.sock"
//!
//! [[fleet.host]]                  # an agent serving many stages: one call per cycle
//! endpoint = "10.0.0.7:7400"      # (a token is then required by the agent)
//! stages = ["s1", "s2"]           # default: every stage it serves that the policy knows
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, DecisionRecord, InstanceConfig, StageHandle};
use kv_stage::metrics::{counter, family, gauge};
use kv_stage::units::Rate;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use serde::Deserialize;

use crate::agent::Endpoint;
use crate::error::{Error, Result};
use crate::remote::{ClientOptions, Connector, RemoteStage};

/// One stage of the fleet (`[[fleet.stage]]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// The instance name the policy knows it by.
    pub name: String,
    /// Where its agent listens (`unix:/path`, `127.0.0.1:7401`).
    pub endpoint: String,
    /// The stage's name at that endpoint, when its agent serves several.
    #[serde(default)]
    pub stage: Option<String>,
}

/// An agent serving many stages (`[[fleet.host]]`), read in one call per
/// cycle; each stage is the instance of its own name.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Where the agent listens.
    pub endpoint: String,
    /// The stages to control (default: every stage it serves that the
    /// policy knows, or all of them for SILK).
    #[serde(default)]
    pub stages: Option<Vec<String>>,
}

/// A connection the supervisor keeps: one stage, or one host's stages.
#[derive(Debug, Clone, PartialEq)]
pub struct UnitConfig {
    /// Where.
    pub endpoint: Endpoint,
    /// `Some(name, stage)` for a `[[fleet.stage]]`, `None` for a host.
    pub single: Option<(String, Option<String>)>,
    /// A host's stage list, when given.
    pub names: Option<Vec<String>>,
}

/// The `[fleet]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSection {
    /// The lease every change carries (default: 3 control intervals, at
    /// least 100 ms).
    #[serde(default, with = "kv_stage::units::opt_duration_str")]
    pub lease: Option<Duration>,
    /// The agents' token (never sent: each agent proves it knows it).
    #[serde(default)]
    pub token: Option<String>,
    /// A file whose first line is the token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Deadline of one call (default 1 s).
    #[serde(default, with = "kv_stage::units::opt_duration_str")]
    pub timeout: Option<Duration>,
    /// First wait before connecting again (default 100 ms); doubles up to
    /// `reconnect_max` (default 5 s).
    #[serde(default, with = "kv_stage::units::opt_duration_str")]
    pub reconnect_min: Option<Duration>,
    /// Longest wait before connecting again.
    #[serde(default, with = "kv_stage::units::opt_duration_str")]
    pub reconnect_max: Option<Duration>,
    /// Where `kvsds-controller` serves its Prometheus metrics
    /// (`http://addr/metrics`; off unless set; loopback unless
    /// `metrics_allow_remote`).
    #[serde(default)]
    pub metrics: Option<String>,
    /// Lets `metrics` be an address that is not loopback.
    #[serde(default)]
    pub metrics_allow_remote: bool,
    /// The stages, one agent each.
    #[serde(default)]
    pub stage: Vec<MemberConfig>,
    /// Agents serving many stages.
    #[serde(default)]
    pub host: Vec<HostConfig>,
}

/// A fleet file: the controller's configuration and a `[fleet]` table.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The controller's configuration (policy, interval, log, ...).
    pub controller: ControllerConfig,
    /// The fleet.
    pub fleet: FleetSection,
    /// What the supervisor connects to, parsed.
    pub units: Vec<UnitConfig>,
    /// The token, read.
    pub token: Option<String>,
    /// Where to serve metrics (`fleet.metrics`, parsed and checked).
    pub metrics: Option<std::net::SocketAddr>,
}

impl FleetConfig {
    /// Reads a fleet file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Fleet { path: path.display().to_string(), message: e.to_string() })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a fleet file's text (`source` names it in errors).
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        Self::parse_with(text, source, false)
    }

    /// Parses a policy kept in etcd (`source` names its key): a fleet
    /// file whose `[fleet]` table is optional and may list no stage, the
    /// stages being those registered.
    pub fn parse_policy(text: &str, source: &str) -> Result<Self> {
        Self::parse_with(text, source, true)
    }

    fn parse_with(text: &str, source: &str, discovered: bool) -> Result<Self> {
        let err = |message: String| Error::Fleet { path: source.to_owned(), message };
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| err(e.to_string()))?;
        let fleet_value = match table.remove("fleet") {
            Some(v) => v,
            None if discovered => toml::Value::Table(toml::Table::new()),
            None => return Err(err("no [fleet] table".into())),
        };
        let fleet: FleetSection = fleet_value.try_into().map_err(|e: toml::de::Error| err(format!("fleet: {e}")))?;
        let rest = toml::to_string(&table).map_err(|e| err(e.to_string()))?;
        let controller = ControllerConfig::from_toml(&rest).map_err(|e| err(e.to_string()))?;
        if fleet.stage.is_empty() && fleet.host.is_empty() && !discovered {
            return Err(err("fleet: list at least one [[fleet.stage]] or [[fleet.host]]".into()));
        }
        let mut units = Vec::new();
        let mut seen: Vec<&str> = Vec::new();
        let known = |name: &str, key: &str| -> Result<()> {
            match &controller.fair_share {
                Some(fs) if !controller.is_store_policy() && !fs.instances.iter().any(|c| c.name == name) => {
                    Err(err(format!(
                        "{key}: '{name}' is not a fair_share.instance (each stage needs its demand, channel and object)"
                    )))
                }
                _ => Ok(()),
            }
        };
        for (i, m) in fleet.stage.iter().enumerate() {
            let key = format!("fleet.stage[{i}].name");
            if m.name.is_empty() {
                return Err(err(format!("{key}: empty")));
            }
            if seen.contains(&m.name.as_str()) {
                return Err(err(format!("{key}: '{}' is listed twice", m.name)));
            }
            seen.push(&m.name);
            known(&m.name, &key)?;
            units.push(UnitConfig {
                endpoint: m.endpoint.parse().map_err(|e| err(format!("fleet.stage[{i}].endpoint: {e}")))?,
                single: Some((m.name.clone(), m.stage.clone())),
                names: None,
            });
        }
        for (i, h) in fleet.host.iter().enumerate() {
            for (j, n) in h.stages.iter().flatten().enumerate() {
                let key = format!("fleet.host[{i}].stages[{j}]");
                if seen.contains(&n.as_str()) {
                    return Err(err(format!("{key}: '{n}' is listed twice")));
                }
                seen.push(n);
                known(n, &key)?;
            }
            units.push(UnitConfig {
                endpoint: h.endpoint.parse().map_err(|e| err(format!("fleet.host[{i}].endpoint: {e}")))?,
                single: None,
                names: h.stages.clone(),
            });
        }
        let token = match (&fleet.token, &fleet.token_file) {
            (Some(_), Some(_)) => return Err(err("fleet: give token or token_file, not both".into())),
            (Some(t), None) => Some(t.clone()),
            (None, Some(p)) => Some(
                std::fs::read_to_string(p)
                    .map_err(|e| err(format!("fleet.token_file: {}: {e}", p.display())))?
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        if token.as_deref().is_some_and(str::is_empty) {
            return Err(err("fleet.token: empty".into()));
        }
        for (key, d) in [("lease", fleet.lease), ("timeout", fleet.timeout), ("reconnect_min", fleet.reconnect_min)] {
            if d.is_some_and(|d| d.is_zero()) {
                return Err(err(format!("fleet.{key}: must be greater than zero")));
            }
        }
        let interval = controller.effective_interval();
        if let Some(lease) = fleet.lease
            && lease < interval * 2
        {
            return Err(err(format!(
                "fleet.lease: {lease:?} is shorter than two control intervals ({interval:?} each): the stages would fall back between cycles"
            )));
        }
        let metrics = match &fleet.metrics {
            Some(a) => {
                let addr: std::net::SocketAddr =
                    a.parse().map_err(|e| err(format!("fleet.metrics: '{a}' is not an address (ip:port): {e}")))?;
                if !addr.ip().is_loopback() && !fleet.metrics_allow_remote {
                    return Err(err(format!(
                        "fleet.metrics: {addr} is not a loopback address; set fleet.metrics_allow_remote = true to serve metrics there"
                    )));
                }
                Some(addr)
            }
            None => None,
        };
        Ok(FleetConfig { controller, fleet, units, token, metrics })
    }

    /// The lease in effect.
    pub fn lease(&self) -> Duration {
        self.fleet.lease.unwrap_or_else(|| (self.controller.effective_interval() * 3).max(Duration::from_millis(100)))
    }
}

/// How a member is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    /// Its name.
    pub name: String,
    /// Whether it is joined to the policy now.
    pub joined: bool,
    /// Its agent's pid, when joined.
    pub pid: Option<u32>,
    /// Times it joined.
    pub joins: u64,
    /// Times it left.
    pub leaves: u64,
    /// The last error, if any.
    pub last_error: Option<String>,
}

/// A connection the supervisor keeps, and the stages joined through it.
struct Unit {
    config: UnitConfig,
    joined: Vec<(String, Arc<RemoteStage>)>,
    next_try: Instant,
    backoff: Duration,
    /// When its stages joined (a member that stays joined this long has
    /// its backoff reset; one that leaves sooner keeps doubling it).
    joined_at: Option<Instant>,
    last_error: Option<String>,
    /// The etcd key it was registered under (`None`: from the file).
    source: Option<String>,
}

impl Unit {
    fn new(config: UnitConfig, min: Duration, source: Option<String>) -> Unit {
        Unit {
            config,
            joined: Vec::new(),
            next_try: Instant::now(),
            backoff: min,
            joined_at: None,
            last_error: None,
            source,
        }
    }

    fn label(&self) -> String {
        match &self.config.single {
            Some((name, _)) => name.clone(),
            None => format!("host {}", self.config.endpoint),
        }
    }
}

/// A running fleet: the controller, and a supervisor thread that joins
/// stages as they answer and drops them when they stop answering.
pub struct Fleet {
    metrics: Option<crate::metrics::MetricsServer>,
    controller: Option<Controller>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    status: Arc<Mutex<Vec<MemberStatus>>>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").field("members", &self.members()).finish_non_exhaustive()
    }
}

/// How often the supervisor looks at its members.
const SUPERVISE_EVERY: Duration = Duration::from_millis(20);

impl Fleet {
    /// Starts the controller (with no stage yet) and the supervisor, which
    /// connects to every member. Joins, leaves and connection errors are
    /// logged through `tracing`.
    pub fn start(config: FleetConfig) -> Result<Fleet> {
        Self::start_with(config, None, None)
    }

    /// Starts a fleet whose calls carry leadership `term`, and whose
    /// members are also the stages `registered` in etcd (joined when their
    /// key appears, dropped when it vanishes).
    pub(crate) fn start_with(
        config: FleetConfig,
        term: Option<u64>,
        registered: Option<Arc<crate::etcd::Watched>>,
    ) -> Result<Fleet> {
        let lease = config.lease();
        let options = ClientOptions {
            term,
            token: config.token.clone(),
            timeout: config.fleet.timeout.unwrap_or(Duration::from_secs(1)),
            lease,
            ..ClientOptions::default()
        };
        let connector = Connector::new(options)?;
        // The file has every cycle; memory keeps the last 1000 (a cycle of
        // 500 stages is a few hundred KB).
        let controller = Controller::builder(config.controller.clone())
            .late_instances()
            .max_log_records(1000)
            .start()
            .map_err(|e| Error::Fleet { path: "controller".into(), message: e.to_string() })?;
        let min = config.fleet.reconnect_min.unwrap_or(Duration::from_millis(100));
        let max = config.fleet.reconnect_max.unwrap_or(Duration::from_secs(5)).max(min);
        let units: Vec<Unit> = config.units.iter().map(|u| Unit::new(u.clone(), min, None)).collect();
        let status = Arc::new(Mutex::new(
            units
                .iter()
                .flat_map(|u| match &u.config.single {
                    Some((n, _)) => vec![n.clone()],
                    None => u.config.names.clone().unwrap_or_default(),
                })
                .map(|name| MemberStatus { name, joined: false, pid: None, joins: 0, leaves: 0, last_error: None })
                .collect(),
        ));
        let metrics = match config.metrics {
            Some(addr) => {
                let mut registry = prometheus_client::registry::Registry::default();
                registry.register_collector(Box::new(controller.metrics()));
                registry.register_collector(Box::new(FleetCollector { members: Arc::clone(&status) }));
                Some(crate::metrics::MetricsServer::serve(addr, config.fleet.metrics_allow_remote, Arc::new(registry))?)
            }
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut sup = Supervisor {
            units,
            instances: config.controller.fair_share.as_ref().map(|fs| fs.instances.clone()),
            connector,
            controller: controller.handle(),
            check_binding: !config.controller.is_store_policy(),
            lease,
            min,
            max,
            status: Arc::clone(&status),
            stop: Arc::clone(&stop),
            registered,
            registered_seen: u64::MAX,
        };
        let thread = std::thread::Builder::new()
            .name("fleet-supervisor".into())
            .spawn(move || sup.run())
            .map_err(|e| Error::Fleet { path: "supervisor".into(), message: e.to_string() })?;
        Ok(Fleet { metrics, controller: Some(controller), stop, thread: Some(thread), status })
    }

    /// Where the controller's metrics are served, when `fleet.metrics` is
    /// set.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(crate::metrics::MetricsServer::local_addr)
    }

    /// Its controller's and its members' metrics (for a registry that
    /// outlives the fleet: an elected controller's).
    pub(crate) fn collectors(&self) -> (controller::metrics::ControllerMetrics, FleetCollector) {
        (self.controller().metrics(), FleetCollector { members: Arc::clone(&self.status) })
    }

    /// The members now.
    pub fn members(&self) -> Vec<MemberStatus> {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The controller.
    pub fn controller(&self) -> &Controller {
        self.controller.as_ref().expect("present until stop")
    }

    /// Stops the supervisor and the controller; returns the decision log.
    /// Stages keep their rates until their leases run out.
    pub fn stop(mut self) -> Vec<DecisionRecord> {
        self.stop_supervisor();
        self.controller.take().map(Controller::stop).unwrap_or_default()
    }

    fn stop_supervisor(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_supervisor();
    }
}

struct Supervisor {
    units: Vec<Unit>,
    /// The fair-share instances (`None` for SILK: every stage joins).
    instances: Option<Vec<InstanceConfig>>,
    connector: Connector,
    controller: controller::ControllerHandle,
    check_binding: bool,
    lease: Duration,
    min: Duration,
    max: Duration,
    status: Arc<Mutex<Vec<MemberStatus>>>,
    stop: Arc<AtomicBool>,
    /// The registrations in etcd, when the fleet is kept there.
    registered: Option<Arc<crate::etcd::Watched>>,
    /// The generation of `registered` last synced.
    registered_seen: u64,
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

impl Supervisor {
    fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            self.sync_registered();
            for i in 0..self.units.len() {
                self.tend(i, now);
            }
            std::thread::sleep(SUPERVISE_EVERY);
        }
    }

    /// Adds a unit for each stage registered in etcd that has none, and
    /// drops (leaving the policy) each whose key vanished or moved.
    fn sync_registered(&mut self) {
        let Some(w) = &self.registered else { return };
        let generation = w.generation();
        if generation == self.registered_seen || !w.synced() {
            return;
        }
        self.registered_seen = generation;
        let entries = w.snapshot();
        let mut wanted: Vec<(String, crate::etcd::Registered)> = Vec::new();
        for (key, value) in &entries {
            match serde_json::from_slice::<crate::etcd::Registered>(value) {
                Ok(r) => wanted.push((key.clone(), r)),
                Err(e) => tracing::warn!(key = key.as_str(), "etcd key {key}: not a registration, ignored: {e}"),
            }
        }
        let mut i = 0;
        while i < self.units.len() {
            let keep = match &self.units[i].source {
                None => true,
                Some(key) => {
                    let at = self.units[i].config.endpoint.to_string();
                    wanted.iter().any(|(k, r)| k == key && r.endpoint == at)
                }
            };
            if keep {
                i += 1;
                continue;
            }
            let u = self.units.remove(i);
            for (name, _) in u.joined {
                tracing::info!(
                    instance = name.as_str(),
                    "{name} left at unix ms {} (its etcd key vanished)",
                    unix_ms()
                );
                self.member_left(&name);
            }
        }
        for (key, r) in wanted {
            if self.units.iter().any(|u| u.source.as_deref() == Some(key.as_str())) {
                continue;
            }
            if self.units.iter().any(|u| u.config.single.as_ref().is_some_and(|(n, _)| n == &r.stage)) {
                tracing::warn!(
                    key = key.as_str(),
                    "stage '{}' is registered and also listed in [fleet]; the list wins",
                    r.stage
                );
                continue;
            }
            let endpoint = match r.endpoint.parse::<Endpoint>() {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(key = key.as_str(), "etcd key {key}: endpoint: {e}; ignored");
                    continue;
                }
            };
            tracing::info!(
                key = key.as_str(),
                pid = r.pid,
                host = r.host.as_str(),
                "stage '{}' registered at {endpoint}",
                r.stage
            );
            let config = UnitConfig { endpoint, single: Some((r.stage.clone(), Some(r.stage.clone()))), names: None };
            self.units.push(Unit::new(config, self.min, Some(key)));
            self.set_status(&r.stage, |_| {});
        }
    }

    /// A member leaves the policy (its share goes to the others at the
    /// next cycle).
    fn member_left(&self, name: &str) {
        self.controller.leave(name);
        self.set_status(name, |s| {
            s.joined = false;
            s.pid = None;
            s.leaves += 1;
        });
    }

    fn set_status(&self, name: &str, f: impl FnOnce(&mut MemberStatus)) {
        let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
        match st.iter_mut().find(|s| s.name == name) {
            Some(s) => f(s),
            None => {
                let mut s = MemberStatus {
                    name: name.to_owned(),
                    joined: false,
                    pid: None,
                    joins: 0,
                    leaves: 0,
                    last_error: None,
                };
                f(&mut s);
                st.push(s);
            }
        }
    }

    /// The policy's configuration of an instance (a placeholder for SILK,
    /// which needs none); `None` when a fair-share policy does not know it.
    fn instance(&self, name: &str) -> Option<InstanceConfig> {
        match &self.instances {
            Some(list) if self.check_binding => list.iter().find(|c| c.name == name).cloned(),
            _ => Some(InstanceConfig {
                name: name.to_owned(),
                demand: Rate::UNLIMITED,
                channel: String::new(),
                object: String::new(),
            }),
        }
    }

    /// Connects a unit: its stages, each with its instance configuration.
    fn connect(&self, u: &UnitConfig) -> Result<Vec<(InstanceConfig, RemoteStage)>> {
        let stages: Vec<(String, RemoteStage)> = match &u.single {
            Some((name, stage)) => {
                let s = match stage {
                    Some(st) => self.connector.connect_stage(&u.endpoint, st)?,
                    None => self.connector.connect(&u.endpoint)?,
                };
                vec![(name.clone(), s)]
            }
            None => {
                let all = self.connector.connect_all(&u.endpoint)?;
                if let Some(names) = &u.names
                    && let Some(missing) = names.iter().find(|n| !all.iter().any(|s| s.name() == n.as_str()))
                {
                    return Err(Error::Remote {
                        endpoint: u.endpoint.to_string(),
                        message: format!("the agent serves no stage '{missing}'"),
                    });
                }
                all.into_iter()
                    .filter(|s| u.names.as_ref().is_none_or(|n| n.iter().any(|x| x == s.name())))
                    .map(|s| (s.name().to_owned(), s))
                    .collect()
            }
        };
        let mut out = Vec::new();
        for (name, stage) in stages {
            let Some(instance) = self.instance(&name) else {
                tracing::warn!(
                    endpoint = %u.endpoint,
                    stage = name.as_str(),
                    "stage '{name}' is not a fair_share.instance; not controlled"
                );
                continue;
            };
            if self.check_binding {
                let info = stage.stage_info_now()?;
                controller::check_binding(&instance, &info).map_err(|e| Error::Remote {
                    endpoint: u.endpoint.to_string(),
                    message: format!("stage '{}': {e}", info.name),
                })?;
            }
            out.push((instance, stage));
        }
        Ok(out)
    }

    /// How long a member must stay joined for its backoff to start over.
    fn stable_after(&self) -> Duration {
        (self.lease * 4).max(self.max)
    }

    fn tend(&mut self, i: usize, now: Instant) {
        let lease = self.lease;
        if !self.units[i].joined.is_empty() {
            // Gone: two failed calls in a row, or no answer for a lease
            // (its stages have fallen back by then).
            let gone = self.units[i].joined.iter().find_map(|(_, s)| {
                let silent = now.saturating_duration_since(s.last_ok());
                (s.failures() >= 2 || (s.failures() >= 1 && silent >= lease)).then_some(silent)
            });
            if let Some(silent) = gone {
                let left = std::mem::take(&mut self.units[i].joined);
                let stable_after = self.stable_after();
                let u = &mut self.units[i];
                // An agent that answers the handshake and then fails is
                // tried again later and later; one that served a while is
                // tried again at once.
                let stayed = u.joined_at.take().map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
                (u.next_try, u.backoff) = after_leave(now, stayed, u.backoff, self.min, self.max, stable_after);
                for (name, _) in left {
                    tracing::warn!(
                        instance = name.as_str(),
                        "{name} left at unix ms {} (no answer for {silent:?})",
                        unix_ms()
                    );
                    self.member_left(&name);
                }
            }
            return;
        }
        if now < self.units[i].next_try {
            return;
        }
        match self.connect(&self.units[i].config) {
            Ok(stages) => {
                let endpoint = self.units[i].config.endpoint.to_string();
                for (instance, stage) in stages {
                    let stage = Arc::new(stage);
                    let pid = stage.pid();
                    let name = instance.name.clone();
                    tracing::info!(
                        instance = name.as_str(),
                        pid,
                        endpoint = endpoint.as_str(),
                        "{name} joined at unix ms {} (stage '{}')",
                        unix_ms(),
                        stage.name(),
                    );
                    self.controller.join(instance, Arc::clone(&stage) as Arc<dyn StageHandle>);
                    self.units[i].joined.push((name.clone(), stage));
                    self.set_status(&name, |s| {
                        s.joined = true;
                        s.pid = Some(pid);
                        s.joins += 1;
                        s.last_error = None;
                    });
                }
                let u = &mut self.units[i];
                u.joined_at = Some(now);
                u.last_error = None;
                if u.joined.is_empty() {
                    // A host serving nothing the policy knows: look again later.
                    u.next_try = now + self.max;
                }
            }
            Err(e) => {
                let msg = e.to_string();
                let label = self.units[i].label();
                let u = &mut self.units[i];
                u.next_try = now + u.backoff;
                u.backoff = (u.backoff * 2).min(self.max);
                if u.last_error.as_deref() != Some(&msg) {
                    tracing::warn!(
                        member = label.as_str(),
                        error = msg.as_str(),
                        "cannot reach {label}; trying again, backoff up to {:?}",
                        self.max
                    );
                }
                u.last_error = Some(msg.clone());
                if let Some((name, _)) = &u.config.single {
                    let name = name.clone();
                    self.set_status(&name, |s| s.last_error = Some(msg));
                }
            }
        }
    }
}

/// When a member that left is tried again, and the backoff after that:
/// at once with the backoff reset if it had stayed joined `stable_after`
/// or longer, else after the backoff, which doubles up to `max` (an agent
/// that answers the handshake and then fails is not reconnected every
/// cycle forever).
fn after_leave(
    now: Instant,
    stayed: Duration,
    backoff: Duration,
    min: Duration,
    max: Duration,
    stable_after: Duration,
) -> (Instant, Duration) {
    if stayed >= stable_after { (now, min) } else { (now + backoff, (backoff * 2).min(max)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_in_etcd_needs_no_stage_list_and_a_bad_one_names_its_key() {
        let text = "policy = \"silk\"\ninterval = \"200ms\"\n";
        let e = FleetConfig::parse(text, "fleet.toml").unwrap_err().to_string();
        assert!(e.contains("fleet.toml: no [fleet] table"), "{e}");
        let c = FleetConfig::parse_policy(text, "/kvsds/policy").unwrap();
        assert!(c.units.is_empty());
        assert_eq!(c.lease(), Duration::from_millis(600));
        let e = FleetConfig::parse_policy("policy = \"fastest\"\n", "/kvsds/policy").unwrap_err().to_string();
        assert!(e.starts_with("/kvsds/policy: "), "{e}");
        let e = FleetConfig::parse_policy(&format!("{text}[fleet]\nlease = \"100ms\"\n"), "/kvsds/policy")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/kvsds/policy: fleet.lease"), "{e}");
    }

    #[test]
    fn a_member_that_joins_and_fails_backs_off_more_each_time() {
        let (min, max, stable) = (Duration::from_millis(100), Duration::from_secs(5), Duration::from_secs(5));
        let t0 = Instant::now();
        let mut backoff = min;
        let mut waits = Vec::new();
        for _ in 0..8 {
            // Joined, then gone after 50 ms (two failed calls).
            let (next, b) = after_leave(t0, Duration::from_millis(50), backoff, min, max, stable);
            waits.push(next - t0);
            backoff = b;
        }
        let ms: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        // One that served a while is tried again at once, from the minimum.
        assert_eq!(after_leave(t0, Duration::from_secs(60), backoff, min, max, stable), (t0, min));
    }
}

/// A fleet's members as metrics (`kvsds_fleet_*`), served by
/// `kvsds-controller` next to the controller's.
#[derive(Debug)]
pub(crate) struct FleetCollector {
    pub(crate) members: Arc<Mutex<Vec<MemberStatus>>>,
}

impl Collector for FleetCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let members = self.members.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let member = |m: &MemberStatus| ("member", m.name.clone());
        family(
            &mut e,
            "kvsds_fleet_member_joined",
            "1 while the member's stage takes part in the policy.",
            MetricType::Gauge,
            |enc| {
                for m in &members {
                    gauge(enc, &[member(m)], if m.joined { 1.0 } else { 0.0 })?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_fleet_member_joins",
            "Times the member joined the policy.",
            MetricType::Counter,
            |enc| {
                for m in &members {
                    counter(enc, &[member(m)], m.joins)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_fleet_member_leaves",
            "Times the member left: its agent stopped answering (after a lease of silence its stages have fallen back to their own limits).",
            MetricType::Counter,
            |enc| {
                for m in &members {
                    counter(enc, &[member(m)], m.leaves)?;
                }
                Ok(())
            },
        )?;
        Ok(())
    }
}
