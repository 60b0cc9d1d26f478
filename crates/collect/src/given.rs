//! A file named on the command line (`open`, `diff`, `replay`, `export`,
//! `sim --trace`, `advise FILE`): a recording or a PyTorch snapshot file,
//! told apart by its first bytes, and read by every command the same way.
//!
//! A regular file is read from its path, as often as a command needs (a
//! `diff` reads a recording three times). Anything else (a pipe, `<(zcat
//! run.vsrec.gz)`, a FIFO, a character device) can be read only once: it
//! is read into memory once, up to [`MAX_PIPED`] bytes (a pipe that never
//! ends is refused there, in one line), and every reading after that is
//! of those bytes. One that starts as neither kind of file is refused
//! after its first bytes, before anything more is read.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vramscope_core::input::Input;
use vramscope_core::recording::{RecordingError, Replayer, MAGIC};
use vramscope_core::snapfile::{self, SnapError, SnapshotFile};

/// The most bytes read from a file that is not a regular file (a pipe):
/// 1 GiB. A larger one is refused with a line saying to give a regular
/// file.
pub(crate) const MAX_PIPED: u64 = 1 << 30;

/// What a pickle (a snapshot file) starts with: `PROTO`, for every
/// protocol PyTorch writes (2 to 5).
const PICKLE_PROTO: u8 = 0x80;

/// A file given to a command.
#[derive(Debug, Clone)]
pub struct Given {
    path: PathBuf,
    /// The bytes of a file that is not a regular one, read once.
    bytes: Option<Arc<[u8]>>,
    /// Say nothing on standard error of a recording's torn end.
    quiet: bool,
}

/// Why a given file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GivenError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    Refused { path: PathBuf, why: String },
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error(transparent)]
    Snapshot(#[from] SnapError),
}

