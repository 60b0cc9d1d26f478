//! Behaviour tests of the model: event lists against known allocator states.
//!
//! `RefAlloc` is a deliberately naive reference allocator (vectors, linear
//! scans) that follows PyTorch's rules and emits the events PyTorch's trace
//! tracker would, so the model can be checked against an independent truth.

mod attrib;
mod blocks;
mod figures;
mod leak_loop;
mod placed;
mod prop;
mod resync;

use super::{DeviceState, Model, ModelConfig, ProcessKey};
use vramscope_wire::event::{BlockState, Event, EventKind, Place, PoolId, SegmentPool, Stats};

pub(super) const KEY: ProcessKey = ProcessKey {
    pid: 42,
    start_time: 7,
};
pub(super) const MIB: u64 = 1 << 20;
pub(super) const BASE: u64 = 0x7f00_0000_0000;

pub(super) fn place(device: u16, stream: u64) -> Place {
    Place {
        device,
        stream,
        pool: PoolId(0, 0),
        ctx: Default::default(),
    }
}

/// Builds timestamped events for one place.
pub(super) struct Ev {
    pub(crate) t: u64,
    pub(crate) place: Place,
}

impl Ev {
    pub(crate) fn new() -> Self {
        Self {
            t: 1_000,
            place: place(0, 0),
        }
    }
    pub(crate) fn at(&mut self, kind: EventKind) -> Event {
        self.t += 1_000;
        Event {
            time_ns: self.t,
            kind,
        }
    }
    /// A statistics sample of this place's device.
    pub(crate) fn stats(&mut self, stats: Stats) -> Event {
        let device = self.place.device;
        self.at(EventKind::Stats { device, stats })
    }
}

/// `Ev` methods for the allocator events `Kind { place, addr, size }`.
macro_rules! placed_events {
    ($($method:ident => $kind:ident),* $(,)?) => {
        impl Ev {
            $(
                pub(crate) fn $method(&mut self, addr: u64, size: u64) -> Event {
                    let place = self.place;
                    self.at(EventKind::$kind { place, addr, size })
                }
            )*
        }
    };
}

placed_events! {
    alloc => Alloc,
    free_req => FreeRequested,
    free_done => FreeCompleted,
    seg_alloc => SegmentAlloc,
    seg_free => SegmentFree,
    map => SegmentMap,
    unmap => SegmentUnmap,
}

/// (addr, size, state, requested) of every block of a device, address order.
pub(super) type BlockRow = (u64, u64, BlockState, u64);

pub(super) fn rows(d: &DeviceState) -> Vec<BlockRow> {
    d.blocks()
        .map(|(a, b)| (a, b.size, b.state, b.requested))
        .collect()
}

pub(super) fn dev(m: &Model) -> &DeviceState {
    m.process(KEY).and_then(|p| p.device(0)).expect("device 0")
}

pub(super) fn model() -> Model {
    Model::new(ModelConfig::default())
}

