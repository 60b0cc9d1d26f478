//! The driver's address space for `cudaMalloc`, modelled: where a new
//! segment goes when no one recorded it (`sim::placement`). Pure: the
//! allocator hands over its live segments' ranges.

use std::collections::BTreeMap;

/// The driver's address space for `cudaMalloc`, as measured on H100s and
/// H200s (tests/gpu/RESULTS.md): segments live in regions of whole 32 MiB
/// granules, each new region directly below the lowest one a live segment
/// is in (a region no live segment is in is given back); a segment goes to
/// the lowest hole of a region it fits in, at the hole's bottom, else a
/// region of its own. The top region starts partly taken (by what CUDA
/// allocated before the job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VaRegions {
    /// start -> (length, its largest hole).
    regions: BTreeMap<u64, (u64, u64)>,
    /// The regions' largest holes, counted: a segment no hole fits gets a
    /// region of its own without a look at each region.
    largest: BTreeMap<u64, usize>,
}

/// The top region's start.
const TOP_REGION: u64 = 0x7c00_0000_0000;
/// A region's granule.
const GRANULE: u64 = 32 << 20;
/// What the top region holds before the job's first segment.
const TAKEN: u64 = 6 << 20;

impl Default for VaRegions {
    fn default() -> Self {
        VaRegions {
            regions: [(TOP_REGION, (GRANULE, GRANULE - TAKEN))].into(),
            largest: [(GRANULE - TAKEN, 1)].into(),
        }
    }
}

impl VaRegions {
    /// Where a new segment of `size` bytes goes, given the live segments'
    /// `ranges` (base -> size). The caller says what became of it:
    /// [`placed`](Self::placed) once it is in `ranges`, else
    /// [`released`](Self::released).
    pub(crate) fn place(&mut self, size: u64, ranges: &BTreeMap<u64, u64>) -> u64 {
        if self.largest.keys().next_back().is_some_and(|&h| h >= size) {
            let found = (self.regions.iter()).find(|(_, &(_, hole))| hole >= size);
            if let Some((&start, &(len, _))) = found {
                if let Some(at) = holes(start, len, ranges).find(|&(a, b)| b - a >= size) {
                    return at.0;
                }
            }
        }
        let lowest = self.regions.keys().next().copied().unwrap_or(TOP_REGION);
        let len = size.div_ceil(GRANULE).max(1).saturating_mul(GRANULE);
        let at = lowest.saturating_sub(len);
        self.set(at, len, len);
        at
    }

    /// A segment now at `addr` in `ranges`.
    pub(crate) fn placed(&mut self, addr: u64, ranges: &BTreeMap<u64, u64>) {
        if let Some((start, len)) = self.region_of(addr) {
            self.set(start, len, largest_hole(start, len, ranges));
        }
    }

    /// The segment at `addr` is no longer in `ranges` (or never got
    /// there): its region is given back when no live segment is in it.
    pub(crate) fn released(&mut self, addr: u64, ranges: &BTreeMap<u64, u64>) {
        let Some((start, len)) = self.region_of(addr) else {
            return;
        };
        let end = start.saturating_add(len);
        if start != TOP_REGION && ranges.range(start..end).next().is_none() {
            self.unset(start);
        } else {
            self.set(start, len, largest_hole(start, len, ranges));
        }
    }

    /// The region `addr` is in: (start, length).
    fn region_of(&self, addr: u64) -> Option<(u64, u64)> {
        let (&start, &(len, _)) = self.regions.range(..=addr).next_back()?;
        (addr < start.saturating_add(len)).then_some((start, len))
    }

    fn set(&mut self, start: u64, len: u64, hole: u64) {
        self.unset(start);
        self.regions.insert(start, (len, hole));
        *self.largest.entry(hole).or_default() += 1;
    }

    fn unset(&mut self, start: u64) {
        if let Some((_, hole)) = self.regions.remove(&start) {
            if let Some(n) = self.largest.get_mut(&hole) {
                *n -= 1;
                if *n == 0 {
                    self.largest.remove(&hole);
                }
            }
        }
    }
}

