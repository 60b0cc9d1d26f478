//! `vramscope serve`: the collector running headless, its picture served as
//! Prometheus metrics on `--listen` (loopback by default: the labels name
//! users and processes). Read-only; see `crates/collect/src/serve/`.
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};

use vramscope_collect::serve::http::{serve, Limits, Metrics};
use vramscope_collect::Live;

use super::common::CollectFlags;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Address to serve /metrics on. Give 0.0.0.0:PORT (or a host's address)
    /// only where whoever can reach it may read user and process names.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9420")]
    listen: SocketAddr,
    /// The `host` label of every series [default: this machine's hostname].
    #[arg(long, value_name = "NAME")]
    host: Option<String>,
    /// Run the live advisor on every instrumented process (its best setting
    /// and saving as vramscope_process_advice_* series), within 5 % of one
    /// core; a process that starts after `serve` is advised from its start.
    #[arg(long)]
    advise: bool,
    #[command(flatten)]
    collect: CollectFlags,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let listener = std::net::TcpListener::bind(args.listen)
        .with_context(|| format!("--listen {}: cannot listen there", args.listen))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let host = match args.host {
        Some(h) => vramscope_text::printable(&h),
        None => vramscope_collect::serve::hostname(),
    };
    let live = Live::start(args.collect.config()).context("starting the collector")?;
    let share = Some(vramscope_collect::ADVISOR_CPU_SHARE);
    if args.advise {
        live.hub().enable_advisor(true, true, share);
    } else {
        // A job heading for its limit: its forecast by simulation.
        live.hub().advise_forecasts(true, share);
    }
    let limits = Limits::default();
    let metrics = Arc::new(Metrics::new(live.hub().clone(), host, limits.max_age));
    let stop = Arc::new(tokio::sync::Notify::new());
    live.on_signal({
        let stop = stop.clone();
        move || stop.notify_one()
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .thread_name("vramscope-serve")
        .build()
        .context("starting the exporter's runtime")?;
    super::out::line(&format!("serving metrics on http://{addr}/metrics"))?;
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        serve(
            listener,
            metrics,
            limits,
            async move { stop.notified().await },
        )
        .await;
        anyhow::Ok(())
    });
    // A scrape still taking its view is not waited for (dropping the
    // runtime would wait for it): stopped means stopped.
    rt.shutdown_timeout(STOP_WAIT);
    served
}

/// How long a stopping exporter waits for the scrapes it is answering.
const STOP_WAIT: std::time::Duration = std::time::Duration::from_millis(200);
