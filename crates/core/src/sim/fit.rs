//! "Will it fit": a job's peak memory at other batch sizes, and the largest
//! batch that fits a limit, by replaying predicted steps through the
//! simulator (`vramscope fit`).
//!
//! A [`Shape`] is the job's requests with each allocation's size as a law
//! of the batch, `size = a + b·batch`:
//!
//! - from **two recordings** of the job at two batch sizes
//!   ([`Shape::two_runs`]): their steps are matched request by request
//!   (the same kind of request at each place, each free freeing the
//!   allocation at the same place), and each allocation's two sizes give
//!   its line;
//! - from **one recording** ([`Shape::roles`]): the roles' lifetime rule
//!   says which allocations depend on the batch. A block born and freed
//!   within one step is an activation or a temporary: its size scales with
//!   the batch. One that outlives its step (parameters, gradients, optimizer
//!   state, buffers, what the job keeps) stays as it is.
//!
//! [`predict`] replays the requests at a batch under a setting and a limit
//! (segments placed where the driver puts them: the recorded addresses
//! mean nothing at another batch); [`largest_batch`] searches the largest
//! batch whose replay runs out of memory nowhere.

use std::collections::HashMap;

use serde::Serialize;

use super::allocator::{NullSink, SimConfig};
use super::from_events::{step_ends, Mark};
use super::trace::{Replay, Request};

/// The largest batch `fit` considers (searching, or asked for with `--at`).
pub const MAX_BATCH: u64 = 1 << 20;

/// One recording of the job: its batch, its requests on one device and its
/// markers.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    pub batch: u64,
    pub requests: &'a [Request],
    pub marks: &'a [Mark],
}

/// How the sizes at other batches were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Two recordings at two batch sizes, matched request by request.
    TwoRuns,
    /// One recording, scaled where the roles say the batch matters.
    Roles,
}

/// Why a shape could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error("the recording has no steps (no step marks: an optimizer step hook, vramscope.mark(), or steps the agent inferred)")]
    NoSteps,
    #[error("batch {0} is out of range (1 to {MAX_BATCH})")]
    Batch(u64),
    #[error("both recordings are at batch {0}: two runs need two batch sizes")]
    SameBatch(u64),
    #[error("the recordings' steps do not match: {0}")]
    Mismatch(String),
}

/// The size of one allocation as a law of the batch: `a + b·batch`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Law {
    a: f64,
    b: f64,
}

impl Law {
    fn fixed(size: u64) -> Law {
        Law {
            a: size as f64,
            b: 0.0,
        }
    }

    /// Through `(x1, y1)` and `(x2, y2)`; `x1 != x2`.
    fn through(x1: u64, y1: u64, x2: u64, y2: u64) -> Law {
        let b = (y2 as f64 - y1 as f64) / (x2 as f64 - x1 as f64);
        Law {
            a: y1 as f64 - b * x1 as f64,
            b,
        }
    }

    /// The size at `batch`: rounded, at least 1 byte, at most `u64::MAX`
    /// (a huge batch saturates; the replay then runs out of memory).
    fn at(&self, batch: u64) -> u64 {
        let s = (self.a + self.b * batch as f64).round();
        if s.is_nan() || s < 1.0 {
            1
        } else if s >= u64::MAX as f64 {
            u64::MAX
        } else {
            s as u64
        }
    }
}

/// The job's requests with a size law for each allocation.
#[derive(Debug, Clone)]
pub struct Shape {
    pub method: Method,
    /// The complete steps the shape covers.
    pub steps: usize,
    /// Requests in them (and before the first).
    pub requests: usize,
    /// The allocations whose size depends on the batch.
    pub scaled: usize,
    /// The batches the shape was made from.
    pub from: Vec<u64>,
    /// Two runs: the requests of the template and of the other run that
    /// the matching left out (the first are scaled by the roles' rule, the
    /// second are not replayed).
    pub unmatched: (usize, usize),
    template: Vec<Request>,
    /// The batch of the recording whose requests are the template.
    pub template_batch: u64,
    /// Requests before the end of each step.
    ends: Vec<usize>,
    /// Per request of `template` (None for anything but an allocation).
    laws: Vec<Option<Law>>,
}

