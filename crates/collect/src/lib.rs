//! vramscope's collector, and what stands on it.
//!
//! The collector proper (this file, [`hub`], [`state`], [`rings`],
//! [`nvml`], [`procfs`], [`replay`], [`signals`], [`advisor`],
//! [`profile`]) feeds the model from live sources; on it stand:
//!
//! - [`agent`]: the embedded PyTorch agent: extract, run a command with it,
//!   doctor checks.
//! - [`attach`]: `vramscope attach PID`: the agent put into a running
//!   Python process.
//! - [`trace`]: stepping through a snapshot file's trace, each step the
//!   state the model rebuilds in the hub.
//! - [`demo`]: the simulator writing into a real segment, for `vramscope demo`.
//! - [`serve`]: the collector's picture as Prometheus metrics.
//! - [`fleet`]: many machines through Prometheus (`vramscope fleet`).
//! - [`given`]: a file named on the command line (a recording or a
//!   snapshot file), told apart and read once whatever it is.
//! - [`recorded`]: the process of a recording a command takes (its
//!   census), its events and its requests, for `sim`, `advise` and `diff`.
//!
//! Layers, floor 0 first (`tests/layers.rs` holds each crate's files to
//! its list; the collector's own files are the crate root's floor):
//!
//! 0. fleet, state, advisor, floor, nvml, procfs, signals, recorded
//! 1. hub
//! 2. rings, replay, profile, fixtures
//! 3. agent, trace
//! 4. attach, demo, serve, given
//!
//! The collector: sources → hub. One type, [`Collector`], owns every source
//! (the segments of instrumented processes, NVML, the host-pid map from
//! `/proc`) and the [`Hub`] they feed; every way of running vramscope drives
//! it the same way: the dashboard, `snapshot`, `record`, the demo and
//! `replay --ui`.
//!
//! ```text
//!  rings::RingSet ──events──▶┐
//!  nvml::NvmlSource ─Machine─▶ Collector::{step, poll_nvml} ──Input──▶ Hub ──snapshot()──▶ views
//!  procfs ─────identities───▶┘        │                               │
//!                                     └─ ring::client::command ◀──────┘ take_resyncs()
//!                                        (the segment RingSet reads)
//! ```
//!
//! - [`Collector::step`] scans the segment directory when due, drains every
//!   segment and applies what it read; [`Collector::poll_nvml`] reads NVML
//!   once. Both are plain functions: headless drivers (the demo's lockstep
//!   run, `snapshot`) call them directly.
//! - [`Collector::run_until`] is the live loop, on tokio: a ring tick and an
//!   NVML tick (`MissedTickBehavior::Skip`); NVML runs off the runtime
//!   (`spawn_blocking`). After each step it reads what the model wants
//!   ([`Hub::take_resyncs`]) and asks those processes for a state snapshot.
//! - Commands: the one way to a process is [`vramscope_wire::ring::client`] (a
//!   segment opened once, a command posted on its control block, the answer
//!   waited for). The collector sends its own requests (resync snapshots,
//!   `snapshot`'s fresh states) through it, on the runtime's blocking
//!   threads, to the segment it reads the process from. The dashboard sends
//!   its users' commands through it to the segment its snapshot shows, and
//!   the subcommands to the segment they find by pid: neither goes through
//!   the collector.
//! - [`Live`]: the collector on a runtime of its own, for a dashboard whose
//!   thread is not async. The dashboard reads the hub (`snapshot`,
//!   `on_change`), asks [`Live::refusal`] whether its processes may be sent
//!   commands (not under `--readonly`, nor a replay's) and hears signals
//!   through [`Live::on_signal`]; signals come back as calls from a
//!   thread of their own, which the dashboard turns into events on its
//!   own channel.
//!
//! Files: [`hub`] (the shared state), [`state`] (the published picture),
//! [`rings`] (segment discovery and draining), [`nvml`], [`procfs`],
//! [`replay`] (a recording played back at any speed), [`signals`].

pub mod agent;
pub mod attach;
pub mod demo;
pub mod fleet;
pub mod given;
pub mod serve;
pub mod trace;

pub(crate) mod advisor;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
#[cfg(feature = "live-floor")]
mod floor;
pub(crate) mod hub;
pub(crate) mod nvml;
pub mod procfs;
pub(crate) mod profile;
pub mod recorded;
pub mod replay;
pub(crate) mod rings;
pub mod signals;
pub(crate) mod state;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vramscope_core::model::ProcessKey;
use vramscope_wire::ring::client::{self, Expect};
use vramscope_wire::ring::{monotonic_ns, Command, Outcome, RingError, Status};

