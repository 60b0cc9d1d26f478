//! The help overlay: every key of [`super::keys::KEYS`] that has a help
//! line, by section, the mouse, a note, and on its bottom border that an
//! absent figure is a dash. The dashboard's
//! ([`render`]: its sections, the read-only note) and the fleet view's
//! ([`render_fleet`]) are one overlay ([`render_page`]).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;
use unicode_width::UnicodeWidthStr;

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
    /// The note under the keys.
    pub(crate) note: Line<'static>,
}

/// The dashboard's sections, with `playing`'s keys when given (a snapshot
/// file's trace, a recording played back).
fn sections(playing: Option<keys::Context>) -> Vec<keys::Context> {
    let mut sections = keys::HELP_SECTIONS.to_vec();
    sections.extend(playing);
    sections
}

/// The dashboard's page over `area` (with `playing`'s keys): the lines of
/// its longer column and the lines shown at once, where its scrolling
/// stops.
pub(crate) fn extent(area: Rect, playing: Option<keys::Context>) -> (usize, usize) {
    let g = geometry(area, &rows(&sections(playing), keys::MOUSE), 0);
    (g.per_col, g.shown)
}

/// The fleet view's page over `area`, as [`extent`].
pub(crate) fn fleet_extent(area: Rect) -> (usize, usize) {
    let g = geometry(area, &rows(&keys::FLEET_HELP_SECTIONS, &[]), 0);
    (g.per_col, g.shown)
}

/// Lines under the keys: the note (the other is on the bottom border).
const FOOTER_LINES: usize = 1;

/// The widest gap between two columns.
const GAP: usize = 2;

/// The most columns side by side.
const MAX_COLUMNS: usize = 3;

/// A page's line: (keys, what they do, is a process action); a section's
/// title has nothing in the middle.
type Row = (&'static str, &'static str, bool);

/// Where a page's lines go over `area`.
struct Geometry {
    /// Each column's first line and width (its widest line, and but for
    /// the last the gap after it).
    columns: Vec<(usize, u16)>,
    /// The lines of the longest column.
    per_col: usize,
    /// The popup.
    popup: Rect,
    /// It is too short for them: they scroll.
    scrolls: bool,
    /// Lines of the keys shown at once.
    shown: usize,
}

/// The key column (its leading space apart).
const KEY_W: usize = 12;

/// A page line's width: ` keys` in the key column, then what they do (a
/// section's title alone).
fn row_width((k, d, _): &Row) -> usize {
    if d.is_empty() {
        k.width()
    } else {
        1 + KEY_W.max(k.width()) + d.width()
    }
}

/// As many columns side by side as the terminal is wide enough for (at
/// most [`MAX_COLUMNS`], a space between two at least), each as wide as its
/// widest line: no line is cut, and a wide terminal uses its width (issue
/// 46, item 13: 80 columns at any width cut "bytes by module, phase & r").
/// `note`: the width of the note under the keys.
fn geometry(area: Rect, rows: &[Row], note: usize) -> Geometry {
    let inner = (area.width as usize).saturating_sub(2);
    let widest = |rows: &[Row]| rows.iter().map(row_width).max().unwrap_or(0);
    let layout = |n: usize| {
        let starts = starts(rows, n);
        let ends = starts.iter().skip(1).copied().chain([rows.len()]);
        let widths: Vec<usize> = (starts.iter().zip(ends))
            .map(|(&a, b)| widest(&rows[a..b]))
            .collect();
        (starts, widths)
    };
    let fits = |w: &[usize]| w.iter().sum::<usize>() + w.len() - 1 <= inner;
    let (starts, widths) = (2..=MAX_COLUMNS)
        .rev()
        .map(layout)
        .find(|(_, w)| fits(w))
        .unwrap_or_else(|| layout(1));
    let (n, used) = (widths.len(), widths.iter().sum::<usize>());
    let gap = match n {
        1 => 0,
        n => ((inner - used) / (n - 1)).min(GAP),
    };
    let ends = starts.iter().skip(1).copied().chain([rows.len()]);
    let per_col = (starts.iter().zip(ends))
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or(0);
    let content = used + gap * (n - 1);
    let mut w = (content.max(note) + 2).min(area.width as usize) as u16;
    // A column or two left at the sides would show only the borders under
    // it, beside the popup's own: it takes them.
    if w + 2 >= area.width {
        w = area.width;
    }
    let wanted = (per_col + FOOTER_LINES + 2) as u16;
    let h = wanted.min(area.height);
    Geometry {
        columns: (starts.into_iter().zip(widths).enumerate())
            .map(|(i, (s, w))| (s, (w + if i + 1 < n { gap } else { 0 }) as u16))
            .collect(),
        per_col,
        popup: super::layout::centered(area, w, h),
        scrolls: wanted > area.height,
        shown: (h as usize).saturating_sub(2 + FOOTER_LINES),
    }
}

/// The first line of each of `n` columns: every `rows.len() / n` lines
/// (rounded up), but a section's title keeps at least two of its lines
/// under it at a column's foot: with fewer it goes over to the next column
/// with them (issue 46, item 13: "Process view" ended the left column with
/// one line at 80x24).
fn starts(rows: &[Row], n: usize) -> Vec<usize> {
    let per = rows.len().div_ceil(n.max(1));
    let mut starts = vec![0];
    for _ in 1..n {
        let from = starts[starts.len() - 1];
        let end = from + per;
        if end >= rows.len() {
            break;
        }
        let title = (from..end).rev().find(|&i| rows[i].1.is_empty());
        starts.push(match title {
            Some(t) if t > from && end - t < 3 => t,
            _ => end,
        });
    }
    starts
}

