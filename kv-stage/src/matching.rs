//! Differentiation patterns: which requests a rule applies to.
//!
//! A [`Match`] pins any of the five classifiers (workflow, instance, request
//! context, request type, compaction reason) to one value or a set of
//! values; an unpinned classifier is a wildcard. When several rules match a
//! request, the **most specific** wins: pinning a classifier to one value
//! scores 2, to a set of several values 1, a wildcard 0; the highest total
//! wins, and equal totals are decided in the order workflow, instance,
//! context, type, reason (the rule that pins the earlier classifier wins).
//! Two overlapping rules that still tie are ambiguous and rejected when the
//! rules are applied.
//!
//! Two request contexts are **classes** (see [`RequestContext::covers`]):
//! `bg_compaction_L0_L1` covers `bg_compaction_L0_L0`, and
//! `bg_compaction_LN` covers `bg_compaction_L1_L2` ... `bg_compaction_L9_L10`.
//! A rule naming a class matches its members; it scores as one value, and
//! between two rules that tie otherwise, the one that names a member beats
//! the one that names its class (the member is more specific).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, IntoDeserializer, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Serialize, Serializer};

use crate::context::{Context, InstanceId, Reason, RequestContext, RequestType, WorkflowId};

/// A classifier's value type. Only request contexts have classes: a
/// pattern value may stand for several request values.
pub trait Classifier: Ord + Copy + 'static {
    /// Whether the pattern value `pattern` matches the request value `self`.
    #[inline]
    fn within(self, pattern: Self) -> bool {
        self == pattern
    }

    /// Whether this value, in a pattern, stands for a class.
    #[inline]
    fn is_class(self) -> bool {
        false
    }

    /// The request values a class value stands for besides itself.
    fn members(self) -> &'static [Self] {
        &[]
    }
}

impl Classifier for WorkflowId {}
impl Classifier for InstanceId {}
impl Classifier for RequestType {}
impl Classifier for Reason {}

impl Classifier for RequestContext {
    #[inline]
    fn within(self, pattern: Self) -> bool {
        pattern.covers(self)
    }

    fn is_class(self) -> bool {
        RequestContext::is_class(self)
    }

    fn members(self) -> &'static [Self] {
        RequestContext::members(self)
    }
}

/// One classifier's pattern: any value, or one of a sorted, non-empty set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum FieldMatch<T> {
    /// Wildcard.
    #[default]
    Any,
    /// One of these values (sorted, deduplicated, never empty).
    OneOf(Vec<T>),
}

impl<T: Classifier> FieldMatch<T> {
    /// Pins the classifier to one value.
    pub fn one(v: T) -> Self {
        FieldMatch::OneOf(vec![v])
    }

    /// Pins the classifier to a set of values. An empty set is a wildcard.
    pub fn set(values: impl IntoIterator<Item = T>) -> Self {
        let mut v: Vec<T> = values.into_iter().collect();
        v.sort();
        v.dedup();
        if v.is_empty() { FieldMatch::Any } else { FieldMatch::OneOf(v) }
    }

    /// True for the wildcard.
    pub fn is_any(&self) -> bool {
        matches!(self, FieldMatch::Any)
    }

    /// Whether `v` is matched (directly, or as a member of a class the
    /// pattern names).
    #[inline]
    pub fn accepts(&self, v: T) -> bool {
        match self {
            FieldMatch::Any => true,
            FieldMatch::OneOf(vs) => vs.binary_search(&v).is_ok() || vs.iter().any(|p| v.within(*p)),
        }
    }

    /// Whether the pattern pins one value that is a class.
    fn names_class(&self) -> bool {
        matches!(self, FieldMatch::OneOf(v) if v.len() == 1 && v[0].is_class())
    }

    /// Whether a value that is *not* in `mentioned` could be matched, i.e.
    /// whether this pattern accepts "any other value".
    pub(crate) fn accepts_other(&self) -> bool {
        self.is_any()
    }

