//! The out-of-memory forecast by simulation: the job's last step replayed
//! forward through the simulator, from the state the job's own replay has
//! reached, until the allocator fails.
//!
//! Projecting reserved memory counts the cache as spent; the allocator
//! frees its cache and retries before it fails, and fragmentation decides
//! where the last request lands. So the last complete step is repeated as
//! the job repeats it ([`Repeat`]: what it frees itself, what the next step
//! frees of it, and what stays, the leak). Each repetition is a step; the
//! forecast is the repetition whose allocation fails, after the allocator
//! released its cache and retried, as PyTorch does.

use serde::{Deserialize, Serialize};

use super::allocator::{NullSink, SimConfig};
use super::repeat::{Cannot, Repeat};
use super::trace::{Replay, Request};

/// The most steps replayed forward, and the most requests in all: the
/// forecast says "not within" past either.
pub const MAX_STEPS: u64 = 10_000;
pub const MAX_REQUESTS: u64 = 1 << 20;

/// Where the replay forward failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// Steps after the last complete one: 1 is the next step.
    pub step: u64,
    /// What the failed allocation asked the device for: torch's "Tried to
    /// allocate" (the request rounded to a segment).
    pub bytes: u64,
}

/// The replay forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ahead {
    /// Where it failed (None: not within the steps replayed).
    pub failure: Option<Failure>,
    /// Steps replayed forward, and their requests.
    pub steps: u64,
    pub requests: u64,
    /// Bytes each step leaves allocated (its survivors).
    pub survivors_per_step: u64,
}

/// Replays `last` (the job's last complete step, whose requests `now` has
/// applied) forward from `now`, repeating it as the job would, until an
/// allocation fails or [`MAX_STEPS`] / [`MAX_REQUESTS`] pass; `prev` is
/// the step before it.
pub fn ahead(now: &Replay, prev: &[Request], last: &[Request]) -> Result<Ahead, Cannot> {
    let repeat = Repeat::of(prev, last)?;
    let survivors_per_step = repeat.survivors_per_step;
    let mut replay = now.clone();
    let mut requests = 0;
    for step in 1..=MAX_STEPS {
        for req in repeat.requests(step, |_, size| size) {
            requests += 1;
            let r = replay.step(&req, &mut NullSink);
            if let Some(oom) = r.oom {
                // What torch's error says it tried to allocate.
                let bytes = oom.alloc_size;
                return Ok(Ahead {
                    failure: Some(Failure { step, bytes }),
                    steps: step,
                    requests,
                    survivors_per_step,
                });
            }
        }
        // A step that leaves nothing behind, repeated twice without
        // failing, never will.
        if survivors_per_step == 0 && step >= 2 {
            return Ok(Ahead {
                failure: None,
                steps: step,
                requests,
                survivors_per_step,
            });
        }
        if requests >= MAX_REQUESTS {
            return Ok(Ahead {
                failure: None,
                steps: step,
                requests,
                survivors_per_step,
            });
        }
    }
    Ok(Ahead {
        failure: None,
        steps: MAX_STEPS,
        requests,
        survivors_per_step,
    })
}

/// The forecast a replay of a recording makes when the job's `k`-th step
/// (1-based, of the steps `ends` marks: requests before each step's end)
/// has just ended: the requests up to there replayed under `cfg` with the
/// addresses the job's segments had, then [`ahead`] from its last two
/// steps. `k` must be at least 2.
pub fn at_step(
    requests: &[Request],
    ends: &[usize],
    k: usize,
    cfg: &SimConfig,
) -> Result<Ahead, Cannot> {
    if k < 2 || k > ends.len() {
        return Err(Cannot::Empty);
    }
    let mut now = Replay::new(cfg);
    for r in &requests[..ends[k - 1]] {
        now.step(r, &mut NullSink);
    }
    let start = |i: usize| if i == 0 { 0 } else { ends[i - 1] };
    let prev = &requests[start(k - 2)..ends[k - 2]];
    let last = &requests[ends[k - 2]..ends[k - 1]];
    ahead(&now, prev, last)
}

