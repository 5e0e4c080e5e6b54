//! The controller's policy scenarios (SILK, SILK with pressure, max-min
//! join and leave, failing and NaN-rate policies), run through remote
//! stages: every stage behind its own agent on a Unix socket, the
//! controller driving `RemoteStage` handles. The scenarios and their
//! assertions are the in-process ones (`controller/tests/scenarios`).

use std::sync::{Arc, Mutex};

use controller::StageHandle;
use kv_remote::{ClientOptions, Connector, Endpoint, StageAgent};
use kv_stage::Stage;

#[path = "../../controller/tests/scenarios/mod.rs"]
mod scenarios;

/// Each stage gets an agent on a socket in a temporary directory; the
/// handle is a `RemoteStage` connected to it.
struct Remote {
    dir: tempfile::TempDir,
    connector: Connector,
    agents: Mutex<Vec<StageAgent>>,
}

impl Remote {
    fn new() -> Self {
        Remote {
            dir: tempfile::tempdir().unwrap(),
            connector: Connector::new(ClientOptions::default()).unwrap(),
            agents: Mutex::new(Vec::new()),
        }
    }
}

impl scenarios::Via for Remote {
    fn handle(&self, stage: &Arc<Stage>) -> Arc<dyn StageHandle> {
        let mut agents = self.agents.lock().unwrap();
        let path = self.dir.path().join(format!("{}.sock", agents.len()));
        let endpoint: Endpoint = format!("unix:{}", path.display()).parse().unwrap();
        let agent = StageAgent::serve(Arc::clone(stage), &endpoint).unwrap();
        agents.push(agent);
        let remote = self.connector.connect(&endpoint).unwrap();
        assert_eq!(remote.name(), stage.name());
        Arc::new(remote)
    }
}

#[test]
fn failing_policies_keep_the_last_rates_and_never_close_a_drl() {
    scenarios::failing_policies_keep_the_last_rates_and_never_close_a_drl(&Remote::new());
}

#[test]
fn fair_share_instances_join_and_leave() {
    scenarios::fair_share_instances_join_and_leave(&Remote::new());
}

#[test]
fn nan_and_negative_infinity_are_policy_errors_that_keep_the_rate() {
    scenarios::nan_and_negative_infinity_are_policy_errors_that_keep_the_rate(&Remote::new());
}

#[test]
fn pressure_from_the_handle_drives_silk_with_pressure() {
    scenarios::pressure_from_the_handle_drives_silk_with_pressure(&Remote::new());
}

#[test]
fn silk_sees_level_pair_jobs_through_their_classes() {
    scenarios::silk_sees_level_pair_jobs_through_their_classes(&Remote::new());
}
