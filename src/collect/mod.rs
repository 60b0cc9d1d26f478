//! The collector: sources → model. Rings are discovered and drained, NVML is
//! polled off the async runtime, `/proc` names the processes; everything is
//! applied to the pure [`Model`] under a short lock in the [`Hub`], which the
//! views read as a [`Snapshot`].
//!
//! ```text
//!  rings::RingSet ──events──▶┐
//!  nvml::NvmlSource ─Machine─▶ Hub { Model, Machine, identities } ──snapshot()──▶ views
//!  procfs ──────identities──▶┘        ▲
//!                                     └── command(key, Command): the one channel back
//! ```
//!
//! - [`state`]: the published picture ([`Snapshot`]), also `snapshot --json`.
//! - [`rings`]: segment discovery and draining.
//! - [`nvml`]: devices and per-process NVML figures.
//! - [`procfs`]: names, users, start times, host pids.

pub mod nvml;
pub mod procfs;
pub mod rings;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::model::{Mode, Model, ModelConfig, ProcessKey, ViewOptions};
use crate::ring::{monotonic_ns, Command, Outcome, RingError, SegmentReader};

pub use crate::input::{Identity, Input, Machine, Source, SourceProblem};
pub use state::{ProcessEntry, Snapshot};

/// How the collector runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub shm_dir: PathBuf,
    /// NVML poll period (default 1 s).
    pub nvml_interval: Duration,
    /// Ring drain period (default 50 ms).
    pub ring_interval: Duration,
    /// Segment directory scan period (default 500 ms).
    pub discover_interval: Duration,
    /// How long an exited process stays visible (default 60 s).
    pub exited_linger: Duration,
    /// Read NVML at all.
    pub nvml: bool,
    /// Remove segments left by dead processes of this user.
    pub clean_stale: bool,
}

impl Config {
    pub fn new(shm_dir: PathBuf) -> Self {
        Config {
            shm_dir,
            nvml_interval: Duration::from_secs(1),
            ring_interval: Duration::from_millis(50),
            discover_interval: Duration::from_millis(500),
            exited_linger: Duration::from_secs(60),
            nvml: true,
            clean_stale: true,
        }
    }
}

type Listener = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) model: Model,
    pub(crate) machine: Machine,
    pub(crate) identities: HashMap<ProcessKey, Identity>,
    pub(crate) sources: HashMap<ProcessKey, Source>,
    pub(crate) problems: Vec<SourceProblem>,
}

impl Inner {
    fn apply(&mut self, input: Input) -> bool {
        match input {
            Input::Attach {
                key,
                identity,
                source,
                ..
            } => {
                self.model.set_mode(key, source.mode);
                self.identities.insert(key, identity);
                if let Some(seg) = &source.segment {
                    self.problems.retain(|p| &p.path != seg);
                }
                self.sources.insert(key, source);
                false
            }
            Input::Events {
                key,
                events,
                delivered,
                lost,
                lost_now,
                ..
            } => {
                self.model.apply_all(key, events.iter());
                if lost_now > 0 {
                    self.model.note_loss(key, lost_now);
                }
                let mut commands = false;
                if let Some(s) = self.sources.get_mut(&key) {
                    s.delivered = delivered;
                    s.lost = lost;
                    commands = s.commands;
                }
                commands && self.model.resync_wanted().any(|k| k == key)
            }
            Input::Gone { key } => {
                if let Some(s) = self.sources.get_mut(&key) {
                    s.commands = false;
                }
                if let Some(id) = self.identities.get_mut(&key) {
                    id.alive = false;
                }
                false
            }
            Input::Forget { key } => {
                self.model.remove(key);
                self.identities.remove(&key);
                self.sources.remove(&key);
                false
            }
            Input::Machine {
                machine,
                host_pids,
                fresh,
            } => {
                self.apply_machine(machine, &host_pids.into_iter().collect(), fresh);
                false
            }
            Input::Problems { problems } => {
                self.problems = problems;
                false
            }
            // Counts of what a bound dropped: recorded, not yet shown.
            Input::Dropped { .. } => false,
        }
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
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
        }
        for (pid, used) in &per_pid {
            let key = host_pids
                .get(pid)
                .copied()
                .or_else(|| fresh.iter().find(|(k, _)| k.pid == *pid).map(|(k, _)| *k));
            let Some(key) = key else { continue };
            if !self.sources.contains_key(&key) {
                self.model.set_mode(key, Mode::NvmlOnly);
                self.sources.insert(key, Source::unattached(Mode::NvmlOnly));
            }
            if let Some(b) = used {
                self.model.note_nvml(key, now, *b);
            }
        }
        for (key, id) in fresh {
            self.identities.entry(key).or_insert(id);
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

/// Reads NVML's processes that no instrumented segment covers from `/proc`:
/// their model key and identity. Done by the source, outside the hub lock.
pub fn fresh_nvml_processes(
    machine: &Machine,
    host_pids: &HashMap<u32, ProcessKey>,
) -> Vec<(ProcessKey, Identity)> {
    let mut out: Vec<(ProcessKey, Identity)> = Vec::new();
    for p in &machine.processes {
        if host_pids.contains_key(&p.pid) || out.iter().any(|(k, _)| k.pid == p.pid) {
            continue;
        }
        if let Some(t) = crate::ring::discover::proc_start_time(p.pid) {
            let id = procfs::identity(p.pid).unwrap_or_else(|| Identity {
                host_pid: p.pid,
                ns_pid: p.pid,
                ..Identity::default()
            });
            out.push((
                ProcessKey {
                    pid: p.pid,
                    start_time: t,
                },
                id,
            ));
        }
    }
    out
}

/// The shared state between the collector tasks and the views. Writers hold
/// the lock only to apply a batch; readers only to take a snapshot.
pub struct Hub {
    inner: Mutex<Inner>,
    version: AtomicU64,
    listener: Mutex<Option<Listener>>,
    recorder: Mutex<Option<crate::recording::Recorder>>,
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
            version: AtomicU64::new(0),
            listener: Mutex::new(None),
            recorder: Mutex::new(None),
        }
    }