/// Per request, the index of the request that allocated what it frees
/// (frees and record-streams; None for the rest, or an id never seen
/// allocated).
fn targets(requests: &[Request]) -> Vec<Option<usize>> {
    let mut live: HashMap<u64, usize> = HashMap::new();
    requests
        .iter()
        .enumerate()
        .map(|(i, r)| match r {
            Request::Alloc { id, .. } => {
                live.insert(*id, i);
                None
            }
            Request::Free { id } => live.remove(id),
            Request::RecordStream { id, .. } => live.get(id).copied(),
            Request::EmptyCache | Request::Synchronize => None,
        })
        .collect()
}

/// Requests the matching looks ahead over, at most (in both runs
/// together), to find where two runs match again; and how many must match
/// in a row there.
const SKIP: usize = 160;
const AGAIN: usize = 8;
/// The most times the matching may look ahead (each looks at most
/// `SKIP²/2` places), and the most requests of either run it may leave out
/// (a share): past either, the runs are not one job's.
const RESYNCS: usize = 1024;
const MAX_LEFT_OUT: f64 = 0.1;

/// The pairs (template index, other index) of requests that match between
/// `big` (the template, at batch `bb`) and `small` (the other run, at
/// `bs`; either batch may be the larger), in order. Two requests
/// match when they are of the same kind and, for allocations, the size at
/// the larger batch is no smaller and at most a quarter more than the
/// batches' ratio times the size at the smaller. Frees match frees
/// whatever they free: a job releases the same tensors in another order
/// from one run to the next (graph teardown), and a replay of the template
/// frees its own. Where they stop matching, the first place ahead (up to
/// [`SKIP`] requests, in either run) where [`AGAIN`] match in a row
/// resumes it: a larger batch may replace a few requests with others (a
/// kernel chosen for the size, with a workspace of its own).
fn align(
    big: &[Request],
    small: &[Request],
    bs: u64,
    bb: u64,
) -> Result<Vec<(usize, usize)>, FitError> {
    let ratio = bb.max(bs) as f64 / bb.min(bs) as f64;
    let matches = |i: usize, j: usize| -> bool {
        match (&big[i], &small[j]) {
            (Request::Alloc { size: sb, .. }, Request::Alloc { size: ss, .. }) => {
                let (hi, lo) = if bb > bs { (*sb, *ss) } else { (*ss, *sb) };
                let (hi, lo) = (hi as f64, lo as f64);
                hi >= lo && hi <= lo * ratio * 1.25 + 4096.0
            }
            (Request::Free { .. }, Request::Free { .. })
            | (Request::RecordStream { .. }, Request::RecordStream { .. })
            | (Request::EmptyCache, Request::EmptyCache)
            | (Request::Synchronize, Request::Synchronize) => true,
            _ => false,
        }
    };
    // Whether `AGAIN` requests match in a row from (i, j) (or up to the
    // end of either run).
    let again = |i: usize, j: usize| -> bool {
        (0..AGAIN)
            .take_while(|k| i + k < big.len() && j + k < small.len())
            .all(|k| matches(i + k, j + k))
    };
    let (mut i, mut j, mut resyncs) = (0, 0, 0);
    let mut pairs = Vec::with_capacity(big.len().min(small.len()));
    while i < big.len() && j < small.len() {
        if matches(i, j) {
            pairs.push((i, j));
            (i, j) = (i + 1, j + 1);
            continue;
        }
        resyncs += 1;
        // The nearest place ahead where they match again: `d` requests
        // further in all, split between the two runs.
        let found = (1..=SKIP).find_map(|d| {
            (0..=d)
                .map(|e| (i + e, j + d - e))
                .find(|&(a, b)| a < big.len() && b < small.len() && again(a, b))
        });
        match found {
            Some(at) if resyncs <= RESYNCS => (i, j) = at,
            _ => {
                return Err(FitError::Mismatch(format!(
                    "request {} at batch {bb} and request {} at batch {bs} differ, and the requests after them do not match again",
                    i + 1,
                    j + 1
                )))
            }
        }
    }
    let left_out = |n: usize| (n - pairs.len()) as f64 > MAX_LEFT_OUT * n as f64;
    if left_out(big.len()) || left_out(small.len()) {
        return Err(FitError::Mismatch(format!(
            "only {} of {} requests at batch {bb} and {} at batch {bs} match",
            pairs.len(),
            big.len(),
            small.len()
        )));
    }
    Ok(pairs)
}

