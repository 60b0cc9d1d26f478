//! The "By module" overlay (`M` in the process view): who holds the
//! selected process's live memory — bytes by phase and by role on two
//! lines, then a table of module paths with each module's main role,
//! sortable by bytes, name or blocks (`o`, `O` reverses); `r` shows one
//! role's bytes per module (parameter, buffer, gradient, optimizer state,
//! activation, temporary, other), then the next, then all again; Enter
//! shows only the blocks of the module under the cursor in the block map.
//! It only renders [`Attribution`] from the model.

use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Clear, Paragraph, Row, Table};
use ratatui::Frame;

use super::scroll::{Move, Scroll};
use super::theme::Theme;
use vramscope_core::model::attrib::{natural_cmp, Attribution};
use vramscope_core::model::roles::Role;
use vramscope_text::format;

/// What the table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum SortBy {
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

/// The overlay's state: its order and the row under the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ModulesView {
    pub(crate) sort: SortBy,
    /// Smallest first (bytes, blocks) or Z first (module).
    pub(crate) reversed: bool,
    /// The row under the cursor (Enter filters the block map to it), as it
    /// was last placed.
    pub(crate) cursor: usize,
    /// The module under the cursor (a hash of its path), followed when the
    /// rows reorder live (issue 46, item 24: Enter took the module now at
    /// the cursor's row, not the one highlighted before).
    pub(crate) selected: Option<u64>,
    /// Only this role's bytes (None: all roles).
    pub(crate) role: Option<Role>,
}

/// The hash a selected module is followed by (a view is `Copy`).
fn module_hash(module: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    module.hash(&mut h);
    h.finish()
}

impl ModulesView {
    pub(crate) fn sort_next(&mut self) {
        self.sort = self.sort.next();
        self.reversed = false;
    }
    pub(crate) fn reverse(&mut self) {
        self.reversed = !self.reversed;
    }
    pub(crate) fn role_next(&mut self) {
        let all = Role::ALL;
        self.role = match self.role {
            None => Some(all[0]),
            Some(r) => all
                .iter()
                .position(|x| *x == r)
                .and_then(|i| all.get(i + 1).copied()),
        };
        self.cursor = 0;
        self.selected = None;
    }
    /// The row of `rows` under the cursor: the selected module's, wherever
    /// it is now; else the row the cursor was on.
    pub(crate) fn cursor_in(&self, rows: &[TableRow]) -> usize {
        let at = |h: u64| rows.iter().position(|r| module_hash(r.module) == h);
        (self.selected.and_then(at))
            .unwrap_or(self.cursor)
            .min(rows.len().saturating_sub(1))
    }
    /// The cursor moved by a scroll key, within `rows`, a table showing
    /// `shown` at once; it selects the module it lands on.
    pub(crate) fn go(&mut self, m: Move, rows: &[TableRow], shown: usize) {
        let from = self.cursor_in(rows);
        self.cursor = Scroll::new(rows.len(), shown).cursor_after(from, m);
        self.selected = rows.get(self.cursor).map(|r| module_hash(r.module));
    }
}

/// The popup over `area` for the modules of `a`.
fn popup(area: Rect, a: &Attribution) -> Rect {
    let h = (a.by_module.len() as u16).saturating_add(7).max(9);
    super::layout::over_body(area, 100.min(area.width), h)
}

/// Rows the table shows at once over `area` (under the two lines of
/// phases and roles, a gap and its header).
pub(crate) fn rows_shown(area: Rect, a: &Attribution) -> usize {
    (popup(area, a).height as usize)
        .saturating_sub(2 + 3 + 1)
        .max(1)
}

/// A row of the table: a module's bytes (in one role, or in all), and the
/// role that holds most of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableRow<'a> {
    pub(crate) module: &'a str,
    pub(crate) bytes: u64,
    pub(crate) blocks: u64,
    pub(crate) role: Option<Role>,
    /// Other roles the module's bytes are in (all roles shown).
    pub(crate) more_roles: usize,
}

