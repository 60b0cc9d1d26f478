//! The shared-memory wire between instrumented processes and vramscope.
//!
//! The format is specified in `crates/wire/src/ring/FORMAT.md`; this module and the C
//! writer `assets/agent/vramscope_ring.h` implement it.
//!
//! - [`layout`]: constants, header parsing and validation (pure).
//! - [`codec`]: events to slot words and back (pure): the slot codec.
//! - [`shm`]: the mapping as atomic words, kept valid when another process
//!   truncates the file (a SIGBUS handler); the only file with `unsafe`.
//! - [`writer`]: create a segment, write records, answer commands.
//! - [`reader`]: open and validate a segment, drain with exact loss counts
//!   and bounded work (FORMAT.md, "Reader limits").
//! - [`control`]: the command protocol, both ends.
//! - [`client`]: the one way to a process: a segment (named, or found by
//!   pid) opened once, a command posted on its control block, the answer
//!   waited for. The dashboard, the subcommands and the collector's resync
//!   requests all send through it.
//! - [`discover`]: names, hygiene checks, liveness, stale cleanup.

pub mod client;
pub mod codec;
pub mod control;
pub mod discover;
mod error;
pub mod layout;
pub(crate) mod reader;
pub mod shm;
pub mod writer;

pub use control::{Command, Outcome, Status};
pub use error::RingError;
pub use layout::Producer;
pub use reader::{RingCounts, SegmentReader, Start};
pub use shm::monotonic_ns;
pub use writer::{RingSpec, RingWriter, SegmentConfig, SegmentWriter};
