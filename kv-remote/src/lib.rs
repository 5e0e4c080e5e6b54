//! # kv-remote: one controller, stages in many processes and hosts
//!
//! The Paio design's control plane, over the network: a stage's process
//! runs a [`StageAgent`] next to its stage (a few lines, on a Unix socket
//! or a loopback port), and a controller reaches it through a
//! [`RemoteStage`], which is a [`controller::StageHandle`] like the stage
//! itself: SILK, max-min, proportional and static policies run unchanged.
//! The protocol is `kvsds.control.v1` (gRPC, tonic + prost; the schema is
//! `proto/kvsds/control/v1/control.proto`, the generated types are [`pb`]).
//!
//! Every change a controller makes carries a **lease**; a stage whose
//! lease is not renewed in time falls back to its own configuration
//! ([`Fallback`]) and logs it, so a dead controller never leaves a tenant
//! throttled. The `kvsds-controller` binary runs a fleet from a TOML file
//! ([`FleetConfig`]): it connects to every listed agent, joins each to the
//! policy when it answers and drops it when it does not, reconnecting with
//! backoff.
//!
//! A fleet can also live in etcd ([`etcd`]): agents register their stages
//! ([`StageAgent::register`]), several controllers elect a leader
//! ([`ElectedController`], `kvsds-controller --etcd`) that runs the policy
//! kept under a key, and every call carries the leader's term
//! ([`TERM_KEY`]), so a deposed leader is refused.
//!
//! ```
//! use std::sync::Arc;
//! use controller::StageHandle;
//! use kv_remote::{ClientOptions, Connector, StageAgent};
//! use kv_stage::{DrlSpec, Match, ObjectChange, ObjectSpec, RequestContext, Rule, Stage, units::Rate};
//!
//! // The service: a stage with a DRL, and an agent on a Unix socket.
//! let dir = tempfile::tempdir()?;
//! let stage = Arc::new(Stage::new("tenant-a"));
//! stage.apply_rules([
//!     Rule::CreateChannel { channel: "fg".into(), matches: Some(Match::context(RequestContext::FOREGROUND)) },
//!     Rule::CreateObject { channel: "fg".into(), object: "drl".into(), spec: ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED)), matches: None },
//! ])?;
//! let endpoint = format!("unix:{}", dir.path().join("a.sock").display()).parse()?;
//! let agent = StageAgent::serve(Arc::clone(&stage), &endpoint)?;
//!
//! // The controller's side: the same handle a policy drives.
//! let connector = Connector::new(ClientOptions::default())?;
//! let remote = connector.connect(agent.endpoint())?;
//! assert_eq!(remote.name(), "tenant-a");
//! let info = remote.stage_info()?;
//! assert!(info.object("fg", "drl").is_some());
//! remote.object("fg", "drl").unwrap().configure(&ObjectChange::rate("8MiB/s".parse()?))?;
//! assert_eq!(stage.object("fg", "drl").unwrap().spec(), Some(ObjectSpec::Drl(DrlSpec::new("8MiB/s".parse()?))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod agent;
mod auth;
mod convert;
mod elected;
mod error;
pub mod etcd;
mod fleet;
mod lease;
pub mod metrics;
mod remote;

/// The wire types of `kvsds.control.v1`, generated from the .proto file.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("kvsds.control.v1");
}

pub use agent::{
    AgentBuilder, AgentLimits, AgentStats, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_LEASE,
    DEFAULT_MAX_MESSAGE, DEFAULT_MIN_LEASE, Endpoint, Fallback, StageAgent,
};
pub use elected::{ElectedController, ElectedOptions, Leadership};
pub use error::{Error, Result};
pub use fleet::{Fleet, FleetConfig, FleetSection, HostConfig, MemberConfig, MemberStatus, UnitConfig};
pub use remote::{ClientOptions, Connector, ObjectSetting, RemoteStage};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The metadata key every call carries its protocol version in.
pub const PROTOCOL_VERSION_KEY: &str = "kvsds-protocol";
/// The metadata key of the token (`Bearer <token>`).
pub const TOKEN_KEY: &str = "authorization";
/// The metadata key naming the stage a call is for, on an agent serving
/// several.
pub const STAGE_KEY: &str = "kvsds-stage";
/// The metadata key carrying the caller's leadership term (a decimal
/// number: the etcd election's revision). An agent refuses a call whose
/// term is older than the newest it has seen (FAILED_PRECONDITION), so a
/// deposed leader cannot overwrite the new one's rates; a call without a
/// term (a fleet file's controller, a tool) is not fenced.
pub const TERM_KEY: &str = "kvsds-term";

/// For a binary (kvsds-controller, a service hosting an agent): prints
/// this process's `tracing` events on stderr, filtered by `RUST_LOG`
/// (default `info`), in color only on a terminal. The libraries only emit;
/// a process that installed a subscriber already keeps it.
pub fn log_to_stderr() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
