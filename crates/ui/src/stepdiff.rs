//! The step diff overlay (`d` in the process view): what step k allocated
//! that is still alive now, in step k + n, grouped by module, phase, role, size
//! and code location (`model::stepdiff`). `+`/`-` move k back and forth
//! (n = 1 at first: the step before the current one), j/k scroll.

use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph};
use ratatui::Frame;

use super::blockmap::module_label;
use super::scroll::Scroll;
use super::theme::Theme;
use vramscope_core::model::stepdiff::{step_diff, DiffRow, StepDiff};
use vramscope_core::model::ProcessView;
use vramscope_text::format;

/// The overlay's state: how many steps back k is, and the rows shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepDiffView {
    /// k = the current step - `back` (at least 1).
    pub(crate) back: u64,
    /// The table's rows shown.
    pub scroll: Scroll,
}

impl Default for StepDiffView {
    fn default() -> Self {
        StepDiffView {
            back: 1,
            scroll: Scroll::default(),
        }
    }
}

impl StepDiffView {
    /// One step further back (`+`), never before step 0 of `now`.
    pub(crate) fn older(&mut self, now: Option<u64>) {
        self.back = (self.back + 1).min(now.unwrap_or(1).max(1));
        self.scroll = Scroll::default();
    }
    /// One step nearer (`-`), never the current step itself.
    pub(crate) fn newer(&mut self) {
        self.back = self.back.saturating_sub(1).max(1);
        self.scroll = Scroll::default();
    }
}

/// The popup over `area` for `rows` rows.
fn popup(area: Rect, rows: usize) -> Rect {
    let h = (rows as u16).saturating_mul(2).saturating_add(6).max(9);
    super::layout::over_body(area, 100.min(area.width), h)
}

/// Lines of the table's rows in the popup `popup` (under the total, the
/// line that says what the figures are, and the table's header).
fn table_lines(popup: Rect) -> usize {
    (popup.height as usize).saturating_sub(2 + 2 + 1)
}

/// How many of `rows`' last rows `lines` lines show whole (a row with its
/// code location takes two), at least one: the scrolling stops where they
/// are all shown.
fn last_page(rows: &[DiffRow], lines: usize) -> usize {
    let mut used = 0;
    let n = (rows.iter().rev())
        .take_while(|r| {
            used += 1 + usize::from(!r.stack.is_empty());
            used <= lines
        })
        .count();
    n.max(1)
}

/// The overlay's rows for `view` over `area`, and how many of the last
/// ones fit at once: where its scrolling stops.
pub(crate) fn extent(area: Rect, view: &ProcessView, v: &StepDiffView) -> (usize, usize) {
    let rows = match view.attribution.step {
        Some(now) if now >= v.back => step_diff(view, now - v.back).rows,
        _ => Vec::new(),
    };
    let lines = table_lines(popup(area, rows.len()));
    (rows.len(), last_page(&rows, lines))
}

pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    view: &ProcessView,
    v: &StepDiffView,
    t: &Theme,
) {
    let now = view.attribution.step;
    let born = now.and_then(|s| s.checked_sub(v.back));
    let diff = born.map(|k| step_diff(view, k));
    let rows = diff.as_ref().map_or(0, |d| d.rows.len());
    let popup = popup(area, rows);
    frame.render_widget(Clear, popup);
    let title = match (born, now) {
        (Some(k), Some(n)) => format!(
            " Step diff: born in step {k}, alive in step {n} (n={}) ",
            v.back
        ),
        _ => " Step diff ".to_string(),
    };
    let block = t.block(Span::styled(title, t.title()));
    let inner = block.inner(popup);
    let (lines, hint) = match (&diff, born) {
        (Some(d), Some(k)) => table(view, d, k, (v.scroll, popup, inner.width), t),
        _ => {
            let why = match now {
                None => " No step seen yet: the diff needs step boundaries (markers or optimizer steps).",
                Some(_) => " Step 0: no earlier step to compare.",
            };
            (vec![Line::styled(why, t.dim())], None)
        }
    };
    // Its keys are the footer's (issue 46, item 15).
    let block = match hint {
        Some(hint) => block.title_bottom(Line::from(vec![Span::raw(" "), hint])),
        None => block,
    };
    frame.render_widget(block, popup);
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The overlay's lines for `d`, born in step `k`, `width` wide, scrolled
/// to `scroll` in `popup`: the total, what the figures are, the table's
/// header and the rows shown (each with its code location under it where
/// a stack was captured); and which rows show, where not all do.
fn table(
    view: &ProcessView,
    d: &StepDiff,
    k: u64,
    (scroll, popup, width): (Scroll, Rect, u16),
    t: &Theme,
) -> (Vec<Line<'static>>, Option<Span<'static>>) {
    let g = t.glyphs();
    let width = width as usize;
    let head = if view.attribution.tagged() {
        Line::from(vec![
            Span::raw(format!(
                " {} in {} blocks",
                format::bytes(d.bytes),
                format::count(d.blocks)
            )),
            Span::styled(format!(" born in step {k} {} still alive", g.dot), t.dim()),
        ])
    } else {
        Line::styled(
            " This process's producer does not tag allocations with steps (FORMAT 1.1).",
            t.warn(),
        )
    };
    let mut lines = vec![crate::fit::fit_line(head, width, g.ellipsis)];
    if d.rows.is_empty() {
        return (lines, None);
    }
    // What the two figures are (issue 46, item 14: ASKED was one block's
    // size, HELD all the row's blocks).
    let what = Line::styled(
        " ASKED: blocks × the bytes each asked for · HELD: the bytes they hold in all",
        t.dim(),
    );
    lines.push(crate::fit::fit_line(what, width, g.ellipsis));
    let module_w = width
        .saturating_sub(1 + PHASE_W + ROLE_W + ASKED_W + HELD_W)
        .max(8);
    let row = |m: &str, phase: &str, role: &str, asked: &str, held: &str| {
        let m = crate::fit::fit_line(Line::raw(m.to_string()), module_w, g.ellipsis).to_string();
        format!(" {m:<module_w$}{phase:<PHASE_W$}{role:<ROLE_W$}{asked:>ASKED_W$}{held:>HELD_W$}")
    };
    lines.push(Line::styled(
        row("MODULE", "PHASE", "ROLE", "ASKED", "HELD"),
        t.header(),
    ));
    let lines_h = table_lines(popup);
    let shown = scroll.fit(d.rows.len(), last_page(&d.rows, lines_h));
    let mut used = 0;
    let mut drawn = 0;
    for r in d.rows.iter().skip(shown.offset()) {
        used += 1 + usize::from(!r.stack.is_empty());
        if used > lines_h && drawn > 0 {
            break;
        }
        let asked = format!("{} × {}", format::count(r.blocks), format::bytes(r.size));
        lines.push(Line::raw(row(
            module_label(&r.module),
            r.phase.name(),
            r.role.label(),
            &asked,
            &format::bytes(r.bytes),
        )));
        if !r.stack.is_empty() {
            let at = format!("   at {}", r.stack.join(" ← "));
            lines.push(crate::fit::fit_line(
                Line::styled(at, t.dim()),
                width,
                g.ellipsis,
            ));
        }
        drawn += 1;
    }
    // Which rows show, as every scrolled pane says it.
    let mut rows_shown = Scroll::new(d.rows.len(), drawn);
    rows_shown.to(shown.offset());
    (lines, rows_shown.hint("rows", t))
}

/// The table's columns after the module: its phase ("optimizer" and a
/// space), role ("optim state" and a space), what the blocks asked for
/// ("1,024 × 16.0 MiB") and what they hold.
const PHASE_W: usize = 10;
const ROLE_W: usize = 12;
const ASKED_W: usize = 16;
const HELD_W: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n_stays_between_one_and_the_current_step() {
        let mut v = StepDiffView::default();
        assert_eq!(v.back, 1);
        v.newer();
        assert_eq!(v.back, 1);
        v.older(Some(3));
        v.older(Some(3));
        v.older(Some(3));
        assert_eq!(v.back, 3);
        v.older(None);
        assert_eq!(v.back, 1);
    }
}
