//! Records: how an [`Event`] is packed into a slot's seven payload words and
//! unpacked again (`FORMAT.md`, "Records"). Pure code.

use crate::event::{BlockState, Event, EventKind, Place, PoolId, SegmentPool, Stats};

use super::layout::PAYLOAD_WORDS;

/// The seven payload words of one slot.
pub type Words = [u64; PAYLOAD_WORDS];

pub const K_ALLOC: u16 = 1;
pub const K_FREE_REQUESTED: u16 = 2;
pub const K_FREE_COMPLETED: u16 = 3;
pub const K_SEGMENT_ALLOC: u16 = 4;
pub const K_SEGMENT_FREE: u16 = 5;
pub const K_SEGMENT_MAP: u16 = 6;
pub const K_SEGMENT_UNMAP: u16 = 7;
pub const K_OOM: u16 = 9;
pub const K_STATS_A: u16 = 16;
pub const K_STATS_B: u16 = 17;
pub const K_SNAP_BEGIN: u16 = 32;
pub const K_SNAP_SEGMENT: u16 = 33;
pub const K_SNAP_BLOCK: u16 = 34;
pub const K_SNAP_END: u16 = 35;
pub const K_MARKER: u16 = 48;

pub const NO_DEVICE: u16 = 0xffff;

fn head(kind: u16, device: u16, aux: u32) -> u64 {
    kind as u64 | (device as u64) << 16 | (aux as u64) << 32
}

/// Splits a record header word into `(kind, device, aux)`.
pub fn split_head(w0: u64) -> (u16, u16, u32) {
    (w0 as u16, (w0 >> 16) as u16, (w0 >> 32) as u32)
}

fn placed(kind: u16, time: u64, p: &Place, a: u64, b: u64) -> Words {
    [
        head(kind, p.device, 0),
        time,
        a,
        b,
        p.stream,
        p.pool.0,
        p.pool.1,
    ]
}

/// Packs one event into one or two records (statistics take two).
/// `sample` numbers statistics samples so a reader can pair the halves.
pub fn encode(e: &Event, sample: u32, out: &mut Vec<Words>) {
    let t = e.time_ns;
    match &e.kind {
        EventKind::Alloc { place, addr, size } => out.push(placed(K_ALLOC, t, place, *addr, *size)),
        EventKind::FreeRequested { place, addr, size } => {
            out.push(placed(K_FREE_REQUESTED, t, place, *addr, *size))
        }
        EventKind::FreeCompleted { place, addr, size } => {
            out.push(placed(K_FREE_COMPLETED, t, place, *addr, *size))
        }
        EventKind::SegmentAlloc { place, addr, size } => {
            out.push(placed(K_SEGMENT_ALLOC, t, place, *addr, *size))
        }
        EventKind::SegmentFree { place, addr, size } => {
            out.push(placed(K_SEGMENT_FREE, t, place, *addr, *size))
        }
        EventKind::SegmentMap { place, addr, size } => {
            out.push(placed(K_SEGMENT_MAP, t, place, *addr, *size))
        }
        EventKind::SegmentUnmap { place, addr, size } => {
            out.push(placed(K_SEGMENT_UNMAP, t, place, *addr, *size))
        }
        EventKind::Oom {
            place,
            device_free,
            request,
        } => out.push(placed(K_OOM, t, place, *device_free, *request)),
        EventKind::Stats { device, stats: s } => {
            out.push([
                head(K_STATS_A, *device, sample),
                t,
                s.allocated,
                s.reserved,
                s.active,
                s.inactive_split,
                s.requested,
            ]);
            out.push([
                head(K_STATS_B, *device, sample),
                t,
                s.allocated_peak,
                s.reserved_peak,
                s.active_peak,
                s.alloc_retries,
                (s.ooms & 0xffff_ffff) | (s.segments.min(u32::MAX as u64)) << 32,
            ]);
        }
        EventKind::SnapshotBegin {
            device,
            id,
            segments,
            blocks,
        } => out.push([
            head(K_SNAP_BEGIN, *device, *id),
            t,
            *segments,
            *blocks,
            0,
            0,
            0,
        ]),
        EventKind::SnapshotSegment {
            id,
            place,
            addr,
            size,
            pool_kind,
            expandable,
        } => {
            let flags = (*pool_kind == SegmentPool::Small) as u64 | (*expandable as u64) << 1;
            out.push([
                head(K_SNAP_SEGMENT, place.device, *id),
                t,
                *addr,
                *size,
                place.stream,
                place.pool.0,
                flags | place.pool.1 << 8,
            ])
        }
        EventKind::SnapshotBlock {
            id,
            device,
            addr,
            size,
            requested,
            state,
        } => {
            let st = match state {
                BlockState::Allocated => 0,
                BlockState::PendingFree => 1,
                BlockState::Inactive => 2,
            };
            out.push([
                head(K_SNAP_BLOCK, *device, *id),
                t,
                *addr,
                *size,
                *requested,
                st,
                0,
            ])
        }
        EventKind::SnapshotEnd { device, id } => {
            out.push([head(K_SNAP_END, *device, *id), t, 0, 0, 0, 0, 0])
        }
        EventKind::Marker { value } => {
            out.push([head(K_MARKER, NO_DEVICE, 0), t, *value, 0, 0, 0, 0])
        }
        EventKind::Unknown { kind } => out.push([head(*kind, NO_DEVICE, 0), t, 0, 0, 0, 0, 0]),
    }
}

