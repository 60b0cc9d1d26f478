//! `SimAllocator`: one device's CUDA caching allocator, simulated.
//!
//! This mirrors `DeviceCachingAllocator` in PyTorch's
//! `c10/cuda/CUDACachingAllocator.cpp`: the comments name the C++ function
//! each piece follows. Memory is fake (a deterministic address space, a
//! capacity limit standing in for `cudaMalloc` failures); the bookkeeping —
//! pools, best fit, splitting, merging, `max_split_size`, expandable
//! segments, garbage collection, free-and-retry, `empty_cache`, statistics
//! and trace events — follows the C++.
//!
//! Not modelled: CUDA-graph private pools and `MemPool`s (everything is in
//! the default pool `(0, 0)`), IPC, peer access, free-memory callbacks, and
//! real GPU timing. A block freed after `record_stream` on another stream
//! stays `PendingFree` until the next `malloc` (`process_events`), an
//! `empty_cache`, or [`SimAllocator::synchronize`]: the simulated GPU
//! finishes its work as soon as the allocator looks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::conf::AllocConf;
use crate::model::device::HeldSegment;
use crate::pytorch::{self as rules, UNLIMITED_SPLIT_SIZE};
use vramscope_wire::event::{
    BlockState, CtxTag, Event, EventKind, Place, PoolId, SegmentPool, Stats,
};

/// Where the simulator sends the trace events it produces.
pub trait EventSink {
    fn emit(&mut self, event: Event);
}

impl EventSink for Vec<Event> {
    fn emit(&mut self, event: Event) {
        self.push(event);
    }
}

/// Adapts a closure to [`EventSink`].
pub struct FnSink<F: FnMut(Event)>(pub F);

impl<F: FnMut(Event)> EventSink for FnSink<F> {
    fn emit(&mut self, event: Event) {
        (self.0)(event)
    }
}

/// Drops every event.
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&mut self, _event: Event) {}
}

/// The simulated device and allocator settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Device index written into events.
    pub device: u16,
    /// Device memory in bytes (`totalGlobalMem`); `cudaMalloc` and page
    /// mapping fail beyond it.
    pub capacity: u64,
    /// `PYTORCH_CUDA_ALLOC_CONF`.
    pub alloc: AllocConf,
    /// `torch.cuda.set_per_process_memory_fraction(f)`: limits reserved
    /// memory to `f * capacity` and enables `garbage_collection_threshold`.
    pub memory_fraction: Option<f64>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            device: 0,
            capacity: 8 << 30,
            alloc: AllocConf::default(),
            memory_fraction: None,
        }
    }
}

impl SimConfig {
    #[cfg(test)]
    pub(crate) fn with_conf(alloc: AllocConf) -> Self {
        SimConfig {
            alloc,
            ..SimConfig::default()
        }
    }
}

/// A failed allocation (PyTorch raises `torch.OutOfMemoryError`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomError {
    pub(crate) device: u16,
    pub(crate) stream: u64,
    /// The caller's request.
    pub(crate) requested: u64,
    /// `round_size(requested)`, as in the `OOM` trace event.
    pub(crate) rounded: u64,
    /// What `cudaMalloc` was asked for ("Tried to allocate").
    pub(crate) alloc_size: u64,
    /// Free device memory at the failure (the `OOM` event's `device_free`).
    pub(crate) device_free: u64,
    pub(crate) device_total: u64,
    /// `allocated_bytes.all.current` at the failure.
    pub(crate) allocated: u64,
    /// `reserved_bytes.all.current` at the failure.
    pub(crate) reserved: u64,
}

impl fmt::Display for OomError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. \
             Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated.",
            format_size(self.alloc_size),
            self.device,
            format_size(self.device_total),
            format_size(self.device_free),
            format_size(self.allocated),
            format_size(self.reserved - self.allocated),
        )
    }
}

impl std::error::Error for OomError {}

/// Misuse of the simulator API (the C++ would crash or assert).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SimError {
    #[error("no allocated block at address {0:#x}")]
    UnknownAddress(u64),
}

/// Formats a byte count like PyTorch's `format_size`.
pub(crate) fn format_size(size: u64) -> String {
    let s = size as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1_048_576 {
        format!("{:.2} KiB", s / 1024.0)
    } else if size <= 1_073_741_824 {
        format!("{:.2} MiB", s / 1_048_576.0)
    } else {
        format!("{:.2} GiB", s / 1_073_741_824.0)
    }
}

/// One block of a segment, as a snapshot shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// The last request served by this block (PyTorch keeps it after free).
    pub(crate) requested: u64,
    pub(crate) state: BlockState,
}

/// One segment (for expandable segments: one contiguous mapped range) with
/// its blocks in address order, as `torch.cuda.memory_snapshot()` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) pool: SegmentPool,
    pub(crate) expandable: bool,
    pub(crate) blocks: Vec<BlockInfo>,
}

type BlockId = usize;

#[derive(Debug, Clone)]
struct Block {
    stream: u64,
    pool: SegmentPool,
    ptr: u64,
    size: u64,
    requested: u64,
    allocated: bool,
    /// Backed by physical pages (always true outside expandable segments).
    mapped: bool,
    prev: Option<BlockId>,
    next: Option<BlockId>,
    /// The expandable segment this block lies in.
    es: Option<usize>,
    gc_count_base: u64,
    stream_uses: BTreeSet<u64>,
    event_count: u32,
}

