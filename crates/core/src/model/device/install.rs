//! Installing a complete snapshot: its segments and blocks replace the
//! device's state (gaps between blocks filled with inactive blocks, adjacent
//! inactive blocks merged as the allocator would have), the totals are
//! recounted, and the allocator events the snapshot does not reflect are
//! applied on the new state: those received while it was being written
//! (placed by time), or those after its ring position (placed by position,
//! see `placed`).

use std::collections::BTreeMap;

use super::blockmap::BlockMap;
use super::parts::{weigh, Block, Problem, Segment};
use super::pending::{Pending, SnapshotOutcome};
use super::state::DeviceState;
use crate::model::eventlog::EventLog;
use crate::model::rules::BlockRules;
use vramscope_wire::event::{BlockState, EventKind};

impl DeviceState {
    /// Replace the state with the complete snapshot `p` (ended at `t`).
    /// Overlapping segments make the snapshot unusable: it is discarded.
    pub(super) fn install(
        &mut self,
        mut p: Pending,
        t: u64,
        rules: &BlockRules,
        log: &EventLog,
    ) -> SnapshotOutcome {
        // Placed by ring positions when the producer gave them and the
        // events came with theirs (FORMAT.md, "Positions"); else by time.
        if let Some(span) = p.at.filter(|_| self.placement_in_use()) {
            return self.install_placed(p, t, span, rules, log);
        }
        if self.placement_holding() {
            return self.install_timed(p, t, rules, log);
        }
        let replay: Vec<(u64, EventKind, Option<u64>)> = std::mem::take(&mut p.replay)
            .into_iter()
            .map(|(t, k)| (t, k, None))
            .collect();
        self.install_with(p, t, &replay, rules)
    }

    /// Replace the state with the snapshot `p` and apply `later` on it:
    /// `(time, event, ring position)`, where an event of the snapshot's
    /// ambiguous window whose effect the snapshot already shows is skipped.
    pub(super) fn install_with(
        &mut self,
        p: Pending,
        t: u64,
        later: &[(u64, EventKind, Option<u64>)],
        rules: &BlockRules,
    ) -> SnapshotOutcome {
        let Some(segments) = disjoint_segments(p.segments) else {
            return SnapshotOutcome::Discarded;
        };
        let mut blocks = tile(&segments, p.blocks, p.time_ns);
        self.keep_births(&mut blocks);
        if blocks.len() > self.bounds.blocks {
            // With the gaps filled it is more blocks than the bound allows.
            self.dropped.snapshots = self.dropped.snapshots.saturating_add(1);
            return SnapshotOutcome::Discarded;
        }
        self.replace(segments, blocks);
        let (replay_problems, first_problem) = self.replay(later, rules);
        if replay_problems > 0 {
            self.synced = false;
        }
        self.after_change(t);
        SnapshotOutcome::Installed {
            replay_problems,
            first_problem,
        }
    }

    /// A snapshot dates its blocks at its own time; a block the state
    /// already holds (same address, size, request, state and context) is
    /// the same allocation and keeps its birth time and origin. Another
    /// reader's snapshot, or one asked for after lost events, must not make
    /// every live block look born now: the survivor test and leak origins
    /// date blocks by birth.
    fn keep_births(&self, blocks: &mut BTreeMap<u64, Block>) {
        for (addr, b) in blocks.iter_mut() {
            if b.state == BlockState::Inactive {
                continue;
            }
            let same = |o: &&Block| {
                (o.size, o.requested, o.state, o.origin.context)
                    == (b.size, b.requested, b.state, b.origin.context)
            };
            if let Some(old) = self.blocks.get(addr).filter(same) {
                b.since_ns = old.since_ns.min(b.since_ns);
                b.origin.step = old.origin.step.or(b.origin.step);
            }
        }
    }

    /// Make `segments` and `blocks` the state, recount the totals, and trust it.
    fn replace(&mut self, segments: BTreeMap<u64, Segment>, blocks: BTreeMap<u64, Block>) {
        self.segments = segments;
        self.blocks = BlockMap::from_sorted(blocks);
        self.orphans.clear();
        self.unknown_kind = 0;
        let reserved = (self.segments.values()).try_fold(0u64, |r, s| r.checked_add(s.size));
        self.reserved = reserved.unwrap_or(u64::MAX);
        let alloc_active = (self.blocks.values()).try_fold((0u64, 0u64), |(a, b), blk| {
            let (x, y) = blk.weight();
            Some((a.checked_add(x)?, b.checked_add(y)?))
        });
        (self.allocated, self.active) = alloc_active.unwrap_or_else(|| weigh(self.blocks.values()));
        // A snapshot whose sums do not fit cannot be true.
        self.saturated = reserved.is_none() || alloc_active.is_none();
        self.synced = !self.saturated;
        self.drift = 0;
    }

    /// Apply the events received during the snapshot; returns how many
    /// contradicted it, and the first contradiction.
    fn replay(
        &mut self,
        events: &[(u64, EventKind, Option<u64>)],
        rules: &BlockRules,
    ) -> (u32, Option<Problem>) {
        let mut count = 0;
        let mut first = None;
        for (t, kind, pos) in events {
            if pos.is_some_and(|pos| self.reflected_in_window(pos, kind)) {
                continue;
            }
            if let Some(problem) = self.apply_unbuffered(*t, kind, rules).problem {
                count += 1;
                first.get_or_insert(problem);
            }
        }
        (count, first)
    }
}

/// The segments by address, or `None` when two of them overlap.
fn disjoint_segments(mut segments: Vec<Segment>) -> Option<BTreeMap<u64, Segment>> {
    segments.sort_by_key(|s| s.addr);
    if segments.windows(2).any(|w| w[1].addr < w[0].end()) {
        return None;
    }
    Some(segments.into_iter().map(|s| (s.addr, s)).collect())
}

/// The blocks tiling every segment: the given ones, the gaps between them
/// as inactive blocks (learnt at `time_ns`), adjacent inactive blocks merged.
fn tile(
    segments: &BTreeMap<u64, Segment>,
    given: Vec<(u64, Block)>,
    time_ns: u64,
) -> BTreeMap<u64, Block> {
    let given: BTreeMap<u64, Block> = given.into_iter().collect();
    let mut tiled: Vec<(u64, Block)> = Vec::with_capacity(given.len() + segments.len());
    for s in segments.values() {
        let gap = |size| Block::inactive(s, size, time_ns);
        let mut at = s.addr;
        for (&a, b) in given.range(s.addr..s.end()) {
            if a > at {
                push_merged(&mut tiled, at, gap(a - at));
            }
            let b = Block {
                segment: s.addr,
                ..*b
            };
            push_merged(&mut tiled, a, b);
            at = a + b.size;
        }
        if at < s.end() {
            push_merged(&mut tiled, at, gap(s.end() - at));
        }
    }
    tiled.into_iter().collect()
}

/// Append block `b` at `addr`, merged into the previous one when both are
/// inactive, adjacent and of the same segment.
fn push_merged(tiled: &mut Vec<(u64, Block)>, addr: u64, b: Block) {
    match tiled.last_mut() {
        Some((la, lb))
            if lb.segment == b.segment
                && lb.state == BlockState::Inactive
                && b.state == BlockState::Inactive
                && *la + lb.size == addr =>
        {
            lb.size += b.size
        }
        _ => tiled.push((addr, b)),
    }
}
