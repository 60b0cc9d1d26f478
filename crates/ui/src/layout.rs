//! Where everything goes: pure geometry from sizes (and the GPU count), no
//! state. The same functions place the panes when drawing and map mouse
//! clicks and page sizes when handling input, so the two never disagree.
//!
//! ```text
//!  ┌ header: vramscope · processes · GPUs · PAUSED / updated 2s ago ─────────┐
//!  │ demo caption (demo mode only)                                          │
//!  ├ body: the overview, or the process view ───────────────────────────────┤
//!  │  overview:  GPUs (one line each) / process table / history per GPU     │
//!  │  process, wide (≥120×40):  info, timeline,                             │
//!  │                            block map | stats, events | OOM & leak      │
//!  │  process, compact:         info, tabs, one pane                        │
//!  └ footer: keys, or the last message ─────────────────────────────────────┘
//! ```

use ratatui::layout::{Constraint, Layout, Rect};
use serde::{Deserialize, Serialize};

use vramscope_collect::Machine;

/// The panes of the process view (tabs when the terminal is small).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pane {
    Timeline,
    Blocks,
    Stats,
    Events,
    Diagnosis,
}

impl Pane {
    pub const ALL: [Pane; 5] = [
        Pane::Timeline,
        Pane::Blocks,
        Pane::Stats,
        Pane::Events,
        Pane::Diagnosis,
    ];
    /// The panes Tab moves the focus between on a large terminal (where
    /// every pane shows): the ones that scroll.
    pub(crate) const FOCUSABLE: [Pane; 4] =
        [Pane::Blocks, Pane::Stats, Pane::Events, Pane::Diagnosis];
    pub(crate) fn title(self) -> &'static str {
        match self {
            Pane::Timeline => "Timeline",
            Pane::Blocks => "Blocks",
            Pane::Stats => "Stats",
            Pane::Events => "Events",
            Pane::Diagnosis => "OOM/Leak",
        }
    }
}

/// The frame's bands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    pub(crate) header: Rect,
    pub(crate) caption: Option<Rect>,
    pub body: Rect,
    pub(crate) footer: Rect,
}

/// The bands of a terminal of `area`, with a caption band of `caption`
/// lines (none: 0).
pub fn screen(area: Rect, caption: u16) -> Areas {
    let [header, caption_band, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(caption),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    Areas {
        header,
        caption: (caption > 0).then_some(caption_band),
        body,
        footer,
    }
}

/// Whether the process view uses tabs.
pub(crate) fn compact(size: Rect) -> bool {
    size.width < 120 || size.height < 40
}

/// Lines of the GPU block (inside its border): one per GPU, or one for
/// the NVML error, at most a third of the body.
pub(crate) fn gpu_lines(machine: &Machine, body: Rect) -> u16 {
    let n = if machine.nvml_error.is_some() || machine.gpus.is_empty() {
        1
    } else {
        machine.gpus.len() as u16
    };
    n.min((body.height / 3).max(1))
}

/// The overview's bands: the GPU block, the process table, and below it
/// the history, when the table leaves at least [`HISTORY_MIN`] lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OverviewAreas {
    pub(crate) gpus: Rect,
    pub(crate) table: Rect,
    pub(crate) history: Option<Rect>,
}

/// The fewest lines the history band is drawn in.
pub(crate) const HISTORY_MIN: u16 = 10;

/// The overview's GPU block, process table (as tall as its `rows` need,
/// with a few lines to spare) and history (the rest).
pub(crate) fn overview(body: Rect, machine: &Machine, rows: usize) -> OverviewAreas {
    let g = gpu_lines(machine, body);
    let [gpus, rest] =
        Layout::vertical([Constraint::Length(g + 2), Constraint::Min(0)]).areas(body);
    // Borders, header, the rows, a problems line and two to grow.
    let table_h = (rows as u16).saturating_add(6).max(8);
    // With no process there is no history to draw.
    if rows > 0 && rest.height >= table_h + HISTORY_MIN {
        let [table, history] =
            Layout::vertical([Constraint::Length(table_h), Constraint::Min(0)]).areas(rest);
        return OverviewAreas {
            gpus,
            table,
            history: Some(history),
        };
    }
    OverviewAreas {
        gpus,
        table: rest,
        history: None,
    }
}

/// The table's data rows (inside the border, below the header row) on a
/// terminal of `size`, with `rows` processes.
pub(crate) fn table_body(size: Rect, caption: u16, machine: &Machine, rows: usize) -> Rect {
    let table = overview(screen(size, caption).body, machine, rows).table;
    Rect {
        x: table.x + 1,
        y: table.y + 2,
        width: table.width.saturating_sub(2),
        height: table.height.saturating_sub(3),
    }
}

