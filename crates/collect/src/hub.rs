//! The hub: the model and everything the collector learned about the
//! processes, behind one short lock. Sources write [`Input`]s into it
//! ([`Hub::apply`]); views read a [`Snapshot`] out of it. It does no I/O
//! besides writing the inputs into a recording when one is running.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use vramscope_core::input::{EventBatch, Identity, Input, Machine, Source, SourceProblem};
use vramscope_core::model::{Mode, Model, ModelConfig, ProcessKey, ViewOptions};
use vramscope_core::recording::Recorder;
use vramscope_wire::event::{Event, EventKind, MarkSource, RingPos};
use vramscope_wire::ring::monotonic_ns;

use super::advisor;
use super::state::{self, ProcessEntry, Snapshot};

#[derive(Default)]
struct Inner {
    model: Model,
    machine: Machine,
    identities: HashMap<ProcessKey, Identity>,
    sources: HashMap<ProcessKey, Source>,
    problems: Vec<SourceProblem>,
    /// The collector's hub-wide drop counts (`Input::Dropped` without a
    /// process), by what; at most `Bounds::collector_drop_names` names.
    dropped: BTreeMap<String, u64>,
    /// Segments removed because their producer was gone, the newest last.
    cleaned: std::collections::VecDeque<state::CleanedSegment>,
    cleaned_total: u64,
    /// The live advisor, once asked for.
    advising: Option<Advising>,
    /// Start the advisor on a process when a projected forecast of it
    /// shows ([`Hub::advise_forecasts`]): (host, share of a core).
    auto_advise: Option<(bool, Option<f64>)>,
    /// The live path's floor, for measuring only (`collect::floor`).
    #[cfg(feature = "live-floor")]
    floor: super::floor::Blocks,
}

/// The live advisor's state in the hub: its worker's end, and which
/// processes it follows.
struct Advising {
    tap: advisor::Tap,
    /// Every process (`serve --advise`, `vramscope --advise`, `snapshot
    /// --advise`, `replay --advise`), not only those asked for.
    all: bool,
    /// The processes' pids are this host's (not a recording's).
    host: bool,
    /// The processes followed; true once the hub stopped sending one's
    /// events (the worker fell behind, or events were lost).
    following: HashMap<ProcessKey, bool>,
    /// Events each followed process had lost when the advisor began.
    lost_at_start: HashMap<ProcessKey, u64>,
}

impl Inner {
    fn apply(&mut self, input: Input) {
        match input {
            Input::Attach {
                key,
                identity,
                source,
                watch,
            } => {
                // Beyond the model's process bound the process is not
                // followed (its inputs are counted as dropped).
                if !self.model.admit(key) {
                    return;
                }
                self.model.set_mode(key, source.mode);
                self.model.watch(key, &watch);
                self.identities.insert(key, identity);
                if let Some(seg) = &source.segment {
                    self.problems.retain(|p| &p.path != seg);
                }
                self.sources.insert(key, source);
                if self.advising.as_ref().is_some_and(|a| a.all) {
                    // A process that cannot be advised yet (its state not
                    // known) is tried again at its next events.
                    let _ = self.advise(key);
                }
            }
            Input::Events(b) => self.apply_events(&b),
            Input::Gone { key } => {
                if let Some(s) = self.sources.get_mut(&key) {
                    s.commands = false;
                }
                if let Some(id) = self.identities.get_mut(&key) {
                    id.alive = false;
                }
            }
            Input::Forget { key } => {
                if let Some(a) = &mut self.advising {
                    if a.following.remove(&key).is_some() {
                        a.tap.send(advisor::Msg::Forget { key });
                    }
                }
                self.model.remove(key);
                self.identities.remove(&key);
                self.sources.remove(&key);
            }
            Input::Machine {
                machine,
                host_pids,
                fresh,
            } => {
                self.apply_machine(machine, &host_pids.into_iter().collect(), fresh);
            }
            Input::Problems { problems } => {
                self.problems = problems;
            }
            // The collector's drop counts (cumulative: the latest replaces
            // earlier ones): shown with the process, or hub-wide.
            Input::Dropped { key, what, count } => match key {
                Some(key) => self.model.note_collector_drop(key, &what, count),
                None => self.note_drop(what, count),
            },
            Input::PeaksReset { key } => self.model.reset_peaks(key),
        }
    }

