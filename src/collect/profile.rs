//! A run's [`Profile`] for `vramscope diff`: one process of a recording or
//! a snapshot file (the one asked for, else the one with the most events).
//!
//! 1. Its allocation requests are recovered from its events, in time order
//!    (`sim::from_events`), and replayed through the simulator with the
//!    addresses the real segments had, which gives allocated and reserved
//!    exactly after every request (PyTorch's events carry requested sizes;
//!    the blocks' sizes, and so `allocated`, come from the allocator's
//!    rules). Step markers cut the requests into steps: the job's own
//!    (`vramscope.mark`) where it has them, else the optimizer's, else any.
//! 2. The inputs are fed to a fresh model, cut at the time of the
//!    allocated peak and at the last step marker, and the model's
//!    attribution (phases, roles, modules) is taken at both.
//!
//! Memory: one process's events while its requests are recovered (as
//! `vramscope sim` holds them), then one [`StepFigures`] per step, at most
//! [`MAX_STEPS`].

use std::collections::BTreeMap;

use crate::event::{Event, MarkSource};
use crate::input::Input;
use crate::model::rundiff::{Breakdown, Profile, StepFigures};
use crate::model::{ProcessKey, ViewOptions};
use crate::sim::from_events::{recover, Mark};
use crate::sim::{NullSink, Replay, SimConfig};

use super::Hub;

/// The most steps a profile keeps.
pub const MAX_STEPS: usize = 1 << 20;

/// Feeds every input of the source, in order, to the closure given.
pub type Source<'a> = dyn FnMut(&mut dyn FnMut(u64, Input)) -> Result<(), String> + 'a;

/// What the first reading learns of each process.
#[derive(Debug, Default)]
struct Seen {
    events: u64,
    host_pid: u32,
    cmdline: String,
    /// Allocator events per device.
    devices: BTreeMap<u16, u64>,
    /// Watched from mid-run, and whether a new run began since.
    mid_run: bool,
    new_run: bool,
}

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

/// The profile of process `pid` (else the one with the most events) of the
/// inputs `source` feeds, named `name`.
pub fn profile(name: &str, pid: Option<u32>, source: &mut Source<'_>) -> Result<Profile, String> {
    profile_within(
        name,
        pid,
        source,
        crate::sim::from_events::MAX_REPLAY_EVENTS,
    )
}

