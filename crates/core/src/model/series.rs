//! Bounded time series: recent points at full resolution, older ones in
//! coarser min/max/last buckets, so memory stays bounded for runs of days.
//!
//! ```text
//!  tier 0  ─ buckets of base_width (1 ms)      ┐ newest
//!  tier 1  ─ base_width × factor               │
//!  …                                           │
//!  tier n  ─ widest; when full, its width      │
//!            doubles and pairs merge           ┘ oldest
//! ```
//!
//! Every point lands in exactly one bucket; a bucket evicted from a full
//! tier is merged into the next coarser tier. The last tier never drops
//! data: it halves its resolution instead. Memory is therefore at most
//! `tiers × capacity` buckets, whatever the length of the run.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Shape of a series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeriesConfig {
    /// Width of a tier-0 bucket in nanoseconds (points closer than this merge).
    pub(crate) base_width_ns: u64,
    /// Width ratio between successive tiers (≥ 2).
    pub(crate) factor: u64,
    /// Number of tiers (≥ 1).
    pub(crate) tiers: usize,
    /// Buckets per tier (≥ 2).
    pub(crate) capacity: usize,
}

impl Default for SeriesConfig {
    /// 1 ms × 4096 (4 s), 8 ms (33 s), 64 ms (4.4 min), 512 ms (35 min),
    /// 4 s (4.7 h), then the last tier coarsens: ≤ 640 KiB per series.
    fn default() -> Self {
        Self {
            base_width_ns: 1_000_000,
            factor: 8,
            tiers: 5,
            capacity: 4096,
        }
    }
}

/// All points that fell into `[start_ns, start_ns + width)`, for each of
/// the series' `N` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket<const N: usize> {
    pub(crate) start_ns: u64,
    pub(crate) min: [u64; N],
    pub(crate) max: [u64; N],
    /// The newest point's values.
    pub(crate) last: [u64; N],
}

impl<const N: usize> Bucket<N> {
    fn point(start_ns: u64, v: [u64; N]) -> Self {
        Self {
            start_ns,
            min: v,
            max: v,
            last: v,
        }
    }
    fn absorb(&mut self, newer: &Bucket<N>) {
        for i in 0..N {
            self.min[i] = self.min[i].min(newer.min[i]);
            self.max[i] = self.max[i].max(newer.max[i]);
        }
        self.last = newer.last;
    }
    fn column(&self, i: usize) -> Column {
        Column {
            min: self.min[i],
            max: self.max[i],
            last: self.last[i],
        }
    }
}

/// One chart column of a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub min: u64,
    pub max: u64,
    pub(crate) last: u64,
}

#[derive(Debug, Clone)]
struct Tier<const N: usize> {
    width: u64,
    buckets: VecDeque<Bucket<N>>,
}

/// A bounded, downsampling time series of `N` values sampled together
/// (one bucket holds all `N`: a device's allocated, reserved and active
/// bytes share their times).
#[derive(Debug, Clone)]
pub(crate) struct Series<const N: usize = 1> {
    cfg: SeriesConfig,
    tiers: Vec<Tier<N>>,
    /// End of tier 0's newest bucket: points before it update that bucket.
    open_end: u64,
    last_time: u64,
    points: u64,
}

impl<const N: usize> Series<N> {
    pub(crate) fn new(cfg: SeriesConfig) -> Self {
        let cfg = SeriesConfig {
            base_width_ns: cfg.base_width_ns.max(1),
            factor: cfg.factor.max(2),
            tiers: cfg.tiers.max(1),
            capacity: cfg.capacity.max(2),
        };
        let mut width = cfg.base_width_ns;
        let tiers = (0..cfg.tiers)
            .map(|_| {
                let t = Tier {
                    width,
                    buckets: VecDeque::new(),
                };
                width = width.saturating_mul(cfg.factor);
                t
            })
            .collect();
        Self {
            cfg,
            tiers,
            open_end: 0,
            last_time: 0,
            points: 0,
        }
    }

