//! Decoded allocator events: the vocabulary shared by the wire (`ring`), the
//! simulator (`sim`) and the model (`model`).
//!
//! These types say *what happened*, not how it was encoded: `ring::codec`
//! turns them into 64-byte slots and back. The meanings follow PyTorch's
//! `TraceEntry` (see `crates/wire/src/ring/FORMAT.md`, "Event kinds").

use serde::{Deserialize, Serialize};

/// A CUDA caching-allocator memory pool id (`MempoolId_t`, a pair of u64).
/// `(0, 0)` is the default pool; CUDA graphs and `torch.cuda.MemPool` use others.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct PoolId(pub u64, pub u64);

/// Where an allocator event happened: which device allocator, which stream,
/// which pool, and (format 1.1) which code was running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Place {
    /// CUDA device index as the process numbers it.
    pub device: u16,
    /// The `cudaStream_t` value (0 is the legacy default stream).
    pub stream: u64,
    pub pool: PoolId,
    /// The code context the producer tagged the event with (none by default,
    /// and always none from a 1.0 producer).
    #[serde(default, skip_serializing_if = "CtxTag::is_none")]
    pub ctx: CtxTag,
}

/// The context tag of an allocator event (FORMAT.md, "Contexts"): which
/// CONTEXT the calling thread was in, and the low bits of the step. Packed
/// into the record header's `aux`: bits 0–23 the context id, bits 24–31 the
/// step tag. Zero means "not given".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct CtxTag {
    /// A CONTEXT id (1 to 2^24 − 1), 0 for none.
    pub context: u32,
    /// `(step mod 255) + 1`, 0 for not given; the full step is the latest
    /// step boundary (MARKER) whose value has this tag.
    pub step_tag: u8,
}

impl CtxTag {
    pub const NONE: CtxTag = CtxTag {
        context: 0,
        step_tag: 0,
    };
    /// The largest context id a tag can carry.
    pub const MAX_CONTEXT: u32 = (1 << 24) - 1;

    pub fn is_none(&self) -> bool {
        *self == CtxTag::NONE
    }
    /// From a record header's `aux`.
    pub fn from_aux(aux: u32) -> Self {
        CtxTag {
            context: aux & CtxTag::MAX_CONTEXT,
            step_tag: (aux >> 24) as u8,
        }
    }
    /// Into a record header's `aux` (a context id above 2^24 − 1 is cut).
    pub fn aux(self) -> u32 {
        (self.context & CtxTag::MAX_CONTEXT) | (self.step_tag as u32) << 24
    }
    /// The step tag of step `step`.
    pub fn step_tag_of(step: u64) -> u8 {
        (step % 255) as u8 + 1
    }
}

/// What an event is, by the groups the segment format numbers its kinds
/// in (FORMAT.md, "Records"): every set of kinds a reader treats alike is
/// a set of classes ([`EventKind::class`]), so a kind added to the format
/// is classed once, where the compiler asks for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// A tensor's block: ALLOC, FREE_REQUESTED, FREE_COMPLETED.
    Block,
    /// The allocator's device memory: SEGMENT_ALLOC, SEGMENT_FREE,
    /// SEGMENT_MAP, SEGMENT_UNMAP.
    Segment,
    /// OOM: a request the allocator could not serve.
    Oom,
    /// A statistics sample (STATS_A and STATS_B).
    Stats,
    /// Where a statistics sample sits in its device ring (STATS_C).
    StatsPosition,
    /// A state snapshot: SNAP_BEGIN, SNAP_SEGMENT, SNAP_BLOCK, SNAP_END.
    Snapshot,
    /// MARKER: a step boundary, a new run, a memory limit.
    Marker,
    /// DROPPED: what a bound of the producer dropped.
    Dropped,
    /// Attribution definitions: STRING, FRAME, STACK, CONTEXT.
    Definition,
    /// A role list: ROLES, ROLE, ROLES_END.
    Role,
    /// Memory outside the caching allocator: OUTSIDE_ALLOC, OUTSIDE_FREE,
    /// OUTSIDE_TOTAL (1.3).
    Outside,
    /// A kind this build does not know.
    Unknown,
}