/// The most requests one step may make for the live forecast to follow it
/// (two steps are kept, about 20 MiB at most).
pub const MAX_STEP_REQUESTS: usize = 1 << 18;
/// The forecast is made again once the job has made this many times the
/// requests the last one replayed: at most an eighth more work than the
/// replay of the job itself.
const PAYBACK: u64 = 8;

/// The live forecast by simulation, as the advisor publishes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepsAhead {
    /// The job's step it was made at (its last complete one).
    pub at_step: u64,
    /// The step whose allocation fails, and the bytes it asks for (None:
    /// none within `steps` steps).
    pub oom_step: Option<u64>,
    pub request: Option<u64>,
    /// Steps replayed forward.
    pub steps: u64,
    pub survivors_per_step: u64,
    /// The limit replayed under (bytes; a memory fraction's or the
    /// device's), and reserved memory in the replay at `at_step`.
    pub limit: u64,
    pub fraction: bool,
    pub reserved: u64,
    /// Why the simulator cannot follow the job (then nothing else holds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cannot: Option<String>,
}

/// The job's last two complete steps as they come (their requests), for
/// the live forecast.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    prev: Option<Vec<Request>>,
    last: Option<Vec<Request>>,
    current: Vec<Request>,
    /// The current step passed [`MAX_STEP_REQUESTS`] (it is not kept),
    /// and one of the two kept steps did.
    overflow: bool,
    lost: bool,
    /// Requests since the last forecast, and what that one replayed.
    since: u64,
    cost: u64,
}

impl Steps {
    pub(crate) fn request(&mut self, r: &Request) {
        self.since += 1;
        if self.overflow {
            return;
        }
        if self.current.len() >= MAX_STEP_REQUESTS {
            self.overflow = true;
            self.current = Vec::new();
            return;
        }
        self.current.push(r.clone());
    }

    /// A step ended.
    pub(crate) fn boundary(&mut self) {
        let done = std::mem::take(&mut self.current);
        let overflow = std::mem::replace(&mut self.overflow, false);
        self.lost = overflow || self.last.is_none() && self.lost;
        self.prev = self.last.take();
        self.last = (!overflow).then_some(done);
    }

    /// The last two complete steps (None: fewer seen, or one was too long).
    pub(crate) fn last_two(&self) -> Option<(&[Request], &[Request])> {
        Some((self.prev.as_deref()?, self.last.as_deref()?))
    }

    /// Work done beside the forecast, paid back as its own is.
    pub(crate) fn charge(&mut self, requests: u64) {
        self.cost = self.cost.saturating_add(requests);
    }

