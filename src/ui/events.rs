//! Recent allocator events, newest first, with their age.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::blockmap::stream_label;
use super::format;
use super::theme::Theme;
use crate::collect::ProcessEntry;
use crate::event::{Event, EventKind};

/// `e`'s recent events, newest first from `scroll` on, aged against
/// `now_ns` (the snapshot's time).
pub fn render(
    frame: &mut Frame,
    area: Rect,
    e: &ProcessEntry,
    now_ns: u64,
    scroll: usize,
    t: &Theme,
) {
    let evs = &e.view.recent_events;
    let block = t.block(Line::from(vec![
        Span::styled(" Recent events ", t.title()),
        Span::styled(
            format!(
                "{} {} shown, {} total ",
                t.glyphs().dot,
                evs.len(),
                e.view.figures.events_total
            ),
            t.dim(),
        ),
    ]));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if evs.is_empty() {
        let msg = match e.view.mode {
            crate::model::Mode::Exact => "no events yet",
            _ => "no per-event data in this mode",
        };
        frame.render_widget(Paragraph::new(Line::styled(msg, t.dim())), inner);
        return;
    }
    let lines: Vec<Line> = evs
        .iter()
        .rev()
        .skip(scroll)
        .take(inner.height as usize)
        .map(|ev| event_line(ev, now_ns, t))
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `  -1.2s ALLOC      1.50M 0x7f3a…00 s0 cuda:0`
pub fn event_line(ev: &Event, now_ns: u64, t: &Theme) -> Line<'static> {
    let age = if ev.time_ns <= now_ns {
        format!("-{}", format::duration(now_ns - ev.time_ns))
    } else {
        "+0ms".to_string()
    };
    let (name, style, detail) = describe(&ev.kind, t);
    Line::from(vec![
        Span::styled(format!("{age:>8} "), t.dim()),
        Span::styled(format!("{name:<10}"), style),
        Span::raw(detail),
    ])
}

fn describe(k: &EventKind, t: &Theme) -> (&'static str, ratatui::style::Style, String) {
    let place = |p: &crate::event::Place| format!("{} cuda:{}", stream_label(p.stream), p.device);
    let sized = |size: u64, addr: u64, p: &crate::event::Place| {
        format!("{:>7} {addr:#014x} {}", format::bytes_short(size), place(p))
    };
    match k {
        EventKind::Alloc {
            place: p,
            addr,
            size,
        } => ("ALLOC", t.allocated(), sized(*size, *addr, p)),
        EventKind::FreeRequested {
            place: p,
            addr,
            size,
        } => ("FREE_REQ", t.pending(), sized(*size, *addr, p)),
        EventKind::FreeCompleted {
            place: p,
            addr,
            size,
        } => ("FREE", t.inactive(), sized(*size, *addr, p)),
        EventKind::SegmentAlloc {
            place: p,
            addr,
            size,
        } => ("SEG_ALLOC", t.header(), sized(*size, *addr, p)),
        EventKind::SegmentFree {
            place: p,
            addr,
            size,
        } => ("SEG_FREE", t.header(), sized(*size, *addr, p)),
        EventKind::SegmentMap {
            place: p,
            addr,
            size,
        } => ("MAP", t.header(), sized(*size, *addr, p)),
        EventKind::SegmentUnmap {
            place: p,
            addr,
            size,
        } => ("UNMAP", t.header(), sized(*size, *addr, p)),
        EventKind::Oom {
            place: p,
            device_free,
            request,
        } => (
            "OOM",
            t.alert(),
            format!(
                "request {} with {} free on the device, {}",
                format::bytes(*request),
                format::bytes(*device_free),
                place(p)
            ),
        ),
        EventKind::Stats { device, stats } => (
            "STATS",
            t.dim(),
            format!(
                "cuda:{device} alloc {} resv {}",
                format::bytes_short(stats.allocated),
                format::bytes_short(stats.reserved)
            ),
        ),
        EventKind::SnapshotBegin {
            device,
            id,
            segments,
            blocks,
            ..
        } => (
            "SNAPSHOT",
            t.dim(),
            format!("#{id} cuda:{device}: {segments} segments, {blocks} blocks"),
        ),
        EventKind::SnapshotSegment { id, .. } | EventKind::SnapshotBlock { id, .. } => {
            ("SNAP_PART", t.dim(), format!("#{id}"))
        }
        EventKind::SnapshotEnd { device, id } => {
            ("SNAP_END", t.dim(), format!("#{id} cuda:{device}"))
        }
        EventKind::Marker { value, source } => {
            let from = match source {
                crate::event::MarkSource::Unknown => String::new(),
                crate::event::MarkSource::User => " (mark)".into(),
                crate::event::MarkSource::OptimizerStep { .. } => " (optimizer step)".into(),
                crate::event::MarkSource::Inferred => " (inferred)".into(),
                crate::event::MarkSource::Other(_) => " (other)".into(),
            };
            ("STEP", t.key(), format!("marker {value}{from}"))
        }
        EventKind::StatsPosition { device, at } => (
            "STATS_AT",
            t.dim(),
            format!("cuda:{device} ring {} {}..{}", at.ring, at.before, at.after),
        ),
        EventKind::Dropped { what, count, .. } => {
            ("DROPPED", t.dim(), format!("{what:?}: {count}"))
        }
        EventKind::StringChunk { id, .. }
        | EventKind::Frame { id, .. }
        | EventKind::Stack { id, .. }
        | EventKind::Context { id, .. } => ("DEFINE", t.dim(), format!("#{id}")),
        EventKind::Unknown { kind } => ("UNKNOWN", t.dim(), format!("kind {kind}")),
    }
}
