//! Applying allocator events (Alloc, FreeRequested, FreeCompleted,
//! SegmentAlloc, SegmentFree, SegmentMap, SegmentUnmap) to one device's
//! segments and blocks.
//!
//! Each event follows the allocator's own rules (split, merge, map, unmap).
//! An event the state contradicts is reported as a [`Problem`] and applied
//! with the most plausible repair, so that the totals stay close until a
//! snapshot replaces everything.

use super::blockmap::Pos;
use super::parts::{Applied, Block, Live, Problem, Segment};
use super::state::DeviceState;
use crate::model::origin::Origin;
use crate::model::rules::{self, BlockRules};
use vramscope_wire::event::{BlockState, EventKind, Place, SegmentPool};

impl DeviceState {
    /// Apply one allocator event (Alloc … SegmentUnmap); others are ignored.
    /// While a snapshot is being received the event is also kept for replay
    /// on it.
    pub(crate) fn apply(&mut self, t: u64, kind: &EventKind, rules: &BlockRules) -> Applied {
        self.buffer_for_replay(t, kind);
        self.apply_unbuffered(t, kind, rules)
    }

    /// Apply one allocator event to the state as it is.
    pub(super) fn apply_unbuffered(
        &mut self,
        t: u64,
        kind: &EventKind,
        rules: &BlockRules,
    ) -> Applied {
        let out = match *kind {
            EventKind::Alloc { place, addr, size } => self.alloc(t, &place, addr, size, rules),
            EventKind::FreeRequested { addr, .. } => self.free_requested(t, addr),
            EventKind::FreeCompleted { addr, .. } => self.free_completed(t, addr),
            EventKind::SegmentAlloc { place, addr, size } => {
                self.segment_alloc(t, &place, addr, size)
            }
            EventKind::SegmentFree { addr, size, .. } => self.segment_free(addr, size),
            EventKind::SegmentMap { place, addr, size } => self.segment_map(t, &place, addr, size),
            EventKind::SegmentUnmap { addr, size, .. } => self.segment_unmap(t, addr, size),
            _ => return Applied::default(),
        };
        self.after_change(t);
        out
    }

    // ---- blocks ----

    /// A tensor of `request` bytes at `addr`: carved from the start of the
    /// inactive block holding `addr`, the remainder split off when the
    /// rules allow it.
    fn alloc(
        &mut self,
        t: u64,
        place: &Place,
        addr: u64,
        request: u64,
        rules: &BlockRules,
    ) -> Applied {
        let n_blocks = self.blocks.len();
        let host = (self.blocks.find_le(addr)).filter(|&p| {
            let (start, b) = self.blocks.at(p);
            addr - start < b.size
        });
        let Some(p) = host else {
            return self.alloc_orphan(t, place, addr, request);
        };
        let start = self.blocks.at(p).0;
        let b = self.blocks.at_mut(p);
        if b.state != BlockState::Inactive {
            // The model missed a free: take the block over as it is.
            let (found, size) = (b.state, b.size);
            b.state = BlockState::Allocated;
            b.requested = request;
            b.since_ns = t;
            b.origin = Origin::of(place.ctx, self.step_now);
            let mut problem = Problem::BlockState { addr, found };
            if found == BlockState::PendingFree && !self.count_in(size, 0) {
                problem = Problem::Overflow { addr, size };
            }
            return Applied {
                live: Live::Up(request),
                problem: Some(problem),
            };
        }
        let template = *b;
        let offset = addr - start;
        let avail = template.size - offset;
        let size = rules.carve(request, avail, template.expandable);
        let grows = usize::from(offset > 0) + usize::from(size < avail);
        if grows > 0 && n_blocks + grows > self.bounds.blocks.max(1) {
            // The block bound: the allocation is not applied.
            self.dropped.blocks = self.dropped.blocks.saturating_add(1);
            self.desync();
            return Applied::default();
        }
        let mut problem = None;
        if offset > 0 {
            // Not at the block's start: the head before `addr` stays free.
            problem = Some(Problem::MisallocatedBlock { addr });
            self.blocks.at_mut(p).size = offset;
        }
        if rules::round_size(request) > avail {
            problem = Some(Problem::BlockTooSmall {
                addr,
                request,
                free: avail,
            });
        }
        let block = Block {
            size,
            requested: request,
            stream: place.stream,
            pool: place.pool,
            since_ns: t,
            state: BlockState::Allocated,
            origin: Origin::of(place.ctx, self.step_now),
            ..template
        };
        let at = if offset == 0 {
            *self.blocks.at_mut(p) = block;
            p
        } else {
            self.blocks.insert_after(p, addr, block)
        };
        if size < avail {
            let rest = Block {
                size: avail - size,
                requested: 0,
                since_ns: t,
                ..template
            };
            self.blocks.insert_after(at, addr + size, rest);
        }
        if !self.count_in(size, size) {
            problem = Some(Problem::Overflow { addr, size });
        }
        self.learn_pool_kind(template.segment, request);
        Applied {
            live: Live::Up(request),
            problem,
        }
    }