    /// Calls `f` (from a collector thread) after every change.
    pub fn on_change(&self, f: impl Fn() + Send + Sync + 'static) {
        *self.listener.lock().expect("listener lock") = Some(Box::new(f));
    }

    /// Increases with every change; a view redraws only when it moved.
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    pub(crate) fn changed(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        if let Some(f) = self.listener.lock().expect("listener lock").as_ref() {
            f();
        }
    }

    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut g)
    }

    /// A copy of everything, for a view or `snapshot --json`.
    pub fn snapshot(&self, opts: &ViewOptions) -> Snapshot {
        self.snapshot_at(monotonic_ns(), opts)
    }

    /// A copy of everything as of `now` (a replay's clock, not the wall's).
    pub fn snapshot_at(&self, now: u64, opts: &ViewOptions) -> Snapshot {
        self.with(|inner| {
            let view = inner.model.view(now, opts);
            let processes =
                view.processes
                    .into_iter()
                    .map(|v| {
                        let key = v.key;
                        ProcessEntry {
                            identity: inner.identities.get(&key).cloned().unwrap_or_else(|| {
                                Identity {
                                    host_pid: key.pid,
                                    ns_pid: key.pid,
                                    ..Identity::default()
                                }
                            }),
                            source: inner
                                .sources
                                .get(&key)
                                .cloned()
                                .unwrap_or_else(|| Source::unattached(v.mode)),
                            view: v,
                        }
                    })
                    .collect();
            Snapshot {
                version: state::SNAPSHOT_VERSION,
                taken_ns: now,
                machine: inner.machine.clone(),
                processes,
                problems: inner.problems.clone(),
            }
        })
    }

    /// The segment of an instrumented process, if it has one.
    pub fn segment_of(&self, key: ProcessKey) -> Option<PathBuf> {
        self.with(|i| {
            i.sources
                .get(&key)
                .and_then(|s| s.segment.clone())
                .map(PathBuf::from)
        })
    }

    /// Applies one input from a source (live or replayed), records it if a
    /// recording is running, and tells the views. Returns whether the model
    /// now wants a state snapshot from `key` (for `Input::Events`).
    pub fn apply(&self, input: Input) -> bool {
        if let Some(rec) = self.recorder.lock().expect("recorder lock").as_mut() {
            if let Err(e) = rec.write(monotonic_ns(), &input) {
                eprintln!("vramscope: recording stopped: {e}");
                *self.recorder.lock().expect("recorder lock") = None;
            }
        }
        let wants = self.with(|inner| inner.apply(input));
        self.changed();
        wants
    }

    /// Writes every input from now on into `rec` as well.
    pub fn record_to(&self, rec: crate::recording::Recorder) {
        *self.recorder.lock().expect("recorder lock") = Some(rec);
    }

    /// Flushes and closes the recording, if any.
    pub fn stop_recording(&self) -> std::io::Result<()> {
        match self.recorder.lock().expect("recorder lock").take() {
            Some(r) => r.finish(),
            None => Ok(()),
        }
    }

    /// Resets the model's peak figures of `key` (after a producer's reset).
    pub fn reset_peaks(&self, key: ProcessKey) {
        self.with(|i| i.model.reset_peaks(key));
        self.changed();
    }
}

