//! What a snapshot file holds, read from PyTorch's pickle: its segments
//! and blocks, its trace, frames and stacks, the bounds a file is held to
//! and the figures PyTorch reports for it.

use std::path::PathBuf;

use serde::Serialize;

use crate::pickle;
use vramscope_wire::event::{BlockState, PoolId};

/// The most segments, blocks and trace entries a file may hold (far above
/// what an allocator has; a file that claims more is refused, so that memo
/// references cannot make a small file expand into a large state).
pub const MAX_SEGMENTS: usize = 1 << 16;
pub(crate) const MAX_BLOCKS: usize = 1 << 20;
pub(crate) const MAX_TRACE: usize = 1 << 24;

/// What reading one value costs against the bound, counted per
/// reference: the value, and what showing the file builds from it.
/// A segment's or block's entry in a map of a rebuilt state (B-tree
/// entries with their share of a node), of which the stepper keeps the
/// starting state and builds the dumped one.
pub(super) const STATE_ENTRY: usize = 64;
/// A trace entry, and its place in the timeline (the size of an
/// `inputs::Timed`, which a test of `inputs` holds this to).
pub(crate) const ENTRY_COST: usize =
    std::mem::size_of::<TraceEntry>() + std::mem::size_of::<(u16, u64, &'static TraceEntry)>();
/// A block, and its entries in the two states.
pub(crate) const BLOCK_COST: usize = std::mem::size_of::<Block>() + 2 * STATE_ENTRY;
/// A segment (its blocks apart), and its entries in the two states.
pub(crate) const SEGMENT_COST: usize = std::mem::size_of::<Segment>() + 2 * STATE_ENTRY;
/// A stack (its frame indices apart, 4 bytes each) or a frame (its
/// strings apart), with their entries in the maps that intern them and
/// what numbering them again takes.
pub(super) const STACK_COST: usize = 8 + 48;
pub(super) const FRAME_COST: usize = std::mem::size_of::<Frame>() + 48;

/// One source line of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
    /// The frame's other keys, as text, in the file's order (at most
    /// [`MAX_FRAME_EXTRA`]): `_snapshot(augment_with_fx_traces=True)`'s
    /// `fx_node_op`, `fx_node_name`, `fx_original_trace`, `fx_node_info`
    /// on the frames of FX-generated code.
    #[serde(skip_serializing_if = "Vec::is_empty", serialize_with = "as_map")]
    pub extra: Vec<(String, String)>,
}

/// Pairs as one JSON object, in their order.
pub(super) fn as_map<S: serde::Serializer>(
    pairs: &[(String, String)],
    ser: S,
) -> Result<S::Ok, S::Error> {
    ser.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// The most other keys of a frame kept.
pub(crate) const MAX_FRAME_EXTRA: usize = 8;

impl Frame {
    /// The value of other key `k`.
    pub(crate) fn get(&self, k: &str) -> Option<&str> {
        (self.extra.iter())
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
    pub(super) fn empty() -> Frame {
        Frame {
            filename: String::new(),
            line: 0,
            name: String::new(),
            extra: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: BlockState,
    /// Index into [`SnapshotFile::stacks`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Segment {
    pub device: u16,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    /// `segment_type == "large"`.
    pub large: bool,
    pub pool: PoolId,
    pub expandable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    pub blocks: Vec<Block>,
}

/// A trace entry's `action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// Metadata attached to a live allocation after the fact
    /// (`torch.cuda.memory._annotate_memory`, torch ≥ 2.14): `addr` is the
    /// allocation's, the note its `user_metadata`. Changes no state.
    Annotate,
}

impl Action {
    pub(crate) const ALL: [Action; 10] = [
        Action::Alloc,
        Action::FreeRequested,
        Action::FreeCompleted,
        Action::SegmentAlloc,
        Action::SegmentFree,
        Action::SegmentMap,
        Action::SegmentUnmap,
        Action::Snapshot,
        Action::Oom,
        Action::Annotate,
    ];

    /// The name PyTorch writes.
    pub fn name(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
            Action::Snapshot => "snapshot",
            Action::Oom => "oom",
            Action::Annotate => "annotate",
        }
    }

    pub(super) fn from_name(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }
}

/// One recorded allocator event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceEntry {
    pub action: Action,
    /// The block or segment address (for an OOM: the device's free bytes,
    /// PyTorch's `device_free`).
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// Microseconds since the epoch (torch ≥ 2.2; absent before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    /// What later releases add to an entry, when it says anything (boxed:
    /// most entries have none).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Box<EntryMeta>>,
}

impl TraceEntry {
    /// The entry's `user_metadata`, if it has one that is not empty.
    pub fn user_metadata(&self) -> Option<&str> {
        self.meta.as_ref().and_then(|m| m.user_metadata.as_deref())
    }
}

/// A trace entry's fields of later releases: `user_metadata`
/// (`torch.cuda.memory._set_memory_metadata`; torch ≥ 2.10),
/// `compile_context` (the `torch.compile` region, with
/// `_record_memory_history(compile_context=True)`; torch ≥ 2.6),
/// `internal_metadata` (the allocator's own tags; torch ≥ 2.15) and
/// `pool_id` (torch ≥ 2.12). An empty string (what torch writes when
/// nothing was set), the compile context `"N/A"` and the default pool
/// `(0, 0)` are kept as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EntryMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) user_metadata: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) compile_context: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) internal_metadata: Option<String>,
    #[serde(rename = "pool_id", skip_serializing_if = "Option::is_none")]
    pub(crate) pool: Option<PoolId>,
}