    /// An allocation in segment `segment` tells which pool the segment is
    /// in, when that was only a guess.
    fn learn_pool_kind(&mut self, segment: u64, request: u64) {
        if self.unknown_kind == 0 {
            return;
        }
        if let Some(s) = self.segments.get_mut(&segment) {
            if !s.pool_kind_known {
                s.pool_kind = rules::pool_for(rules::round_size(request));
                s.pool_kind_known = true;
                self.unknown_kind -= 1;
            }
        }
    }

    /// An allocation outside every known segment, kept as an orphan while
    /// fewer than the orphan bound are kept (else dropped and counted). One
    /// whose end would be past `u64::MAX` is cut there and flagged.
    fn alloc_orphan(&mut self, t: u64, place: &Place, addr: u64, request: u64) -> Applied {
        let rounded = rules::round_size(request);
        let (size, mut problem) = match addr.checked_add(rounded) {
            Some(_) => (rounded, Problem::BlockOutsideSegment { addr }),
            None => {
                self.overflowed();
                (
                    u64::MAX - addr,
                    Problem::Overflow {
                        addr,
                        size: rounded,
                    },
                )
            }
        };
        if self.orphans.len() >= self.bounds.orphans && !self.orphans.contains_key(&addr) {
            self.dropped.orphans = self.dropped.orphans.saturating_add(1);
            self.desync();
            return Applied::problem(problem);
        }
        let block = Block {
            size,
            requested: request,
            stream: place.stream,
            pool: place.pool,
            segment: addr,
            since_ns: t,
            state: BlockState::Allocated,
            expandable: false,
            origin: Origin::of(place.ctx, self.step_now),
        };
        if let Some(old) = self.orphans.insert(addr, block) {
            self.count_out(&old);
        }
        if !self.count_in(size, size) {
            problem = Problem::Overflow { addr, size };
        }
        Applied {
            live: Live::Up(request),
            problem: Some(problem),
        }
    }

    /// The tensor at `addr` was released; its block stays active until the
    /// streams that used it are done.
    fn free_requested(&mut self, t: u64, addr: u64) -> Applied {
        let b = match self.blocks.get_mut(&addr) {
            Some(b) => b,
            None => match self.orphans.get_mut(&addr) {
                Some(b) => b,
                None => return Applied::problem(Problem::UnknownBlock { addr }),
            },
        };
        if b.state != BlockState::Allocated {
            return Applied::problem(Problem::BlockState {
                addr,
                found: b.state,
            });
        }
        b.state = BlockState::PendingFree;
        b.since_ns = t;
        let (size, requested) = (b.size, b.requested);
        self.allocated = self.allocated.saturating_sub(size);
        Applied {
            live: Live::Down(requested),
            problem: None,
        }
    }

    /// The block at `addr` became inactive and merges with free neighbours.
    fn free_completed(&mut self, t: u64, addr: u64) -> Applied {
        let Some(p) = self.blocks.find(addr) else {
            return self.free_completed_orphan(addr);
        };
        let b = self.blocks.at_mut(p);
        let found = b.state;
        let live = match found {
            BlockState::Inactive => return Applied::problem(Problem::BlockState { addr, found }),
            BlockState::Allocated => {
                // The free request was missed.
                self.allocated = self.allocated.saturating_sub(b.size);
                Live::Down(b.requested)
            }
            BlockState::PendingFree => Live::None,
        };
        self.active = self.active.saturating_sub(b.size);
        b.state = BlockState::Inactive;
        b.requested = 0;
        b.since_ns = t;
        b.origin = Origin::default();
        self.merge_free_at(p);
        Applied {
            live,
            problem: (found == BlockState::Allocated)
                .then_some(Problem::BlockState { addr, found }),
        }
    }

