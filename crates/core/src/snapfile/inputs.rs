//! A snapshot file as the model's inputs: the state the trace starts from,
//! the trace as allocator events, and the file's own state at the end.
//!
//! A file holds the allocator's state when it was dumped and the events
//! that led there (the newest `max_entries` of them). The state before the
//! first recorded event is found by undoing the trace, newest first, from
//! the dumped state (as PyTorch's viewer does): an `alloc` undone removes
//! its block, a `free_requested` undone brings the block back as allocated
//! (its size rounded as the allocator rounds requests, cut at the next
//! block), a `segment_alloc` undone removes the segment, a `segment_free`
//! undone brings it back, and `segment_map` / `segment_unmap` take away or
//! give back a range of an expandable segment.
//!
//! The inputs are then: that starting state as a state snapshot of each
//! device, every trace entry as an allocator event (through the same rules
//! as a live process's), and the dumped state as a second snapshot, so
//! that whatever the replay inferred, the figures at the end are the file's
//! own. Stopping after `n` events ([`Plan::upto`]) gives the state at any
//! event, rebuilt by the model.
//!
//! Cost: undoing an event finds the segments it touches through the map
//! of segments by address (a range and the nearest below), never by
//! walking them all, so the starting state costs O(n log n) in the trace;
//! the dashboard's stepper finds it once and keeps it ([`feed`] takes it),
//! and the inputs are fed as they are made, a chunk at a time, never held
//! whole.

use std::collections::{BTreeMap, HashMap};

use crate::input::{EventBatch, Identity, Input, Source};
use crate::model::Watch;
use crate::model::{rules, Mode, ProcessKey};
use vramscope_wire::event::{BlockState, CtxTag, Event, EventKind, PoolId, SegmentPool};

use super::file::{Action, SnapshotFile, TraceEntry};
use super::ours::{Mark, Ours};

/// The process a file is shown as (files have no pid: 0).
pub const KEY: ProcessKey = ProcessKey {
    pid: 0,
    start_time: 0,
};

/// Where the file's times start on the model's clock (1 s, so that every
/// time is after zero).
const BASE_NS: u64 = 1_000_000_000;

/// Events per `Input::Events`.
const CHUNK: usize = 4096;

/// What to feed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plan {
    /// Stop after this many trace events (over all devices, in time order):
    /// the state at that event. `None`: the whole trace, then the file's
    /// own state.
    pub upto: Option<usize>,
}

/// A trace event with its device, on the model's clock.
#[derive(Debug, Clone, Copy)]
pub struct Timed<'a> {
    pub device: u16,
    pub time_ns: u64,
    pub entry: &'a TraceEntry,
}

/// Every trace entry of every device, in time order (entries without a
/// time keep their order, 1 µs apart).
pub fn timeline(file: &SnapshotFile) -> Vec<Timed<'_>> {
    let t0 = file.traces.iter().flatten().filter_map(|e| e.time_us).min();
    let mut out = Vec::with_capacity(file.traces.iter().map(Vec::len).sum());
    for (dev, trace) in file.traces.iter().enumerate() {
        let mut last = BASE_NS;
        for (i, e) in trace.iter().enumerate() {
            let t = match (e.time_us, t0) {
                (Some(t), Some(t0)) => {
                    BASE_NS.saturating_add((t.saturating_sub(t0) as u64).saturating_mul(1000))
                }
                _ => BASE_NS + i as u64 * 1000,
            };
            // Times never go backwards within a device.
            last = last.max(t);
            out.push(Timed {
                device: dev as u16,
                time_ns: last,
                entry: e,
            });
        }
    }
    out.sort_by_key(|t| t.time_ns);
    out
}

/// The inputs that show `file` (named `name`) in the model, with the time
/// each is applied at ([`feed`], collected).
pub fn inputs(file: &SnapshotFile, name: &str, plan: Plan) -> Vec<(u64, Input)> {
    let mut out = Vec::new();
    let start = starting_state(file);
    feed(file, name, plan, &start, &mut |t, input| {
        out.push((t, input))
    });
    out
}

