//! The overview: one line per GPU, then the process table.
//!
//! ```text
//!  ┌ GPUs · driver 550.54 ─────────────────────────────────────────────┐
//!  │ 0 H100 80GB HBM3  [██████░░░░░░] 41.2G / 80.0G  util 87%  mem 40% │
//!  ├ Processes (3) · sort RESV ▼ ──────────────────────────────────────┤
//!  │ PID   USER NAME      GPU NVML  RESV ALLOC OTHER PEAK FRAG …       │
//!  └───────────────────────────────────────────────────────────────────┘
//! ```

use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row as TRow, Table};
use ratatui::Frame;

use super::history;
use super::layout;
use super::rows::{fit_columns, mode_name, Col, Columns, Row};
use super::state::OverviewState;
use super::theme::Theme;
use vramscope_collect::{Machine, Snapshot};
use vramscope_text::format;

/// The overview; `typing`: its filter is being typed; `file`: a snapshot
/// file's state (nothing to resync: its SYNC flag is not shown).
pub fn render(
    frame: &mut Frame,
    area: Rect,
    snap: &Snapshot,
    state: &OverviewState,
    (typing, file): (bool, bool),
    t: &Theme,
) {
    let mut rows = state.rows(snap);
    if file {
        for r in &mut rows {
            r.needs_resync = false;
        }
    }
    let a = layout::overview(area, &snap.machine, rows.len());
    render_gpus(frame, a.gpus, &snap.machine, t);
    render_table(frame, a.table, snap, (state, rows), typing, t);
    if let Some(h) = a.history {
        history::render(frame, h, snap, t);
    }
}