impl Block {
    fn new(stream: u64, pool: SegmentPool, ptr: u64, size: u64) -> Block {
        Block {
            stream,
            pool,
            ptr,
            size,
            requested: 0,
            allocated: false,
            mapped: true,
            prev: None,
            next: None,
            es: None,
            gc_count_base: 0,
            stream_uses: BTreeSet::new(),
            event_count: 0,
        }
    }
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// `BlockPool`: free mapped blocks ordered by (stream, size, address) and
/// unmapped expandable ranges ordered by (stream, address).
#[derive(Debug, Default, Clone)]
struct Pool {
    blocks: BTreeMap<(u64, u64, u64), BlockId>,
    unmapped: BTreeMap<(u64, u64), BlockId>,
    get_free_blocks_call_count: u64,
}

#[derive(Debug, Clone)]
struct ExpandableSegment {
    base: u64,
    size: u64,
    page: u64,
}

/// Where [`SimAllocator::link_new`] puts a new block.
#[derive(Debug, Clone, Copy)]
enum Side {
    Before,
    After,
}

fn pidx(p: SegmentPool) -> usize {
    match p {
        SegmentPool::Small => 0,
        SegmentPool::Large => 1,
    }
}

/// The caching allocator of one simulated device.
#[derive(Debug, Clone)]
pub struct SimAllocator {
    cfg: SimConfig,
    now_ns: u64,
    blocks: Vec<Option<Block>>,
    free_ids: Vec<BlockId>,
    pools: [Pool; 2],
    /// `active_blocks`, by address.
    active: BTreeMap<u64, BlockId>,
    /// Blocks waiting for stream events (`cuda_events`).
    pending: Vec<BlockId>,
    expandable: BTreeMap<usize, ExpandableSegment>,
    next_es: usize,
    /// `total_allocated_memory`: bytes obtained from the device.
    total_allocated_memory: u64,
    stats: Stats,
    inactive_split_blocks: u64,
    next_va: u64,
    /// The address space of every segment (cudaMalloc'd, or reserved for
    /// an expandable segment): base -> size.
    ranges: BTreeMap<u64, u64>,
    /// Where the next new segment goes, when a trace recorded where the
    /// real one went (`set_segment_addr`).
    segment_addr: Option<u64>,
    /// Where new segments go when no one says: the driver's address space
    /// (`place_by_regions`), else above the last.
    regions: Option<super::va::VaRegions>,
    snapshot_seq: u32,
    /// The context tag events are written with (an agent's thread-local
    /// context and step tag, FORMAT.md "Contexts").
    ctx: CtxTag,
    /// The tag of each live block's allocation (for SNAP_BLOCK), by address.
    tags: BTreeMap<u64, CtxTag>,
    /// Best fit among equal free blocks takes the highest address instead
    /// of the lowest (`break_ties_high`: a counterfactual for finding the
    /// steps a tie decides; PyTorch takes the lowest).
    ties_high: bool,
}

const VA_BASE: u64 = 0x7f00_0000_0000;

impl SimAllocator {
    pub fn new(cfg: SimConfig) -> SimAllocator {
        let next_va = VA_BASE + ((cfg.device as u64) << 40);
        SimAllocator {
            cfg,
            now_ns: 0,
            blocks: Vec::new(),
            free_ids: Vec::new(),
            pools: [Pool::default(), Pool::default()],
            active: BTreeMap::new(),
            pending: Vec::new(),
            expandable: BTreeMap::new(),
            next_es: 0,
            total_allocated_memory: 0,
            stats: Stats::default(),
            inactive_split_blocks: 0,
            next_va,
            ranges: BTreeMap::new(),
            segment_addr: None,
            regions: None,
            snapshot_seq: 0,
            ctx: CtxTag::NONE,
            tags: BTreeMap::new(),
            ties_high: false,
        }
    }

    /// The context tag of the events that follow.
    pub(crate) fn set_context(&mut self, ctx: CtxTag) {
        self.ctx = ctx;
    }

    pub(crate) fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Sets the clock stamped on the events that follow.
    pub fn set_time(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    pub(crate) fn now(&self) -> u64 {
        self.now_ns
    }

    /// `getStats()` for `.all`.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Free device memory as `cudaMemGetInfo` would report it.
    pub(crate) fn device_free(&self) -> u64 {
        self.cfg
            .capacity
            .saturating_sub(self.total_allocated_memory)
    }

    #[cfg(test)]
    /// `inactive_split.all.current` (number of blocks).
    pub(crate) fn inactive_split_blocks(&self) -> u64 {
        self.inactive_split_blocks
    }

    /// The largest cached free block (`cacheInfo`, without the
    /// device-free initial guess), 0 when nothing is cached.
    pub(crate) fn largest_free_block(&self) -> u64 {
        self.pools
            .iter()
            .flat_map(|p| p.blocks.keys())
            .map(|&(_, size, _)| size)
            .max()
            .unwrap_or(0)
    }

    /// `resetPeakStats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.allocated_peak = self.stats.allocated;
        self.stats.reserved_peak = self.stats.reserved;
        self.stats.active_peak = self.stats.active;
    }

    /// Sends a `Stats` event with the current statistics.
    pub fn emit_stats(&self, sink: &mut dyn EventSink) {
        sink.emit(Event {
            time_ns: self.now_ns,
            kind: EventKind::Stats {
                device: self.cfg.device,
                stats: self.stats,
            },
        });
    }

    /// The size of the allocated block at `addr` (its rounded size).
    pub(crate) fn block_size(&self, addr: u64) -> Option<u64> {
        self.active.get(&addr).map(|&id| self.b(id).size)
    }

    // ----- arena helpers -------------------------------------------------

