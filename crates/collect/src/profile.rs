//! A run's [`Profile`] for `vramscope diff`: one process of a recording or
//! a snapshot file, taken as every command takes one
//! ([`crate::recorded::choose`]: the one asked for, else the one with the
//! most allocator events).
//!
//! 1. Its allocation requests are recovered from its events, in time order
//!    (`sim::from_events`), and replayed through the simulator with the
//!    addresses the real segments had, which gives allocated and reserved
//!    exactly after every request (PyTorch's events carry requested sizes;
//!    the blocks' sizes, and so `allocated`, come from the allocator's
//!    rules). Step markers cut the requests into steps: the job's own
//!    (`vramscope.mark`) where it has them, else the optimizer's, else any.
//!    The replay runs with the job's expandable segments when it mapped
//!    pages; a request that failed (OOM) holds nothing, and the cache is
//!    released in its place, as PyTorch releases it before it fails.
//! 2. The inputs are fed to a fresh model, cut at the time of the
//!    allocated peak and at the last step marker, and the model's
//!    attribution (phases, roles, modules) is taken at both.
//! 3. A peak is never below what the model says of the same run, which is
//!    what `open` and `replay` say of it (the state a snapshot file holds,
//!    a starting state no request shows, the job's own statistics): the
//!    peaks are the higher of the two, and where the model's allocated
//!    peak is the higher, the attribution is taken where its block map
//!    first reached it (a second reading).
//!
//! Memory: one process's events while its requests are recovered (as
//! `vramscope sim` holds them), then one [`StepFigures`] per step, at most
//! [`MAX_STEPS`].

use vramscope_core::input::EventBatch;
use vramscope_core::input::Input;
use vramscope_core::model::rundiff::{Breakdown, Profile, StepFigures};
use vramscope_core::model::{ProcessKey, ViewOptions};
use vramscope_core::sim::from_events::{recover, Mark, Recovered};
use vramscope_core::sim::trace::Request;
use vramscope_core::sim::{AllocConf, NullSink, Replay, SimConfig};
use vramscope_wire::event::MarkSource;

use crate::hub::Hub;
use crate::recorded::{choose, events_of, Source};

/// The most steps a profile keeps.
pub(crate) const MAX_STEPS: usize = 1 << 20;

/// The kinds of markers, by preference: the job's own (`vramscope.mark`),
/// the optimizer's steps, any other.
fn track_of(source: MarkSource) -> u8 {
    match source {
        MarkSource::User => 0,
        MarkSource::OptimizerStep { .. } => 1,
        _ => 2,
    }
}

/// The steps the marks of the preferred kind make, given allocated and
/// reserved after each request; and the step the request `peak` fell in.
fn steps(
    marks: &[Mark],
    figures: &[(u64, u64)],
    peak: usize,
) -> (Vec<StepFigures>, Option<u64>, Option<u64>) {
    let Some(kind) =
        (0..3).find(|k| marks.iter().filter(|m| track_of(m.source) == *k).count() >= 2)
    else {
        return (Vec::new(), None, None);
    };
    let marks: Vec<&Mark> = marks
        .iter()
        .filter(|m| track_of(m.source) == kind)
        .collect();
    let at = |k: usize| {
        k.checked_sub(1)
            .and_then(|i| figures.get(i))
            .copied()
            .unwrap_or((0, 0))
    };
    let mut out = Vec::new();
    let mut peak_step = None;
    for w in marks.windows(2) {
        let (from, to) = (w[0].at, w[1].at.min(figures.len()));
        let start = at(from);
        let (mut pa, mut pr) = start;
        for &(a, r) in figures.get(from..to).unwrap_or(&[]) {
            pa = pa.max(a);
            pr = pr.max(r);
        }
        if (from..to).contains(&peak) {
            peak_step = Some(w[0].value);
        }
        let end = at(to);
        if out.len() == MAX_STEPS {
            break;
        }
        {
            out.push(StepFigures {
                step: w[0].value,
                peak_allocated: pa,
                peak_reserved: pr,
                end_allocated: end.0,
                end_reserved: end.1,
            });
        }
    }
    // After the last mark: the step under way when the run ended.
    if let (None, Some(last)) = (peak_step, marks.last()) {
        if peak >= last.at && peak < figures.len() {
            peak_step = Some(last.value);
        }
    }
    let steady_time = marks.last().map(|m| m.time_ns);
    (out, peak_step, steady_time)
}

