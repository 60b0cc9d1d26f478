//! One device allocator's state inside one process: segments and blocks,
//! rebuilt from events and re-synchronised from complete snapshots.
//!
//! This file holds the data types ([`Segment`], [`Block`], [`Problem`],
//! [`DeviceState`]…), the queries and the bookkeeping shared by all
//! operations (totals, peaks, timelines, drift against stats samples). The
//! operations live in submodules:
//!
//! - `apply`: applying allocator events (Alloc … SegmentUnmap);
//! - `snapshot`: receiving a snapshot (SnapshotBegin … SnapshotEnd) and
//!   buffering the events that arrive meanwhile;
//! - `install`: replacing the state from a complete snapshot and replaying
//!   the buffered events on it.
//!
//! Invariants (kept by every operation, checked by the tests):
//! - segments, blocks and orphans stay within their bounds
//!   ([`super::Bounds`]); an event that would pass one is dropped,
//!   counted and leaves the map unsynced;
//! - segments never overlap;
//! - the blocks of a segment tile it exactly (allocated, pending-free and
//!   inactive blocks together), and no two adjacent inactive blocks of one
//!   segment stay unmerged after a free completes;
//! - `allocated`, `active` and `reserved` equal the sums over the maps.
//!
//! Blocks seen in events but outside every known segment (e.g. from segments
//! created before the tracker attached) are kept apart as *orphans*, so the
//! allocated total stays right until the next snapshot replaces everything.

mod apply;
mod blockmap;
mod install;
mod parts;
mod pending;
mod placed;
mod placement;
mod snapshot;
mod state;

pub(crate) use parts::Live;
pub use parts::{Block, BlockSummary, Derived, HeldSegment, Problem, Segment};
pub(crate) use pending::SnapshotOutcome;
pub use placement::AnchoredFrom;
pub(crate) use placement::Verdict;
pub use state::DeviceState;
