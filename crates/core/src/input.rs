//! What sources tell the hub: the one recordable way in. Every live source
//! (segments, NVML, `/proc`) and every replay speaks in [`Input`]s; a
//! recording (`crate::recording`) is a sequence of them. Plain data,
//! serde-serialisable, no I/O.

use serde::{Deserialize, Deserializer, Serialize};

use crate::model::{Mode, ProcessKey, Watch};
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{Event, EventKind};

/// Text from a recording (names, command lines, labels, messages) is made
/// printable as it is read: a crafted recording cannot put terminal escapes
/// on the screen (see [`vramscope_text::printable`]).
pub fn printable<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    String::deserialize(d).map(|s| vramscope_text::printable(&s))
}

fn printable_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Option::<String>::deserialize(d).map(|s| s.map(|s| vramscope_text::printable(&s)))
}

/// One GPU as NVML sees it. A value NVML could not read is `None`, never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub index: u32,
    #[serde(deserialize_with = "printable")]
    pub name: String,
    #[serde(default, deserialize_with = "printable_opt")]
    pub uuid: Option<String>,
    pub total: Option<u64>,
    pub used: Option<u64>,
    pub free: Option<u64>,
    /// Percent of time a kernel ran over the last sample period.
    pub util_gpu: Option<u32>,
    /// Percent of time device memory was read or written.
    pub util_mem: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
}

/// NVML's view of one process on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    /// Host pid (NVML reports host pids).
    pub pid: u32,
    pub gpu: u32,
    pub used: Option<u64>,
}

/// The NVML side of the picture.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Machine {
    /// `None` while NVML works; else why it is unavailable, in one line.
    #[serde(default, deserialize_with = "printable_opt")]
    pub nvml_error: Option<String>,
    #[serde(default, deserialize_with = "printable_opt")]
    pub driver_version: Option<String>,
    pub gpus: Vec<Gpu>,
    pub processes: Vec<GpuProcess>,
    /// When NVML was last read (collector's monotonic ns).
    pub sampled_ns: Option<u64>,
    /// The host side of the processes shown (from `/proc`), read with NVML.
    /// Absent from recordings made before it (and left out when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<HostProcess>,
}

/// A process's host figures, as `htop` and `nvitop` show them: CPU use
/// since the previous reading (100 = one core), resident memory, and how
/// long it has run. A figure that could not be read is absent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct HostProcess {
    /// Host pid.
    pub pid: u32,
    pub cpu_percent: Option<f64>,
    pub rss: Option<u64>,
    pub elapsed_ns: Option<u64>,
}

/// Who a process is, from `/proc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Identity {
    /// The pid in the dashboard's pid namespace (the host pid).
    pub host_pid: u32,
    /// The pid the process sees itself as (differs inside containers).
    pub ns_pid: u32,
    #[serde(deserialize_with = "printable")]
    pub name: String,
    #[serde(deserialize_with = "printable")]
    pub cmdline: String,
    #[serde(deserialize_with = "printable")]
    pub user: String,
    pub uid: Option<u32>,
    /// The producer's label from its segment (script name, scenario).
    #[serde(deserialize_with = "printable")]
    pub label: String,
    /// Still running.
    pub alive: bool,
}

impl Identity {
    /// What is known of a process that `/proc` could not describe: its pid.
    pub fn of_pid(pid: u32) -> Self {
        Identity {
            host_pid: pid,
            ns_pid: pid,
            ..Identity::default()
        }
    }
}

/// Where a process's figures come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Source {
    pub mode: Mode,
    /// The segment file, for instrumented and simulated processes.
    #[serde(default, deserialize_with = "printable_opt")]
    pub segment: Option<String>,
    /// Producer kind and framework, e.g. `TorchExact`, `torch 2.11.0+cu130`.
    #[serde(default, deserialize_with = "printable_opt")]
    pub producer: Option<String>,
    #[serde(default, deserialize_with = "printable_opt")]
    pub framework: Option<String>,
    pub delivered: u64,
    pub lost: u64,
    /// Whether the producer answers commands (`empty_cache`, …).
    pub commands: bool,
}

impl SourceProblem {
    /// The segment directory itself cannot be read (missing, not ours, not
    /// a directory): no segment at all can be shown.
    pub fn is_directory(&self) -> bool {
        self.message.starts_with(DIRECTORY_PROBLEM)
    }
}

impl Source {
    /// A process seen without a segment (NVML only, or not yet attached).
    pub fn unattached(mode: Mode) -> Self {
        Source {
            mode,
            segment: None,
            producer: None,
            framework: None,
            delivered: 0,
            lost: 0,
            commands: false,
        }
    }
}

