//! A recording's census: the processes it holds, each counted once, and
//! the one a command takes. `sim`, `advise`, `export` and `diff` all
//! choose by it, so a pid names the same process in each, and each says
//! the same when it names none.
//!
//! A process is keyed by its [`ProcessKey`] (the pid it sees itself as,
//! in its own pid namespace, and its start time) and known by its host
//! pid too (the pid in the recorder's namespace, from its `Attach`): in a
//! container the two differ, and `--pid` takes either. The choice:
//!
//! - `--pid P`: the process whose host pid is P, else the one whose
//!   namespace pid is P (a pid on the command line is first read in the
//!   user's own namespace); of several (a pid used again), the first in
//!   the order below. It must have events.
//! - else the process with the most allocator events (ALLOC through OOM,
//!   what a replay or an export is made of), then the most events of any
//!   kind, then the lowest key.
//!
//! Fed every input of a recording in order ([`Census::add`]); no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::input::Input;
use crate::model::ProcessKey;

/// The most processes a message lists.
const LISTED: usize = 10;

/// What a recording holds, process by process.
#[derive(Debug, Default)]
pub struct Census {
    processes: BTreeMap<ProcessKey, Counted>,
    /// NVML's total memory of each GPU (by NVML index).
    totals: BTreeMap<u32, u64>,
    /// The GPUs (NVML indices) NVML saw each host pid on.
    seen_on: BTreeMap<u32, BTreeSet<u32>>,
}

/// One process of a recording, as the census counted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub key: ProcessKey,
    /// Its pid in the recorder's namespace (`key.pid` where the recording
    /// does not say).
    pub host_pid: u32,
    pub cmdline: String,
    /// What its producer said it runs (`torch 2.11.0`).
    pub framework: Option<String>,
    /// Its events, of every kind.
    pub events: u64,
    /// Its allocator events (ALLOC through OOM), per device.
    allocator: BTreeMap<u16, u64>,
    /// It was already running when the recording began.
    pub mid_run: bool,
    /// The new runs of the job that began (MARKER source 5).
    pub new_runs: u64,
    /// Its records lost on the wire (the most any of its batches said).
    pub lost: u64,
}

impl Counted {
    fn new(key: ProcessKey) -> Self {
        Counted {
            key,
            host_pid: key.pid,
            cmdline: String::new(),
            framework: None,
            events: 0,
            allocator: BTreeMap::new(),
            mid_run: false,
            new_runs: 0,
            lost: 0,
        }
    }

    /// The pid it sees itself as.
    pub fn ns_pid(&self) -> u32 {
        self.key.pid
    }

    /// Its allocator events on every device.
    fn allocator_events(&self) -> u64 {
        self.allocator.values().sum()
    }

    /// The device it made the most allocator events on (0 when none).
    pub fn busiest_device(&self) -> u16 {
        (self.allocator.iter())
            .max_by_key(|(_, n)| **n)
            .map_or(0, |(d, _)| *d)
    }
}

/// A process's pids as a list names them: `4242`, or `4242 (pid 7 in its
/// namespace)`.
fn pids(host_pid: u32, ns_pid: u32) -> String {
    if host_pid == ns_pid {
        host_pid.to_string()
    } else {
        format!("{host_pid} (pid {ns_pid} in its namespace)")
    }
}

/// How every command names a process: `process 4242`, or `process 4242
/// (pid 7 in its namespace)` where the pid it sees itself as differs.
pub fn name(host_pid: u32, ns_pid: u32) -> String {
    format!("process {}", pids(host_pid, ns_pid))
}

/// [`name`].
impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&name(self.host_pid, self.key.pid))
    }
}

/// Why no process was chosen (the file's name goes before it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unchosen {
    #[error("no process in this recording has events")]
    Empty,
    #[error("no process {pid} in this recording; it holds events of {holds}")]
    NotThere { pid: u32, holds: String },
    #[error("{process} has no events in this recording; it holds events of {holds}")]
    NoEvents { process: String, holds: String },
}

impl Census {
    /// Counts one input of the recording.
    pub fn add(&mut self, input: &Input) {
        match input {
            Input::Attach {
                key,
                identity,
                source,
                watch,
            } => {
                let c = self.entry(*key);
                if identity.host_pid != 0 {
                    c.host_pid = identity.host_pid;
                }
                c.cmdline.clone_from(&identity.cmdline);
                c.framework.clone_from(&source.framework);
                c.mid_run |= watch.mid_run;
            }
            Input::Events(b) => {
                let c = self.entry(b.key);
                c.events += b.events.len() as u64;
                c.lost = c.lost.max(b.lost);
                for e in &b.events {
                    if let Some(p) = e.kind.place() {
                        *c.allocator.entry(p.device).or_default() += 1;
                    }
                    c.new_runs += u64::from(e.kind.starts_run());
                }
            }
            Input::Machine { machine, .. } => {
                for g in &machine.gpus {
                    if let Some(t) = g.total {
                        self.totals.insert(g.index, t);
                    }
                }
                for p in &machine.processes {
                    self.seen_on.entry(p.pid).or_default().insert(p.gpu);
                }
            }
            _ => {}
        }
    }

