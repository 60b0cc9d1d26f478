//! The header, the demo caption and the footer (one line each); the
//! footer's line ([`render_line`]) is every screen's.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, Screen};
use super::keys::{self, Context};
use super::rows::display_name;
use super::state::Overlay;
use super::theme::Theme;
use unicode_width::UnicodeWidthStr;
use vramscope_collect::demo::DemoStatus;
use vramscope_text::format;

/// `vramscope · 3 processes · 2 GPUs › pid 42 train.py          live`
pub(crate) fn render_header(frame: &mut Frame, area: Rect, app: &App) {
    let t = &app.config.theme;
    let g = t.glyphs();
    let snap = &app.snap;
    let mut left = vec![
        Span::styled(" vramscope ", t.title()),
        Span::styled(g.dot, t.dim()),
        Span::raw(format!(
            " {} process{} ",
            snap.processes.len(),
            if snap.processes.len() == 1 { "" } else { "es" }
        )),
        Span::styled(g.dot, t.dim()),
    ];
    if snap.machine.nvml_error.is_some() {
        left.push(Span::styled(" no NVML", t.warn()));
    } else {
        left.push(Span::raw(format!(
            " {} GPU{}",
            snap.machine.gpus.len(),
            if snap.machine.gpus.len() == 1 {
                ""
            } else {
                "s"
            }
        )));
    }
    // Segments not shown (refused, unverifiable, stale): on every screen;
    // the overview says which and why.
    if !snap.problems.is_empty() {
        let segments = snap.problems.iter().filter(|p| !p.is_directory()).count();
        let text = if segments < snap.problems.len() {
            "segment directory unreadable".to_string()
        } else {
            format!("{segments} segment(s) not shown")
        };
        left.push(Span::styled(format!(" {} ", g.dot), t.dim()));
        left.push(Span::styled(text, t.warn()));
    }
    if app.screen == Screen::Process {
        if let Some(e) = app.selected_entry() {
            left.push(Span::styled(" > ", t.dim()));
            left.push(Span::styled(
                format!("pid {} {}", e.identity.host_pid, display_name(e)),
                t.header(),
            ));
        }
    }
    let mut right = Vec::new();
    if app.config.readonly {
        right.push(Span::styled("read-only ", t.dim()));
    }
    if app.paused {
        right.push(Span::styled(" PAUSED ", t.paused()));
    } else {
        right.push(Span::styled(app.age_label(), t.dim()));
    }
    right.push(Span::raw(" "));
    let rw: usize = right.iter().map(|s| s.width()).sum();
    // The left part gives way to the right (a long file name ran into
    // "read-only": issue 30, item 4), cut with an ellipsis and a space.
    let room = (area.width as usize).saturating_sub(rw + 1);
    let mut left = crate::fit::fit_line(Line::from(left), room, g.ellipsis).spans;
    let lw: usize = left.iter().map(|s| s.width()).sum();
    let pad = (area.width as usize).saturating_sub(lw + rw);
    left.push(Span::raw(" ".repeat(pad)));
    left.extend(right);
    frame.render_widget(Paragraph::new(Line::from(left)), area);
}

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
        spans.push(Span::styled(" SIM PAUSED ", t.paused()));
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

/// The dashboard's footer: its screen's key hints, the filter being
/// typed, or the last message.
pub(crate) fn render_footer(frame: &mut Frame, area: Rect, app: &App) {
    let screen = match app.screen {
        Screen::Overview => Context::Overview,
        Screen::Process => Context::Process,
    };
    let contexts: Vec<Context> = match app.overlay {
        // An overlay that takes the keys names its own (issue 46, item 15:
        // By module's footer named the process view's).
        Some(Overlay::Modules(_)) => vec![Context::Modules],
        Some(Overlay::StepDiff(_)) => vec![Context::StepDiff],
        _ => [Some(screen), Some(Context::Global), app.playing()]
            .into_iter()
            .flatten()
            .collect(),
    };
    let hints = keys::footer(
        &contexts,
        app.config.readonly,
        app.demo.as_ref().is_some_and(|d| !d.replay),
    );
    let label = match app.screen {
        Screen::Overview => " filter: ",
        Screen::Process => " search events: ",
    };
    let footer = Footer {
        hints,
        prompt: app.typing().then(|| (label, app.filter())),
        message: app.message.as_deref(),
    };
    render_line(frame, area, &footer, &app.config.theme);
}

/// What a footer shows.
pub(crate) struct Footer<'a> {
    /// The screen's key hints ([`keys::footer`]).
    pub(crate) hints: Vec<keys::Hint>,
    /// A filter being typed: its label (` filter: `) and the text so far.
    pub(crate) prompt: Option<(&'a str, &'a str)>,
    /// One line for the person (errors, what a key did).
    pub(crate) message: Option<&'a str>,
}

/// Key hints, the filter being typed, or the message; `? help` and `q
/// quit` always at the right end (except while typing). Every screen's
/// footer.
pub(crate) fn render_line(frame: &mut Frame, area: Rect, footer: &Footer, t: &Theme) {
    let width = area.width as usize;
    let hint_w = |h: &keys::Hint| h.key.chars().count() + h.text.chars().count() + 3;
    let hint_spans = |h: &keys::Hint| {
        [
            Span::styled(h.key, t.key()),
            Span::raw(format!(" {}  ", h.text)),
        ]
    };
    let (pinned, rest): (Vec<_>, Vec<_>) = footer.hints.iter().partition(|h| h.pinned);
    let mut right: Vec<Span> = Vec::new();
    let mut right_w = 0;
    if footer.prompt.is_none() {
        for h in &pinned {
            right_w += hint_w(h);
            right.extend(hint_spans(h));
        }
    }
    let room = width.saturating_sub(right_w + 1);
    let mut left = vec![Span::raw(" ")];
    if let Some((label, text)) = footer.prompt {
        let hints = keys::footer(&[Context::Filter], false, false)
            .iter()
            .map(|h| format!("{} {}", h.key, h.text))
            .collect::<Vec<_>>()
            .join(" · ");
        left = vec![
            Span::styled(label, t.key()),
            Span::raw(text.to_string()),
            Span::styled("_", t.key()),
            Span::styled(format!("   {hints}"), t.dim()),
        ];
    } else if let Some(m) = footer.message {
        left.push(Span::styled(
            format::fit_words(m, room.saturating_sub(1), t.glyphs().ellipsis),
            t.warn(),
        ));
    } else {
        let mut used = 0;
        for h in &rest {
            if used + hint_w(h) > room {
                break;
            }
            used += hint_w(h);
            left.extend(hint_spans(h));
        }
    }
    let lw: usize = left.iter().map(|s| s.width()).sum();
    left.push(Span::raw(" ".repeat(width.saturating_sub(lw + right_w))));
    left.extend(right);
    frame.render_widget(Paragraph::new(Line::from(left)), area);
}
