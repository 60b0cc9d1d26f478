//! Applying the inputs to a process: allocator events, snapshots,
//! markers, definitions and role lists, loss, NVML readings, how watching
//! began.

use crate::model::attrib;
use crate::model::config::{Mode, Watch};
use crate::model::device::{DeviceState, Live, Problem, SnapshotOutcome, Verdict};
use crate::model::eventlog::LetGo;
use crate::model::rules;
use crate::model::view::{OomRecord, ProblemRecord};
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{Class, DropWhat, Event, EventKind, MarkSource, SegmentPool};

use super::{Process, FORECAST_WARM_UP, STEP_RESERVED};

impl Process {
    /// The index of `device`, created while fewer than `Bounds::devices`
    /// are known (`None` beyond: the event is dropped and counted).
    #[inline]
    fn device_index(&mut self, device: u16) -> Option<usize> {
        match self.devices.iter().position(|d| d.device() == device) {
            Some(i) => Some(i),
            None => self.new_device(device),
        }
    }

    /// [`Self::device_index`] for a device not seen before: added in
    /// device order while the bound allows.
    #[cold]
    fn new_device(&mut self, device: u16) -> Option<usize> {
        if self.devices.len() >= self.cfg.bounds.devices.max(1) {
            self.dropped_devices = self.dropped_devices.saturating_add(1);
            return None;
        }
        let at = self.devices.partition_point(|d| d.device() < device);
        let mut d = DeviceState::new(device, &self.cfg.series, self.cfg.bounds);
        d.set_step(self.clock.step());
        if self.watch.mid_run {
            d.hold_until_anchored(&self.watch.ring_starts);
        }
        self.devices.insert(at, d);
        self.event_fed.insert(at, false);
        Some(at)
    }

    /// The collector dropped `count` things named `what` so far (the
    /// latest count replaces earlier ones). Beyond
    /// `Bounds::collector_drop_names` names, new names add to `"other"`.
    pub(crate) fn note_collector_drop(&mut self, what: &str, count: u64) {
        if let Some(c) = self.collector_drops.get_mut(what) {
            *c = count;
        } else if self.collector_drops.len() < self.cfg.bounds.collector_drop_names.max(1) {
            self.collector_drops.insert(what.to_string(), count);
        } else {
            let other = self.collector_drops.entry("other".into()).or_insert(0);
            *other = other.saturating_add(count);
        }
    }

    fn problem(&mut self, t: u64, i: usize, problem: Problem) {
        self.inconsistencies += 1;
        let device = self.devices[i].device();
        self.devices[i].desync();
        self.last_problem = Some(ProblemRecord {
            time_ns: t,
            device,
            problem,
        });
    }

    /// Keep the event in the log; `pos` when it places its device's
    /// snapshots. A positioned event the log lets go of (or cannot keep)
    /// is missing for placement from then on.
    fn remember(&mut self, t: u64, kind: &EventKind, pos: Option<u64>) {
        let (let_go, kept) = self.log.push(t, kind, pos);
        let missing = match (let_go, kept, pos, kind.place()) {
            (Some(g), ..) => Some(g),
            (None, false, Some(pos), Some(place)) => Some(LetGo {
                seq: self.log.next_seq(),
                device: place.device,
                pos,
            }),
            _ => None,
        };
        if let Some(g) = missing {
            if let Some(d) = self.devices.iter_mut().find(|d| d.device() == g.device) {
                d.placement_let_go(g);
            }
        }
    }

    /// At each step boundary the leak detector counted, its survivor test
    /// over the live allocated blocks (when each was born).
    fn after_leak(&mut self) {
        self.survivor_credit = self.survivor_credit.saturating_add(1);
        let now = self.leak.boundaries();
        if now == self.leak_seen {
            return;
        }
        let blocks: usize = self.devices.iter().map(DeviceState::block_count).sum();
        if self.survivor_credit < blocks as u64 {
            return;
        }
        self.survivor_credit = 0;
        self.leak_seen = now;
        let born = self.devices.iter().flat_map(|d| {
            (d.blocks().map(|(_, b)| b))
                .chain(d.orphans().map(|(_, b)| b))
                .filter(|b| b.state == vramscope_wire::event::BlockState::Allocated)
                .map(|b| (b.since_ns, b.size))
        });
        self.leak.note_survivors(born);
    }