/// Per request, the size law of the roles' lifetime rule at `batch`: an
/// allocation freed in the step it was made in (`ends`: requests before
/// each step's end) scales with the batch; any other stays.
fn lifetime_laws(requests: &[Request], ends: &[usize], batch: u64) -> Vec<Option<Law>> {
    let step_of = |i: usize| ends.partition_point(|&e| e <= i);
    let mut laws: Vec<Option<Law>> = requests
        .iter()
        .map(|r| match r {
            Request::Alloc { size, .. } => Some(Law::fixed(*size)),
            _ => None,
        })
        .collect();
    let transient: Vec<usize> = (targets(requests).into_iter().enumerate())
        .filter_map(|(i, t)| match (t, &requests[i]) {
            (Some(t), Request::Free { .. }) if step_of(t) == step_of(i) => Some(t),
            _ => None,
        })
        .collect();
    // The sizes of what outlives its step: parameters, gradients, optimizer
    // state. A temporary of one of those sizes made after the step's last
    // gradient is the optimizer's, shaped like them, not like the batch.
    let is_transient: std::collections::HashSet<usize> = transient.iter().copied().collect();
    let kept: std::collections::HashSet<u64> = (requests.iter().enumerate())
        .filter(|(i, _)| !is_transient.contains(i))
        .filter_map(|(_, r)| match r {
            Request::Alloc { size, .. } => Some(*size),
            _ => None,
        })
        .collect();
    // Where each step's optimizer part begins: after its last allocation
    // that outlives it (the last gradient).
    let mut last_kept = vec![None; ends.len() + 1];
    for (i, r) in requests.iter().enumerate() {
        if matches!(r, Request::Alloc { .. }) && !is_transient.contains(&i) {
            last_kept[step_of(i)] = Some(i);
        }
    }
    for t in transient {
        let optimizer = last_kept[step_of(t)].is_some_and(|k| t > k);
        if let Some(law) = &mut laws[t] {
            if !(optimizer && kept.contains(&(law.a as u64))) {
                *law = Law {
                    a: 0.0,
                    b: law.a / batch as f64,
                };
            }
        }
    }
    laws
}

/// The request without what belongs to the recording's own run: the
/// segment address the real allocator chose.
fn unplaced(r: &Request) -> Request {
    match r {
        Request::Alloc {
            id,
            size,
            stream,
            released_before,
            ..
        } => Request::Alloc {
            id: *id,
            size: *size,
            stream: *stream,
            segment_addr: None,
            released_before: *released_before,
        },
        other => other.clone(),
    }
}

fn check_batch(batch: u64) -> Result<u64, FitError> {
    if (1..=MAX_BATCH).contains(&batch) {
        Ok(batch)
    } else {
        Err(FitError::Batch(batch))
    }
}

impl Shape {
    /// From two recordings of the job at two batch sizes, matched request
    /// by request over the steps both have; `x`'s requests are the
    /// template (predict with the template nearer the batch: [`nearest`]).
    /// One batch may make requests the other does not (a kernel chosen for
    /// the size needs a workspace): the matching steps over such a run of
    /// requests ([`align`]), and requests of the template left unmatched
    /// are scaled by the roles' rule ([`Shape::roles`]). Recordings whose
    /// requests mostly do not match (other jobs, other steps) are refused.
    pub fn two_runs(x: Run<'_>, y: Run<'_>) -> Result<Shape, FitError> {
        check_batch(x.batch)?;
        check_batch(y.batch)?;
        if x.batch == y.batch {
            return Err(FitError::SameBatch(x.batch));
        }
        let (big, small) = (x, y);
        let (mb, ms) = (step_ends(big.marks), step_ends(small.marks));
        let steps = mb.len().min(ms.len());
        if steps == 0 {
            return Err(FitError::NoSteps);
        }
        let (rb, rs) = (
            &big.requests[..mb[steps - 1]],
            &small.requests[..ms[steps - 1]],
        );
        let pairs = align(rb, rs, small.batch, big.batch)?;
        let mut laws = lifetime_laws(rb, &mb[..steps], big.batch);
        for &(i, j) in &pairs {
            if let (Request::Alloc { size: sb, .. }, Request::Alloc { size: ss, .. }) =
                (&rb[i], &rs[j])
            {
                laws[i] = Some(Law::through(small.batch, *ss, big.batch, *sb));
            }
        }
        let scaled = laws.iter().flatten().filter(|l| l.b != 0.0).count();
        Ok(Shape {
            method: Method::TwoRuns,
            steps,
            requests: rb.len(),
            scaled,
            from: vec![small.batch.min(big.batch), small.batch.max(big.batch)],
            unmatched: (rb.len() - pairs.len(), rs.len() - pairs.len()),
            template_batch: big.batch,
            template: rb.iter().map(unplaced).collect(),
            ends: mb[..steps].to_vec(),
            laws,
        })
    }

