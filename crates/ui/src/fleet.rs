//! The fleet view (`vramscope fleet`): nodes, jobs, or one node, drawn from
//! a [`FleetApp`] (its [`FleetView`]), with the dashboard's footer, help and
//! legend. Renders only; [`app`] decides, [`run`] carries it out in the
//! shell ([`super::shell`]).
//!
//! ```text
//!  ┌ fleet · http://prom:9090 · 256 nodes · 2 down · sort RESV ▼ ──────────┐
//!  │ NODE        STATE GPUS  NVML USED / TOTAL JOBS ALLOC  RESV FRAG LEAK OOM│
//!  │ node-017    up       8   412G / 640G        8  301G  390G  12%    1   0│
//!  │ node-233    DOWN     -                                               │
//!  └───────────────────────────────────────────────────────────────────────┘
//!   ↑↓ select  Enter open  Tab nodes/jobs  / filter  o/O sort  r refresh   L legend  ? help  q quit
//! ```
//!
//! The node screen: its GPUs, its processes, and the selected process's
//! allocated and reserved bytes over time from Prometheus. A failed refresh
//! or query is a message in its pane; the last data stays shown.

pub(crate) mod app;
pub mod run;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Cell, Chart, Dataset, GraphType, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

pub use app::{Ask, FleetApp, FleetEvent};

use super::bars::{self, Footer};
use super::scroll::Scroll;
use super::state::Overlay;
use super::theme::Theme;
use super::{help, keys, legend};
use vramscope_collect::fleet::model::{Node, Proc};
use vramscope_collect::fleet::view::{FleetView, ProcSeries, Screen};
use vramscope_text::format;

fn b(v: Option<f64>, absent: &str) -> String {
    format::opt(v.filter(|x| x.is_finite() && *x >= 0.0), absent, |x| {
        format::bytes_short(x as u64)
    })
}

fn pct(v: Option<f64>, absent: &str) -> String {
    format::opt(v.filter(|x| x.is_finite()), absent, format::percent)
}

/// The whole frame: the screen, the footer (the key table's hints, the
/// filter being typed, or the message), and the help or legend over them.
pub fn render(frame: &mut Frame, app: &FleetApp) {
    let (v, t) = (&app.view, &app.theme);
    let [body, footer] =
        Layout::vertical([Constraint::Min(3), Constraint::Length(1)]).areas(frame.area());
    match &v.screen {
        Screen::Nodes => nodes(frame, body, v, t),
        Screen::Jobs => jobs(frame, body, v, t),
        Screen::Node { instance, .. } => node(frame, body, v, instance, t),
    }
    let footer_line = Footer {
        hints: keys::footer(&app.screen_contexts(), false, false),
        prompt: app.typing().then_some((" filter: ", v.filter.as_str())),
        message: app.message.as_deref(),
    };
    bars::render_line(frame, footer, &footer_line, t);
    match app.overlay {
        Some(Overlay::Help(scroll)) => help::render_fleet(frame, frame.area(), scroll, t),
        Some(Overlay::Legend(scroll)) => {
            legend::render_lines(frame, frame.area(), legend::fleet_lines(t), scroll, t)
        }
        _ => {}
    }
    if ascii(t) {
        super::theme::asciify(frame.buffer_mut());
    }
}

/// Whether the theme is ASCII only.
fn ascii(t: &Theme) -> bool {
    t.glyphs().allocated.is_ascii()
}

