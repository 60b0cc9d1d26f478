//! The process's recent events, one compact log for every use: the
//! dashboard's scrollable, searchable event history, the events kept with
//! each OOM record, and the events that place a snapshot by its ring
//! position (`device::placed`).
//!
//! A record is 40 bytes: time, two values, the ring position, the context
//! tag, an index into the process's table of places (device, stream, pool)
//! and the kind. What is kept decodes back to the very event that came in.
//! The log holds the newest [`EventLog::capacity`] events; the table of
//! places holds at most [`Bounds::places`](crate::model::Bounds::places)
//! entries (a real job has a handful), and an event of a place beyond it is
//! not kept (counted, see [`EventLog::dropped`]).

use std::collections::HashMap;

use vramscope_wire::event::{CtxTag, Event, EventKind, MarkSource, Place, PoolId};

/// Where an event happened, less its context tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlaceKey {
    device: u16,
    stream: u64,
    pool: PoolId,
}

impl PlaceKey {
    fn of(p: &Place) -> Self {
        Self {
            device: p.device,
            stream: p.stream,
            pool: p.pool,
        }
    }
    fn place(self, ctx: CtxTag) -> Place {
        Place {
            device: self.device,
            stream: self.stream,
            pool: self.pool,
            ctx,
        }
    }
}

// The kinds a record holds (the events the history shows).
const ALLOC: u8 = 1;
const FREE_REQUESTED: u8 = 2;
const FREE_COMPLETED: u8 = 3;
const SEGMENT_ALLOC: u8 = 4;
const SEGMENT_FREE: u8 = 5;
const SEGMENT_MAP: u8 = 6;
const SEGMENT_UNMAP: u8 = 7;
const OOM: u8 = 9;
const MARKER: u8 = 48;

/// Set when the record places snapshots of its device (`pos` is its
/// position in the device's ring).
const POSITIONED: u8 = 1;

/// One event, compact. `a` and `b` are the address and size of an
/// allocator event, the free bytes and request of an OOM, the value and
/// source of a marker.
#[derive(Debug, Clone, Copy)]
struct Rec {
    t: u64,
    a: u64,
    b: u64,
    pos: u64,
    ctx: u32,
    place: u16,
    kind: u8,
    flags: u8,
}

/// A positioned event of the log (see [`EventLog::positioned`]).
#[derive(Debug, Clone)]
pub(crate) struct Positioned {
    pub(crate) t: u64,
    pub(crate) pos: u64,
    pub(crate) kind: EventKind,
}

/// A positioned event let go of for the log's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LetGo {
    pub(crate) seq: u64,
    pub(crate) device: u16,
    pub(crate) pos: u64,
}

/// The log (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) struct EventLog {
    /// The records, a ring once full: the oldest at `oldest`.
    recs: Vec<Rec>,
    oldest: usize,
    capacity: usize,
    places: Vec<PlaceKey>,
    index: HashMap<PlaceKey, u16>,
    max_places: usize,
    /// The place of the last event kept (most events share it).
    last: Option<(PlaceKey, u16)>,
    /// The number the next event pushed gets.
    next_seq: u64,
    dropped: u64,
}

fn source_code(s: MarkSource) -> u64 {
    match s {
        MarkSource::Unknown => 0,
        MarkSource::User => 1,
        MarkSource::OptimizerStep { optimizer } => 2 | u64::from(optimizer) << 8,
        MarkSource::Inferred => 3,
        MarkSource::Run => 4,
        MarkSource::Other(x) => 5 | u64::from(x) << 8,
        MarkSource::MemoryLimit {
            device,
            whole_device,
        } => 6 | u64::from(device) << 8 | u64::from(whole_device) << 24,
    }
}

fn source_of(code: u64) -> MarkSource {
    let arg = code >> 8;
    match code & 0xff {
        1 => MarkSource::User,
        2 => MarkSource::OptimizerStep {
            optimizer: arg as u32,
        },
        3 => MarkSource::Inferred,
        4 => MarkSource::Run,
        5 => MarkSource::Other(arg as u8),
        6 => MarkSource::MemoryLimit {
            device: arg as u16,
            whole_device: arg >> 16 & 1 == 1,
        },
        _ => MarkSource::Unknown,
    }
}

