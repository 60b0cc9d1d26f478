//! The dashboard's state machine: everything the screen shows besides the
//! snapshot itself, and how events change it. No terminal, no I/O and no
//! clock here: [`App::handle`] turns an [`AppEvent`] into state changes and
//! a list of [`Effect`]s that the loop (or a test) carries out, and time
//! arrives as [`AppEvent::Tick`]. Every decision about what to draw and when
//! is made here: the freshness label, the data-rate gate, the `--pid` wait,
//! the automatic screenshot, the frame gap ([`App::deadline_ns`],
//! [`App::should_draw`], [`App::frame_drawn`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Rect;

use crate::collect::{ProcessEntry, Snapshot};
use crate::demo::DemoStatus;
use crate::model::{Mode, ProcessKey, TimelineRequest, ViewOptions};
use crate::ring::{Command, Outcome};
use crate::snapfile::step::TraceStatus;

use super::blockmap;
use super::history;
use super::keys::{self, Action, Context};
use super::layout;
use super::rows::{self, Col, Row};
pub use super::state::{
    ActionReport, ActionState, Overlay, OverviewState, Pane, ProcessState, Screen, DEFAULT_SPAN,
    SPANS_NS, SPEEDS,
};
use super::theme::Theme;
use crate::text::format;

/// Everything the loop waits for, in one channel.
#[derive(Debug)]
pub enum AppEvent {
    Input(Event),
    /// The hub moved (coalesced: at most one queued).
    Changed,
    /// Time passed: the loop sends one on every wake-up, before the events it
    /// drained (collector clock, ns). The first one starts the dashboard.
    Tick {
        now_ns: u64,
    },
    /// SIGTERM / SIGHUP / SIGINT.
    Signal,
    /// A command sent through the driver was answered.
    CommandDone(CommandDone),
    /// The snapshot App asked for with [`Effect::Refresh`].
    Snapshot(Box<Snapshot>),
    /// The frame [`App::frame_drawn`] asked for was written (to this path).
    ScreenshotWritten(Result<PathBuf, String>),
}

/// The answer to a command sent to a process.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandDone {
    pub key: ProcessKey,
    pub pid: u32,
    pub command: Command,
    pub result: Result<Outcome, String>,
}

/// What the loop must do after an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Quit,
    /// Take a new snapshot and hand it back as [`AppEvent::Snapshot`].
    Refresh,
    /// Send a command through the driver; answer with `CommandDone`.
    RunCommand {
        key: ProcessKey,
        pid: u32,
        command: Command,
    },
    DemoSpeed(f64),
    DemoTogglePause,
    /// Rebuild the state at this event of the snapshot file's trace
    /// ([`super::Driver::seek`]); the answer goes to [`App::set_trace`].
    Seek(usize),
}

/// Write one frame after a delay, then quit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenshotAfter {
    pub path: PathBuf,
    pub after: Duration,
}

/// A frame to write as SVG: to `path`, or the next free numbered file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shot {
    pub path: Option<PathBuf>,
    /// Quit once written (automation).
    pub then_quit: bool,
}

/// At least this long between two frames.
pub const MIN_FRAME_NS: u64 = 10_000_000;
/// The slow tick (the freshness label), and when idle for a minute.
pub const TICK_NS: u64 = 1_000_000_000;
pub const IDLE_TICK_NS: u64 = 5_000_000_000;
const IDLE_AFTER_NS: u64 = 60_000_000_000;
/// How long `--pid` waits for its process.
pub const PID_WAIT_NS: u64 = 10_000_000_000;
/// Steps `C` asks a process to capture stacks for (command 5).
pub const CAPTURE_STEPS: u32 = 10;
/// How long a footer message stays before the key hints come back.
pub const MESSAGE_NS: u64 = 4_000_000_000;

/// Switches fixed for the life of the dashboard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppConfig {
    /// No actions: nothing is sent to any process.
    pub readonly: bool,
    /// The one theme (colour and ASCII switches, `NO_COLOR` applied).
    pub theme: Theme,
    /// New hub data is taken at most this often (keys are answered at
    /// once); zero takes every change.
    pub data_interval: Duration,
    /// `--pid`: open this process's view as soon as it is seen.
    pub initial_process: Option<u32>,
    /// Automation: write the frame shown `after` the start, then quit.
    pub screenshot: Option<ScreenshotAfter>,
    /// The overview's sort at start (the settings file's).
    pub sort: Option<(Col, Option<bool>)>,
}

/// The clocks, as App was told (collector ns; never read here).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Clock {
    /// Now, as of the last tick.
    pub now_ns: u64,
    /// When the hub last changed.
    pub changed_ns: u64,
    /// The first tick.
    pub started_ns: Option<u64>,
    /// When the slow tick is due.
    pub next_tick_ns: u64,
    /// When hub data was last taken.
    pub data_ns: Option<u64>,
    /// A hub change waits for the data interval.
    pub data_pending: bool,
}

/// What happens once, after the start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Startup {
    /// `--pid` not seen yet.
    pub wanted_pid: Option<u32>,
    /// The automatic screenshot, not taken yet.
    pub screenshot: Option<ScreenshotAfter>,
}

/// Frames: when the last was drawn, what its freshness label said, and
/// screenshots asked for or being written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Redraw {
    pub last_ns: Option<u64>,
    pub label: String,
    /// The next frame is to be written.
    pub shot: Option<Shot>,
    /// The frame being written.
    pub writing: Option<Shot>,
}