    /// The allocated total the leak detector follows: the block map for
    /// devices fed by events (step-level resolution), else the stats.
    fn leak_signal(&self) -> u64 {
        self.devices
            .iter()
            .zip(&self.event_fed)
            .map(|(d, &fed)| match (fed, d.stats()) {
                (false, Some((_, s))) => s.allocated,
                _ => d.derived().allocated,
            })
            .fold(0u64, u64::saturating_add)
    }

    /// How watching began: a reader that began mid-run holds each device's
    /// events until an anchor snapshot is installed.
    pub(crate) fn watch(&mut self, watch: &Watch) {
        self.watch = watch.clone();
        // A ring is named by a byte (FORMAT.md, position flags bits 8–15):
        // more starts than that say nothing (a hostile recording).
        self.watch.ring_starts.truncate(256);
        if watch.mid_run {
            for d in &mut self.devices {
                d.hold_until_anchored(&self.watch.ring_starts);
            }
        }
    }

    /// Apply one event.
    pub fn apply(&mut self, ev: &Event) {
        self.apply_at(ev, None);
    }

    /// Apply one event read at ring position `at` (when given).
    pub(crate) fn apply_at(&mut self, ev: &Event, at: Option<RingPos>) {
        let t = ev.time_ns;
        // The allocator's events and markers are counted, and make the rate.
        let class = ev.kind.class();
        if class.is_allocator() || class == Class::Marker {
            self.events += 1;
            self.rate.note(t);
        }
        match &ev.kind {
            EventKind::Alloc { place, .. }
            | EventKind::FreeRequested { place, .. }
            | EventKind::FreeCompleted { place, .. }
            | EventKind::SegmentAlloc { place, .. }
            | EventKind::SegmentFree { place, .. }
            | EventKind::SegmentMap { place, .. }
            | EventKind::SegmentUnmap { place, .. } => {
                if let EventKind::Alloc { size, .. } = ev.kind {
                    self.step_largest.0 = self.step_largest.0.max(size);
                }
                let Some(i) = self.device_index(place.device) else {
                    self.remember(t, &ev.kind, None);
                    return;
                };
                if let Some(at) = at {
                    if self.devices[i].has_deferred() {
                        self.settle_deferred(t, i, at);
                    }
                }
                let rules = &self.cfg.rules;
                let (pos, applied) = match at {
                    Some(at) => {
                        let (placing, a) = self.devices[i].apply_at(t, &ev.kind, at, rules);
                        (placing.then_some(at.position), a)
                    }
                    None => (None, Some(self.devices[i].apply(t, &ev.kind, rules))),
                };
                self.remember(t, &ev.kind, pos);
                // Held for an anchor, or already in the installed state.
                let Some(applied) = applied else {
                    return;
                };
                self.event_fed[i] = true;
                match applied.live {
                    Live::Up(r) => self.leak.on_alloc(r),
                    Live::Down(r) => self.leak.on_release(r),
                    Live::None => {}
                }
                if let Some(p) = applied.problem {
                    self.problem(t, i, p);
                }
                let v = self.leak_signal();
                self.leak.on_value(v, t);
                self.after_leak();
            }
            EventKind::Oom {
                place,
                device_free,
                request,
            } => {
                let Some(i) = self.device_index(place.device) else {
                    return;
                };
                let d = &self.devices[i];
                let summary = d.block_summary();
                let (allocated, reserved) = match d.stats() {
                    Some((_, s)) => (s.allocated, s.reserved),
                    None => (d.derived().allocated, d.derived().reserved),
                };
                let largest_free_in_pool = match rules::pool_for(*request) {
                    SegmentPool::Small => summary.largest_free_small,
                    SegmentPool::Large => summary.largest_free_large,
                };
                let record = OomRecord {
                    time_ns: t,
                    device: place.device,
                    stream: place.stream,
                    pool: place.pool,
                    request: *request,
                    device_free: *device_free,
                    largest_free_in_pool,
                    largest_free: summary.largest_free_small.max(summary.largest_free_large),
                    allocated,
                    reserved,
                    recent: self.log.newest(self.cfg.oom_context),
                };
                if self.ooms.len() >= self.cfg.max_ooms.max(1) {
                    self.ooms.pop_front();
                }
                self.ooms.push_back(record);
                self.ooms_total += 1;
                self.remember(t, &ev.kind, None);
            }
            EventKind::Stats { device, stats } => {
                let check = self.mode == Mode::Exact && self.cfg.check_drift;
                let Some(i) = self.device_index(*device) else {
                    return;
                };
                if let Some(p) = self.devices[i].note_stats(t, *stats, check) {
                    self.problem(t, i, p);
                }
                if !self.event_fed[i] {
                    let v = self.leak_signal();
                    self.leak.on_value(v, t);
                }
            }
            EventKind::SnapshotBegin { device, .. } | EventKind::SnapshotEnd { device, .. } => {
                self.snapshot(t, *device, &ev.kind)
            }
            EventKind::SnapshotSegment { place, .. } => self.snapshot(t, place.device, &ev.kind),
            EventKind::SnapshotBlock { device, .. } => self.snapshot(t, *device, &ev.kind),
            EventKind::Marker { source, value } => {
                self.remember(t, &ev.kind, None);
                if let MarkSource::MemoryLimit {
                    device,
                    whole_device,
                } = *source
                {
                    if self.limits.len() < self.cfg.bounds.devices
                        || self.limits.contains_key(&device)
                    {
                        self.limits.insert(device, (*value, whole_device));
                    }
                    return;
                }
                if self.clock.on_marker(*source, *value) {
                    for d in &mut self.devices {
                        d.set_step(self.clock.step());
                    }
                }
                // Attached mid-run: steps count from the anchor on. The
                // backlog's boundaries have no block map to take floors
                // from (only sparse statistics samples). A new run counts
                // whenever it comes: its number is the producer's.
                if *source == MarkSource::Run {
                    self.leak.on_run(*value, t);
                } else if !self.waiting_for_anchor() {
                    let steps = self.leak.steps();
                    self.leak.on_marker(*source, t);
                    self.after_leak();
                    if self.leak.steps() > steps {
                        self.step_largest = (0, self.step_largest.0);
                    }
                    if self.leak.steps() > steps && self.leak.steps() > FORECAST_WARM_UP {
                        let reserved = (self.devices.iter())
                            .map(DeviceState::reserved_figure)
                            .fold(0u64, u64::saturating_add);
                        if self.step_reserved.len() == STEP_RESERVED {
                            self.step_reserved.pop_front();
                        }
                        self.step_reserved.push_back(reserved);
                    }
                }
            }
            // Attribution (1.1): definitions kept, bounded.
            EventKind::StringChunk { .. }
            | EventKind::Frame { .. }
            | EventKind::Stack { .. }
            | EventKind::Context { .. } => {
                self.defs.apply(&self.cfg.bounds, &ev.kind);
            }
            EventKind::Dropped {
                what: DropWhat::Outside,
                count,
                ..
            } => self.outside.producer_dropped(*count),
            EventKind::Dropped { what, count, .. } => {
                // A handful of names at most: the known kinds and "other".
                if let Some(name) = attrib::drop_name(*what) {
                    let c = self.producer_drops.entry(name.to_string()).or_insert(0);
                    *c = (*c).max(*count);
                }
            }
            // Placement is for the snapshot features that use it; the
            // figures do not depend on it.
            EventKind::StatsPosition { .. } | EventKind::Unknown { .. } => {}
            // Roles (1.2): the tensors PyTorch holds, matched to blocks.
            EventKind::Roles { .. } | EventKind::Role { .. } | EventKind::RolesEnd { .. } => {
                self.roles.apply(&self.cfg.bounds, t, &ev.kind);
            }
            // Memory outside the caching allocator (1.3).
            EventKind::Outside(o) => {
                self.outside.apply(o);
                self.remember(t, &ev.kind, None);
            }
        }
    }

