//! The legend overlay (`L`): what every column, glyph and word on screen
//! means, btop-style. Column meanings come from [`Col::meaning`], glyphs
//! from the theme (so the ASCII legend shows the ASCII marks), words from
//! [`WORDS`]. Scrolls with j/k when the terminal is short. The fleet
//! view's legend ([`fleet_lines`]) is the same overlay with its own lines.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;

use super::rows::Col;
use super::scroll::Scroll;
use super::theme::Theme;

/// Words and marks the panes use, and what they mean.
pub(crate) const WORDS: &[(&str, &str)] = &[
    (
        "EXIT",
        "the process has exited (its last figures stay shown)",
    ),
    (
        "OOM xN",
        "out-of-memory errors seen, all runs (OOM/Leak pane: why)",
    ),
    (
        "LEAK",
        "suspected leak: floors rise (trend >= 0.60, +16 KiB)",
    ),
    (
        "steps",
        "mark(), else optimizer.step(), else the allocation pattern",
    ),
    (
        "mid-run",
        "watched after the job began: anchored on a snapshot",
    ),
    (
        "SYNC / resync",
        "events were lost; figures wait for a fresh state snapshot",
    ),
    (
        "trend",
        "how steadily the floor rises, -1..1 (1: at every step)",
    ),
    (
        "L / S pool",
        "large (>1 MiB requests) / small pool of the caching allocator",
    ),
    ("x", "an expandable segment (expandable_segments:True)"),
    (
        "ASKED / HELD",
        "step diff: bytes requested / their blocks (rounded up)",
    ),
    (
        "inactive",
        "cached: reserved but free, reusable by the same process",
    ),
    (
        "inactive split",
        "cached in partly used segments: empty_cache keeps them",
    ),
    (
        "FREE_REQ",
        "a free asked for, waiting for its stream's work to finish",
    ),
    ("STEP", "a training step boundary (optimizer step or mark)"),
    (
        "s0, s#b0c0",
        "CUDA stream: the default, or the low bits of a stream pointer",
    ),
    ("—", "absent: not measured, never zero"),
    ("G M K B", "GiB, MiB, KiB, bytes (powers of 1024)"),
];

