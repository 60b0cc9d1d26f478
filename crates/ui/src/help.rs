//! The help overlay: every key of [`super::keys::KEYS`] that has a help
//! line, by section, the mouse, and two lines of notes. The dashboard's
//! ([`render`]: its sections, the read-only note) and the fleet view's
//! ([`render_fleet`]) are one overlay ([`render_page`]).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;

use super::keys;
use super::theme::Theme;

/// What one screen's overlay lists.
pub(crate) struct Page<'a> {
    /// The key table's sections, in order.
    pub(crate) sections: &'a [keys::Context],
    /// The mouse's lines (none: no Mouse section).
    pub(crate) mouse: &'static [(&'static str, &'static str)],
    /// The process actions are off (shown dimmed, "(off)").
    pub(crate) readonly: bool,
    /// The notes under the keys.
    pub(crate) notes: [Line<'static>; 2],
}

/// The dashboard's overlay; `readonly` marks the process actions as off;
/// `trace` adds the keys of a snapshot file's trace.
/// The lines of the dashboard's page (`trace`: with a snapshot file's
/// keys), where its scrolling stops.
pub(crate) fn lines(trace: bool) -> usize {
    let mut sections = keys::HELP_SECTIONS.to_vec();
    sections.extend(trace.then_some(keys::Context::Trace));
    rows(&sections, keys::MOUSE).len()
}

/// The lines of the fleet view's page.
pub(crate) fn fleet_lines() -> usize {
    rows(&keys::FLEET_HELP_SECTIONS, &[]).len()
}

/// A page's lines: each section's title, then its (keys, what, is a
/// process action); the mouse last.
fn rows(
    sections: &[keys::Context],
    mouse: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str, bool)> {
    let mut rows = Vec::new();
    for section in sections {
        rows.push((section.title(), "", false));
        rows.extend(keys::help(*section));
    }
    if !mouse.is_empty() {
        rows.push(("Mouse", "", false));
        rows.extend(mouse.iter().map(|(k, d)| (*k, *d, false)));
    }
    rows
}

/// The dashboard's overlay, scrolled `scroll` lines (where the terminal is
/// too small for it).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    (readonly, trace): (bool, bool),
    scroll: usize,
    t: &Theme,
) {
    let mut sections = keys::HELP_SECTIONS.to_vec();
    sections.extend(trace.then_some(keys::Context::Trace));
    let note = if readonly {
        Line::styled(
            " Read-only: e, r, s and C do nothing; nothing is sent anywhere.",
            t.warn(),
        )
    } else {
        Line::styled(
            " e, r, s and C act on the selected process through its agent.",
            t.dim(),
        )
    };
    let page = Page {
        sections: &sections,
        mouse: keys::MOUSE,
        readonly,
        notes: [note, absent(t)],
    };
    render_page(frame, area, &page, scroll, t);
}

/// The fleet view's overlay.
pub(crate) fn render_fleet(frame: &mut Frame, area: Rect, scroll: usize, t: &Theme) {
    let page = Page {
        sections: &keys::FLEET_HELP_SECTIONS,
        mouse: &[],
        readonly: false,
        notes: [
            Line::styled(
                " Figures are Prometheus's, asked every --refresh; nothing is sent.",
                t.dim(),
            ),
            absent(t),
        ],
    };
    render_page(frame, area, &page, scroll, t);
}

fn absent(t: &Theme) -> Line<'static> {
    Line::styled(" Absent figures show as a dash, never as 0.", t.dim())
}

/// The overlay of `page`, centred in `area`, from line `scroll` on where it
/// does not fit (issue 30, item 12: at 40×10 the end could not be reached).
pub(crate) fn render_page(frame: &mut Frame, area: Rect, page: &Page, scroll: usize, t: &Theme) {
    let ro = page.readonly;
    let rows = rows(page.sections, page.mouse);
    let items: Vec<Line> = rows
        .iter()
        .map(|(k, d, action)| {
            if d.is_empty() {
                Line::styled(k.to_string(), t.header())
            } else if ro && *action {
                Line::from(vec![
                    Span::styled(format!(" {k:<12}"), t.dim()),
                    Span::styled(format!("{d} (off)"), t.dim()),
                ])
            } else {
                Line::from(vec![
                    Span::styled(format!(" {k:<12}"), t.key()),
                    Span::raw(d.to_string()),
                ])
            }
        })
        .collect();
    let two = area.width >= 78;
    // Two columns split at the middle, but a section's title never ends
    // the left one: it goes over with its lines.
    let mut split = items.len().div_ceil(2);
    if rows[..split].last().is_some_and(|(_, d, _)| d.is_empty()) {
        split -= 1;
    }
    let per_col = if two {
        split.max(items.len() - split)
    } else {
        items.len()
    };
    let w = if two { 80 } else { 44 }.min(area.width);
    let footer_lines = 2;
    let h = ((per_col + footer_lines + 2) as u16).min(area.height);
    let popup = super::layout::centered(area, w, h);
    frame.render_widget(Clear, popup);
    let fits = (per_col + footer_lines + 2) as u16 <= area.height;
    let title = if fits {
        " Keys "
    } else {
        " Keys · j/k scroll "
    };
    let block = t.block(Span::styled(title, t.title()));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    let [body, foot] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(footer_lines as u16)])
            .areas(inner);
    let scroll = scroll.min(per_col.saturating_sub(body.height as usize)) as u16;
    if two {
        let [l, r] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
            .areas(body);
        let (a, b) = items.split_at(split);
        frame.render_widget(Paragraph::new(a.to_vec()).scroll((scroll, 0)), l);
        frame.render_widget(Paragraph::new(b.to_vec()).scroll((scroll, 0)), r);
    } else {
        frame.render_widget(Paragraph::new(items).scroll((scroll, 0)), body);
    }
    frame.render_widget(Paragraph::new(page.notes.to_vec()), foot);
}
