//! The terminal screens: the dashboard (a ratatui view of the hub's
//! snapshots) and the fleet view, both run by one shell.
//!
//! One thread, one loop ([`shell::Shell`]), one channel of events. The
//! shell owns the terminal (set up and restored in [`terminal`]), the
//! thread reading keys, the colours ([`ShellOptions::theme`]) and the frame
//! loop; a [`shell::Screen`] decides the rest. The dashboard's, in
//! [`run::Dashboard`], meets the rest of the program through the channel:
//!
//! - the hub: [`Hub::on_change`] sends `Changed`, coalesced (at most one
//!   queued until the next snapshot is taken);
//! - a process: a command App asks for ([`Effect::RunCommand`], with the
//!   segment the snapshot shows for the process) goes through the ring's
//!   command client ([`vramscope_wire::ring::client`]) on a thread of its own, and
//!   its answer comes back as `CommandDone` ([`send_command`]); unless the
//!   [`Driver`] refuses every command ([`Driver::refusal`]: `--readonly`, a
//!   recording played back, a snapshot file), when that is the answer;
//! - the hub's live advisor: `A` ([`Effect::Advise`]) starts it on the
//!   hub and has it advise the selected process; its advice arrives in
//!   the snapshots (`ProcessEntry::advice`), and `y` copies a setting
//!   through the terminal ([`Effect::Copy`], OSC 52, written by the shell);
//! - the [`Driver`]'s [`Driver::on_signal`] callback sends `Signal`
//!   (SIGINT, SIGTERM, SIGHUP);
//! - the keyboard and mouse: the shell's thread blocked in crossterm's reader
//!   sends `Input`;
//! - time: the shell sends `Tick { now_ns }` on every wake-up.
//!
//! The pure [`App`] state machine turns each event into state and
//! [`Effect`]s and makes every decision (what to draw, when to take a
//! snapshot, when to wake up); [`run::Dashboard`] carries them out, takes
//! at most one snapshot per request (snapshot-then-render: the hub's lock
//! is never held while drawing), and the shell draws at most one frame per
//! wake-up — only when App says so, at least 10 ms after the previous one,
//! bracketed by a synchronized update.
//!
//! ```text
//!  crossterm thread ─Input──┐
//!  Hub::on_change ───Changed┤                      ┌ Refresh ─▶ hub.snapshot ─▶ Snapshot
//!  Driver::on_signal ─Signal┼─▶ mpsc ─▶ App::handle ┼ RunCommand{segment} ─▶ thread: ring::client::command
//!  command thread ────Done──┤                      └ DemoSpeed…, Quit
//!  shell ──Tick{now_ns}─────┘        draw(frame, &App) ─▶ one pane file each
//! ```
//!
//! Modules: [`shell`] the frame loop every screen runs in; [`run`](mod@run) the
//! dashboard's effects; [`app`] the state machine, with its state grouped
//! by screen in [`state`]; [`keys`] the one key table (dispatch, help,
//! footer) of every screen, the fleet's included; [`fleet`] the fleet view
//! (its keys in the same table). Panes, one file each, each given
//! what it draws: [`overview`], [`process`] (with [`timeline`],
//! [`blockmap`], [`stats`], [`events`], [`diagnosis`]), [`bars`] (header,
//! demo caption, footer), [`help`], [`legend`], [`popup`], [`attribution`]
//! (the "By module" overlay), [`stepdiff`] (the step diff overlay),
//! [`advisor`] (the allocator advisor overlay; [`clipboard`] copies its
//! line through the terminal).
//! [`scroll`] is the one scroll type of every scrolled pane and overlay
//! (bounded at both ends, the same keys everywhere).
//! [`layout`] places them (pure geometry); [`rows`] the overview's rows;
//! [`theme`] owns colours and glyphs; [`svg`] writes screenshots;
//! `fixtures` builds deterministic snapshots for tests.

