//! The state of one device allocator: its maps, totals, peaks, timelines
//! and drift against stats samples. The operations on it live beside it
//! (`apply`, `snapshot`, `install`, `placed`).

use std::collections::BTreeMap;

use super::blockmap::BlockMap;
use super::parts::{weigh, Block, BlockSummary, Derived, DeviceDropped, Problem, Segment};
use super::pending::Pending;
use super::placement::Placement;
use crate::model::config::Bounds;
use crate::model::series::{Series, SeriesConfig};
use vramscope_wire::event::{BlockState, SegmentPool, Stats};

/// How many past (allocated, reserved) totals a stats sample may match.
pub(super) const TOTALS_RING: usize = 16;
/// Consecutive mismatching stats samples before the model calls it drift.
pub(super) const DRIFT_SAMPLES: u32 = 3;
/// The state of one device allocator.
#[derive(Debug, Clone)]
pub struct DeviceState {
    pub(super) device: u16,
    pub(super) segments: BTreeMap<u64, Segment>,
    pub(super) blocks: BlockMap,
    pub(super) orphans: BTreeMap<u64, Block>,
    pub(super) allocated: u64,
    pub(super) active: u64,
    pub(super) reserved: u64,
    pub(super) unknown_kind: usize,
    /// A complete snapshot was installed and nothing contradicted it since.
    pub(super) synced: bool,
    pub(super) pending: Option<Pending>,
    pub(super) stats: Option<(u64, Stats)>,
    pub(super) totals: [(u64, u64); TOTALS_RING],
    pub(super) totals_pos: usize,
    pub(super) drift: u32,
    pub(super) peaks: Derived,
    /// The timelines of allocated, reserved and active bytes, in this order.
    pub(crate) series: Series<3>,
    pub(super) bounds: Bounds,
    pub(crate) dropped: DeviceDropped,
    /// A total or a range had to be saturated at `u64::MAX` since the last
    /// installed snapshot.
    pub(super) saturated: bool,
    /// Events kept with their ring positions, to place snapshots exactly.
    pub(super) placement: Placement,
    /// The process's current step, which the step tags of new blocks
    /// resolve against (see `origin::resolve_step`).
    pub(super) step_now: Option<u64>,
}

impl DeviceState {
    pub(crate) fn new(device: u16, series: &SeriesConfig, bounds: Bounds) -> Self {
        Self {
            device,
            segments: BTreeMap::new(),
            blocks: BlockMap::default(),
            orphans: BTreeMap::new(),
            allocated: 0,
            active: 0,
            reserved: 0,
            unknown_kind: 0,
            synced: false,
            pending: None,
            stats: None,
            totals: [(u64::MAX, u64::MAX); TOTALS_RING],
            totals_pos: 0,
            drift: 0,
            peaks: Derived::default(),
            series: Series::new(series.clone()),
            bounds,
            dropped: DeviceDropped::default(),
            saturated: false,
            placement: Placement::default(),
            step_now: None,
        }
    }

    /// The process's current step changed (a counted step boundary).
    pub(crate) fn set_step(&mut self, step: Option<u64>) {
        self.step_now = step;
    }

