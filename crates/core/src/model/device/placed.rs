//! Placing snapshots by ring positions (FORMAT.md, "Positions" and
//! "Attaching mid-run").
//!
//! A device's events arrive with their position in the device ring, and a
//! snapshot from a 1.1 producer says where its state sits in that ring:
//! events below `before` are reflected in it, events from `after` on are
//! not. So the model keeps the device's recent events with their positions
//! (a bounded log) and, when such a snapshot completes, installs the state
//! and applies exactly the logged events it does not reflect, whatever order
//! the rings were drained in. Later events below the anchor are dropped as
//! already reflected.
//!
//! A reader that began mid-run (it skipped records written before it came)
//! *holds* the device's events until a usable anchor completes: applying
//! them to an empty state would only produce contradictions. An anchor is
//! usable when no record after its `before` is missing: not skipped by the
//! reader, not lost, not let go of by the log's bound.

use super::parts::{Applied, Problem};
use super::pending::{Pending, SnapshotOutcome};
use super::placement::{AnchoredFrom, Deferred, Verdict, PAST_HEAD_MARGIN_NS};
use super::state::DeviceState;
use crate::model::eventlog::{EventLog, LetGo};
use crate::model::rules::BlockRules;
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{BlockState, EventKind, RingSpan};

impl DeviceState {
    /// Watching began mid-run (the reader skipped earlier records, it
    /// started at `ring_starts` in each ring): hold this device's events
    /// until an anchor snapshot is installed.
    pub(crate) fn hold_until_anchored(&mut self, ring_starts: &[u64]) {
        self.placement.starts = ring_starts.to_vec();
        self.placement.holding = true;
        self.synced = false;
    }

    /// Waiting for an anchor snapshot (see [`hold_until_anchored`](Self::hold_until_anchored)).
    pub(crate) fn holding(&self) -> bool {
        self.placement.holding
    }

    /// For a device watched from mid-run, once anchored: where what the
    /// state was built from begins (`export` and `sim` start there). `None`
    /// while still holding, or when watching began at the start.
    pub fn anchored_from(&self) -> Option<AnchoredFrom> {
        self.placement.first_anchor
    }

    /// Events dropped because an installed snapshot already reflected them.
    pub(crate) fn reflected_events(&self) -> u64 {
        self.placement.reflected
    }

    /// Events were lost on the wire: no anchor below what was seen so far
    /// can be exact.
    pub(crate) fn placement_loss(&mut self) {
        if let Some(n) = self.placement.newest {
            self.placement.missing(n);
        }
    }

    /// The process's log let go of this device's positioned event `g` (or
    /// could not keep it): an anchor at or below it can no longer be
    /// installed exactly, unless the event was already used up.
    pub(crate) fn placement_let_go(&mut self, g: LetGo) {
        let p = &mut self.placement;
        if g.seq >= p.log_from && p.floor.is_none_or(|f| g.pos >= f) {
            p.missing(g.pos);
        }
    }

    /// Apply an allocator event read at `at`. Returns whether the event
    /// places this device's snapshots (the caller keeps it in the process's
    /// log with its position), and what applying it did: `None` when it was
    /// held or dropped as already reflected.
    pub(crate) fn apply_at(
        &mut self,
        t: u64,
        kind: &EventKind,
        at: RingPos,
        rules: &BlockRules,
    ) -> (bool, Option<Applied>) {
        let p = &mut self.placement;
        p.ring.get_or_insert(at.ring);
        if p.ring != Some(at.ring) {
            // Not this device's ring (a producer writing one device's events
            // into several rings): positions cannot place them.
            return (false, Some(self.apply(t, kind, rules)));
        }
        if p.floor.is_some_and(|f| at.position < f) {
            p.reflected += 1;
            return (false, None);
        }
        p.newest = Some(p.newest.map_or(at.position, |n| n.max(at.position)));
        if p.holding || self.reflected_in_window(at.position, kind) {
            return (true, None);
        }
        (true, Some(self.apply(t, kind, rules)))
    }

    /// Whether the event at `pos` lies in the installed snapshot's
    /// ambiguous window and its effect is already in the state (counted).
    #[inline]
    pub(super) fn reflected_in_window(&mut self, pos: u64, kind: &EventKind) -> bool {
        if self.placement.window_end.is_none_or(|end| pos >= end) {
            return false;
        }
        self.reflected_in_prefix(kind)
    }

    /// [`Self::reflected_in_window`] for an event inside the window.
    #[cold]
    fn reflected_in_prefix(&mut self, kind: &EventKind) -> bool {
        if self.placement.in_prefix && self.already_reflected(kind) {
            self.placement.reflected += 1;
            return true;
        }
        self.placement.in_prefix = false;
        false
    }

    /// Install the complete snapshot `p`, placed in the ring by `span`:
    /// the state, then the logged events it does not reflect. A snapshot
    /// after which records are missing is refused (a newer one is needed).
    /// One placed past the positions read so far in its ring waits for the
    /// ring to reach them (the reader drains rings one after another, so
    /// the records before a snapshot may come after it); a record that
    /// proves its positions false refuses it ([`Self::deferred_verdict`]).
    pub(super) fn install_placed(
        &mut self,
        p: Pending,
        t: u64,
        span: RingSpan,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        if !self.placement.usable(&span) {
            self.placement.refused += 1;
            self.synced = false;
            return SnapshotOutcome::Discarded;
        }
        if !self.reached(&span) {
            self.placement.deferred = Some(Deferred {
                pending: p,
                t,
                span,
            });
            return SnapshotOutcome::Ongoing;
        }
        self.install_reached(p, t, span, rules, log)
    }

