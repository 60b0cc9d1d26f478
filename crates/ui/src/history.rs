//! The overview's history, as nvtop and nvitop draw it: below the process
//! table, one band per GPU with its processes' memory over the last
//! [`WINDOW_NS`] — NVML used as a line, the instrumented processes'
//! reserved and allocated beneath it — and a sparkline per table row.
//!
//! ```text
//!  ┌ History · last 5m · ─ NVML used ░ reserved █ allocated ─────────────┐
//!  │ GPU 0 · NVIDIA H100 80GB HBM3 · 17.4G of 80.0G used                   │
//!  │  8.00G┤                                   ────────────────────────   │
//!  │       ┤                       ───────────░░░░░░░░░░░░░░░░░░░░░░░░░   │
//!  │     0B┤               ▒█████████████████████████████████████████   │
//!  │         -5m                  -2m30s                            now   │
//! ```
//!
//! Everything comes from the model's timelines of the processes (asked for
//! by the overview's view options): a process on several GPUs counts on
//! the first of them.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::layout::AXIS_WIDTH;
use super::rows::gpus_of;
use super::theme::Theme;
use super::timeline::{self, Col};
use vramscope_collect::{ProcessEntry, Snapshot};
use vramscope_text::format;

/// How far back the overview's history goes.
pub(crate) const WINDOW_NS: u64 = 300_000_000_000;

/// Plot columns for a history band `width` wide (its border and axis
/// removed): what the overview asks the model for.
pub(crate) fn plot_width(width: u16) -> usize {
    width.saturating_sub(2 + AXIS_WIDTH) as usize
}

/// The columns of the processes on GPU `gpu`, summed.
pub(crate) fn gpu_columns(snap: &Snapshot, gpu: u32) -> Vec<Col> {
    sum_columns(
        snap.processes
            .iter()
            .filter(|e| gpus_of(snap, e).first() == Some(&gpu)),
    )
}

/// The columns of `processes`, summed column by column.
fn sum_columns<'a>(processes: impl Iterator<Item = &'a ProcessEntry>) -> Vec<Col> {
    let mut sum: Vec<Col> = Vec::new();
    for e in processes {
        for (i, c) in timeline::columns(e).into_iter().enumerate() {
            if sum.len() <= i {
                sum.push(Col::default());
            }
            let s = &mut sum[i];
            for (slot, v) in [
                (&mut s.alloc_min, c.alloc_min),
                (&mut s.alloc_max, c.alloc_max),
                (&mut s.reserved, c.reserved),
                (&mut s.nvml, c.nvml),
            ] {
                if let Some(v) = v {
                    *slot = Some(slot.unwrap_or(0).saturating_add(v));
                }
            }
        }
    }
    sum
}

/// One band per GPU in `area`.
pub(crate) fn render(frame: &mut Frame, area: Rect, snap: &Snapshot, t: &Theme) {
    let g = t.glyphs();
    let legend = t.legend(&[
        (g.nvml, t.nvml(), "NVML used"),
        (g.reserved, t.reserved(), "reserved"),
        (g.allocated, t.allocated(), "allocated"),
        (g.swing, t.allocated_alt(), "alloc range"),
    ]);
    let block = t
        .block(Line::from(vec![
            Span::styled(" History ", t.title()),
            Span::styled(
                format!("{} last {} ", g.dot, format::span(WINDOW_NS)),
                t.dim(),
            ),
        ]))
        .title_bottom(legend);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let gpus = &snap.machine.gpus;
    let indices: Vec<u32> = if gpus.is_empty() {
        // No NVML: one band for every process.
        vec![]
    } else {
        gpus.iter().map(|g| g.index).collect()
    };
    let bands = indices.len().max(1) as u16;
    // A line for the time axis, under every band, where each band keeps
    // its 4 lines.
    let axis = inner.height.saturating_sub(1) / bands >= 4;
    let band_h = inner.height.saturating_sub(u16::from(axis)) / bands;
    if band_h < 4 {
        return;
    }
    if axis {
        let plots = Rect {
            x: inner.x + AXIS_WIDTH,
            width: inner.width.saturating_sub(AXIS_WIDTH),
            height: bands * band_h,
            ..inner
        };
        let labels = timeline::ago_labels(WINDOW_NS, 0, true);
        timeline::draw_time_axis(frame, area, plots, &labels, t);
    }
    for (i, y) in (0..bands).map(|i| (i, inner.y + i * band_h)) {
        let band = Rect::new(inner.x, y, inner.width, band_h);
        let (label, cols) = match indices.get(i as usize) {
            Some(&gi) => {
                let gpu = gpus.iter().find(|g| g.index == gi);
                let a = g.absent;
                let label = gpu.map_or_else(String::new, |gp| {
                    let dot = g.dot;
                    let used = format::opt(gp.used, a, format::bytes_short);
                    let total = format::opt(gp.total, a, format::bytes_short);
                    format!(" GPU {gi} {dot} {} {dot} {used} / {total} used", gp.name)
                });
                (label, gpu_columns(snap, gi))
            }
            // No NVML: no GPUs to group by.
            None => (
                " all processes".to_string(),
                sum_columns(snap.processes.iter()),
            ),
        };
        let label = format::fit_words(&label, band.width as usize, g.ellipsis);
        frame.render_widget(
            Paragraph::new(Line::styled(label, t.header())),
            Rect { height: 1, ..band },
        );
        let plot_band = Rect {
            y: band.y + 1,
            height: band.height - 1,
            ..band
        };
        let plot = Rect {
            x: plot_band.x + AXIS_WIDTH,
            width: plot_band.width.saturating_sub(AXIS_WIDTH),
            ..plot_band
        };
        if cols.iter().all(|c| *c == Col::default()) {
            frame.render_widget(
                Paragraph::new(Line::styled("no samples in the last 5 minutes", t.dim()))
                    .centered(),
                Rect {
                    y: plot.y + plot.height / 2,
                    height: 1,
                    ..plot
                },
            );
            continue;
        }
        let top = cols
            .iter()
            .flat_map(|c| [c.alloc_max, c.reserved, c.nvml])
            .flatten()
            .max()
            .unwrap_or(0);
        let ymax = timeline::nice_max(top);
        timeline::draw_columns(frame, plot, &cols, ymax, t);
        timeline::draw_value_axis(
            frame,
            Rect {
                x: band.x.saturating_sub(1),
                ..plot_band
            },
            plot,
            ymax,
            t,
        );
    }
}

