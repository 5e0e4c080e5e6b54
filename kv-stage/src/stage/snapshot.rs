//! The compiled snapshot the data path reads: channels and objects in
//! arrays, routing tables, and [`Layout::resolve`], the one place that says
//! where a request goes (channel lookup or the default channel, then object
//! lookup or the channel's default object). Published with `arc-swap` and
//! remembered per thread.

use std::cell::Cell;
use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::objects::Object;
use crate::route::{RouteError, RouteSpec, RouteTable};

use super::model::{Model, RouteModel};

pub(super) struct ObjectRt {
    pub(super) id: Arc<str>,
    pub(super) label: Arc<str>,
    pub(super) slot: u32,
    pub(super) object: Arc<Object>,
}

pub(super) struct ChannelRt {
    pub(super) label: Arc<str>,
    pub(super) slot: u32,
    pub(super) objects: Box<[ObjectRt]>,
    pub(super) routes: RouteTable,
    pub(super) default_object: Option<u32>,
}

/// An immutable snapshot of the stage's channels and tables.
pub(super) struct Layout {
    pub(super) channels: Box<[ChannelRt]>,
    pub(super) routes: RouteTable,
    pub(super) default_channel: u32,
}

/// What a thread remembers of the stage it used last: the layout, tagged
/// with the stage and layout generation, and the route of the last request
/// classified (its classifiers and where they led).
///
/// Checking the stage's generation (a plain load of a line that changes only
/// when rules do) against the tag costs a few nanoseconds, where loading from
/// the `ArcSwap` costs atomic read-modify-writes on shared lines. A thread
/// mostly repeats the same kind of request (a client thread appending to the
/// WAL, a flush thread writing one table), so the remembered route usually
/// applies and the tables are not consulted at all; when it leads to a Noop
/// or to a channel without objects, the layout is not touched either. The
/// layout is taken out of its cell while in use and put back after, so a
/// nested `enforce` on the same thread (an object doing staged I/O) finds
/// the cell empty and loads its own. One entry per thread: a thread that
/// alternates between stages takes the slower path on every switch.
pub(super) struct ThreadCache {
    pub(super) stage_uid: Cell<u64>,
    pub(super) generation: Cell<u64>,
    pub(super) layout: Cell<Option<Arc<Layout>>>,
    /// `route_key` of the remembered request; 0 when there is none.
    pub(super) memo_key: Cell<u64>,
    pub(super) memo_workflow: Cell<u64>,
    pub(super) memo: Cell<Route>,
}

/// Where a request goes, with the counter slots to charge.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Route {
    pub(super) channel: u32,
    /// Object index in the channel, or `NO_OBJECT`.
    pub(super) object: u32,
    pub(super) channel_slot: u32,
    pub(super) object_slot: u32,
    /// The object must be called (anything but a Noop).
    pub(super) call: bool,
}

pub(super) const NO_OBJECT: u32 = u32::MAX;

impl Route {
    const EMPTY: Route = Route { channel: 0, object: NO_OBJECT, channel_slot: 0, object_slot: 0, call: false };

    #[inline(always)]
    pub(super) fn object_slot(self) -> Option<u32> {
        if self.object == NO_OBJECT { None } else { Some(self.object_slot) }
    }
}

/// The classifiers that decide a route, except the workflow, in one word
/// (bit 63 set so that 0 means "none").
#[inline(always)]
pub(super) fn route_key(ctx: &Context) -> u64 {
    (1 << 63)
        | ctx.request_type as u64
        | (u64::from(ctx.context.id()) << 8)
        | (u64::from(ctx.instance.0) << 24)
        | ((ctx.reason as u64) << 40)
}

thread_local! {
    pub(super) static LAYOUT_CACHE: ThreadCache = const {
        ThreadCache {
            stage_uid: Cell::new(0),
            generation: Cell::new(0),
            layout: Cell::new(None),
            memo_key: Cell::new(0),
            memo_workflow: Cell::new(0),
            memo: Cell::new(Route::EMPTY),
        }
    };
}