impl EventLog {
    /// A log of the newest `capacity` events (at least one) and at most
    /// `max_places` places. Its memory grows as events arrive.
    pub(crate) fn new(capacity: usize, max_places: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            recs: Vec::with_capacity(capacity.min(256)),
            oldest: 0,
            capacity,
            places: Vec::new(),
            index: HashMap::new(),
            max_places: max_places.clamp(1, usize::from(u16::MAX)),
            last: None,
            next_seq: 0,
            dropped: 0,
        }
    }

    /// Events not kept because their place was beyond the table's bound.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The number the next event pushed gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The index of place `p` in the table, added if there is room.
    fn place_index(&mut self, p: &Place) -> Option<u16> {
        let key = PlaceKey::of(p);
        if let Some((k, i)) = self.last {
            if k == key {
                return Some(i);
            }
        }
        let i = match self.index.get(&key) {
            Some(&i) => i,
            None if self.places.len() < self.max_places => {
                let i = self.places.len() as u16;
                self.places.push(key);
                self.index.insert(key, i);
                i
            }
            None => return None,
        };
        self.last = Some((key, i));
        Some(i)
    }

    /// Keep the event `kind` at `t`; `pos` when it places snapshots of its
    /// device (its position in the device's ring). Events the history does
    /// not show are not kept. Returns the positioned event let go of to make
    /// room, if any, and whether this one was kept.
    pub(crate) fn push(
        &mut self,
        t: u64,
        kind: &EventKind,
        pos: Option<u64>,
    ) -> (Option<LetGo>, bool) {
        let (code, place, a, b) = match *kind {
            EventKind::Alloc { place, addr, size } => (ALLOC, Some(place), addr, size),
            EventKind::FreeRequested { place, addr, size } => {
                (FREE_REQUESTED, Some(place), addr, size)
            }
            EventKind::FreeCompleted { place, addr, size } => {
                (FREE_COMPLETED, Some(place), addr, size)
            }
            EventKind::SegmentAlloc { place, addr, size } => {
                (SEGMENT_ALLOC, Some(place), addr, size)
            }
            EventKind::SegmentFree { place, addr, size } => (SEGMENT_FREE, Some(place), addr, size),
            EventKind::SegmentMap { place, addr, size } => (SEGMENT_MAP, Some(place), addr, size),
            EventKind::SegmentUnmap { place, addr, size } => {
                (SEGMENT_UNMAP, Some(place), addr, size)
            }
            EventKind::Oom {
                place,
                device_free,
                request,
            } => (OOM, Some(place), device_free, request),
            EventKind::Marker { value, source } => (MARKER, None, value, source_code(source)),
            _ => return (None, false),
        };
        let (index, ctx) = match place {
            Some(p) => match self.place_index(&p) {
                Some(i) => (i, p.ctx.aux()),
                None => {
                    self.dropped = self.dropped.saturating_add(1);
                    return (None, false);
                }
            },
            None => (0, 0),
        };
        let rec = Rec {
            t,
            a,
            b,
            pos: pos.unwrap_or(0),
            ctx,
            place: index,
            kind: code,
            flags: if pos.is_some() { POSITIONED } else { 0 },
        };
        let mut let_go = None;
        if self.recs.len() < self.capacity {
            if self.recs.len() == self.recs.capacity() {
                // Doubling, but never past the capacity.
                let more = self
                    .recs
                    .len()
                    .max(256)
                    .min(self.capacity - self.recs.len());
                self.recs.reserve_exact(more);
            }
            self.recs.push(rec);
        } else {
            let oldest = self.next_seq - self.recs.len() as u64;
            let old = std::mem::replace(&mut self.recs[self.oldest], rec);
            self.oldest += 1;
            if self.oldest == self.recs.len() {
                self.oldest = 0;
            }
            if old.flags & POSITIONED != 0 {
                let_go = Some(LetGo {
                    seq: oldest,
                    device: self.places[usize::from(old.place)].device,
                    pos: old.pos,
                });
            }
        }
        self.next_seq += 1;
        (let_go, true)
    }

    fn kind(&self, r: &Rec) -> EventKind {
        let place = || self.places[usize::from(r.place)].place(CtxTag::from_aux(r.ctx));
        let (addr, size) = (r.a, r.b);
        match r.kind {
            ALLOC => EventKind::Alloc {
                place: place(),
                addr,
                size,
            },
            FREE_REQUESTED => EventKind::FreeRequested {
                place: place(),
                addr,
                size,
            },
            FREE_COMPLETED => EventKind::FreeCompleted {
                place: place(),
                addr,
                size,
            },
            SEGMENT_ALLOC => EventKind::SegmentAlloc {
                place: place(),
                addr,
                size,
            },
            SEGMENT_FREE => EventKind::SegmentFree {
                place: place(),
                addr,
                size,
            },
            SEGMENT_MAP => EventKind::SegmentMap {
                place: place(),
                addr,
                size,
            },
            SEGMENT_UNMAP => EventKind::SegmentUnmap {
                place: place(),
                addr,
                size,
            },
            OOM => EventKind::Oom {
                place: place(),
                device_free: r.a,
                request: r.b,
            },
            _ => EventKind::Marker {
                value: r.a,
                source: source_of(r.b),
            },
        }
    }

    /// The records kept, oldest first.
    fn iter(&self) -> impl Iterator<Item = &Rec> {
        let (newer, older) = self.recs.split_at(self.oldest);
        older.iter().chain(newer)
    }

    /// Events kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.recs.len()
    }

    /// The newest `n` events kept, oldest first.
    pub(crate) fn newest(&self, n: usize) -> Vec<Event> {
        let skip = self.recs.len().saturating_sub(n);
        (self.iter().skip(skip))
            .map(|r| Event {
                time_ns: r.t,
                kind: self.kind(r),
            })
            .collect()
    }

    /// The positioned events of `device` numbered `from_seq` or later and
    /// placed at `from_pos` or later, in the order they were kept.
    pub(crate) fn positioned(&self, device: u16, from_seq: u64, from_pos: u64) -> Vec<Positioned> {
        let first = self.next_seq - self.recs.len() as u64;
        let skip = from_seq.saturating_sub(first).min(self.recs.len() as u64) as usize;
        (self.iter().skip(skip))
            .filter(|r| {
                r.flags & POSITIONED != 0
                    && r.pos >= from_pos
                    && self.places[usize::from(r.place)].device == device
            })
            .map(|r| Positioned {
                t: r.t,
                pos: r.pos,
                kind: self.kind(r),
            })
            .collect()
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.recs.capacity() * std::mem::size_of::<Rec>()
            + self.places.capacity() * std::mem::size_of::<PlaceKey>()
            // A hash map entry: the key, the index and about a control byte.
            + self.index.capacity() * (std::mem::size_of::<PlaceKey>() + 8)
    }

    /// The bytes one record takes.
    #[cfg(test)]
    pub(crate) const RECORD_BYTES: usize = std::mem::size_of::<Rec>();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(device: u16, stream: u64, context: u32) -> Place {
        Place {
            device,
            stream,
            pool: PoolId(stream, 7),
            ctx: CtxTag {
                context,
                step_tag: 3,
            },
        }
    }

    #[test]
    fn a_record_is_40_bytes_and_decodes_to_the_event_that_came_in() {
        assert_eq!(EventLog::RECORD_BYTES, 40);
        let p = place(2, 0xdead_beef_0000, CtxTag::MAX_CONTEXT);
        let kinds = [
            EventKind::Alloc {
                place: p,
                addr: 1 << 40,
                size: 512,
            },
            EventKind::FreeRequested {
                place: p,
                addr: 1,
                size: u64::MAX,
            },
            EventKind::FreeCompleted {
                place: p,
                addr: 2,
                size: 3,
            },
            EventKind::SegmentAlloc {
                place: p,
                addr: 4,
                size: 5,
            },
            EventKind::SegmentFree {
                place: p,
                addr: 6,
                size: 7,
            },
            EventKind::SegmentMap {
                place: p,
                addr: 8,
                size: 9,
            },
            EventKind::SegmentUnmap {
                place: p,
                addr: 10,
                size: 11,
            },
            EventKind::Oom {
                place: p,
                device_free: 12,
                request: 13,
            },
            EventKind::Marker {
                value: 14,
                source: MarkSource::OptimizerStep {
                    optimizer: u32::MAX,
                },
            },
            EventKind::Marker {
                value: 15,
                source: MarkSource::Other(200),
            },
            EventKind::Marker {
                value: 16,
                source: MarkSource::Run,
            },
            EventKind::Marker {
                value: 17,
                source: MarkSource::User,
            },
            EventKind::Marker {
                value: 18,
                source: MarkSource::Inferred,
            },
            EventKind::Marker {
                value: 19,
                source: MarkSource::Unknown,
            },
        ];
        let mut log = EventLog::new(64, 16);
        for (i, k) in kinds.iter().enumerate() {
            assert_eq!(log.push(i as u64, k, None), (None, true));
        }
        let back: Vec<EventKind> = log.newest(usize::MAX).into_iter().map(|e| e.kind).collect();
        assert_eq!(back, kinds);
        // Kinds the history does not show are not kept.
        let stats = EventKind::Stats {
            device: 0,
            stats: Default::default(),
        };
        assert_eq!(log.push(99, &stats, None), (None, false));
        assert_eq!(log.len(), kinds.len());
    }

    #[test]
    fn keeps_the_newest_and_says_which_positioned_event_it_let_go_of() {
        let mut log = EventLog::new(4, 16);
        let k = |d: u16| EventKind::Alloc {
            place: place(d, 0, 0),
            addr: 0,
            size: 1,
        };
        assert_eq!(log.push(0, &k(0), Some(100)), (None, true));
        assert_eq!(log.push(1, &k(1), None), (None, true));
        assert_eq!(log.push(2, &k(1), Some(5)), (None, true));
        assert_eq!(log.push(3, &k(0), Some(101)), (None, true));
        // Full: the oldest (device 0 at 100) goes.
        let (gone, kept) = log.push(4, &k(0), Some(102));
        assert!(kept);
        assert_eq!(
            gone,
            Some(LetGo {
                seq: 0,
                device: 0,
                pos: 100
            })
        );
        // Not positioned: nothing to say.
        assert_eq!(log.push(5, &k(0), None).0, None);
        let d0: Vec<(u64, u64)> = log
            .positioned(0, 0, 0)
            .iter()
            .map(|p| (p.t, p.pos))
            .collect();
        assert_eq!(d0, [(3, 101), (4, 102)]);
        assert_eq!(log.positioned(0, 4, 0).len(), 1);
        assert_eq!(log.positioned(0, 0, 102).len(), 1);
        assert_eq!(log.positioned(1, 0, 0).len(), 1);
        assert_eq!(
            log.newest(2).iter().map(|e| e.time_ns).collect::<Vec<_>>(),
            [4, 5]
        );
    }

    /// Many laps of a log whose capacity is no power of two, against a
    /// plain double-ended queue of what it should hold: the newest events
    /// in order, the positioned ones by sequence number, each let-go in
    /// turn, and no room allocated past the capacity.
    #[test]
    fn a_full_log_turns_like_a_queue_and_never_grows_past_its_capacity() {
        use std::collections::VecDeque;
        for cap in [1usize, 3, 257, 1000] {
            let mut log = EventLog::new(cap, 16);
            let mut want: VecDeque<(u64, u16, Option<u64>)> = VecDeque::new();
            for t in 0..(cap as u64 * 3 + 7) {
                let d = (t % 3) as u16;
                let pos = (t % 2 == 0).then_some(t * 10);
                let k = EventKind::Alloc {
                    place: place(d, 0, 0),
                    addr: t,
                    size: 1,
                };
                let (gone, kept) = log.push(t, &k, pos);
                assert!(kept);
                want.push_back((t, d, pos));
                let expect = if want.len() > cap {
                    let (old_t, old_d, old_pos) = want.pop_front().unwrap();
                    old_pos.map(|p| LetGo {
                        seq: old_t,
                        device: old_d,
                        pos: p,
                    })
                } else {
                    None
                };
                assert_eq!(gone, expect, "cap {cap} at {t}");
            }
            assert_eq!(log.len(), cap);
            assert!(log.memory_bytes() < cap * EventLog::RECORD_BYTES + 1024);
            let newest: Vec<u64> = log.newest(cap + 5).iter().map(|e| e.time_ns).collect();
            assert_eq!(newest, want.iter().map(|w| w.0).collect::<Vec<_>>());
            let last2: Vec<u64> = log.newest(2).iter().map(|e| e.time_ns).collect();
            assert_eq!(last2, newest[newest.len().saturating_sub(2)..]);
            let from_seq = want[want.len() / 2].0;
            let placed: Vec<(u64, u64)> = (log.positioned(1, from_seq, 0).iter())
                .map(|p| (p.t, p.pos))
                .collect();
            let expect: Vec<(u64, u64)> = (want.iter())
                .filter(|w| w.0 >= from_seq && w.1 == 1)
                .filter_map(|w| w.2.map(|p| (w.0, p)))
                .collect();
            assert_eq!(placed, expect, "cap {cap}");
        }
    }

    #[test]
    fn places_beyond_the_bound_are_counted_not_kept() {
        let mut log = EventLog::new(16, 2);
        for stream in 0..5 {
            let k = EventKind::Alloc {
                place: place(0, stream, 0),
                addr: 0,
                size: 1,
            };
            log.push(stream, &k, None);
        }
        assert_eq!(log.len(), 2);
        assert_eq!(log.dropped(), 3);
        // A marker has no place: always kept.
        log.push(
            9,
            &EventKind::Marker {
                value: 1,
                source: MarkSource::User,
            },
            None,
        );
        assert_eq!(log.len(), 3);
    }
}