    fn b(&self, id: BlockId) -> &Block {
        self.blocks[id].as_ref().expect("live block")
    }
    fn bm(&mut self, id: BlockId) -> &mut Block {
        self.blocks[id].as_mut().expect("live block")
    }
    fn new_block(&mut self, b: Block) -> BlockId {
        if let Some(id) = self.free_ids.pop() {
            self.blocks[id] = Some(b);
            id
        } else {
            self.blocks.push(Some(b));
            self.blocks.len() - 1
        }
    }
    fn delete_block(&mut self, id: BlockId) {
        self.blocks[id] = None;
        self.free_ids.push(id);
    }
    /// A new free block `[ptr, ptr + size)` in `id`'s segment (same stream,
    /// pool and expandable segment), `mapped` or not, linked in on `side`
    /// of `id`.
    fn link_new(&mut self, id: BlockId, side: Side, ptr: u64, size: u64, mapped: bool) -> BlockId {
        let b = self.b(id);
        let (prev, next) = match side {
            Side::Before => (b.prev, Some(id)),
            Side::After => (Some(id), b.next),
        };
        let mut nb = Block::new(b.stream, b.pool, ptr, size);
        nb.mapped = mapped;
        nb.es = b.es;
        nb.prev = prev;
        nb.next = next;
        let nid = self.new_block(nb);
        if let Some(p) = prev {
            self.bm(p).next = Some(nid);
        }
        if let Some(n) = next {
            self.bm(n).prev = Some(nid);
        }
        nid
    }
    fn place(&self, stream: u64) -> Place {
        Place {
            device: self.cfg.device,
            stream,
            pool: PoolId(0, 0),
            ctx: self.ctx,
        }
    }
    fn emit(&self, sink: &mut dyn EventSink, kind: EventKind) {
        sink.emit(Event {
            time_ns: self.now_ns,
            kind,
        });
    }
    /// Address space for a new segment: where `set_segment_addr` said when
    /// that is aligned and free, else the next free range of the simulator's
    /// own, above the last.
    fn va_alloc(&mut self, size: u64, align: u64) -> u64 {
        if let Some(p) = self.segment_addr.take() {
            if p % align == 0 && self.range_free(p, size) {
                self.ranges.insert(p, size);
                return p;
            }
        }
        if let Some(mut r) = self.regions.take() {
            let p = r.place(size, &self.ranges);
            let free = p % align == 0 && self.range_free(p, size);
            if free {
                self.ranges.insert(p, size);
                r.placed(p, &self.ranges);
            } else {
                r.released(p, &self.ranges);
            }
            self.regions = Some(r);
            if free {
                return p;
            }
        }
        let up = |a: u64| a.div_ceil(align).saturating_mul(align);
        let mut p = up(self.next_va);
        while let Some(base) = self.overlap(p, size) {
            p = up(base.saturating_add(self.ranges[&base]));
        }
        self.next_va = p.saturating_add(size);
        self.ranges.insert(p, size);
        p
    }

    /// The base of the last segment's address space overlapping
    /// `[p, p + size)`, if any.
    fn overlap(&self, p: u64, size: u64) -> Option<u64> {
        self.ranges
            .range(..p.saturating_add(size))
            .next_back()
            .filter(|&(&base, &len)| base.saturating_add(len) > p)
            .map(|(&base, _)| base)
    }

    /// Whether `[p, p + size)` overlaps no segment's address space.
    fn range_free(&self, p: u64, size: u64) -> bool {
        self.overlap(p, size).is_none()
    }

    /// The address the next segment this allocator creates gets (its
    /// first block's address): the one a trace recorded from the real
    /// `cudaMalloc`, or the real expandable segment's base, so that ties
    /// between equal free blocks break by the same addresses as in PyTorch.
    /// Ignored when it is misaligned or overlaps a live segment; cleared by
    /// the next `malloc`.
    pub(crate) fn set_segment_addr(&mut self, addr: Option<u64>) {
        self.segment_addr = addr;
    }

    /// New segments go where the driver's address space would have them
    /// (`VaRegions`) when no address is given.
    pub(crate) fn place_by_regions(&mut self) {
        if self.regions.is_none() {
            self.regions = Some(Default::default());
        }
    }

    /// Best fit among free blocks of equal size takes the one at the
    /// highest address rather than the lowest (PyTorch's): a replay with
    /// this beside one without shows which steps a tie between equal free
    /// blocks decides (`sim::diff`).
    pub(crate) fn break_ties_high(&mut self, on: bool) {
        self.ties_high = on;
    }
    /// `BlockPool::insert_into_blocks`.
    fn insert_into_blocks(&mut self, id: BlockId) {
        let (pool, key) = {
            let b = self.b(id);
            (b.pool, (b.stream, b.size, b.ptr))
        };
        let count = self.pools[pidx(pool)].get_free_blocks_call_count;
        self.bm(id).gc_count_base = count;
        let prev = self.pools[pidx(pool)].blocks.insert(key, id);
        debug_assert!(prev.is_none());
    }
    fn erase_from_blocks(&mut self, id: BlockId) -> bool {
        let b = self.b(id);
        let key = (b.stream, b.size, b.ptr);
        let pool = b.pool;
        self.pools[pidx(pool)].blocks.remove(&key).is_some()
    }
    fn insert_unmapped(&mut self, id: BlockId) {
        let b = self.b(id);
        let (pool, key) = (b.pool, (b.stream, b.ptr));
        self.pools[pidx(pool)].unmapped.insert(key, id);
    }
    fn erase_unmapped(&mut self, id: BlockId) -> bool {
        let b = self.b(id);
        let (pool, key) = (b.pool, (b.stream, b.ptr));
        self.pools[pidx(pool)].unmapped.remove(&key).is_some()
    }
    fn gc_enabled(&self) -> bool {
        self.cfg.memory_fraction.is_some() && self.cfg.alloc.garbage_collection_threshold > 0.0
    }
    fn allowed_memory_maximum(&self) -> Option<u64> {
        self.cfg
            .memory_fraction
            .map(|f| (f * self.cfg.capacity as f64) as u64)
    }

    fn inc_allocated(&mut self, n: u64) {
        self.stats.allocated += n;
        self.stats.allocated_peak = self.stats.allocated_peak.max(self.stats.allocated);
    }
    fn inc_reserved(&mut self, n: u64) {
        self.stats.reserved += n;
        self.stats.reserved_peak = self.stats.reserved_peak.max(self.stats.reserved);
    }
    fn inc_active(&mut self, n: u64) {
        self.stats.active += n;
        self.stats.active_peak = self.stats.active_peak.max(self.stats.active);
    }

    // ----- public operations ---------------------------------------------

