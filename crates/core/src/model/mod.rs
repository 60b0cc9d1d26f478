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
//! - [`origin`]: where a block came from (its context and birth step), its
//!   phase as shown, the order of module paths: the floor the block map,
//!   leaks, roles and attribution stand on (it imports no other part).
//! - [`attrib`]: attribution — the definitions a process sent (strings,
//!   frames, stacks, contexts), the step its tags resolve against, live
//!   bytes by module and phase.
//! - [`roles`]: role lists matched to blocks (parameters, gradients, ...).
//! - [`stepdiff`]: what a step allocated that is still alive, from a view.
//! - [`view`]: the serde-serialisable snapshot the views read.
//!
//! Every structure that grows with the input has a bound in
//! [`ModelConfig::bounds`] ([`Bounds`]); what a bound drops is counted per
//! process ([`Dropped`], in [`ProcessView::dropped`]). Figures derived from
//! the input saturate instead of wrapping, and one that cannot be true is
//! flagged ([`Implausible`]) rather than shown as a fact.
//!
//! Memory per process, structure by structure (the figures of the default
//! [`ModelConfig`]; `Process::memory_bytes` counts each, and the test
//! `process::tests::documented_memory_bounds_hold` checks them after a long
//! run):
//!
//! | structure | bound | bytes at most |
//! |---|---|---:|
//! | event log (`eventlog`): the history, OOM context and snapshot placement | [`RECENT_EVENTS`] = 32,768 events × 40 B, and ≤ [`Bounds::places`] places × 32 B | 1.25 MiB |
//! | time series, per device: allocated, reserved and active in one bucket (`Series<3>`) | 5 tiers × 4,096 buckets × 80 B | 1.5625 MiB |
//! | period finder window (`period`), only while no markers or optimizer steps give the steps | 32,768 × 16 B | 0.5 MiB |
//! | role lists (`roles`): the list in use and the one being received | 2 × [`Bounds::roles`] = 2 × 65,536 tensors × 24 B | 3 MiB (GPT-2 small with Adam: about 600 tensors, 28 KiB) |
//! | block map, segments, orphans, attribution, leak sizes | [`Bounds`] | a few KiB for a real job |
//!
//! ```text
//!  events ──▶ Model::apply(key, ev) ──▶ Process ──▶ DeviceState (blocks)
//!  loss   ──▶ Model::note_loss          │            └ Series<3>
//!  NVML   ──▶ Model::note_nvml          ├ LeakDetector, EventRate, OOMs
//!                                       ▼
//!                      Model::view(now) → ModelView (serde)
//! ```

pub mod attrib;
pub mod device;
pub(crate) mod eventlog;
pub mod forecast;
pub mod leak;
pub(crate) mod origin;
pub(crate) mod period;
pub(crate) mod process;
pub mod roles;
pub(crate) mod rules;
pub mod rundiff;
pub(crate) mod series;
pub mod stepdiff;
pub mod view;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub(crate) use device::Block;
#[cfg(test)]
pub(crate) use device::{DeviceState, Problem};
pub(crate) use leak::LeakConfig;
#[cfg(test)]
pub(crate) use leak::StepSource;
pub use process::Process;
pub(crate) use rules::BlockRules;
pub(crate) use series::SeriesConfig;
pub use view::{
    Dropped, Implausible, ModelView, ProcessView, TimelineRequest, ViewOptions, WatchView,
};

use vramscope_wire::event::{Event, RingPos};

/// How and where watching a process began (recording format 1.1; every
/// field is "not given" in an `Attach` of a 1.0 recording).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Watch {
    /// The collector's monotonic ns when watching began.
    #[serde(default)]
    pub began_ns: Option<u64>,
    /// The process was already running: records written before watching
    /// began were skipped, and the state comes from an anchor snapshot.
    #[serde(default)]
    pub mid_run: bool,
    /// Per ring (index in the segment's ring table): the position the
    /// reader started at. Empty: not given.
    #[serde(default)]
    pub ring_starts: Vec<u64>,
    /// The snapshot the state is anchored on (FORMAT.md, "Attaching
    /// mid-run"), once known.
    #[serde(default)]
    pub anchor_snapshot: Option<u32>,
}

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