    fn apply_events(&mut self, b: &EventBatch) {
        self.model.apply_all_at(b.key, b.events.iter(), &b.at);
        self.advise_events(b);
        self.note_tally(b.key, Tally::of(b));
    }

    /// A segment's delivery counts, as of the batch just applied.
    fn note_tally(&mut self, key: ProcessKey, t: Tally) {
        if t.lost_now > 0 {
            self.model.note_loss(key, t.lost_now);
        }
        if let Some(s) = self.sources.get_mut(&key) {
            s.delivered = t.delivered;
            s.lost = t.lost;
        }
    }

    /// The live advisor, started if it is not running (see
    /// [`Hub::enable_advisor`]).
    fn advisor_on(
        &mut self,
        listener: advisor::SharedListener,
        all: bool,
        host: bool,
        share: Option<f64>,
    ) {
        let a = self.advising.get_or_insert_with(|| Advising {
            tap: advisor::Tap::spawn(share, listener),
            all,
            host,
            following: HashMap::new(),
            lost_at_start: HashMap::new(),
        });
        a.all |= all;
    }

    /// Starts advising `key` (nothing when it is already followed).
    fn advise(&mut self, key: ProcessKey) -> Result<(), String> {
        let Some(a) = &mut self.advising else {
            return Err("the advisor is not running".into());
        };
        if a.following.contains_key(&key) {
            return Ok(());
        }
        let p = self
            .model
            .process(key)
            .ok_or_else(|| format!("process {} is not followed", key.pid))?;
        let start = match p.advisor_start()? {
            None => advisor::Start::FromStart,
            Some((device, held, segments)) => advisor::Start::Held {
                device,
                held,
                segments,
            },
        };
        // The limits the job stated before the advisor began, as the
        // markers it would have seen.
        let limits: Vec<Event> = (p.limits())
            .map(|(device, value, whole_device)| Event {
                time_ns: 0,
                kind: EventKind::Marker {
                    value,
                    source: MarkSource::MemoryLimit {
                        device,
                        whole_device,
                    },
                },
            })
            .collect();
        // Device memory: NVML's, where every GPU has the same (the
        // process's CUDA ordinal need not be NVML's index).
        let totals: Vec<Option<u64>> = self.machine.gpus.iter().map(|g| g.total).collect();
        let capacity = totals
            .first()
            .copied()
            .flatten()
            .filter(|t| totals.iter().all(|x| *x == Some(*t)));
        let torch = self
            .sources
            .get(&key)
            .and_then(|s| s.framework.as_deref())
            .and_then(vramscope_core::sim::advise::torch_version);
        let host_pid = self.identities.get(&key).map(|i| i.host_pid);
        a.following.insert(key, false);
        a.lost_at_start.insert(key, p.lost_events());
        a.tap.send(advisor::Msg::Start {
            key,
            host_pid: host_pid.filter(|_| a.host),
            start,
            capacity,
            torch,
        });
        if !limits.is_empty() {
            a.tap.send_events(key, limits);
        }
        Ok(())
    }

    /// Hands the events of an advised process to the advisor; when its
    /// queue is full, stops following the process and says so.
    fn advise_events(&mut self, b: &EventBatch) {
        let Some(a) = &self.advising else {
            return;
        };
        match a.following.get(&b.key) {
            Some(true) => return,
            Some(false) => {}
            None if a.all => {
                if self.advise(b.key).is_err() {
                    return;
                }
            }
            None => return,
        }
        let Some(a) = &mut self.advising else {
            return;
        };
        let events: Vec<_> = b
            .events
            .iter()
            .filter(|e| advisor::wanted(e))
            .cloned()
            .collect();
        if events.is_empty() {
            return;
        }
        if !a.tap.send_events(b.key, events) {
            a.following.insert(b.key, true);
            a.tap.send(advisor::Msg::Stop {
                key: b.key,
                why: format!(
                    "the job makes events faster than the advisor replays them within {:.0} % of a core",
                    advisor::CPU_SHARE * 100.0
                ),
            });
        }
    }

