//! One device allocator's state inside one process: segments and blocks,
//! rebuilt from events and re-synchronised from complete snapshots.
//!
//! Invariants (kept by every operation, checked by the tests):
//! - segments never overlap;
//! - the blocks of a segment tile it exactly (allocated, pending-free and
//!   inactive blocks together), and no two adjacent inactive blocks of one
//!   segment stay unmerged after a free completes;
//! - `allocated`, `active` and `reserved` equal the sums over the maps.
//!
//! Blocks seen in events but outside every known segment (e.g. from segments
//! created before the tracker attached) are kept apart as *orphans*, so the
//! allocated total stays right until the next snapshot replaces everything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rules::{self, BlockRules};
use super::series::{Series, SeriesConfig};
use crate::event::{BlockState, EventKind, Place, PoolId, SegmentPool, Stats};

/// A `cudaMalloc`ed segment, or one contiguous mapped range of an expandable
/// segment (the same unit `torch.cuda.memory_snapshot()` reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub addr: u64,
    /// Bytes backed by device memory: the whole segment, or for an
    /// expandable segment the mapped extent.
    pub size: u64,
    pub stream: u64,
    pub pool: PoolId,
    pub pool_kind: SegmentPool,
    /// False while `pool_kind` is only a guess from the segment size.
    pub pool_kind_known: bool,
    pub expandable: bool,
}

impl Segment {
    pub fn end(&self) -> u64 {
        self.addr.saturating_add(self.size)
    }
}

/// A block; its address is the key of the map that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Block {
    /// The block's size (the rounded request, or the whole free block when
    /// the remainder was too small to split off).
    pub size: u64,
    /// The caller's request (0 for inactive blocks).
    pub requested: u64,
    pub stream: u64,
    pub pool: PoolId,
    /// Address of the segment holding the block (for orphans: the block's own).
    pub segment: u64,
    /// When the block entered its current state (allocation time for
    /// allocated blocks; the snapshot time for blocks learnt from a snapshot).
    pub since_ns: u64,
    pub state: BlockState,
    pub expandable: bool,
}

/// An event that contradicts the model. Each one is counted and asks for a
/// resync; the model keeps going with its best repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Problem {
    /// A free of an address that holds no block.
    UnknownBlock { addr: u64 },
    /// An allocation outside every known segment (kept as an orphan).
    BlockOutsideSegment { addr: u64 },
    /// A block was not in the state the event implies.
    BlockState { addr: u64, found: BlockState },
    /// An allocation inside a free block rather than at its start.
    MisallocatedBlock { addr: u64 },
    /// An allocation larger than the free block it landed in.
    BlockTooSmall { addr: u64, request: u64, free: u64 },
    /// A segment free or unmap of an address that is no known segment.
    UnknownSegment { addr: u64 },
    /// A segment free whose size differs from the segment's.
    SegmentSize {
        addr: u64,
        expected: u64,
        found: u64,
    },
    /// A segment freed or unmapped while blocks in it were still in use.
    SegmentInUse { addr: u64 },
    /// A new segment overlapping known ones (those are dropped).
    OverlappingSegment { addr: u64 },
    /// The allocator's own statistics kept disagreeing with the block map.
    Drift {
        model_allocated: u64,
        stats_allocated: u64,
    },
}

/// What an applied event did to live tensor counts (for leak analysis).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Live {
    #[default]
    None,
    /// A tensor of this requested size came to life.
    Up(u64),
    /// A tensor of this requested size was released.
    Down(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Applied {
    pub live: Live,
    pub problem: Option<Problem>,
}

impl Applied {
    fn problem(p: Problem) -> Self {
        Self {
            live: Live::None,
            problem: Some(p),
        }
    }
}

/// Figures summed from the block map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Derived {
    pub allocated: u64,
    pub active: u64,
    pub reserved: u64,
}

/// Fragmentation figures computed from the block map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BlockSummary {
    /// Inactive bytes in segments that are split (cached but not releasable).
    pub inactive_split: u64,
    pub largest_free_small: Option<u64>,
    pub largest_free_large: Option<u64>,
    pub free_blocks: u64,
    pub blocks: u64,
    pub segments: u64,
}