    /// A completed free of an orphan: it is forgotten.
    fn free_completed_orphan(&mut self, addr: u64) -> Applied {
        let Some(b) = self.orphans.remove(&addr) else {
            return Applied::problem(Problem::UnknownBlock { addr });
        };
        self.count_out(&b);
        let problem = Problem::BlockState {
            addr,
            found: b.state,
        };
        match b.state {
            BlockState::Allocated => Applied {
                live: Live::Down(b.requested),
                problem: Some(problem),
            },
            BlockState::PendingFree => Applied::default(),
            BlockState::Inactive => Applied::problem(problem),
        }
    }

    /// Merge the inactive block at `addr` with inactive neighbours of the same segment.
    fn merge_free(&mut self, addr: u64) {
        if let Some(p) = self.blocks.find(addr) {
            self.merge_free_at(p);
        }
    }

    /// Merge the inactive block at `p` with inactive neighbours of the same
    /// segment (the blocks right before and after it in the map).
    fn merge_free_at(&mut self, p: Pos) {
        let (addr, &b) = self.blocks.at(p);
        if b.state != BlockState::Inactive {
            return;
        }
        let mut size = b.size;
        let end = addr.saturating_add(size);
        if let Some(n) = self.blocks.next(p) {
            let (na, nb) = self.blocks.at(n);
            if na == end && nb.state == BlockState::Inactive && nb.segment == b.segment {
                size += nb.size;
                // `p` is before `n`, so it stays valid.
                self.blocks.unlink(n);
            }
        }
        if let Some(q) = self.blocks.prev(p) {
            let (pa, pb) = self.blocks.at(q);
            if pa.saturating_add(pb.size) == addr
                && pb.state == BlockState::Inactive
                && pb.segment == b.segment
            {
                self.blocks.at_mut(q).size += size;
                self.blocks.unlink(p);
                return;
            }
        }
        self.blocks.at_mut(p).size = size;
    }

    /// Tag the blocks in `[from, end)` as belonging to segment `segment`.
    fn retag(&mut self, from: u64, end: u64, segment: u64) {
        self.blocks.update_range(from..end, |b| b.segment = segment);
    }

    // ---- segments ----

    /// Whether a segment and a block can be added within the bounds; if
    /// not, the event is dropped: counted, and the map no longer trusted.
    fn room_for_segment(&mut self) -> bool {
        let room = self.segments.len() < self.bounds.segments.max(1)
            && self.blocks.len() < self.bounds.blocks.max(1);
        if !room {
            self.dropped.segments = self.dropped.segments.saturating_add(1);
            self.desync();
        }
        room
    }

    /// The end of `[addr, addr + size)`, cut at `u64::MAX` (flagged, with
    /// the problem to report) when it is past it.
    fn range_end(&mut self, addr: u64, size: u64) -> (u64, Option<Problem>) {
        match addr.checked_add(size) {
            Some(end) => (end, None),
            None => {
                self.overflowed();
                (u64::MAX, Some(Problem::Overflow { addr, size }))
            }
        }
    }

    /// Add a segment entry (its blocks are the caller's), counting it while
    /// its pool kind is a guess.
    fn add_segment(&mut self, s: Segment) {
        if !s.pool_kind_known {
            self.unknown_kind += 1;
        }
        self.segments.insert(s.addr, s);
    }

    /// Remove a segment entry (not its blocks).
    fn take_segment(&mut self, addr: u64) -> Option<Segment> {
        let s = self.segments.remove(&addr)?;
        if !s.pool_kind_known {
            self.unknown_kind = self.unknown_kind.saturating_sub(1);
        }
        Some(s)
    }

