//! The one key table: every key of every screen (the dashboard's and the
//! fleet view's), the [`Action`] it stands for, where it counts
//! ([`Context`]), its line in the help overlay and its hint in the footer.
//! [`super::App`] and [`super::fleet::app::FleetApp`] dispatch through
//! [`action`], [`super::help`] lists [`KEYS`], and [`super::bars`] builds
//! the footer from [`footer`], so the three never disagree. An action
//! both screens have is bound to the same keys in both (a test checks).
//!
//! A binding matches on the key code alone (a shifted `S` arrives as `S`
//! with SHIFT), except `ctrl` bindings, which need CONTROL. Only
//! `KeyEventKind::Press` counts; the caller checks that.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use serde::{Deserialize, Serialize};

use super::scroll::Move;
use super::state::Pane;

/// Where `replay --ui` goes: a step back or on (a step's start: its
/// `vramscope.mark()` or optimizer step), or the recording's start or end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplaySeek {
    PrevStep,
    NextStep,
    Start,
    End,
}

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Action {
    Quit,
    Help,
    CloseHelp,
    /// The legend overlay: what columns, glyphs and words mean.
    Legend,
    CloseLegend,
    /// Scroll whatever scrolls: the help, the legend, the step diff, the
    /// pane in focus; the selected row of By module and the advisor. The
    /// same keys in every one of them ([`Move`]).
    Scroll(Move),
    /// Freeze the view (no new snapshots).
    Pause,
    /// Space: the demo's simulation when there is one, else [`Action::Pause`].
    PauseSim,
    Screenshot,
    DemoSlower,
    DemoFaster,
    /// Ask y/n, then `torch.cuda.empty_cache()` in the selected process.
    EmptyCache,
    ResetPeaks,
    RequestSnapshot,
    ConfirmYes,
    ConfirmNo,
    /// Close a finished command's report.
    CloseReport,
    SelectUp,
    SelectDown,
    SelectPageUp,
    SelectPageDown,
    SelectFirst,
    SelectLast,
    Open,
    EditFilter,
    /// Esc in the overview: clear the filter and the message.
    ClearFilter,
    SortNext,
    SortReverse,
    /// Clear the exited processes from the overview now.
    ClearExited,
    /// While typing a filter: keep it.
    FilterKeep,
    /// While typing a filter: drop it.
    FilterClear,
    FilterBackspace,
    /// `/` in the process view: type a search of the event history.
    SearchEvents,
    Back,
    NextPane,
    PrevPane,
    ShowPane(Pane),
    ZoomIn,
    ZoomOut,
    TimeBack,
    TimeForward,
    FollowToggle,
    FollowOn,
    /// The "By module" overlay (attribution) of the selected process.
    Modules,
    CloseModules,
    ModulesSort,
    ModulesReverse,
    /// The "By module" table shows one role's bytes (parameter, gradient,
    /// ...), then the next, then all again.
    ModulesRole,
    /// Enter in the "By module" table: the block map shows only that module.
    ModulesOnly,
    /// The block map's colours: state, module, phase.
    BlockColouring,
    /// The block map shows only the next module or phase of its legend.
    BlockOnly,
    /// Select the next / previous block of the map (allocated, shown).
    BlockNext,
    BlockPrev,
    /// No block selected, no filter.
    BlockClear,
    /// Capture Python stacks for the next steps (command 5).
    CaptureStacks,
    /// The step diff overlay: what an earlier step left alive.
    StepDiff,
    CloseStepDiff,
    /// k one step further back / nearer.
    StepDiffOlder,
    StepDiffNewer,
    /// A recording played back (`replay --ui`): go there in it.
    ReplaySeek(ReplaySeek),
    /// A snapshot file's trace: this many events forward (back if negative).
    TraceStep(i32),
    /// Before the trace's first event.
    TraceFirst,
    /// The file's own state, after the last event.
    TraceLast,
    /// The stack overlay of the event (toggle).
    TraceStacks,
    CloseStacks,
    /// The fleet view: ask Prometheus now.
    Refresh,
    /// The advisor overlay of the selected process: starts advising it
    /// (the hub's live advisor) if nothing does yet.
    Advisor,
    CloseAdvisor,
    /// The "will it fit" overlay of the selected process: the job at other
    /// multiples of its batch (the advisor makes it; started as for
    /// `Advisor`).
    Fit,
    CloseFit,
    /// Copy the selected candidate's `PYTORCH_CUDA_ALLOC_CONF=…` line
    /// (OSC 52, and shown in the footer).
    AdvisorCopy,
}

