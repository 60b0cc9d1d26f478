//! What the views read: a serde-serialisable copy of the model, taken in one
//! call (`Model::view`) so a renderer never holds the model while drawing.
//! This is also the shape of `vramscope snapshot --json`.

use serde::{Deserialize, Serialize};

use super::device::{Block, Problem, Segment};
use super::leak::LeakReport;
use super::series::Column;
use super::{Mode, ProcessKey};
use crate::event::{Event, PoolId, Stats};

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
    /// `inactive_split / reserved` (absent when nothing is reserved).
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
}

/// Headline figures of one process.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProcessFigures {
    pub allocated: u64,
    pub reserved: u64,
    pub active: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// NVML's per-process used memory (absent without NVML).
    pub nvml_used: Option<u64>,
    pub nvml_peak: Option<u64>,
    /// NVML used − reserved: CUDA context, NCCL, cuBLAS workspaces… Absent
    /// without NVML; may be negative briefly (samples are not simultaneous).
    pub non_pytorch: Option<i64>,
    /// Allocator events per second over a sliding window.
    pub events_per_sec: Option<f64>,
    pub events_total: u64,
    pub lost_events: u64,
    pub inconsistencies: u64,
}

/// A block in a view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockView {
    pub addr: u64,
    #[serde(flatten)]
    pub block: Block,
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
    pub active: Vec<Option<Column>>,
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
    pub pool: PoolId,
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
    pub time_ns: u64,
    pub device: u16,
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
    pub snapshots_installed: u64,
    pub snapshots_discarded: u64,
    pub last_problem: Option<ProblemRecord>,
    pub nvml_timeline: Option<Vec<Option<Column>>>,
    /// Heap bytes the model holds for this process (estimate).
    pub memory_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelView {
    pub processes: Vec<ProcessView>,
}
