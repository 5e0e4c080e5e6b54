//! The stage layout of the Paio paper's RocksDB use case.
//!
//! * `foreground`: client I/O (WAL appends, user reads) through a Noop that
//!   only counts;
//! * `flush`: one DRL;
//! * `compaction`: one DRL for compactions whose input starts at L0
//!   (L0->L1, intra-L0) and one for deeper ones (compactions of unknown
//!   level are treated as deep).
//!
//! Every rate starts unlimited until a controller sets it. Requests in other
//! contexts (application-defined ones such as `backup`, info-log writes)
//! reach the stage's pass-through default channel. With an instance, every
//! route also pins the instance, so several DBs can share one stage with
//! their own limits.

use kv_stage::{
    DrlSpec, InstanceId, Match, ObjectSpec, RequestContext as C, Rule, RuleSet, Stage, info::ObjectHandle, units::Rate,
};

use crate::error::{Error, Result};

/// Channel and object names of the RocksDB layout, for one DB or for all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RocksLayout {
    /// Prepended to every channel id (e.g. `"db1."`).
    pub prefix: String,
    /// When set, routes match only this instance's requests.
    pub instance: Option<InstanceId>,
}

/// Handles on the layout's objects, for control loops.
#[derive(Debug, Clone)]
pub struct LayoutHandles {
    /// The foreground Noop.
    pub foreground: ObjectHandle,
    /// The flush DRL.
    pub flush: ObjectHandle,
    /// The DRL of L0 compactions.
    pub compaction_l0: ObjectHandle,
    /// The DRL of deeper compactions.
    pub compaction_ln: ObjectHandle,
}

impl RocksLayout {
    /// The layout for every request of the stage.
    pub fn new() -> Self {
        RocksLayout::default()
    }

    /// The layout for one instance, with channel ids prefixed by `prefix`.
    pub fn for_instance(instance: InstanceId, prefix: impl Into<String>) -> Self {
        RocksLayout { prefix: prefix.into(), instance: Some(instance) }
    }

    /// The foreground channel id.
    pub fn foreground(&self) -> String {
        format!("{}foreground", self.prefix)
    }

    /// The flush channel id.
    pub fn flush(&self) -> String {
        format!("{}flush", self.prefix)
    }

    /// The compaction channel id.
    pub fn compaction(&self) -> String {
        format!("{}compaction", self.prefix)
    }

    fn pin(&self, m: Match) -> Match {
        match self.instance {
            Some(i) => m.and_instance(i),
            None => m,
        }
    }

    /// The rules that build the layout.
    pub fn rules(&self) -> Vec<Rule> {
        let drl = || ObjectSpec::Drl(DrlSpec::new(Rate::UNLIMITED));
        vec![
            Rule::CreateChannel { channel: self.foreground(), matches: Some(self.pin(Match::context(C::FOREGROUND))) },
            Rule::CreateObject {
                channel: self.foreground(),
                object: "noop".into(),
                spec: ObjectSpec::Noop,
                matches: None,
            },
            Rule::CreateChannel { channel: self.flush(), matches: Some(self.pin(Match::context(C::BG_FLUSH))) },
            Rule::CreateObject { channel: self.flush(), object: "drl".into(), spec: drl(), matches: None },
            Rule::CreateChannel {
                channel: self.compaction(),
                matches: Some(self.pin(Match::contexts([
                    C::BG_COMPACTION_L0_L1,
                    C::BG_COMPACTION_LN,
                    C::BG_COMPACTION,
                ]))),
            },
            Rule::CreateObject {
                channel: self.compaction(),
                object: "l0".into(),
                spec: drl(),
                matches: Some(Match::context(C::BG_COMPACTION_L0_L1)),
            },
            Rule::CreateObject {
                channel: self.compaction(),
                object: "ln".into(),
                spec: drl(),
                matches: Some(Match::contexts([C::BG_COMPACTION_LN, C::BG_COMPACTION])),
            },
        ]
    }

    /// Installs the layout into a stage (all or nothing) and returns handles
    /// on its objects.
    pub fn install(&self, stage: &Stage) -> Result<LayoutHandles> {
        if let Err(e) = stage.apply(&RuleSet::from_rules(self.rules())) {
            // The common way here: the stage `StagedDb::open` made, which
            // has this layout already.
            if self.handles(stage).is_ok() {
                return Err(Error::Config(format!(
                    "{e}: stage '{}' has a RocksDB layout already (StagedDb::open installs one on the stage it \
                     makes; use RocksLayout::handles for its objects, or open with StagedDbBuilder::stage to \
                     bring your own)",
                    stage.name()
                )));
            }
            return Err(e.into());
        }
        self.handles(stage)
    }

    /// Handles on an installed layout's objects.
    pub fn handles(&self, stage: &Stage) -> Result<LayoutHandles> {
        let get = |channel: String, object: &str| {
            stage.object(&channel, object).ok_or_else(|| {
                Error::Config(format!("the stage has no object {channel}/{object}; install the layout first"))
            })
        };
        Ok(LayoutHandles {
            foreground: get(self.foreground(), "noop")?,
            flush: get(self.flush(), "drl")?,
            compaction_l0: get(self.compaction(), "l0")?,
            compaction_ln: get(self.compaction(), "ln")?,
        })
    }
}
