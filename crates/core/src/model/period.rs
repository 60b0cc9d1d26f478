//! Steps of a loop with no markers, found from the allocation pattern.
//!
//! A training or inference loop makes the same allocations, in the same
//! order, every step. The finder keeps the requested sizes of the last
//! allocations and, now and then, looks for the smallest lag `g` at which
//! the sequence repeats: the share of allocations whose size equals the
//! size `g` allocations later (the *match* of `g`). Candidate lags are the
//! typical gaps between two allocations of one size. A sub-step pattern
//! (one of many identical layers) repeats too, but the step's own
//! allocations around it (inputs, embeddings, the loss) break it at every
//! step, so its match is lower than the step's; a pattern spanning several
//! steps matches as well as the step but is longer, and the smallest lag
//! within [`TIE`] of the best match wins.
//!
//! Once a period is found, a step boundary is an allocation of the
//! *anchor*: a size allocated once per period at regular gaps. Confidence
//! is the period's match times the share of the anchor's gaps within 5 %
//! of the period: 1.0 for a loop that repeats exactly.

use std::collections::HashMap;
use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Allocations kept for the analysis (a period of up to a third of this).
const WINDOW: usize = 1 << 15;
/// A period must repeat with at least this match to be taken.
const MIN_MATCH: f64 = 0.8;
/// Lags whose match is within this of the best count as equally good.
const TIE: f64 = 0.01;
/// Candidate lags tested per analysis.
const MAX_CANDIDATES: usize = 24;
/// Pairs compared per candidate lag.
const MATCH_PAIRS: usize = 8192;
/// Distinct sizes considered per analysis.
const MAX_SIZES: usize = 4096;

/// A period found in the allocation stream.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct Period {
    /// Allocations per step.
    pub(crate) allocations: u64,
    /// The size allocated once per step, whose allocation starts a step.
    pub(crate) anchor_size: u64,
    /// How sure: the period's match × the anchor's regularity (0..1).
    pub(crate) confidence: f64,
}

/// What an allocation told about steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// These steps ended (usually none or one).
    Steps(Vec<FoundStep>),
    /// A period was found or replaced: the steps so far are these.
    Recount(Vec<FoundStep>),
}

/// A step that ended: the lowest allocated total seen during it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FoundStep {
    pub(crate) floor: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct PeriodFinder {
    /// (requested size, allocated total after the allocation), newest last.
    window: VecDeque<(u64, u64)>,
    /// Allocations seen.
    seen: u64,
    next_analysis: u64,
    period: Option<Period>,
    /// The last analysis found the period already in use.
    stable: bool,
    /// Allocations since the last boundary, and the lowest total since.
    since_boundary: u64,
    low: Option<u64>,
}

impl Default for PeriodFinder {
    fn default() -> Self {
        Self {
            window: VecDeque::new(),
            seen: 0,
            next_analysis: 256,
            period: None,
            stable: false,
            since_boundary: 0,
            low: None,
        }
    }
}

impl PeriodFinder {
    pub(crate) fn period(&self) -> Option<Period> {
        self.period
    }

    /// Heap bytes held (the window; the analysis's tables are temporary).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.window.capacity() * std::mem::size_of::<(u64, u64)>()
    }

    /// An allocation of `size` bytes, after which `allocated` bytes are
    /// allocated; the allocated total may also change between allocations
    /// ([`on_value`](Self::on_value)). Returns the steps that ended: one at
    /// an anchor allocation; when a period is found, or replaced by a
    /// different one (a sub-step pattern is often seen first), every step
    /// in the window so far, to be counted instead of the earlier ones.
    pub(crate) fn on_alloc(&mut self, size: u64, allocated: u64) -> Found {
        if self.window.len() >= WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((size, allocated));
        self.seen += 1;
        let mut out = Found::Steps(Vec::new());
        if let Some(p) = self.period {
            if size == p.anchor_size && self.since_boundary * 2 >= p.allocations {
                if let (Found::Steps(v), Some(floor)) = (&mut out, self.low) {
                    v.push(FoundStep { floor });
                }
                self.since_boundary = 0;
                self.low = None;
            }
        }
        self.since_boundary += 1;
        self.on_value(allocated);
        if self.seen >= self.next_analysis {
            let found = analyse(self.window.make_contiguous());
            let changed = match (self.period, found) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some(a), Some(b)) => {
                    a.anchor_size != b.anchor_size
                        || a.allocations.abs_diff(b.allocations) * 20 > a.allocations
                }
            };
            if let Some(p) = found {
                self.period = Some(p);
            }
            if changed {
                out = Found::Recount(self.steps_in_window());
            }
            // Often at first (the period should be found within a few
            // steps, and a sub-step pattern replaced), then, once the same
            // period was found twice in a row, once a window.
            self.stable = !changed && found.is_some();
            let every = if self.stable {
                WINDOW as u64
            } else {
                self.seen.min(WINDOW as u64 / 2)
            };
            self.next_analysis = self.seen + every.max(256);
        }
        out
    }

    /// The allocated total changed (a free, or any event).
    pub(crate) fn on_value(&mut self, allocated: u64) {
        self.low = Some(self.low.map_or(allocated, |l| l.min(allocated)));
    }

    /// When a period is first found: the steps already in the window, each
    /// from one anchor allocation to the next, and the boundary state set
    /// at the last anchor.
    fn steps_in_window(&mut self) -> Vec<FoundStep> {
        let Some(p) = self.period else {
            return Vec::new();
        };
        let mut steps = Vec::new();
        let mut low: Option<u64> = None;
        let mut since = 0u64;
        let mut started = false;
        for &(size, value) in &self.window {
            if size == p.anchor_size && since * 2 >= p.allocations {
                if let (true, Some(floor)) = (started, low) {
                    steps.push(FoundStep { floor });
                }
                started = true;
                low = None;
                since = 0;
            }
            since += 1;
            low = Some(low.map_or(value, |l| l.min(value)));
        }
        self.since_boundary = since;
        self.low = low;
        steps
    }
}

