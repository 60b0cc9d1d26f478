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

pub use state::{Identity, Machine, ProcessEntry, Snapshot, Source, SourceProblem};

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

/// The shared state between the collector tasks and the views. Writers hold
/// the lock only to apply a batch; readers only to take a snapshot.
pub struct Hub {
    inner: Mutex<Inner>,
    version: AtomicU64,
    listener: Mutex<Option<Listener>>,
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
        let now = monotonic_ns();
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
                            source: inner.sources.get(&key).cloned().unwrap_or(Source {
                                mode: v.mode,
                                segment: None,
                                producer: None,
                                framework: None,
                                delivered: 0,
                                lost: 0,
                                commands: false,
                            }),
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

    /// Applies a new NVML reading: machine figures, and per-process used
    /// memory into the model (creating NVML-only processes as needed).
    pub fn apply_machine(&self, machine: Machine, host_pids: &HashMap<u32, ProcessKey>) {
        let now = machine.sampled_ns.unwrap_or_else(monotonic_ns);
        let mut per_pid: HashMap<u32, Option<u64>> = HashMap::new();
        for p in &machine.processes {
            let e = per_pid.entry(p.pid).or_insert(Some(0));
            *e = match (*e, p.used) {
                (Some(a), Some(b)) => Some(a + b),
                _ => None,
            };
        }
        let mut fresh = Vec::new();
        for &pid in per_pid.keys() {
            if !host_pids.contains_key(&pid) {
                if let Some(t) = crate::ring::discover::proc_start_time(pid) {
                    fresh.push((
                        pid,
                        ProcessKey { pid, start_time: t },
                        procfs::identity(pid),
                    ));
                }
            }
        }
        self.with(|inner| {
            for (pid, used) in &per_pid {
                let key = host_pids
                    .get(pid)
                    .copied()
                    .or_else(|| fresh.iter().find(|(p, _, _)| p == pid).map(|(_, k, _)| *k));
                let Some(key) = key else { continue };
                if !inner.sources.contains_key(&key) {
                    inner.model.set_mode(key, Mode::NvmlOnly);
                    inner.sources.insert(
                        key,
                        Source {
                            mode: Mode::NvmlOnly,
                            segment: None,
                            producer: None,
                            framework: None,
                            delivered: 0,
                            lost: 0,
                            commands: false,
                        },
                    );
                }
                if let Some(b) = used {
                    inner.model.note_nvml(key, now, *b);
                }
            }
            for (_, key, id) in fresh {
                if let Some(id) = id {
                    inner.identities.entry(key).or_insert(id);
                }
            }
            // NVML-only processes that left the GPU are forgotten.
            let gone: Vec<ProcessKey> = inner
                .sources
                .iter()
                .filter(|(k, s)| s.mode == Mode::NvmlOnly && !per_pid.contains_key(&k.pid))
                .map(|(k, _)| *k)
                .collect();
            for k in gone {
                inner.sources.remove(&k);
                inner.identities.remove(&k);
                inner.model.remove(k);
            }
            inner.machine = machine;
        });
        self.changed();
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
                hub.apply_machine(machine, &pids);
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
    hub.apply_machine(machine, &set.host_pids());
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
