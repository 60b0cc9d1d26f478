//! What the model is told and keeps: a process's key, how it is watched,
//! the mode, and the configuration with its bounds (the leak detector's
//! [`LeakConfig`] included). Every part of the model may stand on this
//! file; it stands only on the series' and the block rules' types.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::rules::BlockRules;
use super::series::SeriesConfig;

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
    /// [`Model::resync_due`](crate::model::Model::resync_due)).
    pub resync_interval_ns: u64,
    /// How far each growing structure may grow (see [`Bounds`]).
    #[serde(default)]
    pub bounds: Bounds,
}

/// The bound of every structure of the model that grows with its input, so
/// that no input, however hostile, makes the model's memory grow without
/// limit. What a bound drops is counted per process ([`Dropped`](crate::model::Dropped), shown in
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
    /// (counted model-wide, [`Model::dropped_events`](crate::model::Model::dropped_events)). Far above the GPU
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

/// Thresholds of the leak heuristic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakConfig {
    /// Steps needed before a verdict.
    pub min_steps: usize,
    /// Floor growth over the analysed window needed to flag.
    pub min_growth_bytes: u64,
    /// Kendall's τ between step index and floor needed to flag (0..1).
    pub min_trend: f64,
    /// Floors analysed (the most recent ones).
    pub window_steps: usize,
    /// Sizes named in a report.
    pub(crate) top_sizes: usize,
}

impl Default for LeakConfig {
    fn default() -> Self {
        Self {
            min_steps: 8,
            min_growth_bytes: 16 << 10,
            min_trend: 0.6,
            window_steps: 64,
            top_sizes: 5,
        }
    }
}