    /// A hub-wide drop count of the collector; beyond the bound on names,
    /// new names add to `"other"`.
    fn note_drop(&mut self, what: String, count: u64) {
        let names = self.model.config().bounds.collector_drop_names.max(1);
        if let Some(c) = self.dropped.get_mut(&what) {
            *c = count;
        } else if self.dropped.len() < names {
            self.dropped.insert(what, count);
        } else {
            let other = self.dropped.entry("other".into()).or_insert(0);
            *other = other.saturating_add(count);
        }
    }

    /// Hub-wide drops: the collector's, and the inputs of processes beyond
    /// the model's process bound (`"process_inputs"`).
    fn dropped(&self) -> BTreeMap<String, u64> {
        let mut out = self.dropped.clone();
        let n = self.model.dropped_events();
        if n > 0 {
            out.insert("process_inputs".into(), n);
        }
        out
    }

    fn apply_machine(
        &mut self,
        machine: Machine,
        host_pids: &HashMap<u32, ProcessKey>,
        fresh: Vec<(ProcessKey, Identity)>,
    ) {
        let now = machine.sampled_ns.unwrap_or_else(monotonic_ns);
        let mut per_pid: HashMap<u32, Option<u64>> = HashMap::new();
        for p in &machine.processes {
            let e = per_pid.entry(p.pid).or_insert(Some(0));
            *e = match (*e, p.used) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            };
        }
        for (pid, used) in &per_pid {
            let key = host_pids
                .get(pid)
                .copied()
                .or_else(|| fresh.iter().find(|(k, _)| k.pid == *pid).map(|(k, _)| *k));
            let Some(key) = key else { continue };
            if !self.model.admit(key) {
                continue;
            }
            if !self.sources.contains_key(&key) {
                self.model.set_mode(key, Mode::NvmlOnly);
                self.sources.insert(key, Source::unattached(Mode::NvmlOnly));
            }
            if let Some(b) = used {
                self.model.note_nvml(key, now, *b);
            }
        }
        // Only processes the model follows (its process bound) are named.
        for (key, id) in fresh {
            if self.model.process(key).is_some() {
                self.identities.entry(key).or_insert(id);
            }
        }
        // NVML-only processes that left the GPU are forgotten.
        let gone: Vec<ProcessKey> = self
            .sources
            .iter()
            .filter(|(k, s)| s.mode == Mode::NvmlOnly && !per_pid.contains_key(&k.pid))
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.sources.remove(&k);
            self.identities.remove(&k);
            self.model.remove(k);
        }
        self.machine = machine;
    }
}

/// A segment's delivery counts as of a tick's records (the counts of an
/// [`EventBatch`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tally {
    pub(crate) delivered: u64,
    pub(crate) lost: u64,
    pub(crate) lost_now: u64,
}

impl Tally {
    fn of(b: &EventBatch) -> Self {
        Tally {
            delivered: b.delivered,
            lost: b.lost,
            lost_now: b.lost_now,
        }
    }
}

/// The shared state between the collector tasks and the views. Writers hold
/// the lock only to apply a batch; readers only to take a snapshot.
pub struct Hub {
    inner: Mutex<Inner>,
    /// Shared with the advisor's worker, which calls it when it publishes.
    listener: advisor::SharedListener,
    recorder: Mutex<Recording>,
}

/// The recording the hub writes into, if any. A write that fails ends the
/// recording and keeps its error for whoever started it (the hub never
/// prints: a dashboard's screen is not its to write over).
#[derive(Default)]
enum Recording {
    #[default]
    Off,
    On(Recorder),
    Failed(std::io::Error),
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new(ModelConfig::default())
    }
}

