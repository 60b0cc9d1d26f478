//! The overview's keys and clicks: the selection, the sort, the filter,
//! opening a process.

use ratatui::layout::Rect;

use super::{App, Effect, Overlay, Screen};
use crate::keys::Action;
use crate::rows::{self, Col, Row};
use crate::scroll::Scroll;
use crate::{history, layout};
use vramscope_core::model::{ProcessKey, TimelineRequest};

impl App {
    /// The rows of the overview, filtered and sorted.
    pub fn rows(&self) -> Vec<Row<'_>> {
        self.overview.rows(&self.snap)
    }

    /// The overview table's data rows (for clicks).
    pub fn table_body(&self) -> Rect {
        let rows = self.rows().len();
        layout::table_body(self.size, self.caption_lines(), &self.snap.machine, rows)
    }

    /// Data rows the overview table shows at once.
    pub fn table_rows(&self) -> usize {
        if self.screen != Screen::Overview && self.size.height == 0 {
            return 1;
        }
        self.table_body().height as usize
    }

    /// The overview's history band and sparklines, when it shows either:
    /// the last [`history::WINDOW_NS`], one column per plot cell.
    pub(super) fn overview_timeline(&self) -> Option<TimelineRequest> {
        let rows = self.rows().len();
        let body = layout::screen(self.size, self.caption_lines()).body;
        let band = layout::overview(body, &self.snap.machine, rows).history;
        let spark = self.columns().cols().any(|c| c == Col::History);
        if band.is_none() && !spark {
            return None;
        }
        let to_ns = self.now_ns();
        Some(TimelineRequest {
            from_ns: to_ns.saturating_sub(history::WINDOW_NS),
            to_ns,
            columns: band
                .map_or(64, |b| history::plot_width(b.width))
                .clamp(16, 1000),
        })
    }

    pub(super) fn fix_selection(&mut self) {
        if self.screen == Screen::Process {
            return; // keep showing the chosen process, even once it is gone
        }
        let keys: Vec<ProcessKey> = self.rows().iter().map(|r| r.entry.key()).collect();
        if keys.is_empty() {
            self.overview.selected = None;
            self.overview.scroll = Scroll::default();
            return;
        }
        if self.overview.selected.is_none_or(|k| !keys.contains(&k)) {
            self.overview.selected = Some(keys[0]);
        }
        self.scroll_to_selection(&keys);
    }

    pub(super) fn scroll_to_selection(&mut self, keys: &[ProcessKey]) {
        let visible = self.table_rows().max(1);
        let idx = self
            .overview
            .selected
            .and_then(|k| keys.iter().position(|x| *x == k))
            .unwrap_or(0);
        let s = self.overview.scroll.fit(keys.len(), visible);
        self.overview.scroll = s.reveal(idx);
    }

    /// The overview's actions: the selection, sorting and the filter.
    pub(super) fn overview_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::SelectUp => return self.move_selection(-1),
            A::SelectDown => return self.move_selection(1),
            A::SelectPageUp => return self.move_selection(-self.page()),
            A::SelectPageDown => return self.move_selection(self.page()),
            A::SelectFirst => return self.move_selection(isize::MIN / 2),
            A::SelectLast => return self.move_selection(isize::MAX / 2),
            A::Open => return self.open(),
            A::EditFilter => self.overlay = Some(Overlay::Prompt),
            A::ClearFilter => {
                if !self.overview.filter.is_empty() {
                    self.overview.filter.clear();
                    self.fix_selection();
                }
                self.message = None;
            }
            A::SortNext => {
                // The columns on screen, left to right.
                let shown: Vec<Col> = self.columns().cols().collect();
                let i = shown.iter().position(|c| *c == self.overview.sort);
                let next = shown[i.map_or(0, |i| (i + 1) % shown.len())];
                self.sort_by(next, false);
            }
            A::SortReverse => {
                self.overview.descending = !self.overview.descending;
                self.fix_selection();
            }
            A::ClearExited => {
                let exited: Vec<ProcessKey> = (self.snap.processes.iter())
                    .filter(|p| !p.identity.alive && !self.overview.cleared.contains(&p.key()))
                    .map(|p| p.key())
                    .collect();
                let n = exited.len();
                self.overview.cleared.extend(exited);
                self.fix_selection();
                self.say(match n {
                    0 => "no exited process to clear".to_string(),
                    1 => "1 exited process cleared".to_string(),
                    n => format!("{n} exited processes cleared"),
                });
            }
            _ => {}
        }
        vec![]
    }

    /// The overview table's columns as drawn now.
    pub fn columns(&self) -> rows::Columns {
        crate::overview::table_columns(self.table_body().width, &self.rows())
    }

    /// Sorts by `col` in its natural order (numbers largest first, text
    /// A to Z); `toggle`: the same column again reverses it (a click on
    /// its header).
    pub(super) fn sort_by(&mut self, col: Col, toggle: bool) {
        if toggle && self.overview.sort == col {
            self.overview.descending = !self.overview.descending;
        } else {
            self.overview.sort = col;
            self.overview.descending = !matches!(
                col,
                Col::Pid | Col::Name | Col::User | Col::Mode | Col::Gpus | Col::Flags
            );
        }
        self.fix_selection();
    }

    /// Rows a page key moves the overview's selection.
    pub(super) fn page(&self) -> isize {
        self.table_rows().max(1) as isize
    }

    pub(super) fn move_selection(&mut self, delta: isize) -> Vec<Effect> {
        let keys: Vec<ProcessKey> = self.rows().iter().map(|r| r.entry.key()).collect();
        if keys.is_empty() {
            return vec![];
        }
        let cur = self
            .overview
            .selected
            .and_then(|k| keys.iter().position(|x| *x == k))
            .unwrap_or(0);
        let next = (cur as isize + delta).clamp(0, keys.len() as isize - 1) as usize;
        self.overview.selected = Some(keys[next]);
        self.scroll_to_selection(&keys);
        vec![]
    }

    /// Opens the process view of the selected process.
    pub fn open(&mut self) -> Vec<Effect> {
        if self.selected_entry().is_none() {
            return vec![];
        }
        self.screen = Screen::Process;
        self.process.scroll_home();
        self.process.follow = true;
        // An exited process's view opens on its last samples, not on the
        // empty time since (issue 46, item 4).
        let exited = (self.selected_entry()).filter(|e| !e.identity.alive);
        if let Some((_, last)) = exited.and_then(|e| e.view.samples) {
            self.process.follow = false;
            self.process.end_ns = last.saturating_add(self.span_ns() / 10);
        }
        vec![Effect::Refresh]
    }

    /// Opens the process view of `pid` (the `--pid` start option).
    pub fn open_pid(&mut self, pid: u32) -> bool {
        let key = self
            .snap
            .processes
            .iter()
            .find(|p| p.identity.host_pid == pid || p.key().pid == pid)
            .map(|p| p.key());
        match key {
            Some(k) => {
                self.overview.selected = Some(k);
                self.open();
                true
            }
            None => false,
        }
    }

    /// A click on the table: on the header, sort by that column (again:
    /// reverse); on a row, select it (again: open it).
    pub(super) fn click_table(&mut self, x: u16, y: u16) -> Vec<Effect> {
        let body = self.table_body();
        if x < body.x || x >= body.x + body.width {
            return vec![];
        }
        if y + 1 == body.y {
            if let Some(col) = self.columns().at(x - body.x) {
                self.sort_by(col, true);
                self.dirty = true;
            }
            return vec![];
        }
        if y >= body.y && y < body.y + body.height {
            let idx = self.overview.scroll.offset() + (y - body.y) as usize;
            let key = self.rows().get(idx).map(|r| r.entry.key());
            if let Some(key) = key {
                self.dirty = true;
                if self.overview.selected == Some(key) {
                    return self.open();
                }
                self.overview.selected = Some(key);
            }
        }
        vec![]
    }
}
