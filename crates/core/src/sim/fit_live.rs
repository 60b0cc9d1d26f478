//! "Will it fit", live (`F` in a process view): the job on screen at other
//! batch sizes, from its last two steps, without stopping it.
//!
//! The job's own replay (the advisor's, under its setting and limit) is
//! taken where the last step ended; its cache is emptied, and the step is
//! repeated [`REPS`] times ([`Repeat`]) with the allocations that scale
//! with the batch made larger or smaller. Which ones scale is what `fit`
//! reads from one recording's roles ([`super::fit`]): an allocation freed
//! within its own step (activations, temporaries) scales, unless it is one
//! of the optimizer's temporaries (made after the step's last allocation
//! that outlives it, the size of something the job keeps); what the job
//! holds (parameters, gradients, optimizer state) stays.
//!
//! The batch is not known live, so sizes are multiples of the batch the
//! job runs at, in eighths: ×½, ×1, ×2 and ×4, and the largest multiple
//! whose repetitions run out of memory nowhere under the job's limit
//! (searched by doubling, then halving the gap, to an eighth). The work is
//! bounded: [`MAX_FIT_REQUESTS`] requests replayed in all; past that the
//! largest is the largest found to fit, and said to be so.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::allocator::{NullSink, SimConfig};
use super::repeat::Repeat;
use super::trace::{Replay, Request};

/// Repetitions of the step at each batch (the first builds the cache anew;
/// the others find it built, and free what the one before kept).
pub const REPS: u64 = 3;
/// The most requests one live fit replays.
pub const MAX_FIT_REQUESTS: u64 = 1 << 20;
/// The multiples shown, in eighths of the job's batch: ×½, ×1, ×2, ×4.
pub const SHOWN: [u64; 4] = [4, 8, 16, 32];
/// The largest multiple searched: ×64.
pub const MAX_EIGHTHS: u64 = 64 * 8;

/// Where a repetition first ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitOom {
    /// The repetition (1: the first step at that batch).
    pub step: u64,
    /// What the failed allocation asked the device for.
    pub bytes: u64,
}

/// The job's step at one multiple of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FitAt {
    /// The batch as a multiple of the job's, in eighths (8: as it runs).
    pub eighths: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<FitOom>,
}

/// The live fit, as the advisor publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveFit {
    /// The job's step it was made at (its last complete one).
    pub at_step: u64,
    /// The limit replayed under (a memory fraction's, or the device's).
    pub limit: u64,
    pub fraction: bool,
    /// The step's allocations, and those that scale with the batch.
    pub allocations: usize,
    pub scaled: usize,
    /// Allocated in the job's replay when the step ended.
    pub allocated: u64,
    /// ×½, ×1, ×2, ×4 ([`SHOWN`]), as far as the budget went.
    pub predictions: Vec<FitAt>,
    /// The largest multiple (eighths) that ran out of memory nowhere
    /// (None: not even an eighth, or nothing was replayed).
    pub largest: Option<u64>,
    /// Whether the search ended (false: [`MAX_FIT_REQUESTS`] stopped it,
    /// and `largest` is the largest found to fit).
    pub searched: bool,
    /// Requests replayed.
    pub requests: u64,
    /// Why the job's steps cannot be followed (then nothing else holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cannot: Option<String>,
}

/// `k` eighths as a multiple: ×2, ×0.5, ×2.375.
pub fn times(eighths: u64) -> String {
    if eighths % 8 == 0 {
        format!("×{}", eighths / 8)
    } else {
        let s = format!("{:.3}", eighths as f64 / 8.0);
        format!("×{}", s.trim_end_matches('0'))
    }
}

/// `size` bytes at `eighths`/8 of the batch: rounded, at least 1 byte.
fn scale(size: u64, eighths: u64) -> u64 {
    let s = (u128::from(size) * u128::from(eighths) + 4) / 8;
    u64::try_from(s).unwrap_or(u64::MAX).max(1)
}

/// Per allocation of the step (by place): whether its size scales with the
/// batch. `kept` are the sizes of what the job holds.
fn scaled(repeat: &Repeat, kept: &HashSet<u64>) -> Vec<bool> {
    let allocs: Vec<(usize, u64, bool)> = repeat.allocations().collect();
    let mut kept: HashSet<u64> = kept.clone();
    kept.extend(allocs.iter().filter(|a| !a.2).map(|a| a.1));
    // The optimizer's part: after the step's last allocation that
    // outlives it (the last gradient).
    let last_kept = allocs.iter().rposition(|a| !a.2);
    let mut out = vec![false; allocs.len()];
    for (i, &(q, size, transient)) in allocs.iter().enumerate() {
        let optimizer = last_kept.is_some_and(|k| i > k) && kept.contains(&size);
        out[q] = transient && !optimizer;
    }
    out
}