    /// Whether the records of `span`'s ring below its `after` were all
    /// read (or skipped by a reader that began there).
    fn reached(&self, span: &RingSpan) -> bool {
        let pl = &self.placement;
        let start = pl.starts.get(usize::from(span.ring)).copied().unwrap_or(0);
        let next = pl.newest.map_or(start, |n| n.saturating_add(1).max(start));
        span.after.max(span.before) <= next
    }

    /// A snapshot waits for its ring to reach its positions.
    pub(crate) fn has_deferred(&self) -> bool {
        self.placement.deferred.is_some()
    }

    /// What a record of this device read at `at`, timed `t`, says of the
    /// snapshot waiting for its ring: the ring reached it, or (a record
    /// below its `before` written after it ended) its positions lie past
    /// the ring's head.
    pub(crate) fn deferred_verdict(&self, at: RingPos, t: u64) -> Option<Verdict> {
        let d = self.placement.deferred.as_ref()?;
        if u32::from(d.span.ring) != at.ring {
            return None;
        }
        let reach = d.span.after.max(d.span.before);
        if at.position.saturating_add(1) >= reach {
            return Some(Verdict::Install);
        }
        let late = t > d.t.saturating_add(PAST_HEAD_MARGIN_NS);
        (at.position < d.span.before && late).then_some(Verdict::Refute)
    }

    /// Installs the snapshot that waited for its ring (see
    /// [`Self::deferred_verdict`]).
    pub(crate) fn install_deferred(
        &mut self,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        let Some(d) = self.placement.deferred.take() else {
            return SnapshotOutcome::Ongoing;
        };
        if !self.placement.usable(&d.span) {
            self.placement.refused += 1;
            self.synced = false;
            return SnapshotOutcome::Discarded;
        }
        self.install_reached(d.pending, d.t, d.span, rules, log)
    }

    /// Refuses the snapshot that waited for its ring: its positions lie
    /// past the ring's head, which the record at `position` shows. The
    /// problem to report.
    pub(crate) fn refuse_deferred(&mut self, position: u64) -> Option<Problem> {
        let d = self.placement.deferred.take()?;
        self.placement.refused += 1;
        self.synced = false;
        Some(Problem::AnchorPastHead {
            ring: d.span.ring,
            before: d.span.before,
            reached: Some(self.placement.newest.map_or(position, |n| n.max(position))),
        })
    }

    /// [`Self::install_placed`] once the ring reached the snapshot.
    fn install_reached(
        &mut self,
        p: Pending,
        t: u64,
        span: RingSpan,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        let pl = &mut self.placement;
        pl.deferred = None;
        if pl.holding && pl.first_anchor.is_none() {
            pl.first_anchor = Some(AnchoredFrom::Position {
                ring: u32::from(span.ring),
                position: span.after.max(span.before),
            });
        }
        pl.ring.get_or_insert(u32::from(span.ring));
        let mut kept = log.positioned(self.device, pl.log_from, span.before);
        kept.sort_by_key(|k| k.pos);
        let later: Vec<(u64, EventKind, Option<u64>)> = (kept.into_iter())
            .map(|k| (k.t, k.kind, Some(k.pos)))
            .collect();
        pl.floor = Some(span.before);
        pl.window_end = Some(span.after).filter(|&a| a > span.before);
        pl.in_prefix = true;
        pl.holding = false;
        self.install_with(p, t, &later, rules)
    }

    /// Install the complete snapshot `p` of a producer that gives no
    /// positions while events are held: the held events timed after the
    /// snapshot began are applied on it, earlier ones dropped.
    pub(super) fn install_timed(
        &mut self,
        p: Pending,
        t: u64,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        let pl = &mut self.placement;
        let begun = p.time_ns;
        if pl.holding && pl.first_anchor.is_none() {
            pl.first_anchor = Some(AnchoredFrom::Time { time_ns: begun });
        }
        let kept = log.positioned(self.device, pl.log_from, 0);
        let held = kept.len();
        let later: Vec<(u64, EventKind, Option<u64>)> = (kept.into_iter())
            .filter(|k| k.t > begun)
            .map(|k| (k.t, k.kind, None))
            .collect();
        pl.reflected += (held - later.len()) as u64;
        pl.log_from = log.next_seq();
        pl.holding = false;
        self.install_with(p, t, &later, rules)
    }

    /// Events are held for an anchor.
    pub(super) fn placement_holding(&self) -> bool {
        self.placement.holding
    }

    /// Events come with positions (or are held for an anchor): a snapshot
    /// with positions is placed by them.
    pub(super) fn placement_in_use(&self) -> bool {
        self.placement.ring.is_some() || self.placement.holding
    }

    /// An event from the ambiguous window `before ≤ p < after` whose effect
    /// the snapshot already shows (FORMAT.md, "Positions").
    fn already_reflected(&self, kind: &EventKind) -> bool {
        let block = |addr: u64| self.blocks.get(&addr).map(|b| b.state);
        let covered = |addr: u64| {
            (self.segments.range(..=addr).next_back()).is_some_and(|(_, s)| addr < s.end())
        };
        match *kind {
            EventKind::Alloc { addr, .. } => block(addr) == Some(BlockState::Allocated),
            EventKind::FreeRequested { addr, .. } => block(addr) != Some(BlockState::Allocated),
            EventKind::FreeCompleted { addr, .. } => !matches!(
                block(addr),
                Some(BlockState::Allocated | BlockState::PendingFree)
            ),
            EventKind::SegmentAlloc { addr, .. } => self.segments.contains_key(&addr),
            EventKind::SegmentFree { addr, .. } => !self.segments.contains_key(&addr),
            EventKind::SegmentMap { addr, .. } => covered(addr),
            EventKind::SegmentUnmap { addr, .. } => !covered(addr),
            _ => false,
        }
    }
}