fn render_gpus(frame: &mut Frame, area: Rect, m: &Machine, t: &Theme) {
    let g = t.glyphs();
    let title = match &m.driver_version {
        Some(v) => format!(" GPUs {} driver {v} ", g.dot),
        None => " GPUs ".to_string(),
    };
    let block = t.block(Span::styled(title, t.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut lines = Vec::new();
    if let Some(err) = &m.nvml_error {
        let head = if err.starts_with("NVML") {
            ""
        } else {
            "NVML unavailable: "
        };
        // The error whole where it fits, else cut between words; the note
        // goes first.
        let err_line = Line::from(vec![
            Span::styled(head, t.warn()),
            Span::styled(err.clone(), t.warn()),
        ]);
        let note = Span::styled(" (allocator figures still shown)", t.dim());
        let w = inner.width as usize;
        lines.push(if err_line.width() + note.width() <= w {
            let mut l = err_line;
            l.spans.push(note);
            l
        } else {
            crate::fit::fit_line(err_line, w, g.ellipsis)
        });
    } else if m.gpus.is_empty() {
        lines.push(Line::styled("no GPUs reported by NVML", t.dim()));
    }
    for gpu in &m.gpus {
        if lines.len() >= inner.height as usize {
            break;
        }
        lines.push(gpu_line(gpu, inner.width, t));
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn gpu_line(gpu: &vramscope_core::input::Gpu, width: u16, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let a = g.absent;
    let used = format::opt(gpu.used, a, format::bytes_short);
    let total = format::opt(gpu.total, a, format::bytes_short);
    let util = format::opt(gpu.util_gpu, a, |u| format!("{u}%"));
    let memu = format::opt(gpu.util_mem, a, |u| format!("{u}%"));
    let tail = format!(" {used:>6} / {total:<6} util {util:>4}  mem {memu:>4}");
    let extra = match (gpu.temperature_c, gpu.power_w) {
        (Some(c), Some(w)) => format!("  {c}C {w:.0}W"),
        (Some(c), None) => format!("  {c}C"),
        _ => String::new(),
    };
    let w = width as usize;
    let name_w = (w / 4).clamp(8, 24);
    let name = format::truncate(&gpu.name, name_w, g.ellipsis);
    let head = format!("{:>2} {:<name_w$} ", gpu.index, name);
    let fixed = head.chars().count() + tail.chars().count() + 2;
    let extra = if fixed + extra.len() + 10 <= w {
        extra
    } else {
        String::new()
    };
    let bar_w = w.saturating_sub(fixed + extra.len()).min(40);
    let share = match (gpu.used, gpu.total) {
        (Some(u), Some(t)) if t > 0 => Some(u as f64 / t as f64),
        _ => None,
    };
    let mut spans = vec![Span::raw(head)];
    if bar_w >= 4 {
        spans.push(Span::styled("[", t.dim()));
        match share {
            Some(s) => {
                let fill = ((s.clamp(0.0, 1.0) * bar_w as f64).round() as usize).min(bar_w);
                let style = if s > 0.9 { t.alert() } else { t.bar() };
                spans.push(Span::styled(g.bar_full.repeat(fill), style));
                spans.push(Span::styled(g.bar_empty.repeat(bar_w - fill), t.dim()));
            }
            None => spans.push(Span::styled(format!("{:^bar_w$}", g.absent), t.dim())),
        }
        spans.push(Span::styled("]", t.dim()));
    }
    spans.push(Span::raw(tail));
    spans.push(Span::styled(extra, t.dim()));
    Line::from(spans)
}

fn render_table(
    frame: &mut Frame,
    area: Rect,
    snap: &Snapshot,
    (state, rows): (&OverviewState, Vec<Row>),
    typing: bool,
    t: &Theme,
) {
    // The columns the width leaves: the title says when the sort column is
    // not among them (issue 46, item 17).
    let mut inner = t.block(Line::default()).inner(area);
    let hidden = !table_columns(inner.width, &rows)
        .cols()
        .any(|c| c == state.sort);
    let block = t.block(table_title(rows.len(), state, (typing, hidden), t));
    frame.render_widget(block, area);
    if inner.height == 0 {
        return;
    }
    // Segments that are not shown (refused, unverifiable, stale), on the
    // last line of the table: never silently missing.
    if !snap.problems.is_empty() && inner.height >= 3 {
        let line = problems_line(&snap.problems, inner.width, t);
        let r = Rect {
            y: inner.y + inner.height - 1,
            height: 1,
            ..inner
        };
        frame.render_widget(Paragraph::new(line), r);
        inner.height -= 1;
    }
    let layout = table_columns(inner.width, &rows);
    let cols: Vec<Col> = layout.cols().collect();
    let header = header_row(&cols, state, t);
    if rows.is_empty() {
        let table = Table::new(Vec::<TRow>::new(), widths(&layout)).header(header);
        frame.render_widget(table, inner);
        render_no_rows(frame, inner, snap, state, t);
        return;
    }
    let visible = inner.height.saturating_sub(1) as usize;
    let body: Vec<TRow> = rows
        .iter()
        .skip(state.scroll.offset())
        .take(visible)
        .map(|r| {
            let selected = state.selected == Some(r.entry.key());
            let mut row = TRow::new(layout.0.iter().map(|(c, _, w)| cell(r, *c, *w, t)));
            if selected {
                row = row.style(t.selected());
            } else if !r.alive {
                row = row.style(t.dim());
            }
            row
        })
        .collect();
    let table = Table::new(body, widths(&layout))
        .header(header)
        .column_spacing(1);
    frame.render_widget(table, inner);
    if rows.len() > visible && inner.width > 12 {
        render_position(frame, area, (state.scroll.offset(), visible, rows.len()), t);
    }
}

/// ` Processes (3) · sort RESV ▼ `, `(hidden)` after it when the width
/// leaves the sort column out, then the filter when there is one.
fn table_title(
    count: usize,
    state: &OverviewState,
    (typing, hidden): (bool, bool),
    t: &Theme,
) -> Line<'static> {
    let g = t.glyphs();
    let mut title = vec![
        Span::styled(format!(" Processes ({count}) "), t.title()),
        Span::styled(
            format!(
                "{} sort {} {}{} ",
                g.dot,
                state.sort.title(),
                sort_arrow(state, t),
                if hidden { " (hidden)" } else { "" }
            ),
            t.dim(),
        ),
    ];
    if !state.filter.is_empty() || typing {
        title.push(Span::styled(format!("{} filter ", g.dot), t.dim()));
        title.push(Span::styled(format!("{} ", state.filter), t.key()));
    }
    Line::from(title)
}

fn sort_arrow(state: &OverviewState, t: &Theme) -> &'static str {
    let g = t.glyphs();
    if state.descending {
        g.down
    } else {
        g.up
    }
}

/// The column titles, the sort column's with its arrow.
fn header_row(cols: &[Col], state: &OverviewState, t: &Theme) -> TRow<'static> {
    TRow::new(cols.iter().map(|c| {
        let mut s = c.title().to_string();
        if *c == state.sort {
            s.push_str(sort_arrow(state, t));
        }
        aligned(*c, Line::from(s))
    }))
    .style(t.header())
}

/// `! 2 segments not shown: vramscope-1000-42: stale: … · `vramscope rings
/// --clean` removes stale segments`: the first problem, how many there are,
/// and the advice where it applies.
pub(crate) fn problems_line(
    problems: &[vramscope_core::input::SourceProblem],
    width: u16,
    t: &Theme,
) -> Line<'static> {
    let g = t.glyphs();
    if let Some(dir) = problems.iter().find(|p| p.is_directory()) {
        // No segment can be read at all: the directory is the news.
        let text = format::truncate(&format!("! {}", dir.message), width as usize, g.ellipsis);
        return Line::from(Span::styled(text, t.warn()));
    }
    let n = problems.len();
    let head = format!("! {n} segment{} not shown: ", if n == 1 { "" } else { "s" });
    let first = &problems[0];
    let name = std::path::Path::new(&first.path)
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_else(|| first.path.clone());
    let advice = if problems.iter().any(|p| p.message.starts_with("stale")) {
        " · `vramscope rings --clean` removes stale segments"
    } else {
        ""
    };
    let room = (width as usize)
        .saturating_sub(head.chars().count() + advice.chars().count())
        .max(8);
    let body = format::truncate(&format!("{name}: {}", first.message), room, g.ellipsis);
    Line::from(vec![
        Span::styled(head, t.warn()),
        Span::styled(body, t.warn()),
        Span::styled(advice, t.dim()),
    ])
}