    /// The pinned values (empty for the wildcard).
    pub fn values(&self) -> &[T] {
        match self {
            FieldMatch::Any => &[],
            FieldMatch::OneOf(v) => v,
        }
    }

    fn score(&self) -> u8 {
        match self {
            FieldMatch::Any => 0,
            FieldMatch::OneOf(v) if v.len() == 1 => 2,
            FieldMatch::OneOf(_) => 1,
        }
    }

    /// Intersection of two patterns (`None` when it is empty). A class and
    /// one of its members intersect in the member.
    pub fn intersect(&self, other: &Self) -> Option<Self> {
        match (self, other) {
            (FieldMatch::Any, x) | (x, FieldMatch::Any) => Some(x.clone()),
            (FieldMatch::OneOf(a), FieldMatch::OneOf(b)) => {
                let mut v: Vec<T> = a.iter().copied().filter(|x| other.accepts(*x)).collect();
                v.extend(b.iter().copied().filter(|x| self.accepts(*x)));
                v.sort();
                v.dedup();
                (!v.is_empty()).then_some(FieldMatch::OneOf(v))
            }
        }
    }
}

impl<T: Serialize> Serialize for FieldMatch<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FieldMatch::Any => s.serialize_str("*"),
            FieldMatch::OneOf(v) if v.len() == 1 => v[0].serialize(s),
            FieldMatch::OneOf(v) => {
                let mut seq = s.serialize_seq(Some(v.len()))?;
                for x in v {
                    seq.serialize_element(x)?;
                }
                seq.end()
            }
        }
    }
}

impl<'de, T: Deserialize<'de> + Classifier> Deserialize<'de> for FieldMatch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Classifier> Visitor<'de> for V<T> {
            type Value = FieldMatch<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a value, a list of values, or \"*\"")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                if v == "*" || v.eq_ignore_ascii_case("any") {
                    return Ok(FieldMatch::Any);
                }
                T::deserialize(v.into_deserializer()).map(FieldMatch::one)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                T::deserialize(v.into_deserializer()).map(FieldMatch::one)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                if v < 0 {
                    return Err(E::custom(format!("{v} is negative")));
                }
                T::deserialize((v as u64).into_deserializer()).map(FieldMatch::one)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = seq.next_element::<T>()? {
                    v.push(x);
                }
                if v.is_empty() {
                    return Err(de::Error::custom("an empty list matches nothing; omit the field to match any value"));
                }
                Ok(FieldMatch::set(v))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A differentiation pattern over the five classifiers. The default matches
/// every request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// Workflow ids (thread ids unless the application sets its own).
    #[serde(default, skip_serializing_if = "FieldMatch::is_any")]
    pub workflow: FieldMatch<WorkflowId>,
    /// Instance ids (DB, volume or tenant store).
    #[serde(default, skip_serializing_if = "FieldMatch::is_any")]
    pub instance: FieldMatch<InstanceId>,
    /// Request contexts.
    #[serde(default, skip_serializing_if = "FieldMatch::is_any")]
    pub context: FieldMatch<RequestContext>,
    /// Request types.
    #[serde(default, rename = "type", skip_serializing_if = "FieldMatch::is_any")]
    pub request_type: FieldMatch<RequestType>,
    /// Compaction reasons (RocksDB's `CompactionReason`, see [`Reason`]).
    #[serde(default, skip_serializing_if = "FieldMatch::is_any")]
    pub reason: FieldMatch<Reason>,
}

impl Match {
    /// Matches every request.
    pub fn any() -> Self {
        Match::default()
    }

    /// Matches one request context.
    pub fn context(c: RequestContext) -> Self {
        Match { context: FieldMatch::one(c), ..Match::default() }
    }

    /// Matches any of several request contexts.
    pub fn contexts(cs: impl IntoIterator<Item = RequestContext>) -> Self {
        Match { context: FieldMatch::set(cs), ..Match::default() }
    }

