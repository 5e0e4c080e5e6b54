//! What a call is checked against: `Core`, what an endpoint shares (the
//! token, the refusal counters, its stages), and `Shared`, one stage with
//! its lease and limits (admission, collects, lease renewal and fallback,
//! the checks of rules and changes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kv_stage::{
    ObjectChange, ObjectSpec, QosSpec, RequestContext, Rule, RuleSet, Stage,
    info::Checkpoint,
    object::DrlSettings,
    units::{Rate, RateUnit},
};
use tonic::{Request, Status};

use crate::auth::{self, AgentKeys, same};
use crate::convert;
use crate::lease::{FALLBACK_RETRY, Lease};
use crate::pb;
use crate::{PROTOCOL_VERSION, PROTOCOL_VERSION_KEY, STAGE_KEY, TERM_KEY, TOKEN_KEY};

use super::{AgentLimits, Fallback};

/// What an agent shares across its stages: the token and the counters of
/// refused calls.
#[derive(Debug)]
pub(crate) struct Core {
    pub(super) token: Option<String>,
    /// Answers challenges and checks sessions (with a token only).
    pub(super) keys: Option<AgentKeys>,
    /// The stages served, the first being the default.
    pub(super) slots: Vec<Arc<Shared>>,
    pub(super) calls: AtomicU64,
    pub(super) refused_token: AtomicU64,
    pub(super) refused_version: AtomicU64,
    pub(super) refused_stage: AtomicU64,
    /// The newest leadership term a call carried (fencing).
    pub(super) term: AtomicU64,
    pub(super) refused_term: AtomicU64,
    /// The term of the last change applied.
    pub(super) change_term: AtomicU64,
    pub(super) refused_connections: Arc<AtomicU64>,
    pub(super) idle_closed: Arc<AtomicU64>,
}

/// One stage an agent serves, with its lease.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) stage: Arc<Stage>,
    pub(super) name: String,
    pub(super) max_lease: Duration,
    pub(super) limits: AgentLimits,
    pub(super) fallback: Fallback,
    pub(super) lease: Mutex<Lease>,
    /// Wakes the lease watcher when a lease is taken.
    pub(super) leased: tokio::sync::Notify,
    pub(super) refused_invalid: AtomicU64,
    pub(super) fallbacks: AtomicU64,
}