/// Feed events and check the invariants after each.
pub(super) fn feed(m: &mut Model, events: &[Event]) {
    for ev in events {
        m.apply(KEY, ev);
        for d in m.process(KEY).unwrap().devices() {
            if let Err(e) = d.check_invariants() {
                panic!("after {ev:?}: {e}");
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct RefBlock {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) state: BlockState,
    pub(crate) requested: u64,
}

#[derive(Debug, Clone)]
pub(super) struct RefSeg {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) small: bool,
    pub(crate) stream: u64,
    pub(crate) blocks: Vec<RefBlock>,
}

/// A naive PyTorch-like caching allocator that records the tracker's events.
pub(super) struct RefAlloc {
    pub(crate) segs: Vec<RefSeg>,
    next: u64,
    pub(crate) ev: Ev,
    pub(crate) out: Vec<Event>,
    pub(crate) max_split: u64,
}

impl RefAlloc {
    pub(crate) fn new() -> Self {
        Self {
            segs: Vec::new(),
            next: BASE,
            ev: Ev::new(),
            out: Vec::new(),
            max_split: u64::MAX,
        }
    }

    pub(crate) fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.out)
    }

    fn round(req: u64) -> u64 {
        if req <= 512 {
            512
        } else {
            req.div_ceil(512) * 512
        }
    }

    /// Serve a request on the current stream; returns the block address.
    pub(crate) fn alloc(&mut self, req: u64) -> u64 {
        let rounded = Self::round(req);
        let small = rounded <= MIB;
        let stream = self.ev.place.stream;
        // Best fit: smallest inactive block that fits, lowest address on ties.
        let mut best: Option<(usize, usize)> = None;
        for (si, s) in self.segs.iter().enumerate() {
            if s.small != small || s.stream != stream {
                continue;
            }
            for (bi, b) in s.blocks.iter().enumerate() {
                if b.state == BlockState::Inactive && b.size >= rounded {
                    let better = match best {
                        None => true,
                        Some((bs, bb)) => {
                            let o = &self.segs[bs].blocks[bb];
                            (b.size, b.addr) < (o.size, o.addr)
                        }
                    };
                    if better {
                        best = Some((si, bi));
                    }
                }
            }
        }
        let (si, bi) = match best {
            Some(x) => x,
            None => {
                let size = if small {
                    2 * MIB
                } else if rounded < 10 * MIB {
                    20 * MIB
                } else {
                    rounded.div_ceil(2 * MIB) * 2 * MIB
                };
                let addr = self.next;
                // Leave a gap between segments half of the time so that
                // adjacency of segments is exercised too.
                self.next += size + if (addr >> 21) % 2 == 0 { 0 } else { 2 * MIB };
                let e = self.ev.seg_alloc(addr, size);
                self.out.push(e);
                self.segs.push(RefSeg {
                    addr,
                    size,
                    small,
                    stream,
                    blocks: vec![RefBlock {
                        addr,
                        size,
                        state: BlockState::Inactive,
                        requested: 0,
                    }],
                });
                (self.segs.len() - 1, 0)
            }
        };
        let seg = &mut self.segs[si];
        let free = seg.blocks[bi].size;
        let remaining = free - rounded;
        let split = if small {
            remaining >= 512
        } else {
            rounded < self.max_split && remaining > MIB
        };
        let addr = seg.blocks[bi].addr;
        let size = if split { rounded } else { free };
        seg.blocks[bi] = RefBlock {
            addr,
            size,
            state: BlockState::Allocated,
            requested: req,
        };
        if split {
            seg.blocks.insert(
                bi + 1,
                RefBlock {
                    addr: addr + size,
                    size: free - size,
                    state: BlockState::Inactive,
                    requested: 0,
                },
            );
        }
        let e = self.ev.alloc(addr, req);
        self.out.push(e);
        addr
    }

    fn find(&mut self, addr: u64) -> (usize, usize) {
        for (si, s) in self.segs.iter().enumerate() {
            if let Some(bi) = s.blocks.iter().position(|b| b.addr == addr) {
                return (si, bi);
            }
        }
        panic!("no block at {addr:#x}");
    }

    /// The tensor at `addr` is released (pending until `complete`).
    pub(crate) fn free_request(&mut self, addr: u64) {
        let (si, bi) = self.find(addr);
        let b = &mut self.segs[si].blocks[bi];
        assert_eq!(b.state, BlockState::Allocated);
        b.state = BlockState::PendingFree;
        let req = b.requested;
        let e = self.ev.free_req(addr, req);
        self.out.push(e);
    }

    pub(crate) fn complete(&mut self, addr: u64) {
        let (si, bi) = self.find(addr);
        let req = self.segs[si].blocks[bi].requested;
        assert_eq!(self.segs[si].blocks[bi].state, BlockState::PendingFree);
        let e = self.ev.free_done(addr, req);
        self.out.push(e);
        let blocks = &mut self.segs[si].blocks;
        blocks[bi].state = BlockState::Inactive;
        blocks[bi].requested = 0;
        let mut bi = bi;
        if bi + 1 < blocks.len() && blocks[bi + 1].state == BlockState::Inactive {
            blocks[bi].size += blocks[bi + 1].size;
            blocks.remove(bi + 1);
        }
        if bi > 0 && blocks[bi - 1].state == BlockState::Inactive {
            blocks[bi - 1].size += blocks[bi].size;
            blocks.remove(bi);
            bi -= 1;
        }
        let _ = bi;
    }

    /// Free immediately (no stream uses).
    pub(crate) fn free(&mut self, addr: u64) {
        self.free_request(addr);
        self.complete(addr);
    }

    /// Release every fully free segment.
    pub(crate) fn empty_cache(&mut self) {
        let mut keep = Vec::new();
        for s in std::mem::take(&mut self.segs) {
            if s.blocks.len() == 1 && s.blocks[0].state == BlockState::Inactive {
                let e = self.ev.seg_free(s.addr, s.size);
                self.out.push(e);
            } else {
                keep.push(s);
            }
        }
        self.segs = keep;
    }

    pub(crate) fn allocated(&self) -> u64 {
        self.blocks()
            .filter(|b| b.state == BlockState::Allocated)
            .map(|b| b.size)
            .sum()
    }
    pub(crate) fn active(&self) -> u64 {
        self.blocks()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.size)
            .sum()
    }
    pub(crate) fn reserved(&self) -> u64 {
        self.segs.iter().map(|s| s.size).sum()
    }
    pub(crate) fn blocks(&self) -> impl Iterator<Item = &RefBlock> {
        self.segs.iter().flat_map(|s| s.blocks.iter())
    }
    pub(crate) fn rows(&self) -> Vec<BlockRow> {
        let mut v: Vec<BlockRow> = self
            .blocks()
            .map(|b| (b.addr, b.size, b.state, b.requested))
            .collect();
        v.sort_by_key(|r| r.0);
        v
    }

    /// The snapshot the agent would send for this state.
    pub(crate) fn snapshot(&mut self, id: u32) -> Vec<Event> {
        let nblocks = self.blocks().count() as u64;
        let mut out = Vec::new();
        let mut segs = self.segs.clone();
        segs.sort_by_key(|s| s.addr);
        out.push(self.ev.at(EventKind::SnapshotBegin {
            device: 0,
            id,
            segments: segs.len() as u64,
            blocks: nblocks,
            at: None,
        }));
        for s in &segs {
            let place = Place {
                device: 0,
                stream: s.stream,
                pool: PoolId(0, 0),
                ctx: Default::default(),
            };
            let pool_kind = if s.small {
                SegmentPool::Small
            } else {
                SegmentPool::Large
            };
            out.push(self.ev.at(EventKind::SnapshotSegment {
                id,
                place,
                addr: s.addr,
                size: s.size,
                pool_kind,
                expandable: false,
            }));
            for b in &s.blocks {
                out.push(self.ev.at(EventKind::SnapshotBlock {
                    id,
                    device: 0,
                    addr: b.addr,
                    size: b.size,
                    requested: b.requested,
                    state: b.state,
                    ctx: Default::default(),
                }));
            }
        }
        out.push(self.ev.at(EventKind::SnapshotEnd { device: 0, id }));
        out
    }
}

/// A model seeded by an (empty) snapshot so that it starts synced.
pub(super) fn synced_model() -> Model {
    let mut m = model();
    let mut r = RefAlloc::new();
    let snap = r.snapshot(1);
    feed(&mut m, &snap);
    assert!(!m.needs_resync(KEY));
    m
}
