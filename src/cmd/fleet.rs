//! `vramscope fleet --prometheus URL`: every node, GPU and instrumented job
//! that a Prometheus scrapes from `vramscope serve` exporters, in the
//! terminal. One loop on this thread (keys, answers, signals through one
//! channel, a frame only when something changed); the queries run on a
//! small runtime of their own thread, and answers are read and the fleet
//! built on its blocking threads, so that neither holds up the signals it
//! forwards; [`FleetView`] decides, the pane (`ui::fleet`) draws.
use std::io::{self, BufWriter};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{Context, Result};
use crossterm::event::Event;
use crossterm::terminal::{BeginSynchronizedUpdate, EndSynchronizedUpdate};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use vramscope::fleet::model::{queries, series_queries, Fleet};
use vramscope::fleet::prom::{Client, Endpoint};
use vramscope::fleet::view::{Action, FleetView, ProcSeries};
use vramscope::ui::theme::Theme;

use super::value::{Millis, Seconds};

#[derive(Debug, clap::Args)]
pub struct Args {
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

enum Msg {
    Input(Event),
    Fleet(Result<Fleet, String>),
    Series {
        instance: String,
        pid: String,
        result: Result<ProcSeries, String>,
    },
    Quit,
}

enum Ask {
    Refresh,
    Series { instance: String, pid: String },
}

/// Longest a query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

pub fn run(args: Args) -> Result<()> {
    let endpoint =
        Endpoint::parse(&args.prometheus).map_err(|e| anyhow::anyhow!("--prometheus {e}"))?;
    let mut view = FleetView::new(endpoint.url().to_string());
    let client = Client::new(endpoint, QUERY_TIMEOUT);
    let (tx, rx) = mpsc::channel::<Msg>();
    let (ask_tx, ask_rx) = tokio::sync::mpsc::unbounded_channel::<Ask>();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .thread_name("vramscope-fleet")
        .build()
        .context("starting the query runtime")?;
    {
        let _g = rt.enter();
        let tx = tx.clone();
        vramscope::collect::signals::forward(move || {
            let _ = tx.send(Msg::Quit);
        });
    }
    rt.spawn(fetch(
        client,
        args.job.clone(),
        args.refresh.duration(),
        args.range.secs(),
        ask_rx,
        tx.clone(),
    ));
    let color = !args.no_color && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let theme = Theme::new(color, args.ascii);
    let _guard = vramscope::ui::terminal::enter(false).context("setting up the terminal")?;
    let out = BufWriter::with_capacity(1 << 16, io::stdout());
    let mut term = Terminal::new(CrosstermBackend::new(out)).context("creating the terminal")?;
    let input = tx.clone();
    std::thread::Builder::new()
        .name("vramscope-input".into())
        .spawn(move || {
            while let Ok(ev) = crossterm::event::read() {
                if input.send(Msg::Input(ev)).is_err() {
                    break;
                }
            }
        })
        .context("starting the input thread")?;
    drop(tx);
    let mut dirty = true;
    loop {
        if dirty {
            crossterm::queue!(term.backend_mut(), BeginSynchronizedUpdate)?;
            term.draw(|f| vramscope::ui::fleet::render(f, &view, &theme))?;
            crossterm::execute!(term.backend_mut(), EndSynchronizedUpdate)?;
            dirty = false;
        }
        // Everything queued, then one frame.
        let Ok(first) = rx.recv() else { break };
        let mut quit = false;
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            let action = match msg {
                Msg::Input(Event::Key(k)) => view.key(k),
                Msg::Input(Event::Resize(..)) => Action::Redraw,
                Msg::Input(_) => Action::Nothing,
                Msg::Fleet(r) => view.refreshed(r),
                Msg::Series {
                    instance,
                    pid,
                    result,
                } => {
                    view.series_loaded(result, &instance, &pid);
                    Action::Redraw
                }
                Msg::Quit => Action::Quit,
            };
            match action {
                Action::Nothing => {}
                Action::Redraw => dirty = true,
                Action::Refresh => {
                    let _ = ask_tx.send(Ask::Refresh);
                }
                Action::LoadSeries { instance, pid } => {
                    dirty = true;
                    let _ = ask_tx.send(Ask::Series { instance, pid });
                }
                Action::Quit => quit = true,
            }
        }
        if quit {
            break;
        }
    }
    drop(term);
    rt.shutdown_timeout(Duration::from_millis(100));
    Ok(())
}

/// The query side: a refresh every `period` (and on request), a process's
/// series on request; answers go to the loop.
async fn fetch(
    client: Client,
    job: String,
    period: Duration,
    range_s: f64,
    mut asks: tokio::sync::mpsc::UnboundedReceiver<Ask>,
    tx: mpsc::Sender<Msg>,
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
            Ask::Refresh => Msg::Fleet(refresh(&client, &job).await),
            Ask::Series { instance, pid } => {
                let result = series(&client, &job, &instance, &pid, range_s).await;
                Msg::Series {
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
    let first = |s: Vec<vramscope::fleet::prom::Series>| {
        s.into_iter().next().map(|s| s.points).unwrap_or_default()
    };
    Ok(ProcSeries {
        instance: instance.to_string(),
        pid: pid.to_string(),
        allocated: first(a?),
        reserved: first(r?),
    })
}
