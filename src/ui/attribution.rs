//! The "By module" overlay (`M` in the process view): who holds the
//! selected process's live memory — bytes by phase on one line, then a table
//! of module paths, sortable by bytes, name or blocks (`o`, `O` reverses);
//! Enter shows only the blocks of the module under the cursor in the block
//! map.
//! It only renders [`Attribution`] from the model.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Clear, Paragraph, Row, Table};
use ratatui::Frame;

use super::theme::Theme;
use crate::model::attrib::{natural_cmp, Attribution, ModuleBytes};
use crate::text::format;

/// What the table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortBy {
    #[default]
    Bytes,
    Module,
    Blocks,
}

impl SortBy {
    fn next(self) -> SortBy {
        match self {
            SortBy::Bytes => SortBy::Module,
            SortBy::Module => SortBy::Blocks,
            SortBy::Blocks => SortBy::Bytes,
        }
    }
    fn name(self) -> &'static str {
        match self {
            SortBy::Bytes => "bytes",
            SortBy::Module => "module",
            SortBy::Blocks => "blocks",
        }
    }
}

/// The overlay's state: its order and scroll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModulesView {
    pub sort: SortBy,
    /// Smallest first (bytes, blocks) or Z first (module).
    pub reversed: bool,
    pub scroll: usize,
}

impl ModulesView {
    pub(crate) fn sort_next(&mut self) {
        self.sort = self.sort.next();
        self.reversed = false;
    }
    pub(crate) fn reverse(&mut self) {
        self.reversed = !self.reversed;
    }
    pub(crate) fn scroll_by(&mut self, down: bool, rows: usize) {
        self.scroll = if down {
            (self.scroll + 1).min(rows.saturating_sub(1))
        } else {
            self.scroll.saturating_sub(1)
        };
    }
}

/// The rows in the order `v` asks for.
pub(crate) fn sorted<'a>(a: &'a Attribution, v: &ModulesView) -> Vec<&'a ModuleBytes> {
    let mut rows: Vec<&ModuleBytes> = a.by_module.iter().collect();
    match v.sort {
        SortBy::Bytes => rows.sort_by(|x, y| {
            y.bytes
                .cmp(&x.bytes)
                .then(natural_cmp(&x.module, &y.module))
        }),
        SortBy::Module => rows.sort_by(|x, y| natural_cmp(&x.module, &y.module)),
        SortBy::Blocks => rows.sort_by(|x, y| {
            y.blocks
                .cmp(&x.blocks)
                .then(natural_cmp(&x.module, &y.module))
        }),
    }
    if v.reversed {
        rows.reverse();
    }
    rows
}

