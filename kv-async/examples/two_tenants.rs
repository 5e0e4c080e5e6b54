//! A small tokio service with two tenants: a line protocol over TCP on
//! loopback, each connection naming its tenant, every request served
//! through an `AsyncDb` whose stage gives each tenant its own limit.
//!
//! The example also runs its own clients, and stops by itself: a light
//! tenant sends 100 requests/s on one connection for the whole run; after
//! a third of it, a heavy tenant floods on 32 connections, far over its
//! 500 ops/s limit. Every second it prints the light tenant's p99 and the
//! heavy tenant's throughput: the light p99 stays flat when the flood
//! starts, because the heavy tenant's requests wait as futures in its own
//! limiter and the two worker threads keep serving.
//!
//! ```sh
//! cargo run --release -p kv-async --example two_tenants -- --duration 9s
//! ```
//!
//! Protocol (one line each): the first line is the tenant's name; then
//! `GET key`, `PUT key value` or `DEL key`; the answer is `OK`, `VALUE v`,
//! `NOTFOUND` or `ERR message`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use kv_async::AsyncDb;
use kv_stage::{RequestContext, RuleSet, RulesFormat};
use rocks_env::StagedDb;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
struct Args {
    /// How long the clients run (e.g. 9s).
    #[arg(long, default_value = "9s", value_parser = kv_stage::units::parse_duration)]
    duration: Duration,
}

const RULES: &str = r#"
version = 1
[[rules]]
op = "create_channel"
channel = "heavy"
match = { context = "heavy", type = ["get", "put", "delete"] }
[[rules]]
op = "create_object"
channel = "heavy"
object = "limit"
spec = { kind = "drl", rate = "500ops/s" }
[[rules]]
op = "create_channel"
channel = "light"
match = { context = "light", type = ["get", "put", "delete"] }
[[rules]]
op = "create_object"
channel = "light"
object = "limit"
spec = { kind = "drl", rate = "2000ops/s" }
"#;

/// Serves one connection: its first line names the tenant, whose context
/// the rest of the connection runs in.
async fn serve(db: AsyncDb, stream: TcpStream) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let Some(name) = lines.next_line().await? else { return Ok(()) };
    let tenant = match RequestContext::register(name.trim()) {
        Ok(t) => t,
        Err(e) => return write.write_all(format!("ERR tenant: {e}\n").as_bytes()).await,
    };
    kv_async::scope(tenant, async move {
        while let Some(line) = lines.next_line().await? {
            let mut words = line.splitn(3, ' ');
            let answer = match (words.next(), words.next(), words.next()) {
                (Some("GET"), Some(k), None) => match db.get(k.as_bytes().to_vec()).await {
                    Ok(Some(v)) => format!("VALUE {}\n", String::from_utf8_lossy(&v)),
                    Ok(None) => "NOTFOUND\n".to_owned(),
                    Err(e) => format!("ERR {e}\n"),
                },
                (Some("PUT"), Some(k), Some(v)) => match db.put(k.as_bytes().to_vec(), v.as_bytes().to_vec()).await {
                    Ok(()) => "OK\n".to_owned(),
                    Err(e) => format!("ERR {e}\n"),
                },
                (Some("DEL"), Some(k), None) => match db.delete(k.as_bytes().to_vec()).await {
                    Ok(()) => "OK\n".to_owned(),
                    Err(e) => format!("ERR {e}\n"),
                },
                _ => format!("ERR cannot read '{line}': GET key, PUT key value or DEL key\n"),
            };
            write.write_all(answer.as_bytes()).await?;
        }
        Ok(())
    })
    .await
}

/// A client connection: names its tenant, then sends requests one at a
/// time, each answered before the next.
struct Client {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

impl Client {
    async fn connect(addr: std::net::SocketAddr, tenant: &str) -> std::io::Result<Client> {
        let (read, mut write) = TcpStream::connect(addr).await?.into_split();
        write.write_all(format!("{tenant}\n").as_bytes()).await?;
        Ok(Client { lines: BufReader::new(read).lines(), write })
    }