/// How many past (allocated, reserved) totals a stats sample may match.
const TOTALS_RING: usize = 16;
/// Consecutive mismatching stats samples before the model calls it drift.
const DRIFT_SAMPLES: u32 = 3;
/// Events buffered during a snapshot for replay; beyond this the snapshot
/// is given up.
const MAX_REPLAY: usize = 1 << 20;
/// Upper bound on what a snapshot may announce (untrusted input).
const MAX_SNAPSHOT_ITEMS: u64 = 1 << 26;

/// A snapshot being received.
#[derive(Debug, Clone)]
struct Pending {
    id: u32,
    time_ns: u64,
    want_segments: u64,
    want_blocks: u64,
    segments: Vec<Segment>,
    blocks: Vec<(u64, Block)>,
    /// The segment blocks currently attach to, and where the next block may start.
    current: Option<(u64, u64, u64)>,
    broken: bool,
    replay: Vec<(u64, EventKind)>,
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

/// The state of one device allocator.
#[derive(Debug, Clone)]
pub struct DeviceState {
    device: u16,
    segments: BTreeMap<u64, Segment>,
    blocks: BTreeMap<u64, Block>,
    orphans: BTreeMap<u64, Block>,
    allocated: u64,
    active: u64,
    reserved: u64,
    unknown_kind: usize,
    /// A complete snapshot was installed and nothing contradicted it since.
    synced: bool,
    pending: Option<Pending>,
    stats: Option<(u64, Stats)>,
    totals: [(u64, u64); TOTALS_RING],
    totals_pos: usize,
    drift: u32,
    peaks: Derived,
    pub(crate) series: DeviceSeries,
}

/// The timelines of one device.
#[derive(Debug, Clone)]
pub struct DeviceSeries {
    pub allocated: Series,
    pub reserved: Series,
    pub active: Series,
}

impl DeviceState {
    pub(crate) fn new(device: u16, series: &SeriesConfig) -> Self {
        Self {
            device,
            segments: BTreeMap::new(),
            blocks: BTreeMap::new(),
            orphans: BTreeMap::new(),
            allocated: 0,
            active: 0,
            reserved: 0,
            unknown_kind: 0,
            synced: false,
            pending: None,
            stats: None,
            totals: [(u64::MAX, u64::MAX); TOTALS_RING],
            totals_pos: 0,
            drift: 0,
            peaks: Derived::default(),
            series: DeviceSeries {
                allocated: Series::new(series.clone()),
                reserved: Series::new(series.clone()),
                active: Series::new(series.clone()),
            },
        }
    }