/// The dashboard's state, grouped by screen.
#[derive(Debug, Clone)]
pub struct App {
    pub config: AppConfig,
    pub snap: Arc<Snapshot>,
    pub screen: Screen,
    /// What is drawn over the screen and takes its keys.
    pub overlay: Option<Overlay>,
    pub overview: OverviewState,
    pub process: ProcessState,
    /// The process action asked, running or answered.
    pub action: Option<ActionState>,
    /// The running demo, as last read.
    pub demo: Option<DemoStatus>,
    /// The snapshot file's trace, where the state is in it (`open FILE`).
    pub trace: Option<TraceStatus>,
    /// The view is frozen: no new snapshots.
    pub paused: bool,
    /// One line for the footer (errors, hints), shown until
    /// `message_until_ns` and then gone: the key hints come back.
    pub message: Option<String>,
    pub message_until_ns: u64,
    /// Terminal size.
    pub size: Rect,
    pub clock: Clock,
    pub startup: Startup,
    pub redraw: Redraw,
    /// Something changed since the last frame.
    pub dirty: bool,
    pub quit: bool,
}

impl App {
    pub fn new(config: AppConfig) -> App {
        let mut app = App {
            config: config.clone(),
            snap: Arc::new(Snapshot::default()),
            screen: Screen::Overview,
            overlay: None,
            overview: OverviewState::default(),
            process: ProcessState::default(),
            action: None,
            demo: None,
            trace: None,
            paused: false,
            message: None,
            message_until_ns: 0,
            size: Rect::new(0, 0, 80, 24),
            clock: Clock::default(),
            startup: Startup {
                wanted_pid: config.initial_process,
                screenshot: config.screenshot.clone(),
            },
            redraw: Redraw::default(),
            dirty: true,
            quit: false,
        };
        if let Some((col, descending)) = config.sort {
            app.sort_by(col, false);
            if let Some(d) = descending {
                app.overview.descending = d;
            }
        }
        app
    }

