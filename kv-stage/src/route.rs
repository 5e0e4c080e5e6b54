//! Compiled routing tables: from a request's classifiers to a target index in
//! a few array loads, with no hashing of strings and no lock.
//!
//! Each classifier dimension maps its value to a *slot*: slot 0 stands for
//! "a value no rule names", slots 1.. for each value some rule names. The table
//! is dense over the product of the slot counts, and every cell holds the
//! winning target, resolved once when rules change. Dimensions no rule pins
//! collapse to a single slot, so the usual table (rules on context and type
//! only) has a few dozen cells.

use crate::context::{Context, Reason, RequestContext, RequestType};
use crate::matching::{Classifier, FieldMatch, Match};

const NONE: u32 = u32::MAX;

/// Largest table we build; beyond it rules are rejected with a clear error.
pub(crate) const MAX_CELLS: usize = 1 << 20;
/// Most cells all of a stage's tables (the channel table and every
/// channel's object table) may have together: 4 Mi cells, 16 MiB. Without
/// it, many channels each just under [`MAX_CELLS`] would cost gigabytes.
pub(crate) const MAX_TOTAL_CELLS: usize = 1 << 22;

/// Open-addressing map from an integer classifier value to its slot.
#[derive(Debug, Clone, Default)]
struct IntSlots {
    keys: Box<[u64]>,
    slots: Box<[u32]>,
    mask: usize,
    shift: u32,
}

impl IntSlots {
    fn build(values: &[u64]) -> Self {
        if values.is_empty() {
            return IntSlots::default();
        }
        let cap = (values.len() * 2).next_power_of_two().max(4);
        let mut keys = vec![0u64; cap].into_boxed_slice();
        let mut slots = vec![0u32; cap].into_boxed_slice();
        let shift = 64 - cap.trailing_zeros();
        let mask = cap - 1;
        for (i, &k) in values.iter().enumerate() {
            let mut p = Self::hash(k, shift) & mask;
            while slots[p] != 0 {
                p = (p + 1) & mask;
            }
            keys[p] = k;
            slots[p] = i as u32 + 1;
        }
        IntSlots { keys, slots, mask, shift }
    }

    #[inline]
    fn hash(k: u64, shift: u32) -> usize {
        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
    }

    #[inline]
    fn slot(&self, k: u64) -> usize {
        if self.slots.is_empty() {
            return 0;
        }
        let mut p = Self::hash(k, self.shift) & self.mask;
        loop {
            let s = self.slots[p];
            if s == 0 {
                return 0;
            }
            if self.keys[p] == k {
                return s as usize;
            }
            p = (p + 1) & self.mask;
        }
    }
}

/// A compiled table from classifiers to a target index.
#[derive(Debug, Clone)]
pub(crate) struct RouteTable {
    type_slots: [u8; RequestType::COUNT],
    reason_slots: [u8; Reason::COUNT],
    ctx_slots: Box<[u16]>,
    instances: IntSlots,
    workflows: IntSlots,
    /// Strides of the workflow, instance, reason and context dimensions.
    stride_wf: usize,
    stride_inst: usize,
    stride_reason: usize,
    stride_ctx: usize,
    /// No rule pins a workflow or an instance: skip those lookups.
    plain: bool,
    cells: Box<[u32]>,
}

/// Why a set of routes could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RouteError {
    /// Routes `first` and `second` match the same requests with equal
    /// specificity and different targets; `example` describes such a request.
    Ambiguous { first: usize, second: usize, example: String },
    /// The table would need `cells` cells, more than `limit`: the smaller
    /// of [`MAX_CELLS`] and what [`MAX_TOTAL_CELLS`] leaves.
    TooLarge { cells: usize, limit: usize },
}

/// A route: pattern and target index.
pub(crate) struct RouteSpec<'a> {
    pub(crate) pattern: &'a Match,
    pub(crate) target: u32,
}

