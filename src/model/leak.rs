//! Leak detection a user can act on.
//!
//! 1. **Steps.** A training loop repeats. Step boundaries come from `Marker`
//!    events when the process writes them; otherwise they are inferred from
//!    the allocated total with a zig-zag (hysteresis) detector: a trough is
//!    confirmed once the total rises `swing_bytes` above its lowest point
//!    since the last peak. That lowest point is the step's *floor* — what
//!    stays allocated between steps (weights, optimizer state, and leaks).
//! 2. **Floor trend.** Over the last `window_steps` floors the detector takes
//!    the Theil–Sen slope (median of pairwise slopes, robust to outliers)
//!    and Kendall's τ (how consistently floors rise). A process is flagged
//!    when enough steps were seen, τ ≥ `min_trend`, the slope is positive and
//!    the growth over the window is at least `min_growth_bytes`. A steady
//!    loop, noisy or not, has τ near 0 and is not flagged.
//! 3. **Culprits.** Live tensor counts per requested size are recorded at
//!    every step boundary (last 32 boundaries); sizes whose live counts rise
//!    with the same robust tests are named, most growth first, with the age
//!    of their oldest live allocation.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use super::device::Block;
use super::rules;
use crate::event::BlockState;

/// Boundaries of live-count history kept per size.
pub const SIZE_HISTORY: usize = 32;
/// Distinct sizes tracked by default (`Bounds::leak_sizes`).
const MAX_SIZES: usize = 4096;

/// Thresholds of the leak heuristic.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakConfig {
    /// Steps needed before a verdict.
    pub min_steps: usize,
    /// Floor growth over the analysed window needed to flag.
    pub min_growth_bytes: u64,
    /// Kendall's τ between step index and floor needed to flag (0..1).
    pub min_trend: f64,
    /// Hysteresis of the trough detector (used without markers).
    pub swing_bytes: u64,
    /// Floors analysed (the most recent ones).
    pub window_steps: usize,
    /// Sizes named in a report.
    pub top_sizes: usize,
}

impl Default for LeakConfig {
    fn default() -> Self {
        Self {
            min_steps: 8,
            min_growth_bytes: 16 << 10,
            min_trend: 0.6,
            swing_bytes: 1 << 20,
            window_steps: 64,
            top_sizes: 5,
        }
    }
}

/// Where step boundaries come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepSource {
    /// No step seen yet.
    None,
    /// `Marker` events written by the process.
    Markers,
    /// Troughs of the allocated total.
    Troughs,
}

/// One allocation size whose live count keeps growing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakSize {
    /// The caller's request in bytes.
    pub requested: u64,
    /// The block it occupies (512 B rounding).
    pub block_size: u64,
    /// Tensors of this size alive now.
    pub live: u64,
    /// Robust growth of the live count per step.
    pub live_growth_per_step: f64,
    /// Growth of the live count over the analysed boundaries.
    pub live_growth: i64,
    /// Age of the oldest live tensor of this size, when known.
    pub oldest_age_ns: Option<u64>,
}

/// The verdict for one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakReport {
    pub flagged: bool,
    pub source: StepSource,
    /// Steps seen since the detector started.
    pub steps_observed: u64,
    /// Floors analysed.
    pub window_steps: usize,
    /// Theil–Sen slope of the floor, bytes per step.
    pub floor_slope_bytes_per_step: f64,
    /// Slope × analysed steps.
    pub floor_growth_bytes: f64,
    /// Kendall's τ of floor vs step (1 = rises every step).
    pub trend: f64,
    pub last_floor: Option<u64>,
    /// Sizes whose live counts grow most.
    pub top_sizes: Vec<LeakSize>,
}

/// A multiplicative hasher for `u64` keys (sizes are not attacker-chosen
/// in a way that matters: the map is bounded).
#[derive(Default, Clone, Copy)]
pub(crate) struct SizeHasher(u64);

impl Hasher for SizeHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

