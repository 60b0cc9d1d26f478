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

use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod client;
pub mod codec;
pub mod control;
pub mod discover;
pub mod layout;
pub(crate) mod reader;
pub mod shm;
pub mod writer;

pub use control::{Command, Outcome, Status};
pub use layout::Producer;
pub use reader::{RingCounts, SegmentReader, Start};
pub use shm::monotonic_ns;
pub use writer::{RingSpec, RingWriter, SegmentConfig, SegmentWriter};

/// Everything that can go wrong on the wire. Messages name the file and
/// what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: refused: {why}")]
    Refused { path: PathBuf, why: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{path}: not a valid segment: {why}")]
    InvalidFile { path: PathBuf, why: String },
    #[error("{0}: still being initialised by its producer")]
    Initialising(PathBuf),
    #[error("header parse needs {needed} bytes")]
    ShortCopy { needed: usize },
    #[error("the control block is busy (held by pid {holder_pid}; 0: an earlier command is still running)")]
    Busy { holder_pid: u32 },
    #[error("no answer from the process within {0:?}")]
    Timeout(Duration),
    #[error("the answer was overwritten by a newer command before it was read")]
    Superseded,
}

impl RingError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        RingError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub(crate) fn refused(path: &Path, why: impl Into<String>) -> Self {
        RingError::Refused {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
    pub(crate) fn invalid(path: &Path, why: impl Into<String>) -> Self {
        RingError::InvalidFile {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}