/// The attribution the model gives `key` now.
fn breakdown(hub: &Hub, now: u64, key: ProcessKey) -> Breakdown {
    let opts = ViewOptions {
        block_map: true,
        recent_events: 0,
        timeline: None,
    };
    let snap = hub.snapshot_at_for(now, &opts, Some(key));
    let Some(p) = snap.processes.iter().find(|p| p.key() == key) else {
        return Breakdown::default();
    };
    let a = &p.view.attribution;
    let module = |m: &str| {
        if m.is_empty() {
            "(outside every module)".to_string()
        } else {
            m.to_string()
        }
    };
    Breakdown {
        by_phase: (a.by_phase.iter())
            .map(|r| (r.phase.name().to_string(), r.bytes))
            .collect(),
        by_role: (a.roles.iter())
            .map(|r| (r.role.name().to_string(), r.bytes))
            .collect(),
        by_module: (a.by_module.iter())
            .map(|r| (module(&r.module), r.bytes))
            .collect(),
        by_module_role: (a.by_role.iter())
            .map(|r| {
                (
                    format!("{} / {}", module(&r.module), r.role.name()),
                    r.bytes,
                )
            })
            .collect(),
    }
}

/// The profile of process `pid` (else the one with the most allocator
/// events) of the inputs `source` feeds, named `name`.
pub(crate) fn profile(
    name: &str,
    pid: Option<u32>,
    source: &mut Source<'_>,
) -> Result<Profile, String> {
    profile_within(
        name,
        pid,
        source,
        vramscope_core::sim::from_events::MAX_REPLAY_EVENTS,
    )
}

/// [`profile`], refusing a process of more than `max_events` events.
pub(crate) fn profile_within(
    name: &str,
    pid: Option<u32>,
    source: &mut Source<'_>,
    max_events: u64,
) -> Result<Profile, String> {
    let (_, process) = choose(name, pid, source, max_events)?;
    // The requests are replayed from an empty allocator: a job watched
    // from mid-run would be replayed on a state it never had (as `sim`
    // says), unless it started a new run since.
    if process.mid_run && process.new_runs == 0 {
        return Err(format!(
            "{name}: {process} was already running when the recording began: its peaks and steps would not be the job's; record from before the job starts (`vramscope record` first)"
        ));
    }
    let (key, device) = (process.key, process.busiest_device());
    // Its requests, replayed (the last run, where a demo started over).
    let events = events_of(source, &process)?;
    let got = recover(events, device);
    // The job's own allocator: expandable segments where it mapped pages.
    let mut replay = Replay::new(&SimConfig {
        device,
        capacity: u64::MAX >> 8,
        alloc: AllocConf {
            expandable_segments: got.expandable,
            ..AllocConf::default()
        },
        ..SimConfig::default()
    });
    let figures = replayed(&mut replay, &got);
    let (replay_peak, peak_at) =
        figures.iter().enumerate().fold(
            (0, None),
            |(m, at), (i, f)| if f.0 > m { (f.0, Some(i)) } else { (m, at) },
        );
    let replay_peak_reserved = figures.iter().map(|f| f.1).max().unwrap_or(0);
    let (steps, mut peak_step, steady_time) =
        steps(&got.marks, &figures, peak_at.unwrap_or(usize::MAX));
    let peak_time = peak_at.and_then(|i| got.times.get(i)).copied();
    drop(figures);
    // The model, cut at those times: its attribution there, and its own
    // figures of the run.
    let cuts = [peak_time, steady_time];
    let seen = attribute(source, key, device, &cuts, None)?;
    let [mut at_peak, at_steady] = seen.at;
    // A peak is never below what the model says of the same run (what
    // `open` and `replay` say of it: the state a file holds, a starting
    // state the requests do not show, the job's own statistics). Where the
    // model's allocated peak is the higher, the attribution is taken where
    // the model reached it.
    let (model_peak, model_peak_reserved) = seen.peaks;
    if model_peak > replay_peak {
        if let Some(at) = seen.peak_piece {
            let again = attribute(source, key, device, &cuts, Some(at))?;
            if let Some((b, step)) = again.at_model_peak {
                at_peak = b;
                peak_step = step.or(peak_step);
            }
        }
    }
    let steps_dropped = (got.marks.len() as u64).saturating_sub(steps.len() as u64 + 1);
    Ok(Profile {
        name: name.to_string(),
        pid: process.host_pid,
        ns_pid: process.ns_pid(),
        cmdline: process.cmdline,
        peak_allocated: replay_peak.max(model_peak),
        peak_reserved: replay_peak_reserved.max(model_peak_reserved),
        peak_step,
        at_peak,
        steady: steps.last().copied(),
        at_steady,
        steps_dropped,
        steps,
        outside: seen.outside,
    })
}