    /// Matches one workflow.
    pub fn workflow(w: WorkflowId) -> Self {
        Match { workflow: FieldMatch::one(w), ..Match::default() }
    }

    /// Matches one instance.
    pub fn instance(i: InstanceId) -> Self {
        Match { instance: FieldMatch::one(i), ..Match::default() }
    }

    /// Matches one request type.
    pub fn request_type(t: RequestType) -> Self {
        Match { request_type: FieldMatch::one(t), ..Match::default() }
    }

    /// Matches one compaction reason.
    pub fn reason(r: Reason) -> Self {
        Match { reason: FieldMatch::one(r), ..Match::default() }
    }

    /// Also pins the compaction reason.
    pub fn and_reason(mut self, r: Reason) -> Self {
        self.reason = FieldMatch::one(r);
        self
    }

    /// Also pins the request type.
    pub fn and_type(mut self, t: RequestType) -> Self {
        self.request_type = FieldMatch::one(t);
        self
    }

    /// Also pins the request types to a set.
    pub fn and_types(mut self, ts: impl IntoIterator<Item = RequestType>) -> Self {
        self.request_type = FieldMatch::set(ts);
        self
    }

    /// Also pins the instance.
    pub fn and_instance(mut self, i: InstanceId) -> Self {
        self.instance = FieldMatch::one(i);
        self
    }

    /// Also pins the request context.
    pub fn and_context(mut self, c: RequestContext) -> Self {
        self.context = FieldMatch::one(c);
        self
    }

    /// Also pins the workflow.
    pub fn and_workflow(mut self, w: WorkflowId) -> Self {
        self.workflow = FieldMatch::one(w);
        self
    }

    /// Whether the pattern matches a request.
    pub fn matches(&self, ctx: &Context) -> bool {
        self.workflow.accepts(ctx.workflow)
            && self.instance.accepts(ctx.instance)
            && self.context.accepts(ctx.context)
            && self.request_type.accepts(ctx.request_type)
            && self.reason.accepts(ctx.reason)
    }

    /// True when the pattern matches every request.
    pub fn is_any(&self) -> bool {
        self.workflow.is_any()
            && self.instance.is_any()
            && self.context.is_any()
            && self.request_type.is_any()
            && self.reason.is_any()
    }

