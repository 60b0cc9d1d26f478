//! One process of a recording, as `sim` and `advise` replay it and `diff`
//! profiles it: taken by the recording's census
//! (`vramscope_core::recording::census`: `--pid`, host or namespace pid,
//! else the most allocator events), its events read (from its last new
//! run on), and its allocation requests recovered from them
//! (`vramscope_core::sim::from_events`), with what the recording says of
//! its GPU and memory limit.
//!
//! Two readings of the source: the census, then the chosen process's
//! events (one process's, held at once: at most
//! [`MAX_REPLAY_EVENTS`]).

use vramscope_core::input::Input;
use vramscope_core::recording::census::{Census, Counted};
use vramscope_core::sim::from_events::{recover, Recovered, MAX_REPLAY_EVENTS};
use vramscope_wire::event::{Event, RingPos};

/// Feeds every input of the source, in order, to the closure given.
pub(crate) type Source<'a> = dyn FnMut(&mut dyn FnMut(u64, Input)) -> Result<(), String> + 'a;

/// One process of a recording, ready to replay.
pub struct Recorded {
    /// The process, as the census counted it.
    pub process: Counted,
    /// Its requests on the device asked for, and the statistics it
    /// reported.
    pub got: Recovered,
    /// Its GPU's total memory when the recording's NVML readings show it
    /// (bytes, NVML index).
    pub capacity: Option<(u64, u32)>,
    /// The last memory limit its agent stated for the device: bytes, and
    /// whether it is the whole device (no memory fraction).
    pub limit: Option<(u64, bool)>,
    /// What is worth saying of the reading (new runs, losses, samples
    /// placed by time, frees of tensors never seen), a line each.
    pub notes: Vec<String>,
}

/// The census of what `source` feeds, and the process it takes (`pid`,
/// else the most allocator events); refused in one line naming `name`
/// when it takes none, or one of more than `max_events` events (a replay
/// holds them all at once).
pub(crate) fn choose(
    name: &str,
    pid: Option<u32>,
    source: &mut Source<'_>,
    max_events: u64,
) -> Result<(Census, Counted), String> {
    let mut census = Census::default();
    source(&mut |_, input| census.add(&input))?;
    let process = census
        .choose(pid)
        .map_err(|e| format!("{name}: {e}"))?
        .clone();
    if process.events > max_events {
        return Err(format!(
            "{name}: {process} has {} events; a replay holds at most {max_events} (record a shorter stretch of the job)",
            process.events
        ));
    }
    Ok((census, process))
}

/// The events of `process` that `source` feeds, in the order read, with
/// their ring positions where the recording has them; from its last new
/// run on (a job that started over did so from an empty allocator).
pub(crate) fn events_of(
    source: &mut Source<'_>,
    process: &Counted,
) -> Result<Vec<(Event, Option<RingPos>)>, String> {
    let mut events = Vec::new();
    source(&mut |_, input| {
        let Input::Events(b) = input else { return };
        if b.key != process.key {
            return;
        }
        for (e, at) in b.positioned() {
            if e.kind.starts_run() {
                events.clear();
            }
            events.push((e, at));
        }
    })?;
    Ok(events)
}

