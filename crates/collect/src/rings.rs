//! Segment discovery and draining: every segment of this user in the segment
//! directory (and in the segment directories of containers, seen through
//! `/proc/<pid>/root`: `discover::container_dirs`) is opened (after the checks of `ring::discover`), drained each
//! step, and its events applied to the hub. Refused segments become
//! problems shown to the user, never crashes. No threads, no commands: the
//! [`Collector`](crate::collector::Collector) drives this and sends the commands.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use vramscope_core::model::{Mode, ProcessKey};
use vramscope_wire::event::Event;
use vramscope_wire::ring::discover::{self, FileId, Found, Liveness, Located, SegmentDir};
use vramscope_wire::ring::{monotonic_ns, Producer, RingError, SegmentReader, Start};

use super::hub::Tally;
use crate::config::Config;
use crate::hub::Hub;
use crate::procfs;
use vramscope_core::input::Input;
use vramscope_core::input::{Identity, Source, SourceProblem};
use vramscope_core::model::Watch;
use vramscope_wire::event::RingPos;

struct Attached {
    reader: SegmentReader,
    /// The directory it was found in, opened, and its name there: it is
    /// removed through them, never by path.
    dir: Arc<SegmentDir>,
    name: String,
    /// The file that was validated: the linger cleanup removes only it.
    file: FileId,
    key: ProcessKey,
    host_pid: Option<u32>,
    lost_seen: u64,
    gone_at: Option<Instant>,
    /// Per ring: whether it is the agent's.
    agent: Vec<bool>,
}

/// A segment's records of one tick: each ring's, as drained (in position
/// order), and the order that merges them by time, as runs of one ring's
/// records ([`Drained::merged`]). The records are applied from where they
/// were drained: nothing is copied to merge them (a copy only for a
/// recording or the advisor, which keep batches).
#[derive(Default)]
struct Drained {
    /// Per ring: its events and their positions, in position order.
    rings: Vec<(Vec<Event>, Vec<u64>)>,
    /// Per ring, while merging: how many of its records are merged.
    taken: Vec<usize>,
    /// Per ring: whether it is the agent's.
    agent: Vec<bool>,
    /// The merge's running latest time per ring.
    latest: Vec<u64>,
    /// The merged order: runs of `(ring, first record, records)`.
    runs: Vec<(usize, usize, usize)>,
}

/// Per ring of a segment: whether it is the agent's.
fn agent_rings(reader: &SegmentReader) -> Vec<bool> {
    (reader.header().rings.iter())
        .map(|r| r.role == vramscope_wire::ring::layout::ROLE_AGENT)
        .collect()
}

impl Drained {
    /// Ready for the records of a segment whose rings are `agent` (each
    /// ring's buffers are empty: a segment's records are merged and handed
    /// on before the next segment's are drained).
    fn ready_for(&mut self, agent: &[bool]) {
        self.agent.clear();
        self.agent.extend_from_slice(agent);
        self.rings
            .resize_with(agent.len().max(self.rings.len()), Default::default);
        self.agent.resize(self.rings.len(), false);
        self.latest.resize(self.rings.len(), 0);
        self.taken.resize(self.rings.len(), 0);
    }

    fn push(&mut self, ring: usize, position: u64, e: Event) {
        if let Some((ev, pos)) = self.rings.get_mut(ring) {
            ev.push(e);
            pos.push(position);
        }
    }

    /// Records drained.
    fn len(&self) -> usize {
        self.rings.iter().map(|(ev, _)| ev.len()).sum()
    }

