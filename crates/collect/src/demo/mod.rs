//! The workshop demo: a simulated training job (`sim::scenario`) whose
//! caching allocator writes into a real segment, exactly as an instrumented
//! process does, and answers the same commands. The dashboard reads it like
//! any other process.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod gpu;

use anyhow::{anyhow, Context, Result};

use gpu::GpuBacking;
pub(crate) use vramscope_core::sim::allocator::{EventSink, SimConfig};
use vramscope_core::sim::conf::AllocConf;
use vramscope_core::sim::scenario::{Scenario, ScenarioRunner};
use vramscope_wire::event::{Class, Event, EventKind, MarkSource, RingSpan};
use vramscope_wire::ring::codec::{encode, Words};
use vramscope_wire::ring::{monotonic_ns, Command, Producer, SegmentConfig, SegmentWriter, Status};

/// How long the final state of a scenario stays on screen before it restarts.
const HOLD_AT_END: Duration = Duration::from_secs(10);

/// The speed a scenario plays at unless the user picks one: the OOM story
/// is over in about a second of simulated time.
pub fn default_speed(name: &str) -> f64 {
    if name == "oom" {
        0.2
    } else {
        1.0
    }
}

/// What the dashboard can see of, and change in, a running demo.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoStatus {
    pub scenario: String,
    pub caption: String,
    /// Fraction of the scenario's script done, 0.0 to 1.0.
    pub progress: f64,
    /// Simulated seconds per real second.
    pub speed: f64,
    pub paused: bool,
    /// Completed runs of the scenario (it restarts when it ends).
    pub runs: u64,
    /// A recording played back (`replay --ui`), not a simulation: no speed
    /// or pause controls, `scenario` is the file.
    pub replay: bool,
    /// The recording was played to its end: nothing more arrives.
    pub ended: bool,
}

/// Shared between the demo thread and the dashboard.
pub struct DemoControl {
    status: Mutex<DemoStatus>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl DemoControl {
    pub fn status(&self) -> DemoStatus {
        self.status.lock().expect("demo status").clone()
    }
    pub fn set_speed(&self, speed: f64) {
        self.status.lock().expect("demo status").speed = speed.clamp(0.05, 64.0);
    }
    pub fn toggle_pause(&self) {
        let mut s = self.status.lock().expect("demo status");
        s.paused = !s.paused;
    }
    /// Stops the simulation and waits for its thread, which closes and
    /// removes the demo's segment.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().expect("demo thread").take() {
            let _ = t.join();
        }
    }
}

/// The scenario names and one-line stories, for `demo --list`.
pub fn list() -> &'static [(&'static str, &'static str)] {
    Scenario::list()
}

/// Builds a scenario from its name and an optional `PYTORCH_CUDA_ALLOC_CONF`.
pub fn scenario(name: &str, conf: Option<&str>) -> Result<Scenario> {
    let alloc = match conf {
        Some(c) => AllocConf::parse(c).with_context(|| format!("--conf {c:?}"))?,
        None => AllocConf::default(),
    };
    Scenario::with_config(
        name,
        SimConfig {
            alloc,
            ..SimConfig::default()
        },
    )
    .ok_or_else(|| {
        let names: Vec<&str> = Scenario::list().iter().map(|(n, _)| *n).collect();
        anyhow!("no scenario {name:?}; choose one of: {}", names.join(", "))
    })
}

/// Writes events into the segment: device events into ring 1, the rest
/// (statistics, snapshots, markers) into ring 0, with times moved onto the
/// monotonic clock.
struct RingSink<'a> {
    seg: &'a SegmentWriter,
    base_ns: u64,
    sample: u32,
    words: Vec<Words>,
    /// `--gpu`: real device memory behind every simulated segment.
    gpu: Option<GpuBacking>,
    gpu_error: Option<String>,
    /// Stamp events with the wall's monotonic clock when emitted (the live
    /// demo, as a real process would), else with `base_ns` + simulated time
    /// (headless runs, which go as fast as they can).
    realtime: bool,
    last_ns: u64,
}

impl<'a> RingSink<'a> {
    fn new(seg: &'a SegmentWriter, gpu: Option<GpuBacking>) -> Self {
        RingSink {
            seg,
            base_ns: monotonic_ns(),
            sample: 0,
            words: Vec::new(),
            gpu,
            gpu_error: None,
            realtime: false,
            last_ns: 0,
        }
    }
}