/// The search over multiples, with its budget.
struct Search<'a> {
    now: &'a Replay,
    repeat: &'a Repeat,
    scaled: Vec<bool>,
    requests: u64,
    done: Vec<FitAt>,
}

impl Search<'_> {
    /// The step at `eighths` (None: over the budget).
    fn at(&mut self, eighths: u64) -> Option<FitAt> {
        if let Some(f) = self.done.iter().find(|f| f.eighths == eighths) {
            return Some(*f);
        }
        if self.requests + REPS * self.repeat.len() > MAX_FIT_REQUESTS {
            return None;
        }
        let mut r = self.now.clone();
        r.step(&Request::EmptyCache, &mut NullSink);
        r.reset_peaks();
        let scaled = &self.scaled;
        let mut oom = None;
        'steps: for step in 1..=REPS {
            let size = |q: usize, s: u64| if scaled[q] { scale(s, eighths) } else { s };
            for req in self.repeat.requests(step, size) {
                self.requests += 1;
                if let Some(e) = r.step(&req, &mut NullSink).oom {
                    oom = Some(FitOom {
                        step,
                        bytes: e.alloc_size,
                    });
                    break 'steps;
                }
            }
        }
        let s = r.stats();
        let f = FitAt {
            eighths,
            peak_reserved: s.reserved_peak,
            peak_allocated: s.allocated_peak,
            oom,
        };
        self.done.push(f);
        Some(f)
    }

    fn fits(&mut self, eighths: u64) -> Option<bool> {
        self.at(eighths).map(|f| f.oom.is_none())
    }

    /// The largest multiple that fits, and whether the search ended.
    fn largest(&mut self) -> (Option<u64>, bool) {
        let known = |d: &[FitAt], ok: bool| -> Vec<u64> {
            (d.iter().filter(|f| f.oom.is_none() == ok))
                .map(|f| f.eighths)
                .collect()
        };
        let mut lo = known(&self.done, true).into_iter().max();
        let mut hi = known(&self.done, false).into_iter().min();
        // Nothing known to fit: from an eighth.
        if lo.is_none() && hi != Some(1) {
            match self.fits(1) {
                Some(true) => lo = Some(1),
                Some(false) => return (None, true),
                None => return (None, false),
            }
        }
        let Some(mut lo) = lo else {
            return (None, true);
        };
        // Doubling to a multiple that does not fit.
        let mut hi = match hi.take() {
            Some(h) => h,
            None => loop {
                let next = (lo * 2).min(MAX_EIGHTHS);
                if next == lo {
                    return (Some(lo), true);
                }
                match self.fits(next) {
                    Some(true) => lo = next,
                    Some(false) => break next,
                    None => return (Some(lo), false),
                }
            },
        };
        // Halving the gap.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match self.fits(mid) {
                Some(true) => lo = mid,
                Some(false) => hi = mid,
                None => return (Some(lo), false),
            }
        }
        (Some(lo), true)
    }
}

/// The live fit at the step `at_step` just ended: `now` is the job's
/// replay there (under its setting and `limit`), `prev` and `last` its
/// last two steps, `kept` the sizes of the tensors it holds.
pub(crate) fn fit(
    now: &Replay,
    prev: &[Request],
    last: &[Request],
    kept: &HashSet<u64>,
    at_step: u64,
    (limit, fraction): (u64, bool),
) -> LiveFit {
    let mut out = LiveFit {
        at_step,
        limit,
        fraction,
        allocations: 0,
        scaled: 0,
        allocated: now.stats().allocated,
        predictions: Vec::new(),
        largest: None,
        searched: false,
        requests: 0,
        cannot: None,
    };
    let repeat = match Repeat::of(prev, last) {
        Ok(r) => r,
        Err(e) => {
            out.cannot = Some(e.to_string());
            return out;
        }
    };
    let scaled = scaled(&repeat, kept);
    out.allocations = scaled.len();
    out.scaled = scaled.iter().filter(|s| **s).count();
    let mut search = Search {
        now,
        repeat: &repeat,
        scaled,
        requests: 0,
        done: Vec::new(),
    };
    out.predictions = SHOWN.iter().filter_map(|&k| search.at(k)).collect();
    (out.largest, out.searched) = search.largest();
    out.requests = search.requests;
    out
}

