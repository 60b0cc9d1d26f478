//! What the views read: a serde-serialisable copy of the model, taken in one
//! call (`Model::view`) so a renderer never holds the model while drawing.
//! This is also the shape of `vramscope snapshot --json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::config::{Bounds, Mode, ProcessKey};
use super::device::{Block, Problem, Segment};
use super::leak::LeakReport;
use super::roles::Role;
use super::series::Column;
use vramscope_wire::event::{Event, PoolId, Stats};

/// What to include in a view (the block map and timelines can be large).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewOptions {
    /// Include segments and blocks.
    pub block_map: bool,
    /// How many recent events per process (at most what the model keeps).
    pub recent_events: usize,
    /// Timelines over a window, one value range per column.
    pub timeline: Option<TimelineRequest>,
}

impl Default for ViewOptions {
    fn default() -> Self {
        Self {
            block_map: true,
            recent_events: 64,
            timeline: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimelineRequest {
    pub from_ns: u64,
    pub to_ns: u64,
    pub columns: usize,
}

/// Where headline figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FigureSource {
    /// The allocator's own statistics (exact).
    Stats,
    /// Summed from the block map.
    BlockMap,
}

/// Fragmentation of one device's reserved memory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fragmentation {
    /// Cached bytes in split segments (cannot be returned by `empty_cache`).
    pub inactive_split: u64,
    /// `inactive_split / reserved` (absent when nothing is reserved, and
    /// when above 1, which cannot be true: see [`Implausible`]).
    pub share_of_reserved: Option<f64>,
    pub largest_free_small: Option<u64>,
    pub largest_free_large: Option<u64>,
    /// Inactive blocks in the block map.
    pub free_blocks: u64,
}

/// Headline figures of one device in one process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceFigures {
    pub device: u16,
    pub source: FigureSource,
    pub allocated: u64,
    pub reserved: u64,
    pub active: u64,
    /// `requested_bytes` (stats only).
    pub requested: Option<u64>,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub peak_active: u64,
    pub fragmentation: Fragmentation,
    pub segments: u64,
    pub blocks: u64,
    /// The raw stats sample, when one arrived.
    pub stats: Option<Stats>,
    /// Block map trusted (complete snapshot, no contradiction since).
    pub synced: bool,
    /// Figures above that cannot be true (shown flagged, not as true).
    #[serde(default)]
    pub implausible: Implausible,
}

/// Figures that cannot be true, as the input gave them: each is flagged in
/// the view rather than shown as a fact (the input is wrong, or a sum did
/// not fit in 64 bits and was saturated).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Implausible {
    /// A sum or a block's end did not fit in 64 bits (saturated at `u64::MAX`).
    pub saturated: bool,
    /// A peak below its current figure.
    pub peak_below_current: bool,
    /// Allocated above active, or active above reserved.
    pub above_reserved: bool,
    /// Inactive split above reserved (a share above 100 %).
    pub share_above_100: bool,
}

impl Implausible {
    /// Whether any figure is flagged.
    pub fn any(&self) -> bool {
        self.saturated || self.peak_below_current || self.above_reserved || self.share_above_100
    }

    /// Both flags together.
    pub(crate) fn or(self, o: Implausible) -> Implausible {
        Implausible {
            saturated: self.saturated || o.saturated,
            peak_below_current: self.peak_below_current || o.peak_below_current,
            above_reserved: self.above_reserved || o.above_reserved,
            share_above_100: self.share_above_100 || o.share_above_100,
        }
    }

    /// What is flagged, in words.
    pub fn describe(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.saturated {
            out.push("sum past 2^64");
        }
        if self.peak_below_current {
            out.push("peak < current");
        }
        if self.above_reserved {
            out.push("allocated > reserved");
        }
        if self.share_above_100 {
            out.push("split > reserved");
        }
        out
    }
}