/// The holes of the region at `start` (`len` long) between the live
/// segments in it, lowest first: (from, to).
fn holes(
    start: u64,
    len: u64,
    ranges: &BTreeMap<u64, u64>,
) -> impl Iterator<Item = (u64, u64)> + '_ {
    let end = start.saturating_add(len);
    let mut at = if start == TOP_REGION {
        start + TAKEN
    } else {
        start
    };
    let mut live = ranges.range(start..end);
    let mut done = false;
    std::iter::from_fn(move || loop {
        if done {
            return None;
        }
        match live.next() {
            Some((&a, &n)) => {
                let from = at;
                at = at.max(a.saturating_add(n));
                if a > from {
                    return Some((from, a));
                }
            }
            None => {
                done = true;
                return (end > at).then_some((at, end));
            }
        }
    })
}

fn largest_hole(start: u64, len: u64, ranges: &BTreeMap<u64, u64>) -> u64 {
    holes(start, len, ranges)
        .map(|(a, b)| b - a)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// The model and the live segments it places, as the allocator keeps
    /// them.
    #[derive(Default)]
    struct Space {
        va: VaRegions,
        ranges: BTreeMap<u64, u64>,
    }

    impl Space {
        /// A new segment of `mib` MiB: where it went, in MiB from the top
        /// region's start.
        fn make(&mut self, mib: u64) -> i64 {
            let at = self.va.place(mib * MIB, &self.ranges);
            self.ranges.insert(at, mib * MIB);
            self.va.placed(at, &self.ranges);
            (at as i64 - TOP_REGION as i64) / MIB as i64
        }
        fn release(&mut self, at_mib: i64) {
            let at = (TOP_REGION as i64 + at_mib * MIB as i64) as u64;
            assert!(self.ranges.remove(&at).is_some());
            self.va.released(at, &self.ranges);
        }
    }

    /// The rules as the corpora showed them (tests/gpu/RESULTS.md, the
    /// H200's trace 0 begins so): small segments after what CUDA holds in
    /// the top region, a large one in the rest of it, then regions
    /// downwards; one no live segment is in is given back and the next
    /// goes below the lowest in use; holes are taken lowest first, at
    /// their bottom.
    #[test]
    fn regions_downwards_holes_lowest_first() {
        let mut s = Space::default();
        assert_eq!(s.make(2), 6);
        assert_eq!(s.make(2), 8);
        assert_eq!(s.make(20), 10, "the rest of the top region");
        assert_eq!(s.make(20), -32, "a region below");
        assert_eq!(s.make(20), -64);
        s.release(-32);
        assert_eq!(
            s.make(20),
            -96,
            "the region given back is not taken: below the lowest in use"
        );
        s.release(10);
        assert_eq!(
            s.make(12),
            -76,
            "the lowest hole it fits: the rest of -96's"
        );
        assert_eq!(s.make(12), -44, "then -64's");
        assert_eq!(s.make(12), 10, "then the top region's");
        assert_eq!(s.make(42), -160, "over 32 MiB: a region of two granules");
        assert_eq!(s.make(2), -118, "the rest of it, lowest first");
        assert_eq!(s.make(14), -116, "the rest of the rest");
        assert_eq!(s.make(24), -192, "no hole fits: a region of its own");
    }

    /// Holes between live segments, the taken part of the top region, and
    /// a region's end.
    #[test]
    fn holes_between_live_segments() {
        let start = TOP_REGION - 64 * MIB;
        let ranges: BTreeMap<u64, u64> = [
            (start + 4 * MIB, 2 * MIB),
            (start + 10 * MIB, 20 * MIB),
            (TOP_REGION + 6 * MIB, 2 * MIB),
        ]
        .into();
        let got: Vec<(u64, u64)> = holes(start, 32 * MIB, &ranges)
            .map(|(a, b)| ((a - start) / MIB, (b - start) / MIB))
            .collect();
        assert_eq!(got, [(0, 4), (6, 10), (30, 32)]);
        let top: Vec<(u64, u64)> = holes(TOP_REGION, 32 * MIB, &ranges)
            .map(|(a, b)| ((a - TOP_REGION) / MIB, (b - TOP_REGION) / MIB))
            .collect();
        assert_eq!(top, [(8, 32)], "what CUDA holds is no hole");
        assert_eq!(largest_hole(start, 32 * MIB, &ranges), 4 * MIB);
    }
}
