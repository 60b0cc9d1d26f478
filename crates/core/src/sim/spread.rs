//! A replay beside others that place segments differently: where a tie
//! between equal free blocks decides a figure, the range of that figure
//! over plausible placements instead of one number.
//!
//! The replay compared is [`Placement::driver`]'s; beside it run the
//! reverse order, shuffled orders and the driver's order with every tie
//! broken the other way (the highest address instead of the lowest). A
//! step where they disagree on a figure is *tie-decided*, and each figure's
//! range is the lowest and highest of them all.

use serde::Serialize;

use super::allocator::{NullSink, SimConfig};
use super::placement::Placement;
use super::trace::{Replay, Request, StepReport};
use crate::model::device::HeldSegment;

/// How many replays run beside the compared one: the reverse order, four
/// shuffled orders, and the driver's with ties broken high (the same set
/// `sim::diff` measures against PyTorch).
pub const BESIDE: usize = 6;

/// The figures a tie can change, lowest and highest over the replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    pub lo: u64,
    pub hi: u64,
}

impl Range {
    fn of(x: u64) -> Range {
        Range { lo: x, hi: x }
    }
    fn add(&mut self, x: u64) {
        self.lo = self.lo.min(x);
        self.hi = self.hi.max(x);
    }
    /// Whether the replays disagree.
    pub fn is_spread(&self) -> bool {
        self.lo != self.hi
    }
}

/// One step's figures over every placement, when they disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Spread {
    pub allocated: Range,
    pub reserved: Range,
    pub segments: Range,
    pub inactive_split: Range,
    pub(crate) reserved_peak: Range,
    pub alloc_retries: Range,
    pub ooms: Range,
}

impl Spread {
    fn of(r: &StepReport) -> Spread {
        Spread {
            allocated: Range::of(r.allocated),
            reserved: Range::of(r.reserved),
            segments: Range::of(r.segments),
            inactive_split: Range::of(r.inactive_split),
            reserved_peak: Range::of(r.reserved_peak),
            alloc_retries: Range::of(r.alloc_retries),
            ooms: Range::of(r.ooms),
        }
    }
    fn add(&mut self, r: &StepReport) {
        self.allocated.add(r.allocated);
        self.reserved.add(r.reserved);
        self.segments.add(r.segments);
        self.inactive_split.add(r.inactive_split);
        self.reserved_peak.add(r.reserved_peak);
        self.alloc_retries.add(r.alloc_retries);
        self.ooms.add(r.ooms);
    }
    fn is_spread(&self) -> bool {
        [
            self.allocated,
            self.reserved,
            self.segments,
            self.inactive_split,
            self.reserved_peak,
            self.alloc_retries,
            self.ooms,
        ]
        .iter()
        .any(Range::is_spread)
    }
}

/// One replay's outcome so far, in [`Totals`]' order: reserved now, peak
/// reserved, peak allocated, inactive split now, its peak, retries, OOMs.
type Outcome = [u64; 7];

/// `r`'s outcome, after `before`.
fn outcome(before: Option<Outcome>, r: &StepReport) -> Outcome {
    let split_peak = before.map_or(0, |o| o[4]).max(r.inactive_split);
    [
        r.reserved,
        r.reserved_peak,
        r.allocated_peak,
        r.inactive_split,
        split_peak,
        r.alloc_retries,
        r.ooms,
    ]
}

/// The driver-order replay and the ones beside it.
pub struct SpreadReplay {
    main: Replay,
    others: Vec<Replay>,
    /// Per replay (the driver's first), its outcome so far (None before
    /// any step): [`Outcome`]'s figures.
    last: Vec<Option<Outcome>>,
    /// Steps so far, and those a tie decided.
    pub steps: usize,
    pub tied: usize,
}

/// A whole replay's outcome over every placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub reserved_now: Range,
    pub reserved_peak: Range,
    pub allocated_peak: Range,
    pub inactive_split_now: Range,
    pub inactive_split_peak: Range,
    pub alloc_retries: Range,
    pub ooms: Range,
}

impl SpreadReplay {
    /// A replay under `cfg` with [`BESIDE`] others. `ignoring_addresses`:
    /// the addresses the requests give are left out (a what-if replay).
    pub fn new(cfg: &SimConfig, ignoring_addresses: bool) -> SpreadReplay {
        let make = |p: Placement| {
            let r = Replay::with_placement(cfg, p);
            if ignoring_addresses {
                r.ignoring_addresses()
            } else {
                r
            }
        };
        let mut others: Vec<Replay> = Placement::alternatives(BESIDE - 1, 0x5eed)
            .into_iter()
            .map(make)
            .collect();
        others.push(make(Placement::driver()).breaking_ties_high());
        SpreadReplay {
            main: make(Placement::driver()),
            last: vec![None; others.len() + 1],
            others,
            steps: 0,
            tied: 0,
        }
    }

    /// One replay alone, with the addresses the requests give: for a
    /// replay of what really happened, where no tie is left to decide.
    /// The replay in the driver's order (or with the addresses given).
    pub(crate) fn main(&self) -> &Replay {
        &self.main
    }

    pub(crate) fn exact(cfg: &SimConfig) -> SpreadReplay {
        SpreadReplay {
            main: Replay::new(cfg),
            others: Vec::new(),
            last: vec![None],
            steps: 0,
            tied: 0,
        }
    }

