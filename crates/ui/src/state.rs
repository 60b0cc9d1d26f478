//! The dashboard's state, grouped by screen: what [`super::App`] changes and
//! the panes draw. Plain data and small derived values; no events here.

use std::collections::HashSet;

use super::rows::{self, Col, Row};
use super::scroll::Scroll;
use vramscope_collect::Snapshot;
use vramscope_core::model::ProcessKey;
use vramscope_wire::ring::{Command, Outcome, Status};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Screen {
    Overview,
    Process,
}

pub use super::layout::Pane;

/// Time windows `+` and `-` step through.
pub const SPANS_NS: [u64; 13] = [
    1_000_000_000,
    2_000_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
    60_000_000_000,
    120_000_000_000,
    300_000_000_000,
    600_000_000_000,
    1_800_000_000_000,
    3_600_000_000_000,
    10_800_000_000_000,
    43_200_000_000_000,
];
pub const DEFAULT_SPAN: usize = 4;

/// Demo speeds `[` and `]` step through.
pub const SPEEDS: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// What is drawn over the screen and takes its keys: one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overlay {
    /// The keys (`?`), scrolled (a small terminal).
    Help(Scroll),
    /// The legend (`L`), scrolled.
    Legend(Scroll),
    /// The "By module" table of the selected process (`M`).
    Modules(super::attribution::ModulesView),
    /// What an earlier step left alive (`d`).
    StepDiff(super::stepdiff::StepDiffView),
    /// The allocator advisor's advice for the selected process (`A`).
    Advisor(super::advisor::AdvisorView),
    /// The selected process at other multiples of its batch (`F`).
    Fit,
    /// The stacks of a snapshot file's event (`t`; its stepping keys still
    /// count).
    Stacks,
    /// A filter being typed (keys are text): the overview's, or the
    /// process view's search of the events.
    Prompt,
}

/// A process action's life: asked, running, answered.
#[derive(Debug, Clone, PartialEq)]
pub enum ActionState {
    /// `e` pressed: waiting for y/n.
    Confirm {
        key: ProcessKey,
        pid: u32,
        name: String,
        reserved: Option<u64>,
        allocated: Option<u64>,
    },
    Running {
        pid: u32,
        command: Command,
        /// NVML used of the target when the command was posted.
        nvml_before: Option<u64>,
    },
    Done(ActionReport),
}

/// What a finished command did.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionReport {
    pub(crate) pid: u32,
    pub(crate) key: ProcessKey,
    pub(crate) command: Command,
    pub(crate) status: Result<Status, String>,
    pub(crate) outcome: Option<Outcome>,
    /// NVML used when the command was posted.
    pub nvml_before: Option<u64>,
    /// NVML used in the first NVML sample taken after the answer.
    pub nvml_after: Option<u64>,
    /// NVML sample time when the answer came (to spot the next sample).
    pub(crate) nvml_sampled_at_done: Option<u64>,
}

impl ActionReport {
    pub fn released(&self) -> Option<u64> {
        let o = self.outcome?;
        matches!(self.command, Command::EmptyCache { .. })
            .then(|| o.result0.saturating_sub(o.result1))
    }
}

/// The overview: the process table's selection, scroll, order and filter.
/// The selection is also the process the process view shows.
#[derive(Debug, Clone, PartialEq)]
pub struct OverviewState {
    pub selected: Option<ProcessKey>,
    /// The table rows shown (they follow the selection).
    pub scroll: Scroll,
    pub sort: Col,
    pub descending: bool,
    pub filter: String,
    /// Exited processes cleared from the table (`X`), until the collector
    /// forgets them too.
    pub cleared: HashSet<ProcessKey>,
}

impl Default for OverviewState {
    fn default() -> Self {
        OverviewState {
            selected: None,
            scroll: Scroll::default(),
            sort: Col::Reserved,
            descending: true,
            filter: String::new(),
            cleared: HashSet::new(),
        }
    }
}