/// The period of `w` (sizes, totals), if it repeats clearly enough.
fn analyse(w: &[(u64, u64)]) -> Option<Period> {
    let n = w.len();
    let mut at: HashMap<u64, Vec<u32>> = HashMap::new();
    for (i, &(size, _)) in w.iter().enumerate() {
        if let Some(v) = at.get_mut(&size) {
            v.push(i as u32);
        } else if at.len() < MAX_SIZES {
            at.insert(size, vec![i as u32]);
        }
    }
    // Candidate lags: the median gap of each regularly recurring size.
    let mut candidates: Vec<(u64, f64)> = at
        .values()
        .filter(|v| v.len() >= 3)
        .filter_map(|v| regular_gap(v))
        .filter(|&(g, _)| g >= 2 && (g as usize) * 3 <= n)
        .collect();
    candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut lags: Vec<u64> = Vec::new();
    for (g, _) in candidates {
        if !lags.contains(&g) {
            lags.push(g);
        }
        if lags.len() >= MAX_CANDIDATES {
            break;
        }
    }
    let scored: Vec<(u64, f64)> = lags.iter().map(|&g| (g, matches(w, g as usize))).collect();
    let best = scored.iter().map(|s| s.1).fold(0.0, f64::max);
    if best < MIN_MATCH {
        return None;
    }
    let (lag, m) = scored
        .iter()
        .filter(|s| s.1 + TIE >= best)
        .min_by_key(|s| s.0)
        .copied()?;
    // The anchor: a size recurring once per period, the most regular
    // (then the largest: big allocations are the most specific).
    let anchor = at
        .iter()
        .filter_map(|(&size, v)| {
            let (g, reg) = regular_gap(v)?;
            let once = g.abs_diff(lag) * 20 <= lag && v.len() as u64 * lag <= n as u64 + lag;
            once.then_some((size, reg))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))?;
    let gap = regular_gap(&at[&anchor.0]).map_or(lag, |g| g.0);
    Some(Period {
        allocations: gap,
        anchor_size: anchor.0,
        confidence: (m * anchor.1).clamp(0.0, 1.0),
    })
}

/// The median gap between successive positions, and the share of gaps
/// within 5 % of it.
fn regular_gap(at: &[u32]) -> Option<(u64, f64)> {
    let mut gaps: Vec<u64> = at.windows(2).map(|p| u64::from(p[1] - p[0])).collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    let g = gaps[gaps.len() / 2];
    let near = gaps.iter().filter(|&&x| x.abs_diff(g) * 20 <= g).count();
    Some((g, near as f64 / gaps.len() as f64))
}

/// The share of allocations whose size equals the size `lag` later, give or
/// take one allocation (an occasional extra allocation shifts the rest of
/// the step by one; it should not make the period look broken).
fn matches(w: &[(u64, u64)], lag: usize) -> f64 {
    // The newest pairs only: enough to judge, and the cost of an analysis
    // stays bounded whatever the window.
    let pairs = w.len().saturating_sub(lag + 1).min(MATCH_PAIRS);
    let w = &w[w.len() - pairs - lag - 1..];
    if pairs == 0 {
        return 0.0;
    }
    let near = |i: usize| (lag - 1..=lag + 1).any(|l| w[i].0 == w[i + l].0);
    let same = (0..pairs).filter(|&i| near(i)).count();
    same as f64 / pairs as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop of `steps` steps: an input, `layers` identical layers of
    /// `per_layer` allocations, a head; `extra` adds an allocation every
    /// 10th step (logging).
    fn run(steps: u64, layers: u64, per_layer: u64, extra: bool) -> (PeriodFinder, u64) {
        let mut f = PeriodFinder::default();
        let mut found = 0u64;
        let mut total = 1_000_000u64;
        for s in 0..steps {
            let mut alloc = |size: u64, f: &mut PeriodFinder| {
                total += size;
                match f.on_alloc(size, total) {
                    Found::Steps(v) => found += v.len() as u64,
                    Found::Recount(v) => found = v.len() as u64,
                }
            };
            alloc(4096, &mut f); // the input batch
            for _ in 0..layers {
                for j in 0..per_layer {
                    alloc(1 << (10 + j), &mut f);
                }
            }
            alloc(50_000, &mut f); // logits
            if extra && s % 10 == 0 {
                alloc(77, &mut f);
            }
            total = 1_000_000;
            f.on_value(total);
        }
        (f, found)
    }

    #[test]
    fn a_deep_stack_of_identical_layers_is_one_step_not_many() {
        let (f, found) = run(400, 48, 4, false);
        let p = f.period().expect("a period");
        assert_eq!(p.allocations, 48 * 4 + 2);
        assert!(p.confidence > 0.95, "{p:?}");
        // Every step but the first and the one still running.
        assert!(found.abs_diff(399) <= 1, "{found}");
    }

    #[test]
    fn an_allocation_every_tenth_step_does_not_make_steps_ten_times_longer() {
        let (f, found) = run(600, 6, 3, true);
        let p = f.period().expect("a period");
        assert_eq!(p.allocations, 6 * 3 + 2, "{p:?}");
        assert!(found.abs_diff(599) <= 12, "{found}");
    }

    #[test]
    fn noise_has_no_period() {
        let mut f = PeriodFinder::default();
        let mut x = 7u64;
        for _ in 0..20_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            f.on_alloc(512 * (1 + (x >> 40) % 5000), 0);
        }
        assert_eq!(f.period(), None);
    }
}
