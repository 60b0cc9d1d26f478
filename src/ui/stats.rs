//! A statistics table in the spirit of `torch.cuda.memory_summary()`: per
//! device, current and peak of allocated, active, requested, reserved and
//! inactive-split memory, then segments, blocks, retries and OOMs.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::format;
use super::theme::Theme;
use crate::collect::ProcessEntry;
use crate::model::view::FigureSource;
use crate::model::Mode;

/// The summary of `e`; `scroll` rows skipped when it does not fit (on a
/// small terminal, where it is a tab of its own).
pub fn render(frame: &mut Frame, area: Rect, e: &ProcessEntry, scroll: usize, t: &Theme) {
    let g = t.glyphs();
    let a = g.absent;
    let block = t.block(Span::styled(" Memory summary ", t.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let f = &e.view.figures;
    let b = |v: u64| format::bytes(v);
    let ob = |v: Option<u64>| format::opt(v, a, format::bytes);
    let row = |name: &str, cur: String, peak: String| {
        Row::new(vec![
            Cell::from(format!(" {name}")),
            Cell::from(Line::from(cur).right_aligned()),
            Cell::from(Line::from(peak).right_aligned()),
        ])
    };
    let section = |name: String| Row::new(vec![Cell::from(Span::styled(name, t.header()))]);
    let mut rows = vec![
        section("Process".into()),
        row("NVML used", ob(f.nvml_used), ob(f.nvml_peak)),
        row(
            "Non-PyTorch (NVML-resv)",
            format::opt(f.non_pytorch, a, format::bytes_i64),
            a.to_string(),
        ),
    ];
    if e.view.mode == Mode::NvmlOnly {
        rows.push(Row::new(vec![Cell::from(Span::styled(
            " no allocator figures: no vramscope agent in this process",
            t.dim(),
        ))]));
    }
    for d in &e.view.devices {
        let df = &d.figures;
        let src = match df.source {
            FigureSource::Stats => "stats",
            FigureSource::BlockMap => "block map",
        };
        rows.push(section(format!("cuda:{} · {src}", df.device)));
        rows.push(row(
            "Allocated memory",
            b(df.allocated),
            b(df.peak_allocated),
        ));
        rows.push(row("Active memory", b(df.active), b(df.peak_active)));
        rows.push(row("Requested memory", ob(df.requested), a.to_string()));
        rows.push(row(
            "GPU reserved memory",
            b(df.reserved),
            b(df.peak_reserved),
        ));
        rows.push(row(
            "Inactive split",
            b(df.fragmentation.inactive_split),
            a.to_string(),
        ));
        rows.push(row(
            "Segments",
            df.stats
                .map(|s| s.segments)
                .unwrap_or(df.segments)
                .to_string(),
            a.to_string(),
        ));
        rows.push(row("Blocks (map)", df.blocks.to_string(), a.to_string()));
        rows.push(row(
            "Free blocks (map)",
            df.fragmentation.free_blocks.to_string(),
            a.to_string(),
        ));
        rows.push(row(
            "Alloc retries",
            format::opt(df.stats.map(|s| s.alloc_retries), a, |v| v.to_string()),
            a.to_string(),
        ));
        rows.push(row(
            "OOMs",
            format::opt(df.stats.map(|s| s.ooms), a, |v| v.to_string()),
            a.to_string(),
        ));
    }
    if inner.height == 0 {
        return;
    }
    let header = Row::new(vec![
        Cell::from(" Metric"),
        Cell::from(Line::from("Current").right_aligned()),
        Cell::from(Line::from("Peak").right_aligned()),
    ])
    .style(t.header());
    let skip = if rows.len() + 1 > inner.height as usize {
        scroll.min(rows.len().saturating_sub(1))
    } else {
        0
    };
    let rows: Vec<Row> = rows.into_iter().skip(skip).collect();
    let table = Table::new(
        rows,
        [
            Constraint::Min(20),
            Constraint::Length(11),
            Constraint::Length(11),
        ],
    )
    .header(header)
    .column_spacing(1);
    frame.render_widget(table, inner);
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