pub(crate) mod advisor;
pub mod app;
pub(crate) mod attribution;
pub(crate) mod bars;
pub mod blockmap;
pub(crate) mod clipboard;
pub mod diagnosis;
pub(crate) mod events;
pub(crate) mod fit;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod fleet;
pub(crate) mod help;
pub(crate) mod history;
pub mod keys;
pub mod layout;
pub(crate) mod legend;
pub(crate) mod letters;
pub mod overview;
pub mod popup;
pub(crate) mod process;
pub mod rows;
pub mod run;
pub(crate) mod scroll;
pub mod shell;
pub mod state;
pub mod stats;
pub(crate) mod stepdiff;
pub(crate) mod svg;
pub(crate) mod terminal;
pub mod theme;
pub(crate) mod timeline;
pub(crate) mod trace;

use std::path::{Path, PathBuf};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::{Frame, Terminal};

pub use app::{App, AppConfig, AppEvent, CommandDone, Effect, ScreenshotAfter, Shot};
pub use scroll::Scroll;
pub use shell::{Shell, ShellOptions};
pub use state::{Overlay, Pane, Screen};
pub use theme::Theme;

use vramscope_collect::demo::{DemoControl, DemoStatus};
use vramscope_collect::trace::TraceStatus;
use vramscope_collect::Hub;
use vramscope_core::model::ProcessKey;
use vramscope_wire::ring::client::{self, Expect};
use vramscope_wire::ring::{Command, Outcome, Status};

/// How the dashboard runs (the CLI fills this in).
#[derive(Debug, Clone)]
pub struct UiOptions {
    /// No actions: `e`, `r` and `s` do nothing and nothing is sent to any process.
    pub readonly: bool,
    /// No braille, box-drawing or block glyphs.
    pub ascii: bool,
    /// No colours, as asked on the command line. `NO_COLOR` (set and not
    /// empty) is applied by the shell ([`shell::theme`]).
    pub monochrome: bool,
    /// Report mouse clicks and the wheel (on by default).
    pub mouse: bool,
    /// Where `S` writes screenshots (default: the current directory).
    pub screenshot_dir: Option<PathBuf>,
    /// Automation: write the frame shown `after` the start to `path` as SVG,
    /// then quit.
    pub screenshot: Option<ScreenshotAfter>,
    /// Open the process view of this pid at start (when it is visible).
    pub initial_process: Option<u32>,
    /// No terminal: draw at this size (columns, rows), only for
    /// `screenshot`.
    pub size: Option<(u16, u16)>,
    /// The overview's sort at start: a column, and largest first (None:
    /// the column's natural order).
    pub sort: Option<(rows::Col, Option<bool>)>,
    /// New data is drawn at most this often (input is answered at once).
    pub data_interval: Duration,
    /// A still ([`screenshot_now`]): keys pressed before the picture is
    /// taken (`demo --headless --keys`).
    pub keys: String,
}

impl UiOptions {
    /// How the shell runs the dashboard.
    pub(crate) fn shell(&self) -> ShellOptions {
        ShellOptions {
            mouse: self.mouse,
            size: self.size,
            monochrome: self.monochrome,
            ascii: self.ascii,
            shots_dir: (self.screenshot_dir.clone()).unwrap_or_else(|| PathBuf::from(".")),
        }
    }
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions {
            readonly: false,
            ascii: false,
            monochrome: false,
            mouse: true,
            screenshot_dir: None,
            screenshot: None,
            initial_process: None,
            size: None,
            sort: None,
            data_interval: Duration::from_millis(250),
            keys: String::new(),
        }
    }
}

/// What App needs of `opts`, with `no_color` (the environment's
/// `NO_COLOR`) applied by the shell's [`shell::theme`], as every screen's.
pub fn app_config(opts: &UiOptions, no_color: bool) -> AppConfig {
    AppConfig {
        readonly: opts.readonly,
        theme: shell::theme(opts.monochrome, opts.ascii, no_color),
        data_interval: opts.data_interval,
        initial_process: opts.initial_process,
        screenshot: opts.screenshot.clone(),
        sort: opts.sort,
    }
}

