//! A statistics table in the spirit of `torch.cuda.memory_summary()`: per
//! device, current and peak of allocated, active, requested, reserved and
//! inactive-split memory, then segments, blocks, retries and OOMs.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::scroll::Scroll;
use super::theme::Theme;
use vramscope_collect::ProcessEntry;
pub(crate) use vramscope_core::model::view::{DeviceFigures, FigureSource, Implausible};
use vramscope_core::model::{Bounds, Dropped, Mode};
use vramscope_text::format;

/// The summary of `e`, scrolled when it does not fit (on a small
/// terminal, where it is a tab of its own).
pub(crate) fn render(frame: &mut Frame, area: Rect, e: &ProcessEntry, scroll: Scroll, t: &Theme) {
    let block = t.block(Span::styled(" Memory summary ", t.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let mut rows = process_rows(e, t);
    for d in &e.view.devices {
        rows.extend(device_rows(&d.figures, t));
    }
    if inner.height == 0 {
        return;
    }
    render_table(frame, inner, rows, scroll, t);
    if e.view.devices.is_empty() && e.view.mode != Mode::NvmlOnly && inner.height > 5 {
        frame.render_widget(
            Paragraph::new(Line::styled(" no device figures yet", t.dim())),
            Rect {
                y: inner.y + 4,
                height: 1,
                ..inner
            },
        );
    }
}

/// Rows the summary of `e` has (for scrolling).
pub(crate) fn row_count(e: &ProcessEntry) -> usize {
    let t = Theme::default();
    process_rows(e, &t).len()
        + e.view
            .devices
            .iter()
            .map(|d| device_rows(&d.figures, &t).len())
            .sum::<usize>()
}

/// `rows` under the Metric / Current / Peak header, scrolled when they do
/// not all fit.
fn render_table(frame: &mut Frame, area: Rect, rows: Vec<Row<'static>>, scroll: Scroll, t: &Theme) {
    let header = Row::new(vec![
        Cell::from(" Metric"),
        Cell::from(Line::from("Current").right_aligned()),
        Cell::from(Line::from("Peak").right_aligned()),
    ])
    .style(t.header());
    // Never past the last full page (a scroll kept from a smaller terminal).
    let page = area.height.saturating_sub(1) as usize;
    let skip = scroll.fit(rows.len(), page).offset();
    let table = Table::new(
        rows.into_iter().skip(skip),
        [
            Constraint::Min(20),
            Constraint::Length(11),
            Constraint::Length(11),
        ],
    )
    .header(header)
    .column_spacing(1);
    frame.render_widget(table, area);
}

/// The process section: NVML's figures, and why there are no others.
fn process_rows(e: &ProcessEntry, t: &Theme) -> Vec<Row<'static>> {
    let a = t.glyphs().absent;
    let f = &e.view.figures;
    let ob = |v: Option<u64>| format::opt(v, a, format::bytes);
    let mut rows = vec![
        section("Process".into(), t),
        row("NVML used", ob(f.nvml_used), ob(f.nvml_peak)),
        row(
            "Other (NVML - resv)",
            format::opt(f.non_pytorch, a, format::bytes_i64),
            a.to_string(),
        ),
    ];
    rows.extend(outside_rows(e, t));
    if e.view.mode == Mode::NvmlOnly {
        rows.push(Row::new(vec![Cell::from(Span::styled(
            " no allocator figures: no vramscope agent in this process",
            t.dim(),
        ))]));
    }
    if f.implausible.saturated {
        rows.push(implausible_row(
            &Implausible {
                saturated: true,
                ..Implausible::default()
            },
            t,
        ));
    }
    rows.extend(
        dropped_lines(&e.view.dropped, &e.view.bounds)
            .into_iter()
            .map(|l| Row::new(vec![Cell::from(Span::styled(format!(" {l}"), t.warn()))])),
    );
    rows
}

/// Parts named one by one; the smaller ones past them are summed.
const OUTSIDE_ROWS: usize = 6;

/// What the producer named outside the caching allocator (issue 47): one
/// row per part by what it is called (context, NCCL, cuBLAS, …: its kinds
/// and devices summed), largest first, then what no one named of "Other"
/// (absent without NVML), under "Outside the allocator" (short enough
/// for the pane's narrowest first column). Nothing when the producer names
/// nothing.
fn outside_rows(e: &ProcessEntry, t: &Theme) -> Vec<Row<'static>> {
    use vramscope_core::model::outside::by_what;
    let v = &e.view;
    if v.outside.is_empty() {
        return Vec::new();
    }
    let a = t.glyphs().absent;
    let mut rows = vec![section("Outside the allocator".into(), t)];
    for (what, bytes) in by_what(&v.outside, OUTSIDE_ROWS) {
        let name = format!("  {}", vramscope_text::printable(&what));
        rows.push(row(&name, format::bytes(bytes), a.to_string()));
    }
    rows.push(row(
        "  unexplained",
        format::opt(v.figures.unexplained, a, format::bytes_i64),
        a.to_string(),
    ));
    rows
}

