//! The help overlay: every key of [`super::keys::KEYS`] that has a help
//! line, by section, the mouse, and two lines of notes. The dashboard's
//! ([`render`]: its sections, the read-only note) and the fleet view's
//! ([`render_fleet`]) are one overlay ([`render_page`]).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;

use super::keys;
use super::scroll::Scroll;
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

/// The dashboard's sections (`trace`: with a snapshot file's keys).
fn sections(trace: bool) -> Vec<keys::Context> {
    let mut sections = keys::HELP_SECTIONS.to_vec();
    sections.extend(trace.then_some(keys::Context::Trace));
    sections
}

/// The dashboard's page over `area` (`trace`: with a snapshot file's
/// keys): the lines of its longer column and the lines shown at once,
/// where its scrolling stops.
pub(crate) fn extent(area: Rect, trace: bool) -> (usize, usize) {
    let g = geometry(area, &rows(&sections(trace), keys::MOUSE));
    (g.per_col, g.shown)
}

/// The fleet view's page over `area`, as [`extent`].
pub(crate) fn fleet_extent(area: Rect) -> (usize, usize) {
    let g = geometry(area, &rows(&keys::FLEET_HELP_SECTIONS, &[]));
    (g.per_col, g.shown)
}

/// Lines under the keys: the notes.
const FOOTER_LINES: usize = 2;

/// Where a page's lines go over `area`.
struct Geometry {
    /// Two columns (a wide terminal).
    two: bool,
    /// The first line of the right column.
    split: usize,
    /// The lines of the longer column (of all, in one column).
    per_col: usize,
    /// The popup.
    popup: Rect,
    /// It is too short for them: they scroll.
    scrolls: bool,
    /// Lines of the keys shown at once.
    shown: usize,
}

/// Two columns where the terminal is wide enough, split at the middle, but
/// a section's title never ends the left one: it goes over with its lines.
fn geometry(area: Rect, rows: &[(&str, &str, bool)]) -> Geometry {
    let two = area.width >= 78;
    let mut split = rows.len().div_ceil(2);
    if rows[..split].last().is_some_and(|(_, d, _)| d.is_empty()) {
        split -= 1;
    }
    let per_col = if two {
        split.max(rows.len() - split)
    } else {
        rows.len()
    };
    let w = if two { 80 } else { 44 }.min(area.width);
    let wanted = (per_col + FOOTER_LINES + 2) as u16;
    let h = wanted.min(area.height);
    Geometry {
        two,
        split,
        per_col,
        popup: super::layout::centered(area, w, h),
        scrolls: wanted > area.height,
        shown: (h as usize).saturating_sub(2 + FOOTER_LINES),
    }
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

/// The dashboard's overlay; `readonly` marks the process actions as off;
/// `trace` adds the keys of a snapshot file's trace; scrolled (where the
/// terminal is too small for it).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    (readonly, trace): (bool, bool),
    scroll: Scroll,
    t: &Theme,
) {
    let sections = sections(trace);
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
pub(crate) fn render_fleet(frame: &mut Frame, area: Rect, scroll: Scroll, t: &Theme) {
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

/// The overlay of `page`, centred in `area`, scrolled where it does not fit
/// (issue 30, item 12: at 40×10 the end could not be reached).
pub(crate) fn render_page(frame: &mut Frame, area: Rect, page: &Page, scroll: Scroll, t: &Theme) {
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
    let g = geometry(area, &rows);
    frame.render_widget(Clear, g.popup);
    let title = if g.scrolls {
        " Keys · j/k scroll "
    } else {
        " Keys "
    };
    let block = t.block(Span::styled(title, t.title()));
    let inner = block.inner(g.popup);
    frame.render_widget(block, g.popup);
    let [body, foot] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(FOOTER_LINES as u16)])
            .areas(inner);
    let scroll = scroll.fit(g.per_col, body.height as usize).offset() as u16;
    if g.two {
        let [l, r] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
            .areas(body);
        let (a, b) = items.split_at(g.split);
        frame.render_widget(Paragraph::new(a.to_vec()).scroll((scroll, 0)), l);
        frame.render_widget(Paragraph::new(b.to_vec()).scroll((scroll, 0)), r);
    } else {
        frame.render_widget(Paragraph::new(items).scroll((scroll, 0)), body);
    }
    frame.render_widget(Paragraph::new(page.notes.to_vec()), foot);
}