/// Eight heights of a sparkline (ASCII: `_.-=+*#@`).
const SPARKS: [&str; 8] = ["▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
const SPARKS_ASCII: [&str; 8] = ["_", ".", "-", "=", "+", "*", "#", "@"];

/// `e`'s memory over the history window in `width` cells: reserved for an
/// instrumented process, else NVML used; each cell the largest value of
/// its slice, scaled to the largest of all; a blank where nothing was seen.
pub(crate) fn sparkline(e: &ProcessEntry, width: usize, t: &Theme) -> String {
    let cols = timeline::columns(e);
    let vals: Vec<Option<u64>> = cols.iter().map(|c| c.reserved.or(c.nvml)).collect();
    if vals.is_empty() || width == 0 {
        return String::new();
    }
    let cells: Vec<Option<u64>> = (0..width)
        .map(|x| {
            let (a, b) = (
                x * vals.len() / width,
                ((x + 1) * vals.len() / width).max(x * vals.len() / width + 1),
            );
            vals[a..b.min(vals.len())].iter().flatten().copied().max()
        })
        .collect();
    let top = cells.iter().flatten().copied().max().unwrap_or(0).max(1);
    let marks = if t.ascii { &SPARKS_ASCII } else { &SPARKS };
    cells
        .iter()
        .map(|c| match c {
            Some(v) => marks[((*v as f64 / top as f64) * 7.0).round() as usize],
            None => " ",
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::Fixture;

    #[test]
    fn a_sparkline_rises_with_a_leak_and_is_as_wide_as_asked() {
        let fx = Fixture::new(6);
        let opts = vramscope_core::model::ViewOptions {
            block_map: false,
            recent_events: 0,
            timeline: Some(vramscope_core::model::TimelineRequest {
                from_ns: fx.now_ns.saturating_sub(WINDOW_NS),
                to_ns: fx.now_ns,
                columns: 120,
            }),
        };
        let snap = fx.snapshot(&opts);
        let leak = snap
            .processes
            .iter()
            .find(|p| Some(p.key()) == fx.key_of("leak"))
            .unwrap();
        let t = Theme::new(true, false);
        let s = sparkline(leak, 16, &t);
        assert_eq!(s.chars().count(), 16, "{s:?}");
        // The leak's reserved only grows: the last cell is the highest.
        assert!(s.ends_with('█'), "{s:?}");
        let ascii = sparkline(leak, 16, &Theme::new(false, true));
        assert!(ascii.is_ascii(), "{ascii:?}");
        // GPU 0's band sums its processes.
        let g0 = gpu_columns(&snap, 0);
        assert_eq!(g0.len(), 120);
        assert!(g0.iter().any(|c| c.nvml.is_some() && c.reserved.is_some()));
    }
}
