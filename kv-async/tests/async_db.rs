//! `AsyncDb` on a real RocksDB: the calls, the tenant's context across
//! `.await` and threads, batching of durable puts (order in the WAL, one
//! batch failing as a unit), and a throttled tenant that does not stall
//! another.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use kv_async::AsyncDb;
use kv_stage::{RequestContext, RuleSet, RulesFormat};
use rocks_env::{FaultInjection, FaultRule, FileKind, FileOp, StagedDb};

fn options() -> rocksdb::Options {
    let mut o = rocksdb::Options::default();
    o.create_if_missing(true);
    o.set_max_background_jobs(2);
    o
}

fn open(dir: &tempfile::TempDir) -> Arc<StagedDb> {
    Arc::new(StagedDb::open(options(), dir.path().join("db")).unwrap())
}

fn apply(db: &StagedDb, rules: &str) {
    db.stage().apply(&RuleSet::parse(rules, RulesFormat::Toml, None, &Default::default()).unwrap()).unwrap();
}

fn tenant(name: &str) -> RequestContext {
    RequestContext::register(name).unwrap()
}

/// A channel for `name`'s key-value requests of `types`, with one object.
fn tenant_rules(name: &str, types: &str, spec: &str) -> String {
    format!(
        r#"
version = 1
[[rules]]
op = "create_channel"
channel = "{name}"
match = {{ context = "{name}", type = [{types}] }}
[[rules]]
op = "create_object"
channel = "{name}"
object = "o"
spec = {spec}
"#
    )
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap()
}

#[test]
fn every_call_round_trips_and_is_enforced_in_the_tasks_context() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let t = tenant("calls_tenant");
    apply(
        &staged,
        &tenant_rules(
            "calls_tenant",
            "\"put\", \"get\", \"delete\", \"multi_get\", \"scan\", \"write_batch\"",
            "{ kind = \"noop\" }",
        ),
    );
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    rt.block_on(kv_async::scope(t, async {
        for i in 0..1000u32 {
            db.put(format!("k{i:04}").into_bytes(), i.to_le_bytes().to_vec()).await.unwrap();
        }
        assert_eq!(db.get(b"k0007".to_vec()).await.unwrap(), Some(7u32.to_le_bytes().to_vec()));
        db.delete(b"k0007".to_vec()).await.unwrap();
        assert_eq!(db.get(b"k0007".to_vec()).await.unwrap(), None);
        let got = db.multi_get(vec![b"k0001".to_vec(), b"k0007".to_vec(), b"zz".to_vec()]).await.unwrap();
        assert_eq!(got, vec![Some(1u32.to_le_bytes().to_vec()), None, None]);
        let mut wb = rocksdb::WriteBatch::default();
        wb.put(b"k0007", b"again");
        wb.delete(b"k0008");
        db.write(wb).await.unwrap();
        // 999 entries from k0000 on: 4 chunks of 256.
        let all = db.scan_collect(b"k".to_vec(), usize::MAX).await.unwrap();
        assert_eq!(all.len(), 999);
        assert!(all.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(all[7], (b"k0007".to_vec(), b"again".to_vec()));
        let from = db.scan_collect(b"k0500".to_vec(), 3).await.unwrap();
        assert_eq!(
            from.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
            [b"k0500", b"k0501", b"k0502"].map(|k| k.to_vec())
        );
    }));
    let c = staged.stage().collect();
    let ch = c.channel("calls_tenant").unwrap();
    // 1000 + 1 puts, 2 gets, 1 delete, 1 multi-get, 1 write batch, 4 + 1 scan chunks.
    assert_eq!(ch.ops, 1000 + 2 + 1 + 1 + 1 + 4 + 1);
    // The tenant's context carries its key-value requests only: the WAL
    // appends of its calls were enforced as foreground and counted for it
    // apart.
    assert_eq!(c.context(t).ops, ch.ops);
    assert_eq!(c.contexts.iter().find(|x| x.context == t).unwrap().file.ops, 0);
    let mine = staged.client_io().into_iter().find(|x| x.client == t).expect("the tenant's file I/O");
    assert!(mine.written.ops >= 1000, "only {} WAL writes counted for the tenant", mine.written.ops);
}

