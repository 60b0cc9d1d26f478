//! Signals: SIGINT, SIGTERM and SIGHUP either call a function each time
//! ([`forward`], [`forward_on_own_thread`]: the dashboard turns that into
//! an event on its channel, `serve` into its end) or end a wait
//! ([`stopped`], `record`).
//!
//! A runtime hears a signal only while its thread polls it. The
//! collector's thread waits on the hub's lock while a view is taken, so
//! [`crate::collector::Live`] hears signals on a thread of its own
//! ([`forward_on_own_thread`]): a long view never holds one back (issue
//! 44: `serve` ignored SIGTERM for as long as its views took).

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

/// [`forward`] on a thread of its own, with a runtime of its own that does
/// nothing else: the signals are heard whatever the caller's threads wait
/// on. The handlers are installed before it returns; the thread lives as
/// long as the process.
pub(crate) fn forward_on_own_thread(f: impl Fn() + Send + Sync + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let streams: Vec<Signal> = {
        let _in = rt.enter();
        STOPPING.iter().filter_map(|k| signal(k()).ok()).collect()
    };
    let f = std::sync::Arc::new(f);
    std::thread::Builder::new()
        .name("vramscope-signals".into())
        .spawn(move || {
            rt.block_on(async move {
                let heard: Vec<_> = streams
                    .into_iter()
                    .map(|mut s| {
                        let f = f.clone();
                        tokio::spawn(async move {
                            while s.recv().await.is_some() {
                                f();
                            }
                        })
                    })
                    .collect();
                for h in heard {
                    let _ = h.await;
                }
            })
        })?;
    Ok(())
}