    /// Installs `seg` as the job's allocator holds it (a `cudaMalloc`'d
    /// segment: not under expandable segments): its address space, its
    /// blocks (neighbouring free ones merged, as the allocator keeps
    /// them), and the statistics that count them. Refused (false, nothing
    /// changed) when it is empty or overlaps a segment already here.
    pub(crate) fn install(&mut self, seg: &HeldSegment) -> bool {
        let size = (seg.blocks.iter()).try_fold(0u64, |a, b| a.checked_add(b.0));
        let requested = (seg.blocks.iter()).try_fold(0u64, |a, b| a.checked_add(b.1.unwrap_or(0)));
        // A map no device holds (sizes past what the figures can count:
        // hostile or corrupt) is refused, not summed into them.
        let fits = |figure: u64, n: u64| figure.checked_add(n).is_some_and(|t| t < 1 << 62);
        let (Some(size), Some(requested)) = (size, requested) else {
            return false;
        };
        if size == 0
            || seg.blocks.iter().any(|b| b.0 == 0)
            || self.cfg.alloc.expandable_segments
            || seg.addr.checked_add(size).is_none()
            || !fits(self.stats.reserved, size)
            || !fits(self.total_allocated_memory, size)
            || !fits(self.stats.requested, requested)
            || !self.range_free(seg.addr, size)
        {
            return false;
        }
        let mut blocks: Vec<(u64, Option<u64>)> = Vec::new();
        for &(s, r) in &seg.blocks {
            match (blocks.last_mut(), r) {
                (Some((last, None)), None) => *last += s,
                _ => blocks.push((s, r)),
            }
        }
        self.ranges.insert(seg.addr, size);
        self.total_allocated_memory = self.total_allocated_memory.saturating_add(size);
        self.stats.segments += 1;
        self.inc_reserved(size);
        let split = blocks.len() > 1;
        let (mut ptr, mut prev) = (seg.addr, None);
        for (s, r) in blocks {
            let mut b = Block::new(seg.stream, seg.pool, ptr, s);
            b.prev = prev;
            let id = self.new_block(b);
            if let Some(p) = prev {
                self.bm(p).next = Some(id);
            }
            match r {
                Some(requested) => {
                    let b = self.bm(id);
                    b.allocated = true;
                    b.requested = requested;
                    self.active.insert(ptr, id);
                    self.inc_allocated(s);
                    self.inc_active(s);
                    self.stats.requested += requested;
                }
                None => {
                    self.insert_into_blocks(id);
                    if split {
                        self.stats.inactive_split += s;
                        self.inactive_split_blocks += 1;
                    }
                }
            }
            prev = Some(id);
            ptr += s;
        }
        true
    }

    /// `malloc`: allocates `size` bytes on `stream` and returns the block's
    /// address, or the OOM PyTorch would raise (after emitting `Oom`).
    ///
    /// A zero-byte request returns address 0 without touching the allocator
    /// (`CUDACachingAllocator::allocate(0)` hands out a null pointer), and
    /// `free(0)` is a no-op.
    pub fn malloc(
        &mut self,
        size: u64,
        stream: u64,
        sink: &mut dyn EventSink,
    ) -> Result<u64, OomError> {
        if size == 0 {
            return Ok(0);
        }
        self.process_events(sink);
        let rsize = self.cfg.alloc.round_size(size);
        let pool = rules::pool_for_size(rsize);
        let alloc_size = rules::get_allocation_size(rsize);

        let found = self.find_or_allocate(pool, stream, rsize, alloc_size, sink);
        self.segment_addr = None;
        let Some(block) = found else {
            return Err(self.out_of_memory(stream, size, rsize, alloc_size, sink));
        };
        let split = rules::should_split(
            self.b(block).size,
            rsize,
            pool,
            self.cfg.alloc.expandable_segments,
            self.cfg.alloc.max_split_size,
        );
        Ok(self.alloc_found_block(block, rsize, size, split, sink))
    }