#[derive(Debug, Clone)]
struct SizeEntry {
    live: u64,
    /// Live count at boundary `b`, at index `b % SIZE_HISTORY`.
    hist: [u32; SIZE_HISTORY],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zig {
    /// Looking for the lowest point; `lo` so far.
    Falling { lo: u64 },
    /// Climbing; `hi` so far.
    Rising { hi: u64 },
}

/// Online state of the leak heuristic for one process.
#[derive(Debug, Clone)]
pub struct LeakDetector {
    cfg: LeakConfig,
    source: StepSource,
    steps: u64,
    current: u64,
    seen_value: bool,
    zig: Zig,
    step_min: Option<u64>,
    floors: VecDeque<u64>,
    sizes: HashMap<u64, SizeEntry, BuildHasherDefault<SizeHasher>>,
    /// Distinct sizes tracked at most.
    max_sizes: usize,
    /// Allocations of a size not tracked because `max_sizes` were.
    dropped: u64,
}

impl LeakDetector {
    pub fn new(cfg: LeakConfig) -> Self {
        Self {
            floors: VecDeque::with_capacity(cfg.window_steps.min(4096)),
            cfg,
            source: StepSource::None,
            steps: 0,
            current: 0,
            seen_value: false,
            zig: Zig::Falling { lo: u64::MAX },
            step_min: None,
            sizes: HashMap::default(),
            max_sizes: MAX_SIZES,
            dropped: 0,
        }
    }

    /// Track at most `max` distinct sizes (`Bounds::leak_sizes`): a new
    /// size beyond is not tracked (and counted); idle sizes are pruned at
    /// step boundaries.
    pub fn with_max_sizes(mut self, max: usize) -> Self {
        self.max_sizes = max.max(1);
        self
    }

    /// Allocations whose size could not be tracked (the size bound).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Distinct sizes tracked now.
    pub fn tracked_sizes(&self) -> usize {
        self.sizes.len()
    }

    pub fn steps(&self) -> u64 {
        self.steps
    }
    /// The thresholds a verdict is judged against.
    pub fn config(&self) -> &LeakConfig {
        &self.cfg
    }

    pub fn source(&self) -> StepSource {
        self.source
    }
    /// The recorded floors, oldest first.
    pub fn floors(&self) -> impl Iterator<Item = u64> + '_ {
        self.floors.iter().copied()
    }

    /// A tensor of `requested` bytes came to life.
    #[inline]
    pub fn on_alloc(&mut self, requested: u64) {
        let full = self.sizes.len() >= self.max_sizes;
        if let Some(e) = self.sizes.get_mut(&requested) {
            e.live = e.live.saturating_add(1);
        } else if full {
            self.dropped = self.dropped.saturating_add(1);
        } else {
            self.sizes.insert(
                requested,
                SizeEntry {
                    live: 1,
                    hist: [0; SIZE_HISTORY],
                },
            );
        }
    }

    /// A tensor of `requested` bytes was released.
    #[inline]
    pub fn on_release(&mut self, requested: u64) {
        if let Some(e) = self.sizes.get_mut(&requested) {
            e.live = e.live.saturating_sub(1);
        }
    }