#[test]
fn a_tenant_limit_charges_its_key_value_requests_once_and_reads_by_what_they_return() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let t = tenant("charged_tenant");
    apply(&staged, &tenant_rules("charged_tenant", "", "{ kind = \"noop\" }").replace(", type = []", ""));
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    let value = vec![b'v'; 1000];
    let (mut put_bytes, mut scanned) = (0u64, 0u64);
    rt.block_on(kv_async::scope(t, async {
        for i in 0..100u32 {
            let key = format!("key{i:07}").into_bytes(); // 10 bytes
            put_bytes += (key.len() + value.len()) as u64;
            db.put(key, value.clone()).await.unwrap();
        }
        for i in 0..50u32 {
            assert_eq!(db.get(format!("key{i:07}").into_bytes()).await.unwrap().unwrap().len(), 1000);
        }
        assert_eq!(db.get(b"absent".to_vec()).await.unwrap(), None);
        for (k, v) in db.scan_collect(b"key".to_vec(), usize::MAX).await.unwrap() {
            scanned += (k.len() + v.len()) as u64;
        }
    }));
    assert_eq!(scanned, 100 * 1010);
    let c = staged.stage().collect();
    let ch = c.channel("charged_tenant").unwrap();
    // 100 puts, 51 gets, one scan chunk (100 entries < 256): each request
    // once; bytes: puts key + value, gets their key and the value they
    // returned (the absent key: its 6 bytes), the scan its start key and
    // the keys and values it returned.
    assert_eq!(ch.ops, 100 + 51 + 1);
    assert_eq!(ch.bytes, put_bytes + 50 * (10 + 1000) + 6 + 3 + scanned);
    let ctx = c.contexts.iter().find(|x| x.context == t).unwrap();
    assert_eq!((ctx.counter.ops, ctx.counter.bytes), (ch.ops, ch.bytes));
    assert_eq!(ctx.file.ops, 0, "file I/O charged to the tenant");
    // The file-level view stays: the WAL appends of the 100 puts.
    let mine = staged.client_io().into_iter().find(|x| x.client == t).unwrap();
    assert!(mine.written.bytes >= put_bytes, "{} WAL bytes counted for the tenant", mine.written.bytes);
}

#[test]
fn a_bytes_limit_bounds_what_a_tenant_reads() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let t = tenant("reader_tenant");
    for i in 0..5u32 {
        staged.put(format!("big{i}"), vec![b'r'; 64 << 10]).unwrap();
    }
    apply(&staged, &tenant_rules("reader_tenant", "\"get\"", "{ kind = \"drl\", rate = \"160KiB/s\" }"));
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    // Five gets of 64 KiB each: the first goes at once and puts the limiter
    // 64 KiB in debt, each next one waits for the one before it (0.4 s at
    // 160 KiB/s): about 1.6 s. Charged by their keys, as before, they took
    // a few milliseconds.
    let started = Instant::now();
    rt.block_on(kv_async::scope(t, async {
        for i in 0..5u32 {
            assert_eq!(db.get(format!("big{i}").into_bytes()).await.unwrap().unwrap().len(), 64 << 10);
        }
    }));
    let took = started.elapsed();
    eprintln!("5 gets of 64 KiB under 160 KiB/s took {took:?}");
    assert!(took >= Duration::from_millis(1400), "{took:?}: reads were not charged what they returned");
    assert_eq!(staged.stage().collect().channel("reader_tenant").unwrap().bytes, 5 * (4 + (64 << 10)));
}

struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `f` on the calling thread until it is ready or `polls` polls
/// returned `Pending`; returns it back if not ready.
fn drive<F: Future + Unpin>(f: &mut F, polls: usize) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    for _ in 0..polls {
        if let Poll::Ready(v) = Pin::new(&mut *f).poll(&mut cx) {
            return Some(v);
        }
        std::thread::park_timeout(Duration::from_millis(50));
    }
    None
}

