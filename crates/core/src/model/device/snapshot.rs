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

use std::mem::size_of;

use super::{Block, DeviceState, Origin, Problem, Segment};
use crate::model::eventlog::EventLog;
use crate::model::rules::BlockRules;
use crate::model::Bounds;
use vramscope_wire::event::{BlockState, EventKind, Place, RingSpan, SegmentPool};

// The bounds (`Bounds::replay`, `Bounds::segments`, `Bounds::blocks`) say
// how many events are buffered for replay and how large a snapshot may be.

/// A snapshot being received.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    id: u32,
    /// When the snapshot began (the time given to its blocks).
    pub(super) time_ns: u64,
    want_segments: u64,
    want_blocks: u64,
    pub(super) segments: Vec<Segment>,
    pub(super) blocks: Vec<(u64, Block)>,
    /// The segment blocks currently attach to.
    cursor: Option<Cursor>,
    broken: bool,
    /// The replay bound was reached: events are no longer kept.
    overflowed: bool,
    /// Allocator events received since the snapshot began.
    pub(super) replay: Vec<(u64, EventKind)>,
    /// Where the snapshot sits in the device's ring (1.1 producers).
    pub(super) at: Option<RingSpan>,
}

/// The segment the next blocks belong to, and where the next block may start.
#[derive(Debug, Clone, Copy)]
struct Cursor {
    segment: Segment,
    next: u64,
}

/// Result of feeding a snapshot record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SnapshotOutcome {
    /// Nothing finished.
    Ongoing,
    /// A complete snapshot was installed; the replay of events received
    /// meanwhile found this many problems.
    Installed {
        replay_problems: u32,
        first_problem: Option<Problem>,
    },
    /// The snapshot was incomplete or malformed and was dropped.
    Discarded,
}

impl Pending {
    /// A snapshot announcing `want_segments` and `want_blocks`; broken at
    /// once when that is more than the bounds allow.
    fn new(
        id: u32,
        time_ns: u64,
        (want_segments, want_blocks): (u64, u64),
        at: Option<RingSpan>,
        bounds: &Bounds,
    ) -> Self {
        let too_large =
            want_segments > bounds.segments as u64 || want_blocks > bounds.blocks as u64;
        Self {
            id,
            time_ns,
            want_segments,
            want_blocks,
            segments: Vec::new(),
            blocks: Vec::new(),
            cursor: None,
            broken: too_large,
            overflowed: false,
            replay: Vec::new(),
            at,
        }
    }

    /// Keep an allocator event for replay, or give up when `max` are kept;
    /// true when the event was dropped for that bound.
    fn buffer(&mut self, t: u64, kind: &EventKind, max: usize) -> bool {
        if self.overflowed {
            return true;
        }
        if self.broken {
            return false;
        }
        if self.replay.len() >= max {
            self.broken = true;
            self.overflowed = true;
            // Nothing will be replayed: give the memory back now.
            self.replay = Vec::new();
            true
        } else {
            self.replay.push((t, *kind));
            false
        }
    }

    fn add_segment(
        &mut self,
        place: &Place,
        addr: u64,
        size: u64,
        pool_kind: SegmentPool,
        expandable: bool,
    ) {
        let valid = size > 0 && addr.checked_add(size).is_some();
        if !valid || self.segments.len() as u64 >= self.want_segments {
            self.broken = true;
            return;
        }
        let segment = Segment {
            addr,
            size,
            stream: place.stream,
            pool: place.pool,
            pool_kind,
            pool_kind_known: true,
            expandable,
        };
        self.segments.push(segment);
        self.cursor = Some(Cursor {
            segment,
            next: addr,
        });
    }

    /// Add a block of the segment last received.
    fn add_block(
        &mut self,
        addr: u64,
        size: u64,
        requested: u64,
        state: BlockState,
        origin: Origin,
    ) {
        let Some(Cursor { segment: seg, next }) = self.cursor else {
            self.broken = true;
            return;
        };
        let fits =
            size > 0 && addr >= next && addr.checked_add(size).is_some_and(|e| e <= seg.end());
        if !fits || self.blocks.len() as u64 >= self.want_blocks {
            self.broken = true;
            return;
        }
        let requested = if state == BlockState::Inactive {
            0
        } else {
            requested
        };
        self.blocks.push((
            addr,
            Block {
                size,
                requested,
                stream: seg.stream,
                pool: seg.pool,
                segment: seg.addr,
                since_ns: self.time_ns,
                state,
                expandable: seg.expandable,
                origin,
            },
        ));
        self.cursor = Some(Cursor {
            segment: seg,
            next: addr + size,
        });
    }

    /// Whether the snapshot `id` ends complete: every announced record
    /// received and none rejected.
    fn complete(&self, id: u32) -> bool {
        self.id == id
            && !self.broken
            && self.segments.len() as u64 == self.want_segments
            && self.blocks.len() as u64 == self.want_blocks
    }

    pub(super) fn memory_bytes(&self) -> usize {
        self.segments.capacity() * size_of::<Segment>()
            + self.blocks.capacity() * size_of::<(u64, Block)>()
            + self.replay.capacity() * size_of::<(u64, EventKind)>()
    }
}

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