/// How the problem of a segment directory that cannot be read begins (its
/// path and error follow): it is no segment, and is not counted as one.
pub const DIRECTORY_PROBLEM: &str = "the segment directory cannot be read: ";

/// A segment the collector could not use, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceProblem {
    #[serde(deserialize_with = "printable")]
    pub path: String,
    #[serde(deserialize_with = "printable")]
    pub message: String,
}

/// Events drained from one process's segment, and its wire totals so far
/// (written as `Input::Events`; in JSON the same object as before it had a
/// name of its own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventBatch {
    pub key: ProcessKey,
    pub events: Vec<Event>,
    pub delivered: u64,
    pub lost: u64,
    pub lost_now: u64,
    /// The ring position of each event (1.1): empty (not given), or one
    /// per event, in order.
    #[serde(default)]
    pub at: Vec<RingPos>,
}

impl EventBatch {
    /// `events` of `key` as one batch read whole: every event delivered,
    /// none lost, no ring positions (a test's or a fixture's batch).
    pub fn whole(key: ProcessKey, events: Vec<Event>) -> EventBatch {
        EventBatch {
            key,
            delivered: events.len() as u64,
            events,
            lost: 0,
            lost_now: 0,
            at: Vec::new(),
        }
    }

    /// The events with their ring positions, `None` each where the batch
    /// gives none.
    pub fn positioned(self) -> impl Iterator<Item = (Event, Option<RingPos>)> {
        let at = if self.at.len() == self.events.len() {
            self.at
        } else {
            Vec::new()
        };
        let mut at = at.into_iter();
        self.events.into_iter().map(move |e| (e, at.next()))
    }

    /// The batch cut after each step marker, in order: each piece holds
    /// the events (and positions) up to and including one marker, the last
    /// what follows the last marker; the totals are the batch's, and the
    /// loss seen now is told once, by the last piece.
    pub fn split_after_markers(self) -> Vec<EventBatch> {
        let mut pieces = Vec::new();
        let mut start = 0;
        let n = self.events.len();
        while start < n {
            let end = (self.events[start..].iter())
                .position(|e| matches!(e.kind, EventKind::Marker { .. }))
                .map_or(n, |i| start + i + 1);
            pieces.push(EventBatch {
                key: self.key,
                events: self.events[start..end].to_vec(),
                delivered: self.delivered,
                lost: self.lost,
                lost_now: if end == n { self.lost_now } else { 0 },
                at: (self.at.get(start..end).map(<[_]>::to_vec)).unwrap_or_default(),
            });
            start = end;
        }
        pieces
    }
}

/// Everything a source tells the hub. A recording is a sequence of these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Input {
    /// A process appeared (an instrumented segment was opened).
    Attach {
        key: ProcessKey,
        identity: Identity,
        source: Source,
        /// How watching began (1.1; default: not given).
        #[serde(default)]
        watch: Watch,
    },
    /// Events drained from a process's segment, and its wire totals so far.
    Events(EventBatch),
    /// The process exited (its figures stay visible for a while).
    Gone { key: ProcessKey },
    /// Stop showing the process.
    Forget { key: ProcessKey },
    /// An NVML reading; `host_pids` maps host pids to instrumented processes.
    Machine {
        machine: Machine,
        host_pids: Vec<(u32, ProcessKey)>,
        fresh: Vec<(ProcessKey, Identity)>,
    },
    /// The segments that could not be used, and why (replaces the list).
    Problems { problems: Vec<SourceProblem> },
    /// A bound of the collector or the model dropped `count` things named by
    /// `what` (e.g. `"events"`, `"blocks"`) so far, for process `key` (None:
    /// the whole hub). Cumulative: the latest count replaces earlier ones.
    /// Added in recording format 1.1.
    Dropped {
        key: Option<ProcessKey>,
        what: String,
        count: u64,
    },
    /// The process reset its peak statistics (it answered a `ResetPeaks`
    /// command): the peaks the model tracks for it start again from now.
    /// Added in recording format 1.2.
    PeaksReset { key: ProcessKey },
}

impl Input {
    /// The names of every variant, as they appear in JSON: a reader skips
    /// (and counts) an input whose name is not among them (a later minor's).
    pub(crate) const VARIANTS: &'static [&'static str] = &[
        "Attach",
        "Events",
        "Gone",
        "Forget",
        "Machine",
        "Problems",
        "Dropped",
        "PeaksReset",
    ];

    /// Whether recording format 1.0 knew this variant (it goes into an
    /// input frame of kind 1; later ones into kind 4, which 1.0 skips).
    pub(crate) fn known_to_1_0(&self) -> bool {
        !matches!(self, Input::Dropped { .. } | Input::PeaksReset { .. })
    }
}