    async fn call(&mut self, request: &str) -> std::io::Result<String> {
        self.write.write_all(request.as_bytes()).await?;
        self.lines.next_line().await?.ok_or_else(|| std::io::Error::other("the server closed the connection"))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    let staged = Arc::new(StagedDb::open(opts, dir.path().join("db"))?);
    // The tenants' contexts, named in the rules.
    RequestContext::register("heavy")?;
    RequestContext::register("light")?;
    staged.stage().apply(&RuleSet::parse(RULES, RulesFormat::Toml, None, &Default::default())?)?;
    let db = AsyncDb::builder(Arc::clone(&staged)).sync_writes(false).build();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        println!("serving on {addr} (2 worker threads); heavy limited to 500 ops/s, light to 2000 ops/s");
        let server = {
            let db = db.clone();
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve(db.clone(), stream));
                }
            })
        };
        let stop = Arc::new(AtomicBool::new(false));
        let heavy_ops = Arc::new(AtomicU64::new(0));
        let light_lat = Arc::new(std::sync::Mutex::new(Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?));
        let start = Instant::now();

        // The light tenant: 100 requests/s, latency from each one's scheduled time.
        let light = {
            let (stop, lat) = (Arc::clone(&stop), Arc::clone(&light_lat));
            tokio::spawn(async move {
                let mut c = Client::connect(addr, "light").await?;
                let mut next = tokio::time::Instant::now();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep_until(next).await;
                    let req =
                        if i.is_multiple_of(2) { format!("PUT l{i} v{i}\n") } else { format!("GET l{}\n", i - 1) };
                    let answer = c.call(&req).await?;
                    if answer.starts_with("ERR") {
                        return Err(std::io::Error::other(answer));
                    }
                    lat.lock().unwrap_or_else(|e| e.into_inner()).saturating_record(next.elapsed().as_micros() as u64);
                    next += Duration::from_millis(10);
                    i += 1;
                }
                Ok::<_, std::io::Error>(())
            })
        };
        // The heavy tenant: 32 connections as fast as they are answered,
        // from a third of the run on.
        let flood_at = args.duration / 3;
        let heavy: Vec<_> = (0..32)
            .map(|c| {
                let (stop, ops) = (Arc::clone(&stop), Arc::clone(&heavy_ops));
                tokio::spawn(async move {
                    tokio::time::sleep(flood_at).await;
                    let mut client = Client::connect(addr, "heavy").await?;
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        client.call(&format!("PUT h{c}-{i} x\n")).await?;
                        ops.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                    Ok::<_, std::io::Error>(())
                })
            })
            .collect();

        println!("{:>4}  {:>14}  {:>12}", "s", "light p99 ms", "heavy ops/s");
        let mut last_heavy = 0;
        for s in 1..=args.duration.as_secs().max(1) {
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + Duration::from_secs(s))).await;
            let p99 = {
                let mut h = light_lat.lock().unwrap_or_else(|e| e.into_inner());
                let p = h.value_at_quantile(0.99);
                h.reset();
                p
            };
            let heavy_now = heavy_ops.load(Ordering::Relaxed);
            println!(
                "{s:>4}  {:>14.2}  {:>12}{}",
                p99 as f64 / 1000.0,
                heavy_now - last_heavy,
                if Duration::from_secs(s) > flood_at { "   (flooding)" } else { "" }
            );
            last_heavy = heavy_now;
        }
        stop.store(true, Ordering::Relaxed);
        light.await??;
        // The heavy clients may be waiting in their limiter: lift it so
        // they see the stop, and wait for them.
        staged.stage().configure("heavy", "limit", kv_stage::ObjectChange::rate(kv_stage::units::Rate::UNLIMITED))?;
        for h in heavy {
            h.await??;
        }
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    Ok(())
}
