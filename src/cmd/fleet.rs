//! `vramscope fleet --prometheus URL`: every node, GPU and instrumented job
//! that a Prometheus scrapes from `vramscope serve` exporters, in the
//! terminal. The view runs in the dashboard's shell (`ui::shell`: one loop
//! on this thread, keys, answers and signals through one channel, a frame
//! only when something changed) with the dashboard's keys, help and
//! legend; the queries run on a small runtime of their own thread, and
//! answers are read and the fleet built on its blocking threads, so that
//! neither holds up the signals it forwards. `ui::fleet::app` decides, the
//! pane (`ui::fleet`) draws.
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};

use vramscope_collect::fleet::model::{queries, series_queries, Fleet};
use vramscope_collect::fleet::prom::{Client, Endpoint};
use vramscope_collect::fleet::view::{FleetView, ProcSeries};
use vramscope_ui::fleet::{Ask, FleetApp, FleetEvent};
use vramscope_ui::{Shell, ShellOptions};

use super::value::{Millis, Seconds};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Prometheus's address, e.g. http://prometheus:9090 (plain http).
    #[arg(long, value_name = "URL")]
    prometheus: String,
    /// The Prometheus job whose targets are vramscope exporters.
    #[arg(long, value_name = "NAME", default_value = "vramscope")]
    job: String,
    /// Milliseconds between refreshes (at least 500).
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "5000",
        value_name = "MS"
    )]
    refresh: Millis<500>,
    /// Seconds of history in a process's chart.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "900",
        value_name = "SECS"
    )]
    range: Seconds,
    /// ASCII only: no braille, box-drawing or block glyphs.
    #[arg(long)]
    ascii: bool,
    /// No colours (also when NO_COLOR is set).
    #[arg(long)]
    no_color: bool,
}

/// Longest a query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn run(args: Args) -> Result<()> {
    let endpoint =
        Endpoint::parse(&args.prometheus).map_err(|e| anyhow::anyhow!("--prometheus {e}"))?;
    let view = FleetView::new(endpoint.url().to_string());
    let client = Client::new(endpoint, QUERY_TIMEOUT);
    let shell = Shell::new(ShellOptions {
        mouse: false,
        monochrome: args.no_color,
        ascii: args.ascii,
        ..ShellOptions::default()
    });
    let (ask_tx, ask_rx) = tokio::sync::mpsc::unbounded_channel::<Ask>();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("vramscope-fleet")
        .build()
        .context("starting the query runtime")?;
    {
        let _g = rt.enter();
        vramscope_collect::signals::forward(shell.signal());
    }
    rt.spawn(fetch(
        client,
        args.job.clone(),
        args.refresh.duration(),
        args.range.secs(),
        ask_rx,
        shell.sender(),
    ));
    let app = FleetApp::new(view, shell.options().theme());
    let ran = vramscope_ui::fleet::run::run(shell, app, move |ask| {
        let _ = ask_tx.send(ask);
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    ran
}

/// The query side: a refresh every `period` (and on request), a process's
/// series on request; answers go to the loop.
async fn fetch(
    client: Client,
    job: String,
    period: Duration,
    range_s: f64,
    mut asks: tokio::sync::mpsc::UnboundedReceiver<Ask>,
    tx: mpsc::Sender<FleetEvent>,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ask = tokio::select! {
            _ = tick.tick() => Ask::Refresh,
            a = asks.recv() => match a {
                Some(a) => a,
                None => return,
            },
        };
        let msg = match ask {
            Ask::Refresh => FleetEvent::Fleet(refresh(&client, &job).await),
            Ask::Series { instance, pid } => {
                let result = series(&client, &job, &instance, &pid, range_s).await;
                FleetEvent::Series {
                    instance,
                    pid,
                    result,
                }
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
}

/// One refresh: the three instant queries, at once, then the fleet built
/// on a blocking thread (the runtime's worker stays free for signals).
async fn refresh(client: &Client, job: &str) -> Result<Fleet, String> {
    let [up, figures, rates] = queries(job);
    let (up, figures, rates) = tokio::join!(
        client.query(&up),
        client.query(&figures),
        client.query(&rates)
    );
    let (up, figures, rates) = (up?, figures?, rates?);
    tokio::task::spawn_blocking(move || Fleet::build(&up, &figures, &rates))
        .await
        .map_err(|e| format!("building the fleet failed: {e}"))
}

async fn series(
    client: &Client,
    job: &str,
    instance: &str,
    pid: &str,
    range_s: f64,
) -> Result<ProcSeries, String> {
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let start = end - range_s;
    // About 240 points whatever the range (a chart is not wider).
    let step = (range_s / 240.0).max(1.0);
    let [alloc, resv] = series_queries(job, instance, pid);
    let (a, r) = tokio::join!(
        client.query_range(&alloc, start, end, step),
        client.query_range(&resv, start, end, step)
    );
    let first = |s: Vec<vramscope_collect::fleet::prom::Series>| {
        s.into_iter().next().map(|s| s.points).unwrap_or_default()
    };
    Ok(ProcSeries {
        instance: instance.to_string(),
        pid: pid.to_string(),
        allocated: first(a?),
        reserved: first(r?),
    })
}