fn title(v: &FleetView, what: &str, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let mut spans = vec![Span::styled(
        format!(" fleet {} {} {} {what}", g.dot, v.source, g.dot),
        t.title(),
    )];
    if let Some(f) = &v.fleet {
        let down = f.down();
        spans.push(Span::styled(
            format!(" {} {} nodes", g.dot, f.nodes.len()),
            t.title(),
        ));
        if down > 0 {
            spans.push(Span::styled(format!(" {} {down} down", g.dot), t.alert()));
        }
    }
    // Names run A to Z, figures largest first, unless reversed.
    let up = (v.sort == vramscope_collect::fleet::view::SortKey::Name) != v.descending;
    let arrow = if up { g.up } else { g.down };
    spans.push(Span::styled(
        format!(" {} sort {} {arrow} ", g.dot, v.sort.title()),
        t.title(),
    ));
    if !v.filter.is_empty() {
        spans.push(Span::styled(format!("filter \"{}\" ", v.filter), t.warn()));
    }
    Line::from(spans)
}

/// The message of a failed refresh, above the data (or instead of it).
fn problem_line(v: &FleetView, t: &Theme) -> Option<Line<'static>> {
    let e = v.error.as_ref()?;
    let tail = if v.fleet.is_some() {
        " (showing the last answer)"
    } else {
        ""
    };
    Some(Line::from(vec![
        Span::styled(e.clone(), t.alert()),
        Span::styled(tail, t.dim()),
    ]))
}

/// A bordered pane holding `table`, with the refresh problem (if any) or a
/// message when there is nothing to list.
fn pane(
    frame: &mut Frame,
    area: Rect,
    v: &FleetView,
    title: Line<'static>,
    table: Option<Table<'static>>,
    empty: &str,
    t: &Theme,
) {
    let block = t.block(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut area = inner;
    if let Some(p) = problem_line(v, t) {
        let h = if v.fleet.is_some() { 1 } else { area.height };
        let [top, rest] = Layout::vertical([Constraint::Length(h), Constraint::Min(0)]).areas(area);
        frame.render_widget(Paragraph::new(p).wrap(Wrap { trim: true }), top);
        area = rest;
    }
    if v.fleet.is_none() {
        if v.error.is_none() {
            frame.render_widget(
                Paragraph::new(Line::styled("asking Prometheus…", t.dim())),
                area,
            );
        }
        return;
    }
    match table {
        Some(tb) => frame.render_widget(tb, area),
        None => frame.render_widget(
            Paragraph::new(Line::styled(empty.to_string(), t.dim())),
            area,
        ),
    }
}

/// Rows scrolled so that `selected` is visible in `height` lines (one is
/// the header).
fn window(selected: usize, rows: usize, height: u16) -> std::ops::Range<usize> {
    let h = (height as usize).saturating_sub(1).max(1);
    Scroll::new(rows, h).reveal(selected).range()
}

fn table(
    header: &[&'static str],
    widths: &[u16],
    rows: Vec<Row<'static>>,
    t: &Theme,
) -> Table<'static> {
    Table::new(rows, widths.iter().map(|w| Constraint::Length(*w)))
        .header(Row::new(header.iter().map(|h| Cell::from(*h))).style(t.header()))
        .column_spacing(1)
}

fn nodes(frame: &mut Frame, area: Rect, v: &FleetView, t: &Theme) {
    let a = t.glyphs().absent;
    let list = v.nodes();
    let range = window(v.selected, list.len(), area.height.saturating_sub(3));
    let rows: Vec<Row> = list[range.clone()]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let sel = range.start + i == v.selected;
            node_row(n, sel, a, t)
        })
        .collect();
    let tb = (!list.is_empty()).then(|| {
        table(
            &[
                "NODE",
                "STATE",
                "GPUS",
                "NVML USED/TOTAL",
                "JOBS",
                "ALLOC",
                "RESV",
                "FRAG",
                "LEAKS",
                "OOMS",
            ],
            &[22, 5, 4, 15, 4, 7, 7, 5, 5, 5],
            rows,
            t,
        )
    });
    let total = v.fleet.as_ref().map_or(0, |f| f.nodes.len());
    let what = if list.len() == total {
        "nodes".to_string()
    } else {
        format!("nodes ({} shown)", list.len())
    };
    pane(frame, area, v, title(v, &what, t), tb, "no node matches", t);
}

