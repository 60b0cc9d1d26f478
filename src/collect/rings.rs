//! Segment discovery and draining: every segment of this user in the segment
//! directory is opened (after the checks of `ring::discover`), drained each
//! step, and its events applied to the hub. Refused segments become
//! problems shown to the user, never crashes. No threads, no commands: the
//! [`Collector`](super::Collector) drives this and sends the commands.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::event::{Event, EventKind};
use crate::model::{Mode, ProcessKey};
use crate::ring::discover::{self, Liveness};
use crate::ring::{Producer, RingError, SegmentReader};

use super::{procfs, Config, Hub};
use crate::input::Input;
use crate::input::{Identity, Source, SourceProblem};

struct Attached {
    reader: SegmentReader,
    key: ProcessKey,
    host_pid: Option<u32>,
    lost_seen: u64,
    gone_at: Option<Instant>,
}

/// All segments being read.
pub struct RingSet {
    cfg: Config,
    attached: HashMap<PathBuf, Attached>,
    refused: HashMap<PathBuf, String>,
    last_scan: Option<Instant>,
}

fn mode_of(p: Producer) -> Mode {
    match p {
        Producer::TorchSampled => Mode::Sampled,
        _ => Mode::Exact,
    }
}

impl RingSet {
    pub fn new(cfg: Config) -> Self {
        RingSet {
            cfg,
            attached: HashMap::new(),
            refused: HashMap::new(),
            last_scan: None,
        }
    }

    /// Host pid → model key of every attached process (for NVML's figures).
    pub fn host_pids(&self) -> HashMap<u32, ProcessKey> {
        self.attached
            .values()
            .filter_map(|a| a.host_pid.map(|p| (p, a.key)))
            .collect()
    }

    /// One tick: scan the directory if due, drain every segment, apply.
    pub fn step(&mut self, hub: &Hub) {
        let due = self
            .last_scan
            .is_none_or(|t| t.elapsed() >= self.cfg.discover_interval);
        if due {
            self.last_scan = Some(Instant::now());
            self.scan(hub);
        }
        self.drain(hub);
    }

    fn problems(&self) -> Vec<SourceProblem> {
        let mut v: Vec<SourceProblem> = self
            .refused
            .iter()
            .map(|(p, m)| SourceProblem {
                path: p.display().to_string(),
                message: m.clone(),
            })
            .collect();
        v.sort_by(|a, b| a.path.cmp(&b.path));
        v
    }

    fn scan(&mut self, hub: &Hub) {
        let (found, _) = match discover::list(&self.cfg.shm_dir) {
            Ok(x) => x,
            Err(e) => {
                let dir = self.cfg.shm_dir.clone();
                if self.refused.get(&dir) != Some(&e.to_string()) {
                    self.refused.insert(dir, e.to_string());
                    hub.apply(Input::Problems {
                        problems: self.problems(),
                    });
                }
                return;
            }
        };
        let before = self.refused.clone();
        self.refused.remove(&self.cfg.shm_dir);
        // Forget refusals of files that are gone.
        self.refused
            .retain(|p, _| found.iter().any(|f| &f.path == p));
        for f in found {
            if !self.attached.contains_key(&f.path) {
                self.open(f.path, hub);
            }
        }
        if self.refused != before {
            hub.apply(Input::Problems {
                problems: self.problems(),
            });
        }
    }

    /// Opens a segment found in the directory: attached when its producer
    /// is alive, tidied away when dead, reported when refused or reused.
    fn open(&mut self, path: PathBuf, hub: &Hub) {
        let reader = match SegmentReader::open(&path) {
            Ok(r) => r,
            Err(RingError::Initialising(_)) => return,
            Err(e) => {
                self.refused.insert(path, e.to_string());
                return;
            }
        };
        match reader.liveness() {
            Liveness::Alive => {
                self.refused.remove(&path);
                self.attach(path, reader, hub);
            }
            Liveness::Dead => {
                // Left behind by a process that is gone (or closed):
                // nothing to show; tidy it away.
                if self.cfg.clean_stale {
                    let _ = std::fs::remove_file(&path);
                }
            }
            Liveness::Reused => {
                // Its pid now names another process. Never deleted
                // automatically (a writer with a wrong start time would lose
                // its segment): reported, and `vramscope rings --clean`
                // removes it.
                let why = format!(
                    "stale: pid {} now belongs to a newer process (start time differs); `vramscope rings --clean` removes it",
                    reader.header().pid
                );
                self.refused.insert(path, why);
            }
        }
    }