    /// The forecast from `now` (the job's replay under its own setting and
    /// `cfg`'s limit, at the boundary just passed, step `at_step`), when
    /// the job has paid back the last one's cost; None when it is not due.
    pub(crate) fn forecast(
        &mut self,
        now: &Replay,
        at_step: u64,
        limit: u64,
        fraction: bool,
    ) -> Option<StepsAhead> {
        if self.since.saturating_mul(PAYBACK) < self.cost {
            return None;
        }
        let reserved = now.stats().reserved;
        let mut out = StepsAhead {
            at_step,
            oom_step: None,
            request: None,
            steps: 0,
            survivors_per_step: 0,
            limit,
            fraction,
            reserved,
            cannot: None,
        };
        let (Some(prev), Some(last)) = (&self.prev, &self.last) else {
            // Fewer than two steps seen: not yet; one too long: say so.
            out.cannot = self
                .lost
                .then(|| format!("a step made more than {MAX_STEP_REQUESTS} requests"));
            return out.cannot.is_some().then_some(out);
        };
        self.since = 0;
        match ahead(now, prev, last) {
            Ok(a) => {
                self.cost = a.requests;
                out.oom_step = a.failure.map(|f| at_step.saturating_add(f.step));
                out.request = a.failure.map(|f| f.bytes);
                out.steps = a.steps;
                out.survivors_per_step = a.survivors_per_step;
            }
            Err(e) => out.cannot = Some(e.to_string()),
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::allocator::SimConfig;

    const MIB: u64 = 1 << 20;

    /// A step of the job: `acts` activations freed in it, one gradient
    /// freed by the next step, and `leak` bytes kept for good (none: 0).
    fn step(first: u64, acts: usize, leak: u64, prev_grad: Option<u64>) -> (Vec<Request>, u64) {
        let mut r = Vec::new();
        let mut id = first;
        let mut alloc = |r: &mut Vec<Request>, size| {
            id += 1;
            r.push(Request::alloc(id, size, 0));
            id
        };
        if let Some(g) = prev_grad {
            r.push(Request::Free { id: g });
        }
        if leak > 0 {
            alloc(&mut r, leak);
        }
        let a: Vec<u64> = (0..acts).map(|_| alloc(&mut r, 20 * MIB)).collect();
        let g = alloc(&mut r, 8 * MIB);
        for a in a {
            r.push(Request::Free { id: a });
        }
        (r, g)
    }

    /// `n` steps from an empty allocator under `cap` bytes: the replay at
    /// the end and the last two steps.
    fn job(n: usize, leak: u64, cap: u64) -> (Replay, Vec<Request>, Vec<Request>) {
        let cfg = SimConfig {
            capacity: cap,
            ..SimConfig::default()
        };
        let mut replay = Replay::new(&cfg);
        let mut grad = None;
        let mut steps = Vec::new();
        for k in 1..=n as u64 {
            let (r, g) = step(k * 100, 4, leak, grad);
            grad = Some(g);
            for q in &r {
                replay.step(q, &mut NullSink);
            }
            steps.push(r);
        }
        let last = steps.pop().unwrap();
        (replay, steps.pop().unwrap(), last)
    }

    /// A 40 MiB leak under 1 GiB: the step whose allocation fails is the
    /// one a replay of the whole job fails at.
    #[test]
    fn a_leak_fails_where_the_whole_job_would() {
        let (now, prev, last) = job(5, 40 * MIB, 1 << 30);
        let a = ahead(&now, &prev, &last).unwrap();
        assert_eq!(a.survivors_per_step, 40 * MIB);
        let f = a.failure.unwrap();
        // The job itself, step after step, until an allocation fails.
        let mut replay = Replay::new(&SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        });
        let (mut grad, mut k) = (None, 0u64);
        let (failed_at, tried) = loop {
            k += 1;
            let (r, g) = step(k * 100, 4, 40 * MIB, grad);
            grad = Some(g);
            let oom = r.iter().find_map(|q| replay.step(q, &mut NullSink).oom);
            if let Some(oom) = oom {
                break (k, oom.alloc_size);
            }
        };
        assert_eq!((5 + f.step, f.bytes), (failed_at, tried));
    }

    /// A step that leaves nothing stops after two repetitions; two steps
    /// of different shapes cannot be followed.
    #[test]
    fn a_steady_job_never_fails_and_changing_steps_are_refused() {
        let (now, prev, last) = job(4, 0, 1 << 30);
        let a = ahead(&now, &prev, &last).unwrap();
        assert_eq!((a.failure, a.steps, a.survivors_per_step), (None, 2, 0));
        let (other, _) = step(9000, 6, 0, None);
        assert_eq!(ahead(&now, &other, &last), Err(Cannot::Differ(7, 5)));
        assert_eq!(ahead(&now, &prev, &[]), Err(Cannot::Empty));
    }

    /// The live steps: none before two steps, one too long is said, and
    /// the forecast waits until the job has paid for the last one.
    #[test]
    fn the_live_steps_pay_back_and_say_what_they_cannot_follow() {
        let (now, prev, last) = job(5, 40 * MIB, 1 << 30);
        let mut s = Steps::default();
        assert_eq!(s.forecast(&now, 5, 1 << 30, false), None);
        for r in &prev {
            s.request(r);
        }
        s.boundary();
        for r in &last {
            s.request(r);
        }
        s.boundary();
        let f = s.forecast(&now, 5, 1 << 30, false).unwrap();
        assert!(f.oom_step.is_some() && f.cannot.is_none(), "{f:?}");
        // Just made: not again until the job made an eighth as many.
        assert_eq!(s.forecast(&now, 5, 1 << 30, false), None);
        for _ in 0..=MAX_STEP_REQUESTS {
            s.request(&Request::Synchronize);
        }
        s.boundary();
        let f = s.forecast(&now, 6, 1 << 30, false).unwrap();
        assert!(f.cannot.unwrap().contains("more than"));
    }
}
