//! The agent's own counters as Prometheus metrics (`kvsds_agent_*`).

use std::sync::Arc;

use kv_stage::metrics::{counter, family, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

/// An agent's own counters as metrics (`kvsds_agent_*`), read at scrape
/// time from what [`StageAgent::stats`](super::StageAgent::stats) reports.
#[derive(Debug, Clone)]
pub(crate) struct AgentCollector {
    pub(crate) name: String,
    pub(crate) core: Arc<super::Core>,
}

impl Collector for AgentCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let s = super::stats_of(&self.core);
        let agent = || ("agent", self.name.clone());
        family(
            &mut e,
            "kvsds_agent_calls",
            "Control calls the agent answered (with success or an error status).",
            MetricType::Counter,
            |m| counter(m, &[agent()], s.calls),
        )?;
        family(
            &mut e,
            "kvsds_agent_refused",
            "Control calls or connections the agent refused, by reason.",
            MetricType::Counter,
            |m| {
                for (reason, n) in [
                    ("token", s.refused_token),
                    ("version", s.refused_version),
                    ("invalid", s.refused_invalid),
                    ("connection", s.refused_connections),
                    ("term", s.refused_term),
                ] {
                    counter(m, &[agent(), ("reason", reason.to_owned())], n)?;
                }
                Ok(())
            },
        )?;
        family(
            &mut e,
            "kvsds_agent_term",
            "The newest leadership term a controller's call carried (0: none carried one); older terms are refused.",
            MetricType::Gauge,
            |m| gauge(m, &[agent()], s.term as f64),
        )?;
        family(
            &mut e,
            "kvsds_agent_idle_closed",
            "Connections closed after the idle timeout.",
            MetricType::Counter,
            |m| counter(m, &[agent()], s.idle_closed),
        )?;
        family(
            &mut e,
            "kvsds_agent_lease_fallbacks",
            "Times a controller's lease ran out and the stage fell back.",
            MetricType::Counter,
            |m| counter(m, &[agent()], s.fallbacks),
        )?;
        family(
            &mut e,
            "kvsds_agent_leased",
            "1 while a controller holds a lease on one of the agent's stages.",
            MetricType::Gauge,
            |m| gauge(m, &[agent()], if s.leased { 1.0 } else { 0.0 }),
        )?;
        Ok(())
    }
}