/// What the bounds of the model ([`Bounds`]) dropped for one process, and
/// what the collector reported dropping (`Input::Dropped`). Each figure
/// counts since the process was first seen.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Dropped {
    /// Allocations outside every known segment not kept ([`Bounds::orphans`]).
    pub orphans: u64,
    /// Allocations not applied: they would split a block beyond
    /// [`Bounds::blocks`].
    pub blocks: u64,
    /// Segment events not applied: they would add a segment (or its block)
    /// beyond [`Bounds::segments`] or [`Bounds::blocks`].
    pub segments: u64,
    /// Events of devices beyond [`Bounds::devices`].
    pub devices: u64,
    /// Events not buffered during a snapshot ([`Bounds::replay`]).
    pub replay: u64,
    /// Snapshots given up because they announced more segments or blocks
    /// than the bounds.
    pub snapshots: u64,
    /// Allocations of a size the leak analysis could not track
    /// ([`Bounds::leak_sizes`]).
    pub leak_sizes: u64,
    /// The collector's own drop counts by what (`Input::Dropped`).
    pub collector: BTreeMap<String, u64>,
    /// Attribution definitions not kept: beyond [`Bounds::definitions`] or
    /// [`Bounds::string_bytes`], or malformed.
    pub definitions: u64,
    /// Events not kept in the history: their place (device, stream, pool)
    /// was beyond [`Bounds::places`].
    pub history: u64,
    /// Role list tensors not kept ([`Bounds::roles`]).
    #[serde(default)]
    pub roles: u64,
    /// Records of memory outside the caching allocator refused here (past
    /// their bounds, or a figure no device holds) or dropped by the
    /// producer (its rate or bounds: DROPPED `what` 8) (1.3).
    #[serde(default)]
    pub outside: u64,
}

impl Dropped {
    /// Whether anything was dropped.
    pub fn any(&self) -> bool {
        self.model_total() > 0 || self.collector.values().any(|&c| c > 0)
    }

    /// Everything the model's bounds dropped.
    pub(crate) fn model_total(&self) -> u64 {
        [
            self.orphans,
            self.blocks,
            self.segments,
            self.devices,
            self.replay,
            self.snapshots,
            self.leak_sizes,
            self.definitions,
            self.history,
            self.roles,
            self.outside,
        ]
        .iter()
        .fold(0u64, |a, &b| a.saturating_add(b))
    }
}

/// Headline figures of one process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProcessFigures {
    pub allocated: u64,
    pub reserved: u64,
    pub(crate) active: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// NVML's per-process used memory (absent without NVML).
    pub nvml_used: Option<u64>,
    pub nvml_peak: Option<u64>,
    /// NVML used − reserved: CUDA context, NCCL, cuBLAS workspaces… Absent
    /// without NVML; may be negative briefly (samples are not simultaneous).
    pub non_pytorch: Option<i64>,
    /// The device memory outside the caching allocator the producer named
    /// (context, libraries: [`ProcessView::outside`]), all devices (1.3).
    #[serde(default)]
    pub outside_named: u64,
    /// `non_pytorch` − `outside_named`: what no one named (absent without
    /// NVML, or when the producer names nothing).
    #[serde(default)]
    pub unexplained: Option<i64>,
    /// Allocator events per second over a sliding window.
    pub events_per_sec: Option<f64>,
    pub events_total: u64,
    pub lost_events: u64,
    pub inconsistencies: u64,
    /// Figures above that cannot be true (a device's, or a sum saturated).
    #[serde(default)]
    pub implausible: Implausible,
}

/// A block in a view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockView {
    pub addr: u64,
    #[serde(flatten)]
    pub block: Block,
    /// What the block is to PyTorch (`model::roles`; allocated blocks only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// The module holding the tensor, when a role list named the block
    /// (one text shared by every block it holds).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "shared_text")]
    pub held_by: Option<std::sync::Arc<str>>,
}

/// A segment and its blocks in address order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentView {
    #[serde(flatten)]
    pub segment: Segment,
    pub blocks: Vec<BlockView>,
}

