//! One scroll type for every scrolled pane (as gitui's `VerticalScroll`):
//! the first line shown of a pane's lines, bounded at both ends, so that no
//! key takes it past the last full page and the key after the end moves at
//! once (issue 46, item 3: the legend's `j` kept counting past its end,
//! after which `k` seemed stuck).
//!
//! A [`Scroll`] knows its lines and the lines shown at once as they were
//! when it last moved; [`super::App`] fits it to the pane's lines before a
//! key moves it ([`Scroll::fit`], then [`Scroll::go`]), and the pane fits
//! it again to what it draws (a terminal resized since, lines added), so
//! the two never disagree. Every scrolled pane holds one: the process
//! view's block map, summary, events and OOM & leak panes
//! ([`super::state::ProcessState`]), the help and legend overlays
//! ([`super::Overlay`], the fleet view's too) and the step diff. A list with
//! a selected row (the overview's table, the fleet's lists, By module)
//! shows the rows [`Scroll::reveal`] says, and its selection moves as
//! [`Scroll::cursor_after`] says.
//!
//! The same keys everywhere ([`super::keys`]): `j`/`k` (Down/Up) a line,
//! PgDn/PgUp a page, `g`/Home the top, `G`/End the end (in the process view
//! End follows live, so `G` alone).

use std::ops::Range;

use ratatui::text::Span;
use serde::{Deserialize, Serialize};

use super::theme::Theme;

/// Where a scroll key moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Move {
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
}

impl Move {
    /// Towards the end (further back, in the event history).
    pub(crate) fn down(self) -> bool {
        matches!(self, Move::Down | Move::PageDown | Move::End)
    }
}

/// The first line shown of `len` lines, `height` at a time: never past the
/// last full page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scroll {
    offset: usize,
    len: usize,
    height: usize,
    /// Moved to the end (`G`, End): kept at the end as lines are added (a
    /// history loaded further back), until another key moves it.
    tail: bool,
}

impl Scroll {
    /// At the top of `len` lines shown `height` at a time.
    pub(crate) fn new(len: usize, height: usize) -> Scroll {
        Scroll {
            len,
            height,
            ..Scroll::default()
        }
    }

    /// The same place in `len` lines shown `height` at a time: no further
    /// than their last full page (a scroll kept from a smaller terminal or
    /// from more lines), and at the end still after `G`.
    #[must_use]
    pub(crate) fn fit(self, len: usize, height: usize) -> Scroll {
        let mut s = Scroll {
            len,
            height,
            ..self
        };
        s.offset = if s.tail {
            s.last()
        } else {
            s.offset.min(s.last())
        };
        s
    }

    /// The first line shown.
    pub fn offset(self) -> usize {
        self.offset
    }

    /// The furthest it goes: the last line at the bottom.
    pub fn last(self) -> usize {
        self.len.saturating_sub(self.height)
    }

    /// The lines shown.
    pub(crate) fn range(self) -> Range<usize> {
        self.offset..(self.offset + self.height).min(self.len)
    }

    /// Moved to the end by `G`/End (and kept there as lines are added).
    pub(crate) fn tail(self) -> bool {
        self.tail
    }

    /// `delta` lines down (up if negative), within the lines.
    pub(crate) fn by(&mut self, delta: isize) {
        let to = if delta < 0 {
            self.offset.saturating_sub(delta.unsigned_abs())
        } else {
            self.offset.saturating_add(delta.unsigned_abs())
        };
        self.to(to);
    }

    /// From line `offset` on (no further than the last full page).
    pub(crate) fn to(&mut self, offset: usize) {
        self.offset = offset.min(self.last());
        self.tail = false;
    }

    /// Where a scroll key takes it: a line, a page (the lines shown), the
    /// top or the end.
    pub(crate) fn go(&mut self, m: Move) {
        let page = self.height.max(1) as isize;
        match m {
            Move::Up => self.by(-1),
            Move::Down => self.by(1),
            Move::PageUp => self.by(-page),
            Move::PageDown => self.by(page),
            Move::Home => self.to(0),
            Move::End => {
                self.offset = self.last();
                self.tail = true;
            }
        }
    }

    /// A list with row `cursor` selected: the rows shown, moved as little
    /// as they must to show it (from the top: the row on the last line).
    #[must_use]
    pub(crate) fn reveal(self, cursor: usize) -> Scroll {
        let mut s = self.fit(self.len, self.height);
        let height = s.height.max(1);
        if cursor < s.offset {
            s.offset = cursor;
        } else if cursor >= s.offset + height {
            s.offset = cursor + 1 - height;
        }
        s.offset = s.offset.min(s.last());
        s
    }

    /// Where `m` takes the selected row `cursor` of a list shown like this
    /// (a page: the rows shown), within its rows.
    pub(crate) fn cursor_after(self, cursor: usize, m: Move) -> usize {
        let (page, end) = (self.height.max(1), self.len.saturating_sub(1));
        match m {
            Move::Up => cursor.saturating_sub(1),
            Move::Down => cursor.saturating_add(1),
            Move::PageUp => cursor.saturating_sub(page),
            Move::PageDown => cursor.saturating_add(page),
            Move::Home => 0,
            Move::End => end,
        }
        .min(end)
    }