/// Allocated and reserved after each request of `got`, replayed. A
/// request that was an out-of-memory error holds nothing, before or after:
/// the job never had it, and its allocator had released every cached
/// segment before it failed (as PyTorch does), so the replay does that in
/// its place (and in the place of the free that follows it).
fn replayed(replay: &mut Replay, got: &Recovered) -> Vec<(u64, u64)> {
    let ooms: std::collections::HashSet<usize> = got.ooms.iter().copied().collect();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(got.requests.len());
    let mut skip_free = false;
    for (i, r) in got.requests.iter().enumerate() {
        let r = if ooms.contains(&i) {
            skip_free = true;
            &Request::EmptyCache
        } else if std::mem::take(&mut skip_free) && matches!(r, Request::Free { .. }) {
            // The OOM's own free: nothing to free.
            let last = out.last().copied().unwrap_or_default();
            out.push(last);
            continue;
        } else {
            r
        };
        let s = replay.step(r, &mut NullSink);
        out.push((s.allocated, s.reserved));
    }
    out
}

/// What one reading of a run through a fresh model gives.
struct Attributed {
    /// The attribution at each cut asked for (at the end when the run
    /// never reached it; empty when there was no cut).
    at: [Breakdown; 2],
    /// The model's peak allocated and reserved of the process at the end
    /// of its last run: what `open` and `replay` say.
    peaks: (u64, u64),
    /// Where the block map's allocated on the device peaked in the last
    /// run: the piece of the process's events it peaked in (its batches
    /// cut at the cuts and at new runs, counted), and that peak.
    peak_piece: Option<(usize, u64)>,
    /// With a piece asked for: the attribution when the block map first
    /// held that much in it, and the step under way.
    at_model_peak: Option<(Breakdown, Option<u64>)>,
    /// Memory outside the caching allocator at the end, by what holds it.
    outside: Vec<(String, u64)>,
}

/// Feeds `source` to a fresh model: the attribution of `key` at each cut
/// (a time: what the events up to and including it leave), the model's own
/// peaks, and where the block map on `device` peaked; with `exact`, the
/// attribution there (see [`Attributed`]).
fn attribute(
    source: &mut Source<'_>,
    key: ProcessKey,
    device: u16,
    cuts: &[Option<u64>; 2],
    exact: Option<(usize, u64)>,
) -> Result<Attributed, String> {
    // The cuts in time order, with where each goes.
    let mut order: Vec<(u64, usize)> = (cuts.iter().enumerate())
        .filter_map(|(i, c)| Some(((*c)?, i)))
        .collect();
    order.sort_unstable();
    let hub = Hub::default();
    let mut out = Attributed {
        at: Default::default(),
        peaks: (0, 0),
        peak_piece: None,
        at_model_peak: None,
        outside: Vec::new(),
    };
    let mut taken = [false; 2];
    let mut next = 0usize;
    let mut piece = 0usize;
    let mut peak_before = 0u64;
    let mut last_t = 0;
    source(&mut |t, input| {
        last_t = t;
        let Input::Events(batch) = input else {
            hub.apply(input);
            return;
        };
        if batch.key != key {
            hub.apply(Input::Events(batch));
            return;
        }
        for (mut part, new_run) in at_runs(batch) {
            loop {
                // The events up to and including the next cut's time go
                // first; the cut is taken between the two.
                let cut = order.get(next).copied();
                let k = cut.map_or(part.events.len(), |(c, _)| {
                    part.events.partition_point(|e| e.time_ns <= c)
                });
                let whole = k == part.events.len();
                let rest = (!whole).then(|| split(&mut part, k));
                // One piece.
                match exact {
                    Some((p, want)) if p == piece && out.at_model_peak.is_none() => {
                        let events = std::mem::take(&mut part.events);
                        let at = std::mem::take(&mut part.at);
                        for (i, e) in events.into_iter().enumerate() {
                            let mut one = part.clone();
                            one.events = vec![e];
                            one.at = at.get(i).copied().into_iter().collect();
                            hub.apply(Input::Events(one));
                            if out.at_model_peak.is_none()
                                && hub.allocated_on(key, device).0 >= want
                            {
                                let b = breakdown(&hub, e.time_ns.max(t), key);
                                out.at_model_peak = Some((b, hub.step(key)));
                            }
                        }
                    }
                    _ => hub.apply(Input::Events(part)),
                }
                let (_, peak) = hub.allocated_on(key, device);
                if peak > peak_before {
                    out.peak_piece = Some((piece, peak));
                }
                peak_before = peak;
                piece += 1;
                let Some(rest) = rest else { break };
                if let Some((c, i)) = cut {
                    out.at[i] = breakdown(&hub, c.max(t), key);
                    taken[i] = true;
                    next += 1;
                }
                part = rest;
            }
            if new_run {
                // What came before is another run's: its peaks too.
                hub.reset_peaks(key);
                out.peak_piece = None;
                peak_before = hub.allocated_on(key, device).1;
            }
        }
    })?;
    // A cut at the very end (the last marker, or the peak, in the last
    // batch's last event): taken now.
    for (_, i) in order.get(next..).unwrap_or(&[]) {
        if !taken[*i] {
            out.at[*i] = breakdown(&hub, last_t, key);
        }
    }
    let opts = ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    };
    let snap = hub.snapshot_at_for(last_t, &opts, Some(key));
    if let Some(p) = snap.processes.iter().find(|p| p.key() == key) {
        out.peaks = (p.view.figures.peak_allocated, p.view.figures.peak_reserved);
        out.outside = vramscope_core::model::outside::by_what(&p.view.outside, usize::MAX);
    }
    Ok(out)
}