/// One entry of `external_annotations` (torch ≥ 2.6; `record_function`
/// regions seen while history is recorded, with
/// `_record_memory_history(global_record_annotations=True)` every one):
/// its device, time, and every other key as text (`name`, `stage`
/// `START`/`END`), in the file's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Annotation {
    pub(crate) device: Option<i64>,
    pub(crate) time_us: Option<i64>,
    pub(crate) fields: Vec<(String, String)>,
}

/// As one JSON object: `device`, `time_us`, then the other keys.
impl Serialize for Annotation {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("device", &self.device)?;
        m.serialize_entry("time_us", &self.time_us)?;
        for (k, v) in &self.fields {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// What a file holds of pinned host memory (`host_segments`,
/// `host_traces`: `_record_memory_history(record_pinned_host_memory=True)`,
/// torch ≥ 2.14): counted and summed, apart from the devices' figures
/// (pinned memory is host memory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostMemory {
    pub(crate) segments: u64,
    /// Σ `total_size` (else `size`) of the segments.
    pub(crate) reserved: u64,
    /// Σ `allocated_size` of the segments.
    pub(crate) allocated: u64,
    pub(crate) trace_entries: u64,
}

/// Stacks: each a run of indices into [`SnapshotFile::frames`] in one
/// shared vector. Serialized as a list of lists; equal when they hold the
/// same lists (renumbering may leave indices no run names).
#[derive(Debug, Clone, Default)]
pub struct Stacks {
    pub(super) frames: Vec<u32>,
    pub(super) runs: Vec<(u32, u32)>,
}

impl PartialEq for Stacks {
    fn eq(&self, other: &Stacks) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Stacks {}

impl Stacks {
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The frame indices of stack `id`, innermost first.
    pub fn get(&self, id: u32) -> Option<&[u32]> {
        let (start, len) = *self.runs.get(id as usize)?;
        self.frames
            .get(start as usize..(start as usize + len as usize))
    }

    /// Adds a stack; returns its id.
    pub(crate) fn push(&mut self, frames: &[u32]) -> u32 {
        let start = self.frames.len() as u32;
        self.frames.extend_from_slice(frames);
        self.runs.push((start, frames.len() as u32));
        self.runs.len() as u32 - 1
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &[u32]> {
        (0..self.runs.len() as u32).filter_map(|i| self.get(i))
    }
}

impl FromIterator<Vec<u32>> for Stacks {
    fn from_iter<I: IntoIterator<Item = Vec<u32>>>(iter: I) -> Stacks {
        let mut s = Stacks::default();
        for v in iter {
            s.push(&v);
        }
        s
    }
}

impl Serialize for Stacks {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.iter())
    }
}

/// What a file held, with the keys that tell its release apart.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SnapshotFile {
    pub segments: Vec<Segment>,
    /// Per device (the list's index), oldest first.
    pub traces: Vec<Vec<TraceEntry>>,
    pub frames: Vec<Frame>,
    /// Each a list of indices into `frames`, innermost first.
    pub stacks: Stacks,
    /// `allocator_settings`, as `key = value` text, in the file's order.
    pub allocator_settings: Vec<(String, String)>,
    /// `external_annotations`, in the file's order.
    pub annotations: Vec<Annotation>,
    /// Pinned host memory, when the file has `host_segments` or
    /// `host_traces`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostMemory>,
    /// Trace entries whose `action` this build does not know (skipped).
    pub unknown_actions: u64,
    /// What the file's shape says of the release that wrote it.
    pub format: String,
}

/// A file that could not be read: its path, where, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum SnapError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Pickle {
        path: PathBuf,
        source: pickle::PickleError,
    },
    /// A well-formed pickle that is not a snapshot (or a damaged one):
    /// `offset` is where the value at fault starts, `at` names it, e.g.
    /// `segments[3]['blocks'][0]`.
    #[error("{path}: at offset {offset} ({at}): {why}")]
    Shape {
        path: PathBuf,
        offset: u64,
        at: String,
        why: String,
    },
}

/// The longest start of `s` of at most `n` bytes.
pub(crate) fn head(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The figures PyTorch reports for a snapshot, per device: what
/// `open --json` prints and the fixtures' expected figures are checked
/// against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Totals {
    pub device: u16,
    pub segments: u64,
    pub blocks: u64,
    /// Σ `total_size`.
    pub reserved: u64,
    /// Σ `allocated_size`.
    pub allocated: u64,
    /// Σ `active_size`.
    pub active: u64,
}

impl SnapshotFile {
    /// Per-device totals, by device.
    pub fn totals(&self) -> Vec<Totals> {
        let mut out: Vec<Totals> = Vec::new();
        for s in &self.segments {
            let i = match out.iter().position(|t| t.device == s.device) {
                Some(i) => i,
                None => {
                    out.push(Totals {
                        device: s.device,
                        ..Totals::default()
                    });
                    out.len() - 1
                }
            };
            let t = &mut out[i];
            t.segments += 1;
            t.blocks += s.blocks.len() as u64;
            t.reserved = t.reserved.saturating_add(s.total_size);
            t.allocated = t.allocated.saturating_add(s.allocated_size);
            t.active = t.active.saturating_add(s.active_size);
        }
        out.sort_by_key(|t| t.device);
        out
    }

    /// The frames of stack `id`, innermost first.
    pub fn stack_frames(&self, id: u32) -> impl Iterator<Item = &Frame> {
        self.stacks
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|f| self.frames.get(*f as usize))
    }
}