    /// Remove a segment and its blocks; true when some block was in use.
    fn remove_segment(&mut self, addr: u64) -> bool {
        let Some(seg) = self.take_segment(addr) else {
            return false;
        };
        self.reserved = self.reserved.saturating_sub(seg.size);
        let keys: Vec<u64> = self
            .blocks
            .range(seg.addr..seg.end())
            .map(|(a, _)| *a)
            .collect();
        let mut in_use = false;
        for k in keys {
            if let Some(b) = self.blocks.remove(&k) {
                in_use |= b.state != BlockState::Inactive;
                self.count_out(&b);
            }
        }
        in_use
    }

    /// Addresses of the segments overlapping `[addr, end)`.
    fn overlapping(&self, addr: u64, end: u64) -> Vec<u64> {
        self.segments
            .range(..end)
            .rev()
            .take_while(|(_, s)| s.end() > addr)
            .map(|(a, _)| *a)
            .collect()
    }

    /// Make room for a new segment at `[addr, end)`: segments overlapping it
    /// are dropped (a contradiction), and so are the orphans inside it
    /// (superseded by the segment).
    fn clear_range(&mut self, addr: u64, end: u64) -> Option<Problem> {
        let over = self.overlapping(addr, end);
        let problem = (!over.is_empty()).then_some(Problem::OverlappingSegment { addr });
        for a in over {
            self.remove_segment(a);
        }
        if !self.orphans.is_empty() {
            let keys: Vec<u64> = self.orphans.range(addr..end).map(|(a, _)| *a).collect();
            for k in keys {
                if let Some(b) = self.orphans.remove(&k) {
                    self.count_out(&b);
                }
            }
        }
        problem
    }