    /// From one recording: allocations born and freed within one step scale
    /// with the batch; the rest stay.
    pub fn roles(run: Run<'_>) -> Result<Shape, FitError> {
        check_batch(run.batch)?;
        let marks = step_ends(run.marks);
        let Some(&end) = marks.last() else {
            return Err(FitError::NoSteps);
        };
        let requests = &run.requests[..end];
        let laws = lifetime_laws(requests, &marks, run.batch);
        let scaled = laws.iter().flatten().filter(|l| l.b != 0.0).count();
        Ok(Shape {
            method: Method::Roles,
            steps: marks.len(),
            requests: requests.len(),
            scaled,
            from: vec![run.batch],
            unmatched: (0, 0),
            template_batch: run.batch,
            template: requests.iter().map(unplaced).collect(),
            ends: marks,
            laws,
        })
    }

    /// The requests at `batch`.
    pub fn requests_at(&self, batch: u64) -> impl Iterator<Item = Request> + '_ {
        self.template
            .iter()
            .zip(&self.laws)
            .map(move |(r, law)| match (r, law) {
                (Request::Alloc { .. }, Some(law)) => {
                    let mut r = r.clone();
                    if let Request::Alloc { size, .. } = &mut r {
                        *size = law.at(batch);
                    }
                    r
                }
                _ => r.clone(),
            })
    }

    /// What the job holds that does not depend on the batch, at the end of
    /// its steps: the sum of the allocations never freed whose size stays
    /// (parameters, optimizer state and the like).
    pub fn fixed_bytes(&self) -> u64 {
        let freed: std::collections::HashSet<usize> =
            targets(&self.template).into_iter().flatten().collect();
        (self.template.iter().zip(&self.laws).enumerate())
            .filter(|(i, _)| !freed.contains(i))
            .filter_map(|(_, (_, law))| law.filter(|l| l.b == 0.0))
            .map(|l| l.at(1))
            .fold(0u64, u64::saturating_add)
    }
}

/// The replay of the job at one batch size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prediction {
    pub batch: u64,
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Requests that ran out of memory.
    pub ooms: u64,
    /// The first one: its request's index (1-based), its step and the
    /// bytes asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_oom: Option<FirstOom>,
}

/// Where a replay first ran out of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    pub request: usize,
    pub step: usize,
    pub bytes: u64,
}

/// Of shapes of one job, the one whose template's batch is nearest to
/// `batch` (by ratio): its structure is the likeliest at that batch.
pub fn nearest(shapes: &[Shape], batch: u64) -> &Shape {
    let far = |s: &Shape| (batch as f64 / s.template_batch as f64).ln().abs();
    shapes
        .iter()
        .min_by(|a, b| far(a).total_cmp(&far(b)))
        .expect("at least one shape")
}

/// Replays the job at `batch` under `cfg` (its capacity, fraction and
/// setting).
pub fn predict(shape: &Shape, batch: u64, cfg: &SimConfig) -> Prediction {
    let mut replay = Replay::new(cfg).ignoring_addresses();
    let (mut ooms, mut first_oom) = (0, None);
    for (i, req) in shape.requests_at(batch).enumerate() {
        let r = replay.step(&req, &mut NullSink);
        if r.oom.is_some() {
            ooms += 1;
            if first_oom.is_none() {
                let bytes = match req {
                    Request::Alloc { size, .. } => size,
                    _ => 0,
                };
                first_oom = Some(FirstOom {
                    request: i + 1,
                    step: shape.ends.partition_point(|&e| e <= i) + 1,
                    bytes,
                });
            }
        }
    }
    let s = replay.stats();
    Prediction {
        batch,
        peak_reserved: s.reserved_peak,
        peak_allocated: s.allocated_peak,
        ooms,
        first_oom,
    }
}