impl Action {
    /// Sends something to a process (off in read-only mode).
    pub(crate) fn is_process_action(self) -> bool {
        matches!(
            self,
            Action::EmptyCache
                | Action::ResetPeaks
                | Action::RequestSnapshot
                | Action::CaptureStacks
        )
    }
}

/// Where a binding counts. Modal contexts (a filter being typed, the y/n
/// question, the help overlay) take every key; otherwise a finished
/// command's report, then the global keys, then the screen's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Context {
    /// Everywhere, modal contexts included (Ctrl-C).
    Always,
    Filter,
    Confirm,
    Help,
    Legend,
    /// The "By module" overlay.
    Modules,
    /// The step diff overlay.
    StepDiff,
    /// The allocator advisor overlay.
    Advisor,
    /// The "will it fit" overlay.
    Fit,
    /// A finished command's report is shown (it does not take other keys).
    Report,
    /// A snapshot file's trace is shown (`open FILE`).
    Trace,
    /// A recording is played back (`replay --ui`).
    Replay,
    /// The stack overlay is up (stepping keys still count).
    Stacks,
    Global,
    Overview,
    Process,
    /// Every screen of the fleet view.
    Fleet,
    /// The fleet's lists: every node, every job.
    FleetList,
    /// The fleet's node screen: one node's GPUs and processes.
    FleetNode,
}

impl Context {
    /// The section title in the help overlay.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Context::Global => "Global",
            Context::Overview => "Overview",
            Context::Process => "Process view",
            Context::Always => "Always",
            Context::Filter => "Filter",
            Context::Confirm => "Confirm",
            Context::Help => "Help",
            Context::Legend => "Legend",
            Context::Modules => "By module",
            Context::StepDiff => "Step diff",
            Context::Advisor => "Advisor",
            Context::Fit => "Will it fit",
            Context::Report => "Report",
            Context::Trace => "Snapshot file",
            Context::Replay => "Replay",
            Context::Stacks => "Stacks",
            Context::Fleet => "Fleet",
            Context::FleetList => "Nodes and jobs",
            Context::FleetNode => "One node",
        }
    }
}

/// A key: its code, and whether Control must be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) code: KeyCode,
    pub(crate) ctrl: bool,
}

impl Key {
    pub(crate) fn matches(&self, k: &KeyEvent) -> bool {
        self.code == k.code && (!self.ctrl || k.modifiers.contains(KeyModifiers::CONTROL))
    }
}

/// When a footer hint is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shown {
    Always,
    /// Only while a demo runs.
    Demo,
}

/// A footer hint: `key text`, placed by `order` (screen hints first), and
/// left out from the right when the line is too narrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hint {
    pub(crate) key: &'static str,
    pub(crate) text: &'static str,
    pub(crate) order: u8,
    pub(crate) shown: Shown,
    /// Always on the footer's right end, whatever else it shows (messages
    /// included): how to get help and how to leave.
    pub(crate) pinned: bool,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    pub(crate) keys: &'static [Key],
    pub(crate) action: Action,
    pub(crate) context: Context,
    /// The help overlay's line (keys as written there, what they do). A
    /// binding without one is described by a neighbour's line.
    pub help: Option<(&'static str, &'static str)>,
    pub(crate) footer: Option<Hint>,
}

const fn c(ch: char) -> Key {
    Key {
        code: KeyCode::Char(ch),
        ctrl: false,
    }
}

const fn k(code: KeyCode) -> Key {
    Key { code, ctrl: false }
}

const fn ctrl(ch: char) -> Key {
    Key {
        code: KeyCode::Char(ch),
        ctrl: true,
    }
}

const fn bind(context: Context, keys: &'static [Key], action: Action) -> Binding {
    Binding {
        keys,
        action,
        context,
        help: None,
        footer: None,
    }
}

impl Binding {
    const fn help(mut self, keys: &'static str, text: &'static str) -> Binding {
        self.help = Some((keys, text));
        self
    }

    const fn hint(mut self, key: &'static str, text: &'static str, order: u8) -> Binding {
        self.footer = Some(Hint {
            key,
            text,
            order,
            shown: Shown::Always,
            pinned: false,
        });
        self
    }

    const fn pinned(mut self) -> Binding {
        if let Some(h) = &mut self.footer {
            h.pinned = true;
        }
        self
    }