/// The process view's panes (absent ones are not shown now).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessAreas {
    pub(crate) info: Rect,
    pub(crate) tabs: Option<Rect>,
    pub(crate) timeline: Option<Rect>,
    pub blocks: Option<Rect>,
    pub(crate) stats: Option<Rect>,
    pub events: Option<Rect>,
    pub(crate) diagnosis: Option<Rect>,
}

pub fn process(size: Rect, pane: Pane, body: Rect) -> ProcessAreas {
    let [info, rest] = Layout::vertical([Constraint::Length(2), Constraint::Min(0)]).areas(body);
    let mut a = ProcessAreas {
        info,
        ..ProcessAreas::default()
    };
    if compact(size) {
        let [tabs, area] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(rest);
        a.tabs = Some(tabs);
        match pane {
            Pane::Timeline => a.timeline = Some(area),
            Pane::Blocks => a.blocks = Some(area),
            Pane::Stats => a.stats = Some(area),
            Pane::Events => a.events = Some(area),
            Pane::Diagnosis => a.diagnosis = Some(area),
        }
    } else {
        // The bottom row keeps 10 lines inside its panes: at 120x40 an
        // OOM's advice and the first events before it (issue 46, item 16:
        // with 7, one or the other was cut off).
        let [timeline, middle, bottom] = Layout::vertical([
            Constraint::Percentage(34),
            Constraint::Percentage(40),
            Constraint::Min(12),
        ])
        .areas(rest);
        let [blocks, stats] =
            Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                .areas(middle);
        let [events, diagnosis] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(bottom);
        a.timeline = Some(timeline);
        a.blocks = Some(blocks);
        a.stats = Some(stats);
        a.events = Some(events);
        a.diagnosis = Some(diagnosis);
    }
    a
}

/// Width of the timeline's value labels.
pub const AXIS_WIDTH: u16 = 10;

/// The timeline's plotting area inside `area` (border and axes removed).
pub(crate) fn plot_area(area: Rect) -> Rect {
    Rect {
        x: area.x + 1 + AXIS_WIDTH,
        y: area.y + 1,
        width: area.width.saturating_sub(2 + AXIS_WIDTH),
        height: area.height.saturating_sub(3),
    }
}

/// Columns to ask the model for: one per plot cell.
pub(crate) fn timeline_columns(size: Rect, caption: u16) -> usize {
    let body = screen(size, caption).body;
    let a = process(size, Pane::Timeline, body);
    a.timeline
        .map_or(60, |t| plot_area(t).width as usize)
        .clamp(8, 1000)
}

/// The inside of `pane` (border removed, and a header row where it has
/// one); empty when it is not shown.
pub(crate) fn pane_inner(size: Rect, caption: u16, pane: Pane) -> Rect {
    let a = process(size, pane, screen(size, caption).body);
    let (r, header) = match pane {
        Pane::Blocks => (a.blocks, 0),
        Pane::Events => (a.events, 0),
        Pane::Stats => (a.stats, 1),
        Pane::Timeline => (a.timeline, 0),
        Pane::Diagnosis => (a.diagnosis, 0),
    };
    r.map_or(Rect::default(), |r| Rect {
        x: r.x + 1,
        y: r.y + 1 + header,
        width: r.width.saturating_sub(2),
        height: r.height.saturating_sub(2 + header),
    })
}

/// Rows `pane` shows at once (inside its border, below a header row where
/// it has one); 0 when it is not shown.
pub fn pane_rows(size: Rect, caption: u16, pane: Pane) -> usize {
    pane_inner(size, caption, pane).height as usize
}

/// A `w`×`h` box centred over the screen's `body` (the process view's
/// overlays), as [`centered`]; but one that would leave a line or two of
/// the body takes all of its height: those lines would show only the
/// borders of the panes under it, beside its own (issue 46, item 15: a
/// double bottom border under By module at 80x24).
pub(super) fn over_body(body: Rect, w: u16, h: u16) -> Rect {
    let h = if h.saturating_add(2) >= body.height {
        body.height
    } else {
        h
    };
    centered(body, w, h)
}

/// A `w`×`h` box centred in `area`, cut to fit it (an overlay on a tiny
/// terminal is cut, never out of bounds).
pub(super) fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let (w, h) = (w.min(area.width), h.min(area.height));
    Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    }
}