    pub fn device(&self) -> u16 {
        self.device
    }
    /// Segments in address order.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }
    /// All blocks inside segments, in address order.
    pub fn blocks(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.blocks.iter().map(|(a, b)| (*a, b))
    }
    /// The blocks of one segment, in address order.
    pub(crate) fn blocks_of<'a>(
        &'a self,
        seg: &Segment,
    ) -> impl Iterator<Item = (u64, &'a Block)> + 'a {
        self.blocks.range(seg.addr..seg.end()).map(|(a, b)| (*a, b))
    }
    /// Allocated blocks seen outside every known segment.
    pub(crate) fn orphans(&self) -> impl Iterator<Item = (u64, &Block)> {
        self.orphans.iter().map(|(a, b)| (*a, b))
    }
    /// Totals over the block map.
    pub fn derived(&self) -> Derived {
        Derived {
            allocated: self.allocated,
            active: self.active,
            reserved: self.reserved,
        }
    }
    /// The reserved figure shown for this device: the last statistics
    /// sample's, else the block map's (`Process::device_figures`'s
    /// `reserved`, without the block summary).
    pub(crate) fn reserved_figure(&self) -> u64 {
        self.stats().map_or(self.reserved, |(_, s)| s.reserved)
    }
    /// Peaks of the derived totals since the last reset.
    pub fn derived_peaks(&self) -> Derived {
        self.peaks
    }
    /// The last statistics sample and its time.
    pub(crate) fn stats(&self) -> Option<(u64, &Stats)> {
        self.stats.as_ref().map(|(t, s)| (*t, s))
    }
    /// True when a complete snapshot was installed and nothing contradicted it since.
    pub(crate) fn synced(&self) -> bool {
        self.synced
    }
    pub(crate) fn snapshot_in_progress(&self) -> bool {
        self.pending.is_some()
    }
    /// Whether a total or a range was cut at `u64::MAX` since the last
    /// installed snapshot (its figures cannot be true).
    pub(crate) fn saturated(&self) -> bool {
        self.saturated
    }
    /// Blocks held, orphans included.
    pub(crate) fn block_count(&self) -> usize {
        self.blocks.len() + self.orphans.len()
    }
    /// Orphan blocks held.
    pub fn orphan_count(&self) -> usize {
        self.orphans.len()
    }

    /// Add `(allocated, active)` bytes to the totals; false (and the totals
    /// cut at `u64::MAX`, flagged) when they do not fit.
    pub(super) fn count_in(&mut self, allocated: u64, active: u64) -> bool {
        let a = self.allocated.checked_add(allocated);
        let b = self.active.checked_add(active);
        self.allocated = a.unwrap_or(u64::MAX);
        self.active = b.unwrap_or(u64::MAX);
        let fits = a.is_some() && b.is_some();
        self.saturated |= !fits;
        fits
    }

    /// Add `size` bytes to the reserved total; false (cut, flagged) when
    /// they do not fit.
    pub(super) fn reserve(&mut self, size: u64) -> bool {
        let r = self.reserved.checked_add(size);
        self.reserved = r.unwrap_or(u64::MAX);
        self.saturated |= r.is_none();
        r.is_some()
    }

    /// Note a range `[addr, addr + size)` whose end is past `u64::MAX`.
    pub(super) fn overflowed(&mut self) {
        self.saturated = true;
    }

    pub(crate) fn desync(&mut self) {
        self.synced = false;
    }
    pub(crate) fn reset_peaks(&mut self) {
        self.peaks = self.derived();
    }

    /// Record the current totals (after an event changed the block map),
    /// and feed the timelines when the map is trusted.
    #[inline]
    pub(crate) fn after_change(&mut self, t: u64) {
        self.blocks.tidy();
        self.totals[self.totals_pos] = (self.allocated, self.reserved);
        self.totals_pos = (self.totals_pos + 1) % TOTALS_RING;
        self.peaks.allocated = self.peaks.allocated.max(self.allocated);
        self.peaks.active = self.peaks.active.max(self.active);
        self.peaks.reserved = self.peaks.reserved.max(self.reserved);
        if self.synced || self.stats.is_none() {
            (self.series).push(t, [self.allocated, self.reserved, self.active]);
        }
    }

    /// Take a statistics sample. Returns a drift problem when the block map
    /// disagreed with the allocator's own figures several samples in a row
    /// (only checked while synced and exact).
    pub(crate) fn note_stats(
        &mut self,
        t: u64,
        stats: Stats,
        check_drift: bool,
    ) -> Option<Problem> {
        self.stats = Some((t, stats));
        if !self.synced {
            (self.series).push(t, [stats.allocated, stats.reserved, stats.active]);
            self.drift = 0;
            return None;
        }
        if !check_drift || self.pending.is_some() {
            return None;
        }
        let seen = (stats.allocated, stats.reserved);
        if self.totals.contains(&seen) || seen == (self.allocated, self.reserved) {
            self.drift = 0;
            return None;
        }
        self.drift += 1;
        if self.drift >= DRIFT_SAMPLES {
            self.drift = 0;
            return Some(Problem::Drift {
                model_allocated: self.allocated,
                stats_allocated: stats.allocated,
            });
        }
        None
    }

    /// Take a block's bytes out of the totals.
    pub(super) fn count_out(&mut self, b: &Block) {
        let (allocated, active) = b.weight();
        self.allocated = self.allocated.saturating_sub(allocated);
        self.active = self.active.saturating_sub(active);
    }

    /// Fragmentation figures from the block map.
    pub fn block_summary(&self) -> BlockSummary {
        let mut out = BlockSummary {
            segments: self.segments.len() as u64,
            blocks: self.blocks.len() as u64,
            ..BlockSummary::default()
        };
        for s in self.segments.values() {
            for b in self.blocks.range(s.addr..s.end()).map(|(_, b)| b) {
                if b.state != BlockState::Inactive {
                    continue;
                }
                out.free_blocks += 1;
                if b.size < s.size {
                    out.inactive_split = out.inactive_split.saturating_add(b.size);
                }
                let slot = match s.pool_kind {
                    SegmentPool::Small => &mut out.largest_free_small,
                    SegmentPool::Large => &mut out.largest_free_large,
                };
                *slot = Some(slot.map_or(b.size, |m| m.max(b.size)));
            }
        }
        out
    }

    /// Estimated heap bytes held by this device's state.
    pub(crate) fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        // BTreeMap nodes hold up to 11 entries; assume two-thirds full.
        let map = |n: usize, entry: usize| n * entry * 3 / 2;
        let mut bytes = map(self.segments.len(), size_of::<(u64, Segment)>())
            + self.blocks.memory_bytes()
            + self.placement.memory_bytes()
            + map(self.orphans.len(), size_of::<(u64, Block)>())
            + self.series.memory_bytes();
        if let Some(p) = &self.pending {
            bytes += p.memory_bytes();
        }
        bytes
    }

    /// Check the invariants; returns a description of the first violation.
    /// (For tests and debug assertions; O(n).)
    pub fn check_invariants(&self) -> Result<(), String> {
        let b = &self.bounds;
        if self.segments.len() > b.segments.max(1)
            || self.blocks.len() > b.blocks.max(1)
            || self.orphans.len() > b.orphans
        {
            return Err(format!(
                "past a bound: {} segments, {} blocks, {} orphans ({b:?})",
                self.segments.len(),
                self.blocks.len(),
                self.orphans.len()
            ));
        }
        let mut last_end = 0;
        for (i, s) in self.segments.values().enumerate() {
            if i > 0 && s.addr < last_end {
                return Err(format!("segment {:#x} overlaps the previous one", s.addr));
            }
            last_end = s.end();
            let mut at = s.addr;
            let mut prev_free = false;
            for (&a, b) in self.blocks.range(s.addr..s.end()) {
                if a != at {
                    return Err(format!("gap or overlap at {a:#x} in segment {:#x}", s.addr));
                }
                if b.segment != s.addr {
                    return Err(format!("block {a:#x} tagged with segment {:#x}", b.segment));
                }
                let free = b.state == BlockState::Inactive;
                if free && prev_free {
                    return Err(format!("unmerged free blocks at {a:#x}"));
                }
                prev_free = free;
                at = a.saturating_add(b.size);
            }
            if at != s.end() {
                return Err(format!("segment {:#x} not tiled", s.addr));
            }
        }
        let in_segments: usize = self
            .segments
            .values()
            .map(|s| self.blocks.range(s.addr..s.end()).count())
            .sum();
        if in_segments != self.blocks.len() {
            return Err("blocks outside segments".into());
        }
        let (alloc, active) = weigh(self.blocks.values().chain(self.orphans.values()));
        let reserved = (self.segments.values()).fold(0u64, |r, s| r.saturating_add(s.size));
        if (alloc, active, reserved) != (self.allocated, self.active, self.reserved) {
            return Err(format!(
                "totals {:?} differ from counters {:?}",
                (alloc, active, reserved),
                (self.allocated, self.active, self.reserved)
            ));
        }
        Ok(())
    }
}