impl Class {
    /// The allocator's own events (FORMAT.md kinds 1–15: ALLOC through
    /// OOM), the ones [`EventKind::place`] places.
    pub fn is_allocator(self) -> bool {
        matches!(self, Class::Block | Class::Segment | Class::Oom)
    }
}

impl EventKind {
    /// Which [`Class`] of event this is.
    pub fn class(&self) -> Class {
        match self {
            EventKind::Alloc { .. }
            | EventKind::FreeRequested { .. }
            | EventKind::FreeCompleted { .. } => Class::Block,
            EventKind::SegmentAlloc { .. }
            | EventKind::SegmentFree { .. }
            | EventKind::SegmentMap { .. }
            | EventKind::SegmentUnmap { .. } => Class::Segment,
            EventKind::Oom { .. } => Class::Oom,
            EventKind::Stats { .. } => Class::Stats,
            EventKind::StatsPosition { .. } => Class::StatsPosition,
            EventKind::SnapshotBegin { .. }
            | EventKind::SnapshotSegment { .. }
            | EventKind::SnapshotBlock { .. }
            | EventKind::SnapshotEnd { .. } => Class::Snapshot,
            EventKind::Marker { .. } => Class::Marker,
            EventKind::Dropped { .. } => Class::Dropped,
            EventKind::StringChunk { .. }
            | EventKind::Frame { .. }
            | EventKind::Stack { .. }
            | EventKind::Context { .. } => Class::Definition,
            EventKind::Roles { .. } | EventKind::Role { .. } | EventKind::RolesEnd { .. } => {
                Class::Role
            }
            EventKind::Outside(_) => Class::Outside,
            EventKind::Unknown { .. } => Class::Unknown,
        }
    }

    /// A new run of the job begins here (MARKER source 5: a demo starting
    /// its scenario over): what comes after starts from an empty allocator.
    pub fn starts_run(&self) -> bool {
        matches!(
            self,
            EventKind::Marker {
                source: MarkSource::Run,
                ..
            }
        )
    }

    /// The device and stream of an allocator event (ALLOC through OOM);
    /// `None` for every other kind.
    pub fn place(&self) -> Option<Place> {
        match *self {
            EventKind::Alloc { place, .. }
            | EventKind::FreeRequested { place, .. }
            | EventKind::FreeCompleted { place, .. }
            | EventKind::SegmentAlloc { place, .. }
            | EventKind::SegmentFree { place, .. }
            | EventKind::SegmentMap { place, .. }
            | EventKind::SegmentUnmap { place, .. }
            | EventKind::Oom { place, .. } => Some(place),
            _ => None,
        }
    }

    /// The STRING records defining string `id` as `text` (FORMAT.md: cut
    /// at 4096 bytes on a character boundary, chunks of 32 bytes).
    pub fn string_chunks(id: u32, text: &str) -> Vec<EventKind> {
        let mut end = text.len().min(4096);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let text = &text.as_bytes()[..end];
        let chunks = text.chunks(32).map(Some);
        let chunks: Vec<Option<&[u8]>> = if text.is_empty() {
            vec![None]
        } else {
            chunks.collect()
        };
        (chunks.into_iter().enumerate())
            .map(|(i, c)| {
                let mut bytes = [0u8; 32];
                let c = c.unwrap_or_default();
                bytes[..c.len()].copy_from_slice(c);
                EventKind::StringChunk {
                    id,
                    len: end as u32,
                    offset: i as u32 * 32,
                    bytes,
                }
            })
            .collect()
    }
}

/// Where a state snapshot or a statistics sample sits in a device ring
/// (FORMAT.md, "Positions"): records of ring `ring` at positions below
/// `before` are reflected in it, those at `after` and above are not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RingSpan {
    /// Index of the ring in the segment's ring table.
    pub ring: u8,
    /// The ring's head just before the state was read.
    pub before: u64,
    /// The ring's head just after the state was read (≥ `before`).
    pub after: u64,
    /// Read under the allocator lock that every event of the ring is
    /// written under: `before == after` and the split is exact.
    pub exact: bool,
    /// Records were written between `before` and `after`: which of them are
    /// reflected is for the reader to resolve.
    pub ambiguous: bool,
}