/// Events the history shows per process by default
/// ([`ModelConfig::recent_events`]): seconds of a typical job's events,
/// 0.33 s at 100,000 a second; sized for the Events pane and its search.
/// It was 65,536 until issue 28 measured what that costs: at eight busy
/// processes the logs were 20 MiB of a watcher's memory, written to at
/// every event.
pub const RECENT_EVENTS: usize = 1 << 15;

/// Events the process's log keeps at least, whatever the history shows:
/// placing a snapshot by its ring position needs the events after it, and
/// a snapshot is asked for and answered within a few collector ticks (at
/// 100,000 events a second, 32,768 events are 0.33 s, six collector
/// ticks).
pub(crate) const PLACEMENT_LOG: usize = 1 << 15;

/// Settings of the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub rules: BlockRules,
    pub series: SeriesConfig,
    pub leak: LeakConfig,
    /// Recent events shown per process (the dashboard's scrollable,
    /// searchable event history): 65,536 by default. They are kept in the
    /// process's compact log (40 bytes an event, 2.5 MiB at most by
    /// default), held only as the events arrive.
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
    /// How far each growing structure may grow (see [`Bounds`]).
    #[serde(default)]
    pub bounds: Bounds,
}

/// The bound of every structure of the model that grows with its input, so
/// that no input, however hostile, makes the model's memory grow without
/// limit. What a bound drops is counted per process ([`Dropped`], shown in
/// the view, `snapshot --json` and the dashboard's memory summary), and the
/// device it concerns is marked unsynced, so a snapshot is asked for.
///
/// The other bounds are fixed shapes: the time series
/// ([`SeriesConfig`]: `tiers × capacity` buckets, ≤ 640 KiB each by
/// default), recent events ([`ModelConfig::recent_events`]), OOM records
/// ([`ModelConfig::max_ooms`] × [`ModelConfig::oom_context`]) and floors of
/// the leak analysis ([`LeakConfig::window_steps`]).
///
/// With the defaults, one device holds at most about 76 MiB (orphans
/// ≈ 7.5 MiB, blocks ≤ 44 MiB, segments ≈ 6 MiB, the replay buffer of a
/// snapshot ≈ 16 MiB, its series ≈ 1.6 MiB), and one process's attribution
/// definitions at most about 20 MiB (4 MiB of strings, 4 × 65,536 table
/// entries); real allocators stay far below every bound (a busy training
/// job has a few thousand blocks and a few hundred contexts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bounds {
    /// Processes the model follows; the events of others are dropped
    /// (counted model-wide, [`Model::dropped_events`]). Far above the GPU
    /// processes of one machine.
    pub processes: usize,
    /// Devices per process (a node has at most 16 GPUs); events of devices
    /// beyond are dropped.
    pub devices: usize,
    /// Segments per device (the allocator's `cudaMalloc`s and mapped ranges:
    /// hundreds in practice); an event that would add one beyond is dropped.
    pub segments: usize,
    /// Blocks per device, over all its segments (so also per segment): an
    /// allocation that would split a block beyond it is dropped.
    pub blocks: usize,
    /// Orphan blocks per device (allocations outside every known segment):
    /// beyond it a new orphan is not kept and its bytes are not counted.
    pub orphans: usize,
    /// Allocator events buffered per device while a snapshot is received;
    /// beyond it the snapshot is given up. A snapshot announcing more
    /// segments or blocks than the bounds above is given up as well.
    pub replay: usize,
    /// Distinct allocation sizes the leak analysis tracks per process; a
    /// new size beyond it is not tracked (idle sizes are pruned at each step).
    pub leak_sizes: usize,
    /// Names of the collector's drop counts kept per process (`Dropped`
    /// inputs); further names add to `"other"`.
    pub collector_drop_names: usize,
    /// Definitions kept per kind (strings, frames, stacks, contexts; a
    /// producer keys contexts by module, phase and stack, so a long job
    /// uses a few hundred); a new one beyond is not kept.
    pub definitions: usize,
    /// Bytes of strings kept in all (a string is at most 4096 bytes).
    pub string_bytes: usize,
    /// Places (device, stream, pool) the event log names per process (a
    /// real job uses a handful); an event of a place beyond is not kept in
    /// the history.
    pub places: usize,
    /// Tensors of one role list kept (FORMAT.md "Roles": the agent sends
    /// at most 16,384; a model's parameters, gradients and optimizer state
    /// are a few thousand); entries beyond are not kept.
    pub roles: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            processes: 1024,
            devices: 16,
            segments: 1 << 16,
            blocks: 1 << 18,
            orphans: 1 << 16,
            replay: 1 << 18,
            leak_sizes: 4096,
            collector_drop_names: 16,
            definitions: 1 << 16,
            string_bytes: 4 << 20,
            places: 4096,
            roles: 1 << 16,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            rules: BlockRules::default(),
            series: SeriesConfig::default(),
            leak: LeakConfig::default(),
            recent_events: RECENT_EVENTS,
            oom_context: 32,
            max_ooms: 64,
            rate_window_ns: 5_000_000_000,
            check_drift: true,
            resync_interval_ns: 2_000_000_000,
            bounds: Bounds::default(),
        }
    }
}