impl OverviewState {
    /// The rows of the table, filtered and sorted.
    pub(crate) fn rows<'a>(&self, snap: &'a Snapshot) -> Vec<Row<'a>> {
        rows::rows(
            snap,
            &self.filter,
            &self.cleared,
            self.sort,
            self.descending,
        )
    }
}

/// The process view: the pane shown (tabs), the time window and the scroll
/// of each pane that scrolls.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessState {
    pub pane: Pane,
    /// Into [`SPANS_NS`].
    pub span_index: usize,
    /// The window ends now (else at `end_ns`).
    pub follow: bool,
    /// Window end when not following (collector ns).
    pub(crate) end_ns: u64,
    /// The window a snapshot file's trace fixes (`open FILE`): all of it,
    /// whatever the zoom and the clock.
    pub(crate) trace_window: Option<(u64, u64)>,
    /// The block map's rows shown.
    pub block_scroll: Scroll,
    /// The events shown (newest first).
    pub event_scroll: Scroll,
    /// The memory summary's rows shown.
    pub stats_scroll: Scroll,
    /// The OOM & leak pane's lines shown.
    pub diagnosis_scroll: Scroll,
    /// The event history's search (lower-case match on an event's line).
    pub(crate) event_filter: String,
    /// What the block map's colours say (`c`).
    pub(crate) colouring: super::blockmap::Colouring,
    /// The block map shows only these blocks (`v`, Enter in By module).
    pub only: Option<super::blockmap::Only>,
    /// The selected block's address (`n`/`N`).
    pub selected_block: Option<u64>,
    /// The letter of each module in the block map and By module, per
    /// process, given when the module is first seen and kept (processes
    /// no longer in the snapshot are forgotten).
    pub(crate) letters: std::collections::BTreeMap<ProcessKey, super::letters::ModuleLetters>,
}

impl Default for ProcessState {
    fn default() -> Self {
        ProcessState {
            pane: Pane::Timeline,
            span_index: DEFAULT_SPAN,
            follow: true,
            end_ns: 0,
            trace_window: None,
            block_scroll: Scroll::default(),
            event_scroll: Scroll::default(),
            stats_scroll: Scroll::default(),
            diagnosis_scroll: Scroll::default(),
            event_filter: String::new(),
            colouring: Default::default(),
            only: None,
            selected_block: None,
            letters: Default::default(),
        }
    }
}

impl ProcessState {
    /// How the block map of process `key` is drawn, for a snapshot taken
    /// at `taken_ns`.
    pub(crate) fn map_view(&self, taken_ns: u64, key: ProcessKey) -> super::blockmap::MapView<'_> {
        super::blockmap::MapView {
            letters: self.letters.get(&key),
            scroll: self.block_scroll,
            colouring: self.colouring,
            only: self.only.as_ref(),
            selected: self.selected_block,
            taken_ns,
        }
    }

    /// The scroll of `pane` (None: the timeline, which does not scroll).
    pub(crate) fn scroll_mut(&mut self, pane: Pane) -> Option<&mut Scroll> {
        match pane {
            Pane::Blocks => Some(&mut self.block_scroll),
            Pane::Stats => Some(&mut self.stats_scroll),
            Pane::Events => Some(&mut self.event_scroll),
            Pane::Diagnosis => Some(&mut self.diagnosis_scroll),
            Pane::Timeline => None,
        }
    }

    /// Every pane at its top (a process opened).
    pub(crate) fn scroll_home(&mut self) {
        for pane in Pane::FOCUSABLE {
            if let Some(s) = self.scroll_mut(pane) {
                *s = Scroll::default();
            }
        }
    }

    pub(crate) fn span_ns(&self) -> u64 {
        match self.trace_window {
            Some((from, to)) => to.saturating_sub(from),
            None => SPANS_NS[self.span_index.min(SPANS_NS.len() - 1)],
        }
    }

    /// The timeline window `[from, to)` in collector ns, `now` being the
    /// newer of the clock and the snapshot.
    pub(crate) fn window(&self, now: u64) -> (u64, u64) {
        if let Some(w) = self.trace_window {
            return w;
        }
        let to = if self.follow { now } else { self.end_ns };
        (to.saturating_sub(self.span_ns()), to)
    }
}
