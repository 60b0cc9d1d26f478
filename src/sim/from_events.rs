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
    let mut r = Recovery {
        next_id: 1,
        ..Recovery::default()
    };
    for e in events {
        match &e.kind {
            EventKind::Alloc { place, addr, size } if place.device == device => {
                let id = r.alloc(*size, place.stream);
                r.live.insert(*addr, id);
            }
            EventKind::Oom { place, request, .. } if place.device == device => {
                r.alloc(*request, place.stream);
            }
            EventKind::FreeRequested { place, addr, .. } if place.device == device => {
                r.end_burst();
                match r.live.remove(addr) {
                    Some(id) => r.push(Request::Free { id }),
                    None => r.out.unknown_frees += 1,
                }
            }
            EventKind::SegmentFree { place, .. } | EventKind::SegmentUnmap { place, .. }
                if place.device == device =>
            {
                r.burst = true;
            }
            EventKind::Stats { device: d, stats } if *d == device => {
                r.end_burst();
                if let Some(last) = r.out.recorded.last_mut() {
                    *last = Some(*stats);
                }
            }
            _ => {}
        }
    }
    r.end_burst();
    r.out
}

/// The state of [`requests_from_events`] while it walks the events.
#[derive(Default)]
struct Recovery {
    out: Recovered,
    /// Live tensors: real address to request id.
    live: HashMap<u64, u64>,
    next_id: u64,
    /// Segments were released since the last request.
    burst: bool,
}

impl Recovery {
    fn push(&mut self, r: Request) {
        self.out.requests.push(r);
        self.out.recorded.push(None);
    }

    /// An `alloc` of `size` bytes on `stream`; returns its id. A release
    /// burst just before it was the allocator's own retry, not a request.
    fn alloc(&mut self, size: u64, stream: u64) -> u64 {
        self.burst = false;
        let id = self.next_id;
        self.next_id += 1;
        self.push(Request::Alloc { id, size, stream });
        id
    }

    /// A release burst not followed by an allocation was an `empty_cache`.
    fn end_burst(&mut self) {
        if std::mem::take(&mut self.burst) {
            self.push(Request::EmptyCache);
        }
    }
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
