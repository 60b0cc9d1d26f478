//! The dashboard: a ratatui view of the hub's snapshots.
//!
//! One loop, one channel. Input (a crossterm reader thread), hub changes
//! (`Hub::on_change`, coalesced so at most one is queued), signals (a
//! signal-hook thread), command answers (one thread per command) and the
//! slow tick all arrive as [`AppEvent`]s. The loop drains everything queued,
//! lets the pure [`App`] state machine turn each event into state and
//! [`Effect`]s, takes at most one snapshot (snapshot-then-render: the hub's
//! lock is never held while drawing), and draws at most one frame —
//! only when something changed, at least 10 ms after the previous one, and
//! bracketed by a synchronized update.
//!
//! ```text
//!  crossterm ─Input──┐
//!  Hub ─────Changed──┤                 ┌─ Refresh ─▶ hub.snapshot(view_options)
//!  signals ─Signal───┼─▶ mpsc ─▶ App::handle ─┼─ RunCommand ─▶ thread ─▶ CommandDone
//!  commands ─Done────┤                 └─ Screenshot, Demo…, Quit
//!  tick ─────────────┘          draw(frame, &App) ─▶ one pane file each
//! ```
//!
//! Panes, one file each, each `render(frame, area, &App)`: [`overview`],
//! [`process`] (with [`timeline`], [`blockmap`], [`stats`], [`events`],
//! [`diagnosis`]), [`bars`] (header, demo caption, footer), [`help`],
//! [`popup`]. [`layout`] places them; [`theme`] owns colours and glyphs;
//! [`svg`] writes screenshots; [`terminal`] sets up and restores the
//! terminal; [`fixtures`] builds deterministic snapshots for tests.

pub mod app;
pub mod bars;
pub mod blockmap;
pub mod diagnosis;
pub mod events;
pub mod fixtures;
pub mod format;
pub mod help;
pub mod keys;
pub mod layout;
pub mod overview;
pub mod popup;
pub mod process;
pub mod rows;
pub mod state;
pub mod stats;
pub mod svg;
pub mod terminal;
pub mod theme;
pub mod timeline;

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratatui::backend::{CrosstermBackend, TestBackend};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal};

pub use app::{App, AppConfig, AppEvent, CommandDone, Effect, Pane, Screen};
pub use theme::Theme;

use crate::collect::Hub;
use crate::demo::{DemoControl, DemoStatus};
use crate::model::ProcessKey;
use crate::ring::{monotonic_ns, Command, Outcome};

/// How the dashboard runs (the CLI fills this in).
#[derive(Clone)]
pub struct UiOptions {
    /// No actions: `e`, `r` and `s` do nothing and nothing is sent to any process.
    pub readonly: bool,
    /// No braille, box-drawing or block glyphs.
    pub ascii: bool,
    /// No colours (also when `NO_COLOR` is set and not empty).
    pub monochrome: bool,
    /// Report mouse clicks and the wheel (on by default).
    pub mouse: bool,
    /// The running demo, in `vramscope demo`.
    pub demo: Option<Arc<DemoControl>>,
    /// Where `S` writes screenshots (default: the current directory).
    pub screenshot_dir: Option<PathBuf>,
    /// Automation: write the frame shown `after` the start to `path` as SVG,
    /// then quit.
    pub screenshot: Option<ScreenshotAfter>,
    /// Open the process view of this pid at start (when it is visible).
    pub initial_process: Option<u32>,
    /// How long a command may wait for the process's answer.
    pub command_timeout: Duration,
    /// New data is drawn at most this often (input is answered at once).
    pub data_interval: Duration,
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions {
            readonly: false,
            ascii: false,
            monochrome: false,
            mouse: true,
            demo: None,
            screenshot_dir: None,
            screenshot: None,
            initial_process: None,
            command_timeout: Duration::from_secs(5),
            data_interval: Duration::from_millis(250),
        }
    }
}

/// Write one frame after a delay, then quit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenshotAfter {
    pub path: PathBuf,
    pub after: Duration,
}