impl EventSink for RingSink<'_> {
    fn emit(&mut self, mut e: Event) {
        e.time_ns = if self.realtime {
            monotonic_ns().max(self.last_ns)
        } else {
            e.time_ns + self.base_ns
        };
        self.last_ns = e.time_ns;
        if let Some(g) = self.gpu.as_mut() {
            if let Err(err) = g.apply(&e) {
                // Keep simulating; the dashboard shows NVML falling behind.
                self.gpu_error.get_or_insert(err);
            }
        }
        let ring = match e.kind.class() {
            Class::Stats | Class::Snapshot | Class::Marker | Class::Definition => 0,
            _ => 1,
        };
        if matches!(e.kind, EventKind::Stats { .. }) {
            self.sample = self.sample.wrapping_add(1);
        }
        if let EventKind::SnapshotBegin { at, .. } = &mut e.kind {
            // This thread is the device ring's only writer and takes the
            // snapshot between two of its events: the split is exact.
            let head = self.seg.ring(1).head();
            *at = Some(RingSpan {
                ring: 1,
                before: head,
                after: head,
                exact: true,
                ambiguous: false,
            });
        }
        self.words.clear();
        encode(&e, self.sample, &mut self.words);
        for w in &self.words {
            self.seg.ring(ring).write(w);
        }
    }
}

/// Starts the demo on its own thread, writing into `shm_dir`.
pub fn start(
    scenario: Scenario,
    shm_dir: &Path,
    speed: f64,
    gpu: Option<GpuBacking>,
) -> Result<Arc<DemoControl>> {
    start_with_slots(scenario, shm_dir, speed, gpu, 1 << 16)
}

/// [`start`] with a ring of `slots` slots (a power of two): a small one
/// wraps within a run, as a long job's does (tests of watching mid-run).
pub fn start_with_slots(
    scenario: Scenario,
    shm_dir: &Path,
    speed: f64,
    gpu: Option<GpuBacking>,
    slots: u64,
) -> Result<Arc<DemoControl>> {
    let name = scenario.name.to_string();
    let mut cfg = SegmentConfig::new(shm_dir, Producer::Simulator, 1, slots);
    cfg.tag = Some("demo".into());
    // Events, statistics, simulated memory, and snapshots placed by ring
    // positions (FORMAT.md header flags bits 0–3).
    cfg.flags = 15;
    cfg.framework = format!("vramscope sim {}", env!("CARGO_PKG_VERSION"));
    cfg.label = format!("demo: {name}");
    let seg = SegmentWriter::create(&cfg).context("creating the demo's segment")?;
    let control = Arc::new(DemoControl {
        status: Mutex::new(DemoStatus {
            scenario: name,
            caption: scenario.description.to_string(),
            progress: 0.0,
            speed,
            paused: false,
            runs: 0,
            replay: false,
            ended: false,
        }),
        stop: AtomicBool::new(false),
        thread: Mutex::new(None),
    });
    let c = control.clone();
    let handle = std::thread::Builder::new()
        .name("vramscope-demo".into())
        .spawn(move || drive(seg, scenario, &c, gpu))?;
    *control.thread.lock().expect("demo thread") = Some(handle);
    Ok(control)
}

fn drive(seg: SegmentWriter, scenario: Scenario, control: &DemoControl, gpu: Option<GpuBacking>) {
    let mut runner = ScenarioRunner::new(scenario.clone());
    let mut sink = RingSink::new(&seg, gpu);
    sink.realtime = true;
    let mut sim_ns: u64 = 0;
    let mut last = Instant::now();
    let mut finished_at: Option<Instant> = None;
    let server = seg.command_server();
    while !control.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(10));
        let elapsed = last.elapsed();
        last = Instant::now();
        let (speed, paused) = {
            let s = control.status.lock().expect("demo status");
            (s.speed, s.paused)
        };
        if !paused {
            sim_ns += (elapsed.as_nanos() as f64 * speed) as u64;
            runner.advance_to(sim_ns, &mut sink);
        }
        if let Some(req) = server.poll() {
            let t = runner.now().max(sim_ns);
            runner.allocator_mut().set_time(t);
            let (status, r0, r1) = answer(&mut runner, req.command, &mut sink);
            server.answer(req, status, r0, r1);
        }
        seg.heartbeat();
        if runner.is_finished() && !paused {
            // Hold the final picture for a while (a teacher is talking over it).
            let held = *finished_at.get_or_insert_with(Instant::now);
            let left = HOLD_AT_END.saturating_sub(held.elapsed());
            if !left.is_zero() {
                let mut s = control.status.lock().expect("demo status");
                s.caption = format!(
                    "{} (end of scenario; restarting in {}s)",
                    runner.caption(),
                    left.as_secs() + 1
                );
                s.progress = 1.0;
                continue;
            }
            finished_at = None;
            // Start over: the new run's first snapshot resets the dashboard's
            // view; its memory is returned first (and so is the GPU's).
            runner.allocator_mut().empty_cache(&mut sink);
            if let Some(g) = sink.gpu.as_mut() {
                g.clear();
            }
            sink.base_ns += runner.now() + 1_000_000_000;
            sim_ns = 0;
            runner = runner.next_run();
            let mut status = control.status.lock().expect("demo status");
            status.runs += 1;
            sink.emit(run_marker(status.runs + 1));
            drop(status);
        }
        let mut s = control.status.lock().expect("demo status");
        s.caption = runner.caption().to_string();
        s.progress = runner.progress();
    }
    // Dropping `seg` marks the segment closed and removes it.
}