/// One line per kind of thing a bound dropped, e.g. `dropped: 1.2M orphan
/// blocks (bound 65536)`, then the collector's drops.
pub fn dropped_lines(d: &Dropped, b: &Bounds) -> Vec<String> {
    let kinds = [
        (d.orphans, "orphan blocks", Some(b.orphans)),
        (d.blocks, "block splits", Some(b.blocks)),
        (d.segments, "segment events", Some(b.segments)),
        (d.devices, "events of extra devices", Some(b.devices)),
        (d.replay, "events during a snapshot", Some(b.replay)),
        (d.snapshots, "oversized snapshots", None),
        (d.leak_sizes, "untracked leak sizes", Some(b.leak_sizes)),
        (
            d.definitions,
            "attribution definitions",
            Some(b.definitions),
        ),
        (d.history, "events of extra places", Some(b.places)),
        (d.roles, "role list tensors", Some(b.roles)),
    ];
    let mut out: Vec<String> = kinds
        .iter()
        .filter(|(n, _, _)| *n > 0)
        .map(|(n, what, bound)| match bound {
            Some(bound) => format!(
                "dropped: {} {what} (bound {})",
                format::count(*n),
                format::grouped(*bound as u64)
            ),
            None => format!("dropped: {} {what}", format::count(*n)),
        })
        .collect();
    for (what, n) in d.collector.iter().filter(|(_, n)| **n > 0) {
        out.push(format!("collector dropped: {} {what}", format::count(*n)));
    }
    out
}

/// A row naming figures that cannot be true.
fn implausible_row(i: &Implausible, t: &Theme) -> Row<'static> {
    let text = format!(" implausible input: {}", i.describe().join(", "));
    Row::new(vec![Cell::from(Span::styled(text, t.alert()))])
}

/// The segment count shown (the block map's once trusted), then PyTorch's
/// own (its statistics) on a row of its own where they differ: under
/// expandable segments torch counts none (issue 30 item 8, issue 46 item 9:
/// "Segments 0" beside "Block map · 2 segments").
fn segment_rows(stats: Option<u64>, shown: u64) -> Vec<(&'static str, String)> {
    let mut rows = vec![("Segments", shown.to_string())];
    if let Some(s) = stats.filter(|s| *s != shown) {
        rows.push(("  torch's count", s.to_string()));
    }
    rows
}