impl Core {
    /// Every call: the token, then the protocol version.
    pub(super) fn admit(&self, req: &Request<()>) -> std::result::Result<(), Status> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let (Some(token), Some(keys)) = (&self.token, &self.keys) {
            let given = req.metadata().get(TOKEN_KEY).and_then(|v| v.to_str().ok());
            // A session from a challenge (what this crate's client sends),
            // or the token itself (hand tools such as grpcurl).
            let ok = match given {
                Some(v) if v.starts_with(auth::SCHEME) => keys.admits(&v[auth::SCHEME.len()..]),
                Some(v) => v.strip_prefix("Bearer ").is_some_and(|g| same(g.as_bytes(), token.as_bytes())),
                None => false,
            };
            if !ok {
                self.refused_token.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("refused a call without the agent's token");
                return Err(Status::unauthenticated(match given {
                    Some(v) if v.starts_with(auth::SCHEME) => {
                        "unknown session (the agent restarted, or the session is not one it opened)"
                    }
                    Some(_) => "wrong token",
                    None => "this agent needs a token (an AgentAuth challenge, or authorization: Bearer <token>)",
                }));
            }
        }
        self.speaks(req.metadata())?;
        self.fence(req.metadata()).map(|_| ())
    }

    /// The call's term, when it carries one: refused if older than the
    /// newest seen, which it raises otherwise.
    pub(super) fn fence(&self, md: &tonic::metadata::MetadataMap) -> std::result::Result<Option<u64>, Status> {
        let Some(v) = md.get(TERM_KEY) else { return Ok(None) };
        let Some(term) = v.to_str().ok().and_then(|t| t.parse::<u64>().ok()) else {
            return Err(Status::invalid_argument(format!("`{TERM_KEY}` metadata: not a number")));
        };
        let newest = self.term.fetch_max(term, Ordering::AcqRel).max(term);
        self.check_term(Some(term), newest)?;
        Ok(Some(term))
    }

    /// Refuses `term` if it is older than `newest` (counted and logged).
    fn check_term(&self, term: Option<u64>, newest: u64) -> std::result::Result<(), Status> {
        match term {
            Some(t) if t < newest => {
                self.refused_term.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(term = t, newest, "refused a call from a deposed controller");
                Err(Status::failed_precondition(format!(
                    "term {t} is older than term {newest}, which this agent has seen: a newer controller leads"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checks a change's term again under the stage's lease lock, right
    /// before it is applied (a newer leader's call may have come in since
    /// the call was admitted), and records it as the last change's term.
    pub(super) fn fence_change(&self, term: Option<u64>) -> std::result::Result<(), Status> {
        self.check_term(term, self.term.load(Ordering::Acquire))?;
        self.change_term.store(term.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }

    /// The protocol version a call asks for is ours.
    pub(super) fn speaks(&self, md: &tonic::metadata::MetadataMap) -> std::result::Result<(), Status> {
        match md.get(PROTOCOL_VERSION_KEY).map(|v| v.to_str().map(str::parse::<u32>)) {
            Some(Ok(Ok(PROTOCOL_VERSION))) => Ok(()),
            Some(Ok(Ok(v))) => Err(self.version_refused(&v.to_string())),
            Some(_) => Err(self.version_refused("(unreadable)")),
            None => {
                self.refused_version.fetch_add(1, Ordering::Relaxed);
                Err(Status::failed_precondition(format!(
                    "no `{PROTOCOL_VERSION_KEY}` metadata: say which protocol version you speak (this agent speaks {PROTOCOL_VERSION})"
                )))
            }
        }
    }

    pub(super) fn version_refused(&self, v: &str) -> Status {
        self.refused_version.fetch_add(1, Ordering::Relaxed);
        Status::failed_precondition(format!(
            "protocol version {v} is not supported: this agent speaks kvsds.control.v{PROTOCOL_VERSION}"
        ))
    }

    /// The stage a call is for: the one its `kvsds-stage` metadata names,
    /// or the agent's only stage.
    pub(super) fn slot(&self, md: &tonic::metadata::MetadataMap) -> std::result::Result<&Arc<Shared>, Status> {
        match md.get(STAGE_KEY).map(|v| v.to_str()) {
            Some(Ok(name)) => self.slots.iter().find(|s| s.stage.name() == name).ok_or_else(|| {
                self.refused_stage.fetch_add(1, Ordering::Relaxed);
                Status::not_found(format!(
                    "this agent serves no stage '{name}' (it serves {})",
                    self.slots.iter().map(|s| s.stage.name()).collect::<Vec<_>>().join(", ")
                ))
            }),
            Some(Err(_)) => Err(Status::invalid_argument(format!("`{STAGE_KEY}` metadata: not text"))),
            None if self.slots.len() == 1 => Ok(&self.slots[0]),
            None => {
                self.refused_stage.fetch_add(1, Ordering::Relaxed);
                Err(Status::invalid_argument(format!(
                    "this agent serves {} stages: name one in `{STAGE_KEY}` metadata",
                    self.slots.len()
                )))
            }
        }
    }
}

impl Shared {
    /// Renews the lease (when held and asked) and reads the counters.
    pub(super) fn collect(&self, r: &pb::CollectRequest) -> pb::CollectReply {
        let s = self;
        s.renew(r.lease_ms);
        let c = s.stage.collect();
        let settings = if r.with_settings {
            c.objects
                .iter()
                .filter_map(|o| {
                    let spec = s.stage.object(&o.channel, &o.object)?.spec()?;
                    Some(pb::ObjectSetting {
                        channel: o.channel.clone(),
                        object: o.object.clone(),
                        spec_json: convert::spec_json(Some(&spec)),
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        let lease = {
            let l = s.lease.lock().unwrap_or_else(|e| e.into_inner());
            pb::LeaseState {
                remaining_ms: u64::try_from(l.remaining(Instant::now()).as_millis()).unwrap_or(u64::MAX),
                fallbacks: s.fallbacks.load(Ordering::Relaxed),
            }
        };
        pb::CollectReply { collection: Some(convert::collection(&c)), settings, lease: Some(lease) }
    }

    pub(super) fn invalid(&self, status: Status) -> Status {
        self.refused_invalid.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(agent = self.name.as_str(), code = ?status.code(), reason = status.message(), "refused a call");
        status
    }

    pub(super) fn clamp(&self, lease_ms: u64) -> Duration {
        Duration::from_millis(lease_ms).min(self.max_lease)
    }

    /// Renews a lease that is held (a shorter one wakes the watcher, so
    /// the new deadline is kept).
    pub(super) fn renew(&self, lease_ms: u64) {
        if lease_ms == 0 {
            return;
        }
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if lease.renew(Instant::now(), self.clamp(lease_ms)) {
            self.leased.notify_one();
        }
    }

    /// Refuses a change this agent does not take: none without a lease
    /// (when one is required), none with a lease below the minimum.
    pub(super) fn check_lease_ms(&self, lease_ms: u64) -> std::result::Result<(), Status> {
        let l = &self.limits;
        if lease_ms == 0 && l.require_lease {
            return Err(self.invalid(Status::failed_precondition(
                "field `lease_ms`: this agent takes changes only under a lease (give lease_ms > 0)",
            )));
        }
        if lease_ms > 0 && Duration::from_millis(lease_ms) < l.min_lease {
            return Err(self.invalid(Status::invalid_argument(format!(
                "field `lease_ms`: {lease_ms} ms is below this agent's shortest lease ({} ms)",
                l.min_lease.as_millis()
            ))));
        }
        Ok(())
    }

    /// The checkpoint a change under `lease_ms` needs, taken before the
    /// change: only when it takes a lease and none is held.
    pub(super) fn checkpoint_for(&self, lease: &Lease, lease_ms: u64) -> Option<Checkpoint> {
        (lease_ms > 0 && lease.needs_checkpoint()).then(|| self.stage.checkpoint())
    }

    /// Takes (or extends) the lease after a change that succeeded; `taken`
    /// is the stage before it ([`checkpoint_for`](Self::checkpoint_for)),
    /// kept when no lease was held. The watcher is woken: the deadline may
    /// be earlier than the one it sleeps on.
    pub(super) fn take_lease(&self, lease: &mut Lease, lease_ms: u64, taken: Option<Checkpoint>) {
        if lease_ms == 0 {
            return;
        }
        lease.take(Instant::now(), self.clamp(lease_ms), taken);
        self.leased.notify_one();
    }

    /// Falls back when the lease ran out; a fallback that fails is tried
    /// again every [`FALLBACK_RETRY`] until it succeeds or a controller
    /// takes the lease again.
    pub(super) fn check_lease(&self, now: Instant) {
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if !lease.is_due(now) {
            return;
        }
        let attempt = if lease.is_retrying() { "again " } else { "" };
        let result: std::result::Result<String, String> = match &self.fallback {
            Fallback::Keep => Ok("kept the last configuration (fallback = keep)".to_owned()),
            Fallback::Rules(rules) => match self.stage.apply(rules) {
                Ok(r) => {
                    Ok(format!("applied the fallback rules ({} rules, generation {})", rules.rules.len(), r.generation))
                }
                Err(e) => Err(format!("could not apply the fallback rules: {e}")),
            },
            Fallback::Restore => match lease.checkpoint().map(|c| (c.generation(), self.stage.restore(c))) {
                None => Ok("nothing to restore".to_owned()),
                Some((from, Ok(r))) => {
                    let mut s = format!(
                        "restored the stage's layout and settings of generation {from}, from before the lease (now generation {})",
                        r.generation
                    );
                    if !r.warnings.is_empty() {
                        s += &format!("; {}", r.warnings.join("; "));
                    }
                    Ok(s)
                }
                Some((_, Err(e))) => Err(format!("could not restore the stage: {e}")),
            },
        };
        match result {
            Ok(what) => {
                lease.fell_back();
                // Counted before the lease lock is released: the restored
                // stage is visible from here on, and `stats` reads this
                // counter under the same lock, so whoever sees the stage
                // restored and then asks the agent sees the fallback too.
                let n = self.fallbacks.fetch_add(1, Ordering::Relaxed) + 1;
                drop(lease);
                tracing::warn!(
                    agent = self.name.as_str(),
                    fallback = n,
                    "lease expired, no controller renewed it (fallback #{n} {attempt}at unix ms {}): {what}",
                    unix_ms()
                );
            }
            Err(why) => {
                lease.fallback_failed(now);
                drop(lease);
                tracing::warn!(
                    agent = self.name.as_str(),
                    "lease expired at unix ms {}: the fallback failed: {why}; trying again in {FALLBACK_RETRY:?}",
                    unix_ms()
                );
            }
        }
    }

    /// Refuses a batch beyond the agent's bounds: rates, bursts, declared
    /// contexts, the number of channels and objects it would leave.
    pub(super) fn check_rules(&self, rules: &RuleSet) -> std::result::Result<(), String> {
        let l = &self.limits;
        let pending = rules.pending_contexts();
        if pending.len() > l.max_new_contexts {
            return Err(format!(
                "the batch declares {} new request contexts ({}), over this agent's max_new_contexts {}",
                pending.len(),
                pending.join(", "),
                l.max_new_contexts
            ));
        }
        // The batch's new contexts are reserved already: what is free now
        // is what would be left.
        if !pending.is_empty() && RequestContext::free_ids() < l.reserved_contexts {
            return Err(format!(
                "declaring {} would leave {} request context ids free, fewer than the {} this agent keeps for the application",
                pending.join(", "),
                RequestContext::free_ids(),
                l.reserved_contexts
            ));
        }
        let info = self.stage.stage_info();
        let mut channels = info.channels.len();
        let mut objects: usize = info.channels.iter().map(|c| c.objects.len()).sum();
        for e in &rules.rules {
            let at = |m: String| format!("{}: {m}", e.location);
            match &e.rule {
                Rule::CreateChannel { .. } => channels += 1,
                Rule::RemoveChannel { channel } => {
                    channels = channels.saturating_sub(1);
                    let n = info.channels.iter().find(|c| c.id == *channel).map_or(0, |c| c.objects.len());
                    objects = objects.saturating_sub(n);
                }
                Rule::CreateObject { channel, object, spec, .. } => {
                    objects += 1;
                    self.check_spec(&format!("{channel}/{object}"), spec).map_err(at)?;
                }
                Rule::RemoveObject { .. } => objects = objects.saturating_sub(1),
                Rule::Configure { channel, object, set, .. } => {
                    let current = self.stage.object(channel, object).and_then(|h| h.spec());
                    self.check_config(&format!("{channel}/{object}"), current.as_ref(), set).map_err(at)?;
                }
                _ => {}
            }
        }
        if channels > l.max_channels {
            return Err(format!(
                "the batch would leave {channels} channels, over this agent's max_channels {}",
                l.max_channels
            ));
        }
        if objects > l.max_objects {
            return Err(format!(
                "the batch would leave {objects} objects, over this agent's max_objects {}",
                l.max_objects
            ));
        }
        Ok(())
    }

    pub(super) fn check_rate(&self, what: &str, r: Rate) -> std::result::Result<(), String> {
        if r.is_unlimited() {
            return Ok(());
        }
        let (min, unit) = match r.unit() {
            RateUnit::Bytes => (self.limits.min_bytes_per_sec, "bytes/s"),
            RateUnit::Ops => (self.limits.min_ops_per_sec, "ops/s"),
        };
        if r.per_sec() < min {
            return Err(format!("{what}: {r} is below this agent's lowest rate, {min} {unit}"));
        }
        Ok(())
    }

    pub(super) fn check_burst(&self, what: &str, tokens: f64) -> std::result::Result<(), String> {
        if tokens.is_nan() || tokens > self.limits.max_burst {
            return Err(format!(
                "{what}: a burst of {tokens} tokens is over this agent's max_burst {}",
                self.limits.max_burst
            ));
        }
        Ok(())
    }

    /// A rate and the burst its refill period makes.
    pub(super) fn check_flow(
        &self,
        what: &str,
        rate: Option<Rate>,
        period: Option<Duration>,
    ) -> std::result::Result<(), String> {
        if let Some(r) = rate {
            self.check_rate(what, r)?;
            if let Some(p) = period
                && !r.is_unlimited()
            {
                self.check_burst(what, r.per_sec() * p.as_secs_f64())?;
            }
        }
        Ok(())
    }

    pub(super) fn check_spec(&self, label: &str, spec: &ObjectSpec) -> std::result::Result<(), String> {
        match spec {
            ObjectSpec::Drl(d) => {
                self.check_flow(&format!("{label} rate"), Some(d.rate), d.refill_period)?;
                if let Some(b) = d.burst {
                    self.check_burst(&format!("{label} burst"), b.get())?;
                }
                Ok(())
            }
            ObjectSpec::Qos(q) => {
                for (k, r) in q.limits.rates() {
                    self.check_flow(&format!("{label} {k}"), r, q.refill_period)?;
                }
                Ok(())
            }
            ObjectSpec::Noop | ObjectSpec::Batch(_) => Ok(()),
        }
    }

    /// A change to an object now configured as `current`.
    pub(super) fn check_config(
        &self,
        label: &str,
        current: Option<&ObjectSpec>,
        set: &ObjectChange,
    ) -> std::result::Result<(), String> {
        match current {
            Some(ObjectSpec::Drl(d)) => {
                let s: DrlSettings = set.parse("drl").map_err(|e| format!("{label}: {}: {}", e.field, e.message))?;
                let rate = s.rate.unwrap_or(d.rate);
                let period = s.refill_period.or(if s.rate.is_some() { d.refill_period } else { None });
                self.check_flow(&format!("{label} rate"), Some(rate), period)?;
                if let Some(b) = s.burst {
                    self.check_burst(&format!("{label} burst"), b.get())?;
                }
                Ok(())
            }
            Some(ObjectSpec::Qos(q)) => {
                let s: QosSpec = set.parse("qos").map_err(|e| format!("{label}: {}: {}", e.field, e.message))?;
                let period = s.refill_period.or(q.refill_period);
                for ((k, new), (_, old)) in s.limits.rates().into_iter().zip(q.limits.rates()) {
                    self.check_flow(&format!("{label} {k}"), new.or(old), period)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

pub(super) fn unix_ms() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis())
}