#[test]
fn the_context_survives_await_and_moving_to_another_thread() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let t = tenant("moving_tenant");
    // A slow limit, so the task is still waiting when it moves.
    apply(&staged, &tenant_rules("moving_tenant", "\"put\"", "{ kind = \"drl\", rate = \"20ops/s\", burst = \"1\" }"));
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    let mut task = Box::pin(kv_async::scope(t, async move {
        let mut seen = Vec::new();
        for i in 0..4u8 {
            db.put(vec![i], vec![i]).await.unwrap();
            seen.push((kv_async::current(), std::thread::current().id()));
        }
        seen
    }));
    // Polled first on this thread until it waits for its tokens...
    let first_thread = std::thread::current().id();
    let _guard = rt.enter();
    assert!(drive(&mut task, 2).is_none(), "four puts at 20 ops/s finished at once");
    // ...then moved to another OS thread and finished there.
    let handle = rt.handle().clone();
    let seen = std::thread::spawn(move || {
        let _guard = handle.enter();
        drive(&mut task, 1000).expect("the task did not finish")
    })
    .join()
    .unwrap();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|(c, _)| *c == t), "{seen:?}");
    assert!(seen.iter().any(|(_, th)| *th != first_thread), "never ran elsewhere: {seen:?}");
    // Outside the scope, the caller's own context again.
    assert_eq!(kv_async::current(), RequestContext::FOREGROUND);
    assert_eq!(staged.stage().collect().channel("moving_tenant").unwrap().ops, 4);

    // On a 2-worker runtime: 64 tenant tasks that yield often keep their
    // contexts wherever they are resumed.
    let tenants: Vec<_> = (0..4).map(|i| tenant(&format!("yielding_{i}"))).collect();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let c = tenants[i % 4];
            rt.spawn(kv_async::scope(c, async move {
                let mut threads = std::collections::HashSet::new();
                for _ in 0..200 {
                    tokio::task::yield_now().await;
                    assert_eq!(kv_async::current(), c);
                    threads.insert(std::thread::current().id());
                }
                threads.len()
            }))
        })
        .collect();
    let moved = tasks.into_iter().map(|h| rt.block_on(h).unwrap()).filter(|&n| n > 1).count();
    eprintln!("{moved} of 64 tasks ran on more than one worker thread");
}

/// The keys of every write batch in the WAL, in sequence order.
fn wal_keys(db: &StagedDb) -> Vec<Vec<u8>> {
    struct Keys(Vec<Vec<u8>>);
    impl rocksdb::WriteBatchIterator for Keys {
        fn put(&mut self, key: &[u8], _value: &[u8]) {
            self.0.push(key.to_vec());
        }
        fn delete(&mut self, key: &[u8]) {
            self.0.push(key.to_vec());
        }
    }
    let mut keys = Keys(Vec::new());
    for item in db.get_updates_since(0).unwrap() {
        let (_, batch) = item.unwrap();
        batch.iterate(&mut keys);
    }
    keys.0
}

#[test]
fn batched_durable_puts_reach_the_wal_in_arrival_order_in_few_batches() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let t = tenant("batched_tenant");
    apply(&staged, &tenant_rules("batched_tenant", "\"put\", \"delete\"", "{ kind = \"batch\" }"));
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    // 600 puts submitted one after another by one task, each polled once
    // (which queues it) before the next is made; then all awaited.
    rt.block_on(kv_async::scope(t, async {
        let mut pending = Vec::new();
        for i in 0..600u32 {
            let d = db.clone();
            let mut f = Box::pin(async move { d.put(i.to_be_bytes().to_vec(), vec![0u8; 100]).await });
            let first = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx).is_ready())).await;
            assert!(!first, "a durable put completed in its first poll");
            pending.push(f);
        }
        for f in pending {
            f.await.unwrap();
        }
    }));
    let keys = wal_keys(&staged);
    assert_eq!(keys, (0..600u32).map(|i| i.to_be_bytes().to_vec()).collect::<Vec<_>>());
    let s = db.batch_stats();
    assert_eq!(s.requests, 600);
    assert!(s.batches < 100, "600 puts in {} batches", s.batches);
    assert_eq!(s.by_requests + s.by_bytes + s.by_timeout + s.by_idle, s.batches);

    // 256 concurrent tasks: everything written, once.
    rt.block_on(async {
        let tasks: Vec<_> = (0..256u32)
            .map(|i| {
                let d = db.clone();
                tokio::spawn(kv_async::scope(
                    t,
                    async move { d.put(format!("c{i}").into_bytes(), vec![1u8; 100]).await },
                ))
            })
            .collect();
        for h in tasks {
            h.await.unwrap().unwrap();
        }
    });
    assert_eq!(db.batch_stats().requests, 856);
    assert_eq!(staged.stage().collect().channel("batched_tenant").unwrap().ops, 856);
    for i in 0..256u32 {
        assert_eq!(staged.get(format!("c{i}")).unwrap(), Some(vec![1u8; 100]));
    }

    // A live change: not adaptive, a 30 ms timeout; a lone put now waits
    // for company until its timeout sends it.
    let change = r#"
