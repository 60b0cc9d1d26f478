//! Allocated vs reserved over time, with NVML used on the same axis.
//!
//! Each plot column is one model column (min/max/last over its slice of the
//! window). From the bottom: allocated up to the column's minimum (solid),
//! the allocated range min..max (shaded: the swing of a training step),
//! reserved above it (light), and NVML used as a line.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::layout::{plot_area, AXIS_WIDTH};
use super::state::ProcessState;
use super::theme::Theme;
use vramscope_collect::ProcessEntry;
use vramscope_text::format;

/// One plot column, summed over devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Col {
    pub(crate) alloc_min: Option<u64>,
    pub(crate) alloc_max: Option<u64>,
    pub(crate) reserved: Option<u64>,
    pub(crate) nvml: Option<u64>,
}

/// The columns of `e`'s timelines (devices summed).
pub(crate) fn columns(e: &ProcessEntry) -> Vec<Col> {
    let mut n = e.view.nvml_timeline.as_ref().map_or(0, Vec::len);
    for d in &e.view.devices {
        if let Some(tl) = &d.timeline {
            n = n.max(tl.allocated.len()).max(tl.reserved.len());
        }
    }
    let mut cols = vec![Col::default(); n];
    let add = |slot: &mut Option<u64>, v: Option<u64>| {
        if let Some(v) = v {
            *slot = Some(slot.unwrap_or(0).saturating_add(v));
        }
    };
    for d in &e.view.devices {
        let Some(tl) = &d.timeline else { continue };
        for (i, c) in tl.allocated.iter().enumerate() {
            add(&mut cols[i].alloc_min, c.map(|c| c.min));
            add(&mut cols[i].alloc_max, c.map(|c| c.max));
        }
        for (i, c) in tl.reserved.iter().enumerate() {
            add(&mut cols[i].reserved, c.map(|c| c.max));
        }
    }
    if let Some(nv) = &e.view.nvml_timeline {
        for (i, c) in nv.iter().enumerate() {
            cols[i].nvml = c.map(|c| c.max);
        }
    }
    cols
}

/// A round upper bound for the axis: 5 % above `v`, rounded up to a
/// multiple of half a power of two. Saturating: any figure, up to
/// `u64::MAX` (a crafted recording's), gives a bound (at most `u64::MAX`)
/// in at most 44 steps.
pub(crate) fn nice_max(v: u64) -> u64 {
    let v = v.max(1 << 20);
    let target = v.saturating_add(v / 20);
    let mut step: u64 = 1 << 20;
    while step.saturating_mul(8) < target {
        step *= 2;
    }
    // multiples of step/2 give 1.5/2/3/4/6/8-ish tops
    let half = (step / 2).max(1);
    target.div_ceil(half).saturating_mul(half)
}

/// `e`'s memory over `view`'s window; `now` is the newer of the clock and
/// the snapshot.
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    e: &ProcessEntry,
    view: &ProcessState,
    now: u64,
    t: &Theme,
) {
    let g = t.glyphs();
    let legend = t.legend(&[
        (g.allocated, t.allocated(), "allocated"),
        (g.swing, t.allocated_alt(), "alloc range"),
        (g.reserved, t.reserved(), "reserved"),
        (g.nvml, t.nvml(), "NVML used"),
    ]);
    let block = t.block(title(view, now, t)).title_bottom(legend);
    frame.render_widget(block, area);
    let plot = plot_area(area);
    if plot.width < 4 || plot.height < 2 {
        return;
    }
    let cols = columns(e);
    if cols.iter().all(|c| *c == Col::default()) {
        let msg = if e.view.devices.is_empty() && e.view.nvml_timeline.is_none() {
            "no timeline for this process"
        } else {
            "no samples in this window (+/- zoom, f follows live)"
        };
        frame.render_widget(
            Paragraph::new(Line::styled(msg, t.dim())).centered(),
            Rect {
                y: plot.y + plot.height / 2,
                height: 1,
                ..plot
            },
        );
    } else {
        let top = cols
            .iter()
            .flat_map(|c| [c.alloc_max, c.reserved, c.nvml])
            .flatten()
            .max()
            .unwrap_or(0);
        let ymax = nice_max(top);
        draw_columns(frame, plot, &cols, ymax, t);
        draw_value_axis(frame, area, plot, ymax, t);
    }
    draw_watch_start(frame, plot, e, view.window(now), t);
    draw_time_axis(frame, area, plot, &time_labels(view, now), t);
}