/// [`profile`], refusing a process of more than `max_events` events.
pub(crate) fn profile_within(
    name: &str,
    pid: Option<u32>,
    source: &mut Source<'_>,
    max_events: u64,
) -> Result<Profile, String> {
    // Which process, and which of its devices.
    let mut counts: BTreeMap<ProcessKey, Seen> = BTreeMap::new();
    source(&mut |_, input| match input {
        Input::Attach {
            key,
            identity,
            watch,
            ..
        } => {
            let c = counts.entry(key).or_default();
            c.host_pid = identity.host_pid;
            c.cmdline = identity.cmdline;
            c.mid_run |= watch.mid_run;
        }
        Input::Events(b) => {
            let c = counts.entry(b.key).or_default();
            c.events += b.events.len() as u64;
            for e in &b.events {
                if let Some(p) = e.kind.place() {
                    *c.devices.entry(p.device).or_default() += 1;
                }
                c.new_run |= e.kind.starts_run();
            }
        }
        _ => {}
    })?;
    let key = match pid {
        Some(p) => (counts.iter())
            .find(|(k, c)| k.pid == p || c.host_pid == p)
            .map(|(k, _)| *k),
        None => (counts.iter())
            .max_by_key(|(_, c)| c.events)
            .map(|(k, _)| *k),
    };
    let Some((key, seen)) = key
        .and_then(|k| counts.remove(&k).map(|c| (k, c)))
        .filter(|(_, c)| c.events > 0)
    else {
        return Err(format!(
            "{name}: no events of {}",
            pid.map_or("any process".into(), |p| format!("process {p}"))
        ));
    };
    let Seen {
        events: total,
        host_pid,
        cmdline,
        devices,
        mid_run,
        new_run,
    } = seen;
    if total > max_events {
        return Err(format!(
            "{name}: process {} has {total} events; a replay holds at most {max_events} (record a shorter stretch of the job)",
            key.pid,
        ));
    }
    // The requests are replayed from an empty allocator: a job watched
    // from mid-run would be replayed on a state it never had (as `sim`
    // says), unless it started a new run since.
    if mid_run && !new_run {
        return Err(format!(
            "{name}: process {} was already running when the recording began: its peaks and steps would not be the job's; record from before the job starts (`vramscope record` first)",
            key.pid
        ));
    }
    let device = devices
        .iter()
        .max_by_key(|(_, n)| **n)
        .map_or(0, |(d, _)| *d);
    // Its requests, replayed (the last run, where a demo started over).
    let mut events: Vec<(Event, Option<crate::event::RingPos>)> = Vec::new();
    source(&mut |_, input| {
        if let Input::Events(b) = input {
            if b.key == key {
                for e in b.events {
                    if e.kind.starts_run() {
                        events.clear();
                    }
                    events.push((e, None));
                }
            }
        }
    })?;
    let got = recover(events, device);
    let mut replay = Replay::new(&SimConfig {
        device,
        capacity: u64::MAX >> 8,
        ..SimConfig::default()
    });
    let figures: Vec<(u64, u64)> = (got.requests.iter())
        .map(|r| {
            let s = replay.step(r, &mut NullSink);
            (s.allocated, s.reserved)
        })
        .collect();
    let (peak_allocated, peak_at) = figures.iter().enumerate().fold(
        (0, None),
        |(m, at), (i, f)| if f.0 > m { (f.0, Some(i)) } else { (m, at) },
    );
    let peak_reserved = figures.iter().map(|f| f.1).max().unwrap_or(0);
    let (steps, peak_step, steady_time) =
        steps(&got.marks, &figures, peak_at.unwrap_or(usize::MAX));
    let peak_time = peak_at.and_then(|i| got.times.get(i)).copied();
    drop(figures);
    // The model, cut at those times.
    let mut cuts: Vec<(u64, bool)> = [(peak_time, true), (steady_time, false)]
        .into_iter()
        .filter_map(|(t, p)| Some((t?, p)))
        .collect();
    cuts.sort_unstable();
    let hub = Hub::default();
    let mut next = 0usize;
    let (mut at_peak, mut at_steady) = (Breakdown::default(), Breakdown::default());
    let mut last_t = 0;
    source(&mut |t, input| {
        last_t = t;
        let Input::Events(mut batch) = input else {
            hub.apply(input);
            return;
        };
        if batch.key != key {
            hub.apply(Input::Events(batch));
            return;
        }
        while let Some(&(cut, is_peak)) = cuts.get(next) {
            // The events up to and including the cut's time go first.
            let k = batch.events.partition_point(|e| e.time_ns <= cut);
            if k == batch.events.len() {
                break;
            }
            let mut rest = batch.clone();
            batch.events.truncate(k);
            rest.events.drain(..k);
            if rest.at.len() >= k {
                batch.at.truncate(k);
                rest.at.drain(..k);
            }
            hub.apply(Input::Events(batch));
            let b = breakdown(&hub, cut.max(t), key);
            if is_peak {
                at_peak = b;
            } else {
                at_steady = b;
            }
            next += 1;
            batch = rest;
        }
        hub.apply(Input::Events(batch));
    })?;
    // A cut at the very end (the last marker, or the peak, in the last
    // batch's last event): taken now.
    for &(_, is_peak) in cuts.get(next..).unwrap_or(&[]) {
        let b = breakdown(&hub, last_t, key);
        if is_peak {
            at_peak = b;
        } else {
            at_steady = b;
        }
    }
    let steps_dropped = (got.marks.len() as u64).saturating_sub(steps.len() as u64 + 1);
    Ok(Profile {
        name: name.to_string(),
        pid: if host_pid != 0 { host_pid } else { key.pid },
        cmdline,
        peak_allocated,
        peak_reserved,
        peak_step,
        at_peak,
        steady: steps.last().copied(),
        at_steady,
        steps_dropped,
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, EventKind, Place};
    use crate::input::{EventBatch, Identity, Source as InputSource};
    use crate::model::{Mode, Watch};

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
        out.push((
            1,
            Input::Events(EventBatch {
                key,
                delivered: events.len() as u64,
                events,
                lost: 0,
                lost_now: 0,
                at: Vec::new(),
            }),
        ));
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
        // 2 MiB small-pool segment, as PyTorch does (the figures are the
        // allocator's rules applied to the requests).
        assert_eq!(p.peak_allocated, 10 << 20);
        assert_eq!(p.peak_reserved, 10 << 20);
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