    /// One replay alone, beginning where a running job's allocator is
    /// (`held` installed; None when it cannot be), with the addresses the
    /// requests give from then on.
    pub(crate) fn installed(cfg: &SimConfig, held: &[HeldSegment]) -> Option<SpreadReplay> {
        Some(SpreadReplay {
            main: Replay::installed(cfg, held)?,
            others: Vec::new(),
            last: vec![None],
            steps: 0,
            tied: 0,
        })
    }

    /// Tensor `id` is the one held at `addr` when the replay began
    /// ([`Replay::adopt`]).
    pub(crate) fn adopt(&mut self, id: u64, addr: u64) -> bool {
        self.main.adopt(id, addr)
    }

    /// The driver-order replay alone, ignoring the addresses the requests
    /// give: the live advisor's, which cannot afford the others.
    pub(crate) fn driver_only(cfg: &SimConfig) -> SpreadReplay {
        SpreadReplay {
            main: Replay::with_placement(cfg, Placement::driver()).ignoring_addresses(),
            others: Vec::new(),
            last: vec![None],
            steps: 0,
            tied: 0,
        }
    }

    /// The driver-order replay's statistics now.
    pub(crate) fn stats(&self) -> vramscope_wire::event::Stats {
        self.main.stats()
    }

    /// Applies the next request to every replay: the driver-order replay's
    /// report, and the figures' ranges when the replays disagree.
    pub fn step(&mut self, req: &Request) -> (StepReport, Option<Spread>) {
        let r = self.main.step(req, &mut NullSink);
        let mut spread = Spread::of(&r);
        self.last[0] = Some(outcome(self.last[0], &r));
        for (o, last) in self.others.iter_mut().zip(&mut self.last[1..]) {
            let x = o.step(req, &mut NullSink);
            spread.add(&x);
            *last = Some(outcome(*last, &x));
        }
        self.steps += 1;
        let tied = spread.is_spread();
        self.tied += tied as usize;
        (r, tied.then_some(spread))
    }

    /// The outcome so far over every placement (None before any step).
    pub fn totals(&self) -> Option<Totals> {
        let mut t: Option<Totals> = None;
        for last in &self.last {
            let figures = (*last)?;
            match &mut t {
                None => {
                    let [a, b, c, d, e, f, g] = figures.map(Range::of);
                    t = Some(Totals {
                        reserved_now: a,
                        reserved_peak: b,
                        allocated_peak: c,
                        inactive_split_now: d,
                        inactive_split_peak: e,
                        alloc_retries: f,
                        ooms: g,
                    })
                }
                Some(t) => {
                    for (acc, x) in [
                        &mut t.reserved_now,
                        &mut t.reserved_peak,
                        &mut t.allocated_peak,
                        &mut t.inactive_split_now,
                        &mut t.inactive_split_peak,
                        &mut t.alloc_retries,
                        &mut t.ooms,
                    ]
                    .into_iter()
                    .zip(figures)
                    {
                        acc.add(x);
                    }
                }
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(id: u64, mib: u64) -> Request {
        Request::alloc(id, mib << 20, 0)
    }

    /// Two equal free 20 MiB blocks, one a whole segment and one split off
    /// a larger one: which one a 20 MiB request takes decides whether the
    /// whole segment stays free for `empty_cache` to release, so reserved
    /// after it depends on the segments' addresses. The spread says so.
    #[test]
    fn a_tie_between_equal_free_blocks_gives_a_range() {
        let cfg = SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        };
        let reqs = [
            alloc(1, 20), // segment A: 20 MiB
            alloc(2, 40), // segment B: 40 MiB
            Request::Free { id: 2 },
            alloc(3, 20),            // splits B: 20 used, 20 free
            Request::Free { id: 1 }, // A free again: two free 20 MiB blocks
            alloc(4, 20),            // takes A or B's tail: the lower one
            Request::EmptyCache,     // releases A if it is free
        ];
        let mut s = SpreadReplay::new(&cfg, false);
        let mut last = None;
        for r in &reqs {
            last = Some(s.step(r));
        }
        let (report, spread) = last.unwrap();
        let spread = spread.expect("a tie decided the last step");
        assert!(spread.reserved.lo < spread.reserved.hi, "{spread:?}");
        assert!((spread.reserved.lo..=spread.reserved.hi).contains(&report.reserved));
        assert_eq!(spread.reserved.lo, 40 << 20);
        assert_eq!(spread.reserved.hi, 60 << 20);
        assert!(s.tied >= 1);
        let t = s.totals().unwrap();
        assert_eq!((t.reserved_now.lo, t.reserved_now.hi), (40 << 20, 60 << 20));
        assert_eq!(t.reserved_peak.lo, 60 << 20);
    }

    /// Without equal free blocks every placement agrees.
    #[test]
    fn no_tie_no_range() {
        let cfg = SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        };
        let mut s = SpreadReplay::new(&cfg, false);
        for (i, mib) in [4u64, 30, 64].into_iter().enumerate() {
            let (_, spread) = s.step(&alloc(i as u64, mib));
            assert!(spread.is_none());
        }
        assert_eq!(s.tied, 0);
    }
}