    /// A record of device `i` read at `at` while a snapshot waits for its
    /// ring: installs it once the ring reached it, refuses it (and says
    /// so) when the record proves its positions past the ring's head.
    #[cold]
    fn settle_deferred(&mut self, t: u64, i: usize, at: RingPos) {
        match self.devices[i].deferred_verdict(at, t) {
            Some(Verdict::Install) => {
                let outcome = self.devices[i].install_deferred(&self.cfg.rules, &self.log);
                self.snapshot_outcome(t, i, outcome);
            }
            Some(Verdict::Refute) => {
                if let Some(p) = self.devices[i].refuse_deferred(at.position) {
                    self.snapshots_discarded += 1;
                    self.problem(t, i, p);
                }
            }
            None => {}
        }
    }

    fn snapshot(&mut self, t: u64, device: u16, kind: &EventKind) {
        let Some(i) = self.device_index(device) else {
            return;
        };
        let outcome = self.devices[i].snapshot(t, kind, &self.cfg.rules, &self.log);
        self.snapshot_outcome(t, i, outcome);
    }

    /// What a snapshot of device `i` came to.
    fn snapshot_outcome(&mut self, t: u64, i: usize, outcome: SnapshotOutcome) {
        match outcome {
            SnapshotOutcome::Ongoing => {}
            SnapshotOutcome::Discarded => self.snapshots_discarded += 1,
            SnapshotOutcome::Installed {
                replay_problems,
                first_problem,
            } => {
                self.snapshots_installed += 1;
                if let Some(p) = first_problem {
                    self.problem(t, i, p);
                    self.inconsistencies += u64::from(replay_problems.saturating_sub(1));
                }
                if self.devices.iter().all(|d| d.synced()) {
                    self.loss_unsynced = false;
                }
                let blocks = self.devices.iter().flat_map(|d| {
                    d.blocks()
                        .map(|(_, b)| b)
                        .chain(d.orphans().map(|(_, b)| b))
                });
                self.leak.recount(blocks);
                let v = self.leak_signal();
                self.leak.on_value(v, t);
            }
        }
    }

