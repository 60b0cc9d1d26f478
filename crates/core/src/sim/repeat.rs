//! A job's step repeated as the job repeats it, for the replays that go
//! past what the job has done: the out-of-memory forecast
//! ([`super::ahead`]) and the live "will it fit" ([`super::fit_live`]).
//!
//! - what the step allocates and frees within itself, it does again;
//! - what it frees of the step before (gradients set to `None`, outputs
//!   kept one step), the next step frees of it: the step before tells which
//!   of the step's allocations (by their place among its allocations) the
//!   next one frees;
//! - the rest of what the step allocates stays: the measured survivors,
//!   the leak.
//!
//! The two steps must allocate as many tensors (a job whose steps change
//! their shapes is not followed: [`Cannot`]).

use std::collections::HashMap;

use super::trace::Request;

/// Why the job's steps cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Cannot {
    #[error("the last step allocated nothing")]
    Empty,
    #[error("the last two steps allocate {0} and {1} tensors: their shapes change")]
    Differ(usize, usize),
}

/// One request of the step, by the places of the allocations it names.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// The step's `q`-th allocation.
    Alloc {
        q: usize,
        size: u64,
        stream: u64,
    },
    /// Frees the step's own `q`-th allocation.
    Free(usize),
    /// Frees the `q`-th allocation of the step before.
    Carried(usize),
    EmptyCache,
    Synchronize,
}

/// The allocations' ids of a step, in order, and each one's place.
fn allocations(step: &[Request]) -> (Vec<u64>, HashMap<u64, usize>) {
    let ids: Vec<u64> = step
        .iter()
        .filter_map(|r| match r {
            Request::Alloc { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let place = ids.iter().enumerate().map(|(q, id)| (*id, q)).collect();
    (ids, place)
}

/// The job's last step, ready to be repeated.
#[derive(Debug, Clone)]
pub(crate) struct Repeat {
    ops: Vec<Op>,
    /// The ids the last step's allocations had (what its first repetition
    /// frees of it).
    last_ids: Vec<u64>,
    /// Ids of the repetitions start above every id the job used.
    base: u64,
    /// Per allocation: freed within the step.
    transient: Vec<bool>,
    /// Bytes each step leaves allocated (its survivors).
    pub(crate) survivors_per_step: u64,
}

impl Repeat {
    /// `last` (the job's last complete step) repeated; `prev` is the step
    /// before it.
    pub(crate) fn of(prev: &[Request], last: &[Request]) -> Result<Repeat, Cannot> {
        let (prev_ids, prev_place) = allocations(prev);
        let (last_ids, last_place) = allocations(last);
        if last_ids.is_empty() {
            return Err(Cannot::Empty);
        }
        if prev_ids.len() != last_ids.len() {
            return Err(Cannot::Differ(prev_ids.len(), last_ids.len()));
        }
        let ops: Vec<Op> = last
            .iter()
            .filter_map(|r| match *r {
                Request::Alloc {
                    id, size, stream, ..
                } => Some(Op::Alloc {
                    q: last_place[&id],
                    size,
                    stream,
                }),
                Request::Free { id } => match (last_place.get(&id), prev_place.get(&id)) {
                    (Some(&q), _) => Some(Op::Free(q)),
                    (None, Some(&q)) => Some(Op::Carried(q)),
                    // Older than the step before: not freed again.
                    (None, None) => None,
                },
                Request::EmptyCache => Some(Op::EmptyCache),
                Request::Synchronize => Some(Op::Synchronize),
                Request::RecordStream { .. } => None,
            })
            .collect();
        // What each step leaves: its allocations neither freed in it nor by
        // the next.
        let mut stays = vec![true; last_ids.len()];
        let mut transient = vec![false; last_ids.len()];
        for op in &ops {
            match *op {
                Op::Free(q) => {
                    stays[q] = false;
                    transient[q] = true;
                }
                Op::Carried(q) => stays[q] = false,
                _ => {}
            }
        }
        let survivors_per_step = (ops.iter())
            .filter_map(|op| match *op {
                Op::Alloc { q, size, .. } if stays[q] => Some(size),
                _ => None,
            })
            .fold(0u64, u64::saturating_add);
        let base = (prev_ids.iter().chain(&last_ids).copied().max().unwrap_or(0)).saturating_add(1);
        Ok(Repeat {
            ops,
            last_ids,
            base,
            transient,
            survivors_per_step,
        })
    }

    /// Requests per repetition.
    pub(crate) fn len(&self) -> u64 {
        self.ops.len() as u64
    }

    /// The step's allocations in order: (place, size), and whether the
    /// step frees it itself.
    pub(crate) fn allocations(&self) -> impl Iterator<Item = (usize, u64, bool)> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::Alloc { q, size, .. } => Some((q, size, self.transient[q])),
            _ => None,
        })
    }

    /// The requests of repetition `step` (1: the step after the last),
    /// each allocation of `size(place, size)` bytes.
    pub(crate) fn requests<'a>(
        &'a self,
        step: u64,
        size: impl Fn(usize, u64) -> u64 + 'a,
    ) -> impl Iterator<Item = Request> + 'a {
        let n = self.last_ids.len() as u64;
        let base = self.base;
        let id = move |step: u64, q: usize| {
            base.saturating_add(step.saturating_mul(n))
                .saturating_add(q as u64)
        };
        self.ops.iter().map(move |op| match *op {
            Op::Alloc { q, size: s, stream } => Request::alloc(id(step, q), size(q, s), stream),
            Op::Free(q) => Request::Free { id: id(step, q) },
            Op::Carried(q) if step == 1 => Request::Free {
                id: self.last_ids[q],
            },
            Op::Carried(q) => Request::Free {
                id: id(step - 1, q),
            },
            Op::EmptyCache => Request::EmptyCache,
            Op::Synchronize => Request::Synchronize,
        })
    }
}
