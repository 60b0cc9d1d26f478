//! What the collector publishes: a whole picture of the machine at one
//! instant. The dashboard renders it; `vramscope snapshot --json` prints it.
//! Plain data, serde-serialisable, built under a short lock and then owned
//! by the reader.

use serde::{Deserialize, Serialize};

use vramscope_core::input::{Identity, Machine, Source, SourceProblem};
use vramscope_core::model::{ProcessKey, ProcessView};

/// One process: who it is, where its figures come from, and the model's
/// view of it (figures, devices with block maps, events, OOMs, leak report).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub identity: Identity,
    pub source: Source,
    pub view: ProcessView,
    /// The live advisor's advice, when it follows the process
    /// (`vramscope_core::sim::live`). Not read back from JSON.
    #[serde(default, skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub advice: Option<vramscope_core::sim::live::LiveAdvice>,
}

impl ProcessEntry {
    pub fn key(&self) -> ProcessKey {
        self.view.key
    }
}

/// The version of the `Snapshot` JSON shape.
pub(crate) const SNAPSHOT_VERSION: u32 = 1;

/// The whole picture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Snapshot {
    /// `SNAPSHOT_VERSION`.
    pub(crate) version: u32,
    /// Collector's `CLOCK_MONOTONIC` ns when taken.
    pub taken_ns: u64,
    pub machine: Machine,
    /// Processes ordered by key (pid, start time).
    pub processes: Vec<ProcessEntry>,
    pub problems: Vec<SourceProblem>,
    /// What the collector's and the model's bounds dropped that belongs to
    /// no one process (per-process drops are in each process's view).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) dropped: std::collections::BTreeMap<String, u64>,
    /// Segments the collector removed because their producer was gone
    /// (`--clean-stale`), the newest last; at most [`CLEANED_KEPT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleaned: Vec<CleanedSegment>,
}

/// Cleaned segments a snapshot lists (the newest).
pub(crate) const CLEANED_KEPT: usize = 8;

/// A segment removed because the process that wrote it was gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanedSegment {
    /// 1 for the first segment this collector removed, then 2, …
    pub number: u64,
    #[serde(deserialize_with = "vramscope_core::input::printable")]
    pub path: String,
    /// The producer's pid, as its segment names it.
    pub pid: u32,
}