    /// Specificity: higher wins. `(score, pinned-classifier mask, names a
    /// context that is not a class)` compared lexicographically; see the
    /// module documentation.
    pub fn specificity(&self) -> (u8, u8, u8) {
        let score = self.workflow.score()
            + self.instance.score()
            + self.context.score()
            + self.request_type.score()
            + self.reason.score();
        let mask = (u8::from(!self.workflow.is_any()) << 4)
            | (u8::from(!self.instance.is_any()) << 3)
            | (u8::from(!self.context.is_any()) << 2)
            | (u8::from(!self.request_type.is_any()) << 1)
            | u8::from(!self.reason.is_any());
        (score, mask, u8::from(!self.context.names_class()))
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_any() {
            return f.write_str("{*}");
        }
        let mut parts = Vec::new();
        fn list<T: fmt::Display>(v: &[T]) -> String {
            if v.len() == 1 {
                v[0].to_string()
            } else {
                format!("[{}]", v.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            }
        }
        if !self.workflow.is_any() {
            parts.push(format!("workflow={}", list(self.workflow.values())));
        }
        if !self.instance.is_any() {
            parts.push(format!("instance={}", list(self.instance.values())));
        }
        if !self.context.is_any() {
            parts.push(format!("context={}", list(self.context.values())));
        }
        if !self.request_type.is_any() {
            parts.push(format!("type={}", list(self.request_type.values())));
        }
        if !self.reason.is_any() {
            parts.push(format!("reason={}", list(self.reason.values())));
        }
        write!(f, "{{{}}}", parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specificity_orders_exact_over_sets_over_any() {
        let exact = Match::context(RequestContext::BG_FLUSH);
        let set = Match::contexts([RequestContext::BG_FLUSH, RequestContext::BG_COMPACTION_L0_L1]);
        assert!(exact.specificity() > set.specificity());
        assert!(set.specificity() > Match::any().specificity());
        // Ties on score are broken by classifier order: workflow first.
        let wf = Match::workflow(WorkflowId(7));
        let ctx = Match::context(RequestContext::BG_FLUSH);
        assert_eq!(wf.specificity().0, ctx.specificity().0);
        assert!(wf.specificity() > ctx.specificity());
    }

    #[test]
    fn serde_forms() {
        let m: Match = toml::from_str(
            r#"context = "bg_flush"
type = ["read", "write"]
workflow = 12"#,
        )
        .unwrap();
        assert_eq!(m.context, FieldMatch::one(RequestContext::BG_FLUSH));
        assert_eq!(m.request_type, FieldMatch::set([RequestType::Write, RequestType::Read]));
        assert_eq!(m.workflow, FieldMatch::one(WorkflowId(12)));
        let any: Match = toml::from_str(r#"context = "*""#).unwrap();
        assert!(any.is_any());
        assert!(toml::from_str::<Match>(r#"contxt = "bg_flush""#).is_err());
        assert!(toml::from_str::<Match>(r#"context = []"#).is_err());
        assert!(toml::from_str::<Match>(r#"context = "no_such_ctx""#).is_err());
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(serde_json::from_str::<Match>(&json).unwrap(), m);
    }

    #[test]
    fn intersect() {
        let i = InstanceId;
        let a = FieldMatch::set([i(1), i(2), i(3)]);
        let b = FieldMatch::set([i(2), i(3), i(4)]);
        assert_eq!(a.intersect(&b), Some(FieldMatch::set([i(2), i(3)])));
        assert_eq!(a.intersect(&FieldMatch::one(i(9))), None);
        assert_eq!(FieldMatch::Any.intersect(&a), Some(a.clone()));
        // A class and its member meet in the member.
        let ln = FieldMatch::set([RequestContext::BG_COMPACTION_LN, RequestContext::BG_FLUSH]);
        let l2 = FieldMatch::one(RequestContext::BG_COMPACTION_L2_L3);
        assert_eq!(ln.intersect(&l2), Some(l2.clone()));
        assert_eq!(l2.intersect(&ln), Some(l2.clone()));
        assert_eq!(l2.intersect(&FieldMatch::one(RequestContext::BG_COMPACTION_L0_L1)), None);
    }

    #[test]
    fn classes_match_their_members_and_lose_to_them() {
        let ln = Match::context(RequestContext::BG_COMPACTION_LN);
        let l2 = Match::context(RequestContext::BG_COMPACTION_L2_L3);
        let l0 = Match::context(RequestContext::BG_COMPACTION_L0_L1);
        let req = |c| Context::with(WorkflowId(1), RequestType::Write, c, InstanceId(0), 1);
        assert!(ln.matches(&req(RequestContext::BG_COMPACTION_L2_L3)));
        assert!(ln.matches(&req(RequestContext::BG_COMPACTION_LN)));
        assert!(!ln.matches(&req(RequestContext::BG_COMPACTION_L0_L0)));
        assert!(l0.matches(&req(RequestContext::BG_COMPACTION_L0_L0)));
        assert!(!l2.matches(&req(RequestContext::BG_COMPACTION_L1_L2)));
        assert!(l2.specificity() > ln.specificity());
        // A class counts as one value against other classifiers.
        let write = Match::request_type(RequestType::Write);
        assert_eq!(ln.specificity().0, write.specificity().0);
        assert!(ln.specificity() > write.specificity());
        assert!(Match::reason(Reason::Ttl).specificity() < write.specificity());
    }
}