impl Hub {
    pub fn new(cfg: ModelConfig) -> Self {
        Hub {
            inner: Mutex::new(Inner {
                model: Model::new(cfg),
                ..Inner::default()
            }),
            listener: Arc::new(Mutex::new(None)),
            recorder: Mutex::new(Recording::Off),
        }
    }

    /// Calls `f` (from a collector thread) after every change.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.listener.lock().expect("listener lock") = Some(Box::new(f));
    }

    /// Tells the listener that something changed (a replay's end: the
    /// progress it reports moved, though the model did not).
    pub(super) fn changed(&self) {
        if let Some(f) = self.listener.lock().expect("listener lock").as_ref() {
            f();
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    #[cfg(any(test, feature = "fixtures"))]
    /// Holds the hub's lock for `d` on a thread of its own, as a view that
    /// long would; returns once it is held (for tests).
    pub fn hold_for(self: &Arc<Self>, d: std::time::Duration) -> std::thread::JoinHandle<()> {
        let (held, told) = std::sync::mpsc::channel();
        let hub = self.clone();
        let h = std::thread::spawn(move || {
            hub.with(|_| {
                let _ = held.send(());
                std::thread::sleep(d);
            })
        });
        let _ = told.recv();
        h
    }

    /// A copy of everything, for a view or `snapshot --json`.
    pub fn snapshot(&self, opts: &ViewOptions) -> Snapshot {
        self.snapshot_at(monotonic_ns(), opts)
    }

    /// A copy of everything as of `now` (a replay's clock, not the wall's).
    pub fn snapshot_at(&self, now: u64, opts: &ViewOptions) -> Snapshot {
        self.snapshot_at_for(now, opts, None)
    }

    /// A copy of everything, with `opts`' detail (block map, events,
    /// timeline) for the process `focus` only when given: the figures alone
    /// for the others ([`Model::view_for`]).
    pub fn snapshot_for(&self, opts: &ViewOptions, focus: Option<ProcessKey>) -> Snapshot {
        self.snapshot_at_for(monotonic_ns(), opts, focus)
    }

    /// [`Self::snapshot_for`] as of `now`.
    pub fn snapshot_at_for(
        &self,
        now: u64,
        opts: &ViewOptions,
        focus: Option<ProcessKey>,
    ) -> Snapshot {
        let listener = self.listener.clone();
        self.with(|inner| {
            let view = inner.model.view_for(now, opts, focus);
            // The advisor's advice, read under its lock once per snapshot.
            let results = inner.advising.as_ref().map(|a| a.tap.results.clone());
            let advice = results
                .as_ref()
                .map(|r| r.lock().unwrap_or_else(|p| p.into_inner()));
            let mut to_advise = Vec::new();
            let mut lost_since = Vec::new();
            let processes = view
                .processes
                .into_iter()
                .map(|mut v| {
                    let key = v.key;
                    let followed = |a: &Advising| a.following.contains_key(&key);
                    let projected = v.forecast.as_ref().is_some_and(|f| {
                        f.method == vramscope_core::model::forecast::Method::Projection
                    });
                    if projected
                        && inner.auto_advise.is_some()
                        && !inner.advising.as_ref().is_some_and(followed)
                    {
                        to_advise.push(key);
                    }
                    let advice = advice.as_ref().and_then(|a| a.get(&key).cloned());
                    // Events lost since the advisor began: its replay is no
                    // longer the job's (the model resyncs; a replay cannot).
                    let lost = (inner.advising.as_ref())
                        .and_then(|a| a.lost_at_start.get(&key))
                        .map(|&at| v.figures.lost_events.saturating_sub(at))
                        .filter(|&n| n > 0);
                    let stopped = advice.as_ref().is_some_and(|a| a.coverage.stopped.is_some());
                    if let Some(n) = lost.filter(|_| !stopped) {
                        lost_since.push((key, n));
                    }
                    // The advisor's forecast by simulation, where it
                    // found a failure and still follows the job, in place
                    // of the projection.
                    let following = !stopped && lost.is_none();
                    let ahead = advice.as_ref().and_then(|a| a.ahead.as_ref());
                    if let Some(a) = ahead.filter(|_| following) {
                        if let (Some(oom), Some(request)) = (a.oom_step, a.request) {
                            v.forecast = Some(vramscope_core::model::forecast::simulated(
                                v.forecast.as_ref(),
                                a.at_step,
                                oom,
                                request,
                                a.survivors_per_step,
                                a.limit,
                                a.reserved,
                                a.fraction,
                            ));
                        }
                    }
                    ProcessEntry {
                        identity: inner
                            .identities
                            .get(&key)
                            .cloned()
                            .unwrap_or_else(|| Identity::of_pid(key.pid)),
                        source: inner
                            .sources
                            .get(&key)
                            .cloned()
                            .unwrap_or_else(|| Source::unattached(v.mode)),
                        advice,
                        view: v,
                    }
                })
                .collect();
            drop(advice);
            if let Some(a) = inner.advising.as_mut() {
                for (key, n) in lost_since {
                    if a.following.insert(key, true) != Some(true) {
                        a.tap.send(advisor::Msg::Stop {
                            key,
                            why: format!(
                                "the job lost {n} events since the advisor began (its ring overflowed): a replay of it would no longer be the job's"
                            ),
                        });
                    }
                }
            }
            if let Some((host, share)) = inner.auto_advise.filter(|_| !to_advise.is_empty()) {
                inner.advisor_on(listener, false, host, share);
                for key in to_advise {
                    // Not yet possible (its block map not known): the next
                    // snapshot asks again.
                    let _ = inner.advise(key);
                }
            }
            Snapshot {
                version: state::SNAPSHOT_VERSION,
                taken_ns: now,
                machine: inner.machine.clone(),
                processes,
                problems: inner.problems.clone(),
                dropped: inner.dropped(),
                cleaned: inner.cleaned.iter().cloned().collect(),
            }
        })
    }

    /// The step `key`'s allocations are tagged against (its latest
    /// counted step boundary), if any.
    pub fn step(&self, key: ProcessKey) -> Option<u64> {
        self.with(|i| i.model.process(key).and_then(|p| p.step()))
    }

    /// The processes that answer commands.
    pub(crate) fn commandable(&self) -> Vec<ProcessKey> {
        self.with(|i| {
            i.sources
                .iter()
                .filter(|(_, s)| s.commands && s.segment.is_some())
                .map(|(k, _)| *k)
                .collect()
        })
    }

    /// The process this machine calls `pid`, or that calls itself `pid`
    /// (inside a container); among several, an attached one first.
    pub fn find_pid(&self, pid: u32) -> Option<ProcessKey> {
        self.with(|i| {
            let mut found: Vec<ProcessKey> = i
                .identities
                .iter()
                .filter(|(k, id)| id.host_pid == pid || id.ns_pid == pid || k.pid == pid)
                .map(|(k, _)| *k)
                .collect();
            found.sort_by_key(|k| (i.sources.get(k).is_none_or(|s| s.segment.is_none()), *k));
            found.first().copied()
        })
    }

    /// Applies one input from a source (live or replayed), records it if a
    /// recording is running, and tells the views.
    /// The collector removed the segment at `path`, whose producer `pid`
    /// was gone: listed in the snapshots (the newest few), so a reader can
    /// say so. Not an input: nothing of a process changes.
    pub(crate) fn note_cleaned(&self, path: &std::path::Path, pid: u32) {
        self.with(|i| {
            i.cleaned_total += 1;
            if i.cleaned.len() >= state::CLEANED_KEPT {
                i.cleaned.pop_front();
            }
            i.cleaned.push_back(state::CleanedSegment {
                number: i.cleaned_total,
                path: path.display().to_string(),
                pid,
            });
        });
        self.changed();
    }

    /// Starts over with nothing applied (a playback seeking back to replay
    /// from its first input): every process, the machine and the problems
    /// forgotten, the model new with the same configuration. The advisor,
    /// when on, stays on and forgets what it followed.
    pub fn restart(&self) {
        self.with(|inner| {
            let cfg = inner.model.config().clone();
            if let Some(a) = &mut inner.advising {
                for (key, _) in a.following.drain() {
                    a.tap.send(advisor::Msg::Forget { key });
                }
                a.lost_at_start.clear();
            }
            let advising = inner.advising.take();
            let auto_advise = inner.auto_advise;
            *inner = Inner {
                model: Model::new(cfg),
                advising,
                auto_advise,
                ..Inner::default()
            };
        });
        self.changed();
    }

    pub fn apply(&self, input: Input) {
        self.record(&input);
        self.with(|inner| inner.apply(input));
        self.changed();
    }

    /// Applies a batch of events as [`Hub::apply`] applies
    /// `Input::Events(batch)` (recorded the same way), and gives the batch
    /// back: its vectors' capacity is reused for the next one.
    pub(crate) fn apply_events(&self, batch: EventBatch) -> EventBatch {
        let input = Input::Events(batch);
        self.record(&input);
        let Input::Events(batch) = input else {
            unreachable!("built above")
        };
        self.with(|inner| inner.apply_events(&batch));
        self.changed();
        batch
    }

    /// Applies one tick's records of `key`, in order, as
    /// [`apply_events`](Self::apply_events) applies the same records
    /// gathered into one batch. They are gathered (copied) only when a
    /// recording runs or the advisor follows processes, which keep
    /// batches; else they are applied where they lie.
    pub(crate) fn apply_merged<'a>(
        &self,
        key: ProcessKey,
        records: impl Iterator<Item = (&'a Event, RingPos)> + Clone,
        tally: Tally,
    ) {
        let batch = || {
            let (events, at) = records.clone().map(|(e, at)| (*e, at)).unzip();
            EventBatch {
                key,
                events,
                delivered: tally.delivered,
                lost: tally.lost,
                lost_now: tally.lost_now,
                at,
            }
        };
        let recording = matches!(
            *self.recorder.lock().unwrap_or_else(|p| p.into_inner()),
            Recording::On(_)
        );
        if recording {
            self.apply_events(batch());
            return;
        }
        self.with(|inner| {
            #[cfg(feature = "live-floor")]
            if inner.floor.apply(key, records.clone()) {
                inner.note_tally(key, tally);
                return;
            }
            if inner.advising.is_some() {
                inner.apply_events(&batch());
            } else {
                inner
                    .model
                    .apply_records(key, records.clone().map(|(e, at)| (e, Some(at))));
                inner.note_tally(key, tally);
            }
        });
        self.changed();
    }

    /// Writes `input` into the recording, if one runs. The lock is taken
    /// once: a failed write ends the recording under the same guard.
    fn record(&self, input: &Input) {
        let mut slot = self.recorder.lock().unwrap_or_else(|p| p.into_inner());
        if let Recording::On(rec) = &mut *slot {
            if let Err(e) = rec.write(monotonic_ns(), input) {
                *slot = Recording::Failed(e);
            }
        }
    }

    /// The processes to ask for a fresh state snapshot now: the model wants
    /// one (after loss or a contradiction) and has not asked lately, and the
    /// process is alive and answers commands. Each is noted as asked. The
    /// collector reads this after each step; the model only keeps the state.
    pub(crate) fn take_resyncs(&self, now_ns: u64) -> Vec<ProcessKey> {
        self.with(|i| {
            let due: Vec<ProcessKey> = i
                .model
                .resync_due(now_ns)
                .into_iter()
                .filter(|k| i.sources.get(k).is_some_and(|s| s.commands))
                .collect();
            for k in &due {
                i.model.resync_requested(*k, now_ns);
            }
            due
        })
    }

    /// Writes every input from now on into `rec` as well.
    pub fn record_to(&self, rec: Recorder) {
        *self.recorder.lock().unwrap_or_else(|p| p.into_inner()) = Recording::On(rec);
    }

    /// Whether the recording stopped on a failed write (a full disk, a
    /// closed pipe): its owner stops waiting and says so.
    pub fn recording_failed(&self) -> bool {
        matches!(
            *self.recorder.lock().unwrap_or_else(|p| p.into_inner()),
            Recording::Failed(_)
        )
    }

    /// Flushes and closes the recording, if any; the error of a write that
    /// failed earlier, if one did.
    pub fn stop_recording(&self) -> std::io::Result<()> {
        let taken = std::mem::take(&mut *self.recorder.lock().unwrap_or_else(|p| p.into_inner()));
        match taken {
            Recording::On(r) => r.finish(),
            Recording::Failed(e) => Err(e),
            Recording::Off => Ok(()),
        }
    }

    /// Hub-wide drops by what: the collector's own (`Input::Dropped`
    /// without a process) and `"process_inputs"`, the inputs of processes
    /// beyond the model's process bound. (Per-process drops are in each
    /// process's view.)
    pub fn dropped(&self) -> BTreeMap<String, u64> {
        self.with(|i| i.dropped())
    }

    /// Starts the live advisor (its thread) if it is not running; `all`:
    /// every process is advised from now on, not only those asked for;
    /// `host`: the processes are this host's (their environment says their
    /// setting), not a recording's.
    /// `share`: the share of one core the advisor may use (None: no bound;
    /// a recording played as fast as it is read waits for it instead).
    pub fn enable_advisor(&self, all: bool, host: bool, share: Option<f64>) {
        let listener = self.listener.clone();
        self.with(|i| {
            i.advisor_on(listener, all, host, share);
            if all {
                let keys: Vec<ProcessKey> = i.model.processes().map(|p| p.key()).collect();
                for k in keys {
                    let _ = i.advise(k);
                }
            }
        });
    }

    /// From now on, a process whose forecast is a projection (a leak
    /// heading for its limit) is followed by the live advisor, started
    /// if it is not running (`host`, `share` as for
    /// [`Self::enable_advisor`]): its forecast by simulation replaces the
    /// projection once it has two steps to repeat. Taken up when a
    /// snapshot shows the projection.
    pub fn advise_forecasts(&self, host: bool, share: Option<f64>) {
        self.with(|i| i.auto_advise = Some((host, share)));
    }

    /// Events waiting for the advisor (0 when it does not run).
    pub(crate) fn advisor_backlog(&self) -> usize {
        self.with(|i| i.advising.as_ref().map_or(0, |a| a.tap.backlog()))
    }

    /// Waits until the advisor has replayed every event sent to it and
    /// published its advice (at most `limit`).
    pub fn advisor_flush(&self, limit: std::time::Duration) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let sent = self.with(|i| {
            i.advising
                .as_ref()
                .map(|a| a.tap.send(advisor::Msg::Flush(tx)))
                .is_some()
        });
        if sent {
            let _ = rx.recv_timeout(limit);
        }
    }

    /// Advises `key` from now on (the advisor must be enabled); an error
    /// says why it cannot be.
    pub fn advise(&self, key: ProcessKey) -> Result<(), String> {
        self.with(|i| i.advise(key))
    }

    /// Resets the model's peak figures of `key` (after a producer's reset):
    /// [`Input::PeaksReset`], applied and recorded as every input is.
    pub fn reset_peaks(&self, key: ProcessKey) {
        self.apply(Input::PeaksReset { key });
    }

    /// What `key`'s block map holds allocated on `device` now, and the
    /// most it held since its peaks were last reset (0, 0 when unknown):
    /// a constant-time reading, for `diff` to find where a run peaked.
    pub(crate) fn allocated_on(&self, key: ProcessKey, device: u16) -> (u64, u64) {
        self.with(|i| {
            let d = (i.model.process(key).into_iter())
                .flat_map(|p| p.devices())
                .find(|d| d.device() == device);
            d.map_or((0, 0), |d| {
                (d.derived().allocated, d.derived_peaks().allocated)
            })
        })
    }
}
