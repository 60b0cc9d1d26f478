//! The header and the footer, one line each (the caption band is
//! `caption.rs`); the footer's line ([`render_line`]) is every screen's.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::app::{App, Screen};
use super::keys::{self, Context};
use super::rows::display_name;
use super::state::Overlay;
use super::theme::Theme;
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