/// Gives `apply` the inputs that show `file` (named `name`) in the model,
/// in order, with the time each is applied at; `start` is the file's
/// [`starting_state`].
pub fn feed(
    file: &SnapshotFile,
    name: &str,
    plan: Plan,
    start: &BTreeMap<u16, DeviceStateOf>,
    apply: &mut dyn FnMut(u64, Input),
) {
    let events = timeline(file);
    let first = events.first().map_or(BASE_NS, |e| e.time_ns);
    let dumped = events
        .last()
        .map_or(BASE_NS, |e| e.time_ns.saturating_add(1000));
    apply(first.saturating_sub(1000), attach(file, name));
    let mut out = Batch {
        events: Vec::new(),
        apply,
    };
    // What an export of vramscope's adds (contexts, markers, roles).
    let ours = Ours::read(file);
    let mut extra = Extra::new(file, ours.as_ref(), &events);
    for kind in ours.iter().flat_map(|o| o.defs.iter()) {
        out.push(Event {
            time_ns: first.saturating_sub(1000),
            kind: *kind,
        });
    }
    let mut snapshot_id = 1u32;
    if !events.is_empty() {
        for (dev, segs) in start {
            let t = first.saturating_sub(1000);
            let tag = |a| extra.untouched_tag(*dev, a);
            snapshot_events(&mut out, t, *dev, snapshot_id, segs, &tag);
            snapshot_id += 1;
            extra.seed(*dev, segs);
        }
    }
    let n = plan.upto.unwrap_or(usize::MAX).min(events.len());
    for (i, e) in events[..n].iter().enumerate() {
        extra.marks_before(i, e.time_ns, &mut out);
        if let Some(kind) = event_kind(e, extra.tag(e.entry.stack)) {
            extra.note(&kind);
            out.push(Event {
                time_ns: e.time_ns,
                kind,
            });
        }
    }
    if plan.upto.is_none() {
        let end = events.last().map_or(first, |e| e.time_ns);
        extra.marks_before(events.len(), end, &mut out);
        for (dev, segs) in &final_state(file) {
            let tag = |a| extra.block_tag(*dev, a);
            snapshot_events(&mut out, dumped, *dev, snapshot_id, segs, &tag);
            snapshot_id += 1;
        }
        // The blocks installed now are born now: the role list after them.
        extra.roles(dumped.saturating_add(1000), true, &mut out);
    }
    out.flush();
}

/// What an export's own keys add to the inputs, as they are fed: the
/// context tags of entries and blocks, the markers in their places, and
/// role lists.
struct Extra<'f> {
    ours: Option<&'f Ours>,
    /// The markers not sent yet, each with the index in the timeline of
    /// the event it comes before, in order.
    marks: std::vec::IntoIter<(usize, Mark)>,
    next_mark: Option<(usize, Mark)>,
    /// The stacks of the file's blocks, by device and address.
    block_stacks: HashMap<(u16, u64), Option<u32>>,
    /// Addresses some trace entry allocates (a block of the starting
    /// state there may not be the file's).
    allocated_in_trace: std::collections::HashSet<(u16, u64)>,
    /// The live allocations now, by device and address: their requests.
    live: HashMap<(u16, u64), u64>,
    /// The entries of the last role list sent, and the lists sent.
    last_list: Option<Vec<usize>>,
    lists: u32,
    /// What the lists before the last one may still cost: entries
    /// weighed and records sent, from [`ROLE_BUDGET`] down.
    role_budget: usize,
}

/// What the role lists before the last one may cost in all: entries
/// weighed at the markers and records sent (a list is sent at a marker
/// when it changed). A file of many markers and many named blocks is read
/// in time about linear in its size; past this, only the last list is
/// sent.
const ROLE_BUDGET: usize = 1 << 22;

