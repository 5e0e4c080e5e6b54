//! A stage's lease, as a state machine over explicit times: what a change
//! under a lease, a renewal, the deadline passing and a fallback that
//! fails or succeeds do to it. The agent holds one per stage under a mutex
//! and reads the clock; the tests here drive it on a clock of their own.

use std::time::{Duration, Instant};

use kv_stage::info::Checkpoint;

/// How long a fallback that failed waits before it is tried again.
pub(crate) const FALLBACK_RETRY: Duration = Duration::from_secs(1);

/// The lease: when it ends, and what to restore then.
#[derive(Debug, Default)]
pub(crate) struct Lease {
    deadline: Option<Instant>,
    /// The stage as it was when the lease was taken.
    checkpoint: Option<Checkpoint>,
    /// The lease ran out and its fallback failed: `deadline` is the next
    /// try, and collects do not renew it.
    retrying: bool,
}

impl Lease {
    /// When it ends (or its fallback is tried again); `None`: no lease.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// What is left of it at `now` (zero when none is held).
    pub(crate) fn remaining(&self, now: Instant) -> Duration {
        self.deadline.map_or(Duration::ZERO, |d| d.saturating_duration_since(now))
    }

    /// A fallback failed before: this is a retry.
    pub(crate) fn is_retrying(&self) -> bool {
        self.retrying
    }

    /// The stage before the lease, to restore when it runs out.
    pub(crate) fn checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoint.as_ref()
    }

    /// Whether a change that takes a lease must checkpoint the stage first:
    /// only when none is held (the first change of a lease saves the stage
    /// as it was before any of them).
    pub(crate) fn needs_checkpoint(&self) -> bool {
        self.checkpoint.is_none()
    }

    /// A collect renews a lease that is held to `now + length` (not one
    /// whose fallback is being retried). True when the new deadline is
    /// earlier than the old one (whoever sleeps until it must wake).
    pub(crate) fn renew(&mut self, now: Instant, length: Duration) -> bool {
        match self.deadline {
            Some(old) if !self.retrying => {
                let new = now + length;
                self.deadline = Some(new);
                new < old
            }
            _ => false,
        }
    }

    /// A change succeeded under a lease of `length`: the lease runs to
    /// `now + length`, keeping the checkpoint it has (else `taken`, the
    /// stage before this change), and a retry ends.
    pub(crate) fn take(&mut self, now: Instant, length: Duration, taken: Option<Checkpoint>) {
        self.checkpoint = self.checkpoint.take().or(taken);
        self.deadline = Some(now + length);
        self.retrying = false;
    }

    /// Whether the lease ran out by `now` (its fallback is due).
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| d <= now)
    }

    /// The fallback succeeded: no lease, nothing to restore.
    pub(crate) fn fell_back(&mut self) {
        *self = Lease::default();
    }

    /// The fallback failed at `now`: it is tried again
    /// [`FALLBACK_RETRY`] later, and collects do not renew the lease.
    pub(crate) fn fallback_failed(&mut self, now: Instant) {
        self.deadline = Some(now + FALLBACK_RETRY);
        self.retrying = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_lease_runs_out_unless_renewed() {
        let t0 = Instant::now();
        let mut l = Lease::default();
        assert!(!l.is_due(t0 + 1000 * MS), "no lease, nothing due");
        assert!(!l.renew(t0, 500 * MS), "a collect takes no lease");
        assert_eq!(l.deadline(), None);
        l.take(t0, 500 * MS, None);
        assert!(!l.is_due(t0 + 499 * MS));
        assert!(l.is_due(t0 + 500 * MS));
        // Renewed at 400 ms: due at 900, not 500.
        assert!(!l.renew(t0 + 400 * MS, 500 * MS), "a later deadline wakes nobody");
        assert!(!l.is_due(t0 + 899 * MS));
        assert!(l.is_due(t0 + 900 * MS));
        assert_eq!(l.remaining(t0 + 600 * MS), 300 * MS);
        // A shorter renewal moves the deadline earlier and says so.
        assert!(l.renew(t0 + 600 * MS, 100 * MS));
        assert!(l.is_due(t0 + 700 * MS));
    }

    #[test]
    fn the_first_checkpoint_is_kept_until_the_fallback() {
        let stage = kv_stage::Stage::new("lease");
        let before = stage.checkpoint();
        let mut l = Lease::default();
        assert!(l.needs_checkpoint());
        let t0 = Instant::now();
        l.take(t0, 500 * MS, Some(before));
        let generation = l.checkpoint().map(|c| c.generation());
        assert!(!l.needs_checkpoint());
        // A later change under the lease keeps the stage from before the first.
        l.take(t0 + 100 * MS, 500 * MS, Some(stage.checkpoint()));
        assert_eq!(l.checkpoint().map(|c| c.generation()), generation);
        l.fell_back();
        assert!(l.needs_checkpoint() && l.deadline().is_none() && !l.is_retrying());
    }

    #[test]
    fn a_failed_fallback_is_tried_again_and_collects_do_not_renew_it() {
        let t0 = Instant::now();
        let mut l = Lease::default();
        l.take(t0, 500 * MS, None);
        assert!(l.is_due(t0 + 500 * MS));
        l.fallback_failed(t0 + 500 * MS);
        assert!(l.is_retrying());
        assert_eq!(l.deadline(), Some(t0 + 500 * MS + FALLBACK_RETRY));
        // A controller that still collects does not push the retry away.
        assert!(!l.renew(t0 + 600 * MS, 500 * MS));
        assert_eq!(l.deadline(), Some(t0 + 500 * MS + FALLBACK_RETRY));
        assert!(l.is_due(t0 + 500 * MS + FALLBACK_RETRY));
        // A change that takes the lease again ends the retrying.
        l.take(t0 + 700 * MS, 500 * MS, None);
        assert!(!l.is_retrying());
        assert!(!l.is_due(t0 + 1199 * MS));
        assert!(l.renew(t0 + 800 * MS, 100 * MS));
    }
}