/// Where watching began, when it is in the window: a dotted column, and
/// "attached mid-run" (FORMAT.md, "Attaching mid-run") or "watching since".
fn draw_watch_start(
    frame: &mut Frame,
    plot: Rect,
    e: &ProcessEntry,
    (from, to): (u64, u64),
    t: &Theme,
) {
    let w = e.view.watch;
    let Some(began) = w.began_ns.filter(|&b| b >= from && b < to) else {
        return;
    };
    let x = plot.x
        + ((u128::from(began - from) * u128::from(plot.width)) / u128::from(to - from)) as u16;
    let sym = if t.ascii { ":" } else { "┆" };
    let buf = frame.buffer_mut();
    for y in plot.y..plot.y + plot.height {
        buf[(x, y)].set_symbol(sym).set_style(t.warn());
    }
    let label = match (w.mid_run, w.waiting_for_anchor) {
        (true, true) => " attached mid-run: waiting for a snapshot ",
        (true, false) => " attached mid-run ",
        (false, _) => " watching since ",
    };
    let room = (plot.x + plot.width).saturating_sub(x + 1);
    if room as usize >= label.len() {
        frame.render_widget(
            Paragraph::new(Span::styled(label, t.warn())),
            Rect::new(x + 1, plot.y, label.len() as u16, 1),
        );
    }
}

/// ` Memory over time · window 5m  LIVE ` (or how long ago the window ends;
/// a file's trace: ` · the whole trace, 1.2s `).
fn title(view: &ProcessState, now: u64, t: &Theme) -> Line<'static> {
    let dot = t.glyphs().dot;
    let what = Span::styled(" Memory over time ", t.title());
    if view.trace_window.is_some() {
        let span = format::span(view.span_ns());
        return Line::from(vec![
            what,
            Span::styled(format!("{dot} the whole trace, {span} "), t.dim()),
        ]);
    }
    let state = if view.follow {
        Span::styled(" LIVE ", t.good())
    } else {
        let (_, to) = view.window(now);
        let back = now.saturating_sub(to);
        Span::styled(format!(" ends {} ago ", format::duration(back)), t.warn())
    };
    Line::from(vec![
        what,
        Span::styled(
            format!("{dot} window {} ", format::span(view.span_ns())),
            t.dim(),
        ),
        state,
    ])
}

/// `cols` across `plot`, from the bottom up to `ymax`: allocated, its
/// range, reserved, and NVML used as a line.
pub(super) fn draw_columns(frame: &mut Frame, plot: Rect, cols: &[Col], ymax: u64, t: &Theme) {
    let g = t.glyphs();
    let h = plot.height as u64;
    // Value → filled cells (rounded).
    let cells = |v: u64| -> u64 { ((v as f64 / ymax as f64) * h as f64).round() as u64 };
    let buf = frame.buffer_mut();
    let n = cols.len();
    for x in 0..plot.width {
        let i = (x as usize * n) / plot.width as usize;
        let Some(c) = cols.get(i) else { continue };
        let amin = c.alloc_min.map_or(0, cells);
        let amax = c.alloc_max.map_or(0, cells).max(amin);
        let res = c.reserved.map_or(0, cells);
        let nv = c.nvml.map(cells);
        for row in 0..h {
            let y = plot.y + plot.height - 1 - row as u16;
            let (sym, style): (&str, Style) = if row < amin {
                (g.allocated, t.allocated())
            } else if row < amax {
                (g.swing, t.allocated_alt())
            } else if row < res {
                (g.reserved, t.reserved())
            } else {
                continue;
            };
            buf[(plot.x + x, y)].set_symbol(sym).set_style(style);
        }
        if let Some(nv) = nv {
            let row = nv.saturating_sub(1).min(h - 1);
            let y = plot.y + plot.height - 1 - row as u16;
            buf[(plot.x + x, y)].set_symbol(g.nvml).set_style(t.nvml());
        }
    }
}