/// One device's section: memory current and peak, then counts.
fn device_rows(df: &DeviceFigures, t: &Theme) -> Vec<Row<'static>> {
    let a = t.glyphs().absent;
    let b = format::bytes;
    let count = |v: Option<u64>| format::opt(v, a, |v| v.to_string());
    // No peak for these.
    let current = |name: &str, cur: String| row(name, cur, a.to_string());
    let src = match df.source {
        FigureSource::Stats => "stats",
        FigureSource::BlockMap => "block map",
    };
    let mut rows = vec![section(format!("cuda:{} · {src}", df.device), t)];
    if df.implausible.any() {
        rows.push(implausible_row(&df.implausible, t));
    }
    rows.extend([
        row("Allocated memory", b(df.allocated), b(df.peak_allocated)),
        row("Active memory", b(df.active), b(df.peak_active)),
        current("Requested memory", format::opt(df.requested, a, b)),
        row("GPU reserved memory", b(df.reserved), b(df.peak_reserved)),
        current("Inactive split", b(df.fragmentation.inactive_split)),
    ]);
    let segments = segment_rows(df.stats.map(|s| s.segments), df.segments);
    rows.extend(segments.into_iter().map(|(name, v)| current(name, v)));
    rows.extend([
        current("Blocks (map)", df.blocks.to_string()),
        current(
            "Free blocks (map)",
            df.fragmentation.free_blocks.to_string(),
        ),
        current("Alloc retries", count(df.stats.map(|s| s.alloc_retries))),
        // torch's num_ooms, which a new run starts again; the header and
        // the OOM pane count every OOM seen since watching began.
        current("OOMs this run (torch)", count(df.stats.map(|s| s.ooms))),
    ]);
    rows
}

/// ` name`, then the current and the peak figure, right-aligned.
fn row(name: &str, cur: String, peak: String) -> Row<'static> {
    Row::new(vec![
        Cell::from(format!(" {name}")),
        Cell::from(Line::from(cur).right_aligned()),
        Cell::from(Line::from(peak).right_aligned()),
    ])
}

/// A section's heading row.
fn section(name: String, t: &Theme) -> Row<'static> {
    Row::new(vec![Cell::from(Span::styled(name, t.header()))])
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::*;
    use vramscope_core::input::{Identity, Source};
    use vramscope_core::model::{Bounds, Model, ModelConfig, ProcessKey, ViewOptions};
    use vramscope_wire::event::{Event, EventKind, Place};

    #[test]
    fn segments_say_whose_count_where_torch_and_the_map_differ() {
        let shown = |stats, map| segment_rows(stats, map);
        assert_eq!(
            shown(Some(0), 2),
            [("Segments", "2".into()), ("  torch's count", "0".into())]
        );
        assert_eq!(shown(Some(3), 3), [("Segments", "3".into())]);
        assert_eq!(shown(None, 4), [("Segments", "4".into())]);
    }

    #[test]
    fn item_07_the_summary_shows_what_a_bound_dropped() {
        let key = ProcessKey {
            pid: 1,
            start_time: 1,
        };
        let cfg = ModelConfig {
            bounds: Bounds {
                orphans: 10,
                ..Bounds::default()
            },
            ..ModelConfig::default()
        };
        let mut m = Model::new(cfg);
        let events: Vec<Event> = (0..25u64)
            .map(|i| Event {
                time_ns: i,
                kind: EventKind::Alloc {
                    place: Place::default(),
                    addr: 0x10_0000 + i * 512,
                    size: 512,
                },
            })
            .collect();
        m.apply_all(key, events.iter());
        let view = m.view(0, &ViewOptions::default()).processes.remove(0);
        let e = ProcessEntry {
            identity: Identity::of_pid(1),
            source: Source::unattached(Mode::Exact),
            view,
            advice: None,
        };
        let mut term = Terminal::new(TestBackend::new(72, 30)).unwrap();
        let theme = Theme::new(false, false);
        term.draw(|f| render(f, f.area(), &e, Scroll::default(), &theme))
            .unwrap();
        let text: String = term
            .backend()
            .buffer()
            .content()
            .iter()
            .map(|c| c.symbol())
            .collect();
        assert!(
            text.contains("dropped: 15 orphan blocks (bound 10)"),
            "{text}"
        );
    }
}