/// Why the table is empty, under its header.
fn render_no_rows(
    frame: &mut Frame,
    inner: Rect,
    snap: &Snapshot,
    state: &OverviewState,
    t: &Theme,
) {
    if inner.height <= 2 {
        return;
    }
    let msg = if snap.processes.is_empty() {
        "No processes yet. Start a PyTorch job with the vramscope agent, or run `vramscope demo`."
            .to_string()
    } else {
        format!(
            "No process matches \"{}\" (Esc clears the filter).",
            state.filter
        )
    };
    let r = Rect {
        y: inner.y + 2,
        height: inner.height - 2,
        ..inner
    };
    frame.render_widget(
        Paragraph::new(Line::styled(msg, t.dim()))
            .alignment(Alignment::Center)
            .wrap(ratatui::widgets::Wrap { trim: true }),
        r,
    );
}

/// ` 1-8/12 ` on the bottom edge of `area`: which rows are shown.
fn render_position(
    frame: &mut Frame,
    area: Rect,
    (offset, visible, total): (usize, usize, usize),
    t: &Theme,
) {
    let label = format!(
        " {}-{}/{} ",
        offset + 1,
        (offset + visible).min(total),
        total
    );
    let w = label.len() as u16;
    let r = Rect::new(
        area.x + area.width.saturating_sub(w + 1),
        area.y + area.height - 1,
        w,
        1,
    );
    frame.render_widget(Paragraph::new(Span::styled(label, t.dim())), r);
}

/// A cell of column `c`, right-aligned where the column is.
fn aligned(c: Col, line: Line<'static>) -> Cell<'static> {
    Cell::from(if c.right_aligned() {
        line.alignment(Alignment::Right)
    } else {
        line
    })
}

fn widths(cols: &Columns) -> Vec<Constraint> {
    cols.0
        .iter()
        .map(|(_, _, w)| Constraint::Length(*w))
        .collect()
}

/// The table's columns at `width` for `rows` (FLAGS as wide as its widest
/// text).
pub(crate) fn table_columns(width: u16, rows: &[Row]) -> Columns {
    let flags = rows
        .iter()
        .map(|r| r.flags().len() as u16)
        .max()
        .unwrap_or(0);
    fit_columns(width, flags)
}

/// The cell of column `c` (`width` wide: text that does not fit ends in
/// an ellipsis, never cut silently).
fn cell<'a>(r: &Row, c: Col, width: u16, t: &Theme) -> Cell<'a> {
    let g = t.glyphs();
    let a = g.absent;
    let (text, style): (String, Style) = match c {
        Col::Pid => (r.pid.to_string(), Style::new()),
        Col::User => (
            if r.user.is_empty() {
                a.to_string()
            } else {
                format::truncate(&r.user, c.width() as usize, g.ellipsis)
            },
            Style::new(),
        ),
        Col::Name => (
            format::truncate(&r.name, width as usize, g.ellipsis),
            Style::new(),
        ),
        Col::Gpus => (
            r.gpus.clone().unwrap_or_else(|| a.to_string()),
            Style::new(),
        ),
        Col::Nvml => (format::opt(r.nvml, a, format::bytes_short), Style::new()),
        Col::Reserved => (
            format::opt(r.reserved, a, format::bytes_short),
            Style::new(),
        ),
        Col::Allocated => (
            format::opt(r.allocated, a, format::bytes_short),
            Style::new(),
        ),
        Col::NonPytorch => (
            format::opt(r.non_pytorch, a, format::bytes_signed_short),
            Style::new(),
        ),
        Col::Unexplained => (
            format::opt(r.unexplained, a, format::bytes_signed_short),
            Style::new(),
        ),
        Col::Peak => (format::opt(r.peak, a, format::bytes_short), Style::new()),
        Col::Frag => {
            let style = match r.frag {
                Some(f) if f >= 0.3 => t.warn(),
                _ => Style::new(),
            };
            (format::opt(r.frag, a, format::percent), style)
        }
        Col::Rate => (format::opt(r.rate, a, format::rate), Style::new()),
        Col::Lost => {
            let style = if r.lost.unwrap_or(0) > 0 {
                t.warn()
            } else {
                Style::new()
            };
            (format::opt(r.lost, a, format::count), style)
        }
        Col::Cpu => (format::opt(r.cpu, a, |c| format!("{c:.0}%")), Style::new()),
        Col::Rss => (format::opt(r.rss, a, format::bytes_short), Style::new()),
        Col::Elapsed => (format::opt(r.elapsed_ns, a, format::duration), Style::new()),
        Col::Mode => (mode_name(r.mode).to_string(), Style::new()),
        Col::History => (
            history::sparkline(r.entry, width as usize, t),
            if r.reserved.is_some() {
                t.reserved()
            } else {
                t.nvml()
            },
        ),
        Col::Flags => {
            let f = r.flags();
            let style = if r.leak || r.ooms > 0 {
                t.alert()
            } else if !r.alive {
                t.warn()
            } else {
                t.dim()
            };
            (f, style)
        }
    };
    aligned(c, Line::styled(text, style))
}