/// The largest batch (at most `max`) whose replay under `cfg` (with the
/// [`nearest`] of `shapes`) runs out of memory nowhere, searched as a binary search over the batch (the
/// memory a step needs grows with the batch); None when even batch 1 runs
/// out. `tried` gets every replay made.
pub fn largest_batch(
    shapes: &[Shape],
    cfg: &SimConfig,
    max: u64,
    tried: &mut Vec<Prediction>,
) -> Option<u64> {
    let max = max.clamp(1, MAX_BATCH);
    let fits = |b: u64, tried: &mut Vec<Prediction>| {
        let p = predict(nearest(shapes, b), b, cfg);
        let ok = p.ooms == 0;
        tried.push(p);
        ok
    };
    if !fits(1, tried) {
        return None;
    }
    // Doubling to a batch that does not fit, then halving the gap.
    let mut lo = 1;
    let mut hi = loop {
        let next = (lo * 2).min(max);
        if next == lo {
            return Some(lo);
        }
        if !fits(next, tried) {
            break next;
        }
        lo = next;
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid, tried) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_wire::event::MarkSource;

    const MIB: u64 = 1 << 20;

    /// A training job at `batch`: four 1 MiB parameters, then per step
    /// three activations of `batch` × 256 KiB (freed in the step), four
    /// gradients (freed at the next step's start), two optimizer
    /// temporaries of a parameter's size, and the step's mark. With
    /// `workspace`, batches of 16 and more also take a 64 KiB workspace
    /// each step (a kernel chosen for the size).
    fn job(batch: u64, steps: usize, workspace: bool) -> (Vec<Request>, Vec<Mark>) {
        let mut r = Vec::new();
        let mut marks = Vec::new();
        let mut id = 0;
        let mut alloc = |r: &mut Vec<Request>, size: u64| {
            id += 1;
            r.push(Request::alloc(id, size, 0));
            id
        };
        for _ in 0..4 {
            alloc(&mut r, MIB);
        }
        let mut grads: Vec<u64> = Vec::new();
        for _ in 0..steps {
            for g in grads.drain(..) {
                r.push(Request::Free { id: g });
            }
            let acts: Vec<u64> = (0..3).map(|_| alloc(&mut r, batch * 256 * 1024)).collect();
            if workspace && batch >= 16 {
                let w = alloc(&mut r, 64 * 1024);
                r.push(Request::Free { id: w });
            }
            for a in acts.into_iter().rev() {
                grads.push(alloc(&mut r, MIB));
                r.push(Request::Free { id: a });
            }
            grads.push(alloc(&mut r, MIB));
            let temps: Vec<u64> = (0..2).map(|_| alloc(&mut r, MIB)).collect();
            for t in temps {
                r.push(Request::Free { id: t });
            }
            marks.push(Mark {
                at: r.len(),
                source: MarkSource::OptimizerStep { optimizer: 1 },
                value: marks.len() as u64 + 1,
                time_ns: 0,
            });
        }
        (r, marks)
    }

    fn cfg(capacity: u64) -> SimConfig {
        SimConfig {
            capacity,
            ..SimConfig::default()
        }
    }

    /// The replay of the job itself at `batch`.
    fn real(batch: u64, capacity: u64) -> Prediction {
        let (r, m) = job(batch, 4, true);
        let shape = Shape::roles(Run {
            batch,
            requests: &r,
            marks: &m,
        })
        .unwrap();
        predict(&shape, batch, &cfg(capacity))
    }

    #[test]
    fn laws_go_through_both_points_and_stay_in_range() {
        let l = Law::through(8, 1000, 16, 1800);
        assert_eq!((l.at(8), l.at(16), l.at(32)), (1000, 1800, 3400));
        assert_eq!(l.at(1), 300);
        let shrinking = Law::through(8, 100, 16, 10);
        assert_eq!(shrinking.at(64), 1, "never below 1 byte");
        assert_eq!(Law::fixed(1 << 40).at(MAX_BATCH), 1 << 40);
        let huge = Law::through(1, 1, 2, u64::MAX / 2);
        assert_eq!(huge.at(MAX_BATCH), u64::MAX, "saturates");
    }

    /// Optimizer steps are the steps when there are any; a second
    /// optimizer's, new runs and memory limits are not steps.
    #[test]
    fn step_marks_prefer_the_first_optimizer() {
        let m = |at, source| Mark {
            at,
            source,
            value: 0,
            time_ns: 0,
        };
        let marks = [
            m(1, MarkSource::User),
            m(2, MarkSource::OptimizerStep { optimizer: 1 }),
            m(3, MarkSource::OptimizerStep { optimizer: 2 }),
            m(4, MarkSource::Run),
            m(5, MarkSource::OptimizerStep { optimizer: 1 }),
        ];
        assert_eq!(step_ends(&marks), vec![2, 5]);
        assert_eq!(step_ends(&marks[..1]), vec![1]);
        assert!(step_ends(&marks[3..4]).is_empty());
    }

    /// Two runs at 8 and 16 (the larger one with a workspace the smaller
    /// lacks) predict the job at 32 exactly, from either template.
    #[test]
    fn two_runs_predict_the_job_at_another_batch() {
        let (a, ma) = job(8, 4, true);
        let (b, mb) = job(16, 4, true);
        let (x, y) = (
            Run {
                batch: 8,
                requests: &a,
                marks: &ma,
            },
            Run {
                batch: 16,
                requests: &b,
                marks: &mb,
            },
        );
        let shapes = [
            Shape::two_runs(y, x).unwrap(),
            Shape::two_runs(x, y).unwrap(),
        ];
        assert_eq!(shapes[0].unmatched, (8, 0), "the workspace, twice a step");
        assert_eq!(shapes[0].from, vec![8, 16]);
        let want = real(32, 1 << 40);
        assert_eq!(predict(nearest(&shapes, 32), 32, &cfg(1 << 40)), want);
        assert_eq!(nearest(&shapes, 4).template_batch, 8);
        // One run, by roles: the same job.
        let one = Shape::roles(x).unwrap();
        assert_eq!(one.scaled, 4 * 3);
        assert_eq!(
            one.fixed_bytes(),
            8 * MIB,
            "the parameters and the last gradients"
        );
        assert_eq!(predict(&one, 32, &cfg(1 << 40)).peak_allocated, {
            let (r, m) = job(32, 4, false);
            let s = Shape::roles(Run {
                batch: 32,
                requests: &r,
                marks: &m,
            })
            .unwrap();
            predict(&s, 32, &cfg(1 << 40)).peak_allocated
        });
    }

    /// The largest batch the search finds is the one trying every batch
    /// finds; below the parameters, none.
    #[test]
    fn the_largest_batch_is_the_one_trying_finds() {
        let (a, ma) = job(8, 3, false);
        let run = Run {
            batch: 8,
            requests: &a,
            marks: &ma,
        };
        let shapes = [Shape::roles(run).unwrap()];
        for capacity in [40 * MIB, 100 * MIB, 333 * MIB] {
            let mut tried = Vec::new();
            let got = largest_batch(&shapes, &cfg(capacity), MAX_BATCH, &mut tried);
            let brute = (1..=2000u64)
                .take_while(|&b| predict(&shapes[0], b, &cfg(capacity)).ooms == 0)
                .last();
            assert_eq!(got, brute, "capacity {capacity}");
            assert!(tried.len() < 40, "{} replays", tried.len());
        }
        let mut tried = Vec::new();
        assert_eq!(
            largest_batch(&shapes, &cfg(MIB), MAX_BATCH, &mut tried),
            None
        );
        // A limit no batch reaches: the most fit searches.
        assert_eq!(
            largest_batch(&shapes, &cfg(1 << 60), 64, &mut tried),
            Some(64)
        );
    }

    /// What cannot be fitted says why: no steps, a batch out of range, two
    /// runs at one batch, two jobs that do not match.
    #[test]
    fn what_cannot_be_fitted_says_why() {
        let (a, ma) = job(8, 3, false);
        let run = |batch, marks: &'static [Mark]| Run {
            batch,
            requests: &[],
            marks,
        };
        assert_eq!(Shape::roles(run(8, &[])).unwrap_err(), FitError::NoSteps);
        assert_eq!(Shape::roles(run(0, &[])).unwrap_err(), FitError::Batch(0));
        let x = Run {
            batch: 8,
            requests: &a,
            marks: &ma,
        };
        assert_eq!(Shape::two_runs(x, x).unwrap_err(), FitError::SameBatch(8));
        // Another job: only frees, as many steps.
        let other: Vec<Request> = (0..a.len() as u64).map(|id| Request::Free { id }).collect();
        let y = Run {
            batch: 16,
            requests: &other,
            marks: &ma,
        };
        assert!(matches!(Shape::two_runs(x, y), Err(FitError::Mismatch(_))));
    }
}
