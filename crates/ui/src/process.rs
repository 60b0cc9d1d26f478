//! The process view: a two-line summary, then the panes — all at once on a
//! large terminal, as tabs on a small one (see [`super::layout`]).

use ratatui::layout::{Alignment, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Tabs, Wrap};
use ratatui::Frame;

use super::app::App;
use super::rows::{mode_word, Row};
use super::state::Pane;
use super::theme::Theme;
use super::{blockmap, diagnosis, events, layout, stats, timeline};
use vramscope_text::format;

/// The view of the selected process; each pane gets what it draws.
pub(crate) fn render(frame: &mut Frame, area: Rect, app: &App) {
    let t = &app.config.theme;
    let Some(e) = app.selected_entry() else {
        let pid = app.overview.selected.map_or(0, |k| k.pid);
        frame.render_widget(
            Paragraph::new(vec![
                Line::raw(""),
                Line::styled(
                    format!("Process {pid} is no longer visible (it exited)."),
                    t.warn(),
                ),
                Line::styled("Esc goes back to the overview.", t.dim()),
            ])
            .alignment(Alignment::Center)
            .wrap(Wrap { trim: true }),
            area,
        );
        return;
    };
    let view = &app.process;
    let compact = layout::compact(app.size);
    let a = layout::process(app.size, view.pane, area);
    let mut row = Row::new(&app.snap, e);
    // A snapshot file's state is what the file holds: nothing was lost and
    // there is no one to ask for a resync (issue 46, item 21).
    if app.trace.is_some() {
        row.needs_resync = false;
    }
    render_info(frame, a.info, &row, t);
    if let Some(tabs) = a.tabs {
        let titles: Vec<Line> = Pane::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut title = format!("{} {}", i + 1, p.title());
                if *p == Pane::Diagnosis && (e.view.leak.flagged || !e.view.ooms.is_empty()) {
                    title.push('!');
                }
                Line::from(title)
            })
            .collect();
        let w = Tabs::new(titles)
            .select(Pane::ALL.iter().position(|p| *p == view.pane))
            .style(t.dim())
            .highlight_style(t.selected())
            .divider(if t.ascii { "|" } else { "│" });
        frame.render_widget(w, tabs);
    }
    let taken = app.snap.taken_ns;
    if let Some(r) = a.timeline {
        timeline::render(frame, r, e, view, app.now_ns(), t);
    }
    if let Some(r) = a.blocks {
        blockmap::render(frame, r, e, &view.map_view(taken, e.key()), t);
    }
    if let Some(r) = a.stats {
        stats::render(frame, r, e, view.stats_scroll, t);
    }
    if let Some(r) = a.events {
        events::render(
            frame,
            r,
            e,
            taken,
            (view.event_scroll, &view.event_filter),
            t,
        );
    }
    if let Some(r) = a.diagnosis {
        diagnosis::render(frame, r, e, (taken, view.diagnosis_scroll), t);
    }
    // On a large terminal every pane shows: the one Tab moved to (where
    // j/k and PgUp/PgDn scroll) has its border in the key colour.
    if !compact {
        let focused = match view.pane {
            Pane::Blocks => a.blocks,
            Pane::Stats => a.stats,
            Pane::Events => a.events,
            Pane::Diagnosis => a.diagnosis,
            Pane::Timeline => None,
        };
        if let Some(r) = focused {
            highlight_border(frame.buffer_mut(), r, t);
        }
    }
}

/// Draws the border of `r` (already drawn) in the focus style, the
/// titles on it left as they are.
fn highlight_border(buf: &mut ratatui::buffer::Buffer, r: Rect, t: &Theme) {
    let b = t.border();
    let marks = [
        b.top_left,
        b.top_right,
        b.bottom_left,
        b.bottom_right,
        b.vertical_left,
        b.vertical_right,
        b.horizontal_top,
        b.horizontal_bottom,
    ];
    if r.width < 2 || r.height < 2 {
        return;
    }
    let (right, bottom) = (r.x + r.width - 1, r.y + r.height - 1);
    for y in r.y..=bottom {
        for x in r.x..=right {
            if !(y == r.y || y == bottom || x == r.x || x == right) {
                continue;
            }
            if let Some(c) = buf.cell_mut((x, y)) {
                if marks.contains(&c.symbol()) {
                    c.set_style(t.focus());
                }
            }
        }
    }
}