    /// Tells the hub about a live producer and starts draining its segment.
    fn attach(&mut self, path: PathBuf, reader: SegmentReader, hub: &Hub) {
        let h = reader.header();
        let key = ProcessKey {
            pid: h.pid,
            start_time: h.start_time,
        };
        let host_pid = procfs::host_pid(h.pid, h.start_time);
        let mut identity = host_pid
            .and_then(procfs::identity)
            .unwrap_or_else(|| Identity {
                host_pid: host_pid.unwrap_or(0),
                ns_pid: h.pid,
                ..Identity::default()
            });
        identity.label = h.label.clone();
        let source = Source {
            mode: mode_of(h.producer),
            segment: Some(path.display().to_string()),
            producer: Some(format!("{:?}", h.producer)),
            framework: Some(h.framework.clone()).filter(|s| !s.is_empty()),
            delivered: 0,
            lost: 0,
            commands: !matches!(h.producer, Producer::Test | Producer::Other(_)),
        };
        hub.apply(Input::Attach {
            key,
            identity,
            source,
            watch: Default::default(),
        });
        let attached = Attached {
            reader,
            key,
            host_pid,
            lost_seen: 0,
            gone_at: None,
        };
        self.attached.insert(path, attached);
    }

    fn drain(&mut self, hub: &Hub) {
        let mut finished = Vec::new();
        let linger = self.cfg.exited_linger;
        for (path, a) in self.attached.iter_mut() {
            let mut batch: Vec<Event> = Vec::new();
            let gone = a.reader.liveness() != Liveness::Alive;
            // At most two rounds of up to 65,536 records per ring each tick
            // (over 2 M records/s per ring at 20 ticks/s): a busy process
            // cannot starve the others, and the batch stays a few MiB.
            for _ in 0..2 {
                let done = a.reader.drain(65_536, |_, e| batch.push(e));
                if done.delivered == 0 && done.lost == 0 {
                    break;
                }
            }
            // Rings are each in order; merge them by time. At equal times,
            // allocator events come before the agent's statistics, snapshots
            // and markers: a sample or snapshot taken at time T already
            // reflects what happened at T.
            batch.sort_by_key(|e| (e.time_ns, is_agent_record(e)));
            let totals = a.reader.totals();
            let lost_now = totals.lost - a.lost_seen;
            a.lost_seen = totals.lost;
            let key = a.key;
            if !batch.is_empty() || lost_now > 0 {
                hub.apply(Input::Events {
                    key,
                    events: std::mem::take(&mut batch),
                    delivered: totals.delivered,
                    lost: totals.lost,
                    lost_now,
                    at: Vec::new(),
                });
            }
            if gone && a.gone_at.is_none() {
                a.gone_at = Some(Instant::now());
                hub.apply(Input::Gone { key });
            }
            if a.gone_at.is_some_and(|t| t.elapsed() >= linger) {
                finished.push(path.clone());
            }
        }
        for path in finished {
            if let Some(a) = self.attached.remove(&path) {
                hub.apply(Input::Forget { key: a.key });
                if self.cfg.clean_stale {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
}

/// Records an agent writes (statistics, snapshots, markers), as opposed to
/// the allocator's own events.
fn is_agent_record(e: &Event) -> bool {
    matches!(
        e.kind,
        EventKind::Stats { .. }
            | EventKind::SnapshotBegin { .. }
            | EventKind::SnapshotSegment { .. }
            | EventKind::SnapshotBlock { .. }
            | EventKind::SnapshotEnd { .. }
            | EventKind::Marker { .. }
    )
}
