//! The exporter's HTTP side: `GET` (or `HEAD`) `/metrics` is a scrape;
//! any other path is 404, any other method on `/metrics` is 405. There is
//! nothing else: no action endpoint, nothing that writes.
//!
//! Bounds, so that slow or many clients cannot exhaust it: at most
//! [`Limits::connections`] connections at once (one more is closed at
//! once), request headers within [`Limits::header_timeout`], and every
//! connection closed after [`Limits::lifetime`] whatever it does (a client
//! that never reads its answer included). HTTP/1.1 through hyper.
//!
//! A scrape never waits on the collector beyond the hub's short lock: the
//! picture is copied (at most once per [`Limits::max_age`], shared by the
//! scrapes in between) on a blocking thread, rendered there, and written
//! from an owned buffer.

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::exposition::{render, Format};
use crate::collect::{Hub, Snapshot};
use crate::model::ViewOptions;

/// The exporter's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Time a client has to send its request headers.
    pub header_timeout: Duration,
    /// Time after which a connection is closed, whatever it does.
    pub lifetime: Duration,
    /// How old a copied picture may be and still answer a scrape.
    pub max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 64,
            header_timeout: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
            max_age: Duration::from_millis(500),
        }
    }
}

/// What a scrape reads: the hub, copied at most once per `max_age`.
pub struct Metrics {
    hub: Arc<Hub>,
    host: String,
    max_age: Duration,
    last: Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

impl Metrics {
    pub fn new(hub: Arc<Hub>, host: String, max_age: Duration) -> Metrics {
        Metrics {
            hub,
            host,
            max_age,
            last: Mutex::new(None),
        }
    }

    /// The exposition now (blocking: takes the hub's lock to copy).
    pub fn scrape(&self, format: Format) -> String {
        let snap = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            match &*last {
                Some((at, s)) if at.elapsed() < self.max_age => s.clone(),
                _ => {
                    let s = Arc::new(self.hub.snapshot(&ViewOptions {
                        block_map: false,
                        recent_events: 0,
                        timeline: None,
                    }));
                    *last = Some((Instant::now(), s.clone()));
                    s
                }
            }
        };
        render(&snap, &self.host, format)
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one request.
async fn answer(metrics: Arc<Metrics>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the exporter serves GET /metrics only\n",
        );
    }
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed: /metrics is read with GET\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let format = Format::from_accept(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    let text = match tokio::task::spawn_blocking(move || metrics.scrape(format)).await {
        Ok(t) => t,
        Err(_) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the scrape failed: see the exporter's log\n",
            )
        }
    };
    let body = if head {
        Bytes::new()
    } else {
        Bytes::from(text)
    };
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}

/// Serves scrapes on `listener` until `stop` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.connections.max(1)));
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                // Out of file descriptors, say: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Past the bound, the newcomer is closed at once.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let m = metrics.clone();
                async move { Ok::<_, Infallible>(answer(m, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(limits.lifetime, conn).await;
            drop(slot);
        });
    }
}