pub use advisor::CPU_SHARE as ADVISOR_CPU_SHARE;
pub use hub::Hub;
pub use state::{CleanedSegment, ProcessEntry, Snapshot};
pub use vramscope_core::input::{Identity, Input, Machine};

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
    /// Send nothing to any process (`--readonly`): no resync snapshots,
    /// and a [`Live`] whose [`Live::refusal`] refuses every command.
    pub readonly: bool,
    /// Segments already present at the first scan are read from their
    /// oldest record (the dashboard's way: it shows what the rings still
    /// hold); when false, from their head, so only what is written from
    /// now on is read (`record` without `--backlog`), and the model
    /// anchors on a snapshot it asks for (FORMAT.md, "Attaching
    /// mid-run"). Segments that appear later are always read from their
    /// oldest record: their whole life is after the start; so are those
    /// whose producer takes no commands (nothing could ask it for the
    /// snapshot to anchor on; its backlog may hold one).
    pub backlog: bool,
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
            readonly: false,
            backlog: true,
        }
    }
}

/// How long a resync snapshot may take.
const RESYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// Owns the sources and the hub they feed.
pub struct Collector {
    cfg: Config,
    hub: Arc<Hub>,
    rings: rings::RingSet,
    /// Initialised on first use (it can take a while; the dashboard draws first).
    nvml: Option<Arc<nvml::NvmlSource>>,
    /// Host pid → model key of every attached process (for NVML's figures).
    host_pids: HashMap<u32, ProcessKey>,
    /// The rings' generation `host_pids` was read at.
    host_pids_of: Option<u64>,
    /// CPU, memory and age of the processes shown (`/proc`).
    host: procfs::HostSampler,
    /// Processes whose agent answered a snapshot request "unsupported":
    /// never asked for one again.
    no_snapshots: Arc<Mutex<HashSet<ProcessKey>>>,
}

impl Collector {
    /// A collector feeding a new hub.
    pub fn new(cfg: Config) -> Self {
        Collector::with_hub(cfg, Arc::new(Hub::default()))
    }

    /// A collector feeding `hub`.
    pub(crate) fn with_hub(cfg: Config, hub: Arc<Hub>) -> Self {
        Collector {
            rings: rings::RingSet::new(cfg.clone()),
            cfg,
            hub,
            nvml: None,
            host_pids: HashMap::new(),
            host_pids_of: None,
            host: procfs::HostSampler::default(),
            no_snapshots: Arc::default(),
        }
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Sends `command` to the attached process `key` through the segment
    /// it is read from ([`client::command`]), on one of the runtime's
    /// blocking threads. None when no segment of it is read.
    fn ask(
        &self,
        key: ProcessKey,
        command: Command,
        timeout: Duration,
    ) -> Option<tokio::task::JoinHandle<Result<Outcome, RingError>>> {
        let path = self.rings.segment_of(key)?;
        let expect = Expect {
            pid: key.pid,
            start_time: key.start_time,
        };
        Some(tokio::task::spawn_blocking(move || {
            client::command(&path, Some(expect), command, timeout)
        }))
    }

    /// Asks the processes the model wants a state snapshot of for one
    /// (never under `readonly`, nor a process that answered "unsupported").
    fn ask_resyncs(&self) {
        if self.cfg.readonly {
            return;
        }
        for key in self.hub.take_resyncs(monotonic_ns()) {
            let refused = self.no_snapshots.clone();
            if refused
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(&key)
            {
                continue;
            }
            let Some(ask) = self.ask(key, Command::Snapshot { device: None }, RESYNC_TIMEOUT)
            else {
                continue;
            };
            tokio::spawn(async move {
                if let Ok(Ok(Outcome {
                    status: Status::Unsupported,
                    ..
                })) = ask.await
                {
                    refused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key);
                }
            });
        }
    }

    /// One step: scan the segment directory if due, drain every segment,
    /// apply what was read.
    pub fn step(&mut self) {
        self.rings.step(&self.hub);
        let generation = Some(self.rings.generation());
        if self.host_pids_of != generation {
            self.host_pids_of = generation;
            self.host_pids = self.rings.host_pids();
        }
    }

    /// One NVML reading applied to the hub (blocking: NVML calls the driver).
    pub(crate) fn poll_nvml(&mut self) {
        let source = self.nvml_source();
        let machine = source.poll(monotonic_ns());
        self.apply_machine(machine);
    }

    fn nvml_source(&mut self) -> Arc<nvml::NvmlSource> {
        let enabled = self.cfg.nvml;
        self.nvml
            .get_or_insert_with(|| Arc::new(nvml::NvmlSource::new(enabled)))
            .clone()
    }

