//! Allocation requests recovered from a real process's allocator events (a
//! `vramscope record` file), so `vramscope sim --trace` can replay what a
//! job really asked for under another configuration.
//!
//! - ALLOC → an `alloc` of the caller's request on its stream; the real
//!   address names the tensor until it is freed.
//! - FREE_REQUESTED → `free` (allocated bytes drop there in PyTorch too).
//! - OOM → an `alloc` of the failed (rounded) request and its `free` at
//!   once: the job never held it, and a replay under a setting that serves
//!   it must not hold it either.
//! - SEGMENT_FREE / SEGMENT_UNMAP bursts: PyTorch releases segments in
//!   `empty_cache()` and while retrying a failed allocation. A burst followed
//!   by an ALLOC or OOM is the allocator's own retry (the simulator repeats
//!   it by itself); any other burst becomes an `empty_cache`.
//! - STATS samples are kept so a replay can be compared with what the
//!   process really had. A sample that carries its place in the device ring
//!   (STATS_C, FORMAT.md "Positions") is *placed*: it reflects exactly the
//!   requests whose events sit below its `before` position, so it is
//!   compared after exactly those requests (a window `before < after` leaves
//!   a range of candidates). A sample without one is kept beside the request
//!   it follows in time, as a 1.0 reader does.

use std::collections::HashMap;

use vramscope_wire::event::RingPos;
use vramscope_wire::event::{Event, EventKind, MarkSource, PoolId, RingSpan, Stats};

use super::trace::Request;

/// The most events of one process a replay of a recording holds (16 Mi,
/// about 1.5 GiB with their positions): recovering requests sorts them by
/// time, so they are held at once. A process with more is refused with
/// one line (`sim`, `advise`, `diff`), before any is read.
pub const MAX_REPLAY_EVENTS: u64 = 1 << 24;

/// Requests of one device, and the statistics the process reported.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovered {
    pub requests: Vec<Request>,
    /// Per request, the sample without a usable position that followed it
    /// in time (placed by time).
    pub recorded: Vec<Option<Stats>>,
    /// The samples placed by ring positions, in the order they were taken.
    pub placed: Vec<PlacedSample>,
    /// Samples that carried a position the events could not honour (events
    /// without positions, in another ring or out of ring order): placed by
    /// time instead.
    pub unplaceable: u64,
    /// Frees of addresses never seen allocated (allocated before recording).
    pub unknown_frees: u64,
    /// The requests that were out-of-memory errors (indices).
    pub ooms: Vec<usize>,
    /// Some allocation was in a pool other than the default (a CUDA graph's
    /// or a `MemPool`'s, which the simulator does not keep apart).
    pub graph_pools: bool,
    /// The allocator mapped pages (`expandable_segments:True` was on).
    pub expandable: bool,
    /// Step markers: the number of requests before each, where it came
    /// from, its value and its time.
    pub marks: Vec<Mark>,
    /// Each request's time (its first event's).
    pub times: Vec<u64>,
}

impl Recovered {
    /// The last memory limit the producer stated for `device` (MARKER
    /// source 6): bytes, and whether it is the whole device (no memory
    /// fraction).
    pub fn memory_limit(&self, device: u16) -> Option<(u64, bool)> {
        self.marks.iter().rev().find_map(|m| match m.source {
            vramscope_wire::event::MarkSource::MemoryLimit {
                device: d,
                whole_device,
            } if d == device => Some((m.value, whole_device)),
            _ => None,
        })
    }
}

/// A step marker among the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Requests before it.
    pub at: usize,
    pub source: vramscope_wire::event::MarkSource,
    pub value: u64,
    pub time_ns: u64,
}