/// A page's lines: each section's title, then its (keys, what, is a
/// process action); the mouse last.
fn rows(sections: &[keys::Context], mouse: &[(&'static str, &'static str)]) -> Vec<Row> {
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
/// `playing` adds the keys of a snapshot file's trace or of a recording
/// played back; scrolled (where the terminal is too small for it).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    (readonly, playing): (bool, Option<keys::Context>),
    scroll: Scroll,
    t: &Theme,
) {
    let sections = sections(playing);
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
        note,
    };
    render_page(frame, area, &page, scroll, t);
}

/// The fleet view's overlay.
pub(crate) fn render_fleet(frame: &mut Frame, area: Rect, scroll: Scroll, t: &Theme) {
    let page = Page {
        sections: &keys::FLEET_HELP_SECTIONS,
        mouse: &[],
        readonly: false,
        note: Line::styled(
            " Figures are Prometheus's, asked every --refresh; nothing is sent.",
            t.dim(),
        ),
    };
    render_page(frame, area, &page, scroll, t);
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
                // "(off)" in the key column: the line is no wider.
                Line::from(vec![
                    Span::styled(format!(" {:<KEY_W$}", format!("{k} (off)")), t.dim()),
                    Span::styled(d.to_string(), t.dim()),
                ])
            } else {
                Line::from(vec![
                    Span::styled(format!(" {k:<KEY_W$}"), t.key()),
                    Span::raw(d.to_string()),
                ])
            }
        })
        .collect();
    let g = geometry(area, &rows, page.note.width());
    frame.render_widget(Clear, g.popup);
    let title = if g.scrolls {
        " Keys · j/k scroll "
    } else {
        " Keys "
    };
    // The second note on the bottom border: at 80x24 the keys need every
    // line inside (issue 46, item 13).
    let block = t
        .block(Span::styled(title, t.title()))
        .title_bottom(Line::styled(
            " Absent figures show as a dash, never as 0. ",
            t.dim(),
        ));
    let inner = block.inner(g.popup);
    frame.render_widget(block, g.popup);
    let [body, foot] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(FOOTER_LINES as u16)])
            .areas(inner);
    let scroll = scroll.fit(g.per_col, body.height as usize).offset() as u16;
    let areas =
        Layout::horizontal(g.columns.iter().map(|(_, w)| Constraint::Length(*w))).split(body);
    let ends = g
        .columns
        .iter()
        .skip(1)
        .map(|(s, _)| *s)
        .chain([items.len()]);
    for (((start, _), end), area) in g.columns.iter().zip(ends).zip(areas.iter()) {
        let lines = items[*start..end].to_vec();
        frame.render_widget(Paragraph::new(lines).scroll((scroll, 0)), *area);
    }
    frame.render_widget(Paragraph::new(page.note.clone()), foot);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page fits in two columns side by side, a space between them,
    /// inside an 80-column box (a dashboard key's line is at most 38 wide,
    /// wherever the columns split), and in three inside a 120-column one: no
    /// line is cut at 80 columns, and a wide terminal takes the keys in
    /// fewer lines (issue 46, item 13).
    #[test]
    fn two_columns_fit_80_columns_and_three_120() {
        for r in rows(&sections(Some(keys::Context::Trace)), keys::MOUSE) {
            assert!(row_width(&r) <= 38, "{r:?} is {} wide", row_width(&r));
        }
        let pages = [
            rows(&sections(None), keys::MOUSE),
            rows(&sections(Some(keys::Context::Trace)), keys::MOUSE),
            rows(&keys::FLEET_HELP_SECTIONS, &[]),
        ];
        for rows in &pages {
            for (w, n) in [(80, 2), (100, 2), (120, 3), (200, 3)] {
                let g = geometry(Rect::new(0, 0, w, 200), rows, 0);
                assert_eq!(g.columns.len(), n, "{w}: {:?}", g.columns);
                assert!(g.popup.width <= w, "{:?}", g.popup);
                assert_eq!(g.per_col, g.shown, "{w}: nothing scrolls");
            }
        }
    }

    /// A section's title keeps two of its lines under it at the foot of a
    /// column, or goes over to the next one.
    #[test]
    fn a_title_never_ends_a_column_with_fewer_than_two_lines() {
        let rows = |titles: &str| -> Vec<Row> {
            (titles.chars())
                .map(|c| match c {
                    'T' => ("Title", "", false),
                    _ => ("k", "what", false),
                })
                .collect()
        };
        // At the middle: a title with its lines on either side.
        assert_eq!(starts(&rows("TkkkTkkk"), 2), [0, 4]);
        // The middle would leave the second title one line (TkkTk|kkkk):
        // it goes over.
        assert_eq!(starts(&rows("TkkTkkkkk"), 2), [0, 3]);
        // Two lines are enough (TkTkk|kkkk).
        assert_eq!(starts(&rows("TkTkkkkkk"), 2), [0, 5]);
        // The first title stays, whatever follows it.
        assert_eq!(starts(&rows("Tkkkk"), 2), [0, 3]);
        // Three columns: Tkk|Tkk|kkk, a title at the top of the second.
        assert_eq!(starts(&rows("TkkTkkkkk"), 3), [0, 3, 6]);
        // Tkk|kTk|kkk would leave the title one line: Tkk|k|Tkkkk.
        assert_eq!(starts(&rows("TkkkTkkkk"), 3), [0, 3, 4]);
        // Fewer lines than columns: no empty column.
        assert_eq!(starts(&rows("Tk"), 3), [0, 1]);
    }
}