    /// Merges the rings' records by time into `runs`, keeping each ring's
    /// order: each record is ordered by the latest time seen so far in its
    /// own ring, so a clock that steps back inside a ring cannot move a
    /// record before an earlier one of the same ring. At equal times,
    /// records of the agent's rings come after those of the device rings
    /// (a sample or snapshot taken at time T already reflects what
    /// happened at T), and then by ring index; the tie-break is the ring's,
    /// never the record's, so records of one ring that share a time (a
    /// sample and its STATS_C) keep their order too. (The model places
    /// snapshots exactly by the positions, which travel with the events;
    /// the time order is for the timeline.) Nothing is allocated once the
    /// buffers have grown.
    fn merge(&mut self) {
        self.runs.clear();
        self.latest.iter_mut().for_each(|t| *t = 0);
        self.taken.iter_mut().for_each(|n| *n = 0);
        loop {
            // The ring whose next record comes first, and the key of the
            // first record of any other ring (its run ends before it).
            let mut best: Option<(u64, bool, usize)> = None;
            let mut bound: Option<(u64, bool, usize)> = None;
            for (r, (ev, _)) in self.rings.iter().enumerate() {
                let Some(first) = ev.get(self.taken[r]) else {
                    continue;
                };
                let key = (self.latest[r].max(first.time_ns), self.agent[r], r);
                if best.is_none_or(|b| key < b) {
                    bound = best;
                    best = Some(key);
                } else if bound.is_none_or(|b| key < b) {
                    bound = Some(key);
                }
            }
            let Some((_, agent, r)) = best else { break };
            let ev = &self.rings[r].0;
            let from = self.taken[r];
            let mut t = self.latest[r];
            let n = match bound {
                // The last ring with records: the rest of it, in order
                // (its latest time is not needed any more).
                None => ev.len() - from,
                Some(bound) => {
                    let mut n = 0;
                    for e in &ev[from..] {
                        let next = t.max(e.time_ns);
                        if (next, agent, r) >= bound {
                            break;
                        }
                        t = next;
                        n += 1;
                    }
                    n
                }
            };
            self.latest[r] = t;
            self.taken[r] = from + n;
            self.runs.push((r, from, n));
        }
    }

    /// The records in the merged order, each with its ring position.
    fn merged(&self) -> impl Iterator<Item = (&Event, RingPos)> + Clone {
        self.runs.iter().flat_map(move |&(r, from, n)| {
            let (ev, pos) = &self.rings[r];
            let ring = r as u32;
            (ev[from..from + n].iter()).zip(
                pos[from..from + n]
                    .iter()
                    .map(move |&position| RingPos { ring, position }),
            )
        })
    }

    /// Empties the rings' buffers (their capacity is kept).
    fn clear(&mut self) {
        self.runs.clear();
        for (ev, pos) in &mut self.rings {
            ev.clear();
            pos.clear();
        }
    }

    /// Gives back memory a burst made the buffers grow to.
    fn trim(&mut self, used: usize) {
        const KEEP: usize = 16_384;
        for (ev, pos) in &mut self.rings {
            if ev.capacity() > KEEP && used < ev.capacity() / 4 {
                let to = (used * 2).max(KEEP);
                ev.shrink_to(to);
                pos.shrink_to(to);
            }
        }
    }
}

/// All segments being read.
pub(crate) struct RingSet {
    cfg: Config,
    /// By path and file: a new producer's segment at the path of one that
    /// still lingers is a different file, attached beside it.
    attached: HashMap<(PathBuf, FileId), Attached>,
    refused: HashMap<PathBuf, String>,
    /// Segments whose magic was still 0 when first seen, and when.
    initialising: HashMap<PathBuf, Instant>,
    last_scan: Option<Instant>,
    /// Containers' segment directories (`discover::container_dirs`, which
    /// looks at every process's mount namespace), looked for again every
    /// `CONTAINERS_EVERY`, and when.
    containers: Vec<Arc<SegmentDir>>,
    containers_at: Option<Instant>,
    /// Changes whenever a segment is attached or let go (the host pids
    /// change only then).
    generation: u64,
    /// Each segment's records of a tick, drained, merged and handed on in
    /// turn: one set of buffers for all, reused (warm in the cache, and
    /// nothing is allocated per tick once they have grown).
    buf: Drained,
    /// The first scan is done: segments found from now on appeared after
    /// the start, and are read from their oldest record whatever
    /// [`Config::backlog`] says.
    scanned: bool,
}

fn mode_of(p: Producer) -> Mode {
    match p {
        Producer::TorchSampled => Mode::Sampled,
        _ => Mode::Exact,
    }
}

/// Whether the producer answers commands (`empty_cache`, snapshots, …).
fn takes_commands(p: Producer) -> bool {
    !matches!(p, Producer::Test | Producer::Other(_))
}

impl RingSet {
    pub(crate) fn new(cfg: Config) -> Self {
        RingSet {
            cfg,
            attached: HashMap::new(),
            refused: HashMap::new(),
            initialising: HashMap::new(),
            last_scan: None,
            containers: Vec::new(),
            containers_at: None,
            generation: 0,
            buf: Drained::default(),
            scanned: false,
        }
    }

    /// Changes whenever a segment is attached or let go: what
    /// [`Self::host_pids`] returns changes only then.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether no segment is read.
    pub(crate) fn is_empty(&self) -> bool {
        self.attached.is_empty()
    }