/// Executes a dashboard command against the simulated allocator.
fn answer(runner: &mut ScenarioRunner, cmd: Command, sink: &mut RingSink) -> (Status, u64, u64) {
    match cmd {
        Command::EmptyCache { .. } => {
            let before = runner.allocator().stats().reserved;
            runner.allocator_mut().empty_cache(sink);
            runner.allocator().emit_stats(sink);
            (Status::Ok, before, runner.allocator().stats().reserved)
        }
        Command::ResetPeaks { .. } => {
            runner.allocator_mut().reset_peak_stats();
            runner.allocator().emit_stats(sink);
            (Status::Ok, 0, 0)
        }
        Command::Snapshot { .. } => {
            let id = runner.snapshot(sink);
            runner.allocator().emit_stats(sink);
            (Status::Ok, id as u64, 0)
        }
        Command::Ping { value } => (Status::Ok, value, 0),
        // The simulated job's Python stacks (train.py, model.py), for the
        // next steps, as the agent's hooks capture real ones.
        Command::CaptureStacks { steps, depth } => {
            let (granted, began) = runner.capture_stacks(steps, depth, sink);
            (Status::Ok, granted, began)
        }
        // A command of a later minor.
        Command::Unknown { .. } => (Status::Unsupported, 0, 0),
    }
}

/// What `demo --headless` reports: the scenario and the dashboard's view of
/// the simulated process at the end.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HeadlessReport {
    pub scenario: String,
    pub conf: Option<String>,
    /// Simulated seconds run.
    pub simulated_s: f64,
    pub caption: String,
    pub finished: bool,
    /// The allocator's own final statistics (the simulator's truth).
    pub(crate) allocator: vramscope_wire::event::Stats,
    /// The process as the dashboard sees it, through the ring and the model.
    pub process: crate::state::ProcessEntry,
    /// With `--gpu`: device memory held for the segments, and what NVML
    /// reported for this process at the end.
    pub(crate) gpu: Option<GpuReport>,
}

/// `--gpu`: does NVML see what the dashboard shows as reserved?
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct GpuReport {
    /// Device memory allocated to back the simulated segments.
    pub(crate) backed: u64,
    /// The simulated allocator's reserved bytes.
    pub(crate) reserved: u64,
    /// NVML's used memory for this process (context included).
    pub(crate) nvml_used: Option<u64>,
    /// `nvml_used - reserved`: the CUDA context and driver overhead.
    pub(crate) overhead: Option<i64>,
    /// The first device allocation that failed, if any.
    pub(crate) error: Option<String>,
}