    fn entry(&mut self, key: ProcessKey) -> &mut Counted {
        self.processes
            .entry(key)
            .or_insert_with(|| Counted::new(key))
    }

    /// Every process, in key order.
    fn processes(&self) -> impl Iterator<Item = &Counted> {
        self.processes.values()
    }

    /// The processes with events, the one taken by default first.
    fn ranked(&self) -> Vec<&Counted> {
        let mut v: Vec<&Counted> = self.processes().filter(|c| c.events > 0).collect();
        v.sort_by_key(|c| {
            (
                std::cmp::Reverse(c.allocator_events()),
                std::cmp::Reverse(c.events),
                c.key,
            )
        });
        v
    }

    /// The process `pid` names (its host pid, else its namespace pid),
    /// else the one with the most allocator events (see the module's
    /// text).
    pub fn choose(&self, pid: Option<u32>) -> Result<&Counted, Unchosen> {
        let ranked = self.ranked();
        let Some(pid) = pid else {
            return ranked.first().copied().ok_or(Unchosen::Empty);
        };
        let by_host = ranked.iter().find(|c| c.host_pid == pid);
        if let Some(c) = by_host.or_else(|| ranked.iter().find(|c| c.ns_pid() == pid)) {
            return Ok(c);
        }
        if ranked.is_empty() {
            return Err(Unchosen::Empty);
        }
        let holds = list(&ranked);
        match self
            .processes()
            .find(|c| c.host_pid == pid || c.ns_pid() == pid)
        {
            Some(c) => Err(Unchosen::NoEvents {
                process: c.to_string(),
                holds,
            }),
            None => Err(Unchosen::NotThere { pid, holds }),
        }
    }

    /// The total memory of `c`'s GPU, and its NVML index, where the
    /// recording's NVML readings show it: the one GPU NVML saw the process
    /// on, else the machine's only GPU.
    pub fn gpu_total(&self, c: &Counted) -> Option<(u64, u32)> {
        let gpu = match self.seen_on.get(&c.host_pid) {
            Some(gpus) if gpus.len() == 1 => gpus.first().copied(),
            _ if self.totals.len() == 1 => self.totals.keys().next().copied(),
            _ => None,
        };
        gpu.and_then(|g| self.totals.get(&g).map(|&t| (t, g)))
    }
}

