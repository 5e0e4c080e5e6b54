//! Routing picks the most specific rule: a property test against a
//! reference implementation (a linear scan over the rules), with context
//! classes and their members, and compaction reasons.

use kv_stage::{
    Context, InstanceId, Match, Reason, RequestContext as C, RequestType as T, Rule, Stage, WorkflowId,
    rule::{Classifier, FieldMatch},
};
use proptest::prelude::*;

const WORKFLOWS: [u64; 4] = [1, 2, 3, 99];
const INSTANCES: [u16; 3] = [0, 1, 7];
const CONTEXTS: [C; 8] = [
    C::FOREGROUND,
    C::BG_FLUSH,
    C::BG_COMPACTION_L0_L1,
    C::BG_COMPACTION_L0_L0,
    C::BG_COMPACTION_LN,
    C::BG_COMPACTION_L1_L2,
    C::BG_COMPACTION_L2_L3,
    C::BACKGROUND,
];
const TYPES: [T; 4] = [T::Read, T::Write, T::Sync, T::Put];
static REASONS: [Reason; 4] = [Reason::Manual, Reason::Ttl, Reason::None, Reason::LevelSize];

/// A field pattern over the first `n - 1` values of a domain (the last value
/// is never named, so it stands for "a value no rule names").
fn field<V: Classifier + std::fmt::Debug>(domain: &'static [V]) -> impl Strategy<Value = FieldMatch<V>> {
    let named = &domain[..domain.len() - 1];
    prop_oneof![
        2 => Just(FieldMatch::Any),
        2 => proptest::sample::select(named).prop_map(FieldMatch::one),
        1 => proptest::sample::subsequence(named, 1..=named.len()).prop_map(FieldMatch::set),
    ]
}

fn pattern() -> impl Strategy<Value = Match> {
    (field(&WF_IDS), field(&INST_IDS), field(&CONTEXTS), field(&TYPES), field(&REASONS)).prop_map(
        |(workflow, instance, context, request_type, reason)| Match {
            workflow,
            instance,
            context,
            request_type,
            reason,
        },
    )
}

static WF_IDS: [WorkflowId; 4] =
    [WorkflowId(WORKFLOWS[0]), WorkflowId(WORKFLOWS[1]), WorkflowId(WORKFLOWS[2]), WorkflowId(WORKFLOWS[3])];
static INST_IDS: [InstanceId; 3] = [InstanceId(INSTANCES[0]), InstanceId(INSTANCES[1]), InstanceId(INSTANCES[2])];

fn all_requests() -> Vec<Context> {
    let mut v = Vec::new();
    for w in WORKFLOWS {
        for i in INSTANCES {
            for c in CONTEXTS {
                for t in TYPES {
                    for r in REASONS {
                        v.push(Context::with(WorkflowId(w), t, c, InstanceId(i), 0).with_reason(r));
                    }
                }
            }
        }
    }
    v
}

/// Reference: the matching rules with the highest specificity; `Err` when
/// two of them lead to different channels.
fn reference(rules: &[(Match, usize)], ctx: &Context) -> Result<Option<usize>, ()> {
    let best = rules.iter().filter(|(m, _)| m.matches(ctx)).map(|(m, _)| m.specificity()).max();
    let Some(best) = best else { return Ok(None) };
    let mut targets: Vec<usize> =
        rules.iter().filter(|(m, _)| m.matches(ctx) && m.specificity() == best).map(|(_, t)| *t).collect();
    targets.dedup();
    if targets.len() > 1 { Err(()) } else { Ok(Some(targets[0])) }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn routing_picks_the_most_specific_rule(patterns in proptest::collection::vec(pattern(), 1..8)) {
        // Distinct patterns, one channel each.
        let mut rules: Vec<(Match, usize)> = Vec::new();
        for p in patterns {
            if !rules.iter().any(|(m, _)| *m == p) {
                let n = rules.len();
                rules.push((p, n));
            }
        }
        let stage = Stage::new("routing");
        let mut batch = Vec::new();
        for (m, i) in &rules {
            batch.push(Rule::CreateChannel { channel: format!("c{i}"), matches: Some(m.clone()) });
        }
        let applied = stage.apply_rules(batch);
        let requests = all_requests();
        let expected: Vec<Result<Option<usize>, ()>> = requests.iter().map(|r| reference(&rules, r)).collect();
        let ambiguous = expected.iter().any(Result::is_err);
        match applied {
            Err(e) => {
                prop_assert!(ambiguous, "stage rejected unambiguous rules: {e}");
                prop_assert!(e.to_string().contains("equal specificity"), "{e}");
                // Nothing was applied.
                prop_assert_eq!(stage.stage_info().channels.len(), 1);
            }
            Ok(_) => {
                prop_assert!(!ambiguous, "stage accepted ambiguous rules {:?}", rules);
                for (req, exp) in requests.iter().zip(expected) {
                    let (channel, _) = stage.select(req);
                    let want = match exp.unwrap() {
                        Some(i) => format!("c{i}"),
                        None => "default".to_owned(),
                    };
                    prop_assert_eq!(&*channel, want.as_str(), "request {:?}", req);
                }
            }
        }
    }
}