version = 1
[[rules]]
op = "configure"
channel = "batched_tenant"
object = "o"
set = { adaptive = false, timeout = "30ms" }
"#;
    apply(&staged, change);
    let before = db.batch_stats();
    let t0 = Instant::now();
    rt.block_on(kv_async::scope(t, db.put(b"lone".to_vec(), b"x".to_vec()))).unwrap();
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(30), "the lone put went after {took:?}");
    let after = db.batch_stats();
    assert_eq!((after.batches - before.batches, after.by_timeout - before.by_timeout), (1, 1));
}

#[test]
fn a_failed_wal_write_fails_every_put_of_its_batch_and_no_earlier_one() {
    let dir = tempfile::tempdir().unwrap();
    let fault = Arc::new(FaultInjection::new());
    let staged =
        Arc::new(StagedDb::builder(options()).fault_injection(Arc::clone(&fault)).open(dir.path().join("db")).unwrap());
    let t = tenant("failing_tenant");
    // Not adaptive, 32 requests or 20 ms: the batch that fails holds many.
    apply(
        &staged,
        &tenant_rules(
            "failing_tenant",
            "\"put\"",
            "{ kind = \"batch\", requests = 32, timeout = \"20ms\", adaptive = false }",
        ),
    );
    let db = AsyncDb::new(Arc::clone(&staged));
    let rt = runtime(2);
    let put_all = |from: u32, n: u32| {
        let db = db.clone();
        rt.block_on(async move {
            let tasks: Vec<_> = (from..from + n)
                .map(|i| {
                    let d = db.clone();
                    tokio::spawn(kv_async::scope(
                        t,
                        async move { d.put(i.to_be_bytes().to_vec(), vec![2u8; 100]).await },
                    ))
                })
                .collect();
            let mut out = Vec::new();
            for h in tasks {
                out.push(h.await.unwrap());
            }
            out
        })
    };
    assert!(put_all(0, 64).iter().all(|r| r.is_ok()));
    let before = db.batch_stats();
    fault.fail(FaultRule::new([FileOp::Write]).files([FileKind::Wal]).count(1));
    let results = put_all(1000, 32);
    let after = db.batch_stats();
    // One batch of 32 (the request threshold), written with one WAL append
    // that failed: all of its 32 puts failed with the same error.
    assert_eq!((after.batches - before.batches, after.failed, after.failed_requests), (1, 1, 32));
    for r in &results {
        let e = r.as_ref().unwrap_err();
        assert!(e.to_string().contains("a batch of 32 writes failed"), "{e}");
    }
    // The earlier ones are in the DB.
    for i in 0..64u32 {
        assert_eq!(staged.get(i.to_be_bytes()).unwrap(), Some(vec![2u8; 100]));
    }
    assert_eq!(fault.injected(), 1);
}