/// Timelines of one device over the requested window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTimeline {
    pub allocated: Vec<Option<Column>>,
    pub reserved: Vec<Option<Column>>,
    pub(crate) active: Vec<Option<Column>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceView {
    pub figures: DeviceFigures,
    pub segments: Vec<SegmentView>,
    pub orphans: Vec<BlockView>,
    pub timeline: Option<DeviceTimeline>,
}

/// An out-of-memory moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomRecord {
    pub time_ns: u64,
    pub device: u16,
    pub stream: u64,
    pub(crate) pool: PoolId,
    /// The rounded request that failed.
    pub request: u64,
    /// What the driver reported free on the device.
    pub device_free: u64,
    /// Largest inactive block in the pool the request would be served from.
    pub largest_free_in_pool: Option<u64>,
    /// Largest inactive block anywhere on the device.
    pub largest_free: Option<u64>,
    pub allocated: u64,
    pub reserved: u64,
    /// The events just before, oldest first.
    pub recent: Vec<Event>,
}

/// The last contradiction seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProblemRecord {
    pub(crate) time_ns: u64,
    pub(crate) device: u16,
    pub problem: Problem,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessView {
    pub key: ProcessKey,
    pub mode: Mode,
    pub needs_resync: bool,
    pub figures: ProcessFigures,
    pub devices: Vec<DeviceView>,
    pub recent_events: Vec<Event>,
    pub ooms: Vec<OomRecord>,
    pub ooms_total: u64,
    pub leak: LeakReport,
    /// When the job would run out of memory, while a leak is flagged and
    /// the producer said its memory limit (`model::forecast`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast: Option<crate::model::forecast::Forecast>,
    pub snapshots_installed: u64,
    pub snapshots_discarded: u64,
    pub last_problem: Option<ProblemRecord>,
    pub nvml_timeline: Option<Vec<Option<Column>>>,
    /// Heap bytes the model holds for this process (estimate).
    pub memory_bytes: usize,
    /// What the bounds dropped (and the collector reported dropping).
    #[serde(default)]
    pub dropped: Dropped,
    /// The bounds in force.
    #[serde(default)]
    pub bounds: Bounds,
    /// The leak criterion in force (what `leak` was judged against).
    #[serde(default)]
    pub leak_criterion: crate::model::config::LeakConfig,
    /// How watching began, and whether the state is anchored yet.
    #[serde(default)]
    pub watch: WatchView,
    /// Who holds the live memory: bytes by module and phase (empty from a
    /// producer that does not tag its events).
    #[serde(default)]
    pub attribution: crate::model::attrib::Attribution,
    /// Memory outside the caching allocator, by device, library and kind,
    /// largest first (1.3; empty from a producer that does not say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside: Vec<crate::model::outside::OutsidePart>,
    /// The times of the oldest and the newest sample the timelines hold
    /// (allocator or NVML; None: none yet): how far back a timeline can
    /// show anything, and where an exited process's ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<(u64, u64)>,
}

/// How watching a process began (FORMAT.md, "Attaching mid-run").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WatchView {
    /// When watching began (the collector's clock), when known.
    pub began_ns: Option<u64>,
    /// The process was already running: earlier records were skipped.
    pub mid_run: bool,
    /// Some device still waits for an anchor snapshot (its events are held).
    pub waiting_for_anchor: bool,
    /// Events dropped because an installed snapshot already reflected them.
    pub reflected_events: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    pub processes: Vec<ProcessView>,
    /// Inputs of processes beyond [`Bounds::processes`], dropped.
    #[serde(default)]
    pub(crate) dropped_events: u64,
}

/// An optional text shared between views' blocks (`Arc<str>`), in JSON
/// a plain string (serde's own `Arc` support is a feature not enabled).
pub(crate) mod shared_text {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(v: &Option<Arc<str>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(t) => s.serialize_some(&**t),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<str>>, D::Error> {
        Ok(Option::<String>::deserialize(d)?.map(Arc::from))
    }
}