/// `ymax`, its half and 0 left of `plot`.
pub(super) fn draw_value_axis(frame: &mut Frame, area: Rect, plot: Rect, ymax: u64, t: &Theme) {
    let h = plot.height as u64;
    let label_w = (AXIS_WIDTH - 1) as usize;
    let labels = [
        (0u16, ymax),
        (
            plot.height / 2,
            ymax - (u128::from(ymax) * u128::from(plot.height / 2) / u128::from(h)) as u64,
        ),
        (plot.height - 1, 0),
    ];
    for (dy, v) in labels {
        let text = format!("{:>label_w$}", format::bytes_short(v));
        let r = Rect::new(area.x + 1, plot.y + dy, AXIS_WIDTH, 1);
        frame.render_widget(
            Paragraph::new(Line::from(vec![
                Span::styled(text, t.dim()),
                Span::styled(if t.ascii { "|" } else { "┤" }, t.dim()),
            ])),
            r,
        );
    }
}

/// The time axis's labels, left, middle and right: back from now (`-30s
/// -15s now`), or a file's trace from its start (`0s +0.6s +1.2s`).
fn time_labels(view: &ProcessState, now: u64) -> [String; 3] {
    let span = view.span_ns();
    if view.trace_window.is_some() {
        let at = |ns: u64| format!("+{}", format::span(ns));
        return ["0s".to_string(), at(span / 2), at(span)];
    }
    let (_, to) = view.window(now);
    ago_labels(span, now.saturating_sub(to), view.follow)
}

/// The labels of a window `span` long that ends `back` before now:
/// `-30s -15s now` when it follows now (`live`), else `-1m -45s -30s`.
pub(super) fn ago_labels(span: u64, back: u64, live: bool) -> [String; 3] {
    let ago = |ns: u64| format!("-{}", format::span(ns));
    let right = if live && back < 1_000_000_000 {
        "now".to_string()
    } else {
        ago(back)
    };
    [ago(back + span), ago(back + span / 2), right]
}

/// `[left, mid, right]` under `plot`, on the line below it when that line
/// is inside `area` (above its bottom border); the middle one where there
/// is room.
pub(super) fn draw_time_axis(
    frame: &mut Frame,
    area: Rect,
    plot: Rect,
    [left, mid, right]: &[String; 3],
    t: &Theme,
) {
    let y = plot.y + plot.height;
    if y >= area.y + area.height.saturating_sub(1) {
        return;
    }
    let w = plot.width as usize;
    let mut line = vec![' '; w];
    let put = |line: &mut Vec<char>, at: usize, s: &str| {
        for (k, ch) in s.chars().enumerate() {
            if at + k < line.len() {
                line[at + k] = ch;
            }
        }
    };
    put(&mut line, 0, left);
    if w > left.len() + mid.len() + right.len() + 4 {
        put(&mut line, w / 2 - mid.len() / 2, mid);
    }
    put(&mut line, w.saturating_sub(right.len()), right);
    let s: String = line.into_iter().collect();
    frame.render_widget(
        Paragraph::new(Span::styled(s, t.dim())),
        Rect::new(plot.x, y, plot.width, 1),
    );
}

#[cfg(test)]
mod tests {
    use super::{nice_max, time_labels, ProcessState};

    /// A file's trace, however short, is the window, labelled from its
    /// start; a live window back from now (issue 30, item 4).
    #[test]
    fn a_trace_is_labelled_from_its_start_and_live_back_from_now() {
        let now = 100_000_000_000;
        let live = ProcessState::default();
        assert_eq!(time_labels(&live, now), ["-30s", "-15s", "now"]);
        let file = ProcessState {
            trace_window: Some((now - 400_000_000, now)),
            ..ProcessState::default()
        };
        assert_eq!(file.window(now + 7), (now - 400_000_000, now));
        assert_eq!(time_labels(&file, now), ["0s", "+200ms", "+400ms"]);
    }

    #[test]
    fn nice_max_is_above_and_ends_for_any_figure() {
        assert!(nice_max(0) >= 1 << 20);
        for v in [
            1u64 << 30,
            8_800_000_000_000_000_000,
            u64::MAX / 2,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let top = nice_max(v);
            assert!(top >= v, "{v} -> {top}");
        }
        assert_eq!(nice_max(u64::MAX), u64::MAX);
    }
}