/// Where the steps end (requests before each step's end mark), by the
/// kinds of step marks the recording has: optimizer steps when there are any (the first optimizer
/// only), else the user's marks, else inferred or unattributed ones.
pub fn step_ends(marks: &[Mark]) -> Vec<usize> {
    let optimizer =
        |m: &Mark| matches!(m.source, MarkSource::OptimizerStep { optimizer } if optimizer <= 1);
    let user = |m: &Mark| m.source == MarkSource::User;
    let other = |m: &Mark| matches!(m.source, MarkSource::Inferred | MarkSource::Unknown);
    let pick: &dyn Fn(&Mark) -> bool = if marks.iter().any(optimizer) {
        &optimizer
    } else if marks.iter().any(user) {
        &user
    } else {
        &other
    };
    let mut at: Vec<usize> = marks.iter().filter(|m| pick(m)).map(|m| m.at).collect();
    at.dedup();
    at
}

/// A statistics sample placed by its ring positions: it reflects the first
/// `k` requests for some `k` in `from..=to` (`from == to`: one place).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlacedSample {
    pub(crate) stats: Stats,
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// Where the producer said the sample sits.
    pub(crate) at: RingSpan,
}

/// An event and where its record was in its segment (None: not given).
pub(crate) type Located = (Event, Option<RingPos>);

/// Where the events that made one request sit in their ring.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    ring: u32,
    first: u64,
    last: u64,
}

impl Span {
    fn of(at: Option<RingPos>) -> Option<Span> {
        at.map(|p| Span {
            ring: p.ring,
            first: p.position,
            last: p.position,
        })
    }

    /// Both spans' events (None when either is unknown or the rings differ).
    fn join(a: Option<Span>, b: Option<Span>) -> Option<Span> {
        let (a, b) = (a?, b?);
        (a.ring == b.ring).then(|| Span {
            ring: a.ring,
            first: a.first.min(b.first),
            last: a.last.max(b.last),
        })
    }
}

/// Recovers the requests made on `device` from one process's `events`, in
/// the order they were read (each ring's records in ring order); they are
/// ordered by time here.
pub fn recover(events: Vec<Located>, device: u16) -> Recovered {
    let spans = pair_positions(&events, device);
    let mut events: Vec<(Event, Option<RingPos>, Option<RingSpan>)> = events
        .into_iter()
        .zip(spans)
        .map(|((e, at), span)| (e, at, span))
        .collect();
    events.sort_by_key(|(e, ..)| e.time_ns);
    let mut r = Recovery {
        next_id: 1,
        ..Recovery::default()
    };
    // Samples: (stats, where, the request count when met in time); placed
    // once every request is known.
    let mut samples: Vec<(Stats, Option<RingSpan>, usize)> = Vec::new();
    for (e, at, span) in &events {
        if let Some(stats) = r.feed(e, *at, device) {
            samples.push((stats, *span, r.out.requests.len()));
        }
    }
    r.end_burst();
    let ring = r.ring_in_order();
    for (stats, at, met) in samples {
        match at.map(|at| (at, r.place(&at, ring))) {
            Some((at, Some((from, to)))) => r.out.placed.push(PlacedSample {
                stats,
                from,
                to,
                at,
            }),
            Some((_, None)) => {
                r.out.unplaceable += 1;
                r.by_time(stats, met);
            }
            None => r.by_time(stats, met),
        }
    }
    r.out
}

/// What [`Stream::feed`] found in one event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Found {
    /// A request; `oom`: the job's allocation that ran out of memory.
    Request { request: Request, oom: bool },
    /// A marker (step boundary, new run, memory limit).
    Mark {
        source: vramscope_wire::event::MarkSource,
        value: u64,
    },
    /// A statistics sample of the device, after the requests before it.
    Sample(Stats),
    /// The allocator mapped pages (`expandable_segments:True`).
    Expandable,
    /// An allocation in a pool other than the default.
    GraphPool,
    /// Tensor `id` is no longer held, its free not seen (see
    /// [`Stream::feed`]).
    Unseen { id: u64 },
}

/// Requests recovered from a live process's events as they arrive (in
/// ring order, as a collector reads them), one event at a time, holding
/// nothing but the live tensors' ids: what [`recover`] does for a whole
/// recording, for the live advisor.
#[derive(Default)]
pub(crate) struct Stream {
    r: Recovery,
    device: u16,
}

impl Stream {
    /// Reads the requests of `device`.
    pub(crate) fn new(device: u16) -> Stream {
        Stream {
            r: Recovery {
                next_id: 1,
                ..Recovery::default()
            },
            device,
        }
    }