    /// A pane's title part when not all lines fit: ` · rows 1-20/49
    /// (PgUp/PgDn) ` (`what`: rows, lines).
    pub(crate) fn hint(self, what: &str, t: &Theme) -> Option<Span<'static>> {
        (self.len > self.height && self.height > 0).then(|| {
            let Range { start, end } = self.range();
            Span::styled(
                format!(
                    "{} {what} {}-{end}/{} (PgUp/PgDn) ",
                    t.glyphs().dot,
                    start + 1,
                    self.len
                ),
                t.dim(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOVES: [Move; 6] = [
        Move::Up,
        Move::Down,
        Move::PageUp,
        Move::PageDown,
        Move::Home,
        Move::End,
    ];

    /// Whatever keys come, in whatever order, over whatever lines: the
    /// offset stays within the last full page, and a move up from the end
    /// moves at once.
    #[test]
    fn never_past_the_end_whatever_the_keys() {
        for (len, height) in [(0, 0), (0, 5), (3, 5), (5, 5), (6, 5), (100, 7), (100, 0)] {
            let mut s = Scroll::new(len, height);
            let last = len.saturating_sub(height);
            for (i, m) in (0..500).map(|i| (i, MOVES[(i * 7 + i / 3) % 6])) {
                s.go(m);
                assert!(s.offset() <= last, "{len} {height} step {i}: {s:?}");
                assert!(s.range().end <= len);
            }
            s.go(Move::End);
            assert_eq!(s.offset(), last);
            for _ in 0..50 {
                s.go(Move::Down);
            }
            assert_eq!(s.offset(), last, "Down at the end");
            s.go(Move::Up);
            assert_eq!(s.offset(), last.saturating_sub(1), "Up moves at once");
            s.go(Move::Home);
            assert_eq!(s.offset(), 0);
            s.go(Move::PageDown);
            assert_eq!(s.offset(), height.max(1).min(last));
            s.go(Move::PageUp);
            assert_eq!(s.offset(), 0);
        }
    }

    /// Fitted to a taller pane or fewer lines, it comes back within the
    /// last page; after End it stays at the end as lines are added.
    #[test]
    fn fit_keeps_it_within_the_lines_and_at_the_end_after_end() {
        let mut s = Scroll::new(100, 10);
        s.by(85);
        assert_eq!(s.offset(), 85);
        assert_eq!(s.fit(100, 30).offset(), 70);
        assert_eq!(s.fit(40, 10).offset(), 30);
        assert_eq!(s.fit(200, 10).offset(), 85, "not at the end: stays");
        s.go(Move::End);
        assert_eq!(s.fit(200, 10).offset(), 190, "at the end: stays there");
        s.go(Move::Up);
        assert_eq!(s.fit(300, 10).offset(), 89);
        assert!(!s.tail());
    }

    /// A list's cursor stays on its rows; the rows shown follow it, moving
    /// as little as they must (from the top: the cursor on the last line,
    /// as the fleet's lists and By module always drew it).
    #[test]
    fn a_cursor_stays_on_the_rows_and_the_rows_shown_follow_it() {
        let s = Scroll::new(12, 5);
        assert_eq!(s.cursor_after(0, Move::Up), 0);
        assert_eq!(s.cursor_after(3, Move::PageDown), 8);
        assert_eq!(s.cursor_after(9, Move::PageDown), 11);
        assert_eq!(s.cursor_after(4, Move::End), 11);
        assert_eq!(s.cursor_after(11, Move::Down), 11);
        assert_eq!(s.cursor_after(4, Move::Home), 0);
        assert_eq!(Scroll::new(0, 5).cursor_after(0, Move::End), 0);
        for cursor in 0..12usize {
            let fleet = cursor.saturating_sub(4).min(12 - 5);
            assert_eq!(s.reveal(cursor).offset(), fleet, "{cursor}");
            assert!(s.reveal(cursor).range().contains(&cursor));
        }
        let mut at = s.reveal(11);
        assert_eq!(at.offset(), 7);
        at = at.reveal(8);
        assert_eq!(at.offset(), 7, "still shown: no move");
        at = at.reveal(2);
        assert_eq!(at.offset(), 2);
    }

    #[test]
    fn the_hint_says_which_lines_show() {
        let t = Theme::new(false, false);
        let mut s = Scroll::new(49, 20);
        assert_eq!(
            s.hint("rows", &t).unwrap().content,
            "· rows 1-20/49 (PgUp/PgDn) "
        );
        s.go(Move::End);
        assert_eq!(
            s.hint("lines", &t).unwrap().content,
            "· lines 30-49/49 (PgUp/PgDn) "
        );
        assert_eq!(Scroll::new(20, 20).hint("rows", &t), None);
    }
}