impl Layout {
    /// The channel a request goes to: the most specific channel route that
    /// matches it, else the default channel.
    #[inline(always)]
    pub(super) fn channel_of(&self, ctx: &Context) -> u32 {
        self.routes.lookup(ctx).unwrap_or(self.default_channel)
    }

    /// Where a request goes: its channel, and in it the most specific object
    /// route's object, else the channel's default object (`None`: the
    /// request passes through the channel, counted). The one statement of
    /// the routing rule; everything that asks where a request goes calls it.
    #[inline(always)]
    pub(super) fn resolve(&self, ctx: &Context) -> (u32, Option<u32>) {
        let ci = self.channel_of(ctx);
        let ch = &self.channels[ci as usize];
        (ci, ch.routes.lookup(ctx).or(ch.default_object))
    }

    /// [`resolve`](Self::resolve), with the counter slots to charge.
    pub(super) fn route(&self, ctx: &Context) -> Route {
        let (ci, oi) = self.resolve(ctx);
        let ch = &self.channels[ci as usize];
        match oi {
            Some(oi) => {
                let o = &ch.objects[oi as usize];
                Route {
                    channel: ci,
                    object: oi,
                    channel_slot: ch.slot,
                    object_slot: o.slot,
                    call: !matches!(*o.object, Object::Noop(_)),
                }
            }
            None => Route { channel: ci, object: NO_OBJECT, channel_slot: ch.slot, object_slot: 0, call: false },
        }
    }
}

pub(super) fn compile_routes(
    routes: &[RouteModel],
    index_of: impl Fn(&str) -> u32,
    scope: &str,
    budget: &mut usize,
) -> Result<RouteTable> {
    let specs: Vec<RouteSpec<'_>> =
        routes.iter().map(|r| RouteSpec { pattern: &r.matches, target: index_of(&r.target) }).collect();
    RouteTable::compile_within(&specs, budget).map_err(|e| match e {
        RouteError::Ambiguous { first, second, example } => {
            let (a, b) = (&routes[first], &routes[second]);
            Error::rule(
                &b.origin,
                Some("match"),
                format!(
                    "{scope} route {} -> '{}' and route {} -> '{}' (from {}) both match requests such as {example} with equal specificity; make one more specific",
                    b.matches, b.target, a.matches, a.target, a.origin
                ),
            )
        }
        RouteError::TooLarge { cells, limit } => Error::rule(
            &routes.last().map(|r| r.origin.clone()).unwrap_or_default(),
            Some("match"),
            format!(
                "{scope} routes need a table of {cells} cells, over the {limit} left (at most {} per table, {} for all of a stage's tables); pin fewer distinct workflows or instances",
                crate::route::MAX_CELLS,
                crate::route::MAX_TOTAL_CELLS
            ),
        ),
    })
}

pub(super) fn compile(m: &Model) -> Result<Layout> {
    let index_of_channel =
        |id: &str| m.channels.iter().position(|c| &*c.id == id).expect("routes target live channels") as u32;
    let mut budget = crate::route::MAX_TOTAL_CELLS;
    let routes = compile_routes(&m.routes, index_of_channel, "channel", &mut budget)?;
    let mut channels = Vec::with_capacity(m.channels.len());
    for ch in &m.channels {
        let index_of_object =
            |id: &str| ch.objects.iter().position(|o| &*o.id == id).expect("routes target live objects") as u32;
        let table = compile_routes(&ch.routes, index_of_object, &format!("channel '{}' object", ch.id), &mut budget)?;
        channels.push(ChannelRt {
            label: Arc::clone(&ch.id),
            slot: ch.slot.slot,
            objects: ch
                .objects
                .iter()
                .map(|o| ObjectRt {
                    id: Arc::clone(&o.id),
                    label: format!("{}/{}", ch.id, o.id).into(),
                    slot: o.slot.slot,
                    object: Arc::clone(&o.object),
                })
                .collect(),
            routes: table,
            default_object: ch.default_object.as_deref().map(index_of_object),
        });
    }
    Ok(Layout { channels: channels.into_boxed_slice(), routes, default_channel: index_of_channel(&m.default_channel) })
}
