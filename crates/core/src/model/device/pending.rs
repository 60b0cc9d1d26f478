//! A state snapshot of one device while it is being received:
//! `SnapshotBegin`, its `SnapshotSegment` and `SnapshotBlock` records, then
//! `SnapshotEnd`. Each record is checked as it arrives (see `snapshot`).

use std::mem::size_of;

use super::parts::{Block, Problem, Segment};
use crate::model::config::Bounds;
use crate::model::origin::Origin;
use vramscope_wire::event::{BlockState, EventKind, Place, RingSpan, SegmentPool};

// The bounds (`Bounds::replay`, `Bounds::segments`, `Bounds::blocks`) say
// how many events are buffered for replay and how large a snapshot may be.

/// A snapshot being received.
#[derive(Debug, Clone)]
pub(super) struct Pending {
    pub(super) id: u32,
    /// When the snapshot began (the time given to its blocks).
    pub(super) time_ns: u64,
    pub(super) want_segments: u64,
    pub(super) want_blocks: u64,
    pub(super) segments: Vec<Segment>,
    pub(super) blocks: Vec<(u64, Block)>,
    /// The segment blocks currently attach to.
    pub(super) cursor: Option<Cursor>,
    pub(super) broken: bool,
    /// The replay bound was reached: events are no longer kept.
    pub(super) overflowed: bool,
    /// Allocator events received since the snapshot began.
    pub(super) replay: Vec<(u64, EventKind)>,
    /// Where the snapshot sits in the device's ring (1.1 producers).
    pub(super) at: Option<RingSpan>,
}

/// The segment the next blocks belong to, and where the next block may start.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cursor {
    pub(super) segment: Segment,
    pub(super) next: u64,
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
    pub(super) fn new(
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
    pub(super) fn buffer(&mut self, t: u64, kind: &EventKind, max: usize) -> bool {
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

    pub(super) fn add_segment(
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
    pub(super) fn add_block(
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
    pub(super) fn complete(&self, id: u32) -> bool {
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