/// `NO_COLOR` set to anything but the empty string (no-color.org).
pub fn no_color_env() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Sends commands to processes (the real one goes through the hub's rings).
pub trait CommandRunner: Send + Sync {
    fn run(&self, key: ProcessKey, command: Command) -> Result<Outcome, String>;
}

/// The real runner: `collect::command` with a timeout.
pub struct HubRunner {
    pub hub: Arc<Hub>,
    pub timeout: Duration,
}

impl CommandRunner for HubRunner {
    fn run(&self, key: ProcessKey, command: Command) -> Result<Outcome, String> {
        crate::collect::command(&self.hub, key, command, self.timeout).map_err(|e| e.to_string())
    }
}

/// What the dashboard reads from and changes in a running demo.
pub trait DemoHandle: Send + Sync {
    fn status(&self) -> DemoStatus;
    fn set_speed(&self, speed: f64);
    fn toggle_pause(&self);
}

impl DemoHandle for DemoControl {
    fn status(&self) -> DemoStatus {
        DemoControl::status(self)
    }
    fn set_speed(&self, speed: f64) {
        DemoControl::set_speed(self, speed)
    }
    fn toggle_pause(&self) {
        DemoControl::toggle_pause(self)
    }
}

/// Runs `command` on a thread of its own; the answer comes back as
/// `AppEvent::CommandDone` (the UI never blocks on a process).
pub fn spawn_command(
    runner: Arc<dyn CommandRunner>,
    tx: Sender<AppEvent>,
    key: ProcessKey,
    pid: u32,
    command: Command,
) {
    let spawned = std::thread::Builder::new()
        .name("vramscope-command".into())
        .spawn({
            let tx = tx.clone();
            move || {
                let result = runner.run(key, command);
                let _ = tx.send(AppEvent::CommandDone(CommandDone {
                    key,
                    pid,
                    command,
                    result,
                }));
            }
        });
    if let Err(e) = spawned {
        let _ = tx.send(AppEvent::CommandDone(CommandDone {
            key,
            pid,
            command,
            result: Err(format!("could not start a thread: {e}")),
        }));
    }
}

/// Draws the whole screen for `app`.
pub fn draw(frame: &mut Frame, app: &App) {
    let t = &app.config.theme;
    let areas = layout::screen(frame.area(), app.demo.is_some());
    bars::render_header(frame, areas.header, app);
    if let (Some(c), Some(d)) = (areas.caption, &app.demo) {
        bars::render_caption(frame, c, d, t);
    }
    match app.screen {
        Screen::Overview => overview::render(frame, areas.body, &app.snap, &app.overview, t),
        Screen::Process => process::render(frame, areas.body, app),
    }
    bars::render_footer(frame, areas.footer, app);
    if let Some(action) = &app.action {
        popup::render(frame, areas.body, action, t);
    }
    if app.help {
        help::render(frame, frame.area(), app.config.readonly, t);
    }
    if t.ascii {
        theme::asciify(frame.buffer_mut());
    }
}

/// Draws `app` at `width`×`height` into a buffer (tests, benches, screenshots).
pub fn render_buffer(app: &App, width: u16, height: u16) -> Buffer {
    let mut app = app.clone();
    app.size = Rect::new(0, 0, width, height);
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    terminal
        .draw(|f| draw(f, &app))
        .expect("drawing into a test backend")
        .buffer
        .clone()
}

/// Writes `buf` as SVG to `path`.
pub fn write_svg(buf: &Buffer, path: &Path) -> Result<()> {
    std::fs::write(path, svg::render(buf)).with_context(|| format!("writing {}", path.display()))
}

fn next_screenshot_path(dir: &Path, n: &mut u32) -> PathBuf {
    loop {
        *n += 1;
        let p = dir.join(format!("vramscope-{:03}.svg", *n));
        if !p.exists() {
            return p;
        }
    }
}

/// Runs the dashboard on the terminal until the user quits or a signal
/// arrives. The terminal is restored on every path out, panics included.
pub fn run(hub: Arc<Hub>, opts: UiOptions) -> Result<()> {
    let runner: Arc<dyn CommandRunner> = Arc::new(HubRunner {
        hub: hub.clone(),
        timeout: opts.command_timeout,
    });
    let demo: Option<Arc<dyn DemoHandle>> = opts.demo.clone().map(|d| d as Arc<dyn DemoHandle>);
    run_with(hub, runner, demo, opts)
}

/// [`run`] with the command runner and demo handle given.
pub fn run_with(
    hub: Arc<Hub>,
    runner: Arc<dyn CommandRunner>,
    demo: Option<Arc<dyn DemoHandle>>,
    opts: UiOptions,
) -> Result<()> {
    let (tx, rx) = mpsc::channel::<AppEvent>();

    // Hub changes, coalesced: at most one `Changed` in the queue.
    let pending = Arc::new(AtomicBool::new(false));
    {
        let tx = tx.clone();
        let pending = pending.clone();
        hub.on_change(move || {
            if !pending.swap(true, Ordering::AcqRel) {
                let _ = tx.send(AppEvent::Changed);
            }
        });
    }
    let signals = terminal::forward_signals(tx.clone()).context("installing signal handlers")?;

    let guard = terminal::enter(opts.mouse).context("setting up the terminal")?;
    let out = BufWriter::with_capacity(1 << 16, io::stdout());
    let mut term = Terminal::new(CrosstermBackend::new(out)).context("creating the terminal")?;

    // Input: a thread blocked in crossterm's reader.
    {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("vramscope-input".into())
            .spawn(move || {
                while let Ok(ev) = crossterm::event::read() {
                    if tx.send(AppEvent::Input(ev)).is_err() {
                        break;
                    }
                }
            })
            .context("starting the input thread")?;
    }

    let result = event_loop(
        &hub,
        &runner,
        demo.as_deref(),
        &opts,
        &tx,
        &rx,
        &pending,
        &mut term,
    );
    drop(term);
    drop(guard); // restores the terminal
    signals.close();
    result
}

#[allow(clippy::too_many_arguments)]
fn event_loop<W: Write>(
    hub: &Hub,
    runner: &Arc<dyn CommandRunner>,
    demo: Option<&dyn DemoHandle>,
    opts: &UiOptions,
    tx: &Sender<AppEvent>,
    rx: &mpsc::Receiver<AppEvent>,
    pending: &AtomicBool,
    term: &mut Terminal<CrosstermBackend<W>>,
) -> Result<()> {
    const MIN_FRAME: Duration = Duration::from_millis(10);
    let data_frame = opts.data_interval.max(MIN_FRAME);
    let theme = Theme::new(!(opts.monochrome || no_color_env()), opts.ascii);
    let mut app = App::new(AppConfig {
        readonly: opts.readonly,
        theme,
    });
    let size = term.size()?;
    app.size = Rect::new(0, 0, size.width, size.height);
    let take = |app: &mut App| {
        app.clock.now_ns = monotonic_ns();
        pending.store(false, Ordering::Release);
        let snap = hub.snapshot(&app.view_options());
        app.set_snapshot(snap);
        app.set_demo_status(demo.map(|d| d.status()));
    };
    take(&mut app);
    app.clock.changed_ns = app.clock.now_ns;
    // `--pid`: open its process view as soon as the collector sees it.
    let mut want_pid = opts.initial_process;
    let open_wanted = |app: &mut App, want: &mut Option<u32>| {
        if let Some(pid) = *want {
            if app.open_pid(pid) {
                *want = None;
                app.message = None;
                take(app);
            } else {
                app.message = Some(format!("waiting for pid {pid} to appear..."));
            }
        }
    };
    open_wanted(&mut app, &mut want_pid);
    let shots_dir = opts
        .screenshot_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("."));
    let started = Instant::now();
    let mut auto_shot = opts.screenshot.clone();
    let mut last_draw: Option<Instant> = None;
    let mut next_tick = Instant::now() + Duration::from_secs(1);
    let mut want_shot = false;
    let mut quit_after_shot = false;
    let mut shot_count = 0u32;
    let mut tick_label = app.age_label();
    // New data from the collector is taken at most once per `data_frame`
    // (input is answered at once): a busy job changes the model every
    // 50 ms, and redrawing that often costs CPU and ssh bandwidth for
    // nothing a person can read.
    let mut data_pending = false;
    let mut last_data = Instant::now();

    loop {
        // How long to sleep: until the next tick, the frame gap, or the
        // automatic screenshot, whichever comes first.
        let now = Instant::now();
        let mut deadline = next_tick;
        if app.dirty {
            let earliest = last_draw.map_or(now, |t| t + MIN_FRAME);
            deadline = deadline.min(earliest);
        }
        if let Some(s) = &auto_shot {
            deadline = deadline.min(started + s.after);
        }
        if data_pending {
            deadline = deadline.min(last_data + data_frame);
        }
        let mut events = Vec::new();
        match rx.recv_timeout(deadline.saturating_duration_since(now)) {
            Ok(ev) => events.push(ev),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        while let Ok(ev) = rx.try_recv() {
            events.push(ev);
        }
        if Instant::now() >= next_tick {
            let idle = monotonic_ns().saturating_sub(app.clock.changed_ns) > 60_000_000_000;
            next_tick = Instant::now() + Duration::from_secs(if idle { 5 } else { 1 });
            events.push(AppEvent::Tick);
        }
        let mut refresh = false;
        for ev in events {
            let tick = matches!(ev, AppEvent::Tick);
            if matches!(ev, AppEvent::Changed) {
                app.clock.now_ns = monotonic_ns();
                if last_data.elapsed() < data_frame {
                    // Taken when the data interval has passed (below).
                    // `pending` stays set, so the hub queues no more
                    // `Changed` until the snapshot is taken.
                    data_pending = true;
                    continue;
                }
            }
            let dirty_before = app.dirty;
            for fx in app.handle(ev) {
                match fx {
                    Effect::Quit => app.quit = true,
                    Effect::Refresh => refresh = true,
                    Effect::RunCommand { key, pid, command } => {
                        spawn_command(runner.clone(), tx.clone(), key, pid, command);
                    }
                    Effect::Screenshot => {
                        want_shot = true;
                        app.dirty = true;
                    }
                    Effect::DemoSpeed(s) => {
                        if let Some(d) = demo {
                            d.set_speed(s);
                            app.set_demo_status(Some(d.status()));
                        }
                    }
                    Effect::DemoTogglePause => {
                        if let Some(d) = demo {
                            d.toggle_pause();
                            app.set_demo_status(Some(d.status()));
                        }
                    }
                }
            }
            if tick {
                // A tick redraws only when the freshness label moved.
                app.clock.now_ns = monotonic_ns();
                let label = app.age_label();
                app.dirty = dirty_before || label != tick_label;
            }
        }
        if app.quit {
            break;
        }
        if data_pending && last_data.elapsed() >= data_frame {
            data_pending = false;
            app.clock.now_ns = monotonic_ns();
            for fx in app.handle(AppEvent::Changed) {
                if matches!(fx, Effect::Refresh) {
                    refresh = true;
                }
            }
        }
        if refresh && !app.paused {
            last_data = Instant::now();
            take(&mut app);
            if want_pid.is_some() && app.screen == Screen::Overview {
                open_wanted(&mut app, &mut want_pid);
                if want_pid.is_some() && started.elapsed() > Duration::from_secs(10) {
                    app.message = Some(format!(
                        "pid {} is not an instrumented or GPU process",
                        want_pid.take().unwrap_or(0)
                    ));
                }
            }
        }
        if let Some(s) = &auto_shot {
            if started.elapsed() >= s.after {
                want_shot = true;
                quit_after_shot = true;
                app.dirty = true;
            }
        }
        let gap_ok = last_draw.is_none_or(|t| t.elapsed() >= MIN_FRAME);
        if app.dirty && gap_ok {
            crossterm::queue!(
                term.backend_mut(),
                crossterm::terminal::BeginSynchronizedUpdate
            )?;
            let frame = term.draw(|f| draw(f, &app))?;
            let shot = want_shot;
            if want_shot {
                want_shot = false;
                let path = match auto_shot.take() {
                    Some(s) if quit_after_shot => s.path,
                    other => {
                        auto_shot = other;
                        next_screenshot_path(&shots_dir, &mut shot_count)
                    }
                };
                match write_svg(frame.buffer, &path) {
                    Ok(()) => {
                        app.message = Some(format!("screenshot written to {}", path.display()))
                    }
                    Err(e) => app.message = Some(format!("screenshot failed: {e:#}")),
                }
            }
            crossterm::execute!(
                term.backend_mut(),
                crossterm::terminal::EndSynchronizedUpdate
            )?;
            last_draw = Some(Instant::now());
            // The screenshot's message shows in the next frame.
            app.dirty = shot && !quit_after_shot;
            tick_label = app.age_label();
            if quit_after_shot {
                break;
            }
        }
    }
    Ok(())
}