impl<'f> Extra<'f> {
    fn new(file: &SnapshotFile, ours: Option<&'f Ours>, events: &[Timed]) -> Self {
        let mut marks = Vec::new();
        let mut block_stacks = HashMap::new();
        let mut allocated_in_trace = std::collections::HashSet::new();
        if let Some(o) = ours {
            // Where each device's entries are in the timeline.
            let mut at: HashMap<u16, Vec<usize>> = HashMap::new();
            for (i, e) in events.iter().enumerate() {
                at.entry(e.device).or_default().push(i);
                if e.entry.action == Action::Alloc {
                    allocated_in_trace.insert((e.device, e.entry.addr));
                }
            }
            for m in &o.marks {
                let place = at
                    .get(&m.device)
                    .map_or(events.len(), |v| match v.get(m.before) {
                        Some(&i) => i,
                        None => v.last().map_or(events.len(), |&l| l + 1),
                    });
                marks.push((place, *m));
            }
            // In the file's order where two go to one place.
            marks.sort_by_key(|(place, _)| *place);
            for s in &file.segments {
                for b in &s.blocks {
                    block_stacks.insert((s.device, b.address), b.stack);
                }
            }
        }
        let mut marks = marks.into_iter();
        Extra {
            ours,
            next_mark: marks.next(),
            marks,
            block_stacks,
            allocated_in_trace,
            live: HashMap::new(),
            // No list yet says no block is named.
            last_list: Some(Vec::new()),
            lists: 0,
            role_budget: ROLE_BUDGET,
        }
    }

    /// The tag of what the file's stack `stack` was written for.
    fn tag(&self, stack: Option<u32>) -> CtxTag {
        self.ours.map_or(CtxTag::NONE, |o| o.tag(stack))
    }

    /// The tag of the file's block at `addr` of `device`.
    fn block_tag(&self, device: u16, addr: u64) -> CtxTag {
        self.tag(self.block_stacks.get(&(device, addr)).copied().flatten())
    }

    /// The tag of a block of the starting state: the file's block there,
    /// when no trace entry allocates at that address (else unknown).
    fn untouched_tag(&self, device: u16, addr: u64) -> CtxTag {
        if self.allocated_in_trace.contains(&(device, addr)) {
            return CtxTag::NONE;
        }
        self.block_tag(device, addr)
    }

    /// The allocations of a starting state.
    fn seed(&mut self, device: u16, d: &DeviceStateOf) {
        if self.ours.is_some() {
            for (&a, &(_, requested, state)) in &d.live {
                if state == BlockState::Allocated {
                    self.live.insert((device, a), requested);
                }
            }
        }
    }

    /// An allocator event sent.
    fn note(&mut self, kind: &EventKind) {
        if self.ours.is_none() {
            return;
        }
        match *kind {
            EventKind::Alloc { place, addr, size } => {
                self.live.insert((place.device, addr), size);
            }
            EventKind::FreeRequested { place, addr, .. } => {
                self.live.remove(&(place.device, addr));
            }
            _ => {}
        }
    }

    /// Sends the markers that come before the timeline's event `i` (at
    /// `t`), each followed by the role list then, when it changed.
    fn marks_before(&mut self, i: usize, t: u64, out: &mut Batch) {
        while let Some((place, m)) = self.next_mark.filter(|(p, _)| *p <= i) {
            let _ = place;
            out.push(Event {
                time_ns: t,
                kind: EventKind::Marker {
                    value: m.value,
                    source: m.source,
                },
            });
            self.next_mark = self.marks.next();
            self.roles(t, false, out);
        }
    }

    /// Sends the role list of the blocks named in the file whose address
    /// holds, now, an allocation of their request: at the end (`all`),
    /// every named block, always; before it, when the list changed.
    fn roles(&mut self, t: u64, all: bool, out: &mut Batch) {
        let Some(o) = self.ours else {
            return;
        };
        if o.named.is_empty() || (!all && self.role_budget < o.named.len()) {
            return;
        }
        if !all {
            self.role_budget -= o.named.len();
        }
        let entries: Vec<usize> = (o.named.iter().enumerate())
            .filter(|(_, n)| all || self.live.get(&(n.device, n.addr)) == Some(&n.bytes))
            .map(|(i, _)| i)
            .collect();
        if !all {
            if self.last_list.as_ref() == Some(&entries) || self.role_budget < entries.len() {
                return;
            }
            self.role_budget -= entries.len();
        }
        self.lists += 1;
        let list = self.lists;
        let ev = |kind| Event { time_ns: t, kind };
        let count = entries.len() as u64;
        out.push(ev(EventKind::Roles { list, count }));
        for &i in &entries {
            let n = o.named[i];
            out.push(ev(EventKind::Role {
                list,
                device: n.device,
                addr: n.addr,
                bytes: n.bytes,
                held: n.held,
                module: n.module,
            }));
        }
        out.push(ev(EventKind::RolesEnd { list, count }));
        self.last_list = Some(entries);
    }
}