    /// A tensor the process held before the stream began, at `addr`: its
    /// `alloc` (a later free of `addr` frees it).
    pub(crate) fn held(&mut self, addr: u64, size: u64, stream: u64) -> Request {
        let id = self.r.next_id;
        self.r.next_id += 1;
        self.r.live.insert(addr, id);
        Request::alloc(id, size, stream)
    }

    /// Frees of addresses never seen allocated.
    pub(crate) fn unknown_frees(&self) -> u64 {
        self.r.out.unknown_frees
    }

    /// The tensors live now: (address, request id).
    pub(crate) fn live_tensors(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.r.live.iter().map(|(a, id)| (*a, *id))
    }

    /// Forgets every live tensor (the job holds none); returns their
    /// request ids, in order.
    pub(crate) fn forget_live(&mut self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.r.live.drain().map(|(_, id)| id).collect();
        ids.sort_unstable();
        ids
    }

    /// Reads one event; what it made is appended to `out` (requests first).
    ///
    /// An allocation at the address of a tensor still live here proves
    /// that tensor gone (its free was never seen: a producer that started
    /// over, events lost): its `free` comes first.
    pub(crate) fn feed(&mut self, e: &Event, out: &mut Vec<Found>) {
        if let EventKind::Alloc { place, addr, .. } = &e.kind {
            if place.device == self.device {
                if let Some(id) = self.r.live.remove(addr) {
                    out.push(Found::Unseen { id });
                }
            }
        }
        let (expandable, graph) = (self.r.out.expandable, self.r.out.graph_pools);
        let sample = self.r.feed(e, None, self.device);
        let o = &mut self.r.out;
        for (i, request) in o.requests.drain(..).enumerate() {
            out.push(Found::Request {
                request,
                oom: o.ooms.first() == Some(&i),
            });
        }
        o.ooms.clear();
        o.times.clear();
        o.recorded.clear();
        self.r.spans.clear();
        for m in o.marks.drain(..) {
            out.push(Found::Mark {
                source: m.source,
                value: m.value,
            });
        }
        if o.expandable && !expandable {
            out.push(Found::Expandable);
        }
        if o.graph_pools && !graph {
            out.push(Found::GraphPool);
        }
        if let Some(s) = sample {
            out.push(Found::Sample(s));
        }
    }
}

/// The position each sample of `device` carries (STATS_C follows its STATS_B
/// in the same ring, and the decoder keeps it only for the sample completed
/// last there): per event, the span of the sample it is.
fn pair_positions(events: &[Located], device: u16) -> Vec<Option<RingSpan>> {
    let mut spans = vec![None; events.len()];
    // The last sample met per ring (None: positions not given).
    let mut last: HashMap<Option<u32>, usize> = HashMap::new();
    for (i, (e, at)) in events.iter().enumerate() {
        let ring = at.map(|p| p.ring);
        match e.kind {
            EventKind::Stats { device: d, .. } if d == device => {
                last.insert(ring, i);
            }
            EventKind::StatsPosition { device: d, at } if d == device => {
                if let Some(s) = last.remove(&ring) {
                    spans[s] = Some(at);
                }
            }
            _ => {}
        }
    }
    spans
}

/// The state of [`recover`] while it walks the events.
#[derive(Default)]
struct Recovery {
    out: Recovered,
    /// Where each request's events sit (None: not given).
    spans: Vec<Option<Span>>,
    /// Live tensors: real address to request id.
    live: HashMap<u64, u64>,
    next_id: u64,
    /// Segments were released since the last request (with where their
    /// events sit, when every one of them says).
    burst: Option<Option<Span>>,
    /// Where the real allocator put the segment made for the next request.
    segment: Option<u64>,
    /// The time of the event being read.
    now_ns: u64,
}

