//! Everything that can go wrong on the wire, in one type.

use std::path::{Path, PathBuf};
use std::time::Duration;

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
