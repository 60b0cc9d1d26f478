//! The caption band: where a demo, a recording played back or a file's
//! trace is, then what is happening, in words (one line, or two on a tall
//! terminal).

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;
use vramscope_collect::demo::DemoStatus;
use vramscope_text::format;

use super::theme::Theme;

/// A caption band's line: where the demo (or a file's trace) is, then
/// what is happening, in words.
pub(crate) struct Caption {
    /// `demo leak · 2x ████░░ 45% ·`
    pub(crate) status: Vec<Span<'static>>,
    pub(crate) text: String,
}

/// Terminals at least this tall give a caption that does not fit on one
/// line a second one (a smaller one keeps its lines for the panes).
const CAPTION_WRAP_ROWS: u16 = 30;

impl Caption {
    /// The lines it takes on a `size` terminal: a second one where it is
    /// too long for one and the terminal tall enough (issue 46, item 16:
    /// at 120x40 the demo's captions were cut).
    pub(crate) fn lines(&self, size: Rect) -> u16 {
        let status: usize = self.status.iter().map(Span::width).sum();
        let fits = status + 1 + self.text.width() <= size.width as usize;
        if fits || size.height < CAPTION_WRAP_ROWS {
            1
        } else {
            2
        }
    }

    /// The caption over `area`: the text after the status, going on to a
    /// second line where `area` has one; cut between words with an
    /// ellipsis where it still does not fit.
    pub(crate) fn render(self, frame: &mut Frame, area: Rect, t: &Theme) {
        let ellipsis = t.glyphs().ellipsis;
        let width = area.width as usize;
        let status: usize = self.status.iter().map(Span::width).sum();
        let room = width.saturating_sub(status + 1);
        let (head, rest) = if area.height >= 2 {
            // As much as fits, cut between words; the rest below.
            let head = format::fit_words(&self.text, room, "");
            let rest = self.text[head.len()..].trim_start().to_string();
            (head, rest)
        } else {
            (format::fit_words(&self.text, room, ellipsis), String::new())
        };
        let mut first = self.status;
        first.push(Span::raw(format!(" {head}")));
        let second = Line::raw(format!(
            " {}",
            format::fit_words(&rest, width.saturating_sub(1), ellipsis)
        ));
        frame.render_widget(Paragraph::new(vec![Line::from(first), second]), area);
    }
}

/// `demo leak · 2x ████░░ 45% · run 1 · caption`
pub(crate) fn demo_caption(d: &DemoStatus, t: &Theme) -> Caption {
    let g = t.glyphs();
    let bar_w = 10usize;
    let done = ((d.progress.clamp(0.0, 1.0) * bar_w as f64).round() as usize).min(bar_w);
    let what = if d.replay { "replay" } else { "demo" };
    let mut spans = vec![
        Span::styled(format!(" {what} {} ", d.scenario), t.header()),
        Span::styled(g.dot, t.dim()),
        Span::raw(format!(" {}x ", trim_speed(d.speed))),
        Span::styled(g.bar_full.repeat(done), t.bar()),
        Span::styled(g.bar_empty.repeat(bar_w - done), t.dim()),
        Span::raw(format!(" {:>3.0}% ", d.progress * 100.0)),
    ];
    if d.runs > 0 {
        spans.push(Span::styled(format!("run {} ", d.runs + 1), t.dim()));
    }
    if d.paused {
        let what = if d.replay { " PAUSED " } else { " SIM PAUSED " };
        spans.push(Span::styled(what, t.paused()));
        spans.push(Span::raw(" "));
    }
    spans.push(Span::styled(g.dot, t.dim()));
    Caption {
        status: spans,
        text: d.caption.clone(),
    }
}

fn trim_speed(s: f64) -> String {
    if (s - s.round()).abs() < 1e-9 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}