impl Recovery {
    /// Reads one event of `device` (others are passed over); a statistics
    /// sample is given back, for the caller to place.
    fn feed(&mut self, e: &Event, at: Option<RingPos>, device: u16) -> Option<Stats> {
        self.now_ns = e.time_ns;
        match &e.kind {
            EventKind::Alloc { place, addr, size } if place.device == device => {
                self.out.graph_pools |= place.pool != PoolId::default();
                let id = self.alloc(*size, place.stream, at);
                self.live.insert(*addr, id);
            }
            EventKind::Oom { place, request, .. } if place.device == device => {
                // Never used: freed at once where a replay under another
                // setting serves it (a no-op where it fails again).
                self.out.ooms.push(self.out.requests.len());
                let id = self.alloc(*request, place.stream, at);
                self.push(Request::Free { id }, Span::of(at));
            }
            EventKind::FreeRequested { place, addr, .. } if place.device == device => {
                self.end_burst();
                match self.live.remove(addr) {
                    Some(id) => self.push(Request::Free { id }, Span::of(at)),
                    None => self.out.unknown_frees += 1,
                }
            }
            // A segment made (or address space mapped) for the request
            // whose ALLOC follows: the replay puts its segment there too.
            EventKind::SegmentAlloc { place, addr, .. }
            | EventKind::SegmentMap { place, addr, .. }
                if place.device == device =>
            {
                self.out.expandable |= matches!(e.kind, EventKind::SegmentMap { .. });
                self.segment.get_or_insert(*addr);
            }
            EventKind::SegmentFree { place, .. } | EventKind::SegmentUnmap { place, .. }
                if place.device == device =>
            {
                self.burst = Some(match self.burst {
                    None => Span::of(at),
                    Some(b) => Span::join(b, Span::of(at)),
                });
            }
            EventKind::Marker { value, source } => {
                self.out.marks.push(Mark {
                    at: self.out.requests.len(),
                    source: *source,
                    value: *value,
                    time_ns: e.time_ns,
                });
            }
            EventKind::Stats { device: d, stats } if *d == device => {
                self.end_burst();
                return Some(*stats);
            }
            _ => {}
        }
        None
    }

    fn push(&mut self, r: Request, span: Option<Span>) {
        self.out.requests.push(r);
        self.out.times.push(self.now_ns);
        self.out.recorded.push(None);
        self.spans.push(span);
    }

