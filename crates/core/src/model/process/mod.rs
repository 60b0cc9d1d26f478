//! One instrumented process: its devices, counters, recent events, OOMs,
//! NVML samples and leak detector.
//!
//! The files split along the jobs: the [`Process`] type and its small
//! accessors here; `apply` (events and the other inputs applied), `figures`
//! (figures, the leak verdict and the forecast), `view` (the views, roles
//! and attribution), `rate` (events per second).

use std::collections::{BTreeMap, VecDeque};

use super::attrib::{self, Definitions, StepClock};
use super::config::{Mode, ModelConfig, ProcessKey, Watch, PLACEMENT_LOG};
use super::device::{DeviceState, HeldSegment};
use super::eventlog::EventLog;
use super::leak::LeakDetector;
use super::outside::OutsideState;
use super::roles::RoleTable;
use super::series::Series;
use super::view::{Dropped, OomRecord, ProblemRecord};

use vramscope_wire::event::{BlockState, Event, PoolId};

mod apply;
mod figures;
mod rate;
mod view;

use rate::EventRate;

/// Step boundaries whose reserved bytes the forecast measures growth over
/// (from 16 of them on; before, the floor's growth alone).
const STEP_RESERVED: usize = 32;
/// The first steps, whose reserved bytes grow with the job's setting up
/// (optimizer state, caches), are not measured.
const FORECAST_WARM_UP: u64 = 4;

/// Tensors a process holds: address, requested size, stream.
pub(crate) type HeldTensors = Vec<(u64, u64, u64)>;

/// `d`'s segments as its block map shows them (see
/// [`Process::advisor_start`]); empty where they cannot be installed.
fn held_segments(d: &DeviceState) -> Vec<HeldSegment> {
    let mut out = Vec::new();
    for seg in d.segments() {
        if seg.expandable || seg.pool != PoolId(0, 0) || !seg.pool_kind_known {
            return Vec::new();
        }
        let mut at = seg.addr;
        let mut blocks = Vec::new();
        for (addr, b) in d.blocks_of(seg) {
            if addr != at || b.size == 0 {
                return Vec::new();
            }
            let held = (b.state == BlockState::Allocated).then_some(if b.requested > 0 {
                b.requested
            } else {
                b.size
            });
            blocks.push((b.size, held));
            at = at.saturating_add(b.size);
        }
        if at != seg.end() {
            return Vec::new();
        }
        out.push(HeldSegment {
            addr: seg.addr,
            stream: seg.stream,
            pool: seg.pool_kind,
            blocks,
        });
    }
    out
}

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
    /// Its memory outside the caching allocator (1.3).
    outside: OutsideState,
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
            outside: OutsideState::default(),
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
    /// Events the producer lost (its ring overflowed) so far.
    pub fn lost_events(&self) -> u64 {
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
    /// address order, and that device's segments as its block map shows
    /// them, for the replay of the job's own setting to begin exactly
    /// there (none where the map does not tile every segment, or under
    /// expandable segments or private pools: the tensors are then placed
    /// afresh). An error names why it cannot start (the mode, a state not
    /// known yet).
    pub fn advisor_start(&self) -> Result<Option<(u16, HeldTensors, Vec<HeldSegment>)>, String> {
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
        Ok(Some((d.device(), held, held_segments(d))))
    }

    /// The memory limits the producer stated: (device, bytes, whole
    /// device).
    pub fn limits(&self) -> impl Iterator<Item = (u16, u64, bool)> + '_ {
        self.limits.iter().map(|(&d, &(v, whole))| (d, v, whole))
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

    /// What the bounds dropped, and the collector's drop counts.
    pub fn dropped(&self) -> Dropped {
        let mut out = Dropped {
            devices: self.dropped_devices,
            history: self.log.dropped(),
            leak_sizes: self.leak.dropped(),
            collector: self.collector_drops.clone(),
            definitions: self.defs.dropped(),
            roles: self.roles.status().dropped,
            outside: self.outside.refused(),
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
            + self.outside.memory_bytes()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::view::ViewOptions;
    use vramscope_wire::event::EventKind;

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
        let history = crate::model::config::RECENT_EVENTS * 40;
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
        let roles = 2 * crate::model::config::Bounds::default().roles * 24;
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