/// `letters`: the process's module letters (the block map's).
pub(crate) fn render(
    frame: &mut Frame,
    area: Rect,
    a: &Attribution,
    letters: Option<&super::letters::ModuleLetters>,
    v: &ModulesView,
    t: &Theme,
) {
    let g = t.glyphs();
    let w = 100.min(area.width);
    let h = (a.by_module.len() as u16).saturating_add(6).max(8);
    let popup = super::popup::centered(area, w, h);
    frame.render_widget(Clear, popup);
    let order = format!(
        " o sort: {}{} · O reverse · j/k move · Enter: map only this · Esc ",
        v.sort.name(),
        if v.reversed { " (reversed)" } else { "" }
    );
    let block = t
        .block(Span::styled(" By module ", t.title()))
        .title_bottom(Line::styled(order, t.dim()));
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    if inner.height < 3 {
        return;
    }
    let total: u64 = a.by_module.iter().map(|m| m.bytes).sum();
    let mut phases = vec![
        Span::styled(" live ", t.dim()),
        Span::raw(format::bytes(total)),
    ];
    for p in &a.by_phase {
        phases.push(Span::styled(format!(" {} ", g.dot), t.dim()));
        phases.push(Span::styled(format!("{} ", p.phase.name()), t.dim()));
        phases.push(Span::raw(format::bytes_short(p.bytes)));
    }
    if let Some(s) = a.step {
        phases.push(Span::styled(format!("   step {s}"), t.dim()));
    }
    let head = Rect { height: 1, ..inner };
    let width = inner.width as usize;
    frame.render_widget(
        Paragraph::new(format::fit_line(Line::from(phases), width, g.ellipsis)),
        head,
    );
    let body = Rect {
        y: inner.y + 2,
        height: inner.height - 2,
        ..inner
    };
    if !a.tagged() {
        frame.render_widget(
            Paragraph::new(vec![
                Line::styled(" No allocation of this process names its module.", t.warn()),
                Line::styled(
                    " Its producer does not tag allocator events with contexts (FORMAT 1.1).",
                    t.dim(),
                ),
            ]),
            body,
        );
        return;
    }
    let rows = sorted(a, v);
    let shown = body.height.saturating_sub(1).max(1) as usize;
    // `v.scroll` is the row under the cursor (Enter filters the block map
    // to it); the table scrolls to keep it in view.
    let cursor = v.scroll.min(rows.len().saturating_sub(1));
    let scroll = (cursor + 1).saturating_sub(shown);
    let module_w = width.saturating_sub(8 + 10 + 8 + 6 + 2).max(8);
    // The letter the block map (coloured by module) draws each module with.
    let keys = super::letters::keys(letters, a);
    let letter = |m: &str| {
        keys.iter()
            .position(|k| *k == m)
            .map_or("+", |i| super::blockmap::LETTERS[i])
    };
    let table_rows = rows
        .iter()
        .enumerate()
        .skip(scroll)
        .take(shown)
        .map(|(i, m)| {
            let name = match m.module.as_str() {
                "" => Line::styled("(no module)", t.dim()),
                path => format::fit_line(Line::raw(path.to_string()), module_w, g.ellipsis),
            };
            let share = if total > 0 {
                format::percent(m.bytes as f64 / total as f64)
            } else {
                g.absent.to_string()
            };
            Row::new(vec![
                Cell::from(letter(&m.module)),
                Cell::from(name),
                Cell::from(Line::from(format::bytes(m.bytes)).right_aligned()),
                Cell::from(Line::from(share).right_aligned()),
                Cell::from(Line::from(format::count(m.blocks)).right_aligned()),
            ])
            .style(if i == cursor {
                t.selected()
            } else {
                ratatui::style::Style::new()
            })
        });
    let header = Row::new(["", "MODULE", "BYTES", "SHARE", "BLOCKS"]).style(t.header());
    let table = Table::new(
        table_rows,
        [
            Constraint::Length(1),
            Constraint::Min(8),
            Constraint::Length(10),
            Constraint::Length(6),
            Constraint::Length(8),
        ],
    )
    .header(header);
    frame.render_widget(table, body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribution() -> Attribution {
        let m = |module: &str, bytes, blocks| ModuleBytes {
            module: module.into(),
            bytes,
            blocks,
        };
        Attribution {
            by_module: vec![m("b.mlp", 30, 1), m("a.attn", 20, 5), m("", 10, 2)],
            ..Attribution::default()
        }
    }

    #[test]
    fn sorts_by_bytes_name_or_blocks_and_reverses() {
        let a = attribution();
        let mut v = ModulesView::default();
        let names = |v: &ModulesView| -> Vec<String> {
            sorted(&a, v).iter().map(|m| m.module.clone()).collect()
        };
        assert_eq!(names(&v), ["b.mlp", "a.attn", ""]);
        v.sort_next();
        assert_eq!(names(&v), ["", "a.attn", "b.mlp"]);
        v.reverse();
        assert_eq!(names(&v), ["b.mlp", "a.attn", ""]);
        v.sort_next();
        assert_eq!(names(&v), ["a.attn", "", "b.mlp"]);
        v.sort_next();
        assert_eq!(v.sort, SortBy::Bytes);
    }
}