    /// An `alloc` of `size` bytes on `stream`; returns its id. A release
    /// burst just before it was the allocator's own retry, not a request.
    fn alloc(&mut self, size: u64, stream: u64, at: Option<RingPos>) -> u64 {
        let segment_addr = self.segment.take();
        let released_before = self.burst.is_some();
        let span = match self.burst.take() {
            Some(b) => Span::join(b, Span::of(at)),
            None => Span::of(at),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.push(
            Request::Alloc {
                id,
                size,
                stream,
                segment_addr,
                released_before,
            },
            span,
        );
        id
    }

    /// A release burst not followed by an allocation was an `empty_cache`.
    fn end_burst(&mut self) {
        if let Some(span) = self.burst.take() {
            self.push(Request::EmptyCache, span);
        }
    }

    /// A sample placed by time: beside the last of the first `met` requests
    /// (a sample before any request is not compared).
    fn by_time(&mut self, stats: Stats, met: usize) {
        if let Some(slot) = met
            .checked_sub(1)
            .and_then(|i| self.out.recorded.get_mut(i))
        {
            *slot = Some(stats);
        }
    }

    /// The ring every request's events sit in, in ring order (`Some(None)`
    /// when there are no requests); None when they do not.
    fn ring_in_order(&self) -> Option<Option<u32>> {
        let mut prev: Option<Span> = None;
        for s in &self.spans {
            let s = (*s)?;
            if prev.is_some_and(|p| p.ring != s.ring || p.last > s.first) {
                return None;
            }
            prev = Some(s);
        }
        Some(prev.map(|p| p.ring))
    }

    /// The request counts `from..=to` a sample at `at` may reflect: the
    /// requests wholly below `before` are reflected, those wholly at or
    /// above `after` are not. None when the requests' events do not all sit
    /// in that ring in ring order (`ring`: [`Self::ring_in_order`]).
    fn place(&self, at: &RingSpan, ring: Option<Option<u32>>) -> Option<(usize, usize)> {
        let ring = ring?;
        if ring.is_some_and(|r| r != u32::from(at.ring)) || at.before > at.after {
            return None;
        }
        let spans = &self.spans;
        let from = spans.partition_point(|s| s.is_some_and(|s| s.last < at.before));
        let to = spans.partition_point(|s| s.is_some_and(|s| s.first < at.after));
        Some((from, to.max(from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{replay, SimAllocator, SimConfig};

    /// Events from the simulator itself, turned back into requests and
    /// replayed, give the same figures after every request.
    /// `empty_cache()` right before an allocation leaves the same events
    /// as the allocator's own retry (segments released, then the ALLOC):
    /// the replay tells them apart, with the device near full (retries)
    /// and far from it (the job's `empty_cache`). Where both explain the
    /// events (the cache was what kept the request from fitting), the
    /// replay takes the retry: the state after it is the same, and only
    /// the retry count can be one more than the job's.
    #[test]
    fn an_empty_cache_before_an_allocation_is_not_taken_for_a_retry() {
        for capacity in [4u64 << 30, 1 << 30] {
            let cfg = SimConfig {
                capacity,
                ..SimConfig::default()
            };
            let mut a = SimAllocator::new(cfg.clone());
            let mut ev: Vec<Event> = Vec::new();
            let mut held = Vec::new();
            let mut truth = Vec::new();
            for i in 0..400u64 {
                let size = (i * 7919 % 60 + 1) << 20;
                if i % 3 == 2 && !held.is_empty() {
                    let p: u64 = held.remove((i as usize * 13) % held.len());
                    a.free(p, &mut ev).unwrap();
                } else {
                    if i % 10 == 0 {
                        a.empty_cache(&mut ev);
                    }
                    if let Ok(p) = a.malloc(size, 0, &mut ev) {
                        held.push(p);
                    }
                }
                if i % 7 == 6 {
                    a.emit_stats(&mut ev);
                    truth.push(a.stats());
                }
            }
            let got = recover(ev.into_iter().map(|e| (e, None)).collect(), 0);
            let reports = replay(&got.requests, &cfg);
            let mut compared = 0;
            for (r, rec) in reports.iter().zip(&got.recorded) {
                if let Some(s) = rec {
                    assert_eq!(
                        (r.allocated, r.reserved, r.segments, r.ooms),
                        (s.allocated, s.reserved, s.segments, s.ooms),
                        "capacity {capacity}, step {}",
                        r.step
                    );
                    assert!(r.alloc_retries >= s.alloc_retries, "step {}", r.step);
                    compared += 1;
                }
            }
            assert!(compared >= 50, "{compared}");
            let released = got
                .requests
                .iter()
                .filter(|r| {
                    matches!(
                        r,
                        Request::Alloc {
                            released_before: true,
                            ..
                        }
                    )
                })
                .count();
            assert!(
                released > 0,
                "capacity {capacity}: no release before an allocation"
            );
        }
    }

    #[test]
    fn round_trip_through_the_simulator() {
        let cfg = SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        };
        let mut a = SimAllocator::new(cfg.clone());
        let mut ev: Vec<Event> = Vec::new();
        let mut held = Vec::new();
        let mut truth = Vec::new();
        for i in 0..300u64 {
            let size = (i * 7919 % 40 + 1) << 20;
            if i % 3 == 2 {
                let p: u64 = held.remove((i as usize * 13) % held.len());
                a.free(p, &mut ev).unwrap();
            } else if let Ok(p) = a.malloc(size, i % 2, &mut ev) {
                held.push(p);
            }
            if i % 50 == 49 {
                a.empty_cache(&mut ev);
            }
            a.emit_stats(&mut ev);
            truth.push(a.stats());
        }
        let got = recover(ev.into_iter().map(|e| (e, None)).collect(), 0);
        assert_eq!(got.unknown_frees, 0);
        let reports = replay(&got.requests, &cfg);
        let mut compared = 0;
        for (r, rec) in reports.iter().zip(&got.recorded) {
            if let Some(s) = rec {
                assert_eq!(
                    (r.allocated, r.reserved, r.segments),
                    (s.allocated, s.reserved, s.segments),
                    "step {}",
                    r.step
                );
                compared += 1;
            }
        }
        assert!(compared >= 250, "{compared}");
        assert!(got.requests.contains(&Request::EmptyCache));
    }

    /// A sample that carries positions reflects exactly the requests whose
    /// events sit below `before`, wherever its time puts it; a window
    /// leaves a range; one inside a burst of releases leaves the burst's
    /// request open; one whose ring the events do not sit in falls back to
    /// time.
    #[test]
    fn samples_with_positions_are_placed_by_them_not_by_time() {
        use vramscope_wire::event::Place;
        let place = Place::default();
        let dev = |pos: u64, t: u64, kind: EventKind| {
            (
                Event { time_ns: t, kind },
                Some(RingPos {
                    ring: 1,
                    position: pos,
                }),
            )
        };
        let alloc = |addr: u64| EventKind::Alloc {
            place,
            addr,
            size: 1 << 20,
        };
        let release = |addr: u64| EventKind::SegmentFree {
            place,
            addr,
            size: 20 << 20,
        };
        let sample = |n: u64| EventKind::Stats {
            device: 0,
            stats: Stats {
                allocated: n,
                ..Stats::default()
            },
        };
        let at = |ring: u8, before: u64, after: u64| EventKind::StatsPosition {
            device: 0,
            at: RingSpan {
                ring,
                before,
                after,
                exact: before == after,
                ambiguous: before != after,
            },
        };
        let agent = |pos: u64, t: u64, kind: EventKind| {
            (
                Event { time_ns: t, kind },
                Some(RingPos {
                    ring: 0,
                    position: pos,
                }),
            )
        };
        // Ring 1: three allocs (0, 1, 2), then an empty_cache releasing two
        // segments (3, 4). Ring 0: samples written late (time 100 and on).
        let events = vec![
            dev(0, 10, alloc(0xa)),
            dev(1, 20, alloc(0xb)),
            dev(2, 30, alloc(0xc)),
            dev(3, 40, release(0x1)),
            dev(4, 41, release(0x2)),
            agent(1, 100, sample(1)),
            agent(2, 100, at(1, 2, 2)), // after the second alloc
            agent(4, 101, sample(2)),
            agent(5, 101, at(1, 1, 3)), // a window over the second and third
            agent(7, 102, sample(3)),
            agent(8, 102, at(1, 4, 4)), // between the two releases
            agent(10, 103, sample(4)),
            agent(11, 103, at(7, 2, 2)), // a ring the events are not in
            agent(13, 104, sample(5)),   // no position
        ];
        let got = recover(events, 0);
        assert_eq!(got.requests.len(), 4);
        assert_eq!(got.requests[3], Request::EmptyCache);
        let placed: Vec<_> = got
            .placed
            .iter()
            .map(|p| (p.stats.allocated, p.from, p.to))
            .collect();
        assert_eq!(placed, vec![(1, 2, 2), (2, 1, 3), (3, 3, 4)]);
        assert_eq!(got.unplaceable, 1);
        // By time, the last sample wins the last request.
        assert_eq!(got.recorded[3].map(|s| s.allocated), Some(5));
        assert_eq!(got.recorded.iter().flatten().count(), 1);
    }

    #[test]
    fn the_memory_limit_is_the_last_stated_for_the_device() {
        use vramscope_wire::event::MarkSource;
        let limit = |device, value, whole_device| Mark {
            at: 0,
            source: MarkSource::MemoryLimit {
                device,
                whole_device,
            },
            value,
            time_ns: 0,
        };
        let step = Mark {
            at: 0,
            source: MarkSource::User,
            value: 3,
            time_ns: 0,
        };
        let got = Recovered {
            marks: vec![
                limit(0, 80, true),
                limit(0, 40, false),
                limit(1, 20, false),
                step,
            ],
            ..Recovered::default()
        };
        assert_eq!(got.memory_limit(0), Some((40, false)));
        assert_eq!(got.memory_limit(1), Some((20, false)));
        assert_eq!(got.memory_limit(2), None);
    }
}
