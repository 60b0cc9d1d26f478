//! Decoded allocator events: the vocabulary shared by the wire (`ring`), the
//! simulator (`sim`) and the model (`model`).
//!
//! These types say *what happened*, not how it was encoded: `ring::codec`
//! turns them into 64-byte slots and back. The meanings follow PyTorch's
//! `TraceEntry` (see `src/ring/FORMAT.md`, "Event kinds").

use serde::{Deserialize, Serialize};

/// A CUDA caching-allocator memory pool id (`MempoolId_t`, a pair of u64).
/// `(0, 0)` is the default pool; CUDA graphs and `torch.cuda.MemPool` use others.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct PoolId(pub u64, pub u64);

/// Where an allocator event happened: which device allocator, which stream, which pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Place {
    /// CUDA device index as the process numbers it.
    pub device: u16,
    /// The `cudaStream_t` value (0 is the legacy default stream).
    pub stream: u64,
    pub pool: PoolId,
}

/// One event, timestamped with the writer's `CLOCK_MONOTONIC` in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub time_ns: u64,
    pub kind: EventKind,
}

/// The state of a block in a state snapshot (`torch.cuda.memory_snapshot()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockState {
    /// Handed out to a tensor (`active_allocated`).
    Allocated,
    /// Freed by the tensor, waiting for stream uses to finish (`active_pending_free`).
    PendingFree,
    /// Cached: free inside a segment (`inactive`).
    Inactive,
}

/// Which of the allocator's pools a segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SegmentPool {
    /// Blocks ≤ 1 MiB, 2 MiB segments.
    Small,
    /// Everything else.
    Large,
}

/// The allocator's exact statistics for one device at one instant, as
/// `torch.cuda.memory_stats(device)` reports them for `.all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// `allocated_bytes.all.current`
    pub allocated: u64,
    /// `reserved_bytes.all.current`
    pub reserved: u64,
    /// `active_bytes.all.current`
    pub active: u64,
    /// `inactive_split_bytes.all.current`
    pub inactive_split: u64,
    /// `requested_bytes.all.current`
    pub requested: u64,
    /// `allocated_bytes.all.peak`
    pub allocated_peak: u64,
    /// `reserved_bytes.all.peak`
    pub reserved_peak: u64,
    /// `active_bytes.all.peak`
    pub active_peak: u64,
    /// `num_alloc_retries`
    pub alloc_retries: u64,
    /// `num_ooms`
    pub ooms: u64,
    /// `segment.all.current`
    pub segments: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A tensor asked for `size` bytes and got the block at `addr`
    /// (`size` is the request, not the rounded block).
    Alloc { place: Place, addr: u64, size: u64 },
    /// The tensor released the block; it may still be in use by a stream.
    FreeRequested { place: Place, addr: u64, size: u64 },
    /// The block went back to the pool (cached, still reserved).
    FreeCompleted { place: Place, addr: u64, size: u64 },
    /// `cudaMalloc` of a new segment.
    SegmentAlloc { place: Place, addr: u64, size: u64 },
    /// `cudaFree` of a segment (e.g. `empty_cache`, or free-and-retry).
    SegmentFree { place: Place, addr: u64, size: u64 },
    /// Pages mapped into an expandable segment.
    SegmentMap { place: Place, addr: u64, size: u64 },
    /// Pages unmapped from an expandable segment.
    SegmentUnmap { place: Place, addr: u64, size: u64 },
    /// The allocator could not satisfy a request of `request` bytes (rounded)
    /// while the device had `device_free` bytes free.
    Oom {
        place: Place,
        device_free: u64,
        request: u64,
    },
    /// Exact statistics for one device.
    Stats { device: u16, stats: Stats },
    /// A state snapshot starts: `segments` segments and `blocks` blocks follow.
    SnapshotBegin {
        device: u16,
        id: u32,
        segments: u64,
        blocks: u64,
    },
    /// One segment of the snapshot `id`.
    SnapshotSegment {
        id: u32,
        place: Place,
        addr: u64,
        size: u64,
        pool_kind: SegmentPool,
        expandable: bool,
    },
    /// One block of the snapshot `id`, inside the segment last sent.
    SnapshotBlock {
        id: u32,
        device: u16,
        addr: u64,
        size: u64,
        requested: u64,
        state: BlockState,
    },
    /// The snapshot `id` is complete.
    SnapshotEnd { device: u16, id: u32 },
    /// A marker written by the process (e.g. a training step boundary).
    Marker { value: u64 },
    /// A record kind this build does not know; readers skip it.
    Unknown { kind: u16 },
}
