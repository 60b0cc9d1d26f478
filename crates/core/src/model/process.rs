//! One instrumented process: its devices, counters, recent events, OOMs,
//! NVML samples and leak detector.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::attrib::{self, Definitions, StepClock};
use super::device::{DeviceState, Live, Problem, SnapshotOutcome, Verdict};
use super::eventlog::{EventLog, LetGo};
use super::forecast::{self, Cause};
use super::leak::{LeakDetector, LeakReport};
use super::roles::{self, Role, RoleMatches, RoleTable};
use super::rules;
use super::series::Series;
use super::view::{
    BlockView, DeviceFigures, DeviceTimeline, DeviceView, Dropped, FigureSource, Fragmentation,
    Implausible, OomRecord, ProblemRecord, ProcessFigures, ProcessView, SegmentView, ViewOptions,
    WatchView,
};
use super::Block;
use super::{Mode, ModelConfig, ProcessKey, PLACEMENT_LOG};
use crate::model::Watch;
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{BlockState, Class, Event, EventKind, MarkSource, SegmentPool};

/// Step boundaries whose reserved bytes the forecast measures growth over
/// (from 16 of them on; before, the floor's growth alone).
const STEP_RESERVED: usize = 32;
/// The first steps, whose reserved bytes grow with the job's setting up
/// (optimizer state, caches), are not measured.
const FORECAST_WARM_UP: u64 = 4;

/// Events per second over a sliding window of event timestamps, in O(1)
/// per event: counts in fixed slots of `window / SLOTS`.
#[derive(Debug, Clone)]
pub(crate) struct EventRate {
    slot_ns: u64,
    counts: [u32; Self::SLOTS],
    /// Absolute index of the newest slot, and its time range.
    head: u64,
    head_start: u64,
    head_end: u64,
    first_ns: Option<u64>,
}

impl EventRate {
    const SLOTS: usize = 20;

    pub(crate) fn new(window_ns: u64) -> Self {
        let slot_ns = (window_ns / Self::SLOTS as u64).max(1);
        Self {
            slot_ns,
            counts: [0; Self::SLOTS],
            head: 0,
            head_start: 0,
            head_end: 0,
            first_ns: None,
        }
    }

    #[inline]
    pub(crate) fn note(&mut self, t: u64) {
        if t >= self.head_start && t < self.head_end {
            let c = &mut self.counts[(self.head % Self::SLOTS as u64) as usize];
            *c = c.saturating_add(1);
            return;
        }
        self.note_slow(t);
    }

    #[cold]
    fn note_slow(&mut self, t: u64) {
        let s = t / self.slot_ns;
        if self.first_ns.is_none() {
            self.first_ns = Some(t);
            self.head = s;
            self.counts = [0; Self::SLOTS];
        }
        if s > self.head {
            let gap = (s - self.head).min(Self::SLOTS as u64);
            for i in 1..=gap {
                self.counts[((self.head + i) % Self::SLOTS as u64) as usize] = 0;
            }
            self.head = s;
        } else if s.saturating_add(Self::SLOTS as u64) <= self.head {
            return; // older than the window
        }
        self.head_start = self.head * self.slot_ns;
        self.head_end = self.head_start.saturating_add(self.slot_ns);
        let c = &mut self.counts[(s % Self::SLOTS as u64) as usize];
        *c = c.saturating_add(1);
    }

    /// Events per second over the window ending at `now_ns` (absent before
    /// the first event).
    pub(crate) fn per_sec(&self, now_ns: u64) -> Option<f64> {
        let first = self.first_ns?;
        let now_slot = now_ns / self.slot_ns;
        let n = Self::SLOTS as u64;
        let mut sum = 0u64;
        for back in 0..n {
            let Some(s) = now_slot.checked_sub(back) else {
                break;
            };
            if s <= self.head && s.saturating_add(n) > self.head {
                sum += u64::from(self.counts[(s % n) as usize]);
            }
        }
        let window = self.slot_ns * n;
        // A young process is measured over its life, not the whole window.
        let span = now_ns.saturating_sub(first).clamp(self.slot_ns, window);
        Some(sum as f64 * 1e9 / span as f64)
    }
}