/// The rows of `v`'s role (all: one per module), in the order `v` asks for.
pub(crate) fn sorted<'a>(a: &'a Attribution, v: &ModulesView) -> Vec<TableRow<'a>> {
    let mut rows: Vec<TableRow> = match v.role {
        Some(role) => (a.by_role.iter())
            .filter(|r| r.role == role)
            .map(|r| TableRow {
                module: &r.module,
                bytes: r.bytes,
                blocks: r.blocks,
                role: Some(role),
                more_roles: 0,
            })
            .collect(),
        None => (a.by_module.iter())
            .map(|m| {
                // by_role is most bytes first: a module's first row is its
                // main role.
                let mut roles = a.by_role.iter().filter(|r| r.module == m.module);
                let role = roles.next().map(|r| r.role);
                TableRow {
                    module: &m.module,
                    bytes: m.bytes,
                    blocks: m.blocks,
                    role,
                    more_roles: roles.count(),
                }
            })
            .collect(),
    };
    match v.sort {
        SortBy::Bytes => {
            rows.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(natural_cmp(x.module, y.module)))
        }
        SortBy::Module => rows.sort_by(|x, y| natural_cmp(x.module, y.module)),
        SortBy::Blocks => rows.sort_by(|x, y| {
            y.blocks
                .cmp(&x.blocks)
                .then(natural_cmp(x.module, y.module))
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
    let popup = popup(area, a);
    frame.render_widget(Clear, popup);
    // The other keys are the footer's (issue 46, item 15: this line named
    // them all, cut at 80 columns: "· E┘").
    let order = format!(
        " o sort: {}{} · O reverse · r role: {} ",
        v.sort.name(),
        if v.reversed { " (reversed)" } else { "" },
        v.role.map_or("all", Role::label)
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
    // Roles: exact ones from the producer's role lists, the others by
    // their lifetime (model::roles).
    let mut roles = vec![Span::styled(" roles", t.dim())];
    for r in &a.roles {
        let style = if v.role == Some(r.role) {
            t.selected()
        } else {
            ratatui::style::Style::new()
        };
        roles.push(Span::styled(format!(" {} ", g.dot), t.dim()));
        roles.push(Span::styled(format!("{} ", r.role.label()), t.dim()));
        roles.push(Span::styled(format::bytes_short(r.bytes), style));
    }
    if a.role_lists.lists == 0 {
        roles.push(Span::styled(
            "   (no role lists: parameters, gradients and optimizer state need agent 1.2)",
            t.dim(),
        ));
    }
    let head = Rect { height: 1, ..inner };
    let width = inner.width as usize;
    frame.render_widget(
        Paragraph::new(vec![
            crate::fit::fit_line(Line::from(phases), width, g.ellipsis),
            crate::fit::fit_line(Line::from(roles), width, g.ellipsis),
        ]),
        Rect { height: 2, ..head },
    );
    if inner.height < 4 {
        return;
    }
    let body = Rect {
        y: inner.y + 3,
        height: inner.height - 3,
        ..inner
    };
    if !a.tagged() && a.role_lists.lists == 0 {
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
    // One role that no module holds: said, not an empty table.
    if let Some(role) = v.role.filter(|_| rows.is_empty()) {
        let none = format!(" No module holds {} now (r: the next role).", role.label());
        frame.render_widget(Paragraph::new(Line::styled(none, t.dim())), body);
        return;
    }
    let shown = body.height.saturating_sub(1).max(1) as usize;
    // The table scrolls to keep the row under the cursor in view.
    let cursor = v.cursor_in(&rows);
    let scroll = Scroll::new(rows.len(), shown).reveal(cursor).offset();
    let module_w = width.saturating_sub(8 + 10 + 8 + 6 + 14 + 2).max(8);
    // The letter the block map (coloured by module) draws each module with.
    let keys = super::letters::keys(letters, a);
    let letter = |m: &str| {
        keys.iter()
            .position(|k| *k == m)
            .map_or("+", |i| super::letters::LETTERS[i])
    };
    let table_rows = rows
        .iter()
        .enumerate()
        .skip(scroll)
        .take(shown)
        .map(|(i, m)| {
            let name = match m.module {
                "" => Line::styled("(no module)", t.dim()),
                path => crate::fit::fit_line(Line::raw(path.to_string()), module_w, g.ellipsis),
            };
            let role = match (m.role, m.more_roles) {
                (None, _) => String::new(),
                (Some(r), 0) => r.label().to_string(),
                (Some(r), n) => format!("{} +{n}", r.label()),
            };
            let share = if total > 0 {
                format::percent(m.bytes as f64 / total as f64)
            } else {
                g.absent.to_string()
            };
            Row::new(vec![
                Cell::from(letter(m.module)),
                Cell::from(name),
                Cell::from(role),
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
    let header = Row::new(["", "MODULE", "ROLE", "BYTES", "SHARE", "BLOCKS"]).style(t.header());
    let table = Table::new(
        table_rows,
        [
            Constraint::Length(1),
            Constraint::Min(8),
            Constraint::Length(14),
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
        use vramscope_core::model::attrib::ModuleBytes;
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
            sorted(&a, v).iter().map(|m| m.module.to_string()).collect()
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