    #[cfg(test)]
    /// Points pushed so far.
    pub(crate) fn points(&self) -> u64 {
        self.points
    }
    #[cfg(test)]
    /// Buckets currently held, over all tiers.
    pub(crate) fn buckets(&self) -> usize {
        self.tiers.iter().map(|t| t.buckets.len()).sum()
    }
    /// Heap bytes held (bucket storage).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.tiers
            .iter()
            .map(|t| t.buckets.capacity() * std::mem::size_of::<Bucket<N>>())
            .sum::<usize>()
            + self.tiers.capacity() * std::mem::size_of::<Tier<N>>()
    }

    /// The times of the oldest point still held and of the newest (None:
    /// no point yet).
    pub(crate) fn extent(&self) -> Option<(u64, u64)> {
        let first = (self.tiers.iter())
            .filter_map(|t| t.buckets.front())
            .map(|b| b.start_ns)
            .min()?;
        Some((first, self.last_time.max(first)))
    }

    /// Add a point. Times that go backwards are treated as the newest time.
    #[inline]
    pub(crate) fn push(&mut self, time_ns: u64, values: [u64; N]) {
        let t = time_ns.max(self.last_time);
        self.last_time = t;
        self.points += 1;
        if t < self.open_end {
            if let Some(b) = self.tiers[0].buckets.back_mut() {
                // Element by element: a whole-array copy of `values` right
                // after its parts were stored stalls on store forwarding.
                for (i, &v) in values.iter().enumerate() {
                    b.min[i] = b.min[i].min(v);
                    b.max[i] = b.max[i].max(v);
                    b.last[i] = v;
                }
                return;
            }
        }
        self.push_new(t, values);
    }

    #[cold]
    fn push_new(&mut self, t: u64, values: [u64; N]) {
        let w = self.tiers[0].width;
        let start = t - t % w;
        self.open_end = start.saturating_add(w);
        self.insert(0, Bucket::point(start, values));
    }

    /// Put a bucket (newer than everything in tier `k`) into tier `k`. A
    /// full tier first hands its oldest bucket on (or, the last, coarsens),
    /// so a tier never holds more than `capacity` buckets (nor allocates
    /// room for more).
    fn insert(&mut self, k: usize, b: Bucket<N>) {
        let cap = self.cfg.capacity;
        let tier = &mut self.tiers[k];
        let start = b.start_ns - b.start_ns % tier.width;
        if let Some(back) = tier.buckets.back_mut() {
            if back.start_ns == start {
                back.absorb(&b);
                return;
            }
        }
        if tier.buckets.len() >= cap {
            if k + 1 < self.tiers.len() {
                if let Some(old) = self.tiers[k].buckets.pop_front() {
                    self.insert(k + 1, old);
                }
            } else {
                // Twice as wide: the new bucket may now merge with the last.
                self.coarsen_last();
                return self.insert(k, b);
            }
        }
        self.tiers[k].buckets.push_back(Bucket {
            start_ns: start,
            ..b
        });
    }

    /// Double the last tier's width, merging pairs of buckets.
    fn coarsen_last(&mut self) {
        let tier = self.tiers.last_mut().expect("at least one tier");
        tier.width = tier.width.saturating_mul(2);
        let w = tier.width;
        let mut merged: VecDeque<Bucket<N>> = VecDeque::with_capacity(tier.buckets.capacity());
        for b in tier.buckets.drain(..) {
            let start = b.start_ns - b.start_ns % w;
            match merged.back_mut() {
                Some(m) if m.start_ns == start => m.absorb(&b),
                _ => merged.push_back(Bucket {
                    start_ns: start,
                    ..b
                }),
            }
        }
        tier.buckets = merged;
    }

    /// Min/max/last per column for `columns` equal columns over
    /// `[from_ns, to_ns)`, for each of the `N` values. Columns without
    /// points carry the previous value forward (the series is a step
    /// function); columns before the first point are `None`.
    pub(crate) fn query(
        &self,
        from_ns: u64,
        to_ns: u64,
        columns: usize,
    ) -> [Vec<Option<Column>>; N] {
        let mut out: [Vec<Option<Column>>; N] = std::array::from_fn(|_| vec![None; columns]);
        if columns == 0 || to_ns <= from_ns || self.points == 0 {
            return out;
        }
        let span = (to_ns - from_ns) as u128;
        let col_of =
            |t: u64| ((t.saturating_sub(from_ns) as u128 * columns as u128) / span) as usize;
        let mut before: Option<[u64; N]> = None;
        // Oldest tier first; each tier's data is older than the next finer
        // tier's oldest bucket, so clip coarse buckets there.
        for k in (0..self.tiers.len()).rev() {
            let tier = &self.tiers[k];
            let clip = (0..k)
                .rev()
                .find_map(|j| self.tiers[j].buckets.front().map(|b| b.start_ns));
            for b in &tier.buckets {
                let mut end = b.start_ns.saturating_add(tier.width);
                if let Some(c) = clip {
                    end = end.min(c).max(b.start_ns.saturating_add(1));
                }
                end = (end.min(self.last_time.saturating_add(1))).max(b.start_ns.saturating_add(1));
                if end <= from_ns {
                    before = Some(b.last);
                    continue;
                }
                if b.start_ns >= to_ns {
                    continue;
                }
                let c0 = col_of(b.start_ns.max(from_ns));
                let c1 = col_of((end - 1).min(to_ns - 1)).min(columns - 1);
                for (i, out) in out.iter_mut().enumerate() {
                    let new = b.column(i);
                    for slot in &mut out[c0..=c1] {
                        *slot = Some(match slot {
                            Some(c) => Column {
                                min: c.min.min(new.min),
                                max: c.max.max(new.max),
                                last: new.last,
                            },
                            None => new,
                        });
                    }
                }
            }
        }
        let last_col = if self.last_time >= to_ns {
            Some(columns - 1)
        } else if self.last_time >= from_ns {
            Some(col_of(self.last_time).min(columns - 1))
        } else {
            None
        };
        for (i, out) in out.iter_mut().enumerate() {
            let mut carry = before.map(|b| b[i]);
            for (c, slot) in out.iter_mut().enumerate() {
                match slot {
                    Some(col) => carry = Some(col.last),
                    None if last_col.is_some_and(|l| c <= l) => {
                        *slot = carry.map(|v| Column {
                            min: v,
                            max: v,
                            last: v,
                        })
                    }
                    None => {}
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one value's columns of a query.
    fn one(s: &Series, from: u64, to: u64, columns: usize) -> Vec<Option<Column>> {
        let [q] = s.query(from, to, columns);
        q
    }

    /// A column of a query result.
    fn col(min: u64, max: u64, last: u64) -> Option<Column> {
        Some(Column { min, max, last })
    }

    fn small() -> SeriesConfig {
        SeriesConfig {
            base_width_ns: 10,
            factor: 4,
            tiers: 3,
            capacity: 8,
        }
    }

    /// The extent runs from the oldest point (its bucket's start: the
    /// series coarsens, it never drops its oldest time) to the newest.
    #[test]
    fn extent_spans_the_points_held() {
        let mut s: Series = Series::new(small());
        assert_eq!(s.extent(), None);
        for t in 0..100_000u64 {
            s.push(1_000_005 + t * 10, [t]);
        }
        let (first, last) = s.extent().unwrap();
        assert_eq!(last, 1_000_005 + 999_990);
        assert!(first <= 1_000_005 && first > 1_000_005 / 2, "{first}");
        let [before] = s.query(0, first, 4);
        assert!(before.iter().all(Option::is_none), "nothing before it");
    }

    #[test]
    fn full_resolution_when_recent() {
        let mut s = Series::new(small());
        for i in 0..5u64 {
            s.push(i * 10, [i * 100]);
        }
        let q = one(&s, 0, 50, 5);
        let want: Vec<_> = (0..5u64).map(|i| col(i * 100, i * 100, i * 100)).collect();
        assert_eq!(q, want);
    }

    #[test]
    fn points_in_one_bucket_keep_min_max_last() {
        let mut s = Series::new(small());
        s.push(0, [5]);
        s.push(3, [1]);
        s.push(5, [9]);
        s.push(7, [4]);
        assert_eq!(s.buckets(), 1);
        assert_eq!(one(&s, 0, 10, 1), vec![col(1, 9, 4)]);
    }

    #[test]
    fn downsampling_keeps_extremes() {
        let mut s = Series::new(small());
        // A spike long ago, then a long flat run pushing it to coarse tiers.
        s.push(0, [10]);
        s.push(15, [1_000]);
        s.push(25, [10]);
        for i in 3..10_000u64 {
            s.push(i * 10, [10 + (i % 3)]);
        }
        assert!(s.buckets() <= 3 * 8, "bounded: {}", s.buckets());
        let q = one(&s, 0, 100_000, 1);
        assert_eq!(q[0].map(|c| (c.min, c.max)), Some((10, 1_000)));
        // The spike stays visible in the first column of a fine query.
        let q = one(&s, 0, 100_000, 100);
        assert_eq!(q[0].map(|c| c.max), Some(1_000));
        assert!(q[50].map(|c| c.max).unwrap() <= 12);
    }

    #[test]
    fn forward_fill_and_empty_before_first_point() {
        let mut s = Series::new(small());
        s.push(50, [7]);
        s.push(51, [8]);
        s.push(90, [3]);
        let q = one(&s, 0, 100, 10);
        assert_eq!(q[0], None);
        assert_eq!(q[4], None);
        assert_eq!(q[5], col(7, 8, 8));
        assert_eq!(q[6], col(8, 8, 8));
        assert_eq!(q[9], col(3, 3, 3));
        // Nothing is drawn after the last point.
        let q = one(&s, 200, 300, 2);
        assert_eq!(q, vec![None, None]);
        let q = one(&s, 85, 300, 2);
        assert_eq!(q[0].map(|c| c.last), Some(3));
        assert_eq!(q[1], None);
    }

    #[test]
    fn memory_is_bounded_after_millions_of_points() {
        let mut s = Series::new(SeriesConfig::default());
        let mut t = 0u64;
        let mut x = 1u64;
        for _ in 0..3_000_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            t += 50_000 + (x >> 50); // ~20k points/s for ~3 minutes... stretched below
            s.push(t, [x >> 40]);
        }
        let after_3m = s.memory_bytes();
        // A further stretch spanning weeks (one point per second of virtual time).
        for i in 0..3_000_000u64 {
            s.push(t + i * 1_000_000_000, [i % 1_000]);
        }
        let bound = 5 * 4096 * std::mem::size_of::<Bucket<1>>() + 4096;
        // Exactly the tiers' capacity, no room grown for a 4,097th bucket.
        assert!(s.memory_bytes() <= bound, "{} > {bound}", s.memory_bytes());
        assert!(after_3m <= bound);
        assert!(s.buckets() <= 5 * 4096);
        assert_eq!(s.points(), 6_000_000);
        // The oldest data is still there, coarsely.
        let q = one(&s, 0, t + 3_000_000 * 1_000_000_000, 10);
        assert!(q[0].is_some());
    }
}