/// The time of the last input [`feed`] gives for `plan` (or, when the
/// last events it names are `snapshot` entries, a little after it).
pub fn end_ns(events: &[Timed], plan: Plan) -> u64 {
    let first = events.first().map_or(BASE_NS, |e| e.time_ns);
    match plan.upto {
        None => events
            .last()
            .map_or(BASE_NS, |e| e.time_ns.saturating_add(1000)),
        Some(0) => first.saturating_sub(1000),
        Some(n) => events
            .get(n.min(events.len()).saturating_sub(1))
            .map_or(first, |e| e.time_ns),
    }
}

/// Events on their way to the model, a chunk at a time.
struct Batch<'f> {
    events: Vec<Event>,
    apply: &'f mut dyn FnMut(u64, Input),
}

impl Batch<'_> {
    fn push(&mut self, e: Event) {
        self.events.push(e);
        if self.events.len() >= CHUNK {
            self.flush();
        }
    }

    fn flush(&mut self) {
        let Some(t) = self.events.last().map(|e| e.time_ns) else {
            return;
        };
        let events = std::mem::replace(&mut self.events, Vec::with_capacity(CHUNK));
        (self.apply)(
            t,
            Input::Events(EventBatch {
                key: KEY,
                events,
                delivered: 0,
                lost: 0,
                lost_now: 0,
                at: Vec::new(),
            }),
        );
    }
}

fn attach(file: &SnapshotFile, name: &str) -> Input {
    Input::Attach {
        key: KEY,
        identity: Identity {
            name: "snapshot".into(),
            cmdline: vramscope_text::printable(name),
            label: vramscope_text::printable(name),
            alive: true,
            ..Identity::default()
        },
        source: Source {
            mode: Mode::Exact,
            segment: None,
            producer: Some("PyTorch memory snapshot".into()),
            framework: Some(file.format.clone()),
            delivered: 0,
            lost: 0,
            commands: false,
        },
        watch: Watch::default(),
    }
}

/// The allocator event a trace entry is (a `snapshot` entry is none),
/// tagged `ctx`.
fn event_kind(t: &Timed, ctx: CtxTag) -> Option<EventKind> {
    let e = t.entry;
    let place = vramscope_wire::event::Place {
        device: t.device,
        stream: e.stream,
        pool: e.meta.as_ref().and_then(|m| m.pool).unwrap_or_default(),
        ctx,
    };
    let (addr, size) = (e.addr, e.size);
    Some(match e.action {
        Action::Alloc => EventKind::Alloc { place, addr, size },
        Action::FreeRequested => EventKind::FreeRequested { place, addr, size },
        Action::FreeCompleted => EventKind::FreeCompleted { place, addr, size },
        Action::SegmentAlloc => EventKind::SegmentAlloc { place, addr, size },
        Action::SegmentFree => EventKind::SegmentFree { place, addr, size },
        Action::SegmentMap => EventKind::SegmentMap { place, addr, size },
        Action::SegmentUnmap => EventKind::SegmentUnmap { place, addr, size },
        Action::Oom => EventKind::Oom {
            place,
            device_free: addr,
            request: size,
        },
        Action::Snapshot | Action::Annotate => return None,
    })
}

/// A segment of a reconstructed state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateSegment {
    pub(crate) size: u64,
    pub(crate) stream: u64,
    pub(crate) pool: PoolId,
    pub(crate) large: bool,
    pub(crate) expandable: bool,
}

/// A block that is not free: (size, requested, state).
pub(crate) type Live = (u64, u64, BlockState);

/// One device's segments (by address) and its blocks that are not free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStateOf {
    pub(crate) segments: BTreeMap<u64, StateSegment>,
    pub(crate) live: BTreeMap<u64, Live>,
}

