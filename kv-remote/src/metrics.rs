//! `/metrics` over HTTP: what a stage agent and `kvsds-controller` serve to
//! Prometheus.
//!
//! [`MetricsServer`] answers `GET /metrics` with a registry's metrics in the
//! Prometheus text format (0.0.4), read at the moment of the scrape, on an
//! address of its own: loopback unless remote scrapers are explicitly
//! allowed, since the metrics name every channel, tenant and rate. It runs
//! on a thread of its own and stops when dropped.
//!
//! ```
//! use std::sync::Arc;
//! use kv_remote::metrics::MetricsServer;
//! use kv_stage::metrics::StageMetrics;
//! use prometheus_client::registry::Registry;
//!
//! let stage = Arc::new(kv_stage::Stage::new("db"));
//! let stages = StageMetrics::new();
//! stages.add(&stage);
//! let mut registry = Registry::default();
//! registry.register_collector(Box::new(stages));
//! let server = MetricsServer::serve("127.0.0.1:0".parse().unwrap(), false, Arc::new(registry)).unwrap();
//! println!("scrape http://{}/metrics", server.local_addr());
//! // A non-loopback address is refused unless allowed.
//! assert!(MetricsServer::serve("0.0.0.0:0".parse().unwrap(), false, Arc::new(Registry::default())).is_err());
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use kv_stage::metrics::{TEXT_CONTENT_TYPE, encode_text};
use prometheus_client::registry::Registry;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// Longest a scrape connection stays open (Prometheus keeps connections
/// alive between scrapes; an idle one past this is closed).
const CONNECTION_LIMIT: Duration = Duration::from_secs(120);
/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 16;

/// Serves one registry at `/metrics` (see the module documentation).
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    scrapes: Arc<AtomicU64>,
}

impl MetricsServer {
    /// Listens on `addr` (port 0: one the system picks, see
    /// [`local_addr`](Self::local_addr)). An address that is not loopback
    /// is refused unless `allow_remote`.
    pub fn serve(addr: SocketAddr, allow_remote: bool, registry: Arc<Registry>) -> Result<MetricsServer> {
        if !addr.ip().is_loopback() && !allow_remote {
            return Err(Error::Metrics(format!(
                "{addr} is not a loopback address: serving metrics there needs metrics_allow_remote (they name every \
                 channel, tenant and rate)"
            )));
        }
        let listener = std::net::TcpListener::bind(addr).map_err(|e| Error::Metrics(format!("{addr}: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| Error::Metrics(format!("{addr}: {e}")))?;
        let local = listener.local_addr().map_err(|e| Error::Metrics(format!("{addr}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Metrics(format!("runtime: {e}")))?;
        let (tx, rx) = oneshot::channel();
        let scrapes = Arc::new(AtomicU64::new(0));
        let counted = Arc::clone(&scrapes);
        let thread = std::thread::Builder::new()
            .name("kvsds-metrics".into())
            .spawn(move || runtime.block_on(accept_loop(listener, registry, counted, rx)))
            .map_err(|e| Error::Metrics(format!("thread: {e}")))?;
        tracing::info!(addr = %local, "serving metrics at /metrics");
        Ok(MetricsServer { addr: local, stop: Some(tx), thread: Some(thread), scrapes })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Scrapes answered so far.
    pub fn scrapes(&self) -> u64 {
        self.scrapes.load(Ordering::Relaxed)
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    listener: std::net::TcpListener,
    registry: Arc<Registry>,
    scrapes: Arc<AtomicU64>,
    mut stop: oneshot::Receiver<()>,
) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else { return };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            _ = &mut stop => break,
            p = Arc::clone(&slots).acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let stream = tokio::select! {
            _ = &mut stop => break,
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let registry = Arc::clone(&registry);
        let scrapes = Arc::clone(&scrapes);
        tasks.spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let r = respond(&registry, &req, &scrapes);
                async move { Ok::<_, Infallible>(r) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIMIT, conn).await;
        });
        // Reap finished connections so the set does not grow.
        while tasks.try_join_next().is_some() {}
    }
    tasks.abort_all();
}

fn respond(registry: &Registry, req: &Request<hyper::body::Incoming>, scrapes: &AtomicU64) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, body: String, kind: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(kind));
        r
    };
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            scrapes.fetch_add(1, Ordering::Relaxed);
            reply(StatusCode::OK, encode_text(registry), TEXT_CONTENT_TYPE)
        }
        (_, "/metrics") => reply(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into(), "text/plain"),
        _ => reply(StatusCode::NOT_FOUND, "metrics are at /metrics\n".into(), "text/plain"),
    }
}