fn node_row(n: &Node, sel: bool, a: &str, t: &Theme) -> Row<'static> {
    let style = if sel { t.selected() } else { Style::new() };
    let name = format::truncate(n.name(), 22, t.glyphs().ellipsis);
    if !n.up {
        return Row::new(vec![
            Cell::from(name),
            Cell::from(Span::styled("DOWN", t.alert())),
        ])
        .style(style);
    }
    let used = format!("{} / {}", b(n.gpu_used(), a), b(n.gpu_total(), a));
    let leaks = n.leaks();
    let ooms = n.ooms();
    Row::new(vec![
        Cell::from(name),
        Cell::from(Span::styled("up", t.good())),
        Cell::from(n.gpus.len().to_string()),
        Cell::from(used),
        Cell::from(n.jobs().to_string()),
        Cell::from(b(n.allocated(), a)),
        Cell::from(b(n.reserved(), a)),
        Cell::from(pct(n.fragmentation(), a)),
        Cell::from(Span::styled(
            leaks.to_string(),
            if leaks > 0 { t.alert() } else { Style::new() },
        )),
        Cell::from(Span::styled(
            format::count(ooms as u64),
            if ooms > 0.0 { t.alert() } else { Style::new() },
        )),
    ])
    .style(style)
}

fn proc_cells(p: &Proc, host: bool, a: &str, t: &Theme) -> Vec<Cell<'static>> {
    let e = t.glyphs().ellipsis;
    let leak = match p.leak {
        Some(true) => Span::styled("LEAK", t.alert()),
        Some(false) => Span::raw("no"),
        None => Span::styled(a.to_string(), t.dim()),
    };
    let ooms = p.ooms.unwrap_or(0.0);
    let mut cells = Vec::new();
    if host {
        let name = if p.host.is_empty() {
            &p.instance
        } else {
            &p.host
        };
        cells.push(Cell::from(format::truncate(name, 16, e)));
    }
    let name = if p.running {
        Span::raw(format::truncate(&p.process, 18, e))
    } else {
        Span::styled(format::truncate(&p.process, 18, e), t.dim())
    };
    cells.extend([
        Cell::from(p.pid.clone()),
        Cell::from(format::truncate(&p.user, 8, e)),
        Cell::from(name),
        Cell::from(if p.device.is_empty() {
            a.to_string()
        } else {
            p.device.clone()
        }),
        Cell::from(b(p.allocated, a)),
        Cell::from(b(p.reserved, a)),
        Cell::from(pct(p.fragmentation, a)),
        Cell::from(leak),
        Cell::from(Span::styled(
            format::count(ooms as u64),
            if ooms > 0.0 { t.alert() } else { Style::new() },
        )),
        Cell::from(format::opt(p.steps_per_sec, a, format::rate)),
        // Last: the column a narrow screen drops first.
        Cell::from(format::opt(p.unexplained, a, |v| {
            format::bytes_signed_short(v as i64)
        })),
    ]);
    cells
}

const PROC_HEADER: [&str; 11] = [
    "PID", "USER", "PROCESS", "DEV", "ALLOC", "RESV", "FRAG", "LEAK", "OOMS", "STEP/s", "UNEXPL",
];
const PROC_WIDTHS: [u16; 11] = [7, 8, 18, 3, 7, 7, 5, 4, 4, 6, 7];

fn proc_table(
    list: &[&Proc],
    selected: Option<usize>,
    host: bool,
    height: u16,
    t: &Theme,
) -> Option<Table<'static>> {
    let a = t.glyphs().absent;
    let range = window(selected.unwrap_or(0), list.len(), height);
    let rows: Vec<Row> = list[range.clone()]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let style = if Some(range.start + i) == selected {
                t.selected()
            } else {
                Style::new()
            };
            Row::new(proc_cells(p, host, a, t)).style(style)
        })
        .collect();
    let mut header: Vec<&'static str> = Vec::new();
    let mut widths: Vec<u16> = Vec::new();
    if host {
        header.push("NODE");
        widths.push(16);
    }
    header.extend(PROC_HEADER);
    widths.extend(PROC_WIDTHS);
    (!list.is_empty()).then(|| table(&header, &widths, rows, t))
}