/// All processes the collector feeds.
#[derive(Debug, Clone, Default)]
pub struct Model {
    cfg: ModelConfig,
    processes: BTreeMap<ProcessKey, Process>,
    /// Events (and other inputs) of processes beyond [`Bounds::processes`].
    dropped_events: u64,
}

impl Model {
    pub fn new(cfg: ModelConfig) -> Self {
        Self {
            cfg,
            processes: BTreeMap::new(),
            dropped_events: 0,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The process, created on first use while fewer than
    /// [`Bounds::processes`] are followed (`None` beyond: the caller's input
    /// is dropped and counted in [`dropped_events`](Self::dropped_events)).
    pub fn process_mut(&mut self, key: ProcessKey) -> Option<&mut Process> {
        if !self.processes.contains_key(&key)
            && self.processes.len() >= self.cfg.bounds.processes.max(1)
        {
            self.dropped_events = self.dropped_events.saturating_add(1);
            return None;
        }
        let cfg = &self.cfg;
        Some(
            self.processes
                .entry(key)
                .or_insert_with(|| Process::new(key, cfg.clone())),
        )
    }

    /// Whether `key` is followed (created if the bound allows).
    pub fn admit(&mut self, key: ProcessKey) -> bool {
        self.process_mut(key).is_some()
    }

    /// Inputs dropped because [`Bounds::processes`] processes were followed.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events
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

    #[cfg(test)]
    /// Apply one event of `key`.
    pub(crate) fn apply(&mut self, key: ProcessKey, ev: &Event) {
        if let Some(p) = self.process_mut(key) {
            p.apply(ev);
        }
    }

    /// Apply a batch of events of `key` (one map lookup).
    pub fn apply_all<'a>(&mut self, key: ProcessKey, events: impl IntoIterator<Item = &'a Event>) {
        self.apply_all_at(key, events, &[]);
    }

    /// Apply a batch of events of `key` with their ring positions (`at`:
    /// one per event, or empty when not given).
    pub fn apply_all_at<'a>(
        &mut self,
        key: ProcessKey,
        events: impl IntoIterator<Item = &'a Event>,
        at: &[RingPos],
    ) {
        let records = (events.into_iter().enumerate()).map(|(i, ev)| (ev, at.get(i).copied()));
        self.apply_records(key, records);
    }

