//! The allocator model: pure state rebuilt from decoded events. No I/O, no
//! clocks, no threads — the caller feeds events, loss counts and NVML
//! samples, each with its timestamp, and reads views.
//!
//! Module map:
//!
//! - [`Model`] (here): processes by [`ProcessKey`], the entry points.
//! - [`process`]: one process — devices, counters, recent events, OOMs,
//!   NVML, events/s, figures and views.
//! - [`device`]: one device allocator — the segment and block types, the
//!   queries, totals, peaks and drift against stats samples. Its operations
//!   are submodules:
//!   - `device::apply`: the event rules (Alloc … SegmentUnmap) and the
//!     contradictions they detect;
//!   - `device::snapshot`: receiving a snapshot (SnapshotBegin … End), and
//!     buffering the events that arrive meanwhile;
//!   - `device::install`: replacing the state from a complete snapshot and
//!     replaying those events.
//! - [`rules`]: PyTorch's block rules used to infer block sizes (the one
//!   place that guesses).
//! - [`series`]: bounded downsampling time series for timelines.
//! - [`leak`]: step detection, floor trend, growing allocation sizes.
//! - [`view`]: the serde-serialisable snapshot the views read.
//!
//! ```text
//!  events ──▶ Model::apply(key, ev) ──▶ Process ──▶ DeviceState (blocks)
//!  loss   ──▶ Model::note_loss          │            └ Series ×3
//!  NVML   ──▶ Model::note_nvml          ├ LeakDetector, EventRate, OOMs
//!                                       ▼
//!                      Model::view(now) → ModelView (serde)
//! ```

pub mod device;
pub mod leak;
pub mod process;
pub mod rules;
pub mod series;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use device::{Block, BlockSummary, Derived, DeviceState, Problem, Segment};
pub use leak::{LeakConfig, LeakDetector, LeakReport, LeakSize, StepSource};
pub use process::Process;
pub use rules::BlockRules;
pub use series::{Bucket, Column, Series, SeriesConfig};
pub use view::{ModelView, ProcessView, TimelineRequest, ViewOptions};

use crate::event::Event;

/// Identifies a process across pid reuse: pid plus its start time (e.g.
/// `/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ProcessKey {
    pub pid: u32,
    pub start_time: u64,
}

impl fmt::Display for ProcessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.pid, self.start_time)
    }
}

/// How a process is observed (set by the collector).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every allocator event through the tracker.
    #[default]
    Exact,
    /// Statistics and snapshots sampled by the agent; no per-event timeline.
    Sampled,
    /// No agent: NVML's figure only.
    NvmlOnly,
}

/// Settings of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub rules: BlockRules,
    pub series: SeriesConfig,
    pub leak: LeakConfig,
    /// Recent events kept per process.
    pub recent_events: usize,
    /// Events kept with each OOM record.
    pub oom_context: usize,
    /// OOM records kept per process (the newest).
    pub max_ooms: usize,
    /// Window of the events/s figure.
    pub rate_window_ns: u64,
    /// Compare the block map with stats samples and resync on lasting drift.
    pub check_drift: bool,
    /// Least time between two snapshot requests to one process (see
    /// [`Model::resync_due`]).
    pub resync_interval_ns: u64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            rules: BlockRules::default(),
            series: SeriesConfig::default(),
            leak: LeakConfig::default(),
            recent_events: 256,
            oom_context: 32,
            max_ooms: 64,
            rate_window_ns: 5_000_000_000,
            check_drift: true,
            resync_interval_ns: 2_000_000_000,
        }
    }
}

/// All processes the collector feeds.
#[derive(Debug, Clone, Default)]
pub struct Model {
    cfg: ModelConfig,
    processes: BTreeMap<ProcessKey, Process>,
}

impl Model {
    pub fn new(cfg: ModelConfig) -> Self {
        Self {
            cfg,
            processes: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The process, created on first use.
    pub fn process_mut(&mut self, key: ProcessKey) -> &mut Process {
        let cfg = &self.cfg;
        self.processes
            .entry(key)
            .or_insert_with(|| Process::new(key, cfg.clone()))
    }

    pub fn process(&self, key: ProcessKey) -> Option<&Process> {
        self.processes.get(&key)
    }

    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.processes.values()
    }

    /// Forget a process (it exited and the view no longer shows it).
    pub fn remove(&mut self, key: ProcessKey) -> Option<Process> {
        self.processes.remove(&key)
    }

    /// Apply one event of `key`.
    pub fn apply(&mut self, key: ProcessKey, ev: &Event) {
        self.process_mut(key).apply(ev);
    }

    /// Apply a batch of events of `key` (one map lookup).
    pub fn apply_all<'a>(&mut self, key: ProcessKey, events: impl IntoIterator<Item = &'a Event>) {
        let p = self.process_mut(key);
        for ev in events {
            p.apply(ev);
        }
    }

    /// `count` events of `key` were lost on the wire.
    pub fn note_loss(&mut self, key: ProcessKey, count: u64) {
        self.process_mut(key).note_loss(count);
    }

    /// NVML's used memory for `key` at `time_ns`.
    pub fn note_nvml(&mut self, key: ProcessKey, time_ns: u64, bytes: u64) {
        self.process_mut(key).note_nvml(time_ns, bytes);
    }

    pub fn set_mode(&mut self, key: ProcessKey, mode: Mode) {
        self.process_mut(key).set_mode(mode);
    }

    pub fn reset_peaks(&mut self, key: ProcessKey) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.reset_peaks();
        }
    }

    /// Whether the block map of `key` cannot be trusted (see
    /// [`Process::needs_resync`]), whether or not a snapshot is in flight.
    pub fn needs_resync(&self, key: ProcessKey) -> bool {
        self.processes.get(&key).is_some_and(Process::needs_resync)
    }

    /// Processes that need a snapshot and have none in flight (regardless
    /// of when one was last asked for).
    pub fn resync_wanted(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.processes
            .values()
            .filter(|p| p.resync_wanted())
            .map(Process::key)
    }

    /// Processes to ask for a snapshot at `now_ns`: those of
    /// [`resync_wanted`](Self::resync_wanted) not asked within
    /// [`ModelConfig::resync_interval_ns`]. The caller records each request
    /// it makes with [`resync_requested`](Self::resync_requested).
    pub fn resync_due(&self, now_ns: u64) -> Vec<ProcessKey> {
        self.processes
            .values()
            .filter(|p| p.resync_due(now_ns))
            .map(Process::key)
            .collect()
    }

    /// The caller asked `key` for a snapshot at `now_ns` (a process the
    /// model does not know is ignored).
    pub fn resync_requested(&mut self, key: ProcessKey, now_ns: u64) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.resync_requested(now_ns);
        }
    }

    /// A copy of everything the views show, at the caller's `now_ns`.
    pub fn view(&self, now_ns: u64, opts: &ViewOptions) -> ModelView {
        ModelView {
            processes: self
                .processes
                .values()
                .map(|p| p.view(now_ns, opts))
                .collect(),
        }
    }

    /// Heap bytes held by the model (estimate).
    pub fn memory_bytes(&self) -> usize {
        self.processes.values().map(Process::memory_bytes).sum()
    }
}
