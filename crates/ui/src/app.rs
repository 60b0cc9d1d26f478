//! The dashboard's state machine: everything the screen shows besides the
//! snapshot itself, and how events change it. No terminal, no I/O and no
//! clock here: [`App::handle`] turns an [`AppEvent`] into state changes and
//! a list of [`Effect`]s that the loop (or a test) carries out, and time
//! arrives as [`AppEvent::Tick`]. Every decision about what to draw and when
//! is made here: the freshness label, the data-rate gate, the `--pid` wait,
//! the automatic screenshot, the frame gap ([`Pace`](crate::shell::Pace) for `App`:
//! `deadline_ns`, `should_draw`, `frame_drawn`).
//!
//! Here: the events, the effects, the state and the dispatch of keys
//! (`App::key_contexts` into [`super::keys`]'s table). Each screen's keys
//! beside it, in `ui/app/`: `overview.rs` (the process table),
//! `process.rs` (panes, the timeline's window, the block map),
//! `overlays.rs` (help, legend, By module, step diff, advisor, stacks),
//! `prompt.rs` (a filter being typed), `commands.rs` (what is sent to a
//! process), and `clock.rs` (time and frames).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{Event, KeyEvent, KeyEventKind, MouseButton, MouseEvent, MouseEventKind};
use ratatui::layout::Rect;

use vramscope_collect::demo::DemoStatus;
use vramscope_collect::trace::TraceStatus;
use vramscope_collect::{CleanedSegment, ProcessEntry, Snapshot};
use vramscope_core::model::{ProcessKey, TimelineRequest, ViewOptions};
use vramscope_wire::ring::{Command, Outcome};

use super::keys::{self, Action, Context};
use super::layout;
use super::rows::Col;
pub use super::shell::Shot;
pub use super::state::{
    ActionReport, ActionState, Overlay, OverviewState, Pane, ProcessState, Screen, DEFAULT_SPAN,
    SPANS_NS, SPEEDS,
};
use super::theme::Theme;
use super::{caption, trace};

mod clock;
mod commands;
mod overlays;
mod overview;
mod process;
mod prompt;

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
    /// A command sent to a process was answered ([`super::send_command`]).
    CommandDone(CommandDone),
    /// The snapshot App asked for with [`Effect::Refresh`].
    Snapshot(Box<Snapshot>),
    /// The frame [`Pace::frame_drawn`](crate::shell::Pace::frame_drawn) asked for was written (to this path).
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
    /// Send `command` to the process `key` (shown as `pid`) through
    /// `segment`, the segment the snapshot shows for it
    /// ([`super::send_command`]); answer with `CommandDone`.
    RunCommand {
        key: ProcessKey,
        pid: u32,
        segment: PathBuf,
        command: Command,
    },
    DemoSpeed(f64),
    DemoTogglePause,
    /// Go elsewhere in the recording played back.
    ReplaySeek(crate::keys::ReplaySeek),
    /// Rebuild the state at this event of the snapshot file's trace
    /// ([`super::Driver::seek`]); the answer goes to [`App::set_trace`].
    Seek(usize),
    /// Start the hub's live advisor if it is not running (`host`: the
    /// processes are this host's, whose environment it may read; false for
    /// a demo, a replay or a snapshot file), then advise the process `key`;
    /// a refusal goes to [`App::advise_refused`].
    Advise {
        key: ProcessKey,
        host: bool,
    },
    /// Put this text on the user's clipboard (OSC 52 to the terminal,
    /// [`super::clipboard`]).
    Copy(String),
}

/// Write one frame after a delay, then quit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScreenshotAfter {
    pub path: PathBuf,
    pub after: Duration,
}

/// At least this long between two frames.
pub const MIN_FRAME_NS: u64 = 10_000_000;
/// The slow tick (the freshness label), and when idle for a minute.
pub const TICK_NS: u64 = 1_000_000_000;
pub(crate) const IDLE_TICK_NS: u64 = 5_000_000_000;
pub(super) const IDLE_AFTER_NS: u64 = 60_000_000_000;
/// How long `--pid` waits for its process.
pub const PID_WAIT_NS: u64 = 10_000_000_000;
/// Steps `C` asks a process to capture stacks for (command 5).
pub(crate) const CAPTURE_STEPS: u32 = 10;
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
    pub(crate) data_ns: Option<u64>,
    /// A hub change waits for the data interval.
    pub data_pending: bool,
}

