//! The control model: channels, objects and routes as rules see them,
//! guarded by the stage's control mutex and copied for each batch
//! ([`Txn`]), so a batch that fails leaves nothing changed.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::context::InstanceId;
use crate::error::FieldError;
use crate::error::{Error, Location, Result};
use crate::matching::Match;
use crate::objects::{EnforcementObject, Object, ObjectChange, ObjectSpec};
use crate::rules::{Rule, RuleEntry};
use crate::stats::{Counters, MAX_COUNTER_SLOTS};

/// A counter slot as one channel or object uses it: slots of removed
/// channels and objects are reused, so each use has its own incarnation and
/// counts from the totals the slot had when it was taken.
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotUse {
    pub(super) slot: u32,
    pub(super) incarnation: u64,
    pub(super) base: (u64, u64),
}

impl SlotUse {
    pub(super) fn total(&self, counters: &Counters) -> (u64, u64) {
        let (ops, bytes) = counters.slot_total(self.slot);
        (ops.wrapping_sub(self.base.0), bytes.wrapping_sub(self.base.1))
    }
}

#[derive(Clone)]
pub(super) struct ObjectModel {
    pub(super) id: Arc<str>,
    pub(super) slot: SlotUse,
    pub(super) object: Arc<Object>,
}

#[derive(Clone)]
pub(super) struct RouteModel {
    pub(super) matches: Match,
    pub(super) target: Arc<str>,
    pub(super) origin: Location,
}

#[derive(Clone)]
pub(super) struct ChannelModel {
    pub(super) id: Arc<str>,
    pub(super) slot: SlotUse,
    pub(super) objects: Vec<ObjectModel>,
    pub(super) routes: Vec<RouteModel>,
    pub(super) default_object: Option<Arc<str>>,
}

#[derive(Clone)]
pub(super) struct Model {
    pub(super) channels: Vec<ChannelModel>,
    pub(super) routes: Vec<RouteModel>,
    pub(super) default_channel: Arc<str>,
    /// Slots never used so far start here.
    pub(super) next_slot: u32,
    /// Slots given back by removed channels and objects, oldest first.
    pub(super) free_slots: VecDeque<u32>,
    pub(super) next_incarnation: u64,
    pub(super) generation: u64,
    /// Instances open on the stage, with who opened them.
    pub(super) open_instances: Vec<(InstanceId, Arc<str>)>,
    /// Instances whose requests objects no longer hold (closing).
    pub(super) closed_instances: Vec<InstanceId>,
}

impl Model {
    pub(super) fn channel(&self, id: &str) -> Option<&ChannelModel> {
        self.channels.iter().find(|c| &*c.id == id)
    }

    pub(super) fn channel_mut(&mut self, id: &str) -> Option<&mut ChannelModel> {
        self.channels.iter_mut().find(|c| &*c.id == id)
    }

    /// A counter slot for a new channel or object: a fresh one while any
    /// is left, else the one given back longest ago (so that a request
    /// still counting on a removed object, which finishes on the layout it
    /// started with, almost surely counts before its slot is reused).
    pub(super) fn alloc_slot(&mut self, counters: &Counters, loc: &Location, field: &str) -> Result<SlotUse> {
        let slot = if (self.next_slot as usize) < MAX_COUNTER_SLOTS {
            self.next_slot += 1;
            self.next_slot - 1
        } else if let Some(s) = self.free_slots.pop_front() {
            s
        } else {
            return Err(Error::rule(
                loc,
                Some(field),
                format!("this stage has {MAX_COUNTER_SLOTS} channels and objects, its limit; remove some first"),
            ));
        };
        self.next_incarnation += 1;
        Ok(SlotUse { slot, incarnation: self.next_incarnation, base: counters.slot_total(slot) })
    }

    pub(super) fn objects(&self) -> impl Iterator<Item = &Arc<Object>> {
        self.channels.iter().flat_map(|c| c.objects.iter().map(|o| &o.object))
    }
}

