//! The README's service recipe as a test: a protected DB with two tenants
//! and SILK, a bulk job that makes RocksDB flush and compact, statistics, a
//! live limit change, `close` within its grace while a tenant at rate 0
//! waits, and the directory reopened with plain RocksDB holding every
//! acknowledged synced write. Real RocksDB, real files, real threads.

use std::time::{Duration, Instant};

use controller::{ControllerConfig, SilkConfig};
use kv_async::{ProtectedDb, Protection};
use kv_stage::ObjectChange;

fn options() -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    // Small memtables and L1: the bulk job flushes and compacts.
    opts.set_write_buffer_size(1 << 20);
    opts.set_max_bytes_for_level_base(4 << 20);
    opts.set_target_file_size_base(1 << 20);
    opts
}

#[test]
fn the_service_recipe_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = ProtectedDb::open(
        &path,
        options(),
        Protection::default()
            .tenant("recipe_gold", "200ops/s")
            .tenant("recipe_bulk", "unlimited")
            .controller(ControllerConfig::silk(SilkConfig::default())),
    )
    .unwrap();
    let (gold, bulk) = (db.tenant("recipe_gold").unwrap(), db.tenant("recipe_bulk").unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (gold_acked, bulk_acked, gold_took, report, waiter) = rt.block_on(async {
        // The bulk job: 8,000 puts of 1 KiB (8 memtables' worth), 4 tasks.
        let jobs: Vec<_> = (0..4u32)
            .map(|j| {
                let bulk = bulk.clone();
                tokio::spawn(async move {
                    let mut acked = Vec::new();
                    for i in 0..2000u32 {
                        let key = format!("bulk{j}-{i:05}");
                        bulk.put(key.clone().into_bytes(), vec![b'b'; 1024]).await.unwrap();
                        acked.push(key);
                    }
                    acked
                })
            })
            .collect();
        // Gold meanwhile: 60 puts at its 200 ops/s.
        let started = Instant::now();
        let mut gold_acked = Vec::new();
        for i in 0..60u32 {
            let key = format!("gold-{i:03}");
            gold.put(key.clone().into_bytes(), b"g".to_vec()).await.unwrap();
            gold_acked.push(key);
        }
        let gold_took = started.elapsed();
        let mut bulk_acked = Vec::new();
        for j in jobs {
            bulk_acked.extend(j.await.unwrap());
        }
        assert_eq!(gold.get(b"gold-007".to_vec()).await.unwrap().as_deref(), Some(&b"g"[..]));
        // A live change: gold at rate 0, and a put of gold's that waits.
        db.stage().configure("recipe_gold", "limit", ObjectChange::rate("0ops/s".parse().unwrap())).unwrap();
        let waiter = {
            let gold = gold.clone();
            tokio::spawn(async move { gold.put(b"gold-frozen".to_vec(), b"never".to_vec()).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!waiter.is_finished(), "a put at rate 0 completed");
        let started = Instant::now();
        let report = db.close(Duration::from_secs(5)).await.unwrap();
        eprintln!("close took {:?}: {report:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(5), "close waited its whole grace");
        (gold_acked, bulk_acked, gold_took, report, waiter.await.unwrap())
    });
    // Gold's 60 puts at 200 ops/s: at least 59 intervals of 5 ms.
    eprintln!("gold: 60 puts in {gold_took:?}; bulk: {} puts", bulk_acked.len());
    assert!(gold_took >= Duration::from_millis(250), "gold's limit did not hold: {gold_took:?}");
    assert_eq!(waiter.unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
    assert!(report.drained && report.db_closed, "{report:?}");
    assert!(db.db().db().is_none());

    // Statistics: each tenant's channel counted its requests once.
    let c = db.stage().collect();
    assert_eq!(c.channel("recipe_gold").unwrap().ops, 60 + 1); // 60 puts, 1 get
    assert_eq!(c.channel("recipe_bulk").unwrap().ops, 8000);
    // SILK ran, and saw the bulk job's flushes.
    let log = db.decisions();
    assert!(!log.is_empty() && log.iter().all(|r| r.policy == "silk"), "{} cycles", log.len());
    let flushes = c
        .jobs
        .iter()
        .filter(|j| j.context == kv_stage::RequestContext::BG_FLUSH)
        .map(|j| j.counts.completed)
        .sum::<u64>();
    assert!(flushes >= 2, "{flushes} flushes");

    // Reopened with plain RocksDB: every acknowledged write is there.
    let plain = rocksdb::DB::open(&options(), &path).unwrap();
    for k in gold_acked.iter().chain(&bulk_acked) {
        assert!(plain.get(k).unwrap().is_some(), "acknowledged put {k} lost");
    }
    assert_eq!(plain.get(b"gold-frozen").unwrap(), None);
    eprintln!("{} acknowledged puts found after reopening", gold_acked.len() + bulk_acked.len());
}

#[test]
fn a_bad_tenant_is_named_and_nothing_opens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let err =
        ProtectedDb::open(&path, options(), Protection::default().tenant("t_ok", "1MiB/s").tenant("t_bad", "64mb/s"))
            .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("tenant 't_bad'") && text.contains("64mb/s"), "{text}");
    assert!(!path.exists(), "the DB was created although a tenant was refused");
    let err = ProtectedDb::open(
        &path,
        options(),
        Protection::default().tenant("t_twice", "1MiB/s").tenant("t_twice", "2MiB/s"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("tenant 't_twice': declared twice"), "{err}");
}

#[test]
fn the_blocking_api_outside_a_runtime_with_a_waiter_at_rate_0() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = ProtectedDb::open(
        &path,
        options(),
        Protection::default().tenant("sync_gold", "100ops/s").tenant("sync_frozen", "0ops/s"),
    )
    .unwrap();
    let (gold, frozen) = (db.tenant("sync_gold").unwrap(), db.tenant("sync_frozen").unwrap());
    let started = Instant::now();
    for i in 0..30u32 {
        gold.put_blocking(format!("sync-{i:02}").as_bytes(), b"s").unwrap();
    }
    let took = started.elapsed();
    assert_eq!(gold.get_blocking(b"sync-07").unwrap().as_deref(), Some(&b"s"[..]));
    // 30 puts at 100 ops/s: at least 28 intervals of 10 ms after the burst.
    eprintln!("30 blocking puts at 100 ops/s took {took:?}");
    assert!(took >= Duration::from_millis(250), "{took:?}");
    let waiter = std::thread::spawn(move || frozen.put_blocking(b"frozen", b"never"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!waiter.is_finished(), "a put at rate 0 completed");
    let report = db.close_blocking(Duration::from_secs(5)).unwrap();
    assert!(report.db_closed, "{report:?}");
    assert_eq!(waiter.join().unwrap().unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
    assert!(gold.put_blocking(b"late", b"x").is_err());
    let plain = rocksdb::DB::open(&options(), &path).unwrap();
    for i in 0..30u32 {
        assert!(plain.get(format!("sync-{i:02}")).unwrap().is_some());
    }
    assert_eq!(plain.get(b"frozen").unwrap(), None);
}

#[test]
fn a_protected_db_registers_its_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let db = ProtectedDb::open(
        &path,
        options(),
        Protection::default().tenant("metrics_t", "1MiB/s").controller(ControllerConfig::silk(SilkConfig::default())),
    )
    .unwrap();
    let t = db.tenant("metrics_t").unwrap();
    for i in 0..50u32 {
        t.put_blocking(format!("k{i}").as_bytes(), &[b'v'; 512]).unwrap();
    }
    let mut registry = prometheus_client::registry::Registry::default();
    db.register_metrics(&mut registry);
    let stage = path.display().to_string();
    let sample = |text: &str, series: &str| -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    // The controller runs every 10 ms; give it a cycle.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = kv_stage::metrics::encode_text(&registry);
        if sample(&text, r#"kvsds_controller_cycles_total{policy="silk"}"#).is_some_and(|c| c > 0.0)
            || Instant::now() > deadline
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let tenant = format!(r#"{{stage="{stage}",channel="metrics_t",object="limit",kind="drl"}}"#);
    assert_eq!(sample(&text, &format!("kvsds_object_requests_total{tenant}")), Some(50.0), "{text}");
    assert_eq!(
        sample(
            &text,
            &format!(r#"kvsds_object_rate_bytes_per_second{{stage="{stage}",channel="metrics_t",object="limit"}}"#)
        ),
        Some(1048576.0)
    );
    assert!(sample(&text, &format!(r#"kvsds_rocksdb_l0_files{{db="{stage}"}}"#)).is_some(), "{text}");
    assert!(sample(&text, r#"kvsds_controller_cycles_total{policy="silk"}"#).is_some_and(|c| c > 0.0), "{text}");
    db.close_blocking(Duration::from_secs(5)).unwrap();
    let text = kv_stage::metrics::encode_text(&registry);
    assert!(!text.contains(&format!("db=\"{stage}\"")), "a closed DB is still reported: {text}");
}

/// The protected DB issues flushes' and compactions' large direct-I/O
/// requests in pieces of 64 KiB unless told otherwise.
#[test]
fn a_protected_db_bounds_background_requests_by_default() {
    let dir = tempfile::tempdir().unwrap();
    for (protection, bound) in [
        (Protection::default(), rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST),
        (Protection::default().max_background_request(0), 0),
        (Protection::default().max_background_request(128 << 10), 128 << 10),
    ] {
        let path = dir.path().join(format!("db-{bound}"));
        let db = ProtectedDb::open(&path, options(), protection).unwrap();
        assert_eq!(db.db().db().unwrap().max_background_request(), bound);
        db.close_blocking(Duration::from_secs(5)).unwrap();
    }
    assert_eq!(rocks_env::DEFAULT_MAX_BACKGROUND_REQUEST, 64 << 10);
}

/// The protected DB frees deleted files 1 MiB at a time unless told
/// otherwise (rocks-env's tests/deletes.rs checks what a piece does).
#[test]
fn a_protected_db_deletes_in_pieces_by_default() {
    let dir = tempfile::tempdir().unwrap();
    for (protection, piece) in
        [(Protection::default(), rocks_env::DEFAULT_DELETE_PIECE), (Protection::default().delete_in_pieces(0), 0)]
    {
        let path = dir.path().join(format!("db-{piece}"));
        let db = ProtectedDb::open(&path, options(), protection).unwrap();
        assert_eq!(db.db().db().unwrap().delete_piece(), piece);
        db.close_blocking(Duration::from_secs(5)).unwrap();
    }
    assert_eq!(rocks_env::DEFAULT_DELETE_PIECE, 1 << 20);
}

/// Calm hours: the default controller of a protected DB sleeps while the
/// store runs no flush or compaction (`idle_interval`, here 60 s so that
/// no cycle runs on its own while the test watches), healthy or contended
/// (a new DB starts contended for `hold`, so the last cycle before the
/// sleep may be either), and a flush wakes it: RocksDB's listener reports
/// the job's start to the stage, the stage wakes the loop.
#[test]
fn a_calm_protected_db_wakes_its_controller_when_a_flush_starts() {
    use controller::AdaptiveConfig;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let config = AdaptiveConfig {
        hold: Duration::from_millis(50),
        idle_interval: Duration::from_secs(60),
        ..AdaptiveConfig::default()
    };
    let db = ProtectedDb::open(&path, options(), Protection::default().controller(ControllerConfig::adaptive(config)))
        .unwrap();
    let staged = db.db().db().unwrap();
    for i in 0..100u32 {
        staged.put(format!("k{i:03}"), [b'v'; 100]).unwrap();
    }
    // Until the loop has slept for 300 ms (about 30 cycles at 10 ms).
    let deadline = Instant::now() + Duration::from_secs(20);
    let asleep = loop {
        let before = db.decisions().len();
        std::thread::sleep(Duration::from_millis(300));
        if db.decisions().len() == before {
            break before;
        }
        assert!(Instant::now() < deadline, "the controller never slept");
    };
    let last = db.decisions().last().cloned().unwrap();
    for job in ["flush", "l0", "ln"] {
        assert_eq!(last.notes[0]["running"][job], 0, "the loop slept while a {job} job ran: {:?}", last.notes);
    }
    staged.flush().unwrap();
    let woke = Instant::now();
    while db.decisions().len() == asleep {
        assert!(woke.elapsed() < Duration::from_secs(10), "the flush's start did not wake the controller");
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = &db.decisions()[asleep];
    assert!(first.interval_ms >= 250.0, "the cycle after the flush came {} ms after the last", first.interval_ms);
    drop(staged);
    db.close_blocking(Duration::from_secs(5)).unwrap();
}