/// What happens once, after the start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Startup {
    /// `--pid` not seen yet.
    pub wanted_pid: Option<u32>,
    /// The automatic screenshot, not taken yet.
    pub(crate) screenshot: Option<ScreenshotAfter>,
}

/// Frames: when the last was drawn, what its freshness label said, and
/// screenshots asked for or being written.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Redraw {
    pub(crate) last_ns: Option<u64>,
    pub(crate) label: String,
    /// The next frame is to be written.
    pub(crate) shot: Option<Shot>,
    /// The frame being written.
    pub(crate) writing: Option<Shot>,
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
    /// The number of the last cleaned segment said (`CleanedSegment`).
    cleaned_seen: u64,
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
            cleaned_seen: 0,
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

    /// Now: the newer of the clock and the snapshot.
    pub(crate) fn now_ns(&self) -> u64 {
        self.clock.now_ns.max(self.snap.taken_ns)
    }

    /// What the next snapshot must contain for the current screen.
    pub fn view_options(&self) -> ViewOptions {
        let process = self.screen == Screen::Process;
        let timeline = if process {
            let (from_ns, to_ns) = self.window();
            Some(TimelineRequest {
                from_ns,
                to_ns,
                columns: layout::timeline_columns(self.size, self.caption_lines()),
            })
        } else {
            self.overview_timeline()
        };
        // The events the Events pane shows, from the newest to the scroll
        // position and a page beyond (so scrolling back has them); the
        // whole history while searching it, or once `G` went to its end.
        let recent_events = if !process {
            0
        } else if !self.process.event_filter.is_empty() {
            usize::MAX
        } else {
            let s = self.process.event_scroll;
            if s.tail() {
                // `G`: the history's end, wherever it is.
                usize::MAX
            } else {
                let rows = layout::pane_rows(self.size, self.caption_lines(), Pane::Events).max(20);
                s.offset() + 2 * rows + 64
            }
        };
        ViewOptions {
            block_map: process,
            recent_events,
            timeline,
        }
    }

    /// The one process whose detail [`Self::view_options`] asks for (the
    /// process screen's); None: every process's (the overview's timelines).
    pub(crate) fn view_focus(&self) -> Option<ProcessKey> {
        (self.screen == Screen::Process)
            .then_some(self.overview.selected)
            .flatten()
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
        self.say_cleaned(&snap.cleaned);
        self.snap = Arc::new(snap);
        self.settle_rates();
        self.note_letters();
        self.fix_selection();
        self.fit_pane();
        self.note_nvml_after();
        self.update_confirm();
        self.dirty = true;
    }

    /// Gives the modules each process shows for the first time their
    /// letters (kept for the life of the dashboard; issue 34, item A), and
    /// forgets the processes the snapshot no longer has.
    fn note_letters(&mut self) {
        let letters = &mut self.process.letters;
        let procs = &self.snap.processes;
        letters.retain(|k, _| procs.iter().any(|p| p.key() == *k));
        (self.overview.cleared).retain(|k| procs.iter().any(|p| p.key() == *k));
        for p in procs {
            if !p.view.attribution.by_module.is_empty() {
                (letters.entry(p.key()).or_default()).note(&p.view.attribution);
            }
        }
    }

    /// The caption band: a demo's, or a snapshot file's trace.
    pub(crate) fn caption(&self) -> Option<caption::Caption> {
        let t = &self.config.theme;
        match (&self.demo, &self.trace) {
            (Some(d), _) => Some(caption::demo_caption(d, t)),
            (None, Some(s)) => Some(trace::caption(s, t)),
            (None, None) => None,
        }
    }

    /// The lines of the caption band (none: 0).
    pub(crate) fn caption_lines(&self) -> u16 {
        self.caption().map_or(0, |c| c.lines(self.size))
    }

    pub fn set_trace(&mut self, status: Option<TraceStatus>) {
        self.process.trace_window = status.as_ref().map(|s| s.window_ns);
        if self.trace != status {
            self.trace = status;
            self.settle_rates();
            self.dirty = true;
        }
    }

    /// No event rate where nothing arrives: a snapshot file has none (the
    /// model would measure its trace, moved to end now, as a burst), and a
    /// recording played to its end has 0 (the model's rate still counts
    /// its last events; issue 30, item 10).
    fn settle_rates(&mut self) {
        let rate = match (&self.trace, &self.demo) {
            (Some(_), _) => None,
            (None, Some(d)) if d.ended => Some(0.0),
            _ => return,
        };
        for p in &mut Arc::make_mut(&mut self.snap).processes {
            p.view.figures.events_per_sec = rate;
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
            self.settle_rates();
            self.dirty = true;
        }
    }

    /// Says which segments the collector removed since the last snapshot
    /// (their producers were gone).
    fn say_cleaned(&mut self, cleaned: &[CleanedSegment]) {
        let new: Vec<&CleanedSegment> = (cleaned.iter())
            .filter(|c| c.number > self.cleaned_seen)
            .collect();
        let Some(last) = new.last() else { return };
        self.cleaned_seen = last.number;
        let text = match new.len() {
            1 => format!(
                "removed {}: its producer (pid {}) is gone",
                last.path, last.pid
            ),
            n => format!(
                "removed {n} segments whose producers were gone (the last: {}, pid {})",
                last.path, last.pid
            ),
        };
        self.say(text);
    }

    /// Shows `text` in the footer for [`MESSAGE_NS`].
    pub(crate) fn say(&mut self, text: impl Into<String>) {
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
    /// The keys of what is played, when something is: a snapshot file's
    /// trace (`open FILE`) or a recording (`replay --ui`).
    pub(crate) fn playing(&self) -> Option<Context> {
        if self.trace.is_some() {
            Some(Context::Trace)
        } else if self.demo.as_ref().is_some_and(|d| d.replay) {
            Some(Context::Replay)
        } else {
            None
        }
    }

    fn key_contexts(&self) -> Vec<Context> {
        if self.typing() {
            return vec![Context::Always, Context::Filter];
        }
        if matches!(self.action, Some(ActionState::Confirm { .. })) {
            return vec![Context::Always, Context::Confirm];
        }
        match self.overlay {
            Some(Overlay::Help(_)) => return vec![Context::Always, Context::Help],
            Some(Overlay::Legend(_)) => return vec![Context::Always, Context::Legend],
            Some(Overlay::Modules(_)) => return vec![Context::Always, Context::Modules],
            Some(Overlay::StepDiff(_)) => return vec![Context::Always, Context::StepDiff],
            Some(Overlay::Advisor(_)) => return vec![Context::Always, Context::Advisor],
            Some(Overlay::Fit) => return vec![Context::Always, Context::Fit],
            Some(Overlay::Stacks) => return vec![Context::Always, Context::Stacks, Context::Trace],
            Some(Overlay::Prompt) | None => {}
        }
        let mut c = vec![Context::Always];
        if matches!(self.action, Some(ActionState::Done(_))) {
            c.push(Context::Report);
        }
        c.extend(self.playing());
        c.push(Context::Global);
        c.push(match self.screen {
            Screen::Overview => Context::Overview,
            Screen::Process => Context::Process,
        });
        c
    }

    fn key(&mut self, k: KeyEvent) -> Vec<Effect> {
        let action = keys::action(&k, &self.key_contexts());
        if self.typing() {
            return self.type_key(k, action);
        }
        action.map_or_else(Vec::new, |a| self.act(a))
    }

    /// Carries out what a key asked for: the quit, pause, demo, screenshot
    /// and trace keys here; the rest beside their screen or overlay
    /// (`app/overview.rs`, `app/process.rs`, `app/overlays.rs`,
    /// `app/commands.rs`, `app/prompt.rs`).
    fn act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Quit => {
                self.quit = true;
                vec![Effect::Quit]
            }
            A::Pause => self.toggle_pause(),
            // The demo's simulation, or the recording played back.
            A::PauseSim if self.demo.is_some() => vec![Effect::DemoTogglePause],
            A::ReplaySeek(to) => vec![Effect::ReplaySeek(to)],
            A::PauseSim => self.toggle_pause(),
            A::Screenshot => {
                // An automatic screenshot already asked for goes first.
                if self.redraw.shot.is_none() {
                    self.redraw.shot = Some(Shot {
                        path: None,
                        then_quit: false,
                    });
                }
                vec![]
            }
            A::DemoSlower | A::DemoFaster => self.demo_speed(action == A::DemoFaster),
            A::TraceStep(d) => self.seek(|s| s.at.saturating_add_signed(d as isize)),
            A::TraceFirst => self.seek(|_| 0),
            A::TraceLast => self.seek(|s| s.total),
            // The fleet view's (the dashboard takes every change at once).
            A::Refresh => vec![],
            A::EmptyCache
            | A::ResetPeaks
            | A::RequestSnapshot
            | A::CaptureStacks
            | A::ConfirmYes
            | A::ConfirmNo
            | A::CloseReport => self.command_act(action),
            // The overlay up takes the scroll keys; else the pane in focus.
            A::Scroll(m) if self.overlay.is_some() => {
                self.overlay_scroll(m);
                vec![]
            }
            A::Scroll(m) => self.scroll_pane(m.down(), |s| s.go(m)),
            A::Help
            | A::CloseHelp
            | A::Legend
            | A::CloseLegend
            | A::Modules
            | A::CloseModules
            | A::ModulesSort
            | A::ModulesReverse
            | A::ModulesRole
            | A::ModulesOnly
            | A::StepDiff
            | A::CloseStepDiff
            | A::StepDiffOlder
            | A::StepDiffNewer
            | A::Advisor
            | A::CloseAdvisor
            | A::AdvisorCopy
            | A::Fit
            | A::CloseFit
            | A::TraceStacks
            | A::CloseStacks => self.overlay_act(action),
            A::FilterKeep | A::FilterClear | A::FilterBackspace => self.prompt_act(action),
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
            | A::ClearExited => self.overview_act(action),
            A::Back | A::SearchEvents | A::NextPane | A::PrevPane | A::ShowPane(_) => {
                self.process_act(action)
            }
            A::ZoomIn
            | A::ZoomOut
            | A::TimeBack
            | A::TimeForward
            | A::FollowToggle
            | A::FollowOn => self.window_act(action),
            A::BlockColouring | A::BlockOnly | A::BlockNext | A::BlockPrev | A::BlockClear => {
                self.block_act(action);
                vec![]
            }
        }
    }

    fn demo_speed(&mut self, faster: bool) -> Vec<Effect> {
        let Some(d) = self.demo.as_ref() else {
            return vec![];
        };
        let cur = d.speed;
        // A replay may run faster than the list goes (--speed): not slower
        // for asking faster.
        if faster && cur >= SPEEDS[SPEEDS.len() - 1] {
            return vec![];
        }
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

    fn toggle_pause(&mut self) -> Vec<Effect> {
        self.paused = !self.paused;
        if self.paused {
            vec![]
        } else {
            vec![Effect::Refresh]
        }
    }

    /// The wheel scrolls (the selection, or the pane in focus); a click
    /// goes to the screen's own handling.
    fn mouse(&mut self, m: MouseEvent) -> Vec<Effect> {
        let wheel = match m.kind {
            MouseEventKind::ScrollDown => 1,
            MouseEventKind::ScrollUp => -1,
            MouseEventKind::Down(MouseButton::Left) => {
                return match self.screen {
                    Screen::Overview => self.click_table(m.column, m.row),
                    Screen::Process => {
                        self.click_block(m.column, m.row);
                        vec![]
                    }
                };
            }
            _ => return vec![],
        };
        self.dirty = true;
        match self.screen {
            Screen::Overview => self.move_selection(wheel),
            Screen::Process => self.scroll_pane(wheel > 0, |s| s.by(wheel * 3)),
        }
    }
}
