//! Signals, through the collector's tokio runtime (no signal threads of our
//! own): SIGINT, SIGTERM and SIGHUP either call a function each time
//! ([`forward`], the dashboard turns that into an event on its channel) or
//! end a wait ([`stopped`], `record`).

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The signals that end a run.
const STOPPING: [fn() -> SignalKind; 3] = [
    SignalKind::interrupt,
    SignalKind::terminate,
    SignalKind::hangup,
];

/// Completes at the first SIGINT, SIGTERM or SIGHUP. Must be polled inside a
/// tokio runtime; a signal whose handler cannot be installed is not waited on.
pub async fn stopped() {
    let [mut int, mut term, mut hup] = STOPPING.map(|k| signal(k()).ok());
    tokio::select! {
        _ = next(&mut int) => {}
        _ = next(&mut term) => {}
        _ = next(&mut hup) => {}
    }
}

async fn next(s: &mut Option<Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Calls `f` on every SIGINT, SIGTERM and SIGHUP from now on. Call inside a
/// runtime context (`Runtime::enter`).
pub fn forward(f: impl Fn() + Send + Sync + 'static) {
    let f = std::sync::Arc::new(f);
    for kind in STOPPING {
        let Ok(mut stream) = signal(kind()) else {
            continue;
        };
        let f = f.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                f();
            }
        });
    }
}