fn jobs(frame: &mut Frame, area: Rect, v: &FleetView, t: &Theme) {
    let list = v.jobs();
    let tb = proc_table(
        &list,
        Some(v.selected),
        true,
        area.height.saturating_sub(3),
        t,
    );
    let what = format!("jobs ({})", list.len());
    pane(
        frame,
        area,
        v,
        title(v, &what, t),
        tb,
        "no instrumented job",
        t,
    );
}

fn node(frame: &mut Frame, area: Rect, v: &FleetView, instance: &str, t: &Theme) {
    let a = t.glyphs().absent;
    let Some(n) = v.node() else {
        let msg = format!("{instance} is no longer among Prometheus's targets");
        pane(frame, area, v, title(v, instance, t), None, &msg, t);
        return;
    };
    let gpu_h = if n.up {
        n.gpus.len().max(1) as u16 + 2
    } else {
        3
    };
    let [gpus, procs, chart] = Layout::vertical([
        Constraint::Length(gpu_h.min(area.height / 3)),
        Constraint::Min(4),
        Constraint::Percentage(40),
    ])
    .areas(area);
    let state = if n.up { "up" } else { "DOWN" };
    let head = if n.name() == n.instance {
        format!("{} {state}", n.name())
    } else {
        format!("{} ({}) {state}", n.name(), n.instance)
    };
    let block = t.block(title(v, &head, t));
    let inner = block.inner(gpus);
    frame.render_widget(block, gpus);
    let mut lines: Vec<Line> = Vec::new();
    if let Some(p) = problem_line(v, t) {
        lines.push(p);
    }
    if !n.up {
        lines.push(Line::styled(
            "DOWN: Prometheus's last scrape of this node failed; figures below are gone",
            t.alert(),
        ));
    } else if n.gpus.is_empty() {
        lines.push(Line::styled(
            "no GPU reported (NVML unavailable there)",
            t.dim(),
        ));
    }
    // As many as the pane shows (a node may report thousands).
    let room = (inner.height as usize).saturating_sub(lines.len());
    for g in n.gpus.iter().take(room) {
        lines.push(Line::raw(format!(
            "GPU {:>2} {:<24} {:>6} / {:<6} util {}",
            g.index,
            format::truncate(&g.name, 24, t.glyphs().ellipsis),
            b(g.used, a),
            b(g.total, a),
            pct(g.util, a)
        )));
    }
    frame.render_widget(Paragraph::new(lines), inner);

    let list = v.node_procs();
    let block = t.block(Span::styled(
        format!(" processes ({}) ", list.len()),
        t.title(),
    ));
    let inner = block.inner(procs);
    frame.render_widget(block, procs);
    match proc_table(&list, Some(v.selected), false, inner.height, t) {
        Some(tb) => frame.render_widget(tb, inner),
        None => frame.render_widget(
            Paragraph::new(Line::styled("no instrumented process", t.dim())),
            inner,
        ),
    }
    series(frame, chart, v, t);
}