/// Turns records back into events. Holds the first half of a statistics
/// sample until its second half arrives; a sample missing either half is
/// dropped (and counted), never half-reported.
#[derive(Debug, Default)]
pub struct Decoder {
    pending_stats: Option<(u16, u32, Words)>,
    /// Statistics samples dropped because one half was lost.
    pub dropped_samples: u64,
}

impl Decoder {
    /// Decodes one record. Returns `None` for the first half of a statistics
    /// sample, or for a half that cannot be paired.
    pub fn decode(&mut self, w: &Words) -> Option<Event> {
        let (kind, device, aux) = split_head(w[0]);
        let time_ns = w[1];
        let place = || Place {
            device,
            stream: w[4],
            pool: PoolId(w[5], w[6]),
        };
        let kind = match kind {
            K_ALLOC => EventKind::Alloc {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_FREE_REQUESTED => EventKind::FreeRequested {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_FREE_COMPLETED => EventKind::FreeCompleted {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_SEGMENT_ALLOC => EventKind::SegmentAlloc {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_SEGMENT_FREE => EventKind::SegmentFree {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_SEGMENT_MAP => EventKind::SegmentMap {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_SEGMENT_UNMAP => EventKind::SegmentUnmap {
                place: place(),
                addr: w[2],
                size: w[3],
            },
            K_OOM => EventKind::Oom {
                place: place(),
                device_free: w[2],
                request: w[3],
            },
            K_STATS_A => {
                if self.pending_stats.replace((device, aux, *w)).is_some() {
                    self.dropped_samples += 1;
                }
                return None;
            }
            K_STATS_B => {
                let Some((d, sample, a)) = self.pending_stats.take() else {
                    self.dropped_samples += 1;
                    return None;
                };
                if d != device || sample != aux {
                    // The first half belongs to another sample: both are incomplete.
                    self.dropped_samples += 2;
                    return None;
                }
                EventKind::Stats {
                    device,
                    stats: Stats {
                        allocated: a[2],
                        reserved: a[3],
                        active: a[4],
                        inactive_split: a[5],
                        requested: a[6],
                        allocated_peak: w[2],
                        reserved_peak: w[3],
                        active_peak: w[4],
                        alloc_retries: w[5],
                        ooms: w[6] & 0xffff_ffff,
                        segments: w[6] >> 32,
                    },
                }
            }
            K_SNAP_BEGIN => EventKind::SnapshotBegin {
                device,
                id: aux,
                segments: w[2],
                blocks: w[3],
            },
            K_SNAP_SEGMENT => EventKind::SnapshotSegment {
                id: aux,
                place: Place {
                    device,
                    stream: w[4],
                    pool: PoolId(w[5], w[6] >> 8),
                },
                addr: w[2],
                size: w[3],
                pool_kind: if w[6] & 1 != 0 {
                    SegmentPool::Small
                } else {
                    SegmentPool::Large
                },
                expandable: w[6] & 2 != 0,
            },
            K_SNAP_BLOCK => EventKind::SnapshotBlock {
                id: aux,
                device,
                addr: w[2],
                size: w[3],
                requested: w[4],
                state: match w[5] {
                    0 => BlockState::Allocated,
                    1 => BlockState::PendingFree,
                    _ => BlockState::Inactive,
                },
            },
            K_SNAP_END => EventKind::SnapshotEnd { device, id: aux },
            K_MARKER => EventKind::Marker { value: w[2] },
            other => EventKind::Unknown { kind: other },
        };
        if self.pending_stats.take().is_some() {
            self.dropped_samples += 1;
        }
        Some(Event { time_ns, kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Event> {
        let place = Place {
            device: 3,
            stream: 0xdead_beef,
            pool: PoolId(1, 2),
        };
        let k = vec![
            EventKind::Alloc {
                place,
                addr: 0x7f00_0000_0000,
                size: 4096,
            },
            EventKind::FreeRequested {
                place,
                addr: 1,
                size: 2,
            },
            EventKind::FreeCompleted {
                place,
                addr: 3,
                size: 4,
            },
            EventKind::SegmentAlloc {
                place,
                addr: 5,
                size: 6,
            },
            EventKind::SegmentFree {
                place,
                addr: 7,
                size: 8,
            },
            EventKind::SegmentMap {
                place,
                addr: 9,
                size: 10,
            },
            EventKind::SegmentUnmap {
                place,
                addr: 11,
                size: 12,
            },
            EventKind::Oom {
                place,
                device_free: 13,
                request: 14,
            },
            EventKind::Stats {
                device: 1,
                stats: Stats {
                    allocated: 1,
                    reserved: 2,
                    active: 3,
                    inactive_split: 4,
                    requested: 5,
                    allocated_peak: 6,
                    reserved_peak: 7,
                    active_peak: 8,
                    alloc_retries: 9,
                    ooms: 10,
                    segments: 11,
                },
            },
            EventKind::SnapshotBegin {
                device: 0,
                id: 9,
                segments: 2,
                blocks: 5,
            },
            EventKind::SnapshotSegment {
                id: 9,
                place,
                addr: 100,
                size: 2 << 20,
                pool_kind: SegmentPool::Small,
                expandable: true,
            },
            EventKind::SnapshotBlock {
                id: 9,
                device: 3,
                addr: 100,
                size: 512,
                requested: 500,
                state: BlockState::PendingFree,
            },
            EventKind::SnapshotEnd { device: 0, id: 9 },
            EventKind::Marker { value: 17 },
            EventKind::Unknown { kind: 999 },
        ];
        k.into_iter()
            .enumerate()
            .map(|(i, kind)| Event {
                time_ns: i as u64 * 10,
                kind,
            })
            .collect()
    }

    #[test]
    fn every_kind_round_trips() {
        let mut d = Decoder::default();
        for e in all_kinds() {
            let mut words = Vec::new();
            encode(&e, 7, &mut words);
            let back: Vec<Event> = words.iter().filter_map(|w| d.decode(w)).collect();
            assert_eq!(back, vec![e]);
        }
        assert_eq!(d.dropped_samples, 0);
    }

    #[test]
    fn half_a_stats_sample_is_dropped_not_reported() {
        let stats = all_kinds()
            .into_iter()
            .find(|e| matches!(e.kind, EventKind::Stats { .. }));
        let mut words = Vec::new();
        encode(&stats.unwrap(), 1, &mut words);
        let mut d = Decoder::default();
        // Only the second half arrives.
        assert_eq!(d.decode(&words[1]), None);
        assert_eq!(d.dropped_samples, 1);
        // First half, then an unrelated record: the half is dropped.
        assert_eq!(d.decode(&words[0]), None);
        let marker = [head(K_MARKER, NO_DEVICE, 0), 0, 5, 0, 0, 0, 0];
        assert!(d.decode(&marker).is_some());
        assert_eq!(d.dropped_samples, 2);
        // Halves of two different samples do not pair.
        let mut other = Vec::new();
        encode(&all_kinds()[8], 2, &mut other);
        assert_eq!(d.decode(&words[0]), None);
        assert_eq!(d.decode(&other[1]), None);
        assert_eq!(d.dropped_samples, 4);
    }
}
