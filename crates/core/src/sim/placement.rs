//! Where the simulator's new segments go when no one says.
//!
//! Ties between equal free blocks break by address (PyTorch's best fit
//! takes the lowest), so a replay's figures can depend on where the driver
//! put each segment. A recording knows (`Request::Alloc::segment_addr`);
//! a what-if replay under another setting, or a trace without addresses,
//! does not. [`Placement::driver`] puts them where the driver's address
//! space would ([`VaRegions`](super::va::VaRegions), measured on real PyTorch:
//! tests/gpu/RESULTS.md, "Placement without addresses"). The other
//! placements ([`Placement::alternatives`]) put them in other orders, so
//! that a replay beside them shows which figures a tie decided, and the
//! range they span.

use super::allocator::{EventSink, OomError, SimAllocator, SimConfig};
use crate::pytorch::pool_for_size;
use vramscope_wire::event::SegmentPool;

/// Where a replay's new segments go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// The simulator's own: ascending addresses, never reused.
    Ascending,
    /// Each pool's segments one after the other, upwards or downwards from
    /// `at` (index 0: small pool, 1: large). (Large ones downwards and
    /// small ones upwards was this simulator's model of the driver before
    /// `VaRegions`: right on 94–98 % of steps, against 98–100 %.)
    Ordered { up: [bool; 2], at: [u64; 2] },
    /// At pseudo-random addresses (xorshift state).
    Shuffled(u64),
    /// Where the driver's address space would have them
    /// ([`VaRegions`](super::va::VaRegions)).
    Regions,
}

/// Where `Placement::Ordered` starts.
const ORDERED_FROM: u64 = 0x7c00_0000_0000;
/// `Placement::Shuffled`: slots from here, `SLOTS` of them.
const SHUFFLE_FROM: u64 = 0x6000_0000_0000;
const SLOTS: u64 = 1 << 14;

impl Placement {
    /// Where the driver's address space would put them ([`VaRegions`](super::va::VaRegions)).
    pub(crate) const fn driver() -> Placement {
        Placement::Regions
    }

    /// Large segments one above the other, small ones one below the other.
    pub(crate) const fn reverse() -> Placement {
        Placement::Ordered {
            up: [false, true],
            at: [ORDERED_FROM, ORDERED_FROM],
        }
    }

    /// Pseudo-random addresses from `seed` (any value; 0 is changed).
    pub(crate) fn shuffled(seed: u64) -> Placement {
        Placement::Shuffled(seed.max(1))
    }

    /// `n` placements beside the driver's: large segments upwards and small
    /// ones downwards, then shuffled ones seeded from `seed`.
    pub(crate) fn alternatives(n: usize, seed: u64) -> Vec<Placement> {
        let shuffled = (1..)
            .map(|k: u64| Placement::shuffled(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(k) ^ seed));
        std::iter::once(Placement::reverse())
            .chain(shuffled)
            .take(n)
            .collect()
    }

    /// Allocates `size` bytes on `stream` in `sim`, its new segment (if it
    /// makes one) at `given` when that is known, else where this placement
    /// puts it.
    pub(crate) fn malloc(
        &mut self,
        sim: &mut SimAllocator,
        size: u64,
        stream: u64,
        given: Option<u64>,
        sink: &mut dyn EventSink,
    ) -> Result<u64, OomError> {
        let before = (sim.stats().segments, sim.stats().reserved);
        let cfg = sim.config();
        let pool = match pool_for_size(cfg.alloc.round_size(size)) {
            SegmentPool::Small => 0,
            SegmentPool::Large => 1,
        };
        let apart = apart(cfg);
        let hint = given.or_else(|| match self {
            Placement::Ascending | Placement::Regions => None,
            Placement::Ordered { up, at } if up[pool] => Some(at[pool]),
            Placement::Ordered { at, .. } => Some(at[pool].saturating_sub(apart)),
            Placement::Shuffled(x) => {
                *x ^= *x << 13;
                *x ^= *x >> 7;
                *x ^= *x << 17;
                let slots = (SLOTS << 30) / apart;
                Some(SHUFFLE_FROM + *x % slots.max(1) * apart)
            }
        });
        if *self == Placement::Regions {
            sim.place_by_regions();
        }
        sim.set_segment_addr(hint);
        let got = sim.malloc(size, stream, sink);
        let grew = (sim.stats().segments, sim.stats().reserved) > before;
        if let (true, None, Placement::Ordered { up, at }) = (grew, given, self) {
            at[pool] = if up[pool] {
                at[pool].saturating_add(apart)
            } else {
                at[pool].saturating_sub(apart)
            };
        }
        got
    }
}

/// Two consecutive segments' distance: more than any segment (or
/// expandable reservation) can span.
fn apart(cfg: &SimConfig) -> u64 {
    if cfg.alloc.expandable_segments {
        cfg.capacity.saturating_mul(2).max(1 << 30)
    } else {
        1 << 30
    }
}