    /// The rows of the overview, filtered and sorted.
    pub fn rows(&self) -> Vec<Row<'_>> {
        self.overview.rows(&self.snap)
    }

    pub fn span_ns(&self) -> u64 {
        self.process.span_ns()
    }

    /// Now: the newer of the clock and the snapshot.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns.max(self.snap.taken_ns)
    }

    /// The timeline window `[from, to)` in collector ns.
    pub fn window(&self) -> (u64, u64) {
        self.process.window(self.now_ns())
    }

    /// How fresh the data is (the header's right end).
    pub fn age_label(&self) -> String {
        if self.clock.changed_ns == 0 {
            return "waiting for data".into();
        }
        let age = self.clock.now_ns.saturating_sub(self.clock.changed_ns);
        const S: u64 = 1_000_000_000;
        if age < 2 * S {
            "live".into()
        } else if age < 60 * S {
            format!("updated {}s ago", age / S)
        } else {
            // Minutes only: the idle tick is slow.
            format!("updated {} ago", format::span(age / (60 * S) * 60 * S))
        }
    }

    /// The overview table's data rows (for clicks).
    pub fn table_body(&self) -> Rect {
        let rows = self.rows().len();
        layout::table_body(self.size, self.caption(), &self.snap.machine, rows)
    }

    /// Data rows the overview table shows at once.
    pub fn table_rows(&self) -> usize {
        if self.screen != Screen::Overview && self.size.height == 0 {
            return 1;
        }
        self.table_body().height as usize
    }

    /// What the next snapshot must contain for the current screen.
    pub fn view_options(&self) -> ViewOptions {
        let process = self.screen == Screen::Process;
        let timeline = if process {
            let (from_ns, to_ns) = self.window();
            Some(TimelineRequest {
                from_ns,
                to_ns,
                columns: layout::timeline_columns(self.size, self.caption()),
            })
        } else {
            self.overview_timeline()
        };
        // The events the Events pane shows, from the newest to the scroll
        // position and a page beyond (so scrolling back has them); the
        // whole history while searching it.
        let recent_events = if !process {
            0
        } else if !self.process.event_filter.is_empty() {
            usize::MAX
        } else {
            let rows = layout::pane_rows(self.size, self.caption(), Pane::Events).max(20);
            self.process.event_scroll + 2 * rows + 64
        };
        ViewOptions {
            block_map: process,
            recent_events,
            timeline,
        }
    }

    /// The overview's history band and sparklines, when it shows either:
    /// the last [`history::WINDOW_NS`], one column per plot cell.
    fn overview_timeline(&self) -> Option<TimelineRequest> {
        let rows = self.rows().len();
        let body = layout::screen(self.size, self.caption()).body;
        let band = layout::overview(body, &self.snap.machine, rows).history;
        let spark = self.columns().cols().any(|c| c == Col::History);
        if band.is_none() && !spark {
            return None;
        }
        let to_ns = self.now_ns();
        Some(TimelineRequest {
            from_ns: to_ns.saturating_sub(history::WINDOW_NS),
            to_ns,
            columns: band
                .map_or(64, |b| history::plot_width(b.width))
                .clamp(16, 1000),
        })
    }

    /// The selected process in the current snapshot.
    pub fn selected_entry(&self) -> Option<&ProcessEntry> {
        let key = self.overview.selected?;
        self.snap.processes.iter().find(|p| p.key() == key)
    }

    /// A new snapshot arrived.
    pub fn set_snapshot(&mut self, snap: Snapshot) {
        if snap.taken_ns > self.clock.now_ns {
            self.clock.now_ns = snap.taken_ns;
        }
        self.snap = Arc::new(snap);
        self.fix_selection();
        self.note_nvml_after();
        self.update_confirm();
        self.dirty = true;
    }

    /// The caption band is shown: a demo's, or a snapshot file's trace.
    pub fn caption(&self) -> bool {
        self.demo.is_some() || self.trace.is_some()
    }

    pub fn set_trace(&mut self, status: Option<TraceStatus>) {
        if self.trace != status {
            self.trace = status;
            self.dirty = true;
        }
    }

    /// Steps through the trace to event `at` (clamped to it).
    fn seek(&mut self, at: impl FnOnce(&TraceStatus) -> usize) -> Vec<Effect> {
        match &self.trace {
            Some(s) => vec![Effect::Seek(at(s).min(s.total))],
            None => vec![],
        }
    }

    pub fn set_demo_status(&mut self, status: Option<DemoStatus>) {
        if self.demo != status {
            self.demo = status;
            self.dirty = true;
        }
    }

    fn fix_selection(&mut self) {
        if self.screen == Screen::Process {
            return; // keep showing the chosen process, even once it is gone
        }
        let keys: Vec<ProcessKey> = self.rows().iter().map(|r| r.entry.key()).collect();
        if keys.is_empty() {
            self.overview.selected = None;
            self.overview.offset = 0;
            return;
        }
        if self.overview.selected.is_none_or(|k| !keys.contains(&k)) {
            self.overview.selected = Some(keys[0]);
        }
        self.scroll_to_selection(&keys);
    }

    fn scroll_to_selection(&mut self, keys: &[ProcessKey]) {
        let visible = self.table_rows().max(1);
        let idx = self
            .overview
            .selected
            .and_then(|k| keys.iter().position(|x| *x == k))
            .unwrap_or(0);
        if idx < self.overview.offset {
            self.overview.offset = idx;
        } else if idx >= self.overview.offset + visible {
            self.overview.offset = idx + 1 - visible;
        }
        let max_off = keys.len().saturating_sub(visible);
        self.overview.offset = self.overview.offset.min(max_off);
    }

    fn note_nvml_after(&mut self) {
        let Some(ActionState::Done(r)) = &self.action else {
            return;
        };
        if r.nvml_after.is_some() || r.outcome.is_none() {
            return;
        }
        let newer = match (self.snap.machine.sampled_ns, r.nvml_sampled_at_done) {
            (Some(now), Some(then)) => now > then,
            (Some(_), None) => true,
            _ => false,
        };
        if !newer {
            return;
        }
        let key = r.key;
        let used = self
            .snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .and_then(|p| p.view.figures.nvml_used);
        if let Some(ActionState::Done(r)) = &mut self.action {
            r.nvml_after = used;
        }
    }

    /// The y/n question quotes the figures of the latest snapshot, not
    /// those of the moment `e` was pressed.
    fn update_confirm(&mut self) {
        let Some(ActionState::Confirm { key, .. }) = &self.action else {
            return;
        };
        let key = *key;
        let live = self
            .snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .map(|p| (p.view.figures.reserved, p.view.figures.allocated));
        if let Some(ActionState::Confirm {
            reserved,
            allocated,
            ..
        }) = &mut self.action
        {
            *reserved = live.map(|l| l.0);
            *allocated = live.map(|l| l.1);
        }
    }

    fn nvml_of(&self, key: ProcessKey) -> Option<u64> {
        self.snap
            .processes
            .iter()
            .find(|p| p.key() == key)
            .and_then(|p| p.view.figures.nvml_used)
    }

    /// Shows `text` in the footer for [`MESSAGE_NS`].
    pub fn say(&mut self, text: impl Into<String>) {
        self.message = Some(text.into());
        self.message_until_ns = self.clock.now_ns + MESSAGE_NS;
        self.dirty = true;
    }

    /// Applies one event; returns what the loop must do. While paused, no
    /// snapshot is asked for.
    pub fn handle(&mut self, ev: AppEvent) -> Vec<Effect> {
        let mut fx = match ev {
            AppEvent::Input(input) => self.input(input),
            AppEvent::Changed => self.changed(),
            AppEvent::Tick { now_ns } => self.tick(now_ns),
            AppEvent::Signal => {
                self.quit = true;
                vec![Effect::Quit]
            }
            AppEvent::CommandDone(done) => {
                self.command_done(done);
                vec![Effect::Refresh]
            }
            AppEvent::Snapshot(snap) => self.snapshot_taken(*snap),
            AppEvent::ScreenshotWritten(result) => self.screenshot_written(result),
        };
        if self.paused {
            fx.retain(|f| *f != Effect::Refresh);
        }
        fx
    }

    fn data_interval_ns(&self) -> u64 {
        self.config.data_interval.as_nanos() as u64
    }

    /// The data interval has passed since data was last taken.
    fn data_due(&self) -> bool {
        self.clock
            .data_ns
            .is_none_or(|t| self.clock.now_ns >= t + self.data_interval_ns())
    }

    /// New hub data is taken at most every data interval: a busy job
    /// changes the model every 50 ms, and redrawing that often costs CPU
    /// and ssh bandwidth for nothing a person can read.
    fn changed(&mut self) -> Vec<Effect> {
        self.clock.changed_ns = self.clock.now_ns;
        if self.paused {
            return vec![];
        }
        if self.data_due() {
            vec![Effect::Refresh]
        } else {
            self.clock.data_pending = true;
            vec![]
        }
    }

    /// Time passed: start, the slow tick (a redraw only when the freshness
    /// label moved), data held back by the gate, the automatic screenshot.
    fn tick(&mut self, now: u64) -> Vec<Effect> {
        self.clock.now_ns = now;
        let Some(started) = self.clock.started_ns else {
            self.clock.started_ns = Some(now);
            self.clock.next_tick_ns = now + TICK_NS;
            return vec![Effect::Refresh];
        };
        let mut fx = Vec::new();
        if now >= self.clock.next_tick_ns {
            let idle = now.saturating_sub(self.clock.changed_ns) > IDLE_AFTER_NS;
            self.clock.next_tick_ns = now + if idle { IDLE_TICK_NS } else { TICK_NS };
            if self.age_label() != self.redraw.label {
                self.dirty = true;
            }
        }
        if self.message.is_some() && now >= self.message_until_ns {
            self.message = None;
            self.dirty = true;
        }
        if self.startup.wanted_pid.is_some() {
            // The wait ends on time even when no data arrives at all.
            fx.extend(self.open_wanted());
        }
        if self.clock.data_pending && self.data_due() {
            self.clock.data_pending = false;
            fx.push(Effect::Refresh);
        }
        if let Some(s) = &self.startup.screenshot {
            if now >= started + s.after.as_nanos() as u64 {
                self.redraw.shot = Some(Shot {
                    path: Some(s.path.clone()),
                    then_quit: true,
                });
                self.startup.screenshot = None;
                self.dirty = true;
            }
        }
        fx
    }

    /// The snapshot asked for arrived; `--pid` opens its view once it shows.
    fn snapshot_taken(&mut self, snap: Snapshot) -> Vec<Effect> {
        self.clock.data_ns = Some(self.clock.now_ns);
        self.clock.data_pending = false;
        self.set_snapshot(snap);
        if self.clock.changed_ns == 0 {
            self.clock.changed_ns = self.clock.now_ns;
        }
        self.open_wanted()
    }

    fn open_wanted(&mut self) -> Vec<Effect> {
        let Some(pid) = self.startup.wanted_pid else {
            return vec![];
        };
        if self.screen != Screen::Overview {
            return vec![];
        }
        if self.open_pid(pid) {
            self.startup.wanted_pid = None;
            self.message = None;
            return vec![Effect::Refresh];
        }
        let waited = self
            .clock
            .now_ns
            .saturating_sub(self.clock.started_ns.unwrap_or(self.clock.now_ns));
        if waited > PID_WAIT_NS {
            self.startup.wanted_pid = None;
            self.say(format!("pid {pid} is not an instrumented or GPU process"));
        } else {
            self.say(format!("waiting for pid {pid} to appear..."));
        }
        vec![]
    }

    fn screenshot_written(&mut self, result: Result<PathBuf, String>) -> Vec<Effect> {
        let then_quit = self.redraw.writing.take().is_some_and(|s| s.then_quit);
        self.say(match result {
            Ok(path) => format!("screenshot written to {}", path.display()),
            Err(e) => format!("screenshot failed: {e}"),
        });
        // The message shows in the next frame (unless quitting).
        self.dirty = true;
        if then_quit {
            self.quit = true;
            return vec![Effect::Quit];
        }
        vec![]
    }

    /// When the loop must wake up even if nothing arrives (collector ns):
    /// the slow tick, the frame gap, held-back data, the automatic
    /// screenshot. Before the first tick: at once.
    pub fn deadline_ns(&self) -> u64 {
        let Some(started) = self.clock.started_ns else {
            return 0;
        };
        let mut d = self.clock.next_tick_ns;
        if self.dirty {
            d = d.min(self.redraw.last_ns.map_or(0, |t| t + MIN_FRAME_NS));
        }
        if self.clock.data_pending {
            if let Some(t) = self.clock.data_ns {
                d = d.min(t + self.data_interval_ns());
            }
        }
        if let Some(s) = &self.startup.screenshot {
            d = d.min(started + s.after.as_nanos() as u64);
        }
        if self.message.is_some() {
            d = d.min(self.message_until_ns);
        }
        d
    }

    /// Draw now: something changed, and the last frame is at least
    /// [`MIN_FRAME_NS`] old.
    pub fn should_draw(&self, now_ns: u64) -> bool {
        self.dirty
            && self
                .redraw
                .last_ns
                .is_none_or(|t| now_ns >= t + MIN_FRAME_NS)
    }

    /// The loop drew a frame at `now_ns`. Returns the screenshot this frame
    /// is to be written as, if one was asked for; the loop answers with
    /// [`AppEvent::ScreenshotWritten`].
    pub fn frame_drawn(&mut self, now_ns: u64) -> Option<Shot> {
        self.dirty = false;
        self.redraw.last_ns = Some(now_ns);
        self.redraw.label = self.age_label();
        let shot = self.redraw.shot.take();
        self.redraw.writing = shot.clone();
        shot
    }

    fn command_done(&mut self, done: CommandDone) {
        let nvml_before = match &self.action {
            Some(ActionState::Running { nvml_before, .. }) => *nvml_before,
            _ => None,
        };
        let (status, outcome) = match done.result {
            Ok(o) => (Ok(o.status), Some(o)),
            Err(e) => (Err(e), None),
        };
        self.action = Some(ActionState::Done(ActionReport {
            pid: done.pid,
            key: done.key,
            command: done.command,
            status,
            outcome,
            nvml_before,
            nvml_after: None,
            nvml_sampled_at_done: self.snap.machine.sampled_ns,
        }));
        self.dirty = true;
    }

    fn input(&mut self, ev: Event) -> Vec<Effect> {
        match ev {
            Event::Key(k) => {
                if k.kind != KeyEventKind::Press {
                    return vec![];
                }
                let fx = self.key(k);
                self.dirty = true;
                fx
            }
            Event::Mouse(m) => self.mouse(m),
            Event::Resize(w, h) => {
                self.size = Rect::new(0, 0, w, h);
                self.dirty = true;
                let keys: Vec<ProcessKey> = self.rows().iter().map(|r| r.entry.key()).collect();
                self.scroll_to_selection(&keys);
                vec![Effect::Refresh]
            }
            _ => vec![],
        }
    }

    /// Where a key is looked up, first match wins: a modal context takes
    /// every key; otherwise a finished command's report, the global keys,
    /// then the screen's.
    fn key_contexts(&self) -> Vec<Context> {
        if self.typing() {
            return vec![Context::Always, Context::Filter];
        }
        if matches!(self.action, Some(ActionState::Confirm { .. })) {
            return vec![Context::Always, Context::Confirm];
        }
        match self.overlay {
            Some(Overlay::Help) => return vec![Context::Always, Context::Help],
            Some(Overlay::Legend(_)) => return vec![Context::Always, Context::Legend],
            Some(Overlay::Modules(_)) => return vec![Context::Always, Context::Modules],
            Some(Overlay::StepDiff(_)) => return vec![Context::Always, Context::StepDiff],
            Some(Overlay::Stacks) => return vec![Context::Always, Context::Stacks, Context::Trace],
            Some(Overlay::Prompt) | None => {}
        }
        let mut c = vec![Context::Always];
        if matches!(self.action, Some(ActionState::Done(_))) {
            c.push(Context::Report);
        }
        if self.trace.is_some() {
            c.push(Context::Trace);
        }
        c.push(Context::Global);
        c.push(match self.screen {
            Screen::Overview => Context::Overview,
            Screen::Process => Context::Process,
        });
        c
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Effect> {
        let action = keys::action(&k, &self.key_contexts());
        if !self.typing() {
            return action.map_or_else(Vec::new, |a| self.act(a));
        }
        // Typing a filter: characters are text, not commands.
        let mut fx = Vec::new();
        match action {
            Some(a @ (Action::Quit | Action::SelectUp | Action::SelectDown))
                if self.screen == Screen::Overview =>
            {
                return self.act(a)
            }
            Some(Action::SelectUp | Action::SelectDown) => {}
            Some(a) => fx = self.act(a),
            None => {
                if let KeyCode::Char(c) = k.code {
                    let f = self.filter_mut();
                    if !k.modifiers.contains(KeyModifiers::CONTROL) && f.chars().count() < 64 {
                        f.push(c);
                    }
                }
            }
        }
        match self.screen {
            Screen::Overview => {
                self.overview.offset = 0;
                self.fix_selection();
            }
            // The event search runs over the whole history: a new snapshot.
            Screen::Process => {
                self.process.event_scroll = 0;
                fx.push(Effect::Refresh);
            }
        }
        fx
    }

    /// A filter is being typed (keys are text).
    pub fn typing(&self) -> bool {
        self.overlay == Some(Overlay::Prompt)
    }

    /// The filter being typed: the overview's (processes), or the process
    /// view's (events).
    pub fn filter(&self) -> &str {
        match self.screen {
            Screen::Overview => &self.overview.filter,
            Screen::Process => &self.process.event_filter,
        }
    }

    fn filter_mut(&mut self) -> &mut String {
        match self.screen {
            Screen::Overview => &mut self.overview.filter,
            Screen::Process => &mut self.process.event_filter,
        }
    }

    /// Carries out what a key asked for.
    fn act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Quit => {
                self.quit = true;
                return vec![Effect::Quit];
            }
            A::Help => self.overlay = Some(Overlay::Help),
            A::Legend => self.overlay = Some(Overlay::Legend(0)),
            A::Modules => self.overlay = Some(Overlay::Modules(Default::default())),
            A::StepDiff => self.overlay = Some(Overlay::StepDiff(Default::default())),
            A::CloseHelp | A::CloseLegend | A::CloseModules | A::CloseStepDiff | A::CloseStacks => {
                self.overlay = None
            }
            A::ModulesSort | A::ModulesReverse | A::ModulesUp | A::ModulesDown => {
                let rows =
                    (self.selected_entry()).map_or(0, |e| e.view.attribution.by_module.len());
                if let Some(Overlay::Modules(m)) = self.overlay.as_mut() {
                    match action {
                        A::ModulesSort => m.sort_next(),
                        A::ModulesReverse => m.reverse(),
                        _ => m.scroll_by(action == A::ModulesDown, rows),
                    }
                }
            }
            A::ModulesOnly => {
                let module = self.selected_entry().and_then(|e| {
                    let Some(Overlay::Modules(m)) = self.overlay else {
                        return None;
                    };
                    let rows = super::attribution::sorted(&e.view.attribution, &m);
                    rows.get(m.scroll.min(rows.len().saturating_sub(1)))
                        .map(|r| r.module.clone())
                });
                if let Some(module) = module {
                    self.overlay = None;
                    self.show_only(blockmap::Only::Module(module));
                }
            }
            A::BlockColouring => {
                self.process.colouring = self.process.colouring.next();
                self.process.only = None;
                self.say(format!(
                    "block map coloured by {}",
                    self.process.colouring.name()
                ));
            }
            A::BlockOnly => self.next_only(),
            A::StepDiffOlder | A::StepDiffNewer | A::StepDiffUp | A::StepDiffDown => {
                let Some(Overlay::StepDiff(mut d)) = self.overlay else {
                    return vec![];
                };
                let (now, rows) = self.selected_entry().map_or((None, 0), |e| {
                    let rows = super::stepdiff::row_count(&e.view, &d);
                    (e.view.attribution.step, rows)
                });
                match action {
                    A::StepDiffOlder => d.older(now),
                    A::StepDiffNewer => d.newer(),
                    _ => d.scroll_by(action == A::StepDiffDown, rows),
                }
                self.overlay = Some(Overlay::StepDiff(d));
            }
            A::BlockNext | A::BlockPrev => self.select_block(action == A::BlockNext),
            A::BlockClear => {
                self.process.selected_block = None;
                self.process.only = None;
            }
            A::CaptureStacks => {
                return self.simple_command(Command::CaptureStacks {
                    steps: CAPTURE_STEPS,
                    depth: 0,
                })
            }
            A::LegendUp | A::LegendDown => {
                let up = action == A::LegendUp;
                let n = super::legend::lines(&self.config.theme).len();
                if let Some(Overlay::Legend(v)) = &mut self.overlay {
                    *v = if up {
                        v.saturating_sub(1)
                    } else {
                        (*v + 1).min(n)
                    };
                }
            }
            A::Pause => return self.toggle_pause(),
            A::PauseSim if self.demo.as_ref().is_some_and(|d| !d.replay) => {
                return vec![Effect::DemoTogglePause]
            }
            A::PauseSim => return self.toggle_pause(),
            A::Screenshot => {
                // An automatic screenshot already asked for goes first.
                if self.redraw.shot.is_none() {
                    self.redraw.shot = Some(Shot {
                        path: None,
                        then_quit: false,
                    });
                }
            }
            A::DemoSlower | A::DemoFaster => return self.demo_speed(action == A::DemoFaster),
            A::EmptyCache => return self.ask_empty_cache(),
            A::ResetPeaks => return self.simple_command(Command::ResetPeaks { device: None }),
            A::RequestSnapshot => return self.simple_command(Command::Snapshot { device: None }),
            A::ConfirmYes => return self.confirm_empty_cache(),
            A::ConfirmNo => {
                self.action = None;
                self.say("empty_cache cancelled");
            }
            A::CloseReport => self.action = None,
            A::TraceStep(d) => {
                return self.seek(|s| s.at.saturating_add_signed(d as isize));
            }
            A::TraceFirst => return self.seek(|_| 0),
            A::TraceLast => return self.seek(|s| s.total),
            A::TraceStacks => {
                self.overlay = match self.overlay {
                    Some(Overlay::Stacks) => None,
                    _ => Some(Overlay::Stacks),
                }
            }
            A::SelectUp
            | A::SelectDown
            | A::SelectPageUp
            | A::SelectPageDown
            | A::SelectFirst
            | A::SelectLast
            | A::Open
            | A::EditFilter
            | A::ClearFilter
            | A::SortNext
            | A::SortReverse
            | A::FilterKeep
            | A::FilterClear
            | A::FilterBackspace => return self.overview_act(action),
            A::SearchEvents => {
                // The search is over the Events pane: show it (focus it).
                self.process.pane = Pane::Events;
                self.overlay = Some(Overlay::Prompt);
            }
            A::Back
            | A::NextPane
            | A::PrevPane
            | A::ShowPane(_)
            | A::ZoomIn
            | A::ZoomOut
            | A::TimeBack
            | A::TimeForward
            | A::FollowToggle
            | A::FollowOn
            | A::ScrollUp
            | A::ScrollDown
            | A::ScrollPageUp
            | A::ScrollPageDown
            | A::ScrollTop => return self.process_act(action),
        }
        vec![]
    }

    /// The block map shows only `only` (its colouring follows), on screen.
    fn show_only(&mut self, only: blockmap::Only) {
        self.process.colouring = match only {
            blockmap::Only::Module(_) => blockmap::Colouring::Module,
            blockmap::Only::Phase(_) => blockmap::Colouring::Phase,
        };
        self.say(format!("block map: only {} (x clears)", only.label()));
        self.process.only = Some(only);
        self.process.pane = Pane::Blocks;
        if self
            .process
            .selected_block
            .is_some_and(|addr| !self.block_shown(addr))
        {
            self.process.selected_block = None;
        }
    }

    /// Whether block `addr` is allocated and passes the map's filter.
    fn block_shown(&self, addr: u64) -> bool {
        let Some(e) = self.selected_entry() else {
            return false;
        };
        blockmap::find_block(e, addr).is_some_and(|(_, b)| {
            b.block.state == crate::event::BlockState::Allocated
                && (self.process.only.as_ref()).is_none_or(|o| o.matches(&e.view.attribution, b))
        })
    }

    /// `v`: the next module or phase of the legend (modules by live bytes,
    /// phases in order), then none.
    fn next_only(&mut self) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let a = &e.view.attribution;
        let items: Vec<blockmap::Only> = match self.process.colouring {
            blockmap::Colouring::State => {
                self.say("c first: colour the block map by module or phase");
                return;
            }
            blockmap::Colouring::Module => (blockmap::module_keys(a).into_iter())
                .map(|m| blockmap::Only::Module(m.to_string()))
                .collect(),
            blockmap::Colouring::Phase => (a.by_phase.iter())
                .map(|p| blockmap::Only::Phase(p.phase))
                .collect(),
        };
        let next = match &self.process.only {
            None => items.first().cloned(),
            Some(cur) => items
                .iter()
                .position(|i| i == cur)
                .and_then(|i| items.get(i + 1).cloned()),
        };
        match next {
            Some(o) => self.show_only(o),
            None => {
                self.process.only = None;
                self.say("block map: every block");
            }
        }
    }

    /// `n`/`N`: the next or previous allocated block the map shows, in map
    /// order (wrapping); the map scrolls to it.
    fn select_block(&mut self, forward: bool) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let a = &e.view.attribution;
        let only = self.process.only.as_ref();
        let blocks: Vec<(usize, u64)> = blockmap::blocks_in_order(e)
            .into_iter()
            .filter(|(_, b)| {
                b.block.state == crate::event::BlockState::Allocated
                    && only.is_none_or(|o| o.matches(a, b))
            })
            .map(|(row, b)| (row, b.addr))
            .collect();
        if blocks.is_empty() {
            self.say("no allocated block to select");
            return;
        }
        let cur = (self.process.selected_block)
            .and_then(|addr| blocks.iter().position(|(_, b)| *b == addr));
        let i = match (cur, forward) {
            (None, true) => 0,
            (None, false) => blocks.len() - 1,
            (Some(i), true) => (i + 1) % blocks.len(),
            (Some(i), false) => (i + blocks.len() - 1) % blocks.len(),
        };
        let (row, addr) = blocks[i];
        self.process.selected_block = Some(addr);
        self.process.pane = Pane::Blocks;
        // The row in view, a third of the way down.
        let page = layout::pane_rows(self.size, self.caption(), Pane::Blocks).max(1);
        let s = self.process.block_scroll;
        if row < s || row >= s + page * 2 / 3 {
            self.process.block_scroll = row.saturating_sub(page / 3);
        }
    }

    /// A click on the block map selects the block under it.
    fn click_block(&mut self, x: u16, y: u16) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let body = layout::screen(self.size, self.caption()).body;
        let Some(area) = layout::process(self.size, self.process.pane, body).blocks else {
            return;
        };
        let v = self.process.map_view(self.snap.taken_ns);
        if let Some(addr) = blockmap::block_at(e, area, &v, x, y) {
            self.process.selected_block = Some(addr);
            self.dirty = true;
        }
    }

    /// The overview's actions: the selection, sorting and the filter.
    fn overview_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::SelectUp => return self.move_selection(-1),
            A::SelectDown => return self.move_selection(1),
            A::SelectPageUp => return self.move_selection(-self.page()),
            A::SelectPageDown => return self.move_selection(self.page()),
            A::SelectFirst => return self.move_selection(isize::MIN / 2),
            A::SelectLast => return self.move_selection(isize::MAX / 2),
            A::Open => return self.open(),
            A::EditFilter => self.overlay = Some(Overlay::Prompt),
            A::ClearFilter => {
                if !self.overview.filter.is_empty() {
                    self.overview.filter.clear();
                    self.fix_selection();
                }
                self.message = None;
            }
            A::SortNext => {
                // The columns on screen, left to right.
                let shown: Vec<Col> = self.columns().cols().collect();
                let i = shown.iter().position(|c| *c == self.overview.sort);
                let next = shown[i.map_or(0, |i| (i + 1) % shown.len())];
                self.sort_by(next, false);
            }
            A::SortReverse => {
                self.overview.descending = !self.overview.descending;
                self.fix_selection();
            }
            A::FilterKeep => self.overlay = None,
            A::FilterClear => {
                self.filter_mut().clear();
                self.overlay = None;
            }
            A::FilterBackspace => {
                self.filter_mut().pop();
            }
            _ => {}
        }
        vec![]
    }

    /// The overview table's columns as drawn now.
    pub fn columns(&self) -> rows::Columns {
        super::overview::table_columns(self.table_body().width, &self.rows())
    }

    /// Sorts by `col` in its natural order (numbers largest first, text
    /// A to Z); `toggle`: the same column again reverses it (a click on
    /// its header).
    fn sort_by(&mut self, col: Col, toggle: bool) {
        if toggle && self.overview.sort == col {
            self.overview.descending = !self.overview.descending;
        } else {
            self.overview.sort = col;
            self.overview.descending = !matches!(
                col,
                Col::Pid | Col::Name | Col::User | Col::Mode | Col::Gpus | Col::Flags
            );
        }
        self.fix_selection();
    }

    /// The process view's actions: panes, the time window, scrolling.
    fn process_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Back => return self.back(),
            A::NextPane => self.process.pane = self.next_pane(1),
            A::PrevPane => self.process.pane = self.next_pane(-1),
            A::ShowPane(p) => self.process.pane = p,
            A::ZoomIn => {
                self.process.span_index = self.process.span_index.saturating_sub(1);
                return self.refresh_timeline();
            }
            A::ZoomOut => {
                self.process.span_index = (self.process.span_index + 1).min(SPANS_NS.len() - 1);
                return self.refresh_timeline();
            }
            A::TimeBack => {
                if self.process.follow {
                    self.process.end_ns = self.now_ns();
                    self.process.follow = false;
                }
                self.process.end_ns = self
                    .process
                    .end_ns
                    .saturating_sub(self.span_ns() / 2)
                    .max(self.span_ns());
                return self.refresh_timeline();
            }
            A::TimeForward => {
                if !self.process.follow {
                    self.process.end_ns = self.process.end_ns.saturating_add(self.span_ns() / 2);
                    if self.process.end_ns >= self.now_ns() {
                        self.process.follow = true;
                    }
                }
                return self.refresh_timeline();
            }
            A::FollowToggle | A::FollowOn => {
                self.process.follow = !self.process.follow || action == A::FollowOn;
                if !self.process.follow {
                    self.process.end_ns = self.now_ns();
                }
                return self.refresh_timeline();
            }
            A::ScrollUp => return self.scroll(-1),
            A::ScrollDown => return self.scroll(1),
            A::ScrollPageUp => return self.scroll(-(self.pane_page() as isize)),
            A::ScrollPageDown => return self.scroll(self.pane_page() as isize),
            A::ScrollTop => {
                self.process.block_scroll = 0;
                self.process.event_scroll = 0;
                self.process.stats_scroll = 0;
            }
            _ => {}
        }
        vec![]
    }

    /// The pane `step` Tabs away: every tab on a small terminal; on a large
    /// one, where all panes show, the ones that scroll (the focus).
    fn next_pane(&self, step: isize) -> Pane {
        let panes: &[Pane] = if layout::compact(self.size) {
            &Pane::ALL
        } else {
            &Pane::FOCUSABLE
        };
        let i = panes.iter().position(|p| *p == self.process.pane);
        let n = panes.len() as isize;
        let next = match i {
            Some(i) => (i as isize + step).rem_euclid(n),
            None if step > 0 => 0,
            None => n - 1,
        };
        panes[next as usize]
    }

    /// Rows a page key scrolls in the process view.
    fn pane_page(&self) -> usize {
        layout::pane_rows(self.size, self.caption(), self.process.pane).max(1)
    }

    /// Rows a page key moves the overview's selection.
    fn page(&self) -> isize {
        self.table_rows().max(1) as isize
    }

    fn demo_speed(&mut self, faster: bool) -> Vec<Effect> {
        let Some(d) = self.demo.as_ref().filter(|d| !d.replay) else {
            return vec![];
        };
        let cur = d.speed;
        let i = SPEEDS
            .iter()
            .position(|s| *s >= cur - 1e-9)
            .unwrap_or(SPEEDS.len() - 1);
        let j = if faster {
            if SPEEDS[i] > cur + 1e-9 {
                i
            } else {
                (i + 1).min(SPEEDS.len() - 1)
            }
        } else {
            i.saturating_sub(1)
        };
        vec![Effect::DemoSpeed(SPEEDS[j])]
    }

    fn confirm_empty_cache(&mut self) -> Vec<Effect> {
        let Some(ActionState::Confirm { key, pid, .. }) = &self.action else {
            return vec![];
        };
        let (key, pid) = (*key, *pid);
        self.start_command(key, pid, Command::EmptyCache { device: None })
    }

    /// `command` goes to `pid`; the action box shows it running.
    fn start_command(&mut self, key: ProcessKey, pid: u32, command: Command) -> Vec<Effect> {
        let nvml_before = self.nvml_of(key);
        self.action = Some(ActionState::Running {
            pid,
            command,
            nvml_before,
        });
        vec![Effect::RunCommand { key, pid, command }]
    }

    fn toggle_pause(&mut self) -> Vec<Effect> {
        self.paused = !self.paused;
        if self.paused {
            vec![]
        } else {
            vec![Effect::Refresh]
        }
    }

    /// The selected process if it answers commands (`allocator`: and has
    /// allocator figures); otherwise the footer's reason why not.
    fn command_target(&self, allocator: bool) -> Result<&ProcessEntry, String> {
        let e = self
            .selected_entry()
            .ok_or_else(|| "no process selected".to_string())?;
        if !e.source.commands || (allocator && e.view.mode == Mode::NvmlOnly) {
            return Err(format!(
                "pid {} does not answer commands (no vramscope agent)",
                e.identity.host_pid
            ));
        }
        Ok(e)
    }

    fn ask_empty_cache(&mut self) -> Vec<Effect> {
        if self.config.readonly {
            return vec![];
        }
        let e = match self.command_target(true) {
            Ok(e) => e,
            Err(why) => {
                self.say(why);
                return vec![];
            }
        };
        self.action = Some(ActionState::Confirm {
            key: e.key(),
            pid: e.identity.host_pid,
            name: rows::display_name(e),
            reserved: Some(e.view.figures.reserved),
            allocated: Some(e.view.figures.allocated),
        });
        vec![]
    }

    fn simple_command(&mut self, command: Command) -> Vec<Effect> {
        if self.config.readonly {
            return vec![];
        }
        if matches!(self.action, Some(ActionState::Running { .. })) {
            self.say("a command is still running");
            return vec![];
        }
        match self.command_target(false) {
            Ok(e) => {
                let (key, pid) = (e.key(), e.identity.host_pid);
                self.start_command(key, pid, command)
            }
            Err(why) => {
                self.say(why);
                vec![]
            }
        }
    }

    fn back(&mut self) -> Vec<Effect> {
        self.screen = Screen::Overview;
        self.fix_selection();
        vec![Effect::Refresh]
    }

    fn move_selection(&mut self, delta: isize) -> Vec<Effect> {
        let keys: Vec<ProcessKey> = self.rows().iter().map(|r| r.entry.key()).collect();
        if keys.is_empty() {
            return vec![];
        }
        let cur = self
            .overview
            .selected
            .and_then(|k| keys.iter().position(|x| *x == k))
            .unwrap_or(0);
        let next = (cur as isize + delta).clamp(0, keys.len() as isize - 1) as usize;
        self.overview.selected = Some(keys[next]);
        self.scroll_to_selection(&keys);
        vec![]
    }

    /// Opens the process view of the selected process.
    pub fn open(&mut self) -> Vec<Effect> {
        if self.selected_entry().is_none() {
            return vec![];
        }
        self.screen = Screen::Process;
        self.process.block_scroll = 0;
        self.process.event_scroll = 0;
        self.process.stats_scroll = 0;
        self.process.follow = true;
        vec![Effect::Refresh]
    }

    /// Opens the process view of `pid` (the `--pid` start option).
    pub fn open_pid(&mut self, pid: u32) -> bool {
        let key = self
            .snap
            .processes
            .iter()
            .find(|p| p.identity.host_pid == pid || p.key().pid == pid)
            .map(|p| p.key());
        match key {
            Some(k) => {
                self.overview.selected = Some(k);
                self.open();
                true
            }
            None => false,
        }
    }

    fn refresh_timeline(&mut self) -> Vec<Effect> {
        if self.paused {
            self.say("paused: the timeline moves again after p");
            return vec![];
        }
        vec![Effect::Refresh]
    }

    /// Scrolls the pane in focus (the tab shown, or on a large terminal the
    /// pane Tab moved to), never past its last full page. Scrolling back
    /// through the event history asks for a snapshot holding further.
    fn scroll(&mut self, delta: isize) -> Vec<Effect> {
        let pane = self.process.pane;
        let filter = self.process.event_filter.to_lowercase();
        let rows = self.selected_entry().map_or(0, |e| match pane {
            Pane::Events => super::events::shown(e, &filter).count(),
            Pane::Blocks => blockmap::row_count(e),
            Pane::Stats => super::stats::row_count(e),
            Pane::Timeline | Pane::Diagnosis => 0,
        });
        let max = rows.saturating_sub(self.pane_page());
        let v = match pane {
            Pane::Events => &mut self.process.event_scroll,
            Pane::Blocks => &mut self.process.block_scroll,
            Pane::Stats => &mut self.process.stats_scroll,
            Pane::Timeline | Pane::Diagnosis => return vec![],
        };
        *v = (*v as isize + delta).clamp(0, max as isize) as usize;
        if pane == Pane::Events && delta > 0 && filter.is_empty() {
            vec![Effect::Refresh]
        } else {
            vec![]
        }
    }

    fn mouse(&mut self, m: MouseEvent) -> Vec<Effect> {
        match m.kind {
            MouseEventKind::ScrollDown | MouseEventKind::ScrollUp => {
                let d = if m.kind == MouseEventKind::ScrollDown {
                    1
                } else {
                    -1
                };
                self.dirty = true;
                match self.screen {
                    Screen::Overview => self.move_selection(d),
                    Screen::Process => self.scroll(d * 3),
                }
            }
            MouseEventKind::Down(MouseButton::Left) if self.screen == Screen::Process => {
                self.click_block(m.column, m.row);
                vec![]
            }
            MouseEventKind::Down(MouseButton::Left) if self.screen == Screen::Overview => {
                let body = self.table_body();
                // The header row: sort by the column clicked (again: reverse).
                if m.row + 1 == body.y && m.column >= body.x && m.column < body.x + body.width {
                    if let Some(col) = self.columns().at(m.column - body.x) {
                        self.sort_by(col, true);
                        self.dirty = true;
                    }
                    return vec![];
                }
                if m.row >= body.y
                    && m.row < body.y + body.height
                    && m.column >= body.x
                    && m.column < body.x + body.width
                {
                    let idx = self.overview.offset + (m.row - body.y) as usize;
                    let key = self.rows().get(idx).map(|r| r.entry.key());
                    if let Some(key) = key {
                        if self.overview.selected == Some(key) {
                            self.dirty = true;
                            return self.open();
                        }
                        self.overview.selected = Some(key);
                        self.dirty = true;
                    }
                }
                vec![]
            }
            _ => vec![],
        }
    }
}
