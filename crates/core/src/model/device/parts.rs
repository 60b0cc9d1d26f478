//! The parts of one device's state: segments, blocks, the problems an
//! event can reveal and the figures derived from them.

use serde::{Deserialize, Serialize};

use crate::model::origin::Origin;
use vramscope_wire::event::{BlockState, PoolId, SegmentPool};

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
    pub(crate) fn end(&self) -> u64 {
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
    /// The context and step of the allocation that made the block (none
    /// for inactive blocks and from producers that do not tag).
    #[serde(default, skip_serializing_if = "Origin::is_none")]
    pub origin: Origin,
}

impl Block {
    /// An inactive block of `segment` of `size` bytes, in that state since
    /// `since_ns`.
    pub(super) fn inactive(segment: &Segment, size: u64, since_ns: u64) -> Self {
        Self {
            size,
            requested: 0,
            stream: segment.stream,
            pool: segment.pool,
            segment: segment.addr,
            since_ns,
            state: BlockState::Inactive,
            expandable: segment.expandable,
            origin: Origin::default(),
        }
    }

    /// What the block adds to the (allocated, active) totals.
    pub(super) fn weight(&self) -> (u64, u64) {
        match self.state {
            BlockState::Allocated => (self.size, self.size),
            BlockState::PendingFree => (0, self.size),
            BlockState::Inactive => (0, 0),
        }
    }
}

/// The (allocated, active) totals of `blocks`.
pub(super) fn weigh<'a>(blocks: impl IntoIterator<Item = &'a Block>) -> (u64, u64) {
    blocks
        .into_iter()
        .map(Block::weight)
        .fold((0u64, 0u64), |(a, b), (x, y)| {
            (a.saturating_add(x), b.saturating_add(y))
        })
}

/// What the bounds of one device dropped (see [`Bounds`](crate::model::Bounds)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DeviceDropped {
    pub(crate) orphans: u64,
    pub(crate) blocks: u64,
    pub(crate) segments: u64,
    pub(crate) replay: u64,
    pub(crate) snapshots: u64,
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
    /// A range or a total that does not fit in 64 bits: `addr + size` past
    /// `u64::MAX`, or a sum of sizes that had to be saturated. What is shown
    /// is cut at `u64::MAX` and flagged implausible.
    Overflow { addr: u64, size: u64 },
    /// The allocator's own statistics kept disagreeing with the block map.
    Drift {
        model_allocated: u64,
        stats_allocated: u64,
    },
    /// A snapshot placed past its device ring's head (FORMAT.md,
    /// "Positions"): the ring had reached `reached` when a record below
    /// `before`, written after the snapshot, came. It was refused as an
    /// anchor: installed, it would have dropped every later record as
    /// already in it.
    AnchorPastHead {
        ring: u8,
        before: u64,
        reached: Option<u64>,
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
    pub(crate) live: Live,
    pub(crate) problem: Option<Problem>,
}

impl Applied {
    /// An outcome that changes no live tensor count, with problem `p` (if any).
    pub(super) fn problem(p: impl Into<Option<Problem>>) -> Self {
        Self {
            live: Live::None,
            problem: p.into(),
        }
    }
}

/// Figures summed from the block map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Derived {
    pub allocated: u64,
    pub(crate) active: u64,
    pub(crate) reserved: u64,
}

/// Fragmentation figures computed from the block map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BlockSummary {
    /// Inactive bytes in segments that are split (cached but not releasable).
    pub(crate) inactive_split: u64,
    pub(crate) largest_free_small: Option<u64>,
    pub(crate) largest_free_large: Option<u64>,
    pub(crate) free_blocks: u64,
    pub blocks: u64,
    pub(crate) segments: u64,
}

/// A segment as a running job's allocator holds it (its block map), for
/// a replay that begins mid-run (the simulator's `SimAllocator::install`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSegment {
    pub addr: u64,
    pub stream: u64,
    pub pool: SegmentPool,
    /// Its blocks in address order, covering it: each one's size, and the
    /// request it serves when allocated (None: free).
    pub blocks: Vec<(u64, Option<u64>)>,
}