/// A batch in progress: the model copy plus what to do at commit.
pub(super) struct Txn<'a> {
    pub(super) model: Model,
    pub(super) counters: &'a Counters,
    pub(super) configs: Vec<(Arc<Object>, ObjectChange)>,
    pub(super) retired: Vec<Arc<Object>>,
    /// Objects created in this batch (closed instances apply to them).
    pub(super) created: Vec<Arc<Object>>,
    /// Slots given back in this batch; reusable only after it commits.
    pub(super) freed: Vec<u32>,
    pub(super) warnings: Vec<String>,
    pub(super) structural: bool,
    /// Patterns routed in this batch, to reject repeats within one batch.
    pub(super) batch_routes: HashSet<(Option<Arc<str>>, Match)>,
}

pub(super) fn validate_id(id: &str, loc: &Location, field: &str) -> Result<Arc<str>> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(id.into())
    } else {
        Err(Error::rule(loc, Some(field), format!("'{id}' is not a valid id (1-64 of [A-Za-z0-9_.:-])")))
    }
}

pub(super) fn config_error(loc: &Location, label: &str, e: FieldError) -> Error {
    Error::rule(loc, Some(&e.field), format!("{label}: {}", e.message))
}

impl Txn<'_> {
    pub(super) fn channel_mut<'a>(&'a mut self, id: &str, loc: &Location) -> Result<&'a mut ChannelModel> {
        self.model.channel_mut(id).ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{id}'")))
    }

    pub(super) fn create_channel(&mut self, id: &str, matches: Option<&Match>, loc: &Location) -> Result<()> {
        let id = validate_id(id, loc, "channel")?;
        if self.model.channel(&id).is_some() {
            return Err(Error::rule(loc, Some("channel"), format!("channel '{id}' already exists")));
        }
        let slot = self.model.alloc_slot(self.counters, loc, "channel")?;
        self.model.channels.push(ChannelModel {
            id: Arc::clone(&id),
            slot,
            objects: Vec::new(),
            routes: Vec::new(),
            default_object: None,
        });
        self.structural = true;
        if let Some(m) = matches {
            self.route(&id, m, loc)?;
        }
        Ok(())
    }

    pub(super) fn remove_channel(&mut self, id: &str, loc: &Location) -> Result<()> {
        if &*self.model.default_channel == id {
            return Err(Error::rule(
                loc,
                Some("channel"),
                format!("channel '{id}' is the default channel; set another default first"),
            ));
        }
        let pos = self
            .model
            .channels
            .iter()
            .position(|c| &*c.id == id)
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{id}'")))?;
        let ch = self.model.channels.remove(pos);
        self.freed.push(ch.slot.slot);
        self.freed.extend(ch.objects.iter().map(|o| o.slot.slot));
        self.retired.extend(ch.objects.into_iter().map(|o| o.object));
        self.model.routes.retain(|r| &*r.target != id);
        self.structural = true;
        Ok(())
    }

    pub(super) fn add_object(
        &mut self,
        channel: &str,
        object: &str,
        obj: Object,
        matches: Option<&Match>,
        loc: &Location,
    ) -> Result<()> {
        let oid = validate_id(object, loc, "object")?;
        let slot = self.model.alloc_slot(self.counters, loc, "object")?;
        let ch = self.channel_mut(channel, loc)?;
        if ch.objects.iter().any(|o| o.id == oid) {
            return Err(Error::rule(
                loc,
                Some("object"),
                format!("object '{oid}' already exists in channel '{channel}'"),
            ));
        }
        if matches.is_none()
            && let Some(d) = &ch.default_object
        {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!(
                    "channel '{channel}' already has a default object '{d}'; give this object a `match`, or use set_default_object"
                ),
            ));
        }
        let obj = Arc::new(obj);
        ch.objects.push(ObjectModel { id: Arc::clone(&oid), slot, object: Arc::clone(&obj) });
        if matches.is_none() {
            ch.default_object = Some(Arc::clone(&oid));
        }
        self.created.push(obj);
        self.structural = true;
        if let Some(m) = matches {
            self.route_object(channel, object, m, loc)?;
        }
        Ok(())
    }

    pub(super) fn remove_object(&mut self, channel: &str, object: &str, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let pos = ch.objects.iter().position(|o| &*o.id == object).ok_or_else(|| {
            Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
        })?;
        let o = ch.objects.remove(pos);
        ch.routes.retain(|r| &*r.target != object);
        if ch.default_object.as_deref() == Some(object) {
            ch.default_object = None;
        }
        self.freed.push(o.slot.slot);
        self.retired.push(o.object);
        self.structural = true;
        Ok(())
    }

    pub(super) fn route(&mut self, channel: &str, m: &Match, loc: &Location) -> Result<()> {
        let target = self
            .model
            .channel(channel)
            .map(|c| Arc::clone(&c.id))
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{channel}'")))?;
        if !self.batch_routes.insert((None, m.clone())) {
            return Err(Error::rule(loc, Some("match"), format!("the channel route {m} is set twice in this batch")));
        }
        self.model.routes.retain(|r| r.matches != *m);
        self.model.routes.push(RouteModel { matches: m.clone(), target, origin: loc.clone() });
        self.structural = true;
        Ok(())
    }

    pub(super) fn unroute(&mut self, m: &Match, loc: &Location) -> Result<()> {
        let before = self.model.routes.len();
        self.model.routes.retain(|r| r.matches != *m);
        if self.model.routes.len() == before {
            return Err(Error::rule(loc, Some("match"), format!("no channel route has the pattern {m}")));
        }
        self.structural = true;
        Ok(())
    }

    pub(super) fn route_object(&mut self, channel: &str, object: &str, m: &Match, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let target = ch.objects.iter().find(|o| &*o.id == object).map(|o| Arc::clone(&o.id)).ok_or_else(|| {
            Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
        })?;
        let ch_id = Arc::clone(&ch.id);
        ch.routes.retain(|r| r.matches != *m);
        ch.routes.push(RouteModel { matches: m.clone(), target, origin: loc.clone() });
        if !self.batch_routes.insert((Some(ch_id), m.clone())) {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!("the object route {m} of channel '{channel}' is set twice in this batch"),
            ));
        }
        self.structural = true;
        Ok(())
    }

    pub(super) fn unroute_object(&mut self, channel: &str, m: &Match, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let before = ch.routes.len();
        ch.routes.retain(|r| r.matches != *m);
        if ch.routes.len() == before {
            return Err(Error::rule(
                loc,
                Some("match"),
                format!("no object route of channel '{channel}' has the pattern {m}"),
            ));
        }
        self.structural = true;
        Ok(())
    }

    pub(super) fn set_default_channel(&mut self, channel: &str, loc: &Location) -> Result<()> {
        let id = self
            .model
            .channel(channel)
            .map(|c| Arc::clone(&c.id))
            .ok_or_else(|| Error::rule(loc, Some("channel"), format!("unknown channel '{channel}'")))?;
        self.model.default_channel = id;
        self.structural = true;
        Ok(())
    }

    pub(super) fn set_default_object(&mut self, channel: &str, object: Option<&str>, loc: &Location) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        ch.default_object = match object {
            None => None,
            Some(o) => Some(ch.objects.iter().find(|x| &*x.id == o).map(|x| Arc::clone(&x.id)).ok_or_else(|| {
                Error::rule(loc, Some("object"), format!("unknown object '{o}' in channel '{channel}'"))
            })?),
        };
        self.structural = true;
        Ok(())
    }

    pub(super) fn configure(
        &mut self,
        channel: &str,
        object: &str,
        set: &ObjectChange,
        ignore_unsupported: bool,
        loc: &Location,
    ) -> Result<()> {
        let ch = self.channel_mut(channel, loc)?;
        let o = Arc::clone(
            &ch.objects
                .iter()
                .find(|o| &*o.id == object)
                .ok_or_else(|| {
                    Error::rule(loc, Some("object"), format!("unknown object '{object}' in channel '{channel}'"))
                })?
                .object,
        );
        if set.is_empty() {
            return Err(Error::rule(loc, Some("set"), "a configure rule must change at least one setting"));
        }
        match o.validate(set) {
            Ok(()) => {}
            Err(e) if e.unsupported && ignore_unsupported => {
                self.warnings.push(format!(
                    "{loc}: {channel}/{object} ({}) has no setting `{}`; rule skipped",
                    o.kind(),
                    e.field
                ));
                return Ok(());
            }
            Err(e) => return Err(config_error(loc, &format!("{channel}/{object}"), e)),
        }
        self.configs.push((o, set.clone()));
        Ok(())
    }

    pub(super) fn apply(&mut self, entry: &RuleEntry) -> Result<()> {
        let loc = &entry.location;
        match &entry.rule {
            Rule::CreateChannel { channel, matches } => self.create_channel(channel, matches.as_ref(), loc),
            Rule::RemoveChannel { channel } => self.remove_channel(channel, loc),
            Rule::CreateObject { channel, object, spec, matches } => {
                let obj = spec.build().map_err(|e| config_error(loc, &format!("{channel}/{object}"), e))?;
                self.add_object(channel, object, obj, matches.as_ref(), loc)
            }
            Rule::RemoveObject { channel, object } => self.remove_object(channel, object, loc),
            Rule::Route { channel, matches } => self.route(channel, matches, loc),
            Rule::Unroute { matches } => self.unroute(matches, loc),
            Rule::RouteObject { channel, object, matches } => self.route_object(channel, object, matches, loc),
            Rule::UnrouteObject { channel, matches } => self.unroute_object(channel, matches, loc),
            Rule::SetDefaultChannel { channel } => self.set_default_channel(channel, loc),
            Rule::SetDefaultObject { channel, object } => self.set_default_object(channel, object.as_deref(), loc),
            Rule::Configure { channel, object, set, ignore_unsupported } => {
                self.configure(channel, object, set, *ignore_unsupported, loc)
            }
        }
    }

    /// Makes the model `cp` again (see `Stage::restore`): `specs` are the
    /// settings of `cp`'s objects, in order.
    pub(super) fn restore(&mut self, cp: &Model, specs: &[Option<ObjectSpec>]) -> Result<()> {
        let loc = Location::default();
        let current = std::mem::take(&mut self.model.channels);
        let same_slot = |a: &SlotUse, b: &SlotUse| a.slot == b.slot && a.incarnation == b.incarnation;
        let mut specs = specs.iter();
        let mut channels: Vec<ChannelModel> = Vec::with_capacity(cp.channels.len());
        for cch in &cp.channels {
            let live_channel = current.iter().find(|c| c.id == cch.id && same_slot(&c.slot, &cch.slot));
            let slot = match live_channel {
                Some(c) => c.slot,
                None => self.model.alloc_slot(self.counters, &loc, "channel")?,
            };
            let mut objects = Vec::with_capacity(cch.objects.len());
            for o in &cch.objects {
                let spec = specs.next().and_then(Option::as_ref);
                let live = current.iter().flat_map(|c| c.objects.iter()).find(|x| Arc::ptr_eq(&x.object, &o.object));
                match (live, spec) {
                    (Some(x), Some(spec)) if x.object.spec().as_ref() == Some(spec) => objects.push(x.clone()),
                    // An application object: as it is.
                    (Some(x), None) => objects.push(x.clone()),
                    (live, Some(spec)) => {
                        let obj = Arc::new(
                            spec.build().map_err(|e| config_error(&loc, &format!("{}/{}", cch.id, o.id), e))?,
                        );
                        let slot = match live {
                            Some(x) => x.slot,
                            None => self.model.alloc_slot(self.counters, &loc, "object")?,
                        };
                        self.created.push(Arc::clone(&obj));
                        objects.push(ObjectModel { id: Arc::clone(&o.id), slot, object: obj });
                    }
                    (None, None) => self.warnings.push(format!(
                        "{}/{}: an application object removed since the checkpoint cannot be made again; its routes are dropped",
                        cch.id, o.id
                    )),
                }
            }
            let has = |id: &str| objects.iter().any(|x| &*x.id == id);
            let routes = cch.routes.iter().filter(|r| has(&r.target)).cloned().collect();
            let default_object = cch.default_object.clone().filter(|d| has(d));
            channels.push(ChannelModel { id: Arc::clone(&cch.id), slot, objects, routes, default_object });
        }
        // What the restored model does not hold any more: slots freed,
        // objects retired.
        for c in current {
            if !channels.iter().any(|n| same_slot(&n.slot, &c.slot)) {
                self.freed.push(c.slot.slot);
            }
            for o in c.objects {
                let mut restored = channels.iter().flat_map(|n| n.objects.iter());
                if restored.clone().any(|n| Arc::ptr_eq(&n.object, &o.object)) {
                    continue;
                }
                if !restored.any(|n| same_slot(&n.slot, &o.slot)) {
                    self.freed.push(o.slot.slot);
                }
                self.retired.push(o.object);
            }
        }
        self.model.channels = channels;
        self.model.routes = cp.routes.clone();
        self.model.default_channel = Arc::clone(&cp.default_channel);
        self.structural = true;
        Ok(())
    }
}