/// The live fit a replay of a recording makes when the job's `k`-th step
/// (1-based, of the steps `ends` marks) has just ended: the requests up to
/// there replayed under `cfg` with the addresses the job's segments had,
/// then [`fit`] from its last two steps. `k` must be at least 2.
pub fn at_step(requests: &[Request], ends: &[usize], k: usize, cfg: &SimConfig) -> LiveFit {
    let limit = match cfg.memory_fraction {
        Some(f) => ((cfg.capacity as f64 * f) as u64, true),
        None => (cfg.capacity, false),
    };
    let Some(&end) = ends.get(k.wrapping_sub(1)).filter(|_| k >= 2) else {
        let mut out = fit(
            &Replay::new(cfg),
            &[],
            &[],
            &HashSet::new(),
            k as u64,
            limit,
        );
        out.cannot = Some(format!(
            "step {k} of a job with {} steps: two complete steps are needed",
            ends.len()
        ));
        return out;
    };
    let mut now = Replay::new(cfg);
    let mut held = std::collections::HashMap::new();
    for r in &requests[..end] {
        now.step(r, &mut NullSink);
        match *r {
            Request::Alloc { id, size, .. } => {
                held.insert(id, size);
            }
            Request::Free { id } => {
                held.remove(&id);
            }
            _ => {}
        }
    }
    let start = if k >= 3 { ends[k - 3] } else { 0 };
    let prev = &requests[start..ends[k - 2]];
    let last = &requests[ends[k - 2]..end];
    let kept = held.values().copied().collect();
    fit(&now, prev, last, &kept, k as u64, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn multiples_read_as_a_user_writes_them() {
        assert_eq!(times(4), "×0.5");
        assert_eq!(times(8), "×1");
        assert_eq!(times(19), "×2.375");
        assert_eq!(times(1), "×0.125");
        assert_eq!(scale(1000, 4), 500);
        assert_eq!(scale(1, 1), 1);
        assert_eq!(scale(u64::MAX, 16), u64::MAX);
    }

    /// A job: 100 MiB of weights, then steps of 4 activations (`act`
    /// bytes each, freed in the step), a gradient kept until the next
    /// step, and the optimizer's temporary of the gradient's size.
    fn job(steps: u64, act: u64) -> (Vec<Request>, Vec<usize>) {
        let mut r = Vec::new();
        let mut id = 0;
        let mut alloc = |r: &mut Vec<Request>, size| {
            id += 1;
            r.push(Request::alloc(id, size, 0));
            id
        };
        alloc(&mut r, 100 * MIB);
        let mut ends = Vec::new();
        let mut grad = None;
        for _ in 0..steps {
            let acts: Vec<u64> = (0..4).map(|_| alloc(&mut r, act)).collect();
            if let Some(g) = grad {
                r.push(Request::Free { id: g });
            }
            grad = Some(alloc(&mut r, 8 * MIB));
            for a in acts {
                r.push(Request::Free { id: a });
            }
            let tmp = alloc(&mut r, 8 * MIB);
            r.push(Request::Free { id: tmp });
            ends.push(r.len());
        }
        (r, ends)
    }

    /// The largest multiple is the largest at which the job itself, run
    /// from its start with its activations that many eighths as large,
    /// never runs out; the optimizer's temporary does not scale.
    #[test]
    fn the_largest_multiple_is_where_the_job_itself_would_run_out() {
        let cfg = SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        };
        let (r, ends) = job(4, 40 * MIB);
        let f = at_step(&r, &ends, 4, &cfg);
        assert_eq!((f.allocations, f.scaled), (6, 4), "{f:?}");
        let runs_out = |eighths: u64| {
            let (r, _) = job(6, scale(40 * MIB, eighths));
            let mut replay = Replay::new(&cfg);
            r.iter()
                .any(|q| replay.step(q, &mut NullSink).oom.is_some())
        };
        let real = (1..=MAX_EIGHTHS).take_while(|&k| !runs_out(k)).last();
        assert!(f.searched);
        assert_eq!(f.largest, real, "{f:?}");
        assert!(real.is_some_and(|k| k > 8 && k < MAX_EIGHTHS));
        for p in &f.predictions {
            assert_eq!(p.oom.is_some(), runs_out(p.eighths), "{p:?}");
        }
    }

    /// Two steps of different shapes cannot be repeated; a step too long
    /// for the budget leaves the search unfinished, and says so.
    #[test]
    fn what_cannot_be_repeated_or_searched_says_so() {
        let cfg = SimConfig::default();
        let (r, ends) = job(3, 40 * MIB);
        let f = at_step(&r, &ends, 2, &cfg);
        assert!(f.cannot.unwrap().contains("shapes change"));
        let f = at_step(&r, &ends, 9, &cfg);
        assert!(f.cannot.is_some());
        // 700,000 requests a step: not even one multiple within the budget.
        let mut long = Vec::new();
        for k in 0..2 {
            for i in 0..350_000u64 {
                let id = k * 1_000_000 + i + 1;
                long.push(Request::alloc(id, 512, 0));
                long.push(Request::Free { id });
            }
        }
        let f = fit(
            &Replay::new(&cfg),
            &long[..700_000],
            &long[700_000..],
            &HashSet::new(),
            2,
            (cfg.capacity, false),
        );
        assert!(f.cannot.is_none() && !f.searched && f.largest.is_none());
        assert!(f.predictions.is_empty() && f.requests == 0);
    }
}