    /// `malloc`'s search order: a cached block, garbage collection, a new
    /// segment, freeing oversize cached blocks and retrying, freeing every
    /// cached segment and retrying.
    fn find_or_allocate(
        &mut self,
        pool: SegmentPool,
        stream: u64,
        rsize: u64,
        alloc_size: u64,
        sink: &mut dyn EventSink,
    ) -> Option<BlockId> {
        let mut found = self.get_free_block(pool, stream, rsize);
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks(sink);
            }
            found = self.alloc_block(pool, stream, rsize, alloc_size, false, sink);
            if found.is_none() && self.release_available_cached_blocks(pool, stream, rsize, sink) {
                found = self.alloc_block(pool, stream, rsize, alloc_size, false, sink);
            }
            if found.is_none() {
                self.release_cached_blocks(sink);
                found = self.alloc_block(pool, stream, rsize, alloc_size, true, sink);
            }
        }
        found
    }

    /// Emits `Oom`, counts it, and returns the error PyTorch would raise.
    fn out_of_memory(
        &mut self,
        stream: u64,
        requested: u64,
        rounded: u64,
        alloc_size: u64,
        sink: &mut dyn EventSink,
    ) -> OomError {
        let device_free = self.device_free();
        self.emit(
            sink,
            EventKind::Oom {
                place: self.place(stream),
                device_free,
                request: rounded,
            },
        );
        self.stats.ooms += 1;
        OomError {
            device: self.cfg.device,
            stream,
            requested,
            rounded,
            alloc_size,
            device_free,
            device_total: self.cfg.capacity,
            allocated: self.stats.allocated,
            reserved: self.stats.reserved,
        }
    }

    /// `free`: the tensor releases the block at `addr`.
    pub fn free(&mut self, addr: u64, sink: &mut dyn EventSink) -> Result<(), SimError> {
        if addr == 0 {
            return Ok(());
        }
        let id = match self.active.get(&addr) {
            Some(&id) if self.b(id).allocated => id,
            _ => return Err(SimError::UnknownAddress(addr)),
        };
        let (size, requested, stream) = {
            let b = self.bm(id);
            b.allocated = false;
            (b.size, b.requested, b.stream)
        };
        self.tags.remove(&addr);
        self.stats.allocated -= size;
        self.emit(
            sink,
            EventKind::FreeRequested {
                place: self.place(stream),
                addr,
                size: requested,
            },
        );
        if !self.b(id).stream_uses.is_empty() {
            // insert_events: one event per recorded stream.
            let b = self.bm(id);
            b.event_count += b.stream_uses.len() as u32;
            b.stream_uses.clear();
            self.pending.push(id);
        } else {
            self.free_block(id, sink);
        }
        Ok(())
    }

    /// `recordStream`: the block at `addr` is used on `stream` too, so a
    /// later free waits for that stream.
    pub(crate) fn record_stream(&mut self, addr: u64, stream: u64) -> Result<(), SimError> {
        let id = match self.active.get(&addr) {
            Some(&id) if self.b(id).allocated => id,
            _ => return Err(SimError::UnknownAddress(addr)),
        };
        if self.b(id).stream != stream {
            self.bm(id).stream_uses.insert(stream);
        }
        Ok(())
    }

    /// Completes every pending free (the simulated streams are idle).
    pub(crate) fn synchronize(&mut self, sink: &mut dyn EventSink) {
        self.process_events(sink);
    }

    /// `emptyCache`: returns every whole free segment to the device (and
    /// unmaps free pages of expandable segments).
    pub fn empty_cache(&mut self, sink: &mut dyn EventSink) {
        self.release_cached_blocks(sink);
    }

    // ----- malloc internals ----------------------------------------------

    /// `process_events` / `synchronize_and_free_events`.
    fn process_events(&mut self, sink: &mut dyn EventSink) {
        for id in std::mem::take(&mut self.pending) {
            self.bm(id).event_count = 0;
            self.free_block(id, sink);
        }
    }

    fn expandable_size(&self, id: BlockId) -> u64 {
        let b = self.b(id);
        b.size
            + b.next
                .map(|n| self.b(n))
                .filter(|n| !n.mapped)
                .map_or(0, |n| n.size)
    }

    /// `get_free_block`: best fit among the free blocks of this stream.
    fn get_free_block(&mut self, pool: SegmentPool, stream: u64, size: u64) -> Option<BlockId> {
        if self.gc_enabled() {
            self.pools[pidx(pool)].get_free_blocks_call_count += 1;
        }
        let p = &self.pools[pidx(pool)];
        let mut iter = p
            .blocks
            .range((stream, size, 0)..)
            .take_while(|(k, _)| k.0 == stream);
        let mut it = *iter.next()?.1;
        if self.ties_high && self.b(it).es.is_none() {
            let size = self.b(it).size;
            if let Some((_, &last)) = p
                .blocks
                .range((stream, size, 0)..=(stream, size, u64::MAX))
                .rev()
                .find(|(_, &id)| self.b(id).es.is_none())
            {
                it = last;
            }
        }
        if self.b(it).es.is_some() {
            if self.cfg.alloc.expandable_segments {
                // Treat a block followed by unmapped space as the size it can
                // grow to; prefer a later candidate that grows less.
                for (_, &next) in iter {
                    if self.b(it).es.is_some()
                        && self.expandable_size(next) < self.expandable_size(it)
                    {
                        it = next;
                    } else {
                        break;
                    }
                }
            } else {
                // Expandable segments turned off: skip expandable blocks.
                it = *iter
                    .map(|(_, id)| id)
                    .find(|&&id| self.b(id).es.is_none())?;
            }
        }
        let bsize = self.b(it).size;
        if !rules::oversize_block_acceptable(
            size,
            bsize,
            self.cfg.alloc.max_split_size,
            self.cfg.alloc.max_non_split_rounding_size,
        ) {
            return None;
        }
        self.erase_from_blocks(it);
        Some(it)
    }

    /// `alloc_block`: a new segment from the device (or new pages of an
    /// expandable segment).
    fn alloc_block(
        &mut self,
        pool: SegmentPool,
        stream: u64,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
        sink: &mut dyn EventSink,
    ) -> Option<BlockId> {
        if is_retry {
            self.stats.alloc_retries += 1;
        }
        if let Some(max) = self.allowed_memory_maximum() {
            if self.total_allocated_memory.saturating_add(alloc_size) > max {
                return None;
            }
        }
        if self.cfg.alloc.expandable_segments {
            return self.try_allocate_expandable_block(pool, stream, size, sink);
        }
        // cudaMalloc
        if self.total_allocated_memory.saturating_add(alloc_size) > self.cfg.capacity {
            return None;
        }
        let ptr = self.va_alloc(alloc_size, rules::K_SMALL_BUFFER);
        self.total_allocated_memory += alloc_size;
        let id = self.new_block(Block::new(stream, pool, ptr, alloc_size));
        self.stats.segments += 1;
        self.inc_reserved(alloc_size);
        self.emit(
            sink,
            EventKind::SegmentAlloc {
                place: self.place(stream),
                addr: ptr,
                size: alloc_size,
            },
        );
        Some(id)
    }

    /// `alloc_found_block`: hands out `block`, splitting off the remainder.
    fn alloc_found_block(
        &mut self,
        block: BlockId,
        size: u64,
        orig_size: u64,
        split: bool,
        sink: &mut dyn EventSink,
    ) -> u64 {
        let block = if split {
            self.split_block(block, size)
        } else {
            let b = self.b(block);
            if b.is_split() && b.es.is_none() {
                let freed_split = b.size;
                self.stats.inactive_split -= freed_split;
                self.inactive_split_blocks -= 1;
            }
            block
        };
        let (ptr, bsize, stream) = {
            let b = self.bm(block);
            b.allocated = true;
            b.requested = orig_size;
            (b.ptr, b.size, b.stream)
        };
        self.emit(
            sink,
            EventKind::Alloc {
                place: self.place(stream),
                addr: ptr,
                size: orig_size,
            },
        );
        if !self.ctx.is_none() {
            self.tags.insert(ptr, self.ctx);
        }
        self.active.insert(ptr, block);
        self.inc_allocated(bsize);
        self.inc_active(bsize);
        self.stats.requested += orig_size;
        ptr
    }

    /// The split in `alloc_found_block`: the first `size` bytes of the free
    /// block `remaining` become a new block (returned), and `remaining`, the
    /// rest, goes back to its pool.
    fn split_block(&mut self, remaining: BlockId, size: u64) -> BlockId {
        let already_split = self.b(remaining).is_split();
        let expandable = self.b(remaining).es.is_some();
        let ptr = self.b(remaining).ptr;
        let nid = self.link_new(remaining, Side::Before, ptr, size, true);
        {
            let r = self.bm(remaining);
            r.ptr += size;
            r.size -= size;
        }
        self.insert_into_blocks(remaining);
        if !expandable {
            if already_split {
                // An already-split inactive block shrinks by `size`.
                self.stats.inactive_split -= size;
            } else {
                // A new split inactive block appears.
                self.stats.inactive_split += self.b(remaining).size;
                self.inactive_split_blocks += 1;
            }
        }
        nid
    }

    /// `free_block`: returns a block to its pool, merging free neighbours.
    fn free_block(&mut self, id: BlockId, sink: &mut dyn EventSink) {
        let (orig_ptr, orig_size, requested, stream, prev, next) = {
            let b = self.b(id);
            debug_assert!(!b.allocated && b.event_count == 0 && b.stream_uses.is_empty());
            (b.ptr, b.size, b.requested, b.stream, b.prev, b.next)
        };
        self.emit(
            sink,
            EventKind::FreeCompleted {
                place: self.place(stream),
                addr: orig_ptr,
                size: requested,
            },
        );
        let mut net_blocks: i64 = 0;
        let mut net_size: i64 = 0;
        for cand in [prev, next] {
            let subsumed = self.try_merge_blocks(id, cand);
            if subsumed > 0 {
                net_blocks -= 1;
                net_size -= subsumed as i64;
            }
        }
        self.active.remove(&orig_ptr);
        self.insert_into_blocks(id);
        if self.b(id).is_split() {
            net_blocks += 1;
            net_size += self.b(id).size as i64;
        }
        // Expandable segments are excluded from inactive_split, as in PyTorch.
        if self.b(id).es.is_none() {
            self.inactive_split_blocks = (self.inactive_split_blocks as i64 + net_blocks) as u64;
            self.stats.inactive_split = (self.stats.inactive_split as i64 + net_size) as u64;
        }
        self.stats.active -= orig_size;
        self.stats.requested -= requested;
    }

    /// `try_merge_blocks`: absorbs `src` into `dst` when `src` is free and
    /// mapped alike; returns the absorbed size (0 when nothing merged).
    fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        {
            let s = self.b(src);
            let d = self.b(dst);
            if s.allocated || s.event_count > 0 || !s.stream_uses.is_empty() || d.mapped != s.mapped
            {
                return 0;
            }
        }
        // Remove src from its set while its key is intact.
        if self.b(src).mapped {
            self.erase_from_blocks(src);
        } else {
            self.erase_unmapped(src);
        }
        let s = self.b(src).clone();
        if self.b(dst).prev == Some(src) {
            let d = self.bm(dst);
            d.ptr = s.ptr;
            d.prev = s.prev;
            if let Some(p) = s.prev {
                self.bm(p).next = Some(dst);
            }
        } else {
            self.bm(dst).next = s.next;
            if let Some(n) = s.next {
                self.bm(n).prev = Some(dst);
            }
        }
        self.bm(dst).size += s.size;
        self.delete_block(src);
        s.size
    }

    /// Merges `id` with whichever of its neighbours can be merged.
    fn merge_neighbours(&mut self, id: BlockId) {
        let (prev, next) = (self.b(id).prev, self.b(id).next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
    }

    // ----- expandable segments -------------------------------------------

    fn allocatable(&self, id: Option<BlockId>) -> bool {
        id.map(|i| self.b(i))
            .is_some_and(|b| !b.allocated && b.event_count == 0 && b.stream_uses.is_empty())
    }

    /// `find_expandable_block`: the lowest-address run of free/unmapped
    /// blocks of this stream with room for `size`, or a new segment.
    fn find_expandable_block(&mut self, pool: SegmentPool, stream: u64, size: u64) -> BlockId {
        let candidates: Vec<BlockId> = self.pools[pidx(pool)]
            .unmapped
            .range((stream, 0)..)
            .take_while(|(k, _)| k.0 == stream)
            .map(|(_, &id)| id)
            .collect();
        for c in candidates {
            let mut c = c;
            let prev = self.b(c).prev;
            if self.allocatable(prev) {
                c = prev.unwrap_or(c);
            }
            // has_available_address_space
            let mut bytes = 0;
            let mut cur = Some(c);
            while bytes < size && self.allocatable(cur) {
                let b = self.b(cur.unwrap_or(c));
                bytes += b.size;
                cur = b.next;
            }
            if bytes >= size {
                return c;
            }
        }
        let page = rules::expandable_page_size(pool);
        let space = rules::expandable_address_space(self.cfg.capacity, pool);
        // cuMemAddressReserve with no alignment asked: the base is aligned to
        // the mapping granularity (2 MiB), not to the segment's page size.
        let base = self.va_alloc(space, rules::K_SMALL_BUFFER);
        let es_id = self.next_es;
        self.next_es += 1;
        self.expandable.insert(
            es_id,
            ExpandableSegment {
                base,
                size: space,
                page,
            },
        );
        let mut b = Block::new(stream, pool, base, space);
        b.mapped = false;
        b.es = Some(es_id);
        let id = self.new_block(b);
        self.insert_unmapped(id);
        id
    }

    /// `map_block`: backs the first `size` bytes of the unmapped block with
    /// whole pages (all or nothing).
    fn map_block(&mut self, to_map: BlockId, size: u64, sink: &mut dyn EventSink) -> bool {
        let (es_id, ptr, bsize, stream) = {
            let b = self.b(to_map);
            debug_assert!(!b.mapped && size <= b.size);
            (b.es.expect("expandable"), b.ptr, b.size, b.stream)
        };
        let es = &self.expandable[&es_id];
        let begin = (ptr - es.base) / es.page;
        let end = (ptr + size - es.base).div_ceil(es.page);
        debug_assert_eq!(es.base + begin * es.page, ptr);
        let mapped_size = (end - begin) * es.page;
        if mapped_size == 0
            || self.total_allocated_memory.saturating_add(mapped_size) > self.cfg.capacity
        {
            return false; // cuMemCreate failed: pages created so far are released
        }
        self.erase_unmapped(to_map);
        self.bm(to_map).mapped = true;
        if mapped_size < bsize {
            let rid = self.link_new(
                to_map,
                Side::After,
                ptr + mapped_size,
                bsize - mapped_size,
                false,
            );
            self.insert_unmapped(rid);
            self.bm(to_map).size = mapped_size;
        }
        self.merge_neighbours(to_map);
        self.insert_into_blocks(to_map);
        self.total_allocated_memory += mapped_size;
        self.inc_reserved(mapped_size);
        self.emit(
            sink,
            EventKind::SegmentMap {
                place: self.place(stream),
                addr: ptr,
                size: mapped_size,
            },
        );
        true
    }

    /// `try_allocate_expandable_block`.
    fn try_allocate_expandable_block(
        &mut self,
        pool: SegmentPool,
        stream: u64,
        size: u64,
        sink: &mut dyn EventSink,
    ) -> Option<BlockId> {
        let mut candidate = self.find_expandable_block(pool, stream, size);
        if !self.b(candidate).mapped {
            let s = self.b(candidate).size.min(size);
            if !self.map_block(candidate, s, sink) {
                return None;
            }
        }
        while self.b(candidate).size < size {
            let remaining = size - self.b(candidate).size;
            let next = self.b(candidate).next.expect("unmapped space follows");
            let s = remaining.min(self.b(next).size);
            if !self.map_block(next, s, sink) {
                return None;
            }
            candidate = next;
        }
        self.erase_from_blocks(candidate);
        Some(candidate)
    }

    /// `unmap_block`: unmaps the whole free pages inside a free block.
    fn unmap_block(&mut self, id: BlockId, sink: &mut dyn EventSink) {
        let (es_id, ptr, size, stream) = {
            let b = self.b(id);
            (b.es.expect("expandable"), b.ptr, b.size, b.stream)
        };
        let es = &self.expandable[&es_id];
        let begin = (ptr - es.base).div_ceil(es.page);
        let end = (ptr + size - es.base) / es.page;
        if begin >= end {
            return;
        }
        let un_ptr = es.base + begin * es.page;
        let un_size = (end - begin) * es.page;
        self.erase_from_blocks(id);
        let before = un_ptr - ptr;
        if before > 0 {
            let bid = self.link_new(id, Side::Before, ptr, before, true);
            self.insert_into_blocks(bid);
        }
        let after = size - (before + un_size);
        if after > 0 {
            let aid = self.link_new(id, Side::After, un_ptr + un_size, after, true);
            self.insert_into_blocks(aid);
        }
        {
            let b = self.bm(id);
            b.ptr = un_ptr;
            b.size = un_size;
            b.mapped = false;
        }
        self.merge_neighbours(id);
        self.insert_unmapped(id);
        self.total_allocated_memory -= un_size;
        self.stats.reserved -= un_size;
        self.emit(
            sink,
            EventKind::SegmentUnmap {
                place: self.place(stream),
                addr: un_ptr,
                size: un_size,
            },
        );
    }

    /// `release_expandable_segment`: drops a wholly unmapped segment.
    fn release_expandable_segment(&mut self, id: BlockId) {
        let es_id = self.b(id).es.expect("expandable");
        debug_assert_eq!(self.b(id).size, self.expandable[&es_id].size);
        debug_assert!(!self.b(id).mapped);
        self.erase_unmapped(id);
        if let Some(es) = self.expandable.remove(&es_id) {
            self.ranges.remove(&es.base);
            if let Some(r) = self.regions.as_mut() {
                r.released(es.base, &self.ranges);
            }
        }
        self.delete_block(id);
    }

    // ----- releasing memory ----------------------------------------------

    /// `release_block`: `cudaFree` of a whole free segment.
    fn release_block(&mut self, id: BlockId, sink: &mut dyn EventSink) {
        let (ptr, size, stream) = {
            let b = self.b(id);
            debug_assert!(b.es.is_none() && !b.is_split() && !b.allocated);
            (b.ptr, b.size, b.stream)
        };
        self.emit(
            sink,
            EventKind::SegmentFree {
                place: self.place(stream),
                addr: ptr,
                size,
            },
        );
        self.total_allocated_memory -= size;
        self.stats.segments -= 1;
        self.stats.reserved -= size;
        self.ranges.remove(&ptr);
        if let Some(r) = self.regions.as_mut() {
            r.released(ptr, &self.ranges);
        }
        self.erase_from_blocks(id);
        self.delete_block(id);
    }

    /// `release_blocks`: frees every unsplit free segment of a pool and
    /// unmaps the free pages of its expandable segments.
    fn release_blocks(&mut self, pool: SegmentPool, sink: &mut dyn EventSink) {
        let ids: Vec<BlockId> = self.pools[pidx(pool)].blocks.values().copied().collect();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.b(id);
            if b.es.is_some() {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id, sink);
            }
        }
        for id in to_unmap {
            self.unmap_block(id, sink);
            if !self.b(id).is_split() && !self.b(id).mapped {
                self.release_expandable_segment(id);
            }
        }
    }

    /// `release_cached_blocks` (what `empty_cache` runs).
    fn release_cached_blocks(&mut self, sink: &mut dyn EventSink) -> bool {
        self.process_events(sink);
        self.release_blocks(SegmentPool::Large, sink);
        self.release_blocks(SegmentPool::Small, sink);
        true
    }

    /// `release_available_cached_blocks`: with `max_split_size` set, frees
    /// one oversize cached block large enough for the request, or several
    /// (largest first) adding up to it.
    fn release_available_cached_blocks(
        &mut self,
        pool: SegmentPool,
        stream: u64,
        size: u64,
        sink: &mut dyn EventSink,
    ) -> bool {
        let max_split = self.cfg.alloc.max_split_size;
        if max_split == UNLIMITED_SPLIT_SIZE {
            return false;
        }
        let key_size = size.max(max_split);
        let p = &self.pools[pidx(pool)];
        let first = p
            .blocks
            .range((stream, key_size, 0)..)
            .next()
            .map(|(k, &id)| (*k, id));
        if let Some((_, id)) = first {
            let b = self.b(id);
            if b.stream == stream && b.es.is_none() && !b.is_split() {
                self.release_block(id, sink);
                return true;
            }
        }
        let upper = first.map_or((stream, key_size, 0), |(k, _)| k);
        let candidates: Vec<BlockId> = self.pools[pidx(pool)]
            .blocks
            .range(..upper)
            .rev()
            .take_while(|(k, _)| k.0 == stream && k.1 >= max_split)
            .map(|(_, &id)| id)
            .collect();
        let mut released = 0;
        for id in candidates {
            if released >= key_size {
                break;
            }
            let b = self.b(id);
            if b.es.is_none() && !b.is_split() {
                released += b.size;
                self.release_block(id, sink);
            }
        }
        released >= key_size
    }

    /// `garbage_collect_cached_blocks`: with a memory fraction and a
    /// `garbage_collection_threshold`, frees cached unsplit large segments
    /// older than the average (age = `get_free_block` calls since cached)
    /// until reserved memory is back under the threshold.
    fn garbage_collect_cached_blocks(&mut self, sink: &mut dyn EventSink) {
        let Some(allowed) = self.allowed_memory_maximum() else {
            return;
        };
        let gc_threshold = (self.cfg.alloc.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return;
        }
        let target = self.total_allocated_memory - gc_threshold;
        let large = pidx(SegmentPool::Large);
        let calls = self.pools[large].get_free_blocks_call_count;
        let age = |b: &Block| calls - b.gc_count_base;
        let freeable = |b: &Block| !b.is_split() && b.es.is_none();
        let mut total_age: u64 = 0;
        let mut count: u64 = 0;
        for &id in self.pools[large].blocks.values() {
            let b = self.b(id);
            if freeable(b) {
                total_age += age(b);
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold = total_age as f64 / count as f64;
            freed = false;
            let ids: Vec<BlockId> = self.pools[large].blocks.values().copied().collect();
            for id in ids {
                let b = self.b(id);
                if freeable(b) && age(b) as f64 >= threshold {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= age(b);
                    count -= 1;
                    self.release_block(id, sink);
                }
            }
        }
    }

    // ----- inspection ----------------------------------------------------

    fn block_state(b: &Block) -> BlockState {
        if b.allocated {
            BlockState::Allocated
        } else if b.event_count > 0 || !b.stream_uses.is_empty() {
            BlockState::PendingFree
        } else {
            BlockState::Inactive
        }
    }

    /// Every segment with its blocks, sorted by address, as `snapshot()`
    /// reports them (an expandable segment shows one entry per contiguous
    /// mapped range).
    pub(crate) fn segments(&self) -> Vec<SegmentInfo> {
        let heads = self
            .pools
            .iter()
            .flat_map(|p| p.blocks.values())
            .chain(self.active.values())
            .copied()
            .filter(|&id| self.b(id).prev.is_none_or(|p| !self.b(p).mapped));
        let mut out: Vec<SegmentInfo> = heads
            .map(|head| {
                let h = self.b(head);
                let mut seg = SegmentInfo {
                    addr: h.ptr,
                    size: 0,
                    stream: h.stream,
                    pool: h.pool,
                    expandable: h.es.is_some(),
                    blocks: Vec::new(),
                };
                let mut cur = Some(head);
                while let Some(id) = cur {
                    let b = self.b(id);
                    if !b.mapped {
                        break;
                    }
                    seg.size += b.size;
                    seg.blocks.push(BlockInfo {
                        addr: b.ptr,
                        size: b.size,
                        requested: b.requested,
                        state: Self::block_state(b),
                    });
                    cur = b.next;
                }
                seg
            })
            .collect();
        out.sort_by_key(|s| s.addr);
        out
    }

    /// Emits a full state snapshot (`SnapshotBegin`, a `SnapshotSegment`
    /// followed by its `SnapshotBlock`s for each segment, `SnapshotEnd`) and
    /// returns its id.
    pub fn snapshot(&mut self, sink: &mut dyn EventSink) -> u32 {
        self.snapshot_seq = self.snapshot_seq.wrapping_add(1);
        let id = self.snapshot_seq;
        let segs = self.segments();
        let device = self.cfg.device;
        let nblocks = segs.iter().map(|s| s.blocks.len() as u64).sum();
        self.emit(
            sink,
            EventKind::SnapshotBegin {
                device,
                id,
                segments: segs.len() as u64,
                blocks: nblocks,
                at: None,
            },
        );
        for s in &segs {
            self.emit(
                sink,
                EventKind::SnapshotSegment {
                    id,
                    place: self.place(s.stream),
                    addr: s.addr,
                    size: s.size,
                    pool_kind: s.pool,
                    expandable: s.expandable,
                },
            );
            for b in &s.blocks {
                self.emit(
                    sink,
                    EventKind::SnapshotBlock {
                        id,
                        device,
                        addr: b.addr,
                        size: b.size,
                        requested: b.requested,
                        state: b.state,
                        ctx: match b.state {
                            BlockState::Inactive => CtxTag::NONE,
                            _ => self.tags.get(&b.addr).copied().unwrap_or_default(),
                        },
                    },
                );
            }
        }
        self.emit(sink, EventKind::SnapshotEnd { device, id });
        id
    }
}
