//! A simulator of PyTorch's CUDA caching allocator (workshops, demos, and
//! what-if replays of allocation traces).
//!
//! - [`pytorch`](crate::pytorch): the allocator's size rules as pure functions (shared with the model).
//! - [`conf`]: `PYTORCH_CUDA_ALLOC_CONF` parsing.
//! - [`allocator`]: [`SimAllocator`], one device's caching allocator, emitting trace events.
//! - [`trace`]: the JSON-lines request format and [`replay`].
//! - [`from_events`]: requests recovered from a recording; [`samples`]: a
//!   replay compared with the statistics samples the process took.
//! - [`scenario`]: named workshop scenarios and their [`ScenarioRunner`].
//!
//! # Fidelity
//!
//! Mirrored from `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator`)
//! and `c10/core/AllocatorConfig.cpp`:
//!
//! - sizes: 512-byte rounding and `roundup_power2_divisions` (`round_size`),
//!   small pool for rounded sizes `<= 1 MiB` in 2 MiB segments, 20 MiB
//!   segments below 10 MiB, 2 MiB rounding above (`get_allocation_size`);
//! - per-stream best fit over free blocks ordered by (stream, size, address)
//!   (`get_free_block`), splitting (`should_split`, `alloc_found_block`) and
//!   merging of free neighbours (`free_block`, `try_merge_blocks`);
//! - `max_split_size_mb` (oversize blocks are never split and serve oversize
//!   requests only within `max_non_split_rounding_mb`, default 20 MiB) and
//!   `release_available_cached_blocks`;
//! - `malloc`'s order: cached block, garbage collection, `cudaMalloc`, free
//!   oversize blocks and retry, free every unsplit cached segment
//!   (`release_cached_blocks`) and retry (counted in `num_alloc_retries`),
//!   then OOM (counted in `num_ooms`, `OOM` event with the device's free
//!   bytes and the rounded size);
//! - expandable segments: one virtual segment per stream and pool with 2 MiB
//!   (small) or 20 MiB (large) pages, address space 1 1/8 of device memory,
//!   lowest-address growth (`find_expandable_block`, `map_block`,
//!   `try_allocate_expandable_block`), page unmapping on `empty_cache` / retry
//!   (`unmap_block`, `release_blocks`); like PyTorch, mapped pages count in
//!   `reserved` but not in `segment`, and expandable blocks are excluded from
//!   `inactive_split`;
//! - `garbage_collection_threshold` (`garbage_collect_cached_blocks`), active
//!   only with a memory fraction, as in PyTorch;
//! - statistics with PyTorch's update points (allocated drops at
//!   `FREE_REQUESTED`, active/requested at `FREE_COMPLETED`), events with
//!   PyTorch's payloads, snapshots with one segment per `cudaMalloc` (or per
//!   contiguous mapped range of an expandable segment).
//!
//! Simplified: no CUDA graph / `MemPool` private pools (pool id is always
//! `(0, 0)`), no IPC or peer access, no free-memory callbacks; the device's
//! free memory is `capacity - reserved` (no CUDA context or other
//! processes); `recordStream` frees complete at the next `malloc`,
//! `empty_cache` or `synchronize` (the simulated GPU is never busy);
//! addresses come from a deterministic bump allocator and are never reused,
//! except where a replay says where segments go: the addresses a recording
//! holds, or the driver's address space modelled ([`va`]), so that ties
//! between equal free blocks break as on the device.
pub mod advice_text;
pub mod advise;
pub mod ahead;
pub mod allocator;
pub mod conf;
pub mod diff;
pub mod fit;
pub mod fit_live;
pub mod from_events;
pub mod live;
pub(crate) mod placement;
pub mod repeat;
pub mod samples;
pub mod scenario;
pub mod spread;
pub mod trace;
pub(crate) mod va;

pub use allocator::{
    BlockInfo, EventSink, FnSink, NullSink, OomError, SegmentInfo, SimAllocator, SimConfig,
    SimError,
};
pub use conf::{AllocConf, ConfError};
pub use scenario::{Scenario, ScenarioRunner, StepStats};
pub use trace::{
    parse_trace, render_table, replay, replay_with_sink, table_header, table_row, table_summary,
    Replay, Request, StepReport, TraceError, TraceParser, TraceReader, MAX_LINE,
};

#[cfg(test)]
mod alloc_tests;