/// Two address-ordered block sequences as one, in address order.
fn merged<'a>(
    a: impl Iterator<Item = (u64, &'a Block)>,
    b: impl Iterator<Item = (u64, &'a Block)>,
) -> impl Iterator<Item = (u64, &'a Block)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y.0 < x.0 => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// Tensors a process holds: address, requested size, stream.
pub(crate) type HeldTensors = Vec<(u64, u64, u64)>;

/// Everything the model knows about one process.
#[derive(Debug, Clone)]
pub struct Process {
    key: ProcessKey,
    cfg: ModelConfig,
    mode: Mode,
    devices: Vec<DeviceState>,
    /// Devices whose block map has been fed by events.
    event_fed: Vec<bool>,
    lost_events: u64,
    loss_unsynced: bool,
    inconsistencies: u64,
    last_problem: Option<ProblemRecord>,
    snapshots_installed: u64,
    snapshots_discarded: u64,
    /// When a snapshot was last asked for (the caller's clock).
    resync_asked_ns: Option<u64>,
    events: u64,
    rate: EventRate,
    /// The recent events (history, OOM context, snapshot placement).
    log: EventLog,
    ooms: VecDeque<OomRecord>,
    ooms_total: u64,
    /// The producer's memory limit per device (MARKER source 6): bytes,
    /// and whether it is the whole device's; at most
    /// `Bounds::devices` devices.
    limits: BTreeMap<u16, (u64, bool)>,
    /// Reserved bytes at the latest step boundaries (at most
    /// [`STEP_RESERVED`]): how fast reserved memory grows per step.
    step_reserved: VecDeque<u64>,
    /// The largest request of the step under way, and of the last one:
    /// the allocation most likely to fail first.
    step_largest: (u64, u64),
    /// The last NVML reading: (time, used bytes, this process's reserved
    /// bytes as the model knew them when the reading was applied).
    nvml: Option<(u64, u64, u64)>,
    nvml_peak: Option<u64>,
    nvml_series: Series,
    leak: LeakDetector,
    /// The leak detector's (run, steps) when its survivor test last ran.
    leak_seen: (u64, u64),
    /// Events since the survivor test last ran: it reads every live
    /// block, so it runs only once as many events have come (short steps
    /// over many blocks would make it quadratic; a real step has about as
    /// many events as live blocks, so it runs at most steps apart).
    survivor_credit: u64,
    /// Events of devices beyond `Bounds::devices`.
    dropped_devices: u64,
    /// The collector's drop counts by what (`Input::Dropped`), bounded by
    /// `Bounds::collector_drop_names`.
    collector_drops: BTreeMap<String, u64>,
    /// How watching began (mid-run or from the start; where in each ring).
    watch: Watch,
    /// The attribution definitions the process sent.
    defs: Definitions,
    /// The step its events' step tags resolve against.
    clock: StepClock,
    /// The producer's attribution drop counts (DROPPED), by name.
    producer_drops: BTreeMap<String, u64>,
    /// The role lists the process sent (1.2).
    roles: RoleTable,
}

impl Process {
    pub(crate) fn new(key: ProcessKey, cfg: ModelConfig) -> Self {
        Self {
            key,
            mode: Mode::Exact,
            devices: Vec::new(),
            event_fed: Vec::new(),
            lost_events: 0,
            loss_unsynced: false,
            inconsistencies: 0,
            last_problem: None,
            snapshots_installed: 0,
            snapshots_discarded: 0,
            resync_asked_ns: None,
            events: 0,
            rate: EventRate::new(cfg.rate_window_ns),
            // Grown as events arrive: a quiet process holds little.
            log: EventLog::new(
                (cfg.recent_events).max(cfg.bounds.replay.min(PLACEMENT_LOG)),
                cfg.bounds.places,
            ),
            ooms: VecDeque::new(),
            ooms_total: 0,
            limits: BTreeMap::new(),
            step_reserved: VecDeque::new(),
            step_largest: (0, 0),
            nvml: None,
            nvml_peak: None,
            nvml_series: Series::new(cfg.series.clone()),
            leak: LeakDetector::new(cfg.leak.clone()).with_max_sizes(cfg.bounds.leak_sizes),
            leak_seen: (0, 0),
            survivor_credit: 0,
            dropped_devices: 0,
            collector_drops: BTreeMap::new(),
            watch: Watch::default(),
            defs: Definitions::default(),
            clock: StepClock::default(),
            producer_drops: BTreeMap::new(),
            roles: RoleTable::default(),
            cfg,
        }
    }

    pub fn key(&self) -> ProcessKey {
        self.key
    }
    pub(crate) fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }
    /// Per-device states, by device index.
    pub fn devices(&self) -> &[DeviceState] {
        &self.devices
    }
    #[cfg(test)]
    pub(crate) fn device(&self, device: u16) -> Option<&DeviceState> {
        self.devices.iter().find(|d| d.device() == device)
    }
    #[cfg(test)]
    pub(crate) fn lost_events(&self) -> u64 {
        self.lost_events
    }
    pub fn inconsistencies(&self) -> u64 {
        self.inconsistencies
    }
    #[cfg(test)]
    pub(crate) fn last_problem(&self) -> Option<&ProblemRecord> {
        self.last_problem.as_ref()
    }
    #[cfg(test)]
    pub(crate) fn snapshots_installed(&self) -> u64 {
        self.snapshots_installed
    }
    #[cfg(test)]
    pub(crate) fn snapshots_discarded(&self) -> u64 {
        self.snapshots_discarded
    }
    /// Where the live advisor starts on this process: `Ok(None)` when no
    /// device holds a segment and watching began with the process (its
    /// allocator is as it was at start: a replay from here is exact);
    /// else the device holding the most and the tensors allocated there
    /// (address, requested size, stream; not those pending free), in
    /// address order. An error
    /// names why it cannot start (the mode, a state not known yet).
    pub fn advisor_start(&self) -> Result<Option<(u16, HeldTensors)>, String> {
        if self.mode != Mode::Exact {
            return Err(
                "the advisor needs every allocator event, and this process is not watched through its tracker"
                    .into(),
            );
        }
        if self.waiting_for_anchor() || self.devices.iter().any(|d| !d.synced()) {
            return Err("its allocator's state is not known yet (waiting for its snapshot)".into());
        }
        let empty = self.devices.iter().all(|d| d.segments().next().is_none());
        if empty && !self.watch.mid_run {
            return Ok(None);
        }
        let Some(d) = self
            .devices
            .iter()
            .max_by_key(|d| d.segments().map(|s| s.size).sum::<u64>())
        else {
            return Ok(None);
        };
        // A block pending free was freed by its tensor already (its
        // FREE_REQUESTED is past): a replay would hold it for ever.
        let held = d
            .blocks()
            .filter(|(_, b)| b.state == BlockState::Allocated)
            .map(|(a, b)| {
                (
                    a,
                    if b.requested > 0 { b.requested } else { b.size },
                    b.stream,
                )
            })
            .collect();
        Ok(Some((d.device(), held)))
    }

    /// Allocator events applied (snapshot records and stats not counted).
    pub fn events(&self) -> u64 {
        self.events
    }
    #[cfg(test)]
    pub(crate) fn ooms(&self) -> impl Iterator<Item = &OomRecord> {
        self.ooms.iter()
    }
    pub fn leak(&self) -> &LeakDetector {
        &self.leak
    }

    /// True when the block map cannot be trusted and a snapshot should be
    /// requested: at start (state from before attach is unknown), after loss,
    /// after a contradiction, while the last snapshot was incomplete.
    /// Only in exact mode; in other modes the collector decides.
    pub(crate) fn needs_resync(&self) -> bool {
        self.mode == Mode::Exact
            && (self.loss_unsynced
                || self.devices.is_empty()
                || self.devices.iter().any(|d| !d.synced()))
    }

    /// A snapshot is being received on some device.
    pub(crate) fn snapshot_in_progress(&self) -> bool {
        self.devices.iter().any(|d| d.snapshot_in_progress())
    }

    /// A snapshot is needed and none is in flight.
    pub(crate) fn resync_wanted(&self) -> bool {
        self.needs_resync() && !self.snapshot_in_progress()
    }

    /// A snapshot is wanted and was not asked for within the configured
    /// interval before `now_ns` (a `now_ns` before the last request, i.e. a
    /// clock that went back, does not hold the request back).
    pub(crate) fn resync_due(&self, now_ns: u64) -> bool {
        self.resync_wanted()
            && self
                .resync_asked_ns
                .is_none_or(|asked| now_ns < asked || now_ns - asked >= self.cfg.resync_interval_ns)
    }

    /// A snapshot was asked for at `now_ns`.
    pub(crate) fn resync_requested(&mut self, now_ns: u64) {
        self.resync_asked_ns = Some(now_ns);
    }

    #[cfg(test)]
    /// When a snapshot was last asked for.
    pub(crate) fn last_resync_request(&self) -> Option<u64> {
        self.resync_asked_ns
    }

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

    /// What the bounds dropped, and the collector's drop counts.
    pub fn dropped(&self) -> Dropped {
        let mut out = Dropped {
            devices: self.dropped_devices,
            history: self.log.dropped(),
            leak_sizes: self.leak.dropped(),
            collector: self.collector_drops.clone(),
            definitions: self.defs.dropped(),
            roles: self.roles.status().dropped,
            ..Dropped::default()
        };
        for d in &self.devices {
            let dd = d.dropped;
            out.orphans = out.orphans.saturating_add(dd.orphans);
            out.blocks = out.blocks.saturating_add(dd.blocks);
            out.segments = out.segments.saturating_add(dd.segments);
            out.replay = out.replay.saturating_add(dd.replay);
            out.snapshots = out.snapshots.saturating_add(dd.snapshots);
        }
        out
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

    /// Watching began mid-run and the state is not anchored yet: no device
    /// seen, or one still holding its events for an anchor snapshot.
    pub(crate) fn waiting_for_anchor(&self) -> bool {
        self.watch.mid_run
            && (self.devices.is_empty() || self.devices.iter().any(DeviceState::holding))
    }

    /// How watching began.
    pub fn watching(&self) -> &Watch {
        &self.watch
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

    /// Figures of one device (Stats first, block map otherwise).
    pub(crate) fn device_figures(&self, d: &DeviceState) -> DeviceFigures {
        let summary = d.block_summary();
        let derived = d.derived();
        let peaks = d.derived_peaks();
        let stats = d.stats().map(|(_, s)| *s);
        let (source, allocated, reserved, active, inactive_split, requested, peak) = match stats {
            Some(s) => (
                FigureSource::Stats,
                s.allocated,
                s.reserved,
                s.active,
                s.inactive_split,
                Some(s.requested),
                (s.allocated_peak, s.reserved_peak, s.active_peak),
            ),
            None => (
                FigureSource::BlockMap,
                derived.allocated,
                derived.reserved,
                derived.active,
                summary.inactive_split,
                None,
                (peaks.allocated, peaks.reserved, peaks.active),
            ),
        };
        let implausible = Implausible {
            saturated: d.saturated(),
            peak_below_current: peak.0 < allocated || peak.1 < reserved || peak.2 < active,
            above_reserved: allocated > reserved || active > reserved,
            share_above_100: inactive_split > reserved,
        };
        DeviceFigures {
            device: d.device(),
            source,
            allocated,
            reserved,
            active,
            requested,
            peak_allocated: peak.0,
            peak_reserved: peak.1,
            peak_active: peak.2,
            fragmentation: Fragmentation {
                inactive_split,
                // A share above 100 % cannot be true: flagged, not shown.
                share_of_reserved: (reserved > 0 && inactive_split <= reserved)
                    .then(|| inactive_split as f64 / reserved as f64),
                largest_free_small: summary.largest_free_small,
                largest_free_large: summary.largest_free_large,
                free_blocks: summary.free_blocks,
            },
            segments: stats.map_or(summary.segments, |s| s.segments),
            blocks: summary.blocks,
            stats,
            synced: d.synced(),
            implausible,
        }
    }

    /// Process-wide figures at `now_ns` (for events/s).
    pub(crate) fn figures(&self, now_ns: u64) -> ProcessFigures {
        let devs: Vec<DeviceFigures> = self
            .devices
            .iter()
            .map(|d| self.device_figures(d))
            .collect();
        self.figures_from(&devs, now_ns)
    }

    fn figures_from(&self, devs: &[DeviceFigures], now_ns: u64) -> ProcessFigures {
        // Sums of figures from outside: one that does not fit is cut at
        // u64::MAX and flagged.
        let mut saturated = false;
        let mut sum = |f: fn(&DeviceFigures) -> u64| {
            let s = devs.iter().try_fold(0u64, |a, d| a.checked_add(f(d)));
            saturated |= s.is_none();
            s.unwrap_or(u64::MAX)
        };
        let reserved = sum(|d| d.reserved);
        let allocated = sum(|d| d.allocated);
        let active = sum(|d| d.active);
        let peak_allocated = sum(|d| d.peak_allocated);
        let peak_reserved = sum(|d| d.peak_reserved);
        let mut implausible =
            (devs.iter()).fold(Implausible::default(), |a, d| a.or(d.implausible));
        implausible.saturated |= saturated;
        let nvml_used = self.nvml.map(|(_, b, _)| b);
        ProcessFigures {
            allocated,
            reserved,
            active,
            peak_allocated,
            peak_reserved,
            nvml_used,
            nvml_peak: self.nvml_peak,
            non_pytorch: self.nvml.and_then(|(_, used, reserved_then)| {
                // Negative only when the two readings still straddle a
                // change: not a figure to show as true.
                let d = i128::from(used) - i128::from(reserved_then);
                (d >= 0).then(|| d.min(i128::from(i64::MAX)) as i64)
            }),
            events_per_sec: self.rate.per_sec(now_ns),
            events_total: self.events,
            lost_events: self.lost_events,
            inconsistencies: self.inconsistencies,
            implausible,
        }
    }

    /// The leak verdict at `now_ns`.
    /// The out-of-memory forecast, while a leak is flagged or reserved
    /// memory keeps growing step after step, and the producer said its
    /// memory limit: for the device with the most reserved that has one.
    fn forecast(
        &self,
        devs: &[DeviceFigures],
        figures: &ProcessFigures,
        leak: &LeakReport,
    ) -> Option<crate::model::forecast::Forecast> {
        let r: Vec<u64> = self.step_reserved.iter().copied().collect();
        let cause = if leak.flagged {
            Cause::Leak
        } else if forecast::keeps_growing(&r) {
            Cause::ReservedGrowth
        } else {
            return None;
        };
        let (reserved, limit) = devs
            .iter()
            .filter_map(|d| Some((d.reserved, *self.limits.get(&d.device)?)))
            .max_by_key(|(r, _)| *r)?;
        let largest = self.step_largest.0.max(self.step_largest.1);
        let request = (largest > 0).then_some(largest);
        // The floor's growth, or reserved memory's where it grows faster
        // (a leaked block's segment is more than the block).
        // Least squares over the boundaries kept: reserved rises in whole
        // segments, a staircase whose ends alone would swing the slope, and
        // whose latest stair would swing the start; the fitted line gives
        // both (from 16 boundaries on).
        let (reserved_slope, fitted) = if r.len() >= 16 {
            let n = r.len() as f64;
            let mx = (n - 1.0) / 2.0;
            let my = r.iter().map(|&y| y as f64).sum::<f64>() / n;
            let (sxy, sxx) = r
                .iter()
                .enumerate()
                .fold((0.0, 0.0), |(sxy, sxx), (x, &y)| {
                    let dx = x as f64 - mx;
                    (sxy + dx * (y as f64 - my), sxx + dx * dx)
                });
            let slope = sxy / sxx;
            (slope, Some((my + slope * (n - 1.0 - mx)).max(0.0) as u64))
        } else if cause == Cause::ReservedGrowth {
            // Fewer boundaries than a fit needs: the rise over the last
            // GROWING_STEPS of them.
            let n = forecast::GROWING_STEPS;
            let rise = r[r.len() - 1].saturating_sub(r[r.len() - 1 - n]);
            (rise as f64 / n as f64, None)
        } else {
            (0.0, None)
        };
        let reserved = fitted.unwrap_or(reserved);
        crate::model::forecast::forecast(&crate::model::forecast::Inputs {
            step: self.leak.steps(),
            growth_per_step: leak.floor_slope_bytes_per_step.max(reserved_slope),
            reserved,
            limit: Some(limit),
            non_pytorch: figures.non_pytorch.and_then(|b| u64::try_from(b).ok()),
            step_ns: self.leak.step_period_ns(),
            request,
            cause,
        })
    }

    pub fn leak_report(&self, now_ns: u64) -> LeakReport {
        let blocks = self.devices.iter().flat_map(|d| {
            d.blocks()
                .map(|(_, b)| b)
                .chain(d.orphans().map(|(_, b)| b))
        });
        let mut report = self.leak.report(now_ns, blocks);
        if report.flagged {
            // Steps from step tags where the producer's clock has steps
            // (markers, optimizer steps) and they name something; else the
            // leak detector's own steps (the allocation period, a producer
            // without tags), blocks dated by birth time.
            let tagged = self.clock.step().map(|now| self.leak_origins(now, false));
            (report.origins, report.more_origins) = match tagged {
                Some(found) if !found.0.is_empty() => found,
                _ => self.leak_origins(self.leak.step_now(), true),
            };
        }
        report
    }

    /// The modules and stacks whose live blocks outlive their step, step
    /// after step (see [`super::leak::growing_origins`]); a block's step
    /// from its tag, or (`by_time`) from its birth time.
    fn leak_origins(&self, now: u64, by_time: bool) -> (Vec<super::leak::LeakOrigin>, u64) {
        let mut contexts: HashMap<u32, attrib::ContextView> = HashMap::new();
        let mut live: Vec<(u32, u64, u64)> = Vec::new();
        for d in &self.devices {
            for (_, b) in d.blocks().chain(d.orphans()) {
                if b.state != vramscope_wire::event::BlockState::Allocated {
                    continue;
                }
                let c = contexts
                    .entry(b.origin.context)
                    .or_insert_with(|| self.defs.context_view(b.origin.context));
                let step = if by_time {
                    self.leak.step_at(b.since_ns)
                } else {
                    c.step.or(b.origin.step.map(u64::from))
                };
                if let Some(step) = step {
                    live.push((b.origin.context, step, b.size));
                }
            }
        }
        let cfg = self.leak.config();
        super::leak::growing_origins(
            live.iter().map(|(c, step, size)| {
                let v = &contexts[c];
                (v.module.as_str(), v.stack.as_slice(), *step, *size)
            }),
            now,
            cfg.min_steps,
            cfg.top_sizes,
        )
    }

    /// Heap bytes held for this process (estimate; see `DeviceState::memory_bytes`).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .devices
                .iter()
                .map(DeviceState::memory_bytes)
                .sum::<usize>()
            + self.devices.capacity() * std::mem::size_of::<DeviceState>()
            + self.log.memory_bytes()
            + self.roles.memory_bytes()
            + self
                .ooms
                .iter()
                .map(|o| {
                    std::mem::size_of::<OomRecord>()
                        + o.recent.capacity() * std::mem::size_of::<Event>()
                })
                .sum::<usize>()
            + self.nvml_series.memory_bytes()
            + self.leak.memory_bytes()
            + (self.collector_drops.keys())
                .map(|k| k.capacity() + 64)
                .sum::<usize>()
            + self.defs.memory_bytes()
    }

    /// The step the step tags resolve against (the latest counted step
    /// boundary).
    pub fn step(&self) -> Option<u64> {
        self.clock.step()
    }

    /// The contexts, strings, frames and stacks the process defined.
    pub(crate) fn definitions(&self) -> &attrib::Definitions {
        &self.defs
    }

    /// What the role lists say about every allocated block: one pass over
    /// each device's blocks (orphans included) and its entries, so a view
    /// costs the blocks plus the entries, never their product
    /// ([`RoleTable::match_blocks`]).
    pub(crate) fn role_matches(&self) -> RoleMatches {
        let mut out = RoleMatches::default();
        if self.roles.status().tensors == 0 {
            return out;
        }
        let phase = |b: &Block| self.defs.phase_step(b.origin.context).0;
        for d in &self.devices {
            let blocks = merged(d.blocks(), d.orphans());
            self.roles.match_blocks(d.device(), blocks, phase, &mut out);
        }
        out.name_holders(|ids| {
            let paths: Vec<std::borrow::Cow<'_, str>> =
                ids.iter().map(|&m| self.defs.string_cow(m)).collect();
            roles::shared_path(paths.iter().map(|p| p.as_ref()))
        });
        out
    }

    /// The role of the allocated block at `addr` on `device`
    /// (`matches`: the view's [`Self::role_matches`]), and the role list
    /// entries naming it, if any.
    fn block_role<'m>(
        &self,
        matches: &'m RoleMatches,
        device: u16,
        addr: u64,
        b: &Block,
    ) -> (Role, Option<&'m roles::Match>) {
        if let Some(m) = matches.get(device, addr) {
            return (m.role, Some(m));
        }
        let (phase, step) = self.defs.phase_step(b.origin.context);
        let born = step.or(b.origin.step.map(u64::from));
        (Role::by_lifetime(phase, born, self.clock.step()), None)
    }

    /// A block as views show it: its role, and the module holding it when
    /// a role list named it (`matches`: the view's [`Self::role_matches`]).
    pub(crate) fn block_view(
        &self,
        matches: &RoleMatches,
        device: u16,
        addr: u64,
        b: &Block,
    ) -> BlockView {
        let allocated = b.state == BlockState::Allocated;
        let (role, held) = if allocated {
            self.block_role(matches, device, addr, b)
        } else {
            (Role::Other, None)
        };
        BlockView {
            addr,
            block: *b,
            role: allocated.then_some(role),
            held_by: held.and_then(|m| m.held_by.clone()),
        }
    }

    /// Who holds the live memory: bytes by module, phase and role
    /// (`matches`: the view's [`Self::role_matches`]).
    pub(crate) fn attribution(&self, matches: &RoleMatches) -> attrib::Attribution {
        // Sums by group; consecutive blocks mostly share their context and
        // role, so the last context's phase and the last plain group are
        // kept at hand (a view of 5,052 blocks: 585 us with a lookup of
        // each, see `model/view` in benches/model.rs).
        let now = self.clock.step();
        let mut index: HashMap<attrib::GroupKey, usize> = HashMap::new();
        let mut sums: Vec<(u64, u64)> = Vec::new();
        fn group(
            index: &mut HashMap<attrib::GroupKey, usize>,
            sums: &mut Vec<(u64, u64)>,
            key: attrib::GroupKey,
        ) -> usize {
            *index.entry(key).or_insert_with(|| {
                sums.push((0, 0));
                sums.len() - 1
            })
        }
        let mut ctx_memo: Option<(u32, attrib::PhaseKey, Option<u64>)> = None;
        let mut last: Option<((u32, Role), usize)> = None;
        for d in &self.devices {
            let dev = d.device();
            for (addr, b) in d.blocks().chain(d.orphans()) {
                if b.state != BlockState::Allocated {
                    continue;
                }
                let ctx = b.origin.context;
                let i = match matches.get(dev, addr) {
                    Some(m) => group(&mut index, &mut sums, (ctx, m.role, m.modules.clone())),
                    None => {
                        let (phase, cstep) = match ctx_memo {
                            Some((c, p, s)) if c == ctx => (p, s),
                            _ => {
                                let (p, s) = self.defs.phase_step(ctx);
                                ctx_memo = Some((ctx, p, s));
                                (p, s)
                            }
                        };
                        let born = cstep.or(b.origin.step.map(u64::from));
                        let role = Role::by_lifetime(phase, born, now);
                        match last {
                            Some((k, i)) if k == (ctx, role) => i,
                            _ => {
                                let i = group(&mut index, &mut sums, (ctx, role, Vec::new()));
                                last = Some(((ctx, role), i));
                                i
                            }
                        }
                    }
                };
                let e = &mut sums[i];
                e.0 = e.0.saturating_add(b.size);
                e.1 += 1;
            }
        }
        let groups: HashMap<attrib::GroupKey, (u64, u64)> =
            index.into_iter().map(|(k, i)| (k, sums[i])).collect();
        attrib::attribution(
            &self.defs,
            self.clock.step(),
            &groups,
            &self.producer_drops,
            self.roles.status(),
        )
    }

    /// Whether the process ever used `d`: a segment or a stray block, an
    /// allocation seen, or statistics other than all zero. A process lists
    /// the devices it uses, not every device its agent can see (a DDP rank
    /// on GPU 1 reports all-zero statistics for GPU 0).
    fn device_used(&self, d: &DeviceState) -> bool {
        d.segments().next().is_some()
            || d.orphans().next().is_some()
            || d.stats().is_none_or(|(_, s)| {
                s.reserved_peak > 0 || s.allocated_peak > 0 || s.reserved > 0 || s.ooms > 0
            })
    }

    /// A view for renderers and `snapshot --json`.
    pub fn view(&self, now_ns: u64, opts: &ViewOptions) -> ProcessView {
        let matches = self.role_matches();
        let devices: Vec<DeviceView> = self
            .devices
            .iter()
            .filter(|d| self.device_used(d))
            .map(|d| DeviceView {
                figures: self.device_figures(d),
                segments: if opts.block_map {
                    d.segments()
                        .map(|s| SegmentView {
                            segment: *s,
                            blocks: d
                                .blocks_of(s)
                                .map(|(addr, b)| self.block_view(&matches, d.device(), addr, b))
                                .collect(),
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                orphans: if opts.block_map {
                    d.orphans()
                        .map(|(addr, b)| self.block_view(&matches, d.device(), addr, b))
                        .collect()
                } else {
                    Vec::new()
                },
                timeline: opts.timeline.map(|r| {
                    let [allocated, reserved, active] =
                        d.series.query(r.from_ns, r.to_ns, r.columns);
                    DeviceTimeline {
                        allocated,
                        reserved,
                        active,
                    }
                }),
            })
            .collect();
        let figs: Vec<DeviceFigures> = devices.iter().map(|d| d.figures).collect();
        let figures = self.figures_from(&figs, now_ns);
        let leak = self.leak_report(now_ns);
        let forecast = self.forecast(&figs, &figures, &leak);
        ProcessView {
            key: self.key,
            mode: self.mode,
            needs_resync: self.needs_resync(),
            figures,
            devices,
            recent_events: (self.log).newest(opts.recent_events.min(self.cfg.recent_events)),
            ooms: self.ooms.iter().cloned().collect(),
            ooms_total: self.ooms_total,
            leak,
            forecast,
            snapshots_installed: self.snapshots_installed,
            snapshots_discarded: self.snapshots_discarded,
            last_problem: self.last_problem,
            nvml_timeline: opts.timeline.map(|r| {
                let [nvml] = self.nvml_series.query(r.from_ns, r.to_ns, r.columns);
                nvml
            }),
            memory_bytes: self.memory_bytes(),
            dropped: self.dropped(),
            bounds: self.cfg.bounds,
            leak_criterion: self.leak.config().clone(),
            watch: WatchView {
                began_ns: self.watch.began_ns,
                mid_run: self.watch.mid_run,
                waiting_for_anchor: self.waiting_for_anchor(),
                reflected_events: (self.devices.iter())
                    .map(DeviceState::reflected_events)
                    .sum(),
            },
            attribution: self.attribution(&matches),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_rate_window() {
        let mut r = EventRate::new(5_000_000_000);
        assert_eq!(r.per_sec(0), None);
        // 1000 events/s for 10 s.
        for i in 0..10_000u64 {
            r.note(i * 1_000_000);
        }
        let now = 10_000_000_000;
        let rate = r.per_sec(now).unwrap();
        assert!((rate - 1000.0).abs() < 60.0, "{rate}");
        // Idle for a minute: the rate decays to zero.
        assert_eq!(r.per_sec(now + 60_000_000_000), Some(0.0));
    }

    #[test]
    fn the_event_history_holds_32_768_events_within_its_bound() {
        use vramscope_wire::event::EventKind;
        let key = ProcessKey {
            pid: 1,
            start_time: 1,
        };
        let cfg = ModelConfig::default();
        assert_eq!(cfg.recent_events, 32_768);
        let mut p = Process::new(key, cfg.clone());
        let quiet = p.memory_bytes();
        let n = cfg.recent_events as u64 + 50_000;
        for i in 0..n {
            p.apply(&Event {
                time_ns: i,
                kind: EventKind::Marker {
                    value: i,
                    source: Default::default(),
                },
            });
        }
        let all = ViewOptions {
            block_map: false,
            recent_events: usize::MAX,
            timeline: None,
        };
        let v = p.view(n, &all);
        // The newest 32,768, oldest first.
        assert_eq!(v.recent_events.len(), cfg.recent_events);
        assert_eq!(v.recent_events.last().unwrap().time_ns, n - 1);
        assert_eq!(v.recent_events[0].time_ns, n - cfg.recent_events as u64);
        // Held as events arrive, counted, and bounded.
        let history = cfg.recent_events * 40;
        assert!(quiet < 1 << 20, "{quiet}");
        assert!(p.memory_bytes() <= quiet + history, "{}", p.memory_bytes());
    }

    /// The per-process figures of the model's documentation (`model`,
    /// "Memory per process") hold after a long run.
    #[test]
    fn documented_memory_bounds_hold() {
        use vramscope_wire::event::Place;
        const MIB: usize = 1 << 20;
        // The documented figures are what the structures hold at most.
        let history = crate::model::RECENT_EVENTS * 40;
        assert_eq!(history * 4, 5 * MIB);
        let series = 5 * 4096 * 80;
        assert_eq!(series * 64, 100 * MIB);
        let period = (1 << 15) * 16;
        assert_eq!(period * 2, MIB);

        let key = ProcessKey {
            pid: 1,
            start_time: 1,
        };
        let mut p = Process::new(key, ModelConfig::default());
        let place = Place::default();
        let mut t = 0;
        let mut ev = |p: &mut Process, kind: EventKind| {
            t += 1_000;
            p.apply(&Event { time_ns: t, kind });
        };
        ev(
            &mut p,
            EventKind::SegmentAlloc {
                place,
                addr: 0,
                size: 1 << 30,
            },
        );
        for i in 0..100_000u64 {
            let addr = (i % 64) << 20;
            let size = 512 << (i % 7);
            ev(&mut p, EventKind::Alloc { place, addr, size });
            ev(&mut p, EventKind::FreeRequested { place, addr, size });
            ev(&mut p, EventKind::FreeCompleted { place, addr, size });
        }
        assert!(p.log.memory_bytes() <= history + 64 * 1024);
        // Role lists: a hostile list of 200,000 tensors, never ended, after
        // a complete one as long: at most two lists of the bound are kept.
        let roles = 2 * crate::model::Bounds::default().roles * 24;
        assert_eq!(roles, 3 * MIB);
        for list in [1u32, 2] {
            ev(
                &mut p,
                EventKind::Roles {
                    list,
                    count: 200_000,
                },
            );
            for i in 0..200_000u64 {
                let role = EventKind::Role {
                    list,
                    device: 0,
                    addr: i << 10,
                    bytes: 512,
                    held: vramscope_wire::event::Held::Parameter,
                    module: 0,
                };
                ev(&mut p, role);
            }
            if list == 1 {
                ev(
                    &mut p,
                    EventKind::RolesEnd {
                        list,
                        count: 200_000,
                    },
                );
            }
        }
        assert!(
            p.roles.memory_bytes() <= roles,
            "{}",
            p.roles.memory_bytes()
        );
        for d in &p.devices {
            let held = d.series.memory_bytes();
            assert!(held <= series + 3 * 1024, "{held}");
        }
        assert!(
            p.leak.memory_bytes() <= period + MIB,
            "{}",
            p.leak.memory_bytes()
        );
        let per_device = series + 3 * 1024;
        let bound = history + p.devices.len() * per_device + period + 2 * MIB;
        assert!(p.memory_bytes() <= bound, "{} > {bound}", p.memory_bytes());
    }
}