/// Process `pid` (else the one with the most allocator events) of the
/// recording `source` feeds, named `name`, its requests on `device`
/// recovered. A process watched from mid-run is refused (the simulator
/// starts from an empty allocator), unless a new run of it began since.
pub(crate) fn recorded(
    name: &str,
    pid: Option<u32>,
    device: u16,
    source: &mut Source<'_>,
) -> Result<Recorded, String> {
    let (census, process) = choose(name, pid, source, MAX_REPLAY_EVENTS)?;
    let mut notes = Vec::new();
    if process.new_runs > 0 {
        notes.push(format!(
            "note: the recording holds {} runs of {process} (its scenario started over): the replay is of the last, from an empty allocator",
            process.new_runs + 1
        ));
    } else if process.mid_run {
        // The requests of a job watched from mid-run would land on a
        // state the simulator never saw (tensors freed that it never
        // allocated, a peak that is not the job's).
        return Err(format!(
            "{name}: {process} was already running when the recording began: the simulator starts from an empty allocator, so its replay would not be the job's; record from before the job starts (`vramscope record` first), or see this recording with `vramscope replay`"
        ));
    }
    let got = recover(events_of(source, &process)?, device);
    if process.lost > 0 {
        notes.push(format!(
            "note: {} records of this process were lost on the wire: their requests are missing from the replay, so samples after them may differ",
            process.lost
        ));
    }
    if got.unplaceable > 0 {
        notes.push(format!(
            "note: {} statistics samples carry ring positions that this process's events do not (events without positions, or not in ring order); they are placed by time",
            got.unplaceable
        ));
    }
    if got.unknown_frees > 0 {
        notes.push(format!(
            "note: {} frees of tensors allocated before the recording started were skipped",
            got.unknown_frees
        ));
    }
    Ok(Recorded {
        capacity: census.gpu_total(&process),
        limit: got.memory_limit(device),
        process,
        got,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::input::{EventBatch, Identity, Source as InputSource};
    use vramscope_core::model::{Mode, ProcessKey, Watch};
    use vramscope_wire::event::{EventKind, MarkSource, Place};

    /// A job in a container (host pid 4242, pid 7 inside): an allocation,
    /// a new run, then two allocations and a free, over two batches; its
    /// attach says whether it was watched from mid-run.
    fn inputs(mid_run: bool) -> Vec<Input> {
        let key = ProcessKey {
            pid: 7,
            start_time: 1,
        };
        let place = Place::default();
        let alloc = |addr| EventKind::Alloc {
            place,
            addr,
            size: 512,
        };
        let batch = |kinds: Vec<EventKind>| {
            Input::Events(EventBatch {
                key,
                delivered: kinds.len() as u64,
                events: (kinds.into_iter())
                    .map(|kind| Event { time_ns: 1, kind })
                    .collect(),
                lost: 0,
                lost_now: 0,
                at: Vec::new(),
            })
        };
        vec![
            Input::Attach {
                key,
                identity: Identity {
                    host_pid: 4242,
                    ..Identity::of_pid(7)
                },
                source: InputSource::unattached(Mode::Exact),
                watch: Watch {
                    mid_run,
                    ..Watch::default()
                },
            },
            batch(vec![
                alloc(1 << 20),
                EventKind::Marker {
                    value: 2,
                    source: MarkSource::Run,
                },
            ]),
            batch(vec![
                alloc(2 << 20),
                alloc(3 << 20),
                EventKind::FreeRequested {
                    place,
                    addr: 2 << 20,
                    size: 512,
                },
            ]),
        ]
    }

    fn source(inputs: Vec<Input>) -> impl FnMut(&mut dyn FnMut(u64, Input)) -> Result<(), String> {
        move |apply| {
            inputs.iter().cloned().for_each(|i| apply(0, i));
            Ok(())
        }
    }

    #[test]
    fn the_last_run_of_the_process_a_pid_names_is_replayed() {
        for pid in [None, Some(4242), Some(7)] {
            let got = recorded("r.vsrec", pid, 0, &mut source(inputs(false))).unwrap();
            assert_eq!(
                got.process.to_string(),
                "process 4242 (pid 7 in its namespace)"
            );
            // The last run: two allocations and a free (the marker that
            // began it holds no request).
            assert_eq!(got.got.requests.len(), 3, "{pid:?}");
            assert_eq!(got.notes.len(), 1, "{:?}", got.notes);
            assert!(got.notes[0].contains("holds 2 runs of process 4242"));
        }
        let e = recorded("r.vsrec", Some(8), 0, &mut source(inputs(false)))
            .err()
            .unwrap();
        assert_eq!(
            e,
            "r.vsrec: no process 8 in this recording; it holds events of 4242 (pid 7 in its namespace)"
        );
    }

    #[test]
    fn a_process_watched_from_mid_run_is_refused_unless_it_started_over() {
        // It started over since: its last run is replayed.
        assert!(recorded("r.vsrec", None, 0, &mut source(inputs(true))).is_ok());
        // It never did: refused.
        let mut no_new_run = inputs(true);
        no_new_run.remove(1);
        let e = recorded("r.vsrec", None, 0, &mut source(no_new_run))
            .err()
            .unwrap();
        assert!(
            e.starts_with("r.vsrec: process 4242 (pid 7 in its namespace) was already running"),
            "{e}"
        );
    }

    #[test]
    fn a_process_over_the_bound_is_refused_before_its_events_are_read() {
        let e = choose("r.vsrec", None, &mut source(inputs(false)), 4)
            .err()
            .unwrap();
        assert_eq!(
            e,
            "r.vsrec: process 4242 (pid 7 in its namespace) has 5 events; a replay holds at most 4 (record a shorter stretch of the job)"
        );
        assert!(choose("r.vsrec", None, &mut source(inputs(false)), 5).is_ok());
    }
}
