//! A snapshot file's trace (`vramscope open FILE`): the caption band says
//! where the dashboard is in it (event N of M, and what that event was),
//! and the stack overlay (`t`) shows the stacks of that event and of the
//! block it names in the file's state.
//!
//! ```text
//!  file x.pickle · ████░░░░░░  42% · event 12 of 29 · alloc 2.0M at 0x7f.. · [ ] { } Home End
//! ```

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;

use super::caption::Caption;
use super::theme::Theme;
use vramscope_collect::trace::TraceStatus;

/// The caption band: the file, how far into its trace, the event.
pub(crate) fn caption(s: &TraceStatus, t: &Theme) -> Caption {
    let g = t.glyphs();
    let bar_w = 10usize;
    let share = if s.total == 0 {
        1.0
    } else {
        s.at as f64 / s.total as f64
    };
    let done = ((share * bar_w as f64).round() as usize).min(bar_w);
    let position = if s.at == s.total {
        format!(" the file's state, after {} events ", s.total)
    } else {
        format!(" event {} of {} ", s.at, s.total)
    };
    let status = vec![
        Span::styled(format!(" file {} ", s.file), t.header()),
        Span::styled(g.dot, t.dim()),
        Span::raw(" "),
        Span::styled(g.bar_full.repeat(done), t.bar()),
        Span::styled(g.bar_empty.repeat(bar_w - done), t.dim()),
        Span::styled(position, t.key()),
        Span::styled(g.dot, t.dim()),
    ];
    Caption {
        status,
        text: s.event.clone(),
    }
}

/// The stack overlay: each section's title, then its frames, innermost
/// first, as many as fit.
pub(crate) fn render_stacks(frame: &mut Frame, area: Rect, s: &TraceStatus, t: &Theme) {
    let mut lines: Vec<Line> = Vec::new();
    if s.stacks.is_empty() {
        lines.push(Line::styled(
            "No event yet: step forward with ] or }.",
            t.dim(),
        ));
    }
    for (title, frames) in &s.stacks {
        lines.push(Line::styled(title.clone(), t.header()));
        if frames.is_empty() {
            lines.push(Line::styled("  (no stack recorded in the file)", t.dim()));
        }
        lines.extend(frames.iter().map(|f| Line::raw(format!("  {f}"))));
    }
    lines.push(Line::styled("t or Esc closes", t.dim()));
    let w = area.width.saturating_sub(4).min(110);
    let h = (lines.len() as u16 + 2).min(area.height);
    let popup = super::layout::centered(area, w, h);
    frame.render_widget(Clear, popup);
    let block = t.block(Span::styled(" Stacks ", t.title()));
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