    /// Apply events of `key` in order, each with its ring position when
    /// given (one map lookup for all).
    pub fn apply_records<'a>(
        &mut self,
        key: ProcessKey,
        records: impl IntoIterator<Item = (&'a Event, Option<RingPos>)>,
    ) {
        match self.process_mut(key) {
            Some(p) => {
                for (ev, at) in records {
                    p.apply_at(ev, at);
                }
            }
            None => {
                let n = records.into_iter().count() as u64;
                self.dropped_events = self.dropped_events.saturating_add(n.saturating_sub(1));
            }
        }
    }

    /// How watching `key` began (FORMAT.md, "Attaching mid-run").
    pub fn watch(&mut self, key: ProcessKey, watch: &Watch) {
        if let Some(p) = self.process_mut(key) {
            p.watch(watch);
        }
    }

    /// `count` events of `key` were lost on the wire.
    pub fn note_loss(&mut self, key: ProcessKey, count: u64) {
        if let Some(p) = self.process_mut(key) {
            p.note_loss(count);
        }
    }

    /// NVML's used memory for `key` at `time_ns`.
    pub fn note_nvml(&mut self, key: ProcessKey, time_ns: u64, bytes: u64) {
        if let Some(p) = self.process_mut(key) {
            p.note_nvml(time_ns, bytes);
        }
    }

    pub fn set_mode(&mut self, key: ProcessKey, mode: Mode) {
        if let Some(p) = self.process_mut(key) {
            p.set_mode(mode);
        }
    }

    pub fn reset_peaks(&mut self, key: ProcessKey) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.reset_peaks();
        }
    }

    #[cfg(test)]
    /// Whether the block map of `key` cannot be trusted (see
    /// [`Process::needs_resync`]), whether or not a snapshot is in flight.
    pub(crate) fn needs_resync(&self, key: ProcessKey) -> bool {
        self.processes.get(&key).is_some_and(Process::needs_resync)
    }

    #[cfg(test)]
    /// Processes that need a snapshot and have none in flight (regardless
    /// of when one was last asked for).
    pub(crate) fn resync_wanted(&self) -> impl Iterator<Item = ProcessKey> + '_ {
        self.processes
            .values()
            .filter(|p| p.resync_wanted())
            .map(Process::key)
    }

    /// Processes to ask for a snapshot at `now_ns`: those of
    /// `resync_wanted` not asked within
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
        self.view_for(now_ns, opts, None)
    }

    /// [`Self::view`] with `opts` (block map, events, timeline) for the
    /// process `focus` only, when given, and the figures alone for every
    /// other process (a dashboard shows one process's detail at a time).
    pub fn view_for(
        &self,
        now_ns: u64,
        opts: &ViewOptions,
        focus: Option<ProcessKey>,
    ) -> ModelView {
        let brief = ViewOptions {
            block_map: false,
            recent_events: 0,
            timeline: None,
        };
        ModelView {
            dropped_events: self.dropped_events,
            processes: self
                .processes
                .iter()
                .map(|(k, p)| {
                    let o = if focus.is_none_or(|f| f == *k) {
                        opts
                    } else {
                        &brief
                    };
                    p.view(now_ns, o)
                })
                .collect(),
        }
    }

    /// The collector dropped `count` things named `what` for `key` so far
    /// (an `Input::Dropped`; the latest count replaces earlier ones). Unknown
    /// processes are not created for it.
    pub fn note_collector_drop(&mut self, key: ProcessKey, what: &str, count: u64) {
        if let Some(p) = self.processes.get_mut(&key) {
            p.note_collector_drop(what, count);
        }
    }

    /// Heap bytes held by the model (estimate).
    pub fn memory_bytes(&self) -> usize {
        self.processes.values().map(Process::memory_bytes).sum()
    }
}