#[test]
fn a_flooding_tenant_does_not_stall_a_light_one_on_the_same_workers() {
    let dir = tempfile::tempdir().unwrap();
    let staged = open(&dir);
    let (heavy, light) = (tenant("flood_heavy"), tenant("flood_light"));
    apply(
        &staged,
        &tenant_rules("flood_heavy", "\"put\", \"get\"", "{ kind = \"drl\", rate = \"10ops/s\", burst = \"1\" }"),
    );
    let db = AsyncDb::builder(Arc::clone(&staged)).sync_writes(false).build();
    let rt = runtime(2);
    // 100 flooding tasks, far over their 10 ops/s: ~10 s of waiting.
    let floods: Vec<_> = (0..100u32)
        .map(|i| {
            let d = db.clone();
            rt.spawn(kv_async::scope(heavy, async move { d.put(i.to_be_bytes().to_vec(), vec![0u8; 10]).await }))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    // The light tenant's 200 gets and puts complete meanwhile. With a
    // blocking limiter the two workers would be parked in the flood's waits.
    let t0 = Instant::now();
    let d = db.clone();
    rt.block_on(rt.spawn(kv_async::scope(light, async move {
        for i in 0..100u32 {
            d.put(format!("light{i}").into_bytes(), vec![1u8; 10]).await.unwrap();
            d.get(format!("light{i}").into_bytes()).await.unwrap().unwrap();
        }
    })))
    .unwrap();
    let light_took = t0.elapsed();
    let still_waiting = floods.iter().filter(|h| !h.is_finished()).count();
    assert!(light_took < Duration::from_secs(3), "the light tenant took {light_took:?} behind the flood");
    assert!(still_waiting > 50, "the flood was not throttled: {still_waiting} of 100 still waiting");
    // Dropping the runtime cancels the waiting floods; nobody is left in line.
    drop(rt);
    let waiting: u64 = staged.stage().collect().objects.iter().map(|o| o.stats.waiting).sum();
    assert_eq!(waiting, 0);
    // Only admitted requests were counted: the cancelled ones were not.
    let admitted = staged.stage().collect().channel("flood_heavy").unwrap().ops;
    assert!(admitted < 100 && admitted >= (100 - still_waiting) as u64, "{admitted} admitted");
}

#[test]
fn close_fails_a_tenant_held_at_rate_0_drains_the_rest_and_closes_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let frozen = tenant("frozen_tenant");
    let db = {
        let staged = open(&dir);
        apply(&staged, &tenant_rules("frozen_tenant", "\"put\", \"get\"", "{ kind = \"drl\", rate = \"0ops/s\" }"));
        AsyncDb::new(staged)
    };
    let rt = runtime(2);
    let (acked, report, waiter, after) = rt.block_on(async {
        // A writer whose every put is synced and acknowledged.
        let writer = {
            let db = db.clone();
            tokio::spawn(async move {
                let mut acked = Vec::new();
                for i in 0..100_000u32 {
                    match db.put(format!("w{i:06}").into_bytes(), vec![b'x'; 100]).await {
                        Ok(()) => acked.push(i),
                        Err(e) => return (acked, e.kind()),
                    }
                }
                (acked, std::io::ErrorKind::Other)
            })
        };
        // A tenant at rate 0: it waits for good.
        let waiter = {
            let db = db.clone();
            tokio::spawn(kv_async::scope(frozen, async move { db.put(b"frozen".to_vec(), b"never".to_vec()).await }))
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let report = db.close(Duration::from_secs(5)).await.unwrap();
        eprintln!("close took {:?}: {report:?}", started.elapsed());
        assert!(started.elapsed() < Duration::from_secs(5), "close waited its whole grace");
        let (acked, stopped) = writer.await.unwrap();
        assert_eq!(stopped, std::io::ErrorKind::ConnectionAborted, "the writer stopped with {stopped:?}");
        let waiter = waiter.await.unwrap();
        let after = db.get(b"w000000".to_vec()).await;
        // The first report counted the refusals made before it returned; the
        // waiter's and the writer's may land just after. Once both have
        // returned, a second close reports them all.
        let again = db.close(Duration::from_secs(1)).await.unwrap();
        assert!(again.refused >= 3, "{again:?}");
        (acked, report, waiter, after)
    });
    assert_eq!(waiter.unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
    assert_eq!(after.unwrap_err().kind(), std::io::ErrorKind::ConnectionAborted);
    assert!(report.drained && report.db_closed, "{report:?}");
    assert!(acked.len() > 10, "only {} puts before the close", acked.len());
    assert!(db.db().is_none() && db.is_closed());
    // RocksDB is closed: plain RocksDB opens the directory (the lock is
    // free) and finds every acknowledged write, and not the frozen one.
    let plain = rocksdb::DB::open(&options(), &path).unwrap();
    for i in &acked {
        assert!(plain.get(format!("w{i:06}")).unwrap().is_some(), "acknowledged put w{i:06} lost");
    }
    assert_eq!(plain.get(b"frozen").unwrap(), None);
    eprintln!("{} acknowledged puts, all found after reopening", acked.len());
}