    /// Replace live counts by a recount (after a snapshot).
    pub fn recount<'a>(&mut self, allocated: impl Iterator<Item = &'a Block>) {
        for e in self.sizes.values_mut() {
            e.live = 0;
        }
        // A recount is no new allocation: sizes it cannot track are not
        // counted as dropped again.
        let dropped = self.dropped;
        for b in allocated.filter(|b| b.state == BlockState::Allocated) {
            self.on_alloc(b.requested);
        }
        self.dropped = dropped;
    }

    /// The process's allocated total changed to `value`.
    #[inline]
    pub fn on_value(&mut self, value: u64) {
        self.current = value;
        self.seen_value = true;
        match self.source {
            StepSource::Markers => {
                if let Some(m) = &mut self.step_min {
                    *m = (*m).min(value);
                }
            }
            _ => self.zigzag(value),
        }
    }

    #[inline]
    fn zigzag(&mut self, v: u64) {
        let h = self.cfg.swing_bytes.max(1);
        match &mut self.zig {
            Zig::Falling { lo } => {
                *lo = (*lo).min(v);
                if v >= lo.saturating_add(h) {
                    let floor = *lo;
                    self.zig = Zig::Rising { hi: v };
                    self.source = StepSource::Troughs;
                    self.boundary(floor);
                }
            }
            Zig::Rising { hi } => {
                *hi = (*hi).max(v);
                if v.saturating_add(h) <= *hi {
                    self.zig = Zig::Falling { lo: v };
                }
            }
        }
    }

    /// A step boundary written by the process.
    pub fn on_marker(&mut self) {
        if self.source != StepSource::Markers {
            // Markers win over inferred troughs: start over with them.
            self.source = StepSource::Markers;
            self.floors.clear();
            self.steps = 0;
            self.step_min = Some(self.current);
            return;
        }
        let floor = self.step_min.unwrap_or(self.current);
        self.boundary(floor);
        self.step_min = Some(self.current);
    }

    fn boundary(&mut self, floor: u64) {
        if self.floors.len() >= self.cfg.window_steps.max(2) {
            self.floors.pop_front();
        }
        self.floors.push_back(floor);
        let slot = (self.steps % SIZE_HISTORY as u64) as usize;
        if self.sizes.len() >= self.max_sizes {
            self.sizes
                .retain(|_, e| e.live > 0 || e.hist.iter().any(|&h| h > 0));
        }
        for e in self.sizes.values_mut() {
            e.hist[slot] = u32::try_from(e.live).unwrap_or(u32::MAX);
        }
        self.steps += 1;
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> usize {
        self.floors.capacity() * 8
            + self.sizes.capacity() * (std::mem::size_of::<(u64, SizeEntry)>() + 1)
    }

    /// The verdict. `blocks` are the process's blocks (for ages), `now_ns`
    /// the caller's clock in the writer's time base.
    pub fn report<'a>(&self, now_ns: u64, blocks: impl Iterator<Item = &'a Block>) -> LeakReport {
        let floors: Vec<f64> = self.floors.iter().map(|&f| f as f64).collect();
        let n = floors.len();
        let (slope, tau) = if n >= 2 {
            (theil_sen(&floors), kendall_tau(&floors))
        } else {
            (0.0, 0.0)
        };
        let growth = slope * (n.saturating_sub(1)) as f64;
        let flagged = n >= self.cfg.min_steps.max(2)
            && slope > 0.0
            && tau >= self.cfg.min_trend
            && growth >= self.cfg.min_growth_bytes as f64;

        // Sizes whose live counts rise across the recorded boundaries.
        let h = (self.steps as usize).min(SIZE_HISTORY);
        let mut top = Vec::new();
        if h >= self.cfg.min_steps.clamp(2, SIZE_HISTORY) {
            let first = self.steps - h as u64;
            let mut ys = vec![0f64; h];
            for (&size, e) in &self.sizes {
                let at = |b: u64| e.hist[(b % SIZE_HISTORY as u64) as usize];
                if at(self.steps - 1) <= at(first) {
                    continue;
                }
                for (i, y) in ys.iter_mut().enumerate() {
                    *y = f64::from(at(first + i as u64));
                }
                let s = theil_sen(&ys);
                if s <= 0.0 || kendall_tau(&ys) < self.cfg.min_trend {
                    continue;
                }
                top.push(LeakSize {
                    requested: size,
                    block_size: rules::round_size(size),
                    live: e.live,
                    live_growth_per_step: s,
                    live_growth: i64::from(at(self.steps - 1)) - i64::from(at(first)),
                    oldest_age_ns: None,
                });
            }
        }
        top.sort_by(|a, b| {
            let ka = a.live_growth_per_step * a.block_size as f64;
            let kb = b.live_growth_per_step * b.block_size as f64;
            b.live_growth_per_step
                .total_cmp(&a.live_growth_per_step)
                .then(kb.total_cmp(&ka))
        });
        top.truncate(self.cfg.top_sizes);
        if !top.is_empty() {
            let mut oldest: Vec<Option<u64>> = vec![None; top.len()];
            for b in blocks.filter(|b| b.state == BlockState::Allocated) {
                if let Some(i) = top.iter().position(|s| s.requested == b.requested) {
                    oldest[i] = Some(oldest[i].map_or(b.since_ns, |o| o.min(b.since_ns)));
                }
            }
            for (s, o) in top.iter_mut().zip(oldest) {
                s.oldest_age_ns = o.map(|t| now_ns.saturating_sub(t));
            }
        }
        LeakReport {
            flagged,
            source: self.source,
            steps_observed: self.steps,
            window_steps: n,
            floor_slope_bytes_per_step: slope,
            floor_growth_bytes: growth,
            trend: tau,
            last_floor: self.floors.back().copied(),
            top_sizes: top,
        }
    }
}

