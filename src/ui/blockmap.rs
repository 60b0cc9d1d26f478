//! The block map: one row per segment, its blocks drawn to scale across the
//! row and coloured by state. A row starts with its pool (`L` large, `S`
//! small, `?` when only guessed from the size), `x` for an expandable
//! segment, and its stream; it ends with the segment's size.
//!
//! ```text
//!  cuda:0 · 14 segments · 2.1G reserved · largest free S 1.2M L 18M
//!  L  s0 ████▇▇▇▇░░░░░░████████▒▒░░░░░░░░░░░░░░░░░░░░░░░░   20M
//!  S  s0 ██▇█▇░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░  2.0M
//! ```

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::format;
use super::theme::Theme;
use crate::collect::ProcessEntry;
use crate::event::{BlockState, SegmentPool};
use crate::model::view::{DeviceView, SegmentView};
use crate::model::Mode;

/// A row of the map.
enum MapRow<'a> {
    Device(&'a DeviceView),
    Segment(&'a SegmentView),
    Orphans(&'a DeviceView),
}

fn map_rows(e: &ProcessEntry) -> Vec<MapRow<'_>> {
    let mut out = Vec::new();
    for d in &e.view.devices {
        out.push(MapRow::Device(d));
        let mut segs: Vec<&SegmentView> = d.segments.iter().collect();
        segs.sort_by_key(|s| {
            (
                s.segment.stream,
                s.segment.pool_kind == SegmentPool::Small,
                s.segment.addr,
            )
        });
        out.extend(segs.into_iter().map(MapRow::Segment));
        if !d.orphans.is_empty() {
            out.push(MapRow::Orphans(d));
        }
    }
    out
}

/// Rows the map has for `e` (for scrolling).
pub fn row_count(e: &ProcessEntry) -> usize {
    e.view
        .devices
        .iter()
        .map(|d| 1 + d.segments.len() + usize::from(!d.orphans.is_empty()))
        .sum()
}

/// `s0`, `s7`, or the low bits of a real stream pointer (`s#b0c0`).
pub fn stream_label(stream: u64) -> String {
    if stream < 0x1_0000 {
        format!("s{stream}")
    } else {
        format!("s#{:04x}", stream & 0xffff)
    }
}

/// The map of `e`, from row `scroll` on.
pub fn render(frame: &mut Frame, area: Rect, e: &ProcessEntry, scroll: usize, t: &Theme) {
    let g = t.glyphs();
    let rows = map_rows(e);
    let segs: usize = e.view.devices.iter().map(|d| d.segments.len()).sum();
    let inner_h = area.height.saturating_sub(2) as usize;
    // Never past the last full page (a scroll kept from a smaller terminal).
    let offset = scroll.min(rows.len().saturating_sub(inner_h));
    let mut title = vec![
        Span::styled(" Block map ", t.title()),
        Span::styled(format!("{} {segs} segments ", g.dot), t.dim()),
    ];
    if rows.len() > inner_h && inner_h > 0 {
        title.push(Span::styled(
            format!(
                "{} rows {}-{}/{} (PgUp/PgDn) ",
                g.dot,
                offset + 1,
                (offset + inner_h).min(rows.len()),
                rows.len()
            ),
            t.dim(),
        ));
    }
    let legend = t.legend(&[
        (g.allocated, t.allocated(), "allocated"),
        (g.pending, t.pending(), "pending-free"),
        (g.inactive, t.inactive(), "inactive"),
        ("L/S", t.key(), "pool"),
        ("x", t.key(), "expandable"),
    ]);
    let block = t.block(Line::from(title)).title_bottom(legend);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if inner.height == 0 || inner.width < 10 {
        return;
    }
    if rows.is_empty() {
        let msg = if e.view.mode == Mode::NvmlOnly {
            "No block map: this process has no vramscope agent (NVML figures only)."
        } else {
            "No segments known yet (waiting for a state snapshot; s asks for one)."
        };
        frame.render_widget(
            Paragraph::new(Line::styled(msg, t.dim())).wrap(ratatui::widgets::Wrap { trim: true }),
            inner,
        );
        return;
    }
    let prefix_w = rows
        .iter()
        .filter_map(|r| match r {
            MapRow::Segment(s) => Some(stream_label(s.segment.stream).len()),
            _ => None,
        })
        .max()
        .unwrap_or(2)
        + 4;
    let size_w = 7usize;
    let bar_w = (inner.width as usize)
        .saturating_sub(prefix_w + size_w)
        .max(1);
    let mut lines = Vec::with_capacity(inner.height as usize);
    for row in rows.iter().skip(offset).take(inner.height as usize) {
        lines.push(match row {
            MapRow::Device(d) => {
                format::fit_line(device_line(d, t), inner.width as usize, g.ellipsis)
            }
            MapRow::Segment(s) => segment_line(s, prefix_w, bar_w, t),
            MapRow::Orphans(d) => Line::styled(
                format!(
                    "  {} blocks outside any known segment (resync pending)",
                    d.orphans.len()
                ),
                t.warn(),
            ),
        });
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

fn device_line(d: &DeviceView, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let f = &d.figures;
    let fr = &f.fragmentation;
    let mut spans = vec![
        Span::styled(format!("cuda:{}", f.device), t.header()),
        Span::styled(format!(" {} ", g.dot), t.dim()),
        Span::raw(format!(
            "{} reserved, {} allocated",
            format::bytes_short(f.reserved),
            format::bytes_short(f.allocated)
        )),
    ];
    // The warning before the figures a narrow pane may cut.
    if !f.synced {
        spans.push(Span::styled(" (not synced)", t.warn()));
    }
    spans.push(Span::styled(format!(" {} ", g.dot), t.dim()));
    spans.push(Span::raw(format!(
        "largest free S {} L {}",
        format::opt(fr.largest_free_small, g.absent, format::bytes_short),
        format::opt(fr.largest_free_large, g.absent, format::bytes_short)
    )));
    Line::from(spans)
}

fn segment_line(s: &SegmentView, prefix_w: usize, bar_w: usize, t: &Theme) -> Line<'static> {
    let g = t.glyphs();
    let seg = &s.segment;
    let pool = match (seg.pool_kind, seg.pool_kind_known) {
        (SegmentPool::Large, true) => "L",
        (SegmentPool::Small, true) => "S",
        _ => "?",
    };
    let exp = if seg.expandable { "x" } else { " " };
    let prefix = format!(
        "{pool}{exp} {:<w$} ",
        stream_label(seg.stream),
        w = prefix_w - 4
    );
    let pool_style = if seg.pool_kind == SegmentPool::Small {
        t.key()
    } else {
        t.header()
    };
    let mut spans = vec![Span::styled(prefix, pool_style)];
    // For each cell, the block covering most of it.
    let size = seg.size.max(1);
    let mut best: Vec<(u64, Option<(BlockState, bool)>)> = vec![(0, None); bar_w];
    let mut alloc_index = 0usize;
    for b in &s.blocks {
        let alt = if b.block.state == BlockState::Allocated {
            alloc_index += 1;
            alloc_index % 2 == 0
        } else {
            false
        };
        let start = b.addr.saturating_sub(seg.addr).min(size);
        let end = (start + b.block.size).min(size);
        if end <= start {
            continue;
        }
        let c0 = (start as u128 * bar_w as u128 / size as u128) as usize;
        let c1 = ((end as u128 * bar_w as u128).div_ceil(size as u128) as usize).min(bar_w);
        for (c, slot) in best.iter_mut().enumerate().take(c1).skip(c0) {
            let cs = (c as u128 * size as u128 / bar_w as u128) as u64;
            let ce = ((c as u128 + 1) * size as u128 / bar_w as u128) as u64;
            let overlap = end.min(ce).saturating_sub(start.max(cs));
            if overlap > slot.0 {
                *slot = (overlap, Some((b.block.state, alt)));
            }
        }
    }
    // Runs of equal cells become one span.
    let mut run = String::new();
    let mut run_style: Option<Style> = None;
    for (_, cell) in &best {
        let (sym, style) = match cell {
            Some((BlockState::Allocated, false)) => (g.allocated, t.allocated()),
            Some((BlockState::Allocated, true)) => (g.allocated_alt, t.allocated_alt()),
            Some((BlockState::PendingFree, _)) => (g.pending, t.pending()),
            Some((BlockState::Inactive, _)) => (g.inactive, t.inactive()),
            None => (" ", Style::new()),
        };
        if run_style != Some(style) && !run.is_empty() {
            spans.push(Span::styled(
                std::mem::take(&mut run),
                run_style.unwrap_or_default(),
            ));
        }
        run_style = Some(style);
        run.push_str(sym);
    }
    if !run.is_empty() {
        spans.push(Span::styled(run, run_style.unwrap_or_default()));
    }
    spans.push(Span::styled(
        format!("{:>7}", format::bytes_short(seg.size)),
        t.dim(),
    ));
    Line::from(spans)
}