/// The dumped state, per device.
pub(crate) fn final_state(file: &SnapshotFile) -> BTreeMap<u16, DeviceStateOf> {
    let mut out: BTreeMap<u16, DeviceStateOf> = BTreeMap::new();
    for s in &file.segments {
        let d = out.entry(s.device).or_default();
        d.segments.insert(
            s.address,
            StateSegment {
                size: s.total_size,
                stream: s.stream,
                pool: s.pool,
                large: s.large,
                expandable: s.expandable,
            },
        );
        for b in &s.blocks {
            if b.state != BlockState::Inactive {
                d.live
                    .insert(b.address, (b.size, b.requested_size, b.state));
            }
        }
    }
    out
}

/// The state before the first trace entry, per device: the dumped state
/// with the trace undone, newest first.
pub fn starting_state(file: &SnapshotFile) -> BTreeMap<u16, DeviceStateOf> {
    let mut state = final_state(file);
    for (dev, trace) in file.traces.iter().enumerate() {
        let d = state.entry(dev as u16).or_default();
        for e in trace.iter().rev() {
            undo(d, e);
        }
    }
    // A block undone into a place no segment covers cannot be shown.
    for d in state.values_mut() {
        let segs = &d.segments;
        d.live.retain(|&a, &mut (size, _, _)| {
            segs.range(..=a)
                .next_back()
                .is_some_and(|(s, seg)| a.saturating_add(size) <= s.saturating_add(seg.size))
        });
    }
    state.retain(|_, d| !d.segments.is_empty());
    state
}

fn undo(d: &mut DeviceStateOf, e: &TraceEntry) {
    let (addr, size) = (e.addr, e.size);
    match e.action {
        Action::Alloc => {
            d.live.remove(&addr);
        }
        Action::FreeRequested | Action::FreeCompleted => {
            let state = if e.action == Action::FreeRequested {
                BlockState::Allocated
            } else {
                BlockState::PendingFree
            };
            let known = d.live.get(&addr).map(|l| l.0);
            let block = known.unwrap_or_else(|| fit(d, addr, rules::round_size(size)));
            if block > 0 {
                d.live.insert(addr, (block, size, state));
            }
        }
        Action::SegmentAlloc => {
            d.segments.remove(&addr);
        }
        Action::SegmentFree => {
            d.segments.insert(
                addr,
                StateSegment {
                    size,
                    stream: e.stream,
                    pool: PoolId::default(),
                    large: rules::segment_pool_guess(size) == SegmentPool::Large,
                    expandable: false,
                },
            );
        }
        Action::SegmentMap => cut(d, addr, size),
        Action::SegmentUnmap => join(d, addr, size, e.stream),
        Action::Snapshot | Action::Oom | Action::Annotate => {}
    }
}

/// `want` bytes at `addr`, cut at the next live block and the segment's end.
fn fit(d: &DeviceStateOf, addr: u64, want: u64) -> u64 {
    let mut end = addr.saturating_add(want);
    if let Some((&next, _)) = d.live.range(addr.saturating_add(1)..).next() {
        end = end.min(next);
    }
    if let Some((&s, seg)) = d.segments.range(..=addr).next_back() {
        end = end.min(s.saturating_add(seg.size));
    }
    end.saturating_sub(addr)
}

/// The segments that `[addr, end)` overlaps, by address: those that
/// start in it, and the nearest below it if it reaches in. (Segments do
/// not overlap in a real file; where a damaged one's do, a segment
/// reaching in from further below is not found, as everywhere else the
/// state is read: each address belongs to the nearest segment below.)
/// Costs the segments found, not the segments there are.
fn overlapping(d: &DeviceStateOf, addr: u64, end: u64) -> Vec<u64> {
    let below = d.segments.range(..addr).next_back();
    let below = below.filter(|(&s, seg)| s.saturating_add(seg.size) > addr);
    (below.into_iter())
        .chain(d.segments.range(addr..end))
        .map(|(&s, _)| s)
        .collect()
}

