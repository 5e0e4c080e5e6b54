//! Compactions are tagged by level pair and by reason: the bytes tagged per
//! level pair match what RocksDB reports for those jobs, a DRL on one pair
//! throttles only that pair, `CompactRange` is `manual` and an expired file
//! is compacted as `ttl`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kv_stage::{Match, ObjectChange, ObjectSpec, Reason, RequestContext as C, RequestType, Rule, Stage, units::Rate};
use rocks_env::{CompactionLevelStats, StagedDb};

/// A small LSM with static level sizes (L1 1 MiB, L2 4 MiB, L3 16 MiB) and
/// 256 KiB files, so about 20 MiB of data reaches L3.
fn level_options() -> rocksdb::Options {
    let mut o = small_lsm_options();
    o.set_level_compaction_dynamic_level_bytes(false);
    o.set_write_buffer_size(256 << 10);
    o.set_target_file_size_base(256 << 10);
    o.set_max_bytes_for_level_base(1 << 20);
    o.set_max_bytes_for_level_multiplier(4.0);
    o.set_max_background_jobs(4);
    o
}

/// Puts `n` values of 1 KiB over keys spread across `3 * n`, so most of the
/// data survives compaction and pushes into deeper levels.
fn load(db: &StagedDb, n: u64, seed: u64) {
    let mut rng = Lcg(seed);
    for i in 0..n {
        db.put(key(rng.next() % (3 * n)), value(i, 1024)).unwrap();
    }
}

/// The compaction contexts the accounting stage below separates.
fn compaction_contexts() -> Vec<C> {
    let mut v = C::COMPACTION_PAIRS.to_vec();
    v.extend([C::BG_COMPACTION_LN, C::BG_COMPACTION]);
    v
}

/// One channel per compaction context (named after it), each with a
/// `writes` Noop for writes and a default `other` Noop for the rest.
fn level_stage() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("levels"));
    let mut rules = Vec::new();
    for c in compaction_contexts() {
        rules.push(Rule::CreateChannel { channel: c.name().into(), matches: Some(Match::context(c)) });
        rules.push(Rule::CreateObject {
            channel: c.name().into(),
            object: "writes".into(),
            spec: ObjectSpec::Noop,
            matches: Some(Match::request_type(RequestType::Write)),
        });
        rules.push(Rule::CreateObject {
            channel: c.name().into(),
            object: "other".into(),
            spec: ObjectSpec::Noop,
            matches: None,
        });
    }
    stage.apply_rules(rules).unwrap();
    stage
}

fn level(levels: &[CompactionLevelStats], c: C) -> Option<CompactionLevelStats> {
    levels.iter().find(|l| l.context == c).copied()
}

#[test]
fn bytes_per_level_pair_match_rocksdb_job_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let stage = level_stage();
    let db = StagedDb::builder(level_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    load(&db, 24_000, 3);
    db.flush().unwrap();
    wait_idle(&db, Duration::from_secs(180));

    let levels = db.compaction_levels();
    let collected = stage.collect();
    let stage_bytes = |c: C, object: &str| collected.object(c.name(), object).map_or(0, |o| o.counter.bytes);
    for l in &levels {
        eprintln!(
            "{:>22}: {} jobs, RocksDB wrote {} read {}; tagged wrote {} read {}; stage wrote {} other {}",
            l.context.name(),
            l.jobs.counts.completed,
            l.jobs.bytes_written,
            l.jobs.bytes_read,
            l.written.bytes,
            l.read.bytes,
            stage_bytes(l.context, "writes"),
            stage_bytes(l.context, "other"),
        );
    }
    for c in [C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_L1_L2, C::BG_COMPACTION_L2_L3] {
        let l = level(&levels, c).unwrap_or_else(|| panic!("no {c} compaction ran: {levels:?}"));
        assert!(l.jobs.counts.completed >= 1 && l.jobs.retired == 0, "{c}: {:?}", l.jobs);
    }
    // Besides its output files, a compaction writes its MANIFEST edit (a
    // few hundred bytes) on its own thread, with its context: a trivial move
    // writes nothing else and RocksDB reports 0 bytes for it.
    let within = |tagged: u64, reported: u64, jobs: u64| {
        let slack = 0.01 * reported as f64 + 1024.0 * jobs as f64;
        (tagged as f64 - reported as f64).abs() <= slack
    };
    for l in &levels {
        let c = l.context;
        // What the stage saw written in the pair's channel is what rocks-env
        // tagged, and both match the output RocksDB reported for its jobs.
        assert_eq!(stage_bytes(c, "writes"), l.written.bytes, "{c}");
        assert!(
            within(l.written.bytes, l.jobs.bytes_written, l.jobs.counts.completed),
            "{c}: tagged {} B written, RocksDB reported {} B",
            l.written.bytes,
            l.jobs.bytes_written
        );
        assert!(
            within(l.read.bytes, l.jobs.bytes_read, 0),
            "{c}: tagged {} B read, RocksDB reported {} B of input",
            l.read.bytes,
            l.jobs.bytes_read
        );
    }
    // Every compaction had known levels within L10.
    assert!(level(&levels, C::BG_COMPACTION).is_none() && level(&levels, C::BG_COMPACTION_LN).is_none(), "{levels:?}");
}