    fn apply_machine(&mut self, mut machine: Machine) {
        // The host side of every process shown, read with NVML.
        let mut pids: Vec<u32> = self.host_pids.keys().copied().collect();
        pids.extend(machine.processes.iter().map(|p| p.pid));
        pids.sort_unstable();
        pids.dedup();
        let now = machine.sampled_ns.unwrap_or_else(monotonic_ns);
        machine.host = self.host.sample(&pids, now);
        let fresh = fresh_nvml_processes(&machine, &self.host_pids);
        self.hub.apply(Input::Machine {
            machine,
            host_pids: self.host_pids.iter().map(|(p, k)| (*p, *k)).collect(),
            fresh,
        });
    }

    /// The live loop, until `stop` completes: drain the segments every
    /// `ring_interval`, read NVML and the processes' host figures every
    /// `nvml_interval` (every 5 s when there is neither NVML nor a process), ask for the snapshots the model wants. Then one last
    /// step, so nothing written before `stop` is left unread.
    pub async fn run_until(&mut self, stop: impl Future<Output = ()>) {
        let mut ring_tick = tokio::time::interval(self.cfg.ring_interval);
        ring_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut nvml_tick = tokio::time::interval(self.cfg.nvml_interval);
        nvml_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                // Stop first: a tick polled once the runtime is shutting
                // down would panic.
                biased;
                _ = &mut stop => break,
                _ = ring_tick.tick() => {
                    off_runtime(|| self.step());
                    self.ask_resyncs();
                    if self.rings.is_empty() {
                        // Nothing to drain: only the directory scan is
                        // due, at its own period.
                        ring_tick.reset_after(self.cfg.discover_interval.max(self.cfg.ring_interval));
                    }
                }
                _ = nvml_tick.tick() => {
                    let source = self.nvml_source();
                    // Without NVML the reading is only its error (no call
                    // to make); the host figures (CPU%, RSS, TIME) are
                    // still read at each tick, as htop's are (issue 30,
                    // item 7: they waited 30 s between readings).
                    let machine = if source.available() {
                        let source = source.clone();
                        tokio::task::spawn_blocking(move || source.poll(monotonic_ns()))
                            .await
                            .ok()
                    } else {
                        Some(source.poll(monotonic_ns()))
                    };
                    if let Some(machine) = machine {
                        self.apply_machine(machine);
                    }
                    if !source.available() && self.rings.is_empty() {
                        // No NVML and no process to read: nothing changes
                        // between readings; look again in 5 s.
                        nvml_tick.reset_after(Duration::from_secs(5));
                    }
                }
            }
        }
        off_runtime(|| self.step());
    }

    /// One look at the machine (`vramscope snapshot`): every segment drained,
    /// NVML once, each process that answers commands asked for a fresh state
    /// snapshot (waiting up to `wait` for each, all at once), drained again.
    pub async fn look(&mut self, wait: Duration) {
        off_runtime(|| self.step());
        let source = self.nvml_source();
        if let Ok(machine) = tokio::task::spawn_blocking(move || source.poll(monotonic_ns())).await
        {
            self.apply_machine(machine);
        }
        let commandable = if self.cfg.readonly {
            Vec::new()
        } else {
            self.hub.commandable()
        };
        let asks: Vec<_> = commandable
            .into_iter()
            .filter_map(|k| self.ask(k, Command::Snapshot { device: None }, wait))
            .collect();
        for a in asks {
            let _ = a.await;
        }
        off_runtime(|| self.step());
    }

    /// The attached or NVML-seen process that this machine (or the process
    /// itself, inside a container) calls `pid`.
    pub fn find_pid(&self, pid: u32) -> Option<ProcessKey> {
        self.hub.find_pid(pid)
    }
}

/// Why a read-only collector's processes are sent nothing.
const READONLY: &str = "read-only (--readonly): no command is sent to any process";

/// Why a replayed recording's processes are sent nothing.
const REPLAYED: &str = "a recording is played back: its processes cannot be sent commands";