/// Takes `[addr, addr + size)` out of the mapped ranges (undoing a map).
fn cut(d: &mut DeviceStateOf, addr: u64, size: u64) {
    let end = addr.saturating_add(size);
    for s in overlapping(d, addr, end) {
        let Some(seg) = d.segments.remove(&s) else {
            continue;
        };
        let s_end = s.saturating_add(seg.size);
        if s < addr {
            d.segments.insert(
                s,
                StateSegment {
                    size: addr - s,
                    ..seg.clone()
                },
            );
        }
        if s_end > end {
            d.segments.insert(
                end,
                StateSegment {
                    size: s_end - end,
                    ..seg
                },
            );
        }
    }
}

/// Gives `[addr, addr + size)` back as mapped (undoing an unmap), joined to
/// the expandable ranges it touches.
fn join(d: &mut DeviceStateOf, addr: u64, size: u64, stream: u64) {
    let mut start = addr;
    let mut end = addr.saturating_add(size);
    let mut like = StateSegment {
        size: 0,
        stream,
        pool: PoolId::default(),
        large: true,
        expandable: true,
    };
    if let Some((&s, seg)) = d.segments.range(..=start).next_back() {
        if seg.expandable && s.saturating_add(seg.size) == start {
            like = seg.clone();
            start = s;
        }
    }
    if let Some(seg) = d.segments.get(&end) {
        if seg.expandable {
            like = seg.clone();
            end = end.saturating_add(seg.size);
        }
    }
    // What starts there gives way (in a real file, only the expandable
    // ranges just joined: nothing else lies in a range being mapped).
    let inside: Vec<u64> = d.segments.range(start..end).map(|(&s, _)| s).collect();
    for s in inside {
        d.segments.remove(&s);
    }
    like.size = end - start;
    d.segments.insert(start, like);
}

/// Each segment of `d` with the live blocks it holds: those from its start
/// to its end or the next segment's start (so that no block is in two,
/// however a damaged file's segments overlap).
fn segments_with_blocks(
    d: &DeviceStateOf,
) -> impl Iterator<
    Item = (
        u64,
        &StateSegment,
        std::collections::btree_map::Range<'_, u64, Live>,
    ),
> {
    let mut segs = d.segments.iter().peekable();
    std::iter::from_fn(move || {
        let (&s, seg) = segs.next()?;
        let next = segs.peek().map_or(u64::MAX, |(&n, _)| n);
        let end = s.saturating_add(seg.size).min(next);
        Some((s, seg, d.live.range(s..end)))
    })
}

/// A state snapshot of one device as events, each block tagged as `tag`
/// says of its address.
fn snapshot_events(
    out: &mut Batch,
    t: u64,
    device: u16,
    id: u32,
    d: &DeviceStateOf,
    tag: &dyn Fn(u64) -> CtxTag,
) {
    let ev = |kind| Event { time_ns: t, kind };
    let blocks = segments_with_blocks(d)
        .map(|(_, _, blocks)| blocks.count() as u64)
        .sum();
    out.push(ev(EventKind::SnapshotBegin {
        device,
        id,
        segments: d.segments.len() as u64,
        blocks,
        at: None,
    }));
    for (s, seg, blocks) in segments_with_blocks(d) {
        out.push(ev(EventKind::SnapshotSegment {
            id,
            place: vramscope_wire::event::Place {
                device,
                stream: seg.stream,
                pool: seg.pool,
                ..Default::default()
            },
            addr: s,
            size: seg.size,
            pool_kind: if seg.large {
                SegmentPool::Large
            } else {
                SegmentPool::Small
            },
            expandable: seg.expandable,
        }));
        for (&a, &(size, requested, state)) in blocks {
            out.push(ev(EventKind::SnapshotBlock {
                id,
                device,
                addr: a,
                size,
                requested,
                state,
                ctx: if state == BlockState::Inactive {
                    CtxTag::NONE
                } else {
                    tag(a)
                },
            }));
        }
    }
    out.push(ev(EventKind::SnapshotEnd { device, id }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapfile::file::ENTRY_COST;

    /// The file's bound counts a trace entry's place in the timeline by a
    /// tuple of `Timed`'s fields, so that the file's types need not know
    /// this module.
    #[test]
    fn entry_cost_counts_a_timed() {
        let timed = std::mem::size_of::<Timed<'static>>();
        assert_eq!(ENTRY_COST, std::mem::size_of::<TraceEntry>() + timed);
    }
}
