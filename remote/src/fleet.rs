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
//! token_file = "/etc/kvsds/token" # or token = "..."; sent to every agent
//! [[fleet.stage]]
//! name = "t1"                     # the policy's instance name
//! endpoint = "unix:/run/kvsds/t1.sock"
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use controller::{Controller, ControllerConfig, DecisionRecord, InstanceConfig, PolicyKind, StageHandle};
use kv_stage::Rate;
use serde::Deserialize;

use crate::agent::Endpoint;
use crate::error::{Error, Result};
use crate::remote::{ClientOptions, Connector, RemoteStage};

/// One stage of the fleet.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    /// The instance name the policy knows it by.
    pub name: String,
    /// Where its agent listens (`unix:/path`, `127.0.0.1:7401`).
    pub endpoint: String,
}

/// The `[fleet]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetSection {
    /// The lease every change carries (default: 3 control intervals, at
    /// least 100 ms).
    #[serde(default, with = "kv_stage::units::opt_duration_str")]
    pub lease: Option<Duration>,
    /// The token sent to every agent.
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
    /// The stages.
    #[serde(default)]
    pub stage: Vec<MemberConfig>,
}

/// A fleet file: the controller's configuration and a `[fleet]` table.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The controller's configuration (policy, interval, log, ...).
    pub controller: ControllerConfig,
    /// The fleet.
    pub fleet: FleetSection,
    /// The members' endpoints, parsed.
    pub endpoints: Vec<Endpoint>,
    /// The token, read.
    pub token: Option<String>,
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
        let err = |message: String| Error::Fleet { path: source.to_owned(), message };
        let mut table: toml::Table = text.parse().map_err(|e: toml::de::Error| err(e.to_string()))?;
        let fleet_value = table.remove("fleet").ok_or_else(|| err("no [fleet] table".into()))?;
        let fleet: FleetSection = fleet_value.try_into().map_err(|e: toml::de::Error| err(format!("fleet: {e}")))?;
        let rest = toml::to_string(&table).map_err(|e| err(e.to_string()))?;
        let controller = ControllerConfig::from_toml(&rest).map_err(|e| err(e.to_string()))?;
        if fleet.stage.is_empty() {
            return Err(err("fleet.stage: list at least one stage".into()));
        }
        let mut endpoints = Vec::new();
        for (i, m) in fleet.stage.iter().enumerate() {
            if m.name.is_empty() {
                return Err(err(format!("fleet.stage[{i}].name: empty")));
            }
            if fleet.stage[..i].iter().any(|o| o.name == m.name) {
                return Err(err(format!("fleet.stage[{i}].name: '{}' is listed twice", m.name)));
            }
            endpoints.push(m.endpoint.parse::<Endpoint>().map_err(|e| err(format!("fleet.stage[{i}].endpoint: {e}")))?);
            if let Some(fs) = &controller.fair_share
                && controller.policy != PolicyKind::Silk
                && !fs.instances.iter().any(|c| c.name == m.name)
            {
                return Err(err(format!(
                    "fleet.stage[{i}].name: '{}' is not a fair_share.instance (each stage needs its demand, channel and object)",
                    m.name
                )));
            }
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
        Ok(FleetConfig { controller, fleet, endpoints, token })
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

struct Member {
    config: MemberConfig,
    endpoint: Endpoint,
    instance: InstanceConfig,
    stage: Option<Arc<RemoteStage>>,
    next_try: Instant,
    backoff: Duration,
}

/// A running fleet: the controller, and a supervisor thread that joins
/// stages as they answer and drops them when they stop answering.
pub struct Fleet {
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
    /// connects to every member. Log lines (joins, leaves, connection
    /// errors) go to stderr.
    pub fn start(config: FleetConfig) -> Result<Fleet> {
        let lease = config.lease();
        let options = ClientOptions {
            token: config.token.clone(),
            timeout: config.fleet.timeout.unwrap_or(Duration::from_secs(1)),
            lease,
            ..ClientOptions::default()
        };
        let connector = Connector::new(options)?;
        let controller = Controller::builder(config.controller.clone())
            .late_instances()
            .start()
            .map_err(|e| Error::Fleet { path: "controller".into(), message: e.to_string() })?;
        let min = config.fleet.reconnect_min.unwrap_or(Duration::from_millis(100));
        let max = config.fleet.reconnect_max.unwrap_or(Duration::from_secs(5)).max(min);
        let members: Vec<Member> = config
            .fleet
            .stage
            .iter()
            .zip(&config.endpoints)
            .map(|(m, e)| Member {
                instance: config
                    .controller
                    .fair_share
                    .as_ref()
                    .and_then(|fs| fs.instances.iter().find(|c| c.name == m.name).cloned())
                    .unwrap_or_else(|| InstanceConfig {
                        name: m.name.clone(),
                        demand: Rate::UNLIMITED,
                        channel: String::new(),
                        object: String::new(),
                    }),
                config: m.clone(),
                endpoint: e.clone(),
                stage: None,
                next_try: Instant::now(),
                backoff: min,
            })
            .collect();
        let status = Arc::new(Mutex::new(
            members
                .iter()
                .map(|m| MemberStatus {
                    name: m.config.name.clone(),
                    joined: false,
                    pid: None,
                    joins: 0,
                    leaves: 0,
                    last_error: None,
                })
                .collect(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let mut sup = Supervisor {
            members,
            connector,
            controller: controller.handle(),
            check_binding: config.controller.policy != PolicyKind::Silk,
            lease,
            min,
            max,
            status: Arc::clone(&status),
            stop: Arc::clone(&stop),
        };
        let thread = std::thread::Builder::new()
            .name("fleet-supervisor".into())
            .spawn(move || sup.run())
            .map_err(|e| Error::Fleet { path: "supervisor".into(), message: e.to_string() })?;
        Ok(Fleet { controller: Some(controller), stop, thread: Some(thread), status })
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
    members: Vec<Member>,
    connector: Connector,
    controller: controller::ControllerHandle,
    check_binding: bool,
    lease: Duration,
    min: Duration,
    max: Duration,
    status: Arc<Mutex<Vec<MemberStatus>>>,
    stop: Arc<AtomicBool>,
}

fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

impl Supervisor {
    fn run(&mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            for i in 0..self.members.len() {
                self.tend(i, now);
            }
            std::thread::sleep(SUPERVISE_EVERY);
        }
    }

    fn set_status(&self, i: usize, f: impl FnOnce(&mut MemberStatus)) {
        if let Some(s) = self.status.lock().unwrap_or_else(|e| e.into_inner()).get_mut(i) {
            f(s);
        }
    }

    fn tend(&mut self, i: usize, now: Instant) {
        let lease = self.lease;
        let m = &mut self.members[i];
        if let Some(stage) = &m.stage {
            // Gone: two failed calls in a row, or no answer for a lease
            // (its stage has fallen back by then).
            let silent = now.saturating_duration_since(stage.last_ok());
            if stage.failures() >= 2 || (stage.failures() >= 1 && silent >= lease) {
                let name = m.config.name.clone();
                m.stage = None;
                m.next_try = now;
                m.backoff = self.min;
                self.controller.leave(&name);
                eprintln!("kvsds-controller: {name} left at unix ms {} (no answer for {silent:?})", unix_ms());
                self.set_status(i, |s| {
                    s.joined = false;
                    s.pid = None;
                    s.leaves += 1;
                });
            }
            return;
        }
        if now < m.next_try {
            return;
        }
        let attempt = self.connector.connect(&m.endpoint).and_then(|stage| {
            if self.check_binding {
                let info = stage.stage_info_now()?;
                controller::check_binding(&m.instance, &info).map_err(|e| Error::Remote {
                    endpoint: m.endpoint.to_string(),
                    message: format!("stage '{}': {e}", info.name),
                })?;
            }
            Ok(stage)
        });
        match attempt {
            Ok(stage) => {
                let stage = Arc::new(stage);
                let pid = stage.pid();
                eprintln!(
                    "kvsds-controller: {} joined at unix ms {} (stage '{}', pid {pid}, {})",
                    m.config.name,
                    unix_ms(),
                    stage.name(),
                    m.endpoint
                );
                self.controller.join(m.instance.clone(), Arc::clone(&stage) as Arc<dyn StageHandle>);
                m.stage = Some(stage);
                m.backoff = self.min;
                self.set_status(i, |s| {
                    s.joined = true;
                    s.pid = Some(pid);
                    s.joins += 1;
                    s.last_error = None;
                });
            }
            Err(e) => {
                let msg = e.to_string();
                m.next_try = now + m.backoff;
                m.backoff = (m.backoff * 2).min(self.max);
                let name = m.config.name.clone();
                let changed =
                    self.status.lock().unwrap_or_else(|e| e.into_inner())[i].last_error.as_deref() != Some(&msg);
                if changed {
                    eprintln!("kvsds-controller: {name}: {msg} (trying again, backoff up to {:?})", self.max);
                }
                self.set_status(i, |s| s.last_error = Some(msg));
            }
        }
    }
}