    pub fn device(&self) -> u16 {
        self.device
    }
    /// Segments in address order.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }
    /// All blocks inside segments, in address order.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.blocks.iter().map(|(a, b)| (*a, b))
    }
    /// The blocks of one segment, in address order.
    pub fn blocks_of<'a>(&'a self, seg: &Segment) -> impl Iterator<Item = (u64, &'a Block)> + 'a {
        self.blocks.range(seg.addr..seg.end()).map(|(a, b)| (*a, b))
    }
    /// Allocated blocks seen outside every known segment.
    pub fn orphans(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.orphans.iter().map(|(a, b)| (*a, b))
    }
    /// Totals over the block map.
    pub fn derived(&self) -> Derived {
        Derived {
            allocated: self.allocated,
            active: self.active,
            reserved: self.reserved,
        }
    }
    /// Peaks of the derived totals since the last reset.
    pub fn derived_peaks(&self) -> Derived {
        self.peaks
    }
    /// The last statistics sample and its time.
    pub fn stats(&self) -> Option<(u64, &Stats)> {
        self.stats.as_ref().map(|(t, s)| (*t, s))
    }
    /// True when a complete snapshot was installed and nothing contradicted it since.
    pub fn synced(&self) -> bool {
        self.synced
    }
    pub fn snapshot_in_progress(&self) -> bool {
        self.pending.is_some()
    }

    pub(crate) fn desync(&mut self) {
        self.synced = false;
    }
    pub(crate) fn taint_snapshot(&mut self) {
        if let Some(p) = &mut self.pending {
            p.broken = true;
        }
    }
    pub(crate) fn reset_peaks(&mut self) {
        self.peaks = self.derived();
    }

    /// Record the current totals (after an event changed the block map),
    /// and feed the timelines when the map is trusted.
    #[inline]
    pub(crate) fn after_change(&mut self, t: u64) {
        self.totals[self.totals_pos] = (self.allocated, self.reserved);
        self.totals_pos = (self.totals_pos + 1) % TOTALS_RING;
        self.peaks.allocated = self.peaks.allocated.max(self.allocated);
        self.peaks.active = self.peaks.active.max(self.active);
        self.peaks.reserved = self.peaks.reserved.max(self.reserved);
        if self.synced || self.stats.is_none() {
            self.series.allocated.push(t, self.allocated);
            self.series.reserved.push(t, self.reserved);
            self.series.active.push(t, self.active);
        }
    }

    /// Take a statistics sample. Returns a drift problem when the block map
    /// disagreed with the allocator's own figures several samples in a row
    /// (only checked while synced and exact).
    pub(crate) fn note_stats(
        &mut self,
        t: u64,
        stats: Stats,
        check_drift: bool,
    ) -> Option<Problem> {
        self.stats = Some((t, stats));
        if !self.synced {
            self.series.allocated.push(t, stats.allocated);
            self.series.reserved.push(t, stats.reserved);
            self.series.active.push(t, stats.active);
            self.drift = 0;
            return None;
        }
        if !check_drift || self.pending.is_some() {
            return None;
        }
        let seen = (stats.allocated, stats.reserved);
        if self.totals.contains(&seen) || seen == (self.allocated, self.reserved) {
            self.drift = 0;
            return None;
        }
        self.drift += 1;
        if self.drift >= DRIFT_SAMPLES {
            self.drift = 0;
            return Some(Problem::Drift {
                model_allocated: self.allocated,
                stats_allocated: stats.allocated,
            });
        }
        None
    }

    fn count_out(&mut self, b: &Block) {
        match b.state {
            BlockState::Allocated => {
                self.allocated = self.allocated.saturating_sub(b.size);
                self.active = self.active.saturating_sub(b.size);
            }
            BlockState::PendingFree => self.active = self.active.saturating_sub(b.size),
            BlockState::Inactive => {}
        }
    }

    /// Apply one allocator event (Alloc … SegmentUnmap); others are ignored.
    pub(crate) fn apply(&mut self, t: u64, kind: &EventKind, rules: &BlockRules) -> Applied {
        if let Some(p) = &mut self.pending {
            if !p.broken {
                if p.replay.len() >= MAX_REPLAY {
                    p.broken = true;
                } else {
                    p.replay.push((t, kind.clone()));
                }
            }
        }
        self.apply_inner(t, kind, rules)
    }

    fn apply_inner(&mut self, t: u64, kind: &EventKind, rules: &BlockRules) -> Applied {
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

    fn alloc(
        &mut self,
        t: u64,
        place: &Place,
        addr: u64,
        request: u64,
        rules: &BlockRules,
    ) -> Applied {
        let mut out = Applied {
            live: Live::Up(request),
            problem: None,
        };
        let Some((&start, b)) = self.blocks.range_mut(..=addr).next_back() else {
            return self.alloc_orphan(t, place, addr, request);
        };
        if addr - start >= b.size {
            return self.alloc_orphan(t, place, addr, request);
        }
        if b.state != BlockState::Inactive {
            // The model missed a free: take the block over as it is.
            out.problem = Some(Problem::BlockState {
                addr,
                found: b.state,
            });
            if b.state == BlockState::PendingFree {
                self.allocated += b.size;
            }
            b.state = BlockState::Allocated;
            b.requested = request;
            b.since_ns = t;
            return out;
        }
        let template = *b;
        let avail = if addr != start {
            out.problem = Some(Problem::MisallocatedBlock { addr });
            b.size = addr - start;
            template.size - (addr - start)
        } else {
            template.size
        };
        let size = rules.carve(request, avail, template.expandable);
        if rules::round_size(request) > avail {
            out.problem = Some(Problem::BlockTooSmall {
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
            ..template
        };
        if addr == start {
            *b = block;
        } else {
            self.blocks.insert(addr, block);
        }
        if size < avail {
            let rest = Block {
                size: avail - size,
                requested: 0,
                since_ns: t,
                ..template
            };
            self.blocks.insert(addr + size, rest);
        }
        self.allocated += size;
        self.active += size;
        if self.unknown_kind > 0 {
            if let Some(s) = self.segments.get_mut(&template.segment) {
                if !s.pool_kind_known {
                    s.pool_kind = rules::pool_for(rules::round_size(request));
                    s.pool_kind_known = true;
                    self.unknown_kind -= 1;
                }
            }
        }
        out
    }

    fn alloc_orphan(&mut self, t: u64, place: &Place, addr: u64, request: u64) -> Applied {
        let size = rules::round_size(request);
        let block = Block {
            size,
            requested: request,
            stream: place.stream,
            pool: place.pool,
            segment: addr,
            since_ns: t,
            state: BlockState::Allocated,
            expandable: false,
        };
        if let Some(old) = self.orphans.insert(addr, block) {
            self.count_out(&old);
        }
        self.allocated += size;
        self.active += size;
        Applied {
            live: Live::Up(request),
            problem: Some(Problem::BlockOutsideSegment { addr }),
        }
    }

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

    fn free_completed(&mut self, t: u64, addr: u64) -> Applied {
        let Some(b) = self.blocks.get_mut(&addr) else {
            return match self.orphans.remove(&addr) {
                Some(b) => {
                    self.count_out(&b);
                    match b.state {
                        BlockState::Allocated => Applied {
                            live: Live::Down(b.requested),
                            problem: Some(Problem::BlockState {
                                addr,
                                found: b.state,
                            }),
                        },
                        BlockState::PendingFree => Applied::default(),
                        BlockState::Inactive => Applied::problem(Problem::BlockState {
                            addr,
                            found: b.state,
                        }),
                    }
                }
                None => Applied::problem(Problem::UnknownBlock { addr }),
            };
        };
        let mut out = Applied::default();
        match b.state {
            BlockState::Inactive => {
                return Applied::problem(Problem::BlockState {
                    addr,
                    found: BlockState::Inactive,
                })
            }
            BlockState::Allocated => {
                // The free request was missed.
                out = Applied {
                    live: Live::Down(b.requested),
                    problem: Some(Problem::BlockState {
                        addr,
                        found: BlockState::Allocated,
                    }),
                };
                self.allocated = self.allocated.saturating_sub(b.size);
            }
            BlockState::PendingFree => {}
        }
        self.active = self.active.saturating_sub(b.size);
        b.state = BlockState::Inactive;
        b.requested = 0;
        b.since_ns = t;
        self.merge_free(addr);
        out
    }

    /// Merge the inactive block at `addr` with inactive neighbours of the same segment.
    fn merge_free(&mut self, addr: u64) {
        let Some(&b) = self.blocks.get(&addr) else {
            return;
        };
        if b.state != BlockState::Inactive {
            return;
        }
        let mut size = b.size;
        let end = addr.saturating_add(size);
        if let Some(n) = self.blocks.get(&end) {
            if n.state == BlockState::Inactive && n.segment == b.segment {
                size += n.size;
                self.blocks.remove(&end);
            }
        }
        if let Some((&pa, p)) = self.blocks.range_mut(..addr).next_back() {
            if pa.saturating_add(p.size) == addr
                && p.state == BlockState::Inactive
                && p.segment == b.segment
            {
                p.size += size;
                self.blocks.remove(&addr);
                return;
            }
        }
        if let Some(me) = self.blocks.get_mut(&addr) {
            me.size = size;
        }
    }

    /// Addresses of the segments overlapping `[addr, end)`.
    fn overlapping(&self, addr: u64, end: u64) -> Vec<u64> {
        let mut v = Vec::new();
        for (&a, s) in self.segments.range(..end).rev() {
            if s.end() > addr {
                v.push(a);
            } else {
                break;
            }
        }
        v
    }

    /// Remove a segment and its blocks; true when some block was in use.
    fn remove_segment(&mut self, addr: u64) -> bool {
        let Some(seg) = self.segments.remove(&addr) else {
            return false;
        };
        if !seg.pool_kind_known {
            self.unknown_kind = self.unknown_kind.saturating_sub(1);
        }
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

    /// Drop orphans inside `[addr, end)` (superseded by a segment there).
    fn drop_orphans(&mut self, addr: u64, end: u64) {
        if self.orphans.is_empty() {
            return;
        }
        let keys: Vec<u64> = self.orphans.range(addr..end).map(|(a, _)| *a).collect();
        for k in keys {
            if let Some(b) = self.orphans.remove(&k) {
                self.count_out(&b);
            }
        }
    }

    fn drop_overlapping(&mut self, addr: u64, end: u64) -> Option<Problem> {
        let over = self.overlapping(addr, end);
        if over.is_empty() {
            return None;
        }
        for a in over {
            self.remove_segment(a);
        }
        Some(Problem::OverlappingSegment { addr })
    }

    fn segment_alloc(&mut self, t: u64, place: &Place, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::problem(Problem::SegmentSize {
                addr,
                expected: 0,
                found: 0,
            });
        }
        let end = addr.saturating_add(size);
        let size = end - addr;
        let problem = self.drop_overlapping(addr, end);
        self.drop_orphans(addr, end);
        self.segments.insert(
            addr,
            Segment {
                addr,
                size,
                stream: place.stream,
                pool: place.pool,
                pool_kind: rules::segment_pool_guess(size),
                pool_kind_known: false,
                expandable: false,
            },
        );
        self.unknown_kind += 1;
        self.blocks.insert(
            addr,
            Block {
                size,
                requested: 0,
                stream: place.stream,
                pool: place.pool,
                segment: addr,
                since_ns: t,
                state: BlockState::Inactive,
                expandable: false,
            },
        );
        self.reserved += size;
        Applied {
            live: Live::None,
            problem,
        }
    }

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

    fn retag(&mut self, from: u64, end: u64, segment: u64) {
        for b in self.blocks.range_mut(from..end).map(|(_, b)| b) {
            b.segment = segment;
        }
    }

    fn segment_map(&mut self, t: u64, place: &Place, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::default();
        }
        let end = addr.saturating_add(size);
        let size = end - addr;
        let problem = self.drop_overlapping(addr, end);
        self.drop_orphans(addr, end);
        let joins = |s: &Segment| s.expandable && s.stream == place.stream && s.pool == place.pool;
        let left = self
            .segments
            .range(..addr)
            .next_back()
            .filter(|(_, s)| s.end() == addr && joins(s))
            .map(|(a, _)| *a);
        let seg_addr = match left.and_then(|a| self.segments.get_mut(&a)) {
            Some(s) => {
                s.size += size;
                s.addr
            }
            None => {
                self.segments.insert(
                    addr,
                    Segment {
                        addr,
                        size,
                        stream: place.stream,
                        pool: place.pool,
                        pool_kind: SegmentPool::Large,
                        pool_kind_known: false,
                        expandable: true,
                    },
                );
                self.unknown_kind += 1;
                addr
            }
        };
        self.blocks.insert(
            addr,
            Block {
                size,
                requested: 0,
                stream: place.stream,
                pool: place.pool,
                segment: seg_addr,
                since_ns: t,
                state: BlockState::Inactive,
                expandable: true,
            },
        );
        self.reserved += size;
        if let Some(right) = self.segments.get(&end).copied().filter(joins) {
            self.segments.remove(&end);
            if !right.pool_kind_known {
                self.unknown_kind = self.unknown_kind.saturating_sub(1);
            }
            let mut known = None;
            if let Some(s) = self.segments.get_mut(&seg_addr) {
                s.size += right.size;
                if !s.pool_kind_known && right.pool_kind_known {
                    s.pool_kind = right.pool_kind;
                    s.pool_kind_known = true;
                    known = Some(());
                }
            }
            if known.is_some() {
                self.unknown_kind = self.unknown_kind.saturating_sub(1);
            }
            self.retag(end, right.end(), seg_addr);
            self.merge_free(end);
        }
        self.merge_free(addr);
        Applied {
            live: Live::None,
            problem,
        }
    }

    fn segment_unmap(&mut self, t: u64, addr: u64, size: u64) -> Applied {
        if size == 0 {
            return Applied::default();
        }
        let end = addr.saturating_add(size);
        let seg = self
            .segments
            .range(..=addr)
            .next_back()
            .map(|(_, s)| *s)
            .filter(|s| s.end() >= end);
        let Some(seg) = seg else {
            return Applied::problem(Problem::UnknownSegment { addr });
        };
        let mut problem = None;
        let keys: Vec<u64> = self
            .blocks
            .range(..end)
            .rev()
            .take_while(|(a, b)| a.saturating_add(b.size) > addr)
            .map(|(a, _)| *a)
            .collect();
        for k in keys {
            let Some(b) = self.blocks.remove(&k) else {
                continue;
            };
            if b.state != BlockState::Inactive {
                problem = Some(Problem::SegmentInUse { addr });
            }
            self.count_out(&b);
            let piece = Block {
                requested: 0,
                state: BlockState::Inactive,
                since_ns: t,
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
        self.reserved = self.reserved.saturating_sub(size);
        if seg.end() > end {
            self.segments.insert(
                end,
                Segment {
                    addr: end,
                    size: seg.end() - end,
                    ..seg
                },
            );
            if !seg.pool_kind_known {
                self.unknown_kind += 1;
            }
            self.retag(end, seg.end(), end);
        }
        if addr > seg.addr {
            if let Some(s) = self.segments.get_mut(&seg.addr) {
                s.size = addr - seg.addr;
            }
        } else {
            self.segments.remove(&seg.addr);
            if !seg.pool_kind_known {
                self.unknown_kind = self.unknown_kind.saturating_sub(1);
            }
        }
        // Pieces left of a block that was in use may now touch free neighbours.
        if problem.is_some() {
            if let Some((&a, _)) = self.blocks.range(..addr).next_back() {
                self.merge_free(a);
            }
            self.merge_free(end);
        }
        if !seg.expandable && problem.is_none() {
            problem = Some(Problem::UnknownSegment { addr });
        }
        Applied {
            live: Live::None,
            problem,
        }
    }

    /// Feed one snapshot record (SnapshotBegin … SnapshotEnd for this device).
    pub(crate) fn snapshot(
        &mut self,
        t: u64,
        kind: &EventKind,
        rules: &BlockRules,
    ) -> SnapshotOutcome {
        match *kind {
            EventKind::SnapshotBegin {
                id,
                segments,
                blocks,
                ..
            } => {
                let broken = segments > MAX_SNAPSHOT_ITEMS || blocks > MAX_SNAPSHOT_ITEMS;
                let replaced = self.pending.replace(Pending {
                    id,
                    time_ns: t,
                    want_segments: segments,
                    want_blocks: blocks,
                    segments: Vec::new(),
                    blocks: Vec::new(),
                    current: None,
                    broken,
                    replay: Vec::new(),
                });
                if replaced.is_some() {
                    SnapshotOutcome::Discarded
                } else {
                    SnapshotOutcome::Ongoing
                }
            }
            EventKind::SnapshotSegment {
                id,
                place,
                addr,
                size,
                pool_kind,
                expandable,
            } => {
                let Some(p) = self.pending.as_mut().filter(|p| p.id == id) else {
                    return SnapshotOutcome::Ongoing;
                };
                let end = addr.checked_add(size);
                if size == 0 || end.is_none() || p.segments.len() as u64 >= p.want_segments {
                    p.broken = true;
                    return SnapshotOutcome::Ongoing;
                }
                p.segments.push(Segment {
                    addr,
                    size,
                    stream: place.stream,
                    pool: place.pool,
                    pool_kind,
                    pool_kind_known: true,
                    expandable,
                });
                p.current = Some((addr, addr + size, addr));
                SnapshotOutcome::Ongoing
            }
            EventKind::SnapshotBlock {
                id,
                addr,
                size,
                requested,
                state,
                ..
            } => {
                let Some(p) = self.pending.as_mut().filter(|p| p.id == id) else {
                    return SnapshotOutcome::Ongoing;
                };
                let Some((seg_addr, seg_end, next)) = p.current else {
                    p.broken = true;
                    return SnapshotOutcome::Ongoing;
                };
                let fits = size > 0
                    && addr >= next
                    && addr.checked_add(size).is_some_and(|e| e <= seg_end);
                if !fits || p.blocks.len() as u64 >= p.want_blocks {
                    p.broken = true;
                    return SnapshotOutcome::Ongoing;
                }
                let seg = p.segments.last().copied();
                let (stream, pool, expandable) = seg
                    .map(|s| (s.stream, s.pool, s.expandable))
                    .unwrap_or_default();
                let requested = if state == BlockState::Inactive {
                    0
                } else {
                    requested
                };
                p.blocks.push((
                    addr,
                    Block {
                        size,
                        requested,
                        stream,
                        pool,
                        segment: seg_addr,
                        since_ns: p.time_ns,
                        state,
                        expandable,
                    },
                ));
                p.current = Some((seg_addr, seg_end, addr + size));
                SnapshotOutcome::Ongoing
            }
            EventKind::SnapshotEnd { id, .. } => {
                let Some(p) = self.pending.take() else {
                    return SnapshotOutcome::Ongoing;
                };
                let complete = p.id == id
                    && !p.broken
                    && p.segments.len() as u64 == p.want_segments
                    && p.blocks.len() as u64 == p.want_blocks;
                if !complete {
                    return SnapshotOutcome::Discarded;
                }
                self.install(p, t, rules)
            }
            _ => SnapshotOutcome::Ongoing,
        }
    }

    fn install(&mut self, p: Pending, t: u64, rules: &BlockRules) -> SnapshotOutcome {
        let mut segments = BTreeMap::new();
        let mut last_end = 0u64;
        let mut sorted = p.segments;
        sorted.sort_by_key(|s| s.addr);
        for (i, s) in sorted.iter().enumerate() {
            if i > 0 && s.addr < last_end {
                return SnapshotOutcome::Discarded;
            }
            last_end = s.end();
            segments.insert(s.addr, *s);
        }
        let given: BTreeMap<u64, Block> = p.blocks.into_iter().collect();
        // Fill gaps so the blocks tile every segment, and merge adjacent
        // inactive blocks as the allocator would have.
        let mut tiled: Vec<(u64, Block)> = Vec::with_capacity(given.len() + segments.len());
        for s in segments.values() {
            let filler = Block {
                size: 0,
                requested: 0,
                stream: s.stream,
                pool: s.pool,
                segment: s.addr,
                since_ns: p.time_ns,
                state: BlockState::Inactive,
                expandable: s.expandable,
            };
            let push = |tiled: &mut Vec<(u64, Block)>, a: u64, b: Block| match tiled.last_mut() {
                Some((la, lb))
                    if lb.segment == s.addr
                        && lb.state == BlockState::Inactive
                        && b.state == BlockState::Inactive
                        && *la + lb.size == a =>
                {
                    lb.size += b.size
                }
                _ => tiled.push((a, b)),
            };
            let mut at = s.addr;
            for (&a, b) in given.range(s.addr..s.end()) {
                if a > at {
                    push(
                        &mut tiled,
                        at,
                        Block {
                            size: a - at,
                            ..filler
                        },
                    );
                }
                push(
                    &mut tiled,
                    a,
                    Block {
                        segment: s.addr,
                        ..*b
                    },
                );
                at = a + b.size;
            }
            if at < s.end() {
                push(
                    &mut tiled,
                    at,
                    Block {
                        size: s.end() - at,
                        ..filler
                    },
                );
            }
        }
        let blocks: BTreeMap<u64, Block> = tiled.into_iter().collect();
        self.segments = segments;
        self.blocks = blocks;
        self.orphans.clear();
        self.unknown_kind = 0;
        self.reserved = self.segments.values().map(|s| s.size).sum();
        self.allocated = 0;
        self.active = 0;
        for b in self.blocks.values() {
            match b.state {
                BlockState::Allocated => {
                    self.allocated += b.size;
                    self.active += b.size;
                }
                BlockState::PendingFree => self.active += b.size,
                BlockState::Inactive => {}
            }
        }
        self.synced = true;
        self.drift = 0;
        let mut replay_problems = 0;
        let mut first_problem = None;
        for (et, kind) in &p.replay {
            if let Some(pr) = self.apply_inner(*et, kind, rules).problem {
                replay_problems += 1;
                first_problem.get_or_insert(pr);
            }
        }
        if replay_problems > 0 {
            self.synced = false;
        }
        self.after_change(t);
        SnapshotOutcome::Installed {
            replay_problems,
            first_problem,
        }
    }

    /// Fragmentation figures from the block map.
    pub fn block_summary(&self) -> BlockSummary {
        let mut out = BlockSummary {
            segments: self.segments.len() as u64,
            blocks: self.blocks.len() as u64,
            ..BlockSummary::default()
        };
        for s in self.segments.values() {
            for b in self.blocks.range(s.addr..s.end()).map(|(_, b)| b) {
                if b.state != BlockState::Inactive {
                    continue;
                }
                out.free_blocks += 1;
                if b.size < s.size {
                    out.inactive_split += b.size;
                }
                let slot = match s.pool_kind {
                    SegmentPool::Small => &mut out.largest_free_small,
                    SegmentPool::Large => &mut out.largest_free_large,
                };
                *slot = Some(slot.map_or(b.size, |m| m.max(b.size)));
            }
        }
        out
    }

    /// Estimated heap bytes held by this device's state.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        // BTreeMap nodes hold up to 11 entries; assume two-thirds full.
        let map = |n: usize, entry: usize| n * entry * 3 / 2;
        let mut bytes = map(self.segments.len(), size_of::<(u64, Segment)>())
            + map(self.blocks.len(), size_of::<(u64, Block)>())
            + map(self.orphans.len(), size_of::<(u64, Block)>())
            + self.series.allocated.memory_bytes()
            + self.series.reserved.memory_bytes()
            + self.series.active.memory_bytes();
        if let Some(p) = &self.pending {
            bytes += p.segments.capacity() * size_of::<Segment>()
                + p.blocks.capacity() * size_of::<(u64, Block)>()
                + p.replay.capacity() * size_of::<(u64, EventKind)>();
        }
        bytes
    }

    /// Check the invariants; returns a description of the first violation.
    /// (For tests and debug assertions; O(n).)
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut last_end = 0;
        let (mut alloc, mut active) = (0u64, 0u64);
        for (i, s) in self.segments.values().enumerate() {
            if i > 0 && s.addr < last_end {
                return Err(format!("segment {:#x} overlaps the previous one", s.addr));
            }
            last_end = s.end();
            let mut at = s.addr;
            let mut prev_free = false;
            for (&a, b) in self.blocks.range(s.addr..s.end()) {
                if a != at {
                    return Err(format!("gap or overlap at {a:#x} in segment {:#x}", s.addr));
                }
                if b.segment != s.addr {
                    return Err(format!("block {a:#x} tagged with segment {:#x}", b.segment));
                }
                let free = b.state == BlockState::Inactive;
                if free && prev_free {
                    return Err(format!("unmerged free blocks at {a:#x}"));
                }
                prev_free = free;
                at = a + b.size;
            }
            if at != s.end() {
                return Err(format!("segment {:#x} not tiled", s.addr));
            }
        }
        let in_segments: usize = self
            .segments
            .values()
            .map(|s| self.blocks.range(s.addr..s.end()).count())
            .sum();
        if in_segments != self.blocks.len() {
            return Err("blocks outside segments".into());
        }
        for b in self.blocks.values().chain(self.orphans.values()) {
            match b.state {
                BlockState::Allocated => {
                    alloc += b.size;
                    active += b.size;
                }
                BlockState::PendingFree => active += b.size,
                BlockState::Inactive => {}
            }
        }
        let reserved: u64 = self.segments.values().map(|s| s.size).sum();
        if (alloc, active, reserved) != (self.allocated, self.active, self.reserved) {
            return Err(format!(
                "totals {:?} differ from counters {:?}",
                (alloc, active, reserved),
                (self.allocated, self.active, self.reserved)
            ));
        }
        Ok(())
    }
}