/// Runs a scenario without a terminal, as fast as it can: the simulator
/// writes into a real segment in a private directory, the collector drains
/// it into the model in lockstep, and the model's final view is returned.
/// `duration_s` is simulated time (None: to the end of the scenario).
/// `then` is called with the hub, the demo's status, the collector clock
/// and the simulated time at the end, before the demo's segment goes
/// (`demo --headless --screenshot`).
pub fn run_headless_then(
    scenario: Scenario,
    conf: Option<&str>,
    (duration_s, runs): (Option<f64>, u32),
    gpu: bool,
    then: impl FnOnce(&crate::hub::Hub, DemoStatus, (u64, u64)) -> Result<()>,
) -> Result<HeadlessReport> {
    use crate::collector::Collector;
    use crate::config::Config;
    let dir = tempfile_dir()?;
    let result = (|| {
        let mut cfg = SegmentConfig::new(dir.as_path(), Producer::Simulator, 1, 1 << 16);
        cfg.tag = Some("demo".into());
        // Events, statistics, simulated memory, and snapshots placed by ring
        // positions (FORMAT.md header flags bits 0–3).
        cfg.flags = 15;
        cfg.label = format!("demo: {}", scenario.name);
        let seg = SegmentWriter::create(&cfg)?;
        let mut ccfg = Config::new(dir.clone());
        ccfg.nvml = gpu;
        let mut collector = Collector::new(ccfg);
        let backing = if gpu {
            Some(GpuBacking::new(0).map_err(|e| anyhow!("--gpu: {e}"))?)
        } else {
            None
        };
        let mut runner = ScenarioRunner::new(scenario.clone());
        let mut sink = RingSink::new(&seg, backing);
        let end = duration_s.map(|s| (s * 1e9) as u64).unwrap_or(u64::MAX);
        collector.step();
        for run in 0..runs.max(1) {
            if run > 0 {
                // Start over as the dashboard's loop does (see `drive`).
                runner.allocator_mut().empty_cache(&mut sink);
                sink.base_ns += runner.now() + 1_000_000_000;
                runner = runner.next_run();
                sink.emit(run_marker(u64::from(run) + 1));
            }
            let mut t = 0u64;
            while t < end && !runner.is_finished() {
                t = t.saturating_add(20_000_000).min(end);
                runner.advance_to(t, &mut sink);
                collector.step();
            }
        }
        // A final exact picture, as the dashboard would ask for one.
        runner.snapshot(&mut sink);
        runner.allocator().emit_stats(&mut sink);
        collector.step();
        let hub = collector.hub().clone();
        let gpu = sink.gpu.as_ref().map(|g| {
            collector.poll_nvml();
            let snap = hub.snapshot(&vramscope_core::model::ViewOptions::default());
            let me = std::process::id();
            let nvml_used = snap
                .machine
                .processes
                .iter()
                .filter(|p| p.pid == me)
                .try_fold(0u64, |acc, p| p.used.map(|u| acc + u));
            let reserved = runner.allocator().stats().reserved;
            GpuReport {
                backed: g.bytes(),
                reserved,
                nvml_used,
                overhead: nvml_used.map(|u| u as i64 - reserved as i64),
                error: sink.gpu_error.clone(),
            }
        });
        then(
            &hub,
            DemoStatus {
                scenario: scenario.name.to_string(),
                caption: runner.caption().to_string(),
                progress: runner.progress(),
                speed: 1.0,
                paused: false,
                runs: 0,
                replay: false,
                ended: false,
            },
            // The collector clock at the simulation's end (the sink writes
            // simulated times after its base).
            // Also the simulated time run.
            (sink.base_ns + runner.now(), runner.now()),
        )?;
        let snap = hub.snapshot(&vramscope_core::model::ViewOptions::default());
        let process = snap
            .processes
            .into_iter()
            .next()
            .ok_or_else(|| anyhow!("the collector never saw the demo's segment"))?;
        Ok(HeadlessReport {
            scenario: scenario.name.to_string(),
            conf: conf.map(str::to_string),
            simulated_s: runner.now() as f64 / 1e9,
            caption: runner.caption().to_string(),
            finished: runner.is_finished(),
            allocator: runner.allocator().stats(),
            process,
            gpu,
        })
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Run `number` of the scenario begins (2 for the first restart): step
/// counts and leak verdicts start over (FORMAT.md, MARKER source 5, whose
/// `value` is the run's number, so that a reader which began watching
/// mid-job can name the run as the demo does).
fn run_marker(number: u64) -> Event {
    Event {
        time_ns: 0,
        kind: EventKind::Marker {
            value: number,
            source: MarkSource::Run,
        },
    }
}

/// A private directory for a headless run's segment.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for i in 0..100u32 {
        let p = base.join(format!("vramscope-demo-{}-{i}", std::process::id()));
        if std::fs::DirBuilder::new().mode(0o700).create(&p).is_ok() {
            return Ok(p);
        }
    }
    Err(anyhow!(
        "cannot create a private directory under {}",
        base.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FORMAT.md "Versions": a producer answers a command it does not
    /// implement "unsupported" (a later minor's); the demo captures its
    /// simulated stacks (1.1's command 5).
    #[test]
    fn demo_answers_unknown_commands_unsupported_and_captures_stacks() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Simulator, 1, 64);
        cfg.tag = Some("cmdtest".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        let mut sink = RingSink::new(&seg, None);
        let mut runner = ScenarioRunner::new(Scenario::by_name("leak").unwrap());
        assert_eq!(
            answer(
                &mut runner,
                Command::Unknown { kind: 99, arg: 1 },
                &mut sink
            ),
            (Status::Unsupported, 0, 0)
        );
        assert_eq!(
            answer(
                &mut runner,
                Command::CaptureStacks { steps: 3, depth: 0 },
                &mut sink
            ),
            (Status::Ok, 3, 0)
        );
        assert!(runner.capturing());
        assert_eq!(
            answer(&mut runner, Command::Ping { value: 5 }, &mut sink),
            (Status::Ok, 5, 0)
        );
    }
}
