//! The exporter's HTTP side: `GET` (or `HEAD`) `/metrics` is a scrape;
//! any other path is 404, any other method on `/metrics` is 405. There is
//! nothing else: no action endpoint, nothing that writes.
//!
//! Bounds, so that slow or many clients cannot exhaust it nor keep a
//! scrape out:
//!
//! - at most [`Limits::connections`] connections at once. A newcomer that
//!   finds every slot taken takes the slot of the connection that has
//!   waited longest for a request (it never sent a complete one, or sits
//!   idle between two), chosen among those of the peer address holding the
//!   most connections; that one is closed. Only when every connection is
//!   in the middle of a scrape is the newcomer closed at once. So a client
//!   holding hundreds of idle connections (from any address, this
//!   machine's included) delays no scrape: each scrape takes one of its
//!   slots, and a scraper's request, sent as soon as it connects, is read
//!   before the next connection is accepted.
//! - request headers complete within [`Limits::header_timeout`] of the
//!   connection's start or of its previous answer (a deadline for the whole
//!   headers: a client sending one byte a second is closed by it too);
//! - every connection closed after [`Limits::lifetime`] whatever it does
//!   (a client that never reads its answer included).
//!
//! HTTP/1.1 through hyper.
//!
//! A scrape never waits on the collector beyond the hub's short lock: the
//! picture is copied (at most once per [`Limits::max_age`], shared by the
//! scrapes in between) on a blocking thread, rendered there, and written
//! from an owned buffer.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::exposition::{render, Format};
use crate::hub::Hub;
use crate::state::Snapshot;
use vramscope_core::model::ViewOptions;

/// The exporter's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once (see the module's doc for a newcomer past
    /// it).
    pub(crate) connections: usize,
    /// Time a client has to send its request headers.
    pub(crate) header_timeout: Duration,
    /// Time after which a connection is closed, whatever it does.
    pub(crate) lifetime: Duration,
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
    pub(crate) fn scrape(&self, format: Format) -> String {
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

/// One open connection, as [`Slots`] sees it.
struct Conn {
    id: u64,
    peer: IpAddr,
    /// Answering a request (not to be closed for a newcomer).
    busy: bool,
    /// Since when it has waited for a request: its start, or its last
    /// answer.
    waiting_since: Instant,
    /// Dropping it closes the connection.
    _close: oneshot::Sender<()>,
}

/// The open connections, at most `max`.
struct Slots {
    max: usize,
    next_id: u64,
    open: Vec<Conn>,
}

impl Slots {
    fn new(max: usize) -> Slots {
        Slots {
            max: max.max(1),
            next_id: 0,
            open: Vec::new(),
        }
    }

    /// A slot for a newcomer from `peer`: its id and what completes when it
    /// must close; None when every connection is answering a request.
    /// When every slot is taken, the connection that has waited longest for
    /// a request, among those of the peer holding the most, is closed.
    fn admit(&mut self, peer: IpAddr) -> Option<(u64, oneshot::Receiver<()>)> {
        if self.open.len() >= self.max {
            let held = |ip: IpAddr| self.open.iter().filter(|c| c.peer == ip).count();
            let victim = (self.open.iter().enumerate())
                .filter(|(_, c)| !c.busy)
                .max_by_key(|(_, c)| (held(c.peer), std::cmp::Reverse(c.waiting_since)))
                .map(|(i, _)| i)?;
            // Dropping its sender closes it.
            self.open.swap_remove(victim);
        }
        let (tx, rx) = oneshot::channel();
        self.next_id += 1;
        self.open.push(Conn {
            id: self.next_id,
            peer,
            busy: false,
            waiting_since: Instant::now(),
            _close: tx,
        });
        Some((self.next_id, rx))
    }

    /// Connection `id` started (true) or finished (false) answering.
    fn busy(&mut self, id: u64, busy: bool) {
        if let Some(c) = self.open.iter_mut().find(|c| c.id == id) {
            c.busy = busy;
            c.waiting_since = Instant::now();
        }
    }

    fn close(&mut self, id: u64) {
        self.open.retain(|c| c.id != id);
    }
}

fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(|p| p.into_inner())
}

/// Gives connection `id`'s slot back when dropped.
struct Held(Arc<Mutex<Slots>>, u64);

impl Drop for Held {
    fn drop(&mut self) {
        lock(&self.0).close(self.1);
    }
}

/// Serves scrapes on `listener` until `stop` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Mutex::new(Slots::new(limits.connections)));
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok((s, a)) => (s, a.ip()),
                // Out of file descriptors, say: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Every connection answering: the newcomer is closed at once.
        let Some((id, closed)) = lock(&slots).admit(peer) else {
            drop(stream);
            continue;
        };
        let held = Held(slots.clone(), id);
        let _ = stream.set_nodelay(true);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let m = metrics.clone();
                let slots = held.0.clone();
                async move {
                    lock(&slots).busy(id, true);
                    let r = answer(m, req).await;
                    lock(&slots).busy(id, false);
                    Ok::<_, Infallible>(r)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                _ = conn => {}
                _ = closed => {}
                _ = tokio::time::sleep(limits.lifetime) => {}
            }
        });
        // The newcomer's request, already sent, is read before the next
        // accept (else a burst of connections could take its slot first).
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the bound, a newcomer closes the connection that has waited
    /// longest, from the peer holding the most; never one answering.
    #[test]
    fn a_newcomer_takes_the_slot_of_the_longest_idle_one() {
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut s = Slots::new(4);
        let (b1, mut b1_closed) = s.admit(b).unwrap();
        let (a1, mut a1_closed) = s.admit(a).unwrap();
        let (_, mut a2_closed) = s.admit(a).unwrap();
        let (a3, _) = s.admit(a).unwrap();
        s.busy(a1, true);
        // a holds 3 of 4: its longest waiting one that is not answering (a2)
        // goes, though b's has waited longer.
        let (_, _) = s.admit(b).unwrap();
        assert!(a2_closed
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Closed));
        assert_eq!(
            b1_closed.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        assert_eq!(
            a1_closed.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        );
        // a and b hold 2 each now: the longest waiting of all, b1.
        s.admit(a).unwrap();
        assert_eq!(
            b1_closed.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        );
        assert_eq!(s.open.len(), 4);
        // Every one answering: the newcomer is refused.
        let ids: Vec<u64> = s.open.iter().map(|c| c.id).collect();
        for id in ids {
            s.busy(id, true);
        }
        assert!(s.admit(b).is_none());
        // A connection that ends gives its slot back.
        s.close(a3);
        s.close(b1);
        assert_eq!(s.open.len(), 3);
        assert!(s.admit(b).is_some());
    }
}