/// Posts `cmd` to the process `key` and waits for its answer (blocking: call
/// it off the UI thread). The one channel back to a process.
pub fn command(
    hub: &Hub,
    key: ProcessKey,
    cmd: Command,
    timeout: Duration,
) -> Result<Outcome, RingError> {
    let path = hub
        .segment_of(key)
        .ok_or_else(|| RingError::Invalid(format!("process {} has no agent segment", key.pid)))?;
    let reader = SegmentReader::open_at(&path, crate::ring::Start::Now)?;
    let out = reader.command(cmd, timeout)?;
    if matches!(cmd, Command::ResetPeaks { .. }) && out.status == crate::ring::Status::Ok {
        hub.reset_peaks(key);
    }
    Ok(out)
}

/// Starts the collector on a small tokio runtime of its own (background
/// threads) and returns at once. It runs until the process exits.
pub fn spawn(hub: Arc<Hub>, cfg: Config) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .thread_name("vramscope-collect")
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("vramscope-collector".into())
        .spawn(move || {
            rt.block_on(run(hub, cfg));
        })?;
    Ok(())
}

/// The collector's tasks: the ring loop and the NVML loop.
pub async fn run(hub: Arc<Hub>, cfg: Config) {
    let host_pids: Arc<Mutex<HashMap<u32, ProcessKey>>> = Arc::default();
    let nvml_task = {
        let hub = hub.clone();
        let cfg = cfg.clone();
        let host_pids = host_pids.clone();
        tokio::spawn(async move {
            let source = if cfg.nvml {
                tokio::task::spawn_blocking(nvml::NvmlSource::init)
                    .await
                    .unwrap_or_else(|_| nvml::NvmlSource::disabled("NVML initialisation panicked"))
            } else {
                nvml::NvmlSource::disabled("NVML disabled (--no-nvml)")
            };
            let source = Arc::new(source);
            let mut tick = tokio::time::interval(cfg.nvml_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let s = source.clone();
                let Ok(machine) = tokio::task::spawn_blocking(move || s.poll(monotonic_ns())).await
                else {
                    continue;
                };
                let pids = host_pids.lock().expect("pids").clone();
                let fresh = fresh_nvml_processes(&machine, &pids);
                hub.apply(Input::Machine {
                    machine,
                    host_pids: pids.into_iter().collect(),
                    fresh,
                });
                if !source.available() {
                    // Nothing will change: poll rarely.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
            }
        })
    };
    let ring_task = {
        let hub = hub.clone();
        tokio::spawn(async move {
            let mut set = rings::RingSet::new(cfg.clone());
            let mut tick = tokio::time::interval(cfg.ring_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                let (s, h) = (set, hub.clone());
                let Ok(s) = tokio::task::spawn_blocking(move || {
                    let mut s = s;
                    s.step(&h);
                    s
                })
                .await
                else {
                    return;
                };
                set = s;
                *host_pids.lock().expect("pids") = set.host_pids();
            }
        })
    };
    let _ = tokio::join!(nvml_task, ring_task);
}

/// One look at the machine, for `vramscope snapshot`: NVML once, every
/// segment drained, and each producer that answers commands asked for a
/// fresh state snapshot (up to `wait` each) so block maps are exact.
pub fn snapshot_once(cfg: Config, wait: Duration, opts: &ViewOptions) -> Snapshot {
    let hub = Hub::default();
    let mut set = rings::RingSet::new(cfg.clone());
    set.step(&hub);
    let machine = if cfg.nvml {
        nvml::NvmlSource::init().poll(monotonic_ns())
    } else {
        nvml::NvmlSource::disabled("NVML disabled (--no-nvml)").poll(monotonic_ns())
    };
    let pids = set.host_pids();
    let fresh = fresh_nvml_processes(&machine, &pids);
    hub.apply(Input::Machine {
        machine,
        host_pids: pids.into_iter().collect(),
        fresh,
    });
    let asks: Vec<PathBuf> = hub.with(|i| {
        i.sources
            .values()
            .filter(|s| s.commands)
            .filter_map(|s| s.segment.clone().map(PathBuf::from))
            .collect()
    });
    std::thread::scope(|s| {
        for path in &asks {
            s.spawn(move || {
                if let Ok(r) = SegmentReader::open_at(path, crate::ring::Start::Now) {
                    let _ = r.command(Command::Snapshot { device: None }, wait);
                }
            });
        }
    });
    set.step(&hub);
    hub.snapshot(opts)
}
