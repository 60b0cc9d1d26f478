//! Receiving a state snapshot of one device: `SnapshotBegin`, its
//! `SnapshotSegment` and `SnapshotBlock` records, then `SnapshotEnd`.
//!
//! The records are untrusted input: each is checked as it arrives (counts
//! within what `SnapshotBegin` announced, segments non-empty, blocks in
//! address order inside the segment they follow) and a bad one marks the
//! snapshot broken, so that `SnapshotEnd` discards it. Allocator events that
//! arrive meanwhile are kept for replay on the installed state (see
//! [`install`](super::install)). A snapshot is also broken by event loss or
//! too many events to replay.

use super::pending::{Pending, SnapshotOutcome};
use super::state::DeviceState;
use crate::model::eventlog::EventLog;
use crate::model::origin::Origin;
use crate::model::rules::BlockRules;
use vramscope_wire::event::{BlockState, EventKind, RingSpan};

impl DeviceState {
    /// Feed one snapshot record (SnapshotBegin … SnapshotEnd for this device).
    pub(crate) fn snapshot(
        &mut self,
        t: u64,
        kind: &EventKind,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        match *kind {
            EventKind::SnapshotBegin {
                id,
                segments,
                blocks,
                at,
                ..
            } => self.begin_snapshot(t, id, (segments, blocks), at),
            EventKind::SnapshotSegment {
                id,
                place,
                addr,
                size,
                pool_kind,
                expandable,
            } => {
                if let Some(p) = self.receiving(id) {
                    p.add_segment(&place, addr, size, pool_kind, expandable);
                }
                SnapshotOutcome::Ongoing
            }
            EventKind::SnapshotBlock {
                id,
                addr,
                size,
                requested,
                state,
                ctx,
                ..
            } => {
                let origin = match state {
                    BlockState::Inactive => Origin::default(),
                    _ => Origin::of(ctx, self.step_now),
                };
                if let Some(p) = self.receiving(id) {
                    p.add_block(addr, size, requested, state, origin);
                }
                SnapshotOutcome::Ongoing
            }
            EventKind::SnapshotEnd { id, .. } => self.end_snapshot(t, id, rules, log),
            _ => SnapshotOutcome::Ongoing,
        }
    }

    /// Start receiving snapshot `id`; one already in progress is discarded.
    fn begin_snapshot(
        &mut self,
        t: u64,
        id: u32,
        announced: (u64, u64),
        at: Option<RingSpan>,
    ) -> SnapshotOutcome {
        let p = Pending::new(id, t, announced, at, &self.bounds);
        if p.broken {
            self.dropped.snapshots = self.dropped.snapshots.saturating_add(1);
        }
        let replaced = self.pending.replace(p);
        if replaced.is_some() {
            SnapshotOutcome::Discarded
        } else {
            SnapshotOutcome::Ongoing
        }
    }

    /// The snapshot in progress, when it is `id`.
    fn receiving(&mut self, id: u32) -> Option<&mut Pending> {
        self.pending.as_mut().filter(|p| p.id == id)
    }

    /// Finish the snapshot in progress: install it when complete.
    fn end_snapshot(
        &mut self,
        t: u64,
        id: u32,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        match self.pending.take() {
            None => SnapshotOutcome::Ongoing,
            Some(p) if p.complete(id) => self.install(p, t, rules, log),
            Some(_) => SnapshotOutcome::Discarded,
        }
    }

    /// While a snapshot is being received, keep an allocator event for
    /// replay on it.
    pub(super) fn buffer_for_replay(&mut self, t: u64, kind: &EventKind) {
        // A snapshot placed by positions takes its events from the
        // placement log instead.
        let placed = self.placement_in_use();
        if let Some(p) = self
            .pending
            .as_mut()
            .filter(|p| !(placed && p.at.is_some()))
        {
            if p.buffer(t, kind, self.bounds.replay) {
                self.dropped.replay = self.dropped.replay.saturating_add(1);
            }
        }
    }

    /// The snapshot in progress can no longer be complete (events were lost).
    pub(crate) fn taint_snapshot(&mut self) {
        if let Some(p) = &mut self.pending {
            p.broken = true;
        }
    }
}
