//! An agent's registration: one key per stage, bound to an etcd lease the
//! registration keeps alive; registered again (on a new lease) when etcd
//! comes back after an outage or the lease was lost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{EtcdConfig, Registered, Worker, keep_alive_once, runtime};
use crate::error::{Error, Result};

/// Keeps stages registered in etcd while it lives; dropping it (or
/// [`stop`](Self::stop)) revokes the lease, so the keys vanish at once. A
/// process that dies without dropping it loses them within the TTL.
pub struct Registration {
    state: Arc<State>,
    worker: Worker,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("registered", &self.is_registered())
            .field("registrations", &self.registrations())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    registered: AtomicBool,
    registrations: AtomicU64,
}

impl Registration {
    /// Registers `records` (one key each) and keeps them registered, on a
    /// thread of its own. etcd need not be up: the registration is made
    /// when it answers.
    pub fn start(cfg: EtcdConfig, records: Vec<Registered>) -> Result<Registration> {
        cfg.validate()?;
        for r in &records {
            if r.stage.is_empty() || r.stage.contains('/') {
                return Err(Error::Etcd {
                    key: cfg.stage_key(&r.stage),
                    message: format!("stage name '{}' cannot be a key (empty, or with '/')", r.stage),
                });
            }
        }
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        let rt = runtime()?;
        let worker = Worker::spawn("kvsds-etcd-register", "etcd registration".into(), move |stop| {
            let r = rt.block_on(register_once(&cfg, &records, &st, stop));
            if r.is_err() {
                st.registered.store(false, Ordering::Release);
            }
            r
        })?;
        Ok(Registration { state, worker })
    }

    /// Whether the keys are registered now (as far as this process knows).
    pub fn is_registered(&self) -> bool {
        self.state.registered.load(Ordering::Acquire)
    }

    /// Times the keys were registered (1, plus one per outage survived).
    pub fn registrations(&self) -> u64 {
        self.state.registrations.load(Ordering::Relaxed)
    }

    /// Revokes the lease (the keys vanish) and stops (as dropping it
    /// does).
    pub fn stop(mut self) {
        self.worker.stop();
    }
}

/// One registration: a lease, the keys on it, keep-alives every third of
/// the TTL until an error (returned) or `stop` (the lease is revoked).
async fn register_once(cfg: &EtcdConfig, records: &[Registered], st: &State, stop: &AtomicBool) -> Result<()> {
    use etcd_client::PutOptions;
    let mut client = cfg.connect().await?;
    let lease = cfg.call("lease grant", client.lease_grant(cfg.ttl_secs(), None)).await?.id();
    for r in records {
        let value = serde_json::to_vec(r).map_err(|e| cfg.error(e.to_string()))?;
        cfg.call("put", client.put(cfg.stage_key(&r.stage), value, Some(PutOptions::new().with_lease(lease)))).await?;
    }
    let (mut keeper, mut answers) = cfg.call("lease keep-alive", client.lease_keep_alive(lease)).await?;
    st.registered.store(true, Ordering::Release);
    let n = st.registrations.fetch_add(1, Ordering::Relaxed) + 1;
    tracing::info!(
        stages = records.len(),
        lease,
        ttl_s = cfg.ttl_secs(),
        registrations = n,
        "registered in etcd under {}",
        cfg.stages_prefix()
    );
    let every = Duration::from_millis(u64::try_from(cfg.ttl_secs()).unwrap_or(1) * 1000 / 3);
    loop {
        let end = tokio::time::Instant::now() + every;
        while tokio::time::Instant::now() < end {
            if stop.load(Ordering::Relaxed) {
                let _ = cfg.call("lease revoke", client.lease_revoke(lease)).await;
                tracing::info!(lease, "deregistered from etcd");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !keep_alive_once(cfg, &mut keeper, &mut answers).await? {
            return Err(cfg.error(format!("lease {lease} expired")));
        }
    }
}