/// The legend's lines for theme `t`.
pub(crate) fn lines(t: &Theme) -> Vec<Line<'static>> {
    let g = t.glyphs();
    let mut l = vec![Line::styled("Columns (overview)", t.header())];
    for c in Col::ALL {
        l.push(item(c.title(), Style::new(), c.meaning()));
    }
    l.push(Line::styled("Block map", t.header()));
    let marks: [(&'static str, Style, &str); 4] = [
        (g.allocated, t.allocated(), "allocated block (live tensors)"),
        (
            g.allocated_alt,
            t.allocated_alt(),
            "allocated, its neighbour (so blocks stay apart)",
        ),
        (
            g.pending,
            t.pending(),
            "pending free (FREE_REQ, stream still using it)",
        ),
        (g.inactive, t.inactive(), "inactive: cached, free for reuse"),
    ];
    for (m, s, d) in marks {
        l.push(item(m, s, d));
    }
    let marks: [(&'static str, Style, &str); 4] = [
        (
            "a b c",
            t.key(),
            "c by module: each module keeps its first letter (M lists)",
        ),
        ("+", t.dim(), "by module: the modules seen after the 25th"),
        (
            "f b o ~ ?",
            t.key(),
            "c by phase: forward, backward, optimizer, other, unknown",
        ),
        (
            g.allocated,
            t.dim(),
            "dimmed: not the module or phase that v shows",
        ),
    ];
    for (m, s, d) in marks {
        l.push(item(m, s, d));
    }
    l.push(Line::styled("Timeline", t.header()));
    let marks: [(&'static str, Style, &str); 4] = [
        (
            g.allocated,
            t.allocated(),
            "allocated (lowest in the column)",
        ),
        (
            g.swing,
            t.allocated_alt(),
            "alloc range: allocated moved between these in the column",
        ),
        (g.reserved, t.reserved(), "reserved above allocated"),
        (g.nvml, t.nvml(), "NVML used (what nvidia-smi shows)"),
    ];
    for (m, s, d) in marks {
        l.push(item(m, s, d));
    }
    l.push(Line::styled("Words", t.header()));
    for (w, d) in WORDS {
        let w = if *w == "—" { g.absent } else { w };
        l.push(item(w, t.key(), d));
    }
    l
}

/// The fleet view's legend: its tables' columns, the chart's marks, its
/// words.
pub(crate) fn fleet_lines(t: &Theme) -> Vec<Line<'static>> {
    let g = t.glyphs();
    let mut l = vec![Line::styled("Columns (nodes)", t.header())];
    let nodes: [(&str, &str); 10] = [
        (
            "NODE",
            "the exporter's host label, else Prometheus's instance",
        ),
        (
            "STATE",
            "up, or DOWN: Prometheus's last scrape of it failed",
        ),
        ("GPUS", "GPUs its exporter reports"),
        (
            "USED/TOTAL",
            "NVML: GPU memory in use / installed, all its GPUs",
        ),
        ("JOBS", "instrumented processes on the node"),
        (
            "ALLOC",
            "allocated to live tensors, summed over its processes",
        ),
        ("RESV", "reserved by the caching allocators, summed"),
        ("FRAG", "the largest fragmentation of any of its processes"),
        ("LEAKS", "processes whose step floors rise (LEAK suspected)"),
        ("OOMS", "out-of-memory errors its processes saw"),
    ];
    for (c, d) in nodes {
        l.push(item(c, Style::new(), d));
    }
    l.push(Line::styled(
        "Columns (jobs, a node's processes)",
        t.header(),
    ));
    let procs: [(&str, &str); 10] = [
        ("NODE", "the node the job runs on (jobs only)"),
        ("PID USER", "process id and owner on its node"),
        ("PROCESS", "producer label or process name (dim: exited)"),
        ("DEV", "CUDA device ordinal (one row per device)"),
        (
            "ALLOC RESV",
            "allocated to live tensors / reserved by its allocator",
        ),
        ("FRAG", Col::Frag.meaning()),
        ("LEAK", "LEAK: step floors rise; no: they do not"),
        ("OOMS", "out-of-memory errors seen"),
        ("STEP/s", "training steps a second"),
        ("UNEXPL", "NVML's bytes no one named (wide screens)"),
    ];
    for (c, d) in procs {
        l.push(item(c, Style::new(), d));
    }
    l.push(Line::styled("Chart", t.header()));
    l.push(item(g.reserved, t.reserved(), "reserved, over --range"));
    l.push(item(g.allocated, t.allocated(), "allocated, over --range"));
    l.push(Line::styled("Words", t.header()));
    let words: [(&str, &str); 4] = [
        (
            "DOWN",
            "the node's last scrape failed: its figures are gone",
        ),
        (
            "last answer",
            "a refresh failed: the figures shown are the last good ones",
        ),
        (g.absent, "absent: not measured, never zero"),
        ("G M K B", "GiB, MiB, KiB, bytes (powers of 1024)"),
    ];
    for (w, d) in words {
        l.push(item(w, t.key(), d));
    }
    l
}

/// ` mark            meaning`: at most 78 columns (a test checks), so the
/// legend needs no wrapping at 80 columns.
fn item(mark: &str, style: Style, meaning: &str) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!(" {mark:<15}"), style),
        Span::raw(meaning.to_string()),
    ])
}

/// The dashboard's legend over `area`, scrolled.
pub(crate) fn render(frame: &mut Frame, area: Rect, scroll: Scroll, t: &Theme) {
    render_lines(frame, area, lines(t), scroll, t);
}

/// The overlay's height over `area` for `lines` lines: all of them and
/// its border, as far as the terminal goes.
fn height(area: Rect, lines: usize) -> u16 {
    (lines as u16).saturating_add(2).min(area.height)
}

/// `lines` lines over `area`: the lines and the lines shown at once,
/// where the scrolling stops.
pub(crate) fn extent(area: Rect, lines: usize) -> (usize, usize) {
    (lines, height(area, lines).saturating_sub(2) as usize)
}

/// The overlay of `lines` over `area`, scrolled.
pub(crate) fn render_lines(
    frame: &mut Frame,
    area: Rect,
    lines: Vec<Line<'static>>,
    scroll: Scroll,
    t: &Theme,
) {
    let w = 96.min(area.width);
    let h = height(area, lines.len());
    let popup = super::layout::centered(area, w, h);
    frame.render_widget(Clear, popup);
    let (len, inner_h) = extent(area, lines.len());
    let scroll = scroll.fit(len, inner_h).offset();
    let block = t
        .block(Span::styled(" Legend ", t.title()))
        .title_bottom(Line::styled(
            if lines.len() > inner_h {
                " j/k scroll · Esc closes "
            } else {
                " Esc closes "
            },
            t.dim(),
        ));
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .scroll((scroll as u16, 0)),
        popup,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_fits_80_columns() {
        for t in [Theme::new(true, false), Theme::new(false, true)] {
            for l in lines(&t).into_iter().chain(fleet_lines(&t)) {
                assert!(l.width() <= 78, "{l:?}");
            }
        }
    }
}