    /// Host pid → model key of every attached process (for NVML's figures).
    pub(crate) fn host_pids(&self) -> HashMap<u32, ProcessKey> {
        self.attached
            .values()
            .filter_map(|a| a.host_pid.map(|p| (p, a.key)))
            .collect()
    }

    /// One tick: scan the directory if due, drain every segment, apply.
    pub(crate) fn step(&mut self, hub: &Hub) {
        let due = self
            .last_scan
            .is_none_or(|t| t.elapsed() >= self.cfg.discover_interval);
        if due {
            self.last_scan = Some(Instant::now());
            self.scan(hub);
            self.scanned = true;
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
                let why = format!("{}{e}", vramscope_core::input::DIRECTORY_PROBLEM);
                if self.refused.get(&dir) != Some(&why) {
                    self.refused.insert(dir, why);
                    hub.apply(Input::Problems {
                        problems: self.problems(),
                    });
                }
                return;
            }
        };
        // Containers with a segment directory of their own, seen through
        // their processes' roots (what this reader has the rights to see).
        let mut found = found;
        if self
            .containers_at
            .is_none_or(|t| t.elapsed() >= CONTAINERS_EVERY)
        {
            self.containers_at = Some(Instant::now());
            self.containers = discover::container_dirs(&self.cfg.shm_dir)
                .into_iter()
                .map(Arc::new)
                .collect();
        }
        for dir in &self.containers {
            if let Ok((more, _)) = discover::list_in(dir.clone()) {
                found.extend(more);
            }
        }
        let before = self.refused.clone();
        self.refused.remove(&self.cfg.shm_dir);
        // Forget refusals of files that are gone.
        self.refused
            .retain(|p, _| found.iter().any(|f| &f.path == p));
        self.initialising
            .retain(|p, _| found.iter().any(|f| &f.path == p));
        // A file is read once, whichever path reaches it (a container
        // given the host's directory shows the same files again).
        let mut reading: std::collections::HashSet<FileId> =
            self.attached.keys().map(|(_, id)| *id).collect();
        for f in found {
            let Some(id) = f.dir.file_id(&f.file) else {
                continue;
            };
            if !self.attached.contains_key(&(f.path.clone(), id)) && reading.insert(id) {
                self.open(f, id, hub);
            }
        }
        if self.refused != before {
            hub.apply(Input::Problems {
                problems: self.problems(),
            });
        }
    }

    /// Opens a segment found in the directory (`id`: the file its path
    /// named when listed): attached when its producer is alive and ours,
    /// tidied away when dead, reported when refused, reused, unverifiable or
    /// still initialising after 5 s.
    fn open(&mut self, f: Found, id: FileId, hub: &Hub) {
        let path = f.path.clone();
        let start = if self.cfg.backlog || self.scanned {
            Start::Oldest
        } else {
            Start::Now
        };
        let open = |start| SegmentReader::open_in(&f.dir, &f.file, start);
        let opened = open(start).and_then(|r| {
            // Nothing can ask a producer that takes no commands for the
            // snapshot to anchor on: its backlog is read (it may hold one).
            if matches!(start, Start::Now) && !takes_commands(r.header().producer) {
                open(Start::Oldest)
            } else {
                Ok(r)
            }
        });
        let reader = match opened {
            Ok(r) => r,
            Err(RingError::Initialising(_)) => {
                let since = *self
                    .initialising
                    .entry(path.clone())
                    .or_insert_with(Instant::now);
                if since.elapsed() >= INITIALISING_GRACE {
                    self.refused.insert(
                        path,
                        "its magic is still 0 after 5 s: the producer never finished creating it (it may have crashed)".into(),
                    );
                }
                return;
            }
            Err(e) => {
                self.refused.insert(path, e.to_string());
                return;
            }
        };
        self.initialising.remove(&path);
        // The file validated must be the one listed (and still at its path):
        // else it changed meanwhile, and the next scan looks again.
        if f.dir.file_id(&f.file) != Some(id) {
            return;
        }
        let h = reader.header();
        let located = if reader.state() == vramscope_wire::ring::layout::STATE_CLOSED {
            Located::Dead
        } else {
            discover::locate_producer(h.pid, h.start_time, id)
        };
        match located {
            Located::Here(host) => {
                // The pid and start time match a process here; its figures
                // are shown under its name only if it is ours.
                let me = discover::current_uid();
                match procfs::owner(host) {
                    Some(uid) if uid == me && procfs::maps_file(host, id) != Some(true) => {
                        // Ours, but it does not map the segment (or will not
                        // say): not shown as its producer (a segment naming
                        // pid 1, say).
                        let why = match procfs::maps_file(host, id) {
                            Some(_) => format!(
                                "pid {} does not map this segment: it is not its producer; not shown",
                                h.pid
                            ),
                            None => format!(
                                "cannot verify that pid {} maps this segment (/proc/{host}/maps is unreadable); not shown",
                                h.pid
                            ),
                        };
                        self.refused.insert(path, why);
                    }
                    Some(uid) if uid == me => {
                        if let Some(other) = self.twin_of(h.pid, h.start_time, host) {
                            // Two processes of different pid namespaces that
                            // call themselves the same and started in the
                            // same clock tick: the model keys processes by
                            // (pid, start time), so only the first is shown.
                            let why = format!(
                                "pid {} with start time {} is already shown from {} (another process, host pid {other}, that started in the same clock tick in another pid namespace); not shown",
                                h.pid,
                                h.start_time,
                                self.segment_of(ProcessKey { pid: h.pid, start_time: h.start_time })
                                    .unwrap_or_default()
                                    .display()
                            );
                            self.refused.insert(path, why);
                            return;
                        }
                        self.refused.remove(&path);
                        self.attach(f, id, host, reader, hub);
                    }
                    Some(uid) => {
                        let why = format!(
                            "pid {} belongs to another user (uid {uid}), not to the segment's owner (uid {me}): not shown",
                            h.pid
                        );
                        self.refused.insert(path, why);
                    }
                    None => {} // gone meanwhile: the next scan sees it dead
                }
            }
            Located::Dead => {
                // Left behind by a process that is gone (or closed):
                // nothing to show; tidy it away (that very file only), and
                // say so.
                if self.cfg.clean_stale && f.dir.remove_if_same(&f.file, id) {
                    hub.note_cleaned(&path, reader.header().pid);
                }
            }
            Located::Reused => {
                // Its pid now names another process. Never deleted
                // automatically (a writer with a wrong start time would lose
                // its segment): reported, and `vramscope rings --clean`
                // removes it.
                let why = format!(
                    "stale: pid {} now belongs to a newer process (start time differs); `vramscope rings --clean` removes it",
                    h.pid
                );
                self.refused.insert(path, why);
            }
            Located::CannotTell(why) => {
                // Never deleted, never shown as a process: reported.
                self.refused.insert(
                    path,
                    format!("cannot tell whether its producer runs: {why}"),
                );
            }
        }
    }

    /// The host pid of an attached producer with the key (`pid`,
    /// `start_time`) that is not `host`.
    fn twin_of(&self, pid: u32, start_time: u64, host: u32) -> Option<u32> {
        self.attached
            .values()
            .filter(|a| a.key.pid == pid && a.key.start_time == start_time)
            .find_map(|a| a.host_pid.filter(|&h| h != host))
    }

    /// The segment the attached producer `key` is read from.
    pub(crate) fn segment_of(&self, key: ProcessKey) -> Option<PathBuf> {
        self.attached
            .iter()
            .find(|(_, a)| a.key == key)
            .map(|((p, _), _)| p.clone())
    }

    /// Tells the hub about a live producer and starts draining its segment.
    fn attach(&mut self, f: Found, file: FileId, host: u32, reader: SegmentReader, hub: &Hub) {
        let path = f.path;
        let h = reader.header();
        let key = ProcessKey {
            pid: h.pid,
            start_time: h.start_time,
        };
        let host_pid = Some(host);
        let mut identity = procfs::identity(host)
            .filter(|id| id.uid == Some(h.uid))
            .unwrap_or_else(|| Identity {
                host_pid: host,
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
            commands: takes_commands(h.producer),
        };
        hub.apply(Input::Attach {
            key,
            identity,
            source,
            watch: watch_of(&reader),
        });
        let mut reader = reader;
        reader.set_integrity_interval(INTEGRITY_EVERY);
        let attached = Attached {
            agent: agent_rings(&reader),
            reader,
            dir: f.dir,
            name: f.file,
            file,
            key,
            host_pid,
            lost_seen: 0,
            gone_at: None,
        };
        self.attached.insert((path, file), attached);
        self.generation += 1;
    }

    fn drain(&mut self, hub: &Hub) {
        let mut finished = Vec::new();
        let mut damaged: Vec<(PathBuf, String)> = Vec::new();
        let linger = self.cfg.exited_linger;
        for (path, a) in self.attached.iter_mut() {
            let liveness = a.reader.liveness_every(LIVENESS_EVERY);
            let gone = liveness != Liveness::Alive;
            // At most two rounds of up to 65,536 records per ring each tick
            // (over 2 M records/s per ring at 20 ticks/s): a busy process
            // cannot starve the others, and the batch stays a few MiB.
            let buf = &mut self.buf;
            buf.ready_for(&a.agent);
            for _ in 0..2 {
                // The liveness looked up above (at most once a second),
                // not `/proc` again at every round.
                let done = (a.reader).drain_given(65_536, gone, |ring, position, e| {
                    buf.push(ring, position, e)
                });
                if done.delivered == 0 && done.lost == 0 {
                    break;
                }
            }
            // Rings are each in order; merge them by time (`Drained::merge`).
            buf.merge();
            let totals = a.reader.totals();
            let lost_now = totals.lost - a.lost_seen;
            a.lost_seen = totals.lost;
            let used = buf.len();
            if used > 0 || lost_now > 0 {
                hub.apply_merged(
                    a.key,
                    buf.merged(),
                    Tally {
                        delivered: totals.delivered,
                        lost: totals.lost,
                        lost_now,
                    },
                );
            }
            buf.clear();
            buf.trim(used);
            if gone && a.gone_at.is_none() {
                a.gone_at = Some(Instant::now());
                hub.apply(Input::Gone { key: a.key });
            }
            // A segment another process cut short is damaged, not stale:
            // shown as a problem with its reason, and never deleted.
            let broken = a.reader.broken().map(str::to_string);
            if let Some(why) = &broken {
                damaged.push((path.0.clone(), why.clone()));
            }
            if a.gone_at.is_some_and(|t| t.elapsed() >= linger) {
                let stale =
                    broken.is_none() && matches!(liveness, Liveness::Dead | Liveness::Reused);
                finished.push((path.clone(), stale));
            }
        }
        let before = self.refused.len();
        for (p, why) in damaged {
            self.refused.entry(p).or_insert(why);
        }
        if self.refused.len() != before {
            hub.apply(Input::Problems {
                problems: self.problems(),
            });
        }
        for (at, stale) in finished {
            if let Some(a) = self.attached.remove(&at) {
                self.generation += 1;
                hub.apply(Input::Forget { key: a.key });
                // Only the file that was read, never whatever now has its
                // path (a new producer that got the same pid).
                if self.cfg.clean_stale && stale && a.dir.remove_if_same(&a.name, a.file) {
                    hub.note_cleaned(&at.0, a.reader.header().pid);
                }
            }
        }
    }
}