fn series(frame: &mut Frame, area: Rect, v: &FleetView, t: &Theme) {
    let who = v
        .selected_proc()
        .map(|p| format!(" {} (pid {}) over time ", p.process, p.pid))
        .unwrap_or_else(|| " over time ".into());
    let g = t.glyphs();
    let block = t.block(Line::from(vec![
        Span::styled(who, t.title()),
        Span::styled(g.reserved, t.reserved()),
        Span::raw(" reserved "),
        Span::styled(g.allocated, t.allocated()),
        Span::raw(" allocated "),
    ]));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let s: &ProcSeries = match &v.series {
        None => {
            let msg = if v.selected_proc().is_some() {
                "asking Prometheus…"
            } else {
                "select a process"
            };
            frame.render_widget(Paragraph::new(Line::styled(msg, t.dim())), inner);
            return;
        }
        Some(Err(e)) => {
            frame.render_widget(
                Paragraph::new(Line::styled(e.clone(), t.alert())).wrap(Wrap { trim: true }),
                inner,
            );
            return;
        }
        Some(Ok(s)) => s,
    };
    let Some(p) = plot(s) else {
        frame.render_widget(
            Paragraph::new(Line::styled(
                "Prometheus holds no samples of it yet",
                t.dim(),
            )),
            inner,
        );
        return;
    };
    // Braille is not ASCII (dots become ASCII in `asciify`).
    let marker = if ascii(t) {
        Marker::Dot
    } else {
        Marker::Braille
    };
    let data = [
        Dataset::default()
            .name("reserved")
            .marker(marker)
            .graph_type(GraphType::Line)
            .style(t.reserved())
            .data(&p.reserved),
        Dataset::default()
            .name("allocated")
            .marker(marker)
            .graph_type(GraphType::Line)
            .style(t.allocated())
            .data(&p.allocated),
    ];
    let ago = format!("-{}", format::span((p.span_s * 1e9) as u64));
    let chart = Chart::new(data.to_vec())
        .x_axis(
            Axis::default()
                .bounds([0.0, 1.0])
                .labels([Line::raw(ago), Line::raw("now")]),
        )
        .y_axis(
            Axis::default()
                .bounds([0.0, 1.0])
                .labels([Line::raw("0"), Line::raw(format::bytes_short(p.top as u64))]),
        );
    frame.render_widget(chart, inner);
}

/// Steps of the chart's grid on each axis (finer than any terminal's).
const GRID: f64 = 4096.0;

/// A process's series as the chart draws them.
#[derive(Debug, Clone, PartialEq)]
struct Plot {
    /// Seconds from the first point to the last (at least 1).
    span_s: f64,
    /// Bytes at the top of the chart.
    top: f64,
    /// Points scaled into 0..=1 on both axes, in steps of 1/[`GRID`].
    reserved: Vec<(f64, f64)>,
    allocated: Vec<(f64, f64)>,
}