/// What a step boundary (MARKER) came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum MarkSource {
    /// Not said (every 1.0 producer).
    #[default]
    Unknown,
    /// `vramscope.mark()` in the user's code.
    User,
    /// A global optimizer step hook; `optimizer` numbers the optimizer in the
    /// order the producer first saw it (1, 2, …; 0 not given).
    OptimizerStep { optimizer: u32 },
    /// Inferred by the producer from the allocation pattern.
    Inferred,
    /// 5: a new run of the job begins (e.g. the demo's scenario starts
    /// over): step counts and leak verdicts start again. `value` is 0.
    Run,
    /// 6: not a step: the most the allocator of `device` may reserve
    /// (`value`, bytes): the device's memory times the process's memory
    /// fraction (`torch.cuda.set_per_process_memory_fraction`);
    /// `whole_device` when no fraction is set (then other processes and
    /// the CUDA context come off it too). Sent when the producer starts
    /// and when it changes.
    MemoryLimit { device: u16, whole_device: bool },
    /// 4 ("other") or a code this build does not know.
    Other(u8),
}

/// What a code block was doing (CONTEXT `phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Phase {
    #[default]
    NotGiven,
    Forward,
    Backward,
    Optimizer,
    /// 4 ("other") or a code this build does not know.
    Other(u8),
}

/// What a producer's bound dropped (DROPPED `what`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DropWhat {
    /// Records the producer chose not to write (a rate or buffer bound).
    Records,
    /// Allocator events tagged "no context" because context ids ran out.
    ContextIds,
    /// Stacks not captured (capture bound: depth, count or time).
    Stacks,
    /// Strings cut at the length bound.
    Strings,
    /// Definitions not re-sent with a snapshot (re-send bound).
    Definitions,
    /// Live blocks whose context tag was not kept (tag table full, or events
    /// the producer's table missed).
    BlockTags,
    /// Tensors left out of a role list (1.2).
    Roles,
    /// Records of memory outside the caching allocator left out (a rate
    /// bound) or refused (the producer's bounds) (1.3).
    Outside,
    /// A code this build does not know.
    Other(u32),
}

/// Device memory (or pinned host memory) a process holds outside PyTorch's
/// caching allocator (OUTSIDE_ALLOC, OUTSIDE_FREE, OUTSIDE_TOTAL, 1.3):
/// which library made it, of what kind, and, for an allocation, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outside {
    pub op: OutsideOp,
    /// The device (`NO_DEVICE`, 0xffff: host memory).
    pub device: u16,
    /// The library that asked for it (OUTSIDE `aux` bits 0–7).
    pub library: Library,
    pub kind: OutsideKind,
    /// The allocation's address (0 for a total).
    pub addr: u64,
    /// An allocation's bytes; a total's bytes now (two's complement: a
    /// total measured as drops in free memory may be below 0 for a while).
    pub bytes: u64,
    /// The library's file name, its first 24 bytes (UTF-8, 0-padded): a
    /// producer's text, printable only once a reader made it so.
    pub name: [u8; 24],
}

/// What an OUTSIDE record says (its kind: 80, 81, 82).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OutsideOp {
    /// OUTSIDE_ALLOC: `bytes` at `addr` were allocated.
    Alloc,
    /// OUTSIDE_FREE: the allocation at `addr` was freed.
    Free,
    /// OUTSIDE_TOTAL: the producer's total for (device, library, kind)
    /// now; it replaces what a reader summed.
    Total,
}

/// Which library made memory outside the caching allocator (1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Library {
    /// CUDA itself: the driver and its context.
    Cuda,
    /// PyTorch outside its caching allocator (its kernels, its streams).
    Torch,
    Nccl,
    /// cuBLAS and cuBLASLt.
    Cublas,
    Cudnn,
    Cufft,
    Triton,
    TensorRt,
    CuPy,
    /// 0 (not known: the name says what) or a code this build does not
    /// know.
    Other(u8),
}