/// How watching a segment began: now, and mid-run when the reader skipped
/// records written before it came (FORMAT.md, "Attaching mid-run").
fn watch_of(reader: &SegmentReader) -> Watch {
    let ring_starts: Vec<u64> = (0..reader.ring_count()).map(|i| reader.start(i)).collect();
    Watch {
        began_ns: Some(monotonic_ns()),
        mid_run: ring_starts.iter().any(|&s| s > 0),
        ring_starts,
        anchor_snapshot: None,
    }
}

/// How often a segment's producer is looked up in `/proc` (a closed
/// segment is seen gone at once).
const LIVENESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a segment's file is checked (an fstat); a truncation in
/// between is caught by the SIGBUS flag.
const INTEGRITY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the containers' segment directories are looked for (every
/// process's mount namespace is looked at); their files are listed at
/// every scan.
const CONTAINERS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a segment may stay initialising (magic 0) before it is
/// reported (FORMAT.md, "Naming and creation").
const INITIALISING_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_wire::event::{EventKind, Place, Stats};

    fn ev(t: u64, addr: u64) -> Event {
        let place = Place::default();
        Event {
            time_ns: t,
            kind: EventKind::Alloc {
                place,
                addr,
                size: 512,
            },
        }
    }

    fn at(ring: u32, position: u64) -> RingPos {
        RingPos { ring, position }
    }

    /// Drains `batch` (each ring's records in position order) into the
    /// rings of a `Drained` of `rings` rings and merges them.
    fn merge_by_time(batch: &mut Vec<(Event, RingPos)>, rings: usize, agent: impl Fn(u32) -> bool) {
        let mut d = Drained {
            rings: (0..rings).map(|_| Default::default()).collect(),
            agent: (0..rings as u32).map(agent).collect(),
            latest: vec![0; rings],
            taken: vec![0; rings],
            ..Drained::default()
        };
        for (e, at) in batch.drain(..) {
            d.push(at.ring as usize, at.position, e);
        }
        d.merge();
        let merged: Vec<(Event, RingPos)> = d.merged().map(|(e, at)| (*e, at)).collect();
        assert_eq!(merged.len(), d.len());
        batch.extend(merged);
        d.clear();
        assert!(d.rings.iter().all(|(e, p)| e.is_empty() && p.is_empty()));
    }

    /// A device ring whose clock steps back keeps its own order; the agent
    /// ring's records merge in by time, after the allocator's at equal times.
    #[test]
    fn merging_by_time_never_reorders_a_ring() {
        let stats = Event {
            time_ns: 15,
            kind: EventKind::Stats {
                device: 0,
                stats: Stats::default(),
            },
        };
        let mut batch = vec![
            (stats, at(0, 0)),
            (ev(10, 1), at(1, 0)),
            (ev(20, 2), at(1, 1)),
            (ev(12, 3), at(1, 2)),
            (ev(20, 4), at(1, 3)),
        ];
        merge_by_time(&mut batch, 2, |ring| ring == 0);
        let order: Vec<(u32, u64)> = batch.iter().map(|(_, a)| (a.ring, a.position)).collect();
        assert_eq!(order, [(1, 0), (0, 0), (1, 1), (1, 2), (1, 3)]);
    }

    #[test]
    fn records_of_one_ring_with_equal_times_keep_their_order() {
        // A sample (STATS_B) and its STATS_C share the sample's time; an
        // allocator event of a device ring at that time comes first.
        let stats = Event {
            time_ns: 15,
            kind: EventKind::Stats {
                device: 0,
                stats: Stats::default(),
            },
        };
        let place = Event {
            time_ns: 15,
            kind: EventKind::StatsPosition {
                device: 0,
                at: vramscope_wire::event::RingSpan {
                    ring: 1,
                    before: 1,
                    after: 1,
                    exact: true,
                    ambiguous: false,
                },
            },
        };
        let mut batch = vec![(stats, at(0, 3)), (place, at(0, 4)), (ev(15, 1), at(1, 0))];
        merge_by_time(&mut batch, 2, |ring| ring == 0);
        let order: Vec<(u32, u64)> = batch.iter().map(|(_, a)| (a.ring, a.position)).collect();
        assert_eq!(order, [(1, 0), (0, 3), (0, 4)]);
    }
    proptest::proptest! {
        /// The merge gives what a stable sort of every record by its key gives:
        /// (its ring's latest time so far, agent ring, ring), each ring's
        /// order kept; whatever the rings, their order of arrival, and
        /// clocks that step back. Run twice on one `Drained`, as a
        /// collector reuses it.
        #[test]
        fn merge_is_a_stable_sort_by_key(
            rings in proptest::collection::vec(
                (proptest::bool::ANY, proptest::collection::vec(0u64..40, 0..30)), 1..4),
            rounds in 1usize..3,
        ) {
            let agent: Vec<bool> = rings.iter().map(|(a, _)| *a).collect();
            let mut d = Drained::default();
            for _ in 0..2 {
                d.ready_for(&agent);
                // Drained as `drain_given` does: ring after ring, a round
                // at a time (each ring's records split over the rounds).
                for round in 0..rounds {
                    for (r, (_, times)) in rings.iter().enumerate() {
                        let per = times.len().div_ceil(rounds);
                        for (i, t) in times.iter().enumerate().skip(round * per).take(per) {
                            d.push(r, i as u64, ev(*t, (r * 100 + i) as u64));
                        }
                    }
                }
                d.merge();
                let mut want: Vec<((u64, bool, usize), usize, u64)> = Vec::new();
                for (r, (a, times)) in rings.iter().enumerate() {
                    let mut latest = 0;
                    for (i, t) in times.iter().enumerate() {
                        latest = latest.max(*t);
                        want.push(((latest, *a, r), i, (r * 100 + i) as u64));
                    }
                }
                want.sort_by_key(|(k, i, _)| (*k, *i));
                let got: Vec<(u32, u64, u64)> = d.merged()
                    .map(|(e, at)| match e.kind {
                        EventKind::Alloc { addr, .. } => (at.ring, at.position, addr),
                        _ => unreachable!(),
                    })
                    .collect();
                let want: Vec<(u32, u64, u64)> =
                    want.iter().map(|((_, _, r), i, addr)| (*r as u32, *i as u64, *addr)).collect();
                proptest::prop_assert_eq!(got, want);
                d.clear();
                proptest::prop_assert!(d.rings.iter().all(|(e, p)| e.is_empty() && p.is_empty()));
            }
        }
    }
}