/// NVML's processes that no instrumented segment covers, read from `/proc`:
/// their model key and identity.
fn fresh_nvml_processes(
    machine: &Machine,
    host_pids: &HashMap<u32, ProcessKey>,
) -> Vec<(ProcessKey, Identity)> {
    let mut out: Vec<(ProcessKey, Identity)> = Vec::new();
    for p in &machine.processes {
        if host_pids.contains_key(&p.pid) || out.iter().any(|(k, _)| k.pid == p.pid) {
            continue;
        }
        if let Some(t) = vramscope_wire::ring::discover::proc_start_time(p.pid) {
            let id = procfs::identity(p.pid).unwrap_or_else(|| Identity::of_pid(p.pid));
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

/// Runs `f` (file and `/proc` reads: short, but blocking) telling a
/// multi-threaded runtime to move its other tasks off this thread meanwhile.
fn off_runtime<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// A multi-threaded tokio runtime for the collector: one worker for the
/// loop, a few blocking threads for NVML and the control block.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(4)
        .thread_name("vramscope-collect")
        .enable_all()
        .build()
}

/// The collector's own runtime: current-thread (the step runs on the
/// thread that drives it, never handed between workers), with a few
/// blocking threads for NVML and the control block.
fn own_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(4)
        .thread_name("vramscope-collect")
        .enable_all()
        .build()
}

/// What [`on_own_thread`] started: the sender that stops the future, and
/// a channel that hears when it has completed.
struct Started {
    stop: tokio::sync::oneshot::Sender<()>,
    done: std::sync::mpsc::Receiver<()>,
}

/// Runs `make(stopped)` on one dedicated thread, on a current-thread
/// runtime of its own ([`own_runtime`]), until it completes. Its
/// allocations all come from that one thread (one allocator arena), and
/// nothing moves the step between threads.
fn on_own_thread<F, Fut>(make: F) -> std::io::Result<Started>
where
    F: FnOnce(tokio::sync::oneshot::Receiver<()>) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready, started) = std::sync::mpsc::sync_channel(1);
    let (finished, done) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("vramscope-collect".into())
        .spawn(move || {
            let rt = match own_runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            let _ = ready.send(Ok(()));
            rt.block_on(make(stopped));
            let _ = finished.send(());
            // Blocking tasks (an NVML read, a command's wait) are not
            // waited for long.
            rt.shutdown_timeout(LIVE_STOP_WAIT);
        })?;
    started
        .recv()
        .map_err(|_| std::io::Error::other("the collector's thread ended at start"))??;
    Ok(Started { stop, done })
}

/// The collector running on a thread and runtime of its own, for a
/// dashboard whose thread is not async (see the module doc). Dropping it
/// stops everything.
pub struct Live {
    hub: Arc<Hub>,
    /// Why its processes are sent no command ([`Live::refusal`]).
    refusal: Option<&'static str>,
    /// Ends the background loop; dropping `Live` sends it and waits for the
    /// loop's last step (see `Drop`).
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Hears when the loop has ended (in a mutex: `Live` is shared).
    done: Mutex<std::sync::mpsc::Receiver<()>>,
}

/// How long dropping a [`Live`] waits for its loop to finish its step.
const LIVE_STOP_WAIT: Duration = Duration::from_secs(2);

impl Drop for Live {
    /// Stops the background loop and waits (a while) for its last step, so
    /// nothing written before is left unread.
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Ok(done) = self.done.get_mut() {
            let _ = done.recv_timeout(LIVE_STOP_WAIT);
        }
    }
}

impl Live {
    /// Starts the collector's live loop in the background and returns at once.
    pub fn start(cfg: Config) -> std::io::Result<Live> {
        let refusal = cfg.readonly.then_some(READONLY);
        let mut collector = Collector::new(cfg);
        let hub = collector.hub().clone();
        let started = on_own_thread(move |stopped| async move {
            collector
                .run_until(async {
                    let _ = stopped.await;
                })
                .await
        })?;
        Ok(Live {
            hub,
            refusal,
            stop: Some(started.stop),
            done: Mutex::new(started.done),
        })
    }

    /// Plays a recording into a new hub in the background, at `speed`
    /// recorded seconds per second, with its times moved onto this
    /// machine's clock. Its processes cannot be sent commands.
    pub fn replay(
        reader: vramscope_core::recording::Replayer,
        speed: f64,
        progress: Arc<replay::Progress>,
    ) -> std::io::Result<Live> {
        let hub = Arc::new(Hub::default());
        let h = hub.clone();
        let started = on_own_thread(move |stopped| async move {
            let played = replay::play_with(reader, &h, replay::Pace::Live(speed), &progress);
            tokio::select! {
                biased;
                _ = stopped => {}
                r = played => {
                    if let Err(e) = r {
                        vramscope_text::stderr_line(format_args!("vramscope: {e}"));
                    }
                }
            }
        })?;
        Ok(Live {
            hub,
            refusal: Some(REPLAYED),
            stop: Some(started.stop),
            done: Mutex::new(started.done),
        })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Why the processes it shows must be sent no command: `--readonly`,
    /// or a recording played back (its processes are not here to answer).
    /// None: a command may go to a process's segment ([`client`]).
    pub fn refusal(&self) -> Option<&'static str> {
        self.refusal
    }

    /// Calls `f` on every SIGINT, SIGTERM and SIGHUP, from a thread that
    /// waits on nothing else (not from the collector's: it may wait on the
    /// hub's lock behind a long view; see [`signals`]).
    pub fn on_signal(&self, f: impl Fn() + Send + Sync + 'static) {
        if let Err(e) = signals::forward_on_own_thread(f) {
            vramscope_text::stderr_line(format_args!(
                "vramscope: signals cannot be heard ({e}): quit with the keys"
            ));
        }
    }
}
