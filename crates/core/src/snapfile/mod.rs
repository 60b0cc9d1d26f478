//! PyTorch memory snapshot files (`torch.cuda.memory._dump_snapshot`, and
//! the OOM-observer dumps training frameworks write): read into plain data
//! ([`SnapshotFile`]), turned into the model's inputs ([`inputs`]), and
//! written from a recording ([`write`](mod@write)). The data types are
//! here; the reader that builds them from a file's pickle is
//! [`read`](mod@read).
//!
//! # What a file holds (torch 2.1 – 2.15)
//!
//! A pickled dict, written by Python's `pickle.dump` of what
//! `torch.cuda.memory._snapshot()` returns (itself unpickled from the C++
//! `_memory_snapshot_pickled`, `torch/csrc/cuda/memory_snapshot.cpp`):
//!
//! - `segments`: one dict per segment (a `cudaMalloc`, or a mapped range of
//!   an expandable segment): `device`, `address`, `total_size`,
//!   `allocated_size`, `active_size`, `requested_size`, `stream`,
//!   `segment_type` (`"small"`/`"large"`), `segment_pool_id` (a pair: a
//!   CUDA graph's or `MemPool`'s private pool, `(0, 0)` otherwise),
//!   `is_expandable`, `frames` (the stack that allocated it: dicts of
//!   `filename`, `line`, `name`, and with `augment_with_fx_traces` the
//!   `fx_*` keys, kept as [`Frame::extra`]), `blocks`:
//!   dicts of `address`, `size`, `requested_size`, `state`
//!   (`active_allocated`, `active_pending_free`, `inactive`), `frames`.
//! - `device_traces`: per device, the recorded events, oldest first:
//!   `action` (`alloc`, `free_requested`, `free_completed`,
//!   `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`,
//!   `snapshot`, `oom`, and from 2.14 `annotate`), `addr` (`device_free`
//!   for an OOM), `size`, `stream`, `frames`, and from later releases
//!   `time_us` (2.2), `compile_context` (2.6), `user_metadata` (2.10),
//!   `pool_id` (2.12), `internal_metadata` (2.15): [`EntryMeta`].
//! - from later releases: `allocator_settings` (the allocator's
//!   configuration, 2.4), `external_annotations` (2.6: [`Annotation`]),
//!   `host_segments` and `host_traces` (pinned host memory, 2.14:
//!   [`HostMemory`]). A "fast" snapshot (`include_traces=False`, 2.11) has
//!   the segments and no trace entries.
//!
//! Every key besides `segments` is optional (older releases lack them; a
//! reader ignores keys it does not know). A file holding a bare list of
//! segments (`pickle.dump(torch.cuda.memory_snapshot())`) is read as the
//! `segments` of a file without a trace.
//!
//! Frames are interned: a frame dict or a stack list that the pickle's memo
//! shares (the C++ side builds each unique frame and each unique traceback
//! once) is one entry of [`SnapshotFile::frames`] / [`SnapshotFile::stacks`],
//! named by index everywhere else.
//!
//! # Memory: counted per reference
//!
//! A value the memo shares is one value in the parse, however often the
//! file names it; what reading makes of it is not: a segment listed twice
//! is two segments, a string that two frames name is copied into each. So
//! everything reading makes (segments, blocks, trace entries, frames,
//! stacks, settings' text) is charged as it is made, once per reference,
//! against the same bound as the parse ([`pickle::bound`](crate::pickle::bound): 4 × the file +
//! 64 MiB, less what the parse holds), with what showing the file builds
//! from it (a trace entry's place in the timeline, a block's entries in
//! the states the trace is undone in: [`ENTRY_COST`](file::ENTRY_COST), [`BLOCK_COST`](file::BLOCK_COST)). A
//! file past it is refused with one line naming where, before the memory
//! is taken.

mod file;
pub mod inputs;
pub mod lines;
pub(crate) mod ours;
mod read;
pub mod write;

pub use file::{
    Action, Annotation, Block, EntryMeta, Frame, HostMemory, Segment, SnapError, SnapshotFile,
    Stacks, Totals, TraceEntry, MAX_SEGMENTS,
};
pub use read::{read, read_bytes, read_slice, read_slice_plain, read_slice_taking};