impl Given {
    /// The file at `path`: a regular file as it is, anything else read
    /// once into memory (at most [`MAX_PIPED`] bytes).
    pub fn open(path: &Path) -> Result<Given, GivenError> {
        let io = |source| GivenError::Io {
            path: path.to_path_buf(),
            source,
        };
        // The file the name leads to (`/dev/fd/63` leads to a pipe).
        if std::fs::metadata(path).map_err(io)?.is_file() {
            return Ok(Given {
                path: path.to_path_buf(),
                bytes: None,
                quiet: false,
            });
        }
        let mut file = std::fs::File::open(path).map_err(io)?;
        let mut head = Vec::with_capacity(MAGIC.len());
        (&mut file)
            .take(MAGIC.len() as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
        let starts_right = head.is_empty()
            || head.first() == Some(&PICKLE_PROTO)
            || MAGIC.starts_with(&head[..head.len().min(MAGIC.len())]);
        if !starts_right {
            return Err(GivenError::Refused {
                path: path.to_path_buf(),
                why: format!(
                    "neither a vramscope recording nor a PyTorch snapshot file (it starts with 0x{:02x})",
                    head[0]
                ),
            });
        }
        Given::from_stream(path, head, file)
    }

    /// The file named `path` whose first bytes, `head`, were read from
    /// `rest` already (a command that streams other files, as `sim
    /// --trace` streams a JSON trace, and found a recording): the rest is
    /// read once into memory, at most [`MAX_PIPED`] bytes in all.
    pub fn from_stream(path: &Path, head: Vec<u8>, rest: impl Read) -> Result<Given, GivenError> {
        let mut bytes = head;
        let room = (MAX_PIPED + 1).saturating_sub(bytes.len() as u64);
        rest.take(room)
            .read_to_end(&mut bytes)
            .map_err(|source| GivenError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        if bytes.len() as u64 > MAX_PIPED {
            return Err(GivenError::Refused {
                path: path.to_path_buf(),
                why: format!(
                    "not a regular file, and it gives more than {} (a pipe is read into memory): write it to a file and give that",
                    vramscope_text::format::bytes(MAX_PIPED)
                ),
            });
        }
        Ok(Given::from_bytes(path, bytes))
    }

    /// A file held in memory, named `path` (tests, the fuzz targets).
    pub fn from_bytes(path: &Path, bytes: impl Into<Arc<[u8]>>) -> Given {
        Given {
            path: path.to_path_buf(),
            bytes: Some(bytes.into()),
            quiet: false,
        }
    }

    /// Says nothing on standard error of a recording's torn end (the fuzz
    /// targets).
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// The name it was given by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The name as shown.
    pub(crate) fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// Whether it starts as a vramscope recording does (a file that
    /// cannot be read is not one: reading it says why).
    pub fn is_recording(&self) -> bool {
        match &self.bytes {
            Some(b) => b.starts_with(MAGIC),
            None => {
                let mut head = Vec::with_capacity(MAGIC.len());
                std::fs::File::open(&self.path)
                    .and_then(|f| f.take(MAGIC.len() as u64).read_to_end(&mut head))
                    .is_ok_and(|_| head == MAGIC)
            }
        }
    }

    /// A reader of it as a recording, from its start.
    pub fn replayer(&self) -> Result<Replayer, RecordingError> {
        let r = match &self.bytes {
            Some(b) => Replayer::from_bytes(&self.path, b.clone())?,
            None => Replayer::open(&self.path)?,
        };
        Ok(if self.quiet { r.quiet() } else { r })
    }

    /// It read as a PyTorch snapshot file.
    pub fn snapshot(&self) -> Result<SnapshotFile, SnapError> {
        match &self.bytes {
            Some(b) => snapfile::read_bytes(&self.path, b),
            None => snapfile::read(&self.path),
        }
    }

    /// The model's inputs it holds, given to `apply` in order with their
    /// times, as often as `source` is called: a recording's, or those a
    /// snapshot file is shown by (`snapfile::inputs`). What `diff` compares.
    pub(crate) fn source(&self) -> Result<Box<Feed>, GivenError> {
        if self.is_recording() {
            return Ok(self.recording()?);
        }
        let file = self.snapshot()?;
        let start = snapfile::inputs::starting_state(&file);
        let label = self
            .path
            .file_name()
            .map_or(self.name(), |f| f.to_string_lossy().into_owned());
        Ok(Box::new(move |apply: &mut dyn FnMut(u64, Input)| {
            snapfile::inputs::feed(&file, &label, Default::default(), &start, apply);
            Ok(())
        }))
    }

    /// Its inputs as a recording, read as often as asked (a torn end said
    /// once).
    fn recording(&self) -> Result<Box<Feed>, RecordingError> {
        let first = self.replayer()?;
        Ok(Box::new(move |apply: &mut dyn FnMut(u64, Input)| {
            let mut r = first.again().map_err(|e| e.to_string())?;
            while let Some((t, input)) = r.next_input().map_err(|e| e.to_string())? {
                apply(t, input);
            }
            Ok(())
        }))
    }

    /// Process `pid` of it as a recording (its host or namespace pid;
    /// else the one with the most allocator events), its requests on
    /// `device` recovered: what `sim` and `advise` replay.
    pub fn recorded(
        &self,
        pid: Option<u32>,
        device: u16,
    ) -> Result<crate::recorded::Recorded, String> {
        let mut source = self.recording().map_err(|e| e.to_string())?;
        crate::recorded::recorded(&self.name(), pid, device, &mut *source)
    }

    /// The profile of process `pid` (its host or namespace pid; else the
    /// one with the most allocator events) for `diff`.
    pub fn profile(
        &self,
        pid: Option<u32>,
    ) -> Result<vramscope_core::model::rundiff::Profile, String> {
        let mut source = self.source().map_err(|e| e.to_string())?;
        crate::profile::profile(&self.name(), pid, &mut *source)
    }
}

/// A [`Given::source`]: gives every input, in order, to the closure given.
pub(crate) type Feed = dyn FnMut(&mut dyn FnMut(u64, Input)) -> Result<(), String> + Send;