    /// `count` events were lost on the wire: the block map can no longer be
    /// trusted, and a snapshot in flight is no longer complete.
    pub(crate) fn note_loss(&mut self, count: u64) {
        if count == 0 {
            return;
        }
        self.lost_events = self.lost_events.saturating_add(count);
        self.loss_unsynced = true;
        for d in &mut self.devices {
            d.desync();
            d.taint_snapshot();
            d.placement_loss();
        }
    }

    /// NVML's used memory for this process at `time_ns`.
    pub(crate) fn note_nvml(&mut self, time_ns: u64, bytes: u64) {
        // The remainder (used − reserved) pairs NVML's reading with the
        // reserved bytes of the same instant, not of whenever it is shown.
        let reserved = self.figures(time_ns).reserved;
        self.nvml = Some((time_ns, bytes, reserved));
        self.nvml_peak = Some(self.nvml_peak.map_or(bytes, |p| p.max(bytes)));
        self.nvml_series.push(time_ns, [bytes]);
    }

    /// Reset the peaks the model tracks (the process resets its own stats
    /// peaks on the matching command).
    pub(crate) fn reset_peaks(&mut self) {
        for d in &mut self.devices {
            d.reset_peaks();
        }
        self.nvml_peak = self.nvml.map(|(_, b, _)| b);
    }
}