/// Median of pairwise slopes `(y_j − y_i) / (j − i)`.
pub fn theil_sen(ys: &[f64]) -> f64 {
    let n = ys.len();
    if n < 2 {
        return 0.0;
    }
    let mut slopes = Vec::with_capacity(n * (n - 1) / 2);
    for i in 0..n {
        for j in i + 1..n {
            slopes.push((ys[j] - ys[i]) / (j - i) as f64);
        }
    }
    slopes.sort_by(f64::total_cmp);
    let m = slopes.len();
    if m % 2 == 1 {
        slopes[m / 2]
    } else {
        (slopes[m / 2 - 1] + slopes[m / 2]) / 2.0
    }
}

/// Kendall's τ-a between index and value: +1 when every later value is higher.
pub fn kendall_tau(ys: &[f64]) -> f64 {
    let n = ys.len();
    if n < 2 {
        return 0.0;
    }
    let mut s = 0i64;
    for i in 0..n {
        for j in i + 1..n {
            s += match ys[j].total_cmp(&ys[i]) {
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
            };
        }
    }
    s as f64 / (n * (n - 1) / 2) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn robust_statistics() {
        assert_eq!(theil_sen(&[1.0, 2.0, 3.0, 4.0]), 1.0);
        // One outlier does not move the slope.
        assert_eq!(theil_sen(&[0.0, 1.0, 100.0, 3.0, 4.0]), 1.0);
        assert_eq!(kendall_tau(&[1.0, 2.0, 3.0]), 1.0);
        assert_eq!(kendall_tau(&[3.0, 2.0, 1.0]), -1.0);
        assert_eq!(kendall_tau(&[1.0, 1.0, 1.0]), 0.0);
    }

    #[test]
    fn troughs_become_floors() {
        let mut d = LeakDetector::new(LeakConfig {
            swing_bytes: 100,
            ..LeakConfig::default()
        });
        for step in 0..10u64 {
            let floor = 1_000 + step * 10;
            d.on_value(floor);
            d.on_value(floor + 500);
            d.on_value(floor + 1_000);
            d.on_value(floor + 20);
        }
        assert_eq!(d.source(), StepSource::Troughs);
        let floors: Vec<u64> = d.floors().collect();
        assert_eq!(floors[..3], [1_000, 1_010, 1_020]);
        assert_eq!(d.steps(), 10);
    }

    #[test]
    fn markers_take_over() {
        let mut d = LeakDetector::new(LeakConfig::default());
        d.on_value(5);
        d.on_marker();
        for step in 0..4u64 {
            d.on_value(100 + step);
            d.on_value(10 + step);
            d.on_value(100);
            d.on_marker();
        }
        assert_eq!(d.source(), StepSource::Markers);
        assert_eq!(d.floors().collect::<Vec<_>>(), vec![5, 11, 12, 13]);
    }
}