/// The series scaled for the chart, None without a finite point. Every
/// point lies within the chart's bounds (0..=1), on a grid of [`GRID`]
/// steps: the chart widget's own arithmetic then stays small whatever the
/// values were (a point far outside its bounds, or one whose scaling
/// overflows, makes it draw a line of 2^64 cells: for ever). Points that
/// are not finite are left out (`prom` already dropped them; this holds
/// for any input).
fn plot(s: &ProcSeries) -> Option<Plot> {
    let finite = |&&(x, y): &&(f64, f64)| x.is_finite() && y.is_finite();
    let (mut x0, mut x1, mut top) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in s.allocated.iter().chain(&s.reserved).filter(finite) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        top = top.max(y);
    }
    if x0 > x1 {
        return None;
    }
    // Halves, so that neither the span nor the headroom overflows.
    let half_span = (x1 / 2.0 - x0 / 2.0).max(0.5);
    let half_top = if top > 0.0 { top / 2.0 * 1.1 } else { 0.5 };
    let unit = |v: f64| {
        let u = if v.is_nan() { 0.0 } else { v.clamp(0.0, 1.0) };
        (u * GRID).round() / GRID
    };
    let scale = |pts: &[(f64, f64)]| -> Vec<(f64, f64)> {
        pts.iter()
            .filter(finite)
            .map(|&(x, y)| {
                let u = (x / 2.0 - x0 / 2.0) / half_span;
                let w = (y / 2.0) / half_top;
                (unit(u), unit(w))
            })
            .collect()
    };
    Some(Plot {
        span_s: (half_span * 2.0).min(f64::MAX),
        top: (half_top * 2.0).min(f64::MAX),
        reserved: scale(&s.reserved),
        allocated: scale(&s.allocated),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::Wake;
    use crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};
    use ratatui::backend::TestBackend;
    use vramscope_collect::fleet::model::{Fleet, Gpu};

    fn app() -> FleetApp {
        FleetApp::new(
            FleetView::new("http://prom:9090".into()),
            Theme::new(false, false),
        )
    }

    fn key(c: KeyCode) -> FleetEvent {
        FleetEvent::Shell(Wake::Input(Event::Key(KeyEvent::new(
            c,
            KeyModifiers::NONE,
        ))))
    }

    fn text(v: &FleetApp, w: u16, h: u16) -> String {
        let mut term = ratatui::Terminal::new(TestBackend::new(w, h)).unwrap();
        term.draw(|f| render(f, v)).unwrap();
        let buf = term.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn fleet() -> Fleet {
        let p = Proc {
            instance: "10.0.0.1:9420".into(),
            host: "node-a".into(),
            pid: "4242".into(),
            user: "ana".into(),
            process: "train.py".into(),
            mode: "exact".into(),
            device: "0".into(),
            gpu: "0".into(),
            allocated: Some(3.0 * (1u64 << 30) as f64),
            reserved: Some(5.0 * (1u64 << 30) as f64),
            fragmentation: Some(0.125),
            leak: Some(true),
            ooms: Some(1.0),
            steps_per_sec: Some(2.5),
            unexplained: Some(4.0 * (1u64 << 20) as f64),
            running: true,
            ..Proc::default()
        };
        let gpu = Gpu {
            index: "0".into(),
            name: "H100".into(),
            total: Some(80.0 * (1u64 << 30) as f64),
            used: Some(6.0 * (1u64 << 30) as f64),
            util: Some(0.5),
            ..Gpu::default()
        };
        Fleet {
            nodes: vec![
                Node {
                    instance: "10.0.0.1:9420".into(),
                    host: "node-a".into(),
                    up: true,
                    gpus: vec![gpu],
                    procs: vec![p],
                },
                Node {
                    instance: "10.0.0.2:9420".into(),
                    up: false,
                    ..Node::default()
                },
            ],
        }
    }

    #[test]
    fn nodes_a_down_node_and_one_node_are_drawn() {
        let mut v = app();
        v.view.refreshed(Ok(fleet()));
        let s = text(&v, 100, 12);
        assert!(s.contains("2 nodes · 1 down"), "{s}");
        assert!(s.contains("node-a"), "{s}");
        let down = s.lines().find(|l| l.contains("10.0.0.2:9420")).unwrap();
        assert!(down.contains("DOWN"), "{s}");
        assert!(s.contains("sort NAME ▲"), "{s}");
        assert!(s.contains("6.00G / 80.0G"), "{s}");
        v.handle(key(KeyCode::Down));
        v.handle(key(KeyCode::Enter));
        v.view.series_loaded(
            Ok(ProcSeries {
                instance: "10.0.0.1:9420".into(),
                pid: "4242".into(),
                allocated: vec![(0.0, 1e9), (60.0, 3e9)],
                reserved: vec![(0.0, 2e9), (60.0, 5e9)],
            }),
            "10.0.0.1:9420",
            "4242",
        );
        let s = text(&v, 100, 24);
        println!("{s}");
        assert!(s.contains("GPU  0 H100"), "{s}");
        assert!(s.contains("train.py") && s.contains("LEAK"), "{s}");
        assert!(s.contains("train.py (pid 4242) over time"), "{s}");
        assert!(s.contains("-1m") && s.contains("now"), "{s}");
        assert!(s.contains("reserved") && s.contains("allocated"), "{s}");
        // What no one named outside the allocator, where the width has room
        // for it (issue 47).
        let row = s
            .lines()
            .find(|l| l.contains("train.py") && l.contains("LEAK"))
            .unwrap();
        assert!(s.contains("UNEXPL") && row.contains("4.00M"), "{s}");
    }

    #[test]
    fn a_failure_is_a_message_in_the_pane() {
        let mut v = app();
        v.view.refreshed(Err(
            "Prometheus at http://prom:9090 cannot be reached: connection refused".into(),
        ));
        let s = text(&v, 80, 10);
        assert!(s.contains("cannot be reached"), "{s}");
        v.view.refreshed(Ok(fleet()));
        v.view
            .refreshed(Err("Prometheus refused a query: bad_data: x".into()));
        let s = text(&v, 80, 10);
        assert!(
            s.contains("refused a query") && s.contains("showing the last answer"),
            "{s}"
        );
        assert!(s.contains("node-a"), "{s}");
    }

    /// Item 7: whatever the series hold (the extremes of f64, NaN, a single
    /// point, only negatives), every point handed to the chart lies within
    /// its bounds on the grid, the axis labels are finite, and a frame is
    /// drawn (the widget drew a line of 2^64 cells for `1e308` then `NaN`).
    #[test]
    fn item7_the_chart_scales_extreme_ranges_into_its_bounds() {
        let (nan, inf, max) = (f64::NAN, f64::INFINITY, f64::MAX);
        let cases: [&[(f64, f64)]; 9] = [
            &[(0.0, 1e308), (60.0, nan)],
            &[(0.0, 1e308), (60.0, -1e308), (120.0, 1.0)],
            &[(-1e308, 1.0), (1e308, 1e308)],
            &[(-max, max), (max, -max), (0.0, max)],
            &[(0.0, 1e18), (1e-300, -1e18), (2e-300, 5e-324)],
            &[(0.0, inf), (inf, 1.0), (-inf, -inf), (1.0, 2.0)],
            &[(7.0, 5.0)],
            &[(0.0, -5.0), (1.0, -1.0)],
            &[(nan, 1.0), (1.0, nan), (inf, inf)],
        ];
        for (i, c) in cases.iter().enumerate() {
            let s = ProcSeries {
                instance: "10.0.0.1:9420".into(),
                pid: "4242".into(),
                allocated: c.to_vec(),
                reserved: c.iter().rev().copied().collect(),
            };
            let Some(p) = plot(&s) else {
                assert_eq!(i, 8, "case {i}: only the last has no finite point");
                continue;
            };
            assert!(p.span_s.is_finite() && p.span_s >= 1.0, "case {i}: {p:?}");
            assert!(p.top.is_finite() && p.top > 0.0, "case {i}: {p:?}");
            for &(x, y) in p.allocated.iter().chain(&p.reserved) {
                for v in [x, y] {
                    assert!((0.0..=1.0).contains(&v), "case {i}: {p:?}");
                    assert_eq!(v * GRID, (v * GRID).round(), "case {i}: {p:?}");
                }
            }
            let finite = c.iter().filter(|(x, y)| x.is_finite() && y.is_finite());
            assert_eq!(p.allocated.len(), finite.count(), "case {i}");
            // Drawn, on the node screen of a fleet with that process.
            let mut v = app();
            v.view.refreshed(Ok(fleet()));
            v.handle(key(KeyCode::Down));
            v.handle(key(KeyCode::Enter));
            v.view.series_loaded(Ok(s), "10.0.0.1:9420", "4242");
            let screen = text(&v, 100, 24);
            assert!(screen.contains("now"), "case {i}:\n{screen}");
        }
        // The ordinary case: a minute, 1 to 3 GB, top a tenth above.
        let s = ProcSeries {
            allocated: vec![(100.0, 1e9), (160.0, 3e9)],
            ..ProcSeries::default()
        };
        let p = plot(&s).unwrap();
        assert_eq!(p.span_s, 60.0);
        assert!((p.top - 3.3e9).abs() < 1.0, "{p:?}");
        let g = |v: f64| (v * GRID).round() / GRID;
        assert_eq!(p.allocated, [(0.0, g(1.0 / 3.3)), (1.0, g(3.0 / 3.3))]);
    }
}