/// What the dashboard needs from whatever feeds it, besides the hub's
/// snapshots: whether its processes may be sent commands, and the signals.
pub trait Driver: Send + Sync {
    /// Why the processes shown must be sent no command (`--readonly`, a
    /// recording played back, a snapshot file); None: a command goes to the
    /// segment the snapshot shows for its process ([`send_command`]).
    fn refusal(&self) -> Option<&str>;
    /// Calls `f` on every SIGINT, SIGTERM and SIGHUP from now on.
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>);
    /// A snapshot file's trace: where the hub's state is in it (None: the
    /// hub shows no file).
    fn trace(&self) -> Option<TraceStatus> {
        None
    }
    /// Rebuilds the hub's state at event `at` of the file's trace; returns
    /// where it now is (None: no trace to step through).
    fn seek(&self, _at: usize) -> Option<TraceStatus> {
        None
    }
}

/// The real driver: the collector running on its own runtime.
impl Driver for vramscope_collect::Live {
    fn refusal(&self) -> Option<&str> {
        vramscope_collect::Live::refusal(self)
    }
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>) {
        vramscope_collect::Live::on_signal(self, f)
    }
}

/// How long the dashboard waits for a process to answer a command.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

/// Sends `command` to the process `key` (shown as `pid`) through
/// `segment`, the segment the snapshot shows for it ([`client::command`],
/// refusing a segment that names another process by now), on a thread of
/// its own: the dashboard never blocks on a process. The answer comes back
/// on `tx` as [`AppEvent::CommandDone`]; a successful peak reset is applied
/// to `hub`'s model first. When `driver` refuses commands, nothing is sent
/// and its reason is the answer.
pub fn send_command(
    driver: &dyn Driver,
    hub: &Arc<Hub>,
    tx: &Sender<AppEvent>,
    key: ProcessKey,
    pid: u32,
    segment: PathBuf,
    command: Command,
) {
    let reply = move |tx: &Sender<AppEvent>, result: Result<Outcome, String>| {
        let _ = tx.send(AppEvent::CommandDone(CommandDone {
            key,
            pid,
            command,
            result,
        }));
    };
    if let Some(why) = driver.refusal() {
        return reply(tx, Err(why.to_string()));
    }
    let (hub, answers) = (hub.clone(), tx.clone());
    let expect = Expect {
        pid: key.pid,
        start_time: key.start_time,
    };
    let sent = std::thread::Builder::new()
        .name("vramscope-command".into())
        .spawn(move || {
            let out = client::command(&segment, Some(expect), command, COMMAND_TIMEOUT);
            if let (Command::ResetPeaks { .. }, Ok(o)) = (command, &out) {
                if o.status == Status::Ok {
                    hub.reset_peaks(key);
                }
            }
            reply(&answers, out.map_err(|e| e.to_string()))
        });
    if let Err(e) = sent {
        reply(tx, Err(format!("starting a thread for the command: {e}")));
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

/// Runs the dashboard on the terminal until the user quits or a signal
/// arrives. Commands and signals go through `driver`; `demo` is the running
/// demo, if any. The terminal is restored on every path out, panics
/// included.
pub fn run(
    hub: Arc<Hub>,
    driver: Arc<dyn Driver>,
    demo: Option<Arc<dyn DemoHandle>>,
    opts: UiOptions,
) -> Result<()> {
    let mut app = App::new(app_config(&opts, shell::no_color_env()));
    app.set_trace(driver.trace());
    let shell = Shell::new(opts.shell());
    let mut dashboard = run::Dashboard::new(app, hub, driver, demo, &shell);
    shell.run(&mut dashboard)
}

/// Draws the whole screen for `app`.
pub fn draw(frame: &mut Frame, app: &App) {
    let t = &app.config.theme;
    let areas = layout::screen(frame.area(), app.caption());
    bars::render_header(frame, areas.header, app);
    match (areas.caption, &app.demo, &app.trace) {
        (Some(c), Some(d), _) => bars::render_caption(frame, c, d, t),
        (Some(c), None, Some(s)) => trace::render_caption(frame, c, s, t),
        _ => {}
    }
    match app.screen {
        Screen::Overview => {
            overview::render(frame, areas.body, &app.snap, &app.overview, app.typing(), t)
        }
        Screen::Process => process::render(frame, areas.body, app),
    }
    bars::render_footer(frame, areas.footer, app);
    if let Some(action) = &app.action {
        popup::render(frame, areas.body, action, t);
    }
    match (app.overlay, app.screen) {
        (Some(Overlay::Help(scroll)), _) => help::render(
            frame,
            frame.area(),
            (app.config.readonly, app.trace.is_some()),
            scroll,
            t,
        ),
        (Some(Overlay::Stacks), _) => {
            if let Some(s) = &app.trace {
                trace::render_stacks(frame, areas.body, s, t);
            }
        }
        (Some(Overlay::Legend(scroll)), _) => legend::render(frame, frame.area(), scroll, t),
        (Some(Overlay::Modules(m)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                let letters = app.process.letters.get(&e.key());
                attribution::render(frame, areas.body, &e.view.attribution, letters, &m, t);
            }
        }
        (Some(Overlay::StepDiff(d)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                stepdiff::render(frame, areas.body, &e.view, &d, t);
            }
        }
        (Some(Overlay::Advisor(v)), Screen::Process) => {
            if let Some(e) = app.selected_entry() {
                advisor::render(frame, areas.body, e.advice.as_ref(), &v, t);
            }
        }
        _ => {}
    }
    if t.ascii {
        theme::asciify(frame.buffer_mut());
    }
}

/// A picture to take at once, with no terminal ([`screenshot_now`]).
pub struct Still<'a> {
    /// Columns, rows.
    pub size: (u16, u16),
    /// The collector clock the picture is taken at (ns).
    pub now_ns: u64,
    /// The timeline's window: the first of [`state::SPANS_NS`] at least
    /// this long (else the default).
    pub window_ns: Option<u64>,
    pub path: &'a Path,
}

/// Writes the dashboard as it shows `hub` at `still.now_ns` as SVG, with
/// no terminal: the process view of `opts.initial_process` when it is
/// there, else the overview; `demo` in the caption band. For `demo
/// --headless` and `snapshot`.
pub fn screenshot_now(
    hub: &Hub,
    demo: Option<DemoStatus>,
    opts: &UiOptions,
    still: Still,
) -> Result<()> {
    let (size, now) = (still.size, still.now_ns);
    let mut app = App::new(app_config(opts, shell::no_color_env()));
    app.size = Rect::new(0, 0, size.0, size.1);
    app.set_demo_status(demo);
    if let Some(w) = still.window_ns {
        app.process.span_index = state::SPANS_NS
            .iter()
            .position(|s| *s >= w)
            .unwrap_or(state::SPANS_NS.len() - 1);
    }
    let mut fx = app.handle(AppEvent::Tick { now_ns: now });
    // A snapshot for the screen shown; opening a process asks for another;
    // then the keys asked for, each answered as the dashboard would.
    let keys: Vec<AppEvent> = (opts.keys.chars())
        .map(|c| {
            let code = match c {
                '\n' | '\r' => crossterm::event::KeyCode::Enter,
                '\t' => crossterm::event::KeyCode::Tab,
                c => crossterm::event::KeyCode::Char(c),
            };
            AppEvent::Input(crossterm::event::Event::Key(
                crossterm::event::KeyEvent::new(code, crossterm::event::KeyModifiers::NONE),
            ))
        })
        .collect();
    let mut keys = keys.into_iter();
    for _ in 0..3 + opts.keys.len() * 3 {
        if !fx.contains(&Effect::Refresh) {
            match keys.next() {
                Some(k) => {
                    fx = app.handle(k);
                    fx.push(Effect::Refresh);
                    continue;
                }
                None => break,
            }
        }
        let snap = hub.snapshot_at(now, &app.view_options());
        fx = app.handle(AppEvent::Snapshot(Box::new(snap)));
    }
    write_svg(&render_buffer(&app, size.0, size.1), still.path)
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
pub(crate) fn write_svg(buf: &Buffer, path: &Path) -> Result<()> {
    std::fs::write(path, svg::render(buf)).with_context(|| format!("writing {}", path.display()))
}

/// Writes `buf` as SVG into `file`, just made at `path`.
pub(crate) fn write_svg_into(buf: &Buffer, mut file: std::fs::File, path: &Path) -> Result<()> {
    use std::io::Write;
    file.write_all(svg::render(buf).as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}