/// What kind of memory outside the caching allocator (1.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum OutsideKind {
    /// The CUDA context (measured when CUDA started).
    Context,
    /// `cuMemAlloc` and kin.
    Allocation,
    /// Physical memory of the virtual memory API (`cuMemCreate`).
    Physical,
    /// A stream-ordered pool's (`cuMemAllocAsync`).
    StreamOrdered,
    /// Managed memory (`cuMemAllocManaged`).
    Managed,
    /// Pinned host memory (`cuMemHostAlloc`): not the device's.
    Host,
    /// Kernels loaded (modules): the device memory their loading took.
    Kernels,
    /// Streams created: the device memory their creation took.
    Streams,
    /// What the device held outside the allocator when the accounting
    /// began late (a tracker built while the job ran, an attach): the
    /// context and what libraries took before (1.3, code 9).
    Before,
    /// 0 or a code this build does not know.
    Other(u8),
}

/// What PyTorch holds a tensor as (ROLE `w4`, 1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Held {
    Parameter,
    Buffer,
    Gradient,
    OptimizerState,
    /// 0 or a code this build does not know.
    Other(u8),
}

/// One event, timestamped with the writer's `CLOCK_MONOTONIC` in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
        /// Where the snapshot sits in the device's ring (1.1; None from 1.0).
        #[serde(default)]
        at: Option<RingSpan>,
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
        /// The context tag of the allocation that made the block (1.1).
        #[serde(default)]
        ctx: CtxTag,
    },
    /// The snapshot `id` is complete.
    SnapshotEnd { device: u16, id: u32 },
    /// A marker written by the process (e.g. a training step boundary).
    Marker {
        value: u64,
        /// What the boundary came from (1.1; Unknown from 1.0).
        #[serde(default)]
        source: MarkSource,
    },
    /// Where the statistics sample just delivered for `device` sits in the
    /// device ring (STATS_C, 1.1). Follows its `Stats`.
    StatsPosition { device: u16, at: RingSpan },
    /// A producer's bound dropped `count` things of kind `what` since the
    /// segment was created (cumulative); `bound` is the limit (0 not given).
    Dropped {
        device: u16,
        what: DropWhat,
        count: u64,
        bound: u64,
    },
    /// Bytes `offset .. offset + 32` (cut at `len`) of string `id`, `len`
    /// bytes of UTF-8 in all.
    StringChunk {
        id: u32,
        len: u32,
        offset: u32,
        bytes: [u8; 32],
    },
    /// Defines frame `id`: a Python source line.
    Frame {
        id: u32,
        file: u32,
        function: u32,
        line: u32,
    },
    /// Defines stack `id`: frame `frame` called from stack `parent` (0: the
    /// outermost frame).
    Stack { id: u32, frame: u32, parent: u32 },
    /// Defines context `id`: module path string `module` (0 none), `phase`,
    /// the stack captured when it was entered (0 none) and, if the producer
    /// keys contexts by step, the step.
    Context {
        id: u32,
        module: u32,
        phase: Phase,
        stack: u32,
        step: Option<u64>,
    },
    /// Role list `list` begins: `count` ROLE records follow (1.2).
    Roles { list: u32, count: u64 },
    /// In role list `list`: the tensor of `bytes` at `addr` on `device` is
    /// held as `held` by module path string `module` (0 none) (1.2).
    Role {
        list: u32,
        device: u16,
        addr: u64,
        bytes: u64,
        held: Held,
        module: u32,
    },
    /// Role list `list` is complete; the producer wrote `count` ROLE
    /// records (1.2).
    RolesEnd { list: u32, count: u64 },
    /// Memory outside the caching allocator (1.3).
    Outside(Outside),
    /// A record kind this build does not know; readers skip it.
    Unknown { kind: u16 },
}

/// Where an event's record was in its segment: the ring (index in the ring
/// table) and the position of the event's last record (a statistics sample's
/// STATS_B; its STATS_A is at `position - 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RingPos {
    pub ring: u32,
    pub position: u64,
}