/// `batch` cut after each event that starts a new run: the parts, each
/// with whether it ends with such an event.
fn at_runs(mut batch: EventBatch) -> Vec<(EventBatch, bool)> {
    let mut out = Vec::new();
    while let Some(k) = batch.events.iter().position(|e| e.kind.starts_run()) {
        let rest = split(&mut batch, k + 1);
        out.push((batch, true));
        batch = rest;
    }
    out.push((batch, false));
    out
}

/// Cuts `batch` at event `k`: it keeps the first `k`, the rest is returned.
/// (What the batch lost is counted with its first part.)
fn split(batch: &mut EventBatch, k: usize) -> EventBatch {
    EventBatch {
        key: batch.key,
        events: batch.events.split_off(k.min(batch.events.len())),
        delivered: batch.delivered,
        lost: batch.lost,
        lost_now: 0,
        at: if batch.at.len() > k {
            batch.at.split_off(k)
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::input::{EventBatch, Identity, Source as InputSource};
    use vramscope_core::model::{Mode, Watch};
    use vramscope_wire::event::{Event, EventKind, Place};

    /// A process's inputs: attach, then `n` allocations a step apart.
    fn inputs(n: u64) -> Vec<(u64, Input)> {
        let key = ProcessKey {
            pid: 7,
            start_time: 1,
        };
        let mut out = vec![(
            0,
            Input::Attach {
                key,
                identity: Identity::of_pid(7),
                source: InputSource::unattached(Mode::Exact),
                watch: Watch::default(),
            },
        )];
        let events: Vec<Event> = (0..n)
            .flat_map(|i| {
                let place = Place::default();
                [
                    Event {
                        time_ns: 10 * i + 1,
                        kind: EventKind::Marker {
                            value: i,
                            source: MarkSource::User,
                        },
                    },
                    Event {
                        time_ns: 10 * i + 2,
                        kind: EventKind::SegmentAlloc {
                            place,
                            addr: (i + 1) << 30,
                            size: 2 << 20,
                        },
                    },
                    Event {
                        time_ns: 10 * i + 3,
                        kind: EventKind::Alloc {
                            place,
                            addr: (i + 1) << 30,
                            size: 1 << 20,
                        },
                    },
                ]
            })
            .collect();
        out.push((1, Input::Events(EventBatch::whole(key, events))));
        out
    }

    fn run(n: u64, max: u64) -> Result<Profile, String> {
        let all = inputs(n);
        let mut source = |apply: &mut dyn FnMut(u64, Input)| -> Result<(), String> {
            for (t, i) in all.iter().cloned() {
                apply(t, i);
            }
            Ok(())
        };
        profile_within("job", None, &mut source, max)
    }

    #[test]
    fn steps_and_peaks_come_from_the_requests() {
        let p = run(10, 1000).unwrap();
        // Each step keeps one more 1 MiB block; the replay packs two to a
        // 2 MiB segment (the figures of the steps are the allocator's
        // rules applied to the requests).
        assert_eq!(p.peak_allocated, 10 << 20);
        assert_eq!(p.steps[4].peak_reserved, 6 << 20);
        // The peak is never below what the job's own events say, as the
        // model (and `replay`) reads them: ten 2 MiB segments.
        assert_eq!(p.peak_reserved, 20 << 20);
        assert_eq!(p.steps.len(), 9);
        assert_eq!(p.steps[0].end_allocated, 1 << 20);
        assert_eq!(p.peak_step, Some(9));
    }

    #[test]
    fn a_process_over_the_bound_is_refused_before_it_is_read() {
        let e = run(10, 29).unwrap_err();
        assert!(
            e.contains("has 30 events; a replay holds at most 29"),
            "{e}"
        );
        assert!(run(10, 30).is_ok());
    }
}
