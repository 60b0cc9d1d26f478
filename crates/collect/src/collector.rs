//! The collector ([`Collector`]: sources -> hub, one step at a time or as
//! a live loop on tokio) and [`Live`], the collector on a runtime of its
//! own for a dashboard whose thread is not async.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vramscope_core::input::{Identity, Input, Machine};
use vramscope_core::model::ProcessKey;
use vramscope_wire::ring::client::{self, Expect};
use vramscope_wire::ring::{monotonic_ns, Command, Outcome, RingError, Status};

use crate::config::Config;
use crate::hub::Hub;
use crate::{nvml, procfs, replay, rings, signals};

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

    /// Plays a recording into a new hub in the background, at `control`'s
    /// speed (recorded seconds per second; paused, sped and moved by it),
    /// with its times moved onto this machine's clock. Its processes cannot
    /// be sent commands.
    pub fn replay(
        reader: vramscope_core::recording::Replayer,
        control: Arc<replay::Control>,
        progress: Arc<replay::Progress>,
    ) -> std::io::Result<Live> {
        let hub = Arc::new(Hub::default());
        let h = hub.clone();
        let started = on_own_thread(move |stopped| async move {
            let pace = replay::Pace::Live(control.speed());
            let played = replay::play_with(reader, &h, pace, &progress, Some(&control));
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