fn render_info(frame: &mut Frame, area: Rect, r: &Row, t: &Theme) {
    let g = t.glyphs();
    let a = g.absent;
    let e = r.entry;
    let sep = || Span::styled(format!(" {} ", g.dot), t.dim());
    let mut l1 = vec![
        Span::styled(format!(" pid {} ", r.pid), t.header()),
        Span::raw(r.name.clone()),
    ];
    if !e.identity.user.is_empty() {
        l1.push(sep());
        l1.push(Span::raw(e.identity.user.clone()));
    }
    l1.push(sep());
    l1.push(Span::styled(mode_word(r.mode), t.key()));
    if let Some(fw) = e.source.framework.as_ref().or(e.source.producer.as_ref()) {
        l1.push(sep());
        l1.push(Span::styled(fw.clone(), t.dim()));
    }
    if let Some(g) = &r.gpus {
        l1.push(sep());
        l1.push(Span::raw(format!("GPU {g}")));
    }
    if !r.alive {
        l1.push(Span::styled("  EXITED", t.warn()));
    }
    let fig =
        |label: &str, v: String| vec![Span::styled(format!(" {label} "), t.dim()), Span::raw(v)];
    let mut l2 = Vec::new();
    if r.leak {
        l2.push(Span::styled(" LEAK", t.alert()));
    }
    if r.ooms > 0 {
        l2.push(Span::styled(format!(" OOM x{}", r.ooms), t.alert()));
    }
    if r.needs_resync {
        l2.push(Span::styled(" resync", t.warn()));
    }
    l2.extend(fig("NVML", format::opt(r.nvml, a, format::bytes_short)));
    l2.extend(fig("resv", format::opt(r.reserved, a, format::bytes_short)));
    l2.extend(fig(
        "alloc",
        format::opt(r.allocated, a, format::bytes_short),
    ));
    l2.extend(fig(
        "other",
        format::opt(r.non_pytorch, a, format::bytes_signed_short),
    ));
    // What no one named of it, where the producer names its parts (issue
    // 47): `other 770M (unexpl 4.00M)`, where the figures after it still
    // fit.
    let unexpl = (r.unexplained)
        .filter(|_| !e.view.outside.is_empty())
        .map(|u| {
            (
                l2.len(),
                format!(" (unexpl {})", format::bytes_signed_short(u)),
            )
        });
    if let Some((_, text)) = &unexpl {
        l2.push(Span::raw(text.clone()));
    }
    l2.extend(fig("peak", format::opt(r.peak, a, format::bytes_short)));
    l2.extend(fig("frag", format::opt(r.frag, a, format::percent)));
    l2.extend(fig("ev/s", format::opt(r.rate, a, format::rate)));
    l2.extend(fig("lost", format::opt(r.lost, a, format::count)));
    if let Some((at, _)) = unexpl {
        if l2.iter().map(Span::width).sum::<usize>() > area.width as usize {
            l2.remove(at);
        }
    }
    // The host side, as htop shows it.
    if r.cpu.is_some() || r.rss.is_some() {
        l2.push(sep());
        l2.extend(fig("CPU", format::opt(r.cpu, a, |c| format!("{c:.0}%"))));
        l2.extend(fig("RSS", format::opt(r.rss, a, format::bytes_short)));
        l2.extend(fig("up", format::opt(r.elapsed_ns, a, format::duration)));
    }
    if !e.identity.cmdline.is_empty() {
        l1.push(sep());
        l1.push(Span::styled(e.identity.cmdline.clone(), t.dim()));
    }
    let w = area.width as usize;
    let (l1, l2) = (
        crate::fit::fit_line(Line::from(l1), w, g.ellipsis),
        crate::fit::fit_line(Line::from(l2), w, g.ellipsis),
    );
    frame.render_widget(Paragraph::new(vec![l1, l2]), area);
}