/// The values the routes name, and the members of the classes they name
/// (each member gets a slot of its own, so a rule on a member and one on
/// its class both apply).
fn mentioned<T: Classifier>(routes: &[RouteSpec<'_>], f: impl Fn(&Match) -> &FieldMatch<T>) -> Vec<T> {
    let mut v: Vec<T> = routes
        .iter()
        .flat_map(|r| f(r.pattern).values().iter().flat_map(|x| std::iter::once(*x).chain(x.members().iter().copied())))
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The value a slot stands for: `None` for slot 0 ("any other value").
fn rep<T: Copy>(values: &[T], slot: usize) -> Option<T> {
    if slot == 0 { None } else { Some(values[slot - 1]) }
}

fn accepts<T: Classifier>(m: &FieldMatch<T>, rep: Option<T>) -> bool {
    match rep {
        Some(v) => m.accepts(v),
        None => m.accepts_other(),
    }
}

impl RouteTable {
    /// Compiles routes; the most specific matching route wins in every cell.
    #[cfg(test)]
    pub(crate) fn compile(routes: &[RouteSpec<'_>]) -> Result<Self, RouteError> {
        let mut budget = MAX_TOTAL_CELLS;
        Self::compile_within(routes, &mut budget)
    }

    /// Compiles routes into at most `budget` cells (and [`MAX_CELLS`]),
    /// and takes the cells used from `budget`. The size is checked before
    /// anything is allocated.
    pub(crate) fn compile_within(routes: &[RouteSpec<'_>], budget: &mut usize) -> Result<Self, RouteError> {
        let types = mentioned(routes, |m| &m.request_type);
        let ctxs = mentioned(routes, |m| &m.context);
        let insts = mentioned(routes, |m| &m.instance);
        let wfs = mentioned(routes, |m| &m.workflow);
        let reasons = mentioned(routes, |m| &m.reason);

        let n_type = types.len() + 1;
        let n_ctx = ctxs.len() + 1;
        let n_reason = reasons.len() + 1;
        let n_inst = insts.len() + 1;
        let n_wf = wfs.len() + 1;
        let cells = n_type
            .checked_mul(n_ctx)
            .and_then(|x| x.checked_mul(n_reason))
            .and_then(|x| x.checked_mul(n_inst))
            .and_then(|x| x.checked_mul(n_wf))
            .unwrap_or(usize::MAX);
        let limit = MAX_CELLS.min(*budget);
        if cells > limit {
            return Err(RouteError::TooLarge { cells, limit });
        }
        *budget -= cells;

        let mut type_slots = [0u8; RequestType::COUNT];
        for (i, t) in types.iter().enumerate() {
            type_slots[t.index()] = i as u8 + 1;
        }
        let mut reason_slots = [0u8; Reason::COUNT];
        for (i, r) in reasons.iter().enumerate() {
            reason_slots[r.index()] = i as u8 + 1;
        }
        let ctx_len = ctxs.last().map_or(0, |c| c.index() + 1);
        let mut ctx_slots = vec![0u16; ctx_len];
        for (i, c) in ctxs.iter().enumerate() {
            ctx_slots[c.index()] = i as u16 + 1;
        }
        let instances = IntSlots::build(&insts.iter().map(|i| u64::from(i.0)).collect::<Vec<_>>());
        let workflows = IntSlots::build(&wfs.iter().map(|w| w.0).collect::<Vec<_>>());

        let specs: Vec<(u8, u8, u8)> = routes.iter().map(|r| r.pattern.specificity()).collect();
        let mut table = vec![NONE; cells];
        let mut idx = 0;
        for w in 0..n_wf {
            let wr = rep(&wfs, w);
            for i in 0..n_inst {
                let ir = rep(&insts, i);
                for rs in 0..n_reason {
                    let rr = rep(&reasons, rs);
                    for c in 0..n_ctx {
                        let cr = rep(&ctxs, c);
                        for t in 0..n_type {
                            let tr = rep(&types, t);
                            let mut best: Option<usize> = None;
                            let mut tie: Option<usize> = None;
                            for (k, r) in routes.iter().enumerate() {
                                let m = r.pattern;
                                if !(accepts(&m.workflow, wr)
                                    && accepts(&m.instance, ir)
                                    && accepts(&m.context, cr)
                                    && accepts(&m.request_type, tr)
                                    && accepts(&m.reason, rr))
                                {
                                    continue;
                                }
                                match best {
                                    None => best = Some(k),
                                    Some(b) if specs[k] > specs[b] => {
                                        best = Some(k);
                                        tie = None;
                                    }
                                    Some(b) if specs[k] == specs[b] && r.target != routes[b].target => {
                                        tie.get_or_insert(k);
                                    }
                                    Some(_) => {}
                                }
                            }
                            if let (Some(b), Some(k)) = (best, tie) {
                                return Err(RouteError::Ambiguous {
                                    first: b,
                                    second: k,
                                    example: describe(wr, ir, cr, tr, rr),
                                });
                            }
                            table[idx] = best.map_or(NONE, |b| routes[b].target);
                            idx += 1;
                        }
                    }
                }
            }
        }
        Ok(RouteTable {
            type_slots,
            reason_slots,
            ctx_slots: ctx_slots.into_boxed_slice(),
            instances,
            workflows,
            stride_wf: n_inst * n_reason * n_ctx * n_type,
            stride_inst: n_reason * n_ctx * n_type,
            stride_reason: n_ctx * n_type,
            stride_ctx: n_type,
            plain: n_inst == 1 && n_wf == 1,
            cells: table.into_boxed_slice(),
        })
    }

    /// The target for a request, if any route matches it.
    #[inline(always)]
    pub(crate) fn lookup(&self, ctx: &Context) -> Option<u32> {
        let t = self.type_slots[ctx.request_type.index()] as usize;
        let c = self.ctx_slots.get(ctx.context.index()).map_or(0, |&c| c as usize);
        let r = self.reason_slots[ctx.reason.index()] as usize;
        let mut idx = c * self.stride_ctx + t + r * self.stride_reason;
        if !self.plain {
            idx += self.instances.slot(u64::from(ctx.instance.0)) * self.stride_inst
                + self.workflows.slot(ctx.workflow.0) * self.stride_wf;
        }
        let v = self.cells[idx];
        if v == NONE { None } else { Some(v) }
    }

    /// Number of cells.
    #[cfg(test)]
    pub(crate) fn cells(&self) -> usize {
        self.cells.len()
    }
}

fn describe(
    w: Option<crate::context::WorkflowId>,
    i: Option<crate::context::InstanceId>,
    c: Option<RequestContext>,
    t: Option<RequestType>,
    r: Option<Reason>,
) -> String {
    fn part<T: std::fmt::Display>(name: &str, v: Option<T>) -> String {
        match v {
            Some(v) => format!("{name}={v}"),
            None => format!("{name}=<other>"),
        }
    }
    let mut s =
        format!("{{{}, {}, {}, {}", part("workflow", w), part("instance", i), part("context", c), part("type", t));
    if r.is_some() {
        s.push_str(&format!(", {}", part("reason", r)));
    }
    s.push('}');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::{InstanceId, WorkflowId};

    fn ctx(w: u64, t: RequestType, c: RequestContext) -> Context {
        Context::with(WorkflowId(w), t, c, InstanceId(0), 0)
    }

    #[test]
    fn empty_table_matches_nothing() {
        let t = RouteTable::compile(&[]).unwrap();
        assert_eq!(t.cells(), 1);
        assert_eq!(t.lookup(&ctx(1, RequestType::Read, RequestContext::FOREGROUND)), None);
    }

    #[test]
    fn most_specific_wins() {
        let flush = Match::context(RequestContext::BG_FLUSH);
        let flush_writes = Match::context(RequestContext::BG_FLUSH).and_type(RequestType::Write);
        let any = Match::any();
        let routes = [
            RouteSpec { pattern: &any, target: 0 },
            RouteSpec { pattern: &flush, target: 1 },
            RouteSpec { pattern: &flush_writes, target: 2 },
        ];
        let t = RouteTable::compile(&routes).unwrap();
        assert_eq!(t.lookup(&ctx(1, RequestType::Read, RequestContext::FOREGROUND)), Some(0));
        assert_eq!(t.lookup(&ctx(1, RequestType::Read, RequestContext::BG_FLUSH)), Some(1));
        assert_eq!(t.lookup(&ctx(1, RequestType::Write, RequestContext::BG_FLUSH)), Some(2));
    }

    #[test]
    fn workflows_use_the_hash_slots() {
        let pats: Vec<Match> = (0..100).map(|i| Match::workflow(WorkflowId(i * 7919))).collect();
        let routes: Vec<RouteSpec<'_>> =
            pats.iter().enumerate().map(|(i, p)| RouteSpec { pattern: p, target: i as u32 }).collect();
        let t = RouteTable::compile(&routes).unwrap();
        for i in 0..100u64 {
            assert_eq!(t.lookup(&ctx(i * 7919, RequestType::Read, RequestContext::FOREGROUND)), Some(i as u32));
        }
        assert_eq!(t.lookup(&ctx(5, RequestType::Read, RequestContext::FOREGROUND)), None);
    }

    #[test]
    fn overlapping_ties_are_ambiguous() {
        let a = Match::request_type(RequestType::Read);
        let b = Match::context(RequestContext::BG_FLUSH);
        // Same score, different classifiers: context beats type, no ambiguity.
        let routes = [RouteSpec { pattern: &a, target: 0 }, RouteSpec { pattern: &b, target: 1 }];
        let t = RouteTable::compile(&routes).unwrap();
        assert_eq!(t.lookup(&ctx(1, RequestType::Read, RequestContext::BG_FLUSH)), Some(1));
        // Same classifier, overlapping sets: ambiguous.
        let c = Match::contexts([RequestContext::BG_FLUSH, RequestContext::FOREGROUND]);
        let d = Match::contexts([RequestContext::BG_FLUSH, RequestContext::BACKGROUND]);
        let routes = [RouteSpec { pattern: &c, target: 0 }, RouteSpec { pattern: &d, target: 1 }];
        match RouteTable::compile(&routes) {
            Err(RouteError::Ambiguous { first: 0, second: 1, example }) => assert!(example.contains("bg_flush")),
            other => panic!("expected ambiguity, got {other:?}"),
        }
    }

    #[test]
    fn too_large_is_rejected() {
        let pats: Vec<Match> =
            (0..2000u64).map(|i| Match::workflow(WorkflowId(i)).and_instance(InstanceId(i as u16))).collect();
        let routes: Vec<RouteSpec<'_>> = pats.iter().map(|p| RouteSpec { pattern: p, target: 0 }).collect();
        assert!(matches!(RouteTable::compile(&routes), Err(RouteError::TooLarge { .. })));
    }
}