    const fn shown(mut self, shown: Shown) -> Binding {
        if let Some(h) = &mut self.footer {
            h.shown = shown;
        }
        self
    }
}

use Action as A;
use Context::{
    Advisor, Always, Confirm, Filter, Fit, Fleet, FleetList, FleetNode, Global, Help, Legend,
    Modules, Overview, Process, Replay, Report, Stacks, StepDiff, Trace,
};
use KeyCode::{
    BackTab, Backspace, Down, End, Enter, Esc, Home, Left, PageDown, PageUp, Right, Tab, Up, F,
};
use ReplaySeek as Seek;

/// Every key. The help overlay lists the Global, Overview and Process
/// bindings that have a help line, in this order.
pub const KEYS: &[Binding] = &[
    // Everywhere.
    bind(Always, &[ctrl('c'), ctrl('C')], A::Quit),
    // Typing a filter (other characters are typed).
    bind(Filter, &[k(Esc)], A::FilterClear).hint("Esc", "clear", 2),
    bind(Filter, &[k(Enter)], A::FilterKeep).hint("Enter", "keep", 1),
    bind(Filter, &[k(Backspace)], A::FilterBackspace),
    bind(Filter, &[k(Up)], A::SelectUp).hint("↑↓", "select", 3),
    bind(Filter, &[k(Down)], A::SelectDown),
    // The empty-cache question (other keys are ignored).
    bind(Confirm, &[c('y'), c('Y')], A::ConfirmYes),
    bind(Confirm, &[c('n'), c('N'), k(Esc)], A::ConfirmNo),
    // The help overlay (other keys are ignored).
    bind(Help, &[k(Esc), c('?'), c('q'), k(F(1))], A::CloseHelp),
    bind(Help, &[k(Up), c('k')], A::Scroll(Move::Up)),
    bind(Help, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(Help, &[k(PageUp)], A::Scroll(Move::PageUp)),
    bind(Help, &[k(PageDown)], A::Scroll(Move::PageDown)),
    bind(Help, &[k(Home), c('g')], A::Scroll(Move::Home)),
    bind(Help, &[k(End), c('G')], A::Scroll(Move::End)),
    // The legend overlay (other keys are ignored).
    bind(Legend, &[k(Esc), c('L'), c('q'), k(F(2))], A::CloseLegend),
    bind(Legend, &[k(Up), c('k')], A::Scroll(Move::Up)),
    bind(Legend, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(Legend, &[k(PageUp)], A::Scroll(Move::PageUp)),
    bind(Legend, &[k(PageDown)], A::Scroll(Move::PageDown)),
    bind(Legend, &[k(Home), c('g')], A::Scroll(Move::Home)),
    bind(Legend, &[k(End), c('G')], A::Scroll(Move::End)),
    // The "By module" overlay (other keys are ignored; the footer names
    // its keys while it is up: issue 46, item 15).
    bind(Modules, &[k(Esc), c('M'), c('q')], A::CloseModules)
        .hint("Esc", "close", 46)
        .pinned(),
    bind(Modules, &[c('o')], A::ModulesSort).hint("o/O", "sort", 3),
    bind(Modules, &[c('O')], A::ModulesReverse),
    bind(Modules, &[c('r')], A::ModulesRole).hint("r", "role", 4),
    bind(Modules, &[k(Up), c('k')], A::Scroll(Move::Up)).hint("↑↓", "move", 1),
    bind(Modules, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(Modules, &[k(PageUp)], A::Scroll(Move::PageUp)),
    bind(Modules, &[k(PageDown)], A::Scroll(Move::PageDown)),
    bind(Modules, &[k(Home), c('g')], A::Scroll(Move::Home)),
    bind(Modules, &[k(End), c('G')], A::Scroll(Move::End)),
    bind(Modules, &[k(Enter)], A::ModulesOnly).hint("Enter", "map only this", 2),
    bind(Modules, &[c(' ')], A::PauseSim)
        .hint("space", "pause sim", 5)
        .shown(Shown::Demo),
    // The step diff overlay (other keys are ignored; the footer names its
    // keys).
    bind(StepDiff, &[k(Esc), c('d'), c('q')], A::CloseStepDiff)
        .hint("Esc", "close", 46)
        .pinned(),
    // Space pauses the demo's simulation under the overlays that do not
    // take it (issue 46, item 2).
    bind(StepDiff, &[c(' ')], A::PauseSim)
        .hint("space", "pause sim", 5)
        .shown(Shown::Demo),
    bind(StepDiff, &[c('+'), c('='), k(Left)], A::StepDiffOlder).hint("+", "older step", 1),
    bind(StepDiff, &[c('-'), c('_'), k(Right)], A::StepDiffNewer).hint("-", "newer", 2),
    bind(StepDiff, &[k(Up), c('k')], A::Scroll(Move::Up)).hint("j/k", "scroll", 3),
    bind(StepDiff, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(StepDiff, &[k(PageUp)], A::Scroll(Move::PageUp)),
    bind(StepDiff, &[k(PageDown)], A::Scroll(Move::PageDown)),
    bind(StepDiff, &[k(Home), c('g')], A::Scroll(Move::Home)),
    bind(StepDiff, &[k(End), c('G')], A::Scroll(Move::End)),
    // The advisor overlay (other keys are ignored).
    bind(Advisor, &[k(Esc), c('A'), c('q')], A::CloseAdvisor),
    bind(Advisor, &[k(Up), c('k')], A::Scroll(Move::Up)),
    bind(Advisor, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(Advisor, &[c('y')], A::AdvisorCopy),
    bind(Advisor, &[c(' ')], A::PauseSim),
    // The "will it fit" overlay (other keys are ignored).
    bind(Fit, &[k(Esc), c('F'), c('q')], A::CloseFit),
    bind(Fit, &[c(' ')], A::PauseSim),
    // A finished command's report.
    bind(Report, &[k(Esc)], A::CloseReport),
    // The stack overlay (stepping keys go on to the trace's).
    bind(Stacks, &[k(Esc), c('t'), c('q')], A::CloseStacks),
    // A snapshot file's trace (before Global: its [ ] are not the demo's).
    bind(Trace, &[c(']')], A::TraceStep(1))
        .help("[ ]", "event back / forward")
        .hint("[ ]", "step", 0),
    bind(Trace, &[c('[')], A::TraceStep(-1)),
    bind(Trace, &[c('}')], A::TraceStep(100)).help("{ }", "100 events back / forward"),
    bind(Trace, &[c('{')], A::TraceStep(-100)),
    bind(Trace, &[k(Home)], A::TraceFirst).help("Home End", "first / last event"),
    bind(Trace, &[k(End)], A::TraceLast),
    bind(Trace, &[c('t')], A::TraceStacks)
        .help("t", "stacks of event and block")
        .hint("t", "stacks", 0),
    // A recording played back (before Global: its [ ] are not the
    // demo's speed, and before the screens: Home End are its own).
    bind(Replay, &[c(' ')], A::PauseSim)
        .help("space", "pause / play the recording")
        .hint("space", "play/pause", 0),
    bind(Replay, &[c(']')], A::ReplaySeek(Seek::NextStep))
        .help("[ ]", "step back / on")
        .hint("[ ]", "step", 0),
    bind(Replay, &[c('[')], A::ReplaySeek(Seek::PrevStep)),
    bind(Replay, &[c('<'), c(',')], A::DemoSlower)
        .help("< >", "slower / faster")
        .hint("< >", "speed", 0),
    bind(Replay, &[c('>'), c('.')], A::DemoFaster),
    bind(Replay, &[k(Home)], A::ReplaySeek(Seek::Start))
        .help("Home End", "the recording's start / end"),
    bind(Replay, &[k(End)], A::ReplaySeek(Seek::End)),
    // Global.
    bind(Global, &[c('q')], A::Quit)
        .help("q Ctrl-C", "quit")
        .hint("q", "quit", 46)
        .pinned(),
    bind(Global, &[c('?'), k(F(1))], A::Help)
        .help("?", "this help (Esc closes)")
        .hint("?", "help", 45)
        .pinned(),
    bind(Global, &[c('L'), k(F(2))], A::Legend)
        .help("L F2", "legend of the screen")
        .hint("L", "legend", 44)
        .pinned(),
    bind(Global, &[c('p')], A::Pause)
        .help("p", "pause the view (freeze)")
        .hint("p", "pause", 44),
    bind(Global, &[c(' ')], A::PauseSim)
        .help("space", "pause (demo: simulation)")
        .hint("space", "pause sim", 43)
        .shown(Shown::Demo),
    bind(Global, &[c('[')], A::DemoSlower)
        .help("[ ]", "demo speed down / up")
        .hint("[ ]", "speed", 42)
        .shown(Shown::Demo),
    bind(Global, &[c(']')], A::DemoFaster),
    bind(Global, &[c('S')], A::Screenshot)
        .help("S", "save the screen as SVG")
        .hint("S", "svg", 43),
    bind(Global, &[c('e')], A::EmptyCache)
        .help("e", "empty_cache (asks y/n)")
        .hint("e", "empty cache", 40),
    bind(Global, &[c('r')], A::ResetPeaks)
        .help("r", "reset peak statistics")
        .hint("r", "reset peaks", 41),
    bind(Global, &[c('s')], A::RequestSnapshot).help("s", "resync the block map"),
    // Overview.
    bind(Overview, &[k(Up), c('k')], A::SelectUp)
        .help("Up Down j k", "select a process")
        .hint("↑↓", "select", 1),
    bind(Overview, &[k(Down), c('j')], A::SelectDown),
    bind(Overview, &[k(PageUp)], A::SelectPageUp).help("PgUp/Dn g G", "page / first / last"),
    bind(Overview, &[k(PageDown)], A::SelectPageDown),
    bind(Overview, &[k(Home), c('g')], A::SelectFirst),
    bind(Overview, &[k(End), c('G')], A::SelectLast),
    bind(Overview, &[k(Enter), k(Right), c('l')], A::Open)
        .help("Enter", "open the process view")
        .hint("Enter", "open", 2),
    bind(Overview, &[c('/')], A::EditFilter)
        .help("/", "filter name/label/cmd/pid")
        .hint("/", "filter", 3),
    bind(Overview, &[c('o')], A::SortNext)
        .help("o  O", "sort column / reverse")
        .hint("o/O", "sort", 4),
    bind(Overview, &[c('O')], A::SortReverse),
    bind(Overview, &[k(Esc)], A::ClearFilter).help("Esc", "clear the filter"),
    bind(Overview, &[c('X')], A::ClearExited).help("X", "clear exited processes"),
    // Process view.
    bind(Process, &[k(Esc), k(Backspace), c('h')], A::Back)
        .help("Esc Bksp", "back to the overview")
        .hint("Esc", "back", 1),
    bind(Process, &[c('M')], A::Modules)
        .help("M", "bytes: module/phase/role")
        .hint("M", "modules", 9),
    bind(Process, &[c('c')], A::BlockColouring)
        .help("c", "colour: module/phase/role")
        .hint("c", "colour", 7),
    bind(Process, &[c('v')], A::BlockOnly).help("v", "map only one module/phase"),
    bind(Process, &[c('n')], A::BlockNext)
        .help("n  N", "select next / prev block")
        .hint("n/N", "block", 8),
    bind(Process, &[c('N')], A::BlockPrev),
    bind(Process, &[c('x')], A::BlockClear).help("x", "clear selection & filter"),
    bind(Process, &[c('C')], A::CaptureStacks)
        .help("C", "capture stacks, 10 steps")
        .hint("C", "stacks", 11),
    bind(Process, &[c('d')], A::StepDiff)
        .help("d", "step diff: left alive")
        .hint("d", "diff", 10),
    // Not a process action: the advisor replays what the collector already
    // reads and sends the process nothing, so it works read-only and in a
    // replay too.
    bind(Process, &[c('A')], A::Advisor)
        .help("A", "allocator setting advice")
        .hint("A", "advise", 12),
    bind(Process, &[c('F')], A::Fit).help("F", "which batch sizes fit"),
    bind(Process, &[c('/')], A::SearchEvents)
        .help("/", "search the event history")
        .hint("/", "search", 3),
    bind(Process, &[k(Tab)], A::NextPane)
        .help("Tab 1-5", "next pane (tab, or focus)")
        .hint("Tab", "pane", 2),
    bind(Process, &[k(BackTab)], A::PrevPane),
    bind(Process, &[c('1')], A::ShowPane(Pane::Timeline)),
    bind(Process, &[c('2')], A::ShowPane(Pane::Blocks)),
    bind(Process, &[c('3')], A::ShowPane(Pane::Stats)),
    bind(Process, &[c('4')], A::ShowPane(Pane::Events)),
    bind(Process, &[c('5')], A::ShowPane(Pane::Diagnosis)),
    bind(Process, &[c('+'), c('=')], A::ZoomIn)
        .help("+  -", "zoom time in / out")
        .hint("+/-", "zoom", 3),
    bind(Process, &[c('-'), c('_')], A::ZoomOut),
    bind(Process, &[k(Left)], A::TimeBack)
        .help("Left Right", "scroll back / forward")
        .hint("←/→", "scroll", 4),
    bind(Process, &[k(Right)], A::TimeForward),
    bind(Process, &[c('f')], A::FollowToggle)
        .help("f  End", "follow live (toggle/on)")
        .hint("f", "follow", 5),
    bind(Process, &[k(End)], A::FollowOn),
    bind(Process, &[k(PageDown)], A::Scroll(Move::PageDown))
        .help("PgUp/Dn j k", "scroll the pane in focus")
        .hint("j/k", "scroll", 6),
    bind(Process, &[k(PageUp)], A::Scroll(Move::PageUp)),
    bind(Process, &[k(Down), c('j')], A::Scroll(Move::Down)),
    bind(Process, &[k(Up), c('k')], A::Scroll(Move::Up)),
    // End follows live (above): the pane's end is `G` alone.
    bind(Process, &[k(Home), c('g')], A::Scroll(Move::Home))
        .help("Home g  G", "top / end of the pane"),
    bind(Process, &[c('G')], A::Scroll(Move::End)),
    // The fleet view, every screen: the dashboard's keys for the same
    // actions.
    bind(Fleet, &[c('q')], A::Quit)
        .help("q Ctrl-C", "quit")
        .hint("q", "quit", 46)
        .pinned(),
    bind(Fleet, &[c('?'), k(F(1))], A::Help)
        .help("?", "this help (Esc closes)")
        .hint("?", "help", 45)
        .pinned(),
    bind(Fleet, &[c('L'), k(F(2))], A::Legend)
        .help("L F2", "legend of the screen")
        .hint("L", "legend", 44)
        .pinned(),
    bind(Fleet, &[c('S')], A::Screenshot).help("S", "save the screen as SVG"),
    bind(Fleet, &[k(Up), c('k')], A::SelectUp)
        .help("Up Down j k", "select a row")
        .hint("↑↓", "select", 1),
    bind(Fleet, &[k(Down), c('j')], A::SelectDown),
    bind(Fleet, &[k(PageUp)], A::SelectPageUp).help("PgUp/Dn g G", "page / first / last"),
    bind(Fleet, &[k(PageDown)], A::SelectPageDown),
    bind(Fleet, &[k(Home), c('g')], A::SelectFirst),
    bind(Fleet, &[k(End), c('G')], A::SelectLast),
    bind(Fleet, &[k(Tab)], A::NextPane)
        .help("Tab", "every node / every job")
        .hint("Tab", "nodes/jobs", 3),
    bind(Fleet, &[c('/')], A::EditFilter)
        .help("/", "filter node/process/user")
        .hint("/", "filter", 4),
    bind(Fleet, &[c('o')], A::SortNext)
        .help("o  O", "sort column / reverse")
        .hint("o/O", "sort", 5),
    bind(Fleet, &[c('O')], A::SortReverse),
    bind(Fleet, &[c('r')], A::Refresh)
        .help("r", "ask Prometheus now")
        .hint("r", "refresh", 6),
    // The fleet's lists.
    bind(FleetList, &[k(Enter), k(Right), c('l')], A::Open)
        .help("Enter", "open the node (of the job)")
        .hint("Enter", "open", 2),
    bind(FleetList, &[k(Esc)], A::ClearFilter).help("Esc", "clear the filter"),
    // One node.
    bind(FleetNode, &[k(Esc), k(Backspace), c('h')], A::Back)
        .help("Esc Bksp", "back to the list")
        .hint("Esc", "back", 2),
];

/// The mouse, for the help overlay (not keys, so not in [`KEYS`]).
pub(crate) const MOUSE: &[(&str, &str)] = &[("click", "select (again: open)"), ("wheel", "scroll")];

/// The help overlay's sections, in order.
pub(crate) const HELP_SECTIONS: [Context; 3] = [Global, Overview, Process];

/// The fleet view's help sections, in order.
pub(crate) const FLEET_HELP_SECTIONS: [Context; 3] = [Fleet, FleetList, FleetNode];

/// Every screen's keys, for the man page's KEYS section: each section's
/// title and its (keys, what they do), from the one key table.
pub fn manual() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    (HELP_SECTIONS.iter())
        .chain([Context::Trace].iter())
        .chain(FLEET_HELP_SECTIONS.iter())
        .map(|&c| (c.title(), help(c).map(|(k, t, _)| (k, t)).collect()))
        .collect()
}

/// The action `key` stands for in the first of `contexts` that binds it.
pub(crate) fn action(key: &KeyEvent, contexts: &[Context]) -> Option<Action> {
    contexts.iter().find_map(|ctx| {
        KEYS.iter()
            .filter(|b| b.context == *ctx)
            .find(|b| b.keys.iter().any(|k| k.matches(key)))
            .map(|b| b.action)
    })
}

/// The help lines of one section: (keys, what they do, is a process action).
pub(crate) fn help(context: Context) -> impl Iterator<Item = (&'static str, &'static str, bool)> {
    KEYS.iter()
        .filter(move |b| b.context == context)
        .filter_map(|b| {
            b.help
                .map(|(keys, text)| (keys, text, b.action.is_process_action()))
        })
}

/// The footer hints of `contexts`, in footer order: process actions left out
/// in read-only mode, demo keys only with a demo.
pub(crate) fn footer(contexts: &[Context], readonly: bool, demo: bool) -> Vec<Hint> {
    let mut hints: Vec<Hint> = KEYS
        .iter()
        .filter(|b| contexts.contains(&b.context))
        .filter(|b| !(readonly && b.action.is_process_action()))
        .filter_map(|b| b.footer)
        .filter(|h| match h.shown {
            Shown::Always => true,
            Shown::Demo => demo,
        })
        .collect();
    hints.sort_by_key(|h| h.order);
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode, modifiers: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, modifiers)
    }

    #[test]
    fn contexts_take_precedence_in_order() {
        let esc = press(Esc, KeyModifiers::NONE);
        assert_eq!(
            action(&esc, &[Report, Global, Process]),
            Some(A::CloseReport)
        );
        assert_eq!(action(&esc, &[Global, Process]), Some(A::Back));
        assert_eq!(action(&esc, &[Global, Overview]), Some(A::ClearFilter));
        let end = press(End, KeyModifiers::NONE);
        assert_eq!(action(&end, &[Overview]), Some(A::SelectLast));
        assert_eq!(action(&end, &[Process]), Some(A::FollowOn));
    }

    #[test]
    fn ctrl_bindings_need_control() {
        let c_ = press(KeyCode::Char('c'), KeyModifiers::NONE);
        assert_eq!(action(&c_, &[Always]), None);
        let ctrl_c = press(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(action(&ctrl_c, &[Always]), Some(A::Quit));
        // A shifted letter arrives with SHIFT and still matches.
        let s = press(KeyCode::Char('S'), KeyModifiers::SHIFT);
        assert_eq!(action(&s, &[Global]), Some(A::Screenshot));
    }

    #[test]
    fn no_key_is_bound_twice_in_one_context() {
        for (i, a) in KEYS.iter().enumerate() {
            for b in &KEYS[i + 1..] {
                if a.context != b.context {
                    continue;
                }
                for ka in a.keys {
                    assert!(!b.keys.contains(ka), "{ka:?} twice in {:?}", a.context);
                }
            }
        }
    }

    /// The dashboard and the fleet view: an action both have is bound to
    /// the same keys in both (Tab, Enter, Esc, `o`/`O`, `/`, `q`, `?`, `L`,
    /// `S`, the selection keys).
    #[test]
    fn the_same_action_has_the_same_keys_on_every_screen() {
        let keys_of = |contexts: &[Context], a: Action| -> Vec<Key> {
            let mut v: Vec<Key> = KEYS
                .iter()
                .filter(|b| contexts.contains(&b.context) && b.action == a)
                .flat_map(|b| b.keys.iter().copied())
                .collect();
            v.sort_by_key(|k| format!("{k:?}"));
            v
        };
        let dashboard = [Global, Overview, Process];
        let fleet = [Fleet, FleetList, FleetNode];
        let mut shared = 0;
        for b in KEYS.iter().filter(|b| fleet.contains(&b.context)) {
            let theirs = keys_of(&dashboard, b.action);
            if theirs.is_empty() {
                continue;
            }
            shared += 1;
            assert_eq!(keys_of(&fleet, b.action), theirs, "{:?}", b.action);
        }
        assert!(shared >= 15, "{shared}");
        // Only Refresh is the fleet's own.
        for b in KEYS.iter().filter(|b| fleet.contains(&b.context)) {
            assert!(
                b.action == A::Refresh || !keys_of(&dashboard, b.action).is_empty(),
                "{:?}",
                b.action
            );
        }
    }

    /// Issue 46, item 3: every scrolled pane takes the same scroll keys,
    /// `j`/`k` (Down/Up) a line, PgDn/PgUp a page, `g`/Home the top and
    /// `G`/End the end; the process view's End follows live, so there the
    /// end is `G` alone. The help lists them.
    #[test]
    fn every_scrolled_pane_has_the_same_scroll_keys() {
        let keys_of = |ctx: Context, m: Move| -> Vec<Key> {
            (KEYS.iter())
                .filter(|b| b.context == ctx && b.action == A::Scroll(m))
                .flat_map(|b| b.keys.iter().copied())
                .collect()
        };
        let moves = [
            Move::Up,
            Move::Down,
            Move::PageUp,
            Move::PageDown,
            Move::Home,
            Move::End,
        ];
        assert_eq!(keys_of(Help, Move::Down), [k(Down), c('j')]);
        assert_eq!(keys_of(Help, Move::PageUp), [k(PageUp)]);
        assert_eq!(keys_of(Help, Move::Home), [k(Home), c('g')]);
        assert_eq!(keys_of(Help, Move::End), [k(End), c('G')]);
        for ctx in [Legend, Modules, StepDiff] {
            for m in moves {
                assert_eq!(keys_of(ctx, m), keys_of(Help, m), "{ctx:?} {m:?}");
            }
        }
        for m in moves {
            let want = match m {
                Move::End => vec![c('G')],
                _ => keys_of(Help, m),
            };
            assert_eq!(keys_of(Process, m), want, "{m:?}");
        }
        let end = press(End, KeyModifiers::NONE);
        assert_eq!(action(&end, &[Process]), Some(A::FollowOn));
        assert!(help(Process).any(|(k, t, _)| k == "Home g  G" && t.contains("top / end")));
    }

    #[test]
    fn block_map_and_capture_keys() {
        let key = |ch| press(KeyCode::Char(ch), KeyModifiers::NONE);
        assert_eq!(action(&key('c'), &[Process]), Some(A::BlockColouring));
        assert_eq!(action(&key('v'), &[Process]), Some(A::BlockOnly));
        assert_eq!(action(&key('n'), &[Process]), Some(A::BlockNext));
        assert_eq!(action(&key('N'), &[Process]), Some(A::BlockPrev));
        assert_eq!(action(&key('x'), &[Process]), Some(A::BlockClear));
        assert_eq!(action(&key('C'), &[Process]), Some(A::CaptureStacks));
        // Not in the overview, where no block map is drawn.
        assert_eq!(action(&key('C'), &[Overview]), None);
        let enter = press(Enter, KeyModifiers::NONE);
        assert_eq!(action(&enter, &[Modules]), Some(A::ModulesOnly));
        // Capturing stacks writes to the process: off in read-only mode.
        assert!(A::CaptureStacks.is_process_action());
        let help: Vec<_> = help(Process).collect();
        assert!(help.iter().any(|(k, _, process)| *k == "C" && *process));
    }

    #[test]
    fn advisor_keys() {
        let key = |ch| press(KeyCode::Char(ch), KeyModifiers::SHIFT);
        assert_eq!(action(&key('A'), &[Global, Process]), Some(A::Advisor));
        assert_eq!(action(&key('A'), &[Global, Overview]), None);
        // Its overlay takes the keys: A closes it, y copies, j/k select.
        let plain = |ch| press(KeyCode::Char(ch), KeyModifiers::NONE);
        assert_eq!(action(&key('A'), &[Advisor]), Some(A::CloseAdvisor));
        assert_eq!(action(&plain('y'), &[Advisor]), Some(A::AdvisorCopy));
        assert_eq!(action(&plain('j'), &[Advisor]), Some(A::Scroll(Move::Down)));
        let esc = press(Esc, KeyModifiers::NONE);
        assert_eq!(action(&esc, &[Always, Advisor]), Some(A::CloseAdvisor));
        // It sends the process nothing: on in read-only mode and replays,
        // listed in the help and the footer.
        assert!(!A::Advisor.is_process_action());
        assert!(help(Process).any(|(k, _, process)| k == "A" && !process));
        assert!(footer(&[Process], true, false).iter().any(|h| h.key == "A"));
    }
}
