//! Rules change while eight threads enforce: no request is lost, none is
//! enforced twice, and every counter adds up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kv_stage::{
    Context, DrlSpec, InstanceId, Match, ObjectChange, RequestContext as C, RequestType as T, Rule, Stage, WorkflowId,
    errors::Rejection,
    object::{Drl, EnforcementObject, Outcome},
    units::Rate,
};

/// Counts the requests it admits.
#[derive(Default)]
struct Counting(AtomicU64);

impl EnforcementObject for Counting {
    fn kind(&self) -> &'static str {
        "counting"
    }
    fn validate(&self, _: &ObjectChange) -> Result<(), kv_stage::FieldError> {
        Ok(())
    }
    fn configure(&self, _: &ObjectChange) {}
    fn enforce(&self, _: &Context) -> Result<Outcome, Rejection> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::IMMEDIATE)
    }
}

/// A real DRL that also counts the requests it admits (the stage drops a
/// removed object's counters from `collect`; this count outlives it).
struct CountingDrl {
    drl: Drl,
    admitted: AtomicU64,
}

impl EnforcementObject for CountingDrl {
    fn kind(&self) -> &'static str {
        "drl"
    }
    fn validate(&self, c: &ObjectChange) -> Result<(), kv_stage::FieldError> {
        self.drl.validate(c)
    }
    fn configure(&self, c: &ObjectChange) {
        self.drl.configure(c)
    }
    fn enforce(&self, ctx: &Context) -> Result<Outcome, Rejection> {
        let r = self.drl.enforce(ctx);
        if r.is_ok() {
            self.admitted.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn retire(&self) {
        self.drl.retire()
    }
    fn shutdown(&self) {
        self.drl.shutdown()
    }
}

const CONTEXTS: [C; 4] = [C::FOREGROUND, C::BG_FLUSH, C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN];

#[test]
fn rule_changes_under_load_lose_and_duplicate_nothing() {
    let stage = Arc::new(Stage::new("concurrency"));
    // Three channels that live for the whole test, each with a counting
    // default object that is never removed.
    let mut counters: Vec<Arc<Counting>> = Vec::new();
    for ch in ["a", "b", "c"] {
        stage.apply_rules([Rule::CreateChannel { channel: ch.into(), matches: None }]).unwrap();
        let c = Arc::new(Counting::default());
        stage.create_custom_object(ch, "base", c.clone(), None).unwrap();
        counters.push(c);
    }
    stage.apply_rules([Rule::SetDefaultChannel { channel: "a".into() }]).unwrap();
    // The default channel the stage started with never receives anything.

    let stop = Arc::new(AtomicBool::new(false));
    let issued = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let (stage, stop, issued) = (Arc::clone(&stage), Arc::clone(&stop), Arc::clone(&issued));
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ctx = Context::with(WorkflowId(t), T::Write, CONTEXTS[(n % 4) as usize], InstanceId(0), 100);
                    stage.enforce(&ctx).expect("no request fails while rules change");
                    n += 1;
                }
                issued.fetch_add(n, Ordering::Relaxed);
                n
            })
        })
        .collect();

    // Meanwhile: re-route contexts among channels, create and remove extra
    // counting objects and DRLs (real ones, counting what they admit), and
    // change DRL rates.
    let mut extra: Vec<Arc<Counting>> = Vec::new();
    let mut drls: Vec<Arc<CountingDrl>> = Vec::new();
    for round in 0..300u32 {
        let ch = ["a", "b", "c"][(round % 3) as usize];
        let ctx = CONTEXTS[(round % 4) as usize];
        stage.apply_rules([Rule::Route { channel: ch.into(), matches: Match::context(ctx) }]).unwrap();
        let c = Arc::new(Counting::default());
        let name = format!("x{round}");
        stage.create_custom_object(ch, &name, c.clone(), Some(Match::context(ctx).and_type(T::Write))).unwrap();
        extra.push(c);
        if round % 2 == 0 {
            let d = Arc::new(CountingDrl {
                drl: Drl::new(DrlSpec::new(Rate::from_bytes_per_sec(1e9).unwrap())).unwrap(),
                admitted: AtomicU64::new(0),
            });
            let name = format!("d{round}");
            let pattern = Match::context(ctx).and_type(T::Write).and_workflow(WorkflowId(u64::from(round % 8)));
            stage.create_custom_object(ch, &name, d.clone(), Some(pattern)).unwrap();
            stage
                .apply_rules([Rule::configure(ch, &name, ObjectChange::rate(Rate::from_bytes_per_sec(2e9).unwrap()))])
                .unwrap();
            drls.push(d);
        }
        if round >= 2 {
            let old_ch = ["a", "b", "c"][((round - 2) % 3) as usize];
            stage
                .apply_rules([Rule::RemoveObject { channel: old_ch.into(), object: format!("x{}", round - 2) }])
                .unwrap();
            if round % 2 == 0 {
                stage
                    .apply_rules([Rule::RemoveObject { channel: old_ch.into(), object: format!("d{}", round - 2) }])
                    .unwrap();
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    let per_thread: Vec<u64> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    let total = issued.load(Ordering::Relaxed);
    assert!(total > 10_000, "workers made too little progress: {total}");

    // Every request was enforced by exactly one counting object or one DRL.
    let counted: u64 = counters.iter().chain(extra.iter()).map(|c| c.0.load(Ordering::Relaxed)).sum();
    let drl_ops: u64 = drls.iter().map(|d| d.admitted.load(Ordering::Relaxed)).sum();
    assert!(drl_ops > 0, "no request went through a DRL");
    assert_eq!(counted + drl_ops, total, "a request was lost or enforced twice");
    let stats = stage.collect();
    let channel_ops: u64 = ["a", "b", "c"].iter().map(|c| stats.channel(c).unwrap().ops).sum();
    assert_eq!(channel_ops, total, "channel counters must count each request once");
    assert_eq!(stats.channel("default").unwrap().ops, 0);

    // Per-context and per-workflow counters agree with the issued counts.
    let ctx_ops: u64 = CONTEXTS.iter().map(|c| stats.context(*c).ops).sum();
    assert_eq!(ctx_ops, total);
    assert_eq!(stats.context(C::FOREGROUND).bytes, stats.context(C::FOREGROUND).ops * 100);
    for (t, n) in per_thread.iter().enumerate() {
        let w = stats.workflows.iter().find(|w| w.workflow == WorkflowId(t as u64)).expect("workflow tracked");
        assert_eq!(w.counter.ops, *n);
    }
}

#[test]
fn counting_objects_see_each_request_exactly_once() {
    // Without DRLs: every request lands on exactly one counting object.
    let stage = Arc::new(Stage::new("exactly-once"));
    let base = Arc::new(Counting::default());
    stage.apply_rules([Rule::CreateChannel { channel: "a".into(), matches: Some(Match::any()) }]).unwrap();
    stage.create_custom_object("a", "base", base.clone(), None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let (stage, stop) = (Arc::clone(&stage), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ctx = Context::with(WorkflowId(t), T::Read, CONTEXTS[(n % 4) as usize], InstanceId(0), 1);
                    stage.enforce(&ctx).unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut extra = Vec::new();
    for round in 0..200u32 {
        let c = Arc::new(Counting::default());
        let ctx = CONTEXTS[(round % 4) as usize];
        stage.create_custom_object("a", &format!("x{round}"), c.clone(), Some(Match::context(ctx))).unwrap();
        extra.push(c);
        if round >= 1 {
            stage.apply_rules([Rule::RemoveObject { channel: "a".into(), object: format!("x{}", round - 1) }]).unwrap();
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, Ordering::Relaxed);
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let counted: u64 = std::iter::once(&base).chain(extra.iter()).map(|c| c.0.load(Ordering::Relaxed)).sum();
    assert_eq!(counted, total);
    assert_eq!(stage.collect().channel("a").unwrap().ops, total);
}