/// `4242 (pid 7 in its namespace), 5151`, at most [`LISTED`] of them.
fn list(ranked: &[&Counted]) -> String {
    let mut s: Vec<String> = (ranked.iter().take(LISTED))
        .map(|c| pids(c.host_pid, c.ns_pid()))
        .collect();
    if ranked.len() > LISTED {
        s.push(format!("and {} more", ranked.len() - LISTED));
    }
    s.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::{EventBatch, Gpu, GpuProcess, Identity, Machine, Source};
    use crate::model::{Mode, Watch};
    use vramscope_wire::event::{Event, EventKind, MarkSource, Place};

    impl Census {
        /// The census of `inputs`, in order.
        fn of(inputs: &[Input]) -> Census {
            let mut c = Census::default();
            inputs.iter().for_each(|i| c.add(i));
            c
        }
    }

    fn key(pid: u32) -> ProcessKey {
        ProcessKey { pid, start_time: 1 }
    }

    fn attach(key: ProcessKey, host_pid: u32) -> Input {
        Input::Attach {
            key,
            identity: Identity {
                host_pid,
                ns_pid: key.pid,
                cmdline: format!("job{}", key.pid),
                ..Identity::default()
            },
            source: Source::unattached(Mode::Exact),
            watch: Watch::default(),
        }
    }

    /// `allocs` allocations on `device` and `marks` markers of `key`.
    fn events(key: ProcessKey, device: u16, allocs: u64, marks: u64) -> Input {
        let place = Place {
            device,
            ..Place::default()
        };
        let alloc = (0..allocs).map(|i| EventKind::Alloc {
            place,
            addr: i << 20,
            size: 512,
        });
        let mark = (0..marks).map(|i| EventKind::Marker {
            value: i,
            source: MarkSource::User,
        });
        let events: Vec<Event> = (alloc.chain(mark))
            .map(|kind| Event { time_ns: 1, kind })
            .collect();
        Input::Events(EventBatch::whole(key, events))
    }

    /// A containerised job (host 4242, pid 7 inside) with the most
    /// allocator events, a host process (5151) with more events, and an
    /// attached process with none (6000).
    fn census() -> Census {
        Census::of(&[
            attach(key(7), 4242),
            attach(key(5151), 5151),
            attach(key(6000), 6000),
            events(key(7), 0, 5, 0),
            events(key(5151), 0, 2, 50),
        ])
    }

    #[test]
    fn the_default_is_the_most_allocator_events_then_the_most_events() {
        let c = census();
        let job = c.choose(None).unwrap();
        assert_eq!(
            (job.host_pid, job.ns_pid(), job.allocator_events()),
            (4242, 7, 5)
        );
        assert_eq!(job.to_string(), "process 4242 (pid 7 in its namespace)");
        assert_eq!(job.cmdline, "job7");
        // Equal allocator events: the more events.
        let c = Census::of(&[events(key(1), 0, 3, 0), events(key(2), 0, 3, 1)]);
        assert_eq!(c.choose(None).unwrap().key, key(2));
        // Equal in both: the lower key.
        let c = Census::of(&[events(key(2), 0, 3, 1), events(key(1), 0, 3, 1)]);
        assert_eq!(c.choose(None).unwrap().key, key(1));
        // Events but no allocator events (markers only): still taken.
        let c = Census::of(&[attach(key(9), 9), events(key(9), 0, 0, 3)]);
        assert_eq!(c.choose(None).unwrap().key, key(9));
    }

    #[test]
    fn a_host_pid_and_a_namespace_pid_name_the_same_process() {
        let c = census();
        assert_eq!(c.choose(Some(4242)).unwrap().key, key(7));
        assert_eq!(c.choose(Some(7)).unwrap().key, key(7));
        assert_eq!(c.choose(Some(5151)).unwrap().key, key(5151));
        // A host process whose pid is the job's namespace pid (7, another
        // start time): `--pid 7` is the host's, though the job is busier.
        let later = ProcessKey {
            pid: 7,
            start_time: 2,
        };
        let c = Census::of(&[
            attach(key(7), 4242),
            events(key(7), 0, 9, 0),
            attach(later, 7),
            events(later, 0, 1, 0),
        ]);
        assert_eq!(c.choose(Some(7)).unwrap().key, later);
        assert_eq!(c.choose(Some(4242)).unwrap().key, key(7));
        assert_eq!(c.choose(None).unwrap().key, key(7));
    }

    #[test]
    fn a_pid_not_there_or_without_events_names_those_that_are() {
        let c = census();
        let holds = "4242 (pid 7 in its namespace), 5151";
        assert_eq!(
            c.choose(Some(999)).unwrap_err().to_string(),
            format!("no process 999 in this recording; it holds events of {holds}")
        );
        assert_eq!(
            c.choose(Some(6000)).unwrap_err().to_string(),
            format!("process 6000 has no events in this recording; it holds events of {holds}")
        );
        assert_eq!(Census::default().choose(None), Err(Unchosen::Empty));
        assert_eq!(
            Census::of(&[attach(key(3), 3)]).choose(Some(3)),
            Err(Unchosen::Empty)
        );
        // A long list is cut.
        let many: Vec<Input> = (1..=12).map(|p| events(key(p), 0, p as u64, 0)).collect();
        let e = Census::of(&many).choose(Some(99)).unwrap_err().to_string();
        assert!(
            e.ends_with("events of 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, and 2 more"),
            "{e}"
        );
    }

    #[test]
    fn devices_runs_losses_and_the_gpu_are_counted() {
        let mut lost = events(key(7), 1, 4, 0);
        if let Input::Events(b) = &mut lost {
            b.lost = 3;
            b.events.push(Event {
                time_ns: 2,
                kind: EventKind::Marker {
                    value: 2,
                    source: MarkSource::Run,
                },
            });
        }
        let gpu = |index, total| Gpu {
            index,
            name: "H200".into(),
            uuid: None,
            total: Some(total),
            used: None,
            free: None,
            util_gpu: None,
            util_mem: None,
            temperature_c: None,
            power_w: None,
        };
        let machine = Input::Machine {
            machine: Machine {
                gpus: vec![gpu(0, 80), gpu(1, 40)],
                processes: vec![GpuProcess {
                    pid: 4242,
                    gpu: 1,
                    used: None,
                }],
                ..Machine::default()
            },
            host_pids: vec![],
            fresh: vec![],
        };
        let c = Census::of(&[attach(key(7), 4242), events(key(7), 0, 1, 0), lost, machine]);
        let job = c.choose(None).unwrap();
        assert_eq!(job.busiest_device(), 1);
        assert_eq!((job.new_runs, job.lost, job.events), (1, 3, 6));
        assert_eq!(c.gpu_total(job), Some((40, 1)));
    }
}
