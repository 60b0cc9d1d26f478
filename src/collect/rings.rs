//! Segment discovery and draining: every segment of this user in the segment
//! directory is opened (after the checks of `ring::discover`), drained each
//! tick, and its events applied to the model. Refused segments become
//! problems shown to the user, never crashes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::event::Event;
use crate::model::{Mode, ProcessKey};
use crate::ring::discover::{self, Liveness};
use crate::ring::{Command, Producer, RingError, SegmentReader};

use super::state::{Identity, Source, SourceProblem};
use super::{procfs, Config, Hub};

struct Attached {
    reader: SegmentReader,
    key: ProcessKey,
    host_pid: Option<u32>,
    lost_seen: u64,
    gone_at: Option<Instant>,
    last_resync_ask: Option<Instant>,
}

/// All segments being read.
pub struct RingSet {
    cfg: Config,
    attached: HashMap<PathBuf, Attached>,
    refused: HashMap<PathBuf, String>,
    last_scan: Option<Instant>,
    batch: Vec<Event>,
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
            batch: Vec::new(),
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
        let mut changed = false;
        if due {
            self.last_scan = Some(Instant::now());
            changed |= self.scan(hub);
        }
        changed |= self.drain(hub);
        if changed {
            hub.changed();
        }
    }

    fn scan(&mut self, hub: &Hub) -> bool {
        let (found, _) = match discover::list(&self.cfg.shm_dir) {
            Ok(x) => x,
            Err(e) => {
                let problem = SourceProblem {
                    path: self.cfg.shm_dir.display().to_string(),
                    message: e.to_string(),
                };
                return hub.with(|i| {
                    let new = i.problems != vec![problem.clone()];
                    i.problems = vec![problem];
                    new
                });
            }
        };
        let mut changed = false;
        for f in found {
            if self.attached.contains_key(&f.path) {
                continue;
            }
            match SegmentReader::open(&f.path) {
                Ok(reader) => {
                    let h = reader.header().clone();
                    if reader.liveness() != Liveness::Alive {
                        // Left behind by a process that is gone: nothing to show.
                        if self.cfg.clean_stale {
                            let _ = std::fs::remove_file(&f.path);
                        }
                        continue;
                    }
                    let key = ProcessKey {
                        pid: h.pid,
                        start_time: h.start_time,
                    };
                    let host_pid = procfs::host_pid(h.pid, h.start_time);
                    let mut identity =
                        host_pid
                            .and_then(procfs::identity)
                            .unwrap_or_else(|| Identity {
                                host_pid: host_pid.unwrap_or(0),
                                ns_pid: h.pid,
                                ..Identity::default()
                            });
                    identity.label = h.label.clone();
                    let source = Source {
                        mode: mode_of(h.producer),
                        segment: Some(f.path.display().to_string()),
                        producer: Some(format!("{:?}", h.producer)),
                        framework: Some(h.framework.clone()).filter(|s| !s.is_empty()),
                        delivered: 0,
                        lost: 0,
                        commands: !matches!(h.producer, Producer::Test | Producer::Other(_)),
                    };
                    hub.with(|i| {
                        i.model.set_mode(key, source.mode);
                        i.identities.insert(key, identity);
                        i.sources.insert(key, source);
                        i.problems
                            .retain(|p| p.path != f.path.display().to_string());
                    });
                    self.refused.remove(&f.path);
                    self.attached.insert(
                        f.path.clone(),
                        Attached {
                            reader,
                            key,
                            host_pid,
                            lost_seen: 0,
                            gone_at: None,
                            last_resync_ask: None,
                        },
                    );
                    changed = true;
                }
                Err(RingError::Initialising(_)) => {}
                Err(e) => {
                    let message = e.to_string();
                    if self.refused.get(&f.path) != Some(&message) {
                        self.refused.insert(f.path.clone(), message.clone());
                        let path = f.path.display().to_string();
                        hub.with(|i| {
                            i.problems.retain(|p| p.path != path);
                            i.problems.push(SourceProblem { path, message });
                        });
                        changed = true;
                    }
                }
            }
        }
        changed
    }

    fn drain(&mut self, hub: &Hub) -> bool {
        let mut changed = false;
        let mut finished = Vec::new();
        let linger = self.cfg.exited_linger;
        for (path, a) in self.attached.iter_mut() {
            self.batch.clear();
            let batch = &mut self.batch;
            let gone = a.reader.liveness() != Liveness::Alive;
            // Drain in bounded rounds so one busy process cannot starve others.
            for _ in 0..8 {
                let done = a.reader.drain(65_536, |_, e| batch.push(e));
                if done.delivered == 0 && done.lost == 0 {
                    break;
                }
            }
            // Rings are each in order; merge them by time.
            batch.sort_by_key(|e| e.time_ns);
            let totals = a.reader.totals();
            let lost_delta = totals.lost - a.lost_seen;
            a.lost_seen = totals.lost;
            let key = a.key;
            let newly_gone = gone && a.gone_at.is_none();
            if newly_gone {
                a.gone_at = Some(Instant::now());
            }
            if batch.is_empty() && lost_delta == 0 && !newly_gone {
                if a.gone_at.is_some_and(|t| t.elapsed() >= linger) {
                    finished.push(path.clone());
                }
                continue;
            }
            changed = true;
            let wants_resync = hub.with(|i| {
                i.model.apply_all(key, batch.iter());
                if lost_delta > 0 {
                    i.model.note_loss(key, lost_delta);
                }
                if let Some(s) = i.sources.get_mut(&key) {
                    s.delivered = totals.delivered;
                    s.lost = totals.lost;
                    if newly_gone {
                        s.commands = false;
                    }
                }
                if newly_gone {
                    if let Some(id) = i.identities.get_mut(&key) {
                        id.alive = false;
                    }
                }
                !gone
                    && i.sources.get(&key).is_some_and(|s| s.commands)
                    && i.model.resync_wanted().any(|k| k == key)
            });
            if wants_resync
                && a.last_resync_ask
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(2))
            {
                a.last_resync_ask = Some(Instant::now());
                ask_snapshot(path.clone());
            }
        }
        for path in finished {
            if let Some(a) = self.attached.remove(&path) {
                hub.with(|i| {
                    i.model.remove(a.key);
                    i.identities.remove(&a.key);
                    i.sources.remove(&a.key);
                });
                if self.cfg.clean_stale {
                    let _ = std::fs::remove_file(&path);
                }
                changed = true;
            }
        }
        changed
    }
}

/// Asks a producer for a state snapshot without waiting on the ring loop.
fn ask_snapshot(path: PathBuf) {
    let _ = std::thread::Builder::new()
        .name("vramscope-resync".into())
        .spawn(move || {
            if let Ok(r) = SegmentReader::open_at(&path, crate::ring::Start::Now) {
                let _ = r.command(Command::Snapshot { device: None }, Duration::from_secs(2));
            }
        });
}
