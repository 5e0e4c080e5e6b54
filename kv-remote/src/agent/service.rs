//! The gRPC services: `AgentAuth` (challenges, outside the token check)
//! and `StageAgent` (handshake, collects, stage info, rules, configure).

use std::sync::Arc;

use kv_stage::{ObjectChange, RuleSet, RulesFormat, units::Rate};
use tonic::{Request, Response, Status};

use crate::convert;
use crate::pb;
use crate::pb::agent_auth_server::AgentAuth as AgentAuthService;
use crate::pb::stage_agent_server::StageAgent as StageAgentService;
use crate::{PROTOCOL_VERSION, STAGE_KEY};

use super::slot::Core;

/// `AgentAuth`: answers challenges, outside the token check.
pub(super) struct Auth {
    pub(super) core: Arc<Core>,
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

pub(super) struct Service {
    pub(super) core: Arc<Core>,
}

pub(super) fn stage_status(e: &kv_stage::Error) -> Status {
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
        let term = self.core.fence(req.metadata())?;
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
        self.core.fence_change(term)?;
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
        let term = self.core.fence(req.metadata())?;
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
        self.core.fence_change(term)?;
        let taken = s.checkpoint_for(&lease, r.lease_ms);
        handle.configure(&set).map_err(|e| s.invalid(stage_status(&e)))?;
        s.take_lease(&mut lease, r.lease_ms, taken);
        drop(lease);
        Ok(Response::new(pb::ConfigureReply {}))
    }
}
