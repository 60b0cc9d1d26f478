//! Role lists against any block map (issue 44, item 1): `scripts/fuzz.sh
//! roles 600`. Each input is a little program of allocator events, most
//! of them in bursts (up to 16,384 allocations or role-list tensors at a
//! base and a stride, of any size: blocks with no segment become orphans
//! that overlap, lists land inside, across or above them), contexts,
//! step boundaries and frees. The model takes them; then one view with
//! the block map, which must:
//!
//! - take under two seconds (a view cost the blocks times the entries:
//!   92.7 s for 65,536 of each; `-timeout` catches a hang beyond);
//! - count every allocated block once in the attribution, its bytes
//!   adding up to the blocks' (saturated alike);
//! - give a role to every allocated block of the map and to no other.
#![no_main]
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vramscope_wire::event::{
    BlockState, CtxTag, Event, EventKind, Held, MarkSource, Phase, Place, PoolId,
};
use vramscope_core::model::{Model, ModelConfig, ProcessKey, ViewOptions};

const KEY: ProcessKey = ProcessKey {
    pid: 1,
    start_time: 1,
};
/// Allocations or tensors in one burst, at most.
const BURST: u64 = 1 << 14;

/// The input, read a few bytes at a time (zeros once it runs out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u64 {
        u64::from(self.u8()) | u64::from(self.u8()) << 8
    }
    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |a, i| a | u64::from(self.u8()) << (8 * i))
    }
    /// An address: page-aligned and small mostly (so that bursts meet),
    /// sometimes any.
    fn addr(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u64(),
            1 => 0x7f00_0000_0000 + (self.u16() << 12),
            _ => self.u16() << 12,
        }
    }
    /// A size: a block's, a huge one, or any.
    fn size(&mut self) -> u64 {
        match self.u8() % 8 {
            0 => 1,
            1 => 512,
            2 => 1 << 20,
            3 => 1 << 50,
            4 => u64::MAX - self.u16(),
            5 => self.u64(),
            _ => (self.u16() + 1) << 9,
        }
    }
    fn count(&mut self) -> u64 {
        self.u16() % (BURST + 1)
    }
}

fn held(code: u8) -> Held {
    match code % 5 {
        0 => Held::Parameter,
        1 => Held::Buffer,
        2 => Held::Gradient,
        3 => Held::OptimizerState,
        _ => Held::Other(code),
    }
}

fn phase(code: u8) -> Phase {
    match code % 4 {
        0 => Phase::Forward,
        1 => Phase::Backward,
        2 => Phase::Optimizer,
        _ => Phase::NotGiven,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut m = Model::new(ModelConfig::default());
    let mut input = Bytes(data);
    let mut t = 0u64;
    let mut place = Place {
        device: 0,
        stream: 0,
        pool: PoolId(0, 0),
        ctx: CtxTag::NONE,
    };
    let mut out: Vec<Event> = Vec::new();
    let mut emit = |out: &mut Vec<Event>, kind: EventKind| {
        t += 1_000;
        out.push(Event { time_ns: t, kind });
    };
    let mut list = 0u32;
    for _ in 0..64 {
        if input.0.is_empty() {
            break;
        }
        match input.u8() % 10 {
            0 => {
                let (addr, size) = (input.addr(), input.size());
                emit(&mut out, EventKind::Alloc { place, addr, size });
            }
            1 => {
                let (n, base, stride, size) =
                    (input.count(), input.addr(), input.u16() << 12, input.size());
                for i in 0..n {
                    let addr = base.wrapping_add(i.wrapping_mul(stride));
                    emit(&mut out, EventKind::Alloc { place, addr, size });
                }
            }
            2 => {
                let (addr, size) = (input.addr(), input.size());
                emit(&mut out, EventKind::SegmentAlloc { place, addr, size });
            }
            3 => {
                let (addr, size) = (input.addr(), input.size());
                emit(&mut out, EventKind::FreeRequested { place, addr, size });
                emit(&mut out, EventKind::FreeCompleted { place, addr, size });
            }
            4 => {
                // A whole list: count said, tensors in a burst.
                list = list.wrapping_add(1);
                let (n, base, stride, bytes) =
                    (input.count(), input.addr(), input.u16(), input.size());
                let (h, module) = (input.u8(), u32::from(input.u8() % 4));
                let said = if input.u8() % 4 == 0 { n + 1 } else { n };
                emit(&mut out, EventKind::Roles { list, count: said });
                for i in 0..n {
                    let role = EventKind::Role {
                        list,
                        device: place.device,
                        addr: base.wrapping_add(i.wrapping_mul(stride)),
                        bytes,
                        held: held(h.wrapping_add(i as u8 % 2)),
                        module,
                    };
                    emit(&mut out, role);
                }
                emit(&mut out, EventKind::RolesEnd { list, count: said });
            }
            5 => {
                let value = input.u16();
                let source = if input.u8() % 8 == 0 {
                    MarkSource::Run
                } else {
                    MarkSource::User
                };
                emit(&mut out, EventKind::Marker { value, source });
            }
            6 => {
                // A context and its module's name.
                let id = u32::from(input.u8() % 8) + 1;
                let (ph, name) = (input.u8(), input.u8());
                for k in EventKind::string_chunks(id, &format!("m.{name}.x")) {
                    emit(&mut out, k);
                }
                let ctx = EventKind::Context {
                    id,
                    module: id,
                    phase: phase(ph),
                    stack: 0,
                    step: None,
                };
                emit(&mut out, ctx);
            }
            7 => {
                place.ctx = CtxTag {
                    context: u32::from(input.u8() % 9),
                    step_tag: input.u8(),
                };
            }
            8 => place.device = u16::from(input.u8() % 2),
            _ => {
                // A list that never ends, or ends short.
                list = list.wrapping_add(1);
                emit(&mut out, EventKind::Roles { list, count: 2 });
                let (addr, bytes, h) = (input.addr(), input.size(), input.u8());
                let role = EventKind::Role {
                    list,
                    device: place.device,
                    addr,
                    bytes,
                    held: held(h),
                    module: 0,
                };
                emit(&mut out, role);
                if h % 2 == 0 {
                    emit(&mut out, EventKind::RolesEnd { list, count: 2 });
                }
            }
        }
    }
    m.apply_all(KEY, out.iter());
    let start = Instant::now();
    let v = m.view(t, &ViewOptions::default());
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "one view took {took:?}");
    let Some(p) = v.processes.first() else {
        return;
    };
    let mut blocks = 0u64;
    let mut bytes = 0u64;
    for d in &p.devices {
        let all = d.segments.iter().flat_map(|s| s.blocks.iter());
        for b in all.chain(d.orphans.iter()) {
            let allocated = b.block.state == BlockState::Allocated;
            assert_eq!(b.role.is_some(), allocated, "{b:?}");
            assert!(allocated || b.held_by.is_none(), "{b:?}");
            if allocated {
                blocks += 1;
                bytes = bytes.saturating_add(b.block.size);
            }
        }
    }
    let a = &p.attribution;
    let counted: u64 = a.roles.iter().map(|r| r.blocks).sum();
    let summed = a.roles.iter().fold(0u64, |s, r| s.saturating_add(r.bytes));
    assert_eq!((counted, summed), (blocks, bytes));
});