    /// A new `cudaMalloc`ed segment: one inactive block. Its pool is guessed
    /// from its size until an allocation in it tells.
    fn segment_alloc(&mut self, t: u64, place: &Place, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::problem(Problem::SegmentSize {
                addr,
                expected: 0,
                found: 0,
            });
        }
        let (end, overflow) = self.range_end(addr, size);
        let size = end - addr;
        if size == 0 {
            return Applied::problem(overflow);
        }
        if !self.room_for_segment() {
            return Applied::problem(overflow);
        }
        let problem = self.clear_range(addr, end).or(overflow);
        let seg = Segment {
            addr,
            size,
            stream: place.stream,
            pool: place.pool,
            pool_kind: rules::segment_pool_guess(size),
            pool_kind_known: false,
            expandable: false,
        };
        self.add_segment(seg);
        self.blocks.insert(addr, Block::inactive(&seg, size, t));
        let fits = self.reserve(size);
        Applied::problem(if fits {
            problem
        } else {
            Some(Problem::Overflow { addr, size })
        })
    }

    /// A segment was `cudaFree`d, with its blocks.
    fn segment_free(&mut self, addr: u64, size: u64) -> Applied {
        let Some(seg) = self.segments.get(&addr).copied() else {
            return Applied::problem(Problem::UnknownSegment { addr });
        };
        let in_use = self.remove_segment(addr);
        if in_use {
            Applied::problem(Problem::SegmentInUse { addr })
        } else if seg.size != size {
            Applied::problem(Problem::SegmentSize {
                addr,
                expected: seg.size,
                found: size,
            })
        } else {
            Applied::default()
        }
    }

    /// Pages of an expandable segment were mapped at `[addr, addr + size)`:
    /// one inactive block, joined with mapped ranges of the same stream and
    /// pool that touch it on either side.
    fn segment_map(&mut self, t: u64, place: &Place, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::default();
        }
        let (end, overflow) = self.range_end(addr, size);
        let size = end - addr;
        if size == 0 || !self.room_for_segment() {
            return Applied::problem(overflow);
        }
        let problem = self.clear_range(addr, end).or(overflow);
        let joins = |s: &Segment| s.expandable && s.stream == place.stream && s.pool == place.pool;
        let left = self
            .segments
            .range_mut(..addr)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| s.end() == addr && joins(s));
        let seg = match left {
            Some(s) => {
                s.size += size;
                *s
            }
            None => {
                let s = Segment {
                    addr,
                    size,
                    stream: place.stream,
                    pool: place.pool,
                    pool_kind: SegmentPool::Large,
                    pool_kind_known: false,
                    expandable: true,
                };
                self.add_segment(s);
                s
            }
        };
        self.blocks.insert(addr, Block::inactive(&seg, size, t));
        let problem = if self.reserve(size) {
            problem
        } else {
            Some(Problem::Overflow { addr, size })
        };
        if self.segments.get(&end).is_some_and(joins) {
            self.absorb_right(seg.addr, end);
        }
        self.merge_free(addr);
        Applied::problem(problem)
    }

    /// Join the segment at `right` into segment `seg_addr`, which now ends
    /// where it starts.
    fn absorb_right(&mut self, seg_addr: u64, right: u64) {
        let Some(r) = self.take_segment(right) else {
            return;
        };
        if let Some(s) = self.segments.get_mut(&seg_addr) {
            s.size += r.size;
            if !s.pool_kind_known && r.pool_kind_known {
                s.pool_kind = r.pool_kind;
                s.pool_kind_known = true;
                self.unknown_kind = self.unknown_kind.saturating_sub(1);
            }
        }
        self.retag(r.addr, r.end(), seg_addr);
        self.merge_free(r.addr);
    }

    /// Pages of an expandable segment were unmapped at `[addr, addr + size)`:
    /// the range is cut out of its segment and blocks.
    fn segment_unmap(&mut self, t: u64, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::default();
        }
        let (end, overflow) = self.range_end(addr, size);
        let seg = self
            .segments
            .range(..=addr)
            .next_back()
            .map(|(_, s)| *s)
            .filter(|s| s.end() >= end);
        let Some(seg) = seg else {
            return Applied::problem(overflow.or(Some(Problem::UnknownSegment { addr })));
        };
        // A cut inside the segment adds a segment and may add a block.
        if addr > seg.addr && seg.end() > end && !self.room_for_segment() {
            return Applied::problem(overflow);
        }
        let in_use = self.cut_blocks(t, addr, end);
        self.reserved = self.reserved.saturating_sub(end - addr);
        self.cut_segment(seg, addr, end);
        if in_use {
            // Pieces left of a block that was in use may now touch free neighbours.
            let left = self.blocks.range(..addr).next_back().map(|(a, _)| *a);
            if let Some(a) = left {
                self.merge_free(a);
            }
            self.merge_free(end);
            Applied::problem(Problem::SegmentInUse { addr })
        } else if !seg.expandable {
            Applied::problem(Problem::UnknownSegment { addr })
        } else {
            Applied::default()
        }
    }

    /// Remove the blocks overlapping `[addr, end)`, keeping their parts
    /// outside it as inactive blocks; true when one of them was in use.
    fn cut_blocks(&mut self, t: u64, addr: u64, end: u64) -> bool {
        let keys: Vec<u64> = self
            .blocks
            .range(..end)
            .rev()
            .take_while(|(a, b)| a.saturating_add(b.size) > addr)
            .map(|(a, _)| *a)
            .collect();
        let mut in_use = false;
        for k in keys {
            let Some(b) = self.blocks.remove(&k) else {
                continue;
            };
            in_use |= b.state != BlockState::Inactive;
            self.count_out(&b);
            let piece = Block {
                requested: 0,
                state: BlockState::Inactive,
                since_ns: t,
                origin: Origin::default(),
                ..b
            };
            if k < addr {
                self.blocks.insert(
                    k,
                    Block {
                        size: addr - k,
                        ..piece
                    },
                );
            }
            let b_end = k.saturating_add(b.size);
            if b_end > end {
                self.blocks.insert(
                    end,
                    Block {
                        size: b_end - end,
                        ..piece
                    },
                );
            }
        }
        in_use
    }

    /// Cut `[addr, end)` out of segment `seg`: the part right of it becomes
    /// a segment of its own, the part left of it stays.
    fn cut_segment(&mut self, seg: Segment, addr: u64, end: u64) {
        if seg.end() > end {
            self.add_segment(Segment {
                addr: end,
                size: seg.end() - end,
                ..seg
            });
            self.retag(end, seg.end(), end);
        }
        if addr > seg.addr {
            if let Some(s) = self.segments.get_mut(&seg.addr) {
                s.size = addr - seg.addr;
            }
        } else {
            self.take_segment(seg.addr);
        }
    }
}
