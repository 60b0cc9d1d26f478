//! Allocation requests recovered from a real process's allocator events (a
//! `vramscope record` file), so `vramscope sim --trace` can replay what a
//! job really asked for under another configuration.
//!
//! - ALLOC → an `alloc` of the caller's request on its stream; the real
//!   address names the tensor until it is freed.
//! - FREE_REQUESTED → `free` (allocated bytes drop there in PyTorch too).
//! - OOM → an `alloc` of the failed (rounded) request, never freed.
//! - SEGMENT_FREE / SEGMENT_UNMAP bursts: PyTorch releases segments in
//!   `empty_cache()` and while retrying a failed allocation. A burst followed
//!   by an ALLOC or OOM is the allocator's own retry (the simulator repeats
//!   it by itself); any other burst becomes an `empty_cache`.
//! - STATS samples are kept beside the request they follow, so a replay can
//!   be compared with what the process really had.

use std::collections::HashMap;

use crate::event::{Event, EventKind, Stats};

use super::trace::Request;

/// Requests of one device, and the statistics the process reported after
/// each one (where a sample followed it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovered {
    pub requests: Vec<Request>,
    pub recorded: Vec<Option<Stats>>,
    /// Frees of addresses never seen allocated (allocated before recording).
    pub unknown_frees: u64,
}

/// Recovers the requests made on `device` from `events` (in time order).
pub fn requests_from_events<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    device: u16,
) -> Recovered {
    let mut out = Recovered::default();
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut next_id = 1u64;
    let mut burst = false;
    let push = |out: &mut Recovered, r: Request| {
        out.requests.push(r);
        out.recorded.push(None);
    };
    for e in events {
        match &e.kind {
            EventKind::Alloc { place, addr, size } if place.device == device => {
                burst = false; // the allocator's own retry
                live.insert(*addr, next_id);
                push(
                    &mut out,
                    Request::Alloc {
                        id: next_id,
                        size: *size,
                        stream: place.stream,
                    },
                );
                next_id += 1;
            }
            EventKind::Oom { place, request, .. } if place.device == device => {
                burst = false;
                push(
                    &mut out,
                    Request::Alloc {
                        id: next_id,
                        size: *request,
                        stream: place.stream,
                    },
                );
                next_id += 1;
            }
            EventKind::FreeRequested { place, addr, .. } if place.device == device => {
                if std::mem::take(&mut burst) {
                    push(&mut out, Request::EmptyCache);
                }
                match live.remove(addr) {
                    Some(id) => push(&mut out, Request::Free { id }),
                    None => out.unknown_frees += 1,
                }
            }
            EventKind::SegmentFree { place, .. } | EventKind::SegmentUnmap { place, .. }
                if place.device == device =>
            {
                burst = true;
            }
            EventKind::Stats { device: d, stats } if *d == device => {
                if std::mem::take(&mut burst) {
                    push(&mut out, Request::EmptyCache);
                }
                if let Some(last) = out.recorded.last_mut() {
                    *last = Some(*stats);
                }
            }
            _ => {}
        }
    }
    if burst {
        push(&mut out, Request::EmptyCache);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{replay, SimAllocator, SimConfig};

    /// Events from the simulator itself, turned back into requests and
    /// replayed, give the same figures after every request.
    #[test]
    fn round_trip_through_the_simulator() {
        let cfg = SimConfig {
            capacity: 1 << 30,
            ..SimConfig::default()
        };
        let mut a = SimAllocator::new(cfg.clone());
        let mut ev: Vec<Event> = Vec::new();
        let mut held = Vec::new();
        let mut truth = Vec::new();
        for i in 0..300u64 {
            let size = (i * 7919 % 40 + 1) << 20;
            if i % 3 == 2 {
                let p: u64 = held.remove((i as usize * 13) % held.len());
                a.free(p, &mut ev).unwrap();
            } else if let Ok(p) = a.malloc(size, i % 2, &mut ev) {
                held.push(p);
            }
            if i % 50 == 49 {
                a.empty_cache(&mut ev);
            }
            a.emit_stats(&mut ev);
            truth.push(a.stats());
        }
        let got = requests_from_events(&ev, 0);
        assert_eq!(got.unknown_frees, 0);
        let reports = replay(&got.requests, &cfg);
        let mut compared = 0;
        for (r, rec) in reports.iter().zip(&got.recorded) {
            if let Some(s) = rec {
                assert_eq!(
                    (r.allocated, r.reserved, r.segments),
                    (s.allocated, s.reserved, s.segments),
                    "step {}",
                    r.step
                );
                compared += 1;
            }
        }
        assert!(compared >= 250, "{compared}");
        assert!(got.requests.contains(&Request::EmptyCache));
    }
}
