//! The process view's keys and clicks: panes, the timeline's window,
//! scrolling, the event search and the block map.

use super::{App, Effect, Overlay, Pane, Screen, SPANS_NS};
use crate::keys::Action;
use crate::scroll::Scroll;
use crate::{blockmap, diagnosis, events, layout, stats};

impl App {
    pub fn span_ns(&self) -> u64 {
        self.process.span_ns()
    }

    /// The timeline window `[from, to)` in collector ns.
    pub fn window(&self) -> (u64, u64) {
        self.process.window(self.now_ns())
    }

    /// The process view's actions: back, panes, the search.
    pub(super) fn process_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Back => return self.back(),
            A::SearchEvents => {
                // The search is over the Events pane: show it (focus it).
                self.process.pane = Pane::Events;
                self.overlay = Some(Overlay::Prompt);
            }
            A::NextPane => self.process.pane = self.next_pane(1),
            A::PrevPane => self.process.pane = self.next_pane(-1),
            A::ShowPane(p) => self.process.pane = p,
            _ => {}
        }
        vec![]
    }

    /// The timeline's window: zoom, scroll back and forward, follow.
    pub(super) fn window_act(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        if self.process.trace_window.is_some() {
            self.say("the timeline shows the file's whole trace");
            return vec![];
        }
        match action {
            A::ZoomIn => {
                self.process.span_index = self.process.span_index.saturating_sub(1);
            }
            A::ZoomOut => {
                self.process.span_index = (self.process.span_index + 1).min(SPANS_NS.len() - 1);
            }
            A::TimeBack => {
                let followed = self.process.follow;
                if self.process.follow {
                    self.process.end_ns = self.now_ns();
                    self.process.follow = false;
                }
                let end = self.process.end_ns;
                // The window stops where it starts at the oldest sample
                // held: before it there is nothing to show (issue 46,
                // item 4).
                let oldest = (self.selected_entry())
                    .and_then(|e| e.view.samples)
                    .map_or(0, |(first, _)| first);
                let stop = oldest.saturating_add(self.span_ns()).min(end);
                self.process.end_ns = end.saturating_sub(self.span_ns() / 2).max(stop);
                if self.process.end_ns == end {
                    self.process.follow = followed;
                    self.say("the window starts at the oldest sample held");
                }
            }
            A::TimeForward => {
                if !self.process.follow {
                    self.process.end_ns = self.process.end_ns.saturating_add(self.span_ns() / 2);
                    if self.process.end_ns >= self.now_ns() {
                        self.process.follow = true;
                    }
                }
            }
            A::FollowToggle | A::FollowOn => {
                self.process.follow = !self.process.follow || action == A::FollowOn;
                if !self.process.follow {
                    self.process.end_ns = self.now_ns();
                }
            }
            _ => return vec![],
        }
        self.refresh_timeline()
    }

    /// The block map: its colours, what it shows, the selected block.
    pub(super) fn block_act(&mut self, action: Action) {
        use Action as A;
        match action {
            A::BlockColouring => {
                self.process.colouring = self.process.colouring.next();
                self.process.only = None;
                self.say(format!(
                    "block map coloured by {}",
                    self.process.colouring.name()
                ));
            }
            A::BlockOnly => self.next_only(),
            A::BlockNext | A::BlockPrev => self.select_block(action == A::BlockNext),
            A::BlockClear => {
                self.process.selected_block = None;
                self.process.only = None;
            }
            _ => {}
        }
    }

    /// The pane `step` Tabs away: every tab on a small terminal; on a large
    /// one, where all panes show, the ones that scroll (the focus).
    pub(super) fn next_pane(&self, step: isize) -> Pane {
        let panes: &[Pane] = if layout::compact(self.size) {
            &Pane::ALL
        } else {
            &Pane::FOCUSABLE
        };
        let i = panes.iter().position(|p| *p == self.process.pane);
        let n = panes.len() as isize;
        let next = match i {
            Some(i) => (i as isize + step).rem_euclid(n),
            None if step > 0 => 0,
            None => n - 1,
        };
        panes[next as usize]
    }

    pub(super) fn back(&mut self) -> Vec<Effect> {
        self.screen = Screen::Overview;
        self.fix_selection();
        vec![Effect::Refresh]
    }

    pub(super) fn refresh_timeline(&mut self) -> Vec<Effect> {
        if self.paused {
            self.say("paused: the timeline moves again after p");
            return vec![];
        }
        vec![Effect::Refresh]
    }

    /// `pane`'s lines (rows, events) and the lines it shows at once, as
    /// drawn now: where its scrolling stops.
    pub(super) fn pane_extent(&self, pane: Pane) -> (usize, usize) {
        let (size, caption) = (self.size, self.caption_lines());
        let height = layout::pane_rows(size, caption, pane);
        let Some(e) = self.selected_entry() else {
            return (0, height);
        };
        match pane {
            Pane::Events => {
                let filter = self.process.event_filter.to_lowercase();
                (events::shown(e, &filter).count(), height)
            }
            Pane::Blocks => {
                // The selected block's lines take the map's last ones.
                let body = layout::screen(size, caption).body;
                let area = layout::process(size, pane, body).blocks;
                let v = self.process.map_view(self.snap.taken_ns, e.key());
                let shown = area.map_or(height, |a| blockmap::rows_shown(e, a, &v));
                (blockmap::row_count(e), shown)
            }
            Pane::Stats => (stats::row_count(e), height),
            Pane::Diagnosis => {
                let width = layout::pane_inner(size, caption, pane).width;
                (diagnosis::line_count(e, self.snap.taken_ns, width), height)
            }
            Pane::Timeline => (0, height),
        }
    }

    /// Scrolls the pane in focus (the tab shown, or on a large terminal the
    /// pane Tab moved to) as `go` says, never past its last full page.
    /// Scrolling back through the event history (`down`) asks for a
    /// snapshot holding further.
    pub(super) fn scroll_pane(&mut self, down: bool, go: impl FnOnce(&mut Scroll)) -> Vec<Effect> {
        let pane = self.process.pane;
        let (len, height) = self.pane_extent(pane);
        let Some(s) = self.process.scroll_mut(pane) else {
            return vec![];
        };
        *s = s.fit(len, height);
        go(s);
        if pane == Pane::Events && down && self.process.event_filter.is_empty() {
            vec![Effect::Refresh]
        } else {
            vec![]
        }
    }

    /// The pane in focus fitted to its lines in a new snapshot (a history
    /// loaded further back after `G`, a terminal resized).
    pub(super) fn fit_pane(&mut self) {
        if self.screen != Screen::Process {
            return;
        }
        let pane = self.process.pane;
        let (len, height) = self.pane_extent(pane);
        if let Some(s) = self.process.scroll_mut(pane) {
            *s = s.fit(len, height);
        }
    }

    /// The block map shows only `only` (its colouring follows), on screen.
    pub(super) fn show_only(&mut self, only: blockmap::Only) {
        self.process.colouring = match only {
            blockmap::Only::Module(_) => blockmap::Colouring::Module,
            blockmap::Only::Phase(_) => blockmap::Colouring::Phase,
            blockmap::Only::Role(_) => blockmap::Colouring::Role,
        };
        self.say(format!("block map: only {} (x clears)", only.label()));
        self.process.only = Some(only);
        self.process.pane = Pane::Blocks;
        if self
            .process
            .selected_block
            .is_some_and(|addr| !self.block_shown(addr))
        {
            self.process.selected_block = None;
        }
    }

    /// Whether block `addr` is allocated and passes the map's filter.
    pub(super) fn block_shown(&self, addr: u64) -> bool {
        let Some(e) = self.selected_entry() else {
            return false;
        };
        blockmap::find_block(e, addr).is_some_and(|(_, b)| {
            b.block.state == vramscope_wire::event::BlockState::Allocated
                && (self.process.only.as_ref()).is_none_or(|o| o.matches(&e.view.attribution, b))
        })
    }

    /// `v`: the next module or phase of the legend (modules by letter,
    /// phases in order), then none.
    pub(super) fn next_only(&mut self) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let a = &e.view.attribution;
        let items: Vec<blockmap::Only> = match self.process.colouring {
            blockmap::Colouring::State => {
                self.say("c first: colour the block map by module or phase");
                return;
            }
            blockmap::Colouring::Module => {
                let letters = self.process.letters.get(&e.key());
                (crate::letters::keys(letters, a).into_iter())
                    .filter(|m| crate::letters::holds(a, m))
                    .map(|m| blockmap::Only::Module(m.to_string()))
                    .collect()
            }
            blockmap::Colouring::Phase => (a.by_phase.iter())
                .map(|p| blockmap::Only::Phase(p.phase))
                .collect(),
            blockmap::Colouring::Role => (a.roles.iter())
                .map(|r| blockmap::Only::Role(r.role))
                .collect(),
        };
        let next = match &self.process.only {
            None => items.first().cloned(),
            Some(cur) => items
                .iter()
                .position(|i| i == cur)
                .and_then(|i| items.get(i + 1).cloned()),
        };
        match next {
            Some(o) => self.show_only(o),
            None => {
                self.process.only = None;
                self.say("block map: every block");
            }
        }
    }

    /// `n`/`N`: the next or previous allocated block the map shows, in map
    /// order (wrapping); the map scrolls to it.
    pub(super) fn select_block(&mut self, forward: bool) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let a = &e.view.attribution;
        let only = self.process.only.as_ref();
        let blocks: Vec<(usize, u64)> = blockmap::blocks_in_order(e)
            .into_iter()
            .filter(|(_, b)| {
                b.block.state == vramscope_wire::event::BlockState::Allocated
                    && only.is_none_or(|o| o.matches(a, b))
            })
            .map(|(row, b)| (row, b.addr))
            .collect();
        if blocks.is_empty() {
            self.say("no allocated block to select");
            return;
        }
        let cur = (self.process.selected_block)
            .and_then(|addr| blocks.iter().position(|(_, b)| *b == addr));
        let i = match (cur, forward) {
            (None, true) => 0,
            (None, false) => blocks.len() - 1,
            (Some(i), true) => (i + 1) % blocks.len(),
            (Some(i), false) => (i + blocks.len() - 1) % blocks.len(),
        };
        let (row, addr) = blocks[i];
        self.process.selected_block = Some(addr);
        self.process.pane = Pane::Blocks;
        // The row in view, a third of the way down.
        let page = layout::pane_rows(self.size, self.caption_lines(), Pane::Blocks).max(1);
        let (len, shown) = self.pane_extent(Pane::Blocks);
        let s = &mut self.process.block_scroll;
        *s = s.fit(len, shown);
        if row < s.offset() || row >= s.offset() + page * 2 / 3 {
            s.to(row.saturating_sub(page / 3));
        }
    }

    /// A click on the block map selects the block under it.
    pub(super) fn click_block(&mut self, x: u16, y: u16) {
        let Some(e) = self.selected_entry() else {
            return;
        };
        let body = layout::screen(self.size, self.caption_lines()).body;
        let Some(area) = layout::process(self.size, self.process.pane, body).blocks else {
            return;
        };
        let v = self.process.map_view(self.snap.taken_ns, e.key());
        if let Some(addr) = blockmap::block_at(e, area, &v, x, y) {
            self.process.selected_block = Some(addr);
            self.dirty = true;
        }
    }
}