#[test]
fn a_drl_on_l2_l3_throttles_only_those_compactions() {
    const RATE: f64 = 2.0 * 1024.0 * 1024.0;
    let dir = tempfile::tempdir().unwrap();
    let stage = Arc::new(Stage::new("l2l3"));
    stage
        .apply_rules([
            Rule::CreateChannel {
                channel: "compaction".into(),
                matches: Some(Match::contexts([C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN, C::BG_COMPACTION])),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "l2_l3".into(),
                spec: ObjectSpec::Drl(kv_stage::DrlSpec {
                    rate: Rate::from_bytes_per_sec(RATE).unwrap(),
                    burst: None,
                    refill_period: None,
                }),
                matches: Some(Match::context(C::BG_COMPACTION_L2_L3)),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "l1_l2".into(),
                spec: ObjectSpec::Noop,
                matches: Some(Match::context(C::BG_COMPACTION_L1_L2)),
            },
            Rule::CreateObject {
                channel: "compaction".into(),
                object: "rest".into(),
                spec: ObjectSpec::Noop,
                matches: None,
            },
        ])
        .unwrap();
    let db = StagedDb::builder(level_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    load(&db, 24_000, 5);
    db.flush().unwrap();

    // Until the throttled pair has run long enough to measure (or the DB
    // is idle), bounded.
    let deadline = Instant::now() + Duration::from_secs(120);
    let pair = |c: C| level(&db.compaction_levels(), c);
    loop {
        let busy = pair(C::BG_COMPACTION_L2_L3).map_or(0, |l| l.jobs.busy_ns);
        let p = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        let idle = p("rocksdb.num-running-compactions") + p("rocksdb.compaction-pending") == 0;
        if busy >= 5_000_000_000 || idle || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let l23 = pair(C::BG_COMPACTION_L2_L3).expect("no L2->L3 compaction ran");
    let l12 = pair(C::BG_COMPACTION_L1_L2).expect("no L1->L2 compaction ran");
    let collected = stage.collect();
    let drl = collected.object("compaction", "l2_l3").unwrap();
    let noop = collected.object("compaction", "l1_l2").unwrap();
    let secs = |ns: u64| ns as f64 * 1e-9;
    let l23_rate = drl.counter.bytes as f64 / secs(l23.jobs.busy_ns);
    let l12_rate = noop.counter.bytes as f64 / secs(l12.jobs.busy_ns);
    eprintln!(
        "L2->L3: {} jobs, {} B through the DRL in {:.2} s busy: {:.0} B/s (limit {RATE:.0}); \
         L1->L2: {} jobs, {} B in {:.2} s busy: {:.0} B/s",
        l23.jobs.counts.begun,
        drl.counter.bytes,
        secs(l23.jobs.busy_ns),
        l23_rate,
        l12.jobs.counts.begun,
        noop.counter.bytes,
        secs(l12.jobs.busy_ns),
        l12_rate
    );
    // The DRL saw every L2->L3 request and nothing else; the Noop every
    // L1->L2 one.
    assert_eq!(drl.counter, collected.context_exact(C::BG_COMPACTION_L2_L3));
    assert_eq!(noop.counter, collected.context_exact(C::BG_COMPACTION_L1_L2));
    assert!(drl.counter.bytes >= l23.read.bytes + l23.written.bytes);
    assert!(l23.jobs.busy_ns >= 2_000_000_000, "too little L2->L3 compaction to measure: {l23:?}");
    assert!((l23_rate / RATE - 1.0).abs() <= 0.05, "L2->L3 ran at {l23_rate:.0} B/s, limit {RATE:.0}");
    // L1->L2 compactions were not held: nothing of theirs waited, and they
    // ran well above the limit.
    assert_eq!(noop.stats.waits, 0, "{:?}", noop.stats);
    assert!(drl.stats.waits > 0, "the DRL never held a request: {:?}", drl.stats);
    assert!(l12_rate > 3.0 * RATE, "L1->L2 ran at {l12_rate:.0} B/s");

    // Let the backlog go before the DB closes.
    stage.object("compaction", "l2_l3").unwrap().configure(&ObjectChange::rate(Rate::UNLIMITED)).unwrap();
}

/// A stage whose compaction channel separates requests by reason.
fn reason_stage() -> Arc<Stage> {
    let stage = Arc::new(Stage::new("reasons"));
    let mut rules = vec![Rule::CreateChannel {
        channel: "compaction".into(),
        matches: Some(Match::contexts([C::BG_COMPACTION_L0_L1, C::BG_COMPACTION_LN, C::BG_COMPACTION])),
    }];
    for (object, reason) in [("manual", Reason::Manual), ("ttl", Reason::Ttl)] {
        rules.push(Rule::CreateObject {
            channel: "compaction".into(),
            object: object.into(),
            spec: ObjectSpec::Noop,
            matches: Some(Match::reason(reason)),
        });
    }
    rules.push(Rule::CreateObject {
        channel: "compaction".into(),
        object: "auto".into(),
        spec: ObjectSpec::Noop,
        matches: None,
    });
    stage.apply_rules(rules).unwrap();
    stage
}

/// [`level_options`] with no automatic compaction while L0 stays small (a
/// file-count trigger of 50; keep L0 under L1's 1 MiB target as well).
fn quiet_options() -> rocksdb::Options {
    let mut o = level_options();
    o.set_level_zero_file_num_compaction_trigger(50);
    o
}

fn object_bytes(stage: &Stage, object: &str) -> u64 {
    stage.collect().object("compaction", object).map_or(0, |o| o.counter.bytes)
}

#[test]
fn compact_range_is_tagged_manual() {
    let dir = tempfile::tempdir().unwrap();
    let stage = reason_stage();
    // No automatic compaction: the L0 files stay until CompactRange.
    let db = StagedDb::builder(quiet_options()).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    // (Three files of 200 KiB: L0's size stays under L1's 1 MiB target too.)
    for round in 0..3 {
        load(&db, 200, 10 + round);
        db.flush().unwrap();
    }
    assert_eq!(
        object_bytes(&stage, "manual") + object_bytes(&stage, "auto"),
        0,
        "a compaction ran before CompactRange: {:?}",
        db.compaction_levels()
    );
    db.compact_range::<&[u8], &[u8]>(None, None);
    let manual = object_bytes(&stage, "manual");
    let levels = db.compaction_levels();
    let compacted: u64 = levels.iter().map(|l| l.read.bytes + l.written.bytes).sum();
    eprintln!("manual {manual} B, automatic {} B, levels {levels:?}", object_bytes(&stage, "auto"));
    assert!(manual > 1 << 19, "CompactRange moved {manual} B");
    assert_eq!(object_bytes(&stage, "auto") + object_bytes(&stage, "ttl"), 0);
    assert!(manual >= compacted, "every compaction byte is manual: {manual} of {compacted}");
}

#[test]
fn an_expired_file_is_compacted_as_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let stage = reason_stage();
    let mut opts = quiet_options();
    opts.set_ttl(1);
    let db = StagedDb::builder(opts).stage(Arc::clone(&stage)).open(dir.path()).unwrap();
    load(&db, 500, 20);
    db.flush().unwrap();
    db.compact_range::<&[u8], &[u8]>(None, None);
    let before = object_bytes(&stage, "ttl");
    // Once its data is older than the TTL, the next new version (a flush)
    // finds the file expired and compacts it down, with reason `ttl`.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut round = 0;
    while object_bytes(&stage, "ttl") == before {
        assert!(Instant::now() < deadline, "no TTL compaction within 30 s: {:?}", db.compaction_levels());
        std::thread::sleep(Duration::from_millis(1500));
        round += 1;
        load(&db, 50, 100 + round);
        db.flush().unwrap();
    }
    eprintln!("ttl {} B after {round} flushes; levels {:?}", object_bytes(&stage, "ttl"), db.compaction_levels());
    assert_eq!(before, 0, "a TTL compaction before the data expired");
    assert!(object_bytes(&stage, "ttl") > 0);
}
