//! Recent allocator events, newest first, with their age.

use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::blockmap::stream_label;
use super::scroll::Scroll;
use super::theme::Theme;
use vramscope_collect::ProcessEntry;
use vramscope_text::format;
use vramscope_wire::event::{Event, EventKind, MarkSource, Place};

/// The events of `e` the pane lists, newest first: those whose line
/// (name and details, lower case) contains `filter` (lower case).
pub(crate) fn shown<'a>(
    e: &'a ProcessEntry,
    filter: &'a str,
) -> impl Iterator<Item = &'a Event> + 'a {
    e.view
        .recent_events
        .iter()
        .rev()
        .filter(move |ev| filter.is_empty() || matches(ev, filter))
}

/// Whether `ev`'s line contains `filter` (lower case): `alloc`, `oom`,
/// `16.0m`, `0x7f01`, `s1`...
pub(crate) fn matches(ev: &Event, filter: &str) -> bool {
    // The line as the pane shows it, after the age.
    let (name, _, detail) = describe(&ev.kind, &Theme::default());
    format!("{name:<10}{detail}")
        .to_lowercase()
        .contains(filter)
}

/// `e`'s event history, newest first, scrolled, aged against
/// `now_ns` (the snapshot's time); only the events matching `filter` when
/// one is typed (`/`).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    e: &ProcessEntry,
    now_ns: u64,
    (scroll, filter): (Scroll, &str),
    t: &Theme,
) {
    let evs = &e.view.recent_events;
    let filter = filter.to_lowercase();
    // Never past the last full page (a scroll kept from a smaller
    // terminal, or from a longer search).
    let page = area.height.saturating_sub(2) as usize;
    let scroll = scroll.fit(shown(e, &filter).count(), page);
    let dot = t.glyphs().dot;
    let kept = e
        .view
        .figures
        .events_total
        .min(vramscope_core::model::RECENT_EVENTS as u64);
    let count = if filter.is_empty() {
        format!("{dot} {kept} kept of {} ", e.view.figures.events_total)
    } else {
        format!(
            "{dot} search \"{filter}\": {} of {} ",
            shown(e, &filter).count(),
            evs.len()
        )
    };
    let mut title = vec![
        Span::styled(" Event history ", t.title()),
        Span::styled(count, t.dim()),
    ];
    if scroll.offset() > 0 {
        title.push(Span::styled(
            format!("{dot} from #{} ", scroll.offset() + 1),
            t.dim(),
        ));
    }
    let block = t.block(Line::from(title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if evs.is_empty() {
        let msg = match e.view.mode {
            vramscope_core::model::Mode::Exact => "no events yet",
            _ => "no per-event data in this mode",
        };
        frame.render_widget(Paragraph::new(Line::styled(msg, t.dim())), inner);
        return;
    }
    let lines: Vec<Line> = shown(e, &filter)
        .skip(scroll.offset())
        .take(inner.height as usize)
        .map(|ev| event_line(ev, now_ns, t))
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `  -1.2s ALLOC      1.50M 0x7f3a…00 s0 cuda:0`
pub(crate) fn event_line(ev: &Event, now_ns: u64, t: &Theme) -> Line<'static> {
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

/// The event's name, its style and what follows them.
fn describe(k: &EventKind, t: &Theme) -> (&'static str, Style, String) {
    use EventKind as K;
    let (name, style) = match k {
        K::Alloc { .. } => ("ALLOC", t.allocated()),
        K::FreeRequested { .. } => ("FREE_REQ", t.pending()),
        K::FreeCompleted { .. } => ("FREE", t.inactive()),
        K::SegmentAlloc { .. } => ("SEG_ALLOC", t.header()),
        K::SegmentFree { .. } => ("SEG_FREE", t.header()),
        K::SegmentMap { .. } => ("MAP", t.header()),
        K::SegmentUnmap { .. } => ("UNMAP", t.header()),
        K::Oom { .. } => ("OOM", t.alert()),
        K::Stats { .. } => ("STATS", t.dim()),
        K::SnapshotBegin { .. } => ("SNAPSHOT", t.dim()),
        K::SnapshotSegment { .. } | K::SnapshotBlock { .. } => ("SNAP_PART", t.dim()),
        K::SnapshotEnd { .. } => ("SNAP_END", t.dim()),
        K::Marker { .. } => ("STEP", t.key()),
        K::StatsPosition { .. } => ("STATS_AT", t.dim()),
        K::Dropped { .. } => ("DROPPED", t.dim()),
        K::StringChunk { .. } | K::Frame { .. } | K::Stack { .. } | K::Context { .. } => {
            ("DEFINE", t.dim())
        }
        K::Roles { .. } | K::Role { .. } | K::RolesEnd { .. } => ("ROLES", t.dim()),
        K::Outside(_) => ("OUTSIDE", t.header()),
        K::Unknown { .. } => ("UNKNOWN", t.dim()),
    };
    (name, style, detail(k))
}

/// `1.50M 0x7f3a…00 s0 cuda:0` for a block or segment event; what else
/// an event carries for the others.
fn detail(k: &EventKind) -> String {
    use EventKind as K;
    let at = |p: &Place| format!("{} cuda:{}", stream_label(p.stream), p.device);
    match k {
        K::Alloc { place, addr, size }
        | K::FreeRequested { place, addr, size }
        | K::FreeCompleted { place, addr, size }
        | K::SegmentAlloc { place, addr, size }
        | K::SegmentFree { place, addr, size }
        | K::SegmentMap { place, addr, size }
        | K::SegmentUnmap { place, addr, size } => {
            format!(
                "{:>7} {addr:#014x} {}",
                format::bytes_short(*size),
                at(place)
            )
        }
        K::Oom {
            place,
            device_free,
            request,
        } => format!(
            "request {} with {} free on the device, {}",
            format::bytes(*request),
            format::bytes(*device_free),
            at(place)
        ),
        K::Stats { device, stats } => format!(
            "cuda:{device} alloc {} resv {}",
            format::bytes_short(stats.allocated),
            format::bytes_short(stats.reserved)
        ),
        K::SnapshotBegin {
            device,
            id,
            segments,
            blocks,
            ..
        } => format!("#{id} cuda:{device}: {segments} segments, {blocks} blocks"),
        K::SnapshotSegment { id, .. } | K::SnapshotBlock { id, .. } => format!("#{id}"),
        K::SnapshotEnd { device, id } => format!("#{id} cuda:{device}"),
        K::Marker {
            source: MarkSource::Run,
            ..
        } => "a new run begins".to_string(),
        K::Marker {
            value,
            source: MarkSource::MemoryLimit { device, .. },
        } => format!(
            "memory limit of cuda:{device}: {}",
            vramscope_text::format::bytes(*value)
        ),
        K::Marker { value, source } => {
            let from = match source {
                MarkSource::Unknown => "",
                MarkSource::User => " (mark)",
                MarkSource::OptimizerStep { .. } => " (optimizer step)",
                MarkSource::Inferred => " (inferred)",
                MarkSource::Other(_) | MarkSource::Run | MarkSource::MemoryLimit { .. } => {
                    " (other)"
                }
            };
            format!("marker {value}{from}")
        }
        K::StatsPosition { device, at } => {
            format!("cuda:{device} ring {} {}..{}", at.ring, at.before, at.after)
        }
        K::Dropped { what, count, .. } => format!("{what:?}: {count}"),
        K::StringChunk { id, .. }
        | K::Frame { id, .. }
        | K::Stack { id, .. }
        | K::Context { id, .. } => format!("#{id}"),
        K::Roles { list, count } => format!("list {list}: {count} tensors"),
        K::Role {
            device,
            addr,
            bytes,
            held,
            ..
        } => format!(
            "{:>7} {addr:#014x} cuda:{device} {held:?}",
            format::bytes_short(*bytes)
        ),
        K::RolesEnd { list, count } => format!("list {list} complete: {count} tensors"),
        K::Outside(o) => vramscope_core::model::outside::describe(o),
        K::Unknown { kind } => format!("kind {kind}"),
    }
}
