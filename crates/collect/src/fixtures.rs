//! Deterministic pictures for tests, benchmarks and documentation
//! screenshots: workshop scenarios run to a fixed point and fed into a
//! [`Model`], with hand-written identities and NVML figures. No clocks.

use std::collections::HashMap;

use crate::state::{ProcessEntry, Snapshot};
use vramscope_core::input::Source;
use vramscope_core::input::{Gpu, GpuProcess, HostProcess};
use vramscope_core::input::{Identity, Machine};
use vramscope_core::model::{Mode, Model, ModelConfig, ProcessKey, ViewOptions};
use vramscope_core::sim::scenario::{Scenario, ScenarioRunner};
use vramscope_wire::event::Event;

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Simulated time is shifted so that "now" is well past zero.
pub(crate) const BASE_NS: u64 = 100_000_000_000;
/// NVML's share of a process beyond what the allocator reserved: what the
/// simulated job names outside the caching allocator (its CUDA context and
/// cuBLAS's workspace), and 4 MiB no one names.
const CONTEXT: u64 = vramscope_core::sim::scenario::SIM_CONTEXT
    + vramscope_core::sim::scenario::SIM_CUBLAS
    + 4 * MIB;

/// (scenario, script, user)
const CAST: [(&str, &str, &str); 6] = [
    ("leak", "eval_loop.py", "alice"),
    ("fragmentation", "seq2seq.py", "bob"),
    ("oom", "big_batch.py", "carol"),
    ("healthy", "train.py", "alice"),
    ("empty-cache", "finetune.py", "bob"),
    ("inference", "serve.py", "carol"),
];

/// A model with processes in it, and what the collector would know of them.
pub struct Fixture {
    pub model: Model,
    pub(crate) machine: Machine,
    pub(crate) identities: HashMap<ProcessKey, Identity>,
    pub(crate) sources: HashMap<ProcessKey, Source>,
    /// The collector clock at which snapshots are taken.
    pub now_ns: u64,
}

impl Fixture {
    /// `instrumented` simulated processes (scenarios in turn) plus one
    /// NVML-only process, on a machine with two GPUs.
    pub fn new(instrumented: usize) -> Fixture {
        Fixture::build(instrumented, true)
    }

    /// The same without NVML (`machine.nvml_error` set, no NVML figures).
    pub fn without_nvml(instrumented: usize) -> Fixture {
        Fixture::build(instrumented, false)
    }

    fn build(instrumented: usize, nvml: bool) -> Fixture {
        let mut fx = Fixture {
            model: Model::new(ModelConfig::default()),
            machine: Machine::default(),
            identities: HashMap::new(),
            sources: HashMap::new(),
            now_ns: BASE_NS,
        };
        let mut gpu_procs: Vec<GpuProcess> = (0..instrumented)
            .filter_map(|i| fx.add_scenario(i, nvml))
            .collect();
        fx.machine = if nvml {
            gpu_procs.push(fx.add_unattached());
            machine(gpu_procs, fx.now_ns)
        } else {
            Machine {
                nvml_error: Some("NVML library not found (libnvidia-ml.so.1)".into()),
                ..Machine::default()
            }
        };
        fx
    }

    /// The `i`-th instrumented process: the next scenario of [`CAST`] run
    /// to its end. What NVML sees of it, when `nvml`.
    fn add_scenario(&mut self, i: usize, nvml: bool) -> Option<GpuProcess> {
        let (name, script, user) = CAST[i % CAST.len()];
        let pid = 2000 + 17 * i as u32;
        let key = ProcessKey {
            pid,
            start_time: 50_000 + i as u64,
        };
        let ran = self.run_scenario(key, name, nvml);
        self.now_ns = self.now_ns.max(BASE_NS + ran.end_ns);
        let lost = if name == "fragmentation" { 17 } else { 0 };
        if lost > 0 {
            self.model.note_loss(key, lost);
        }
        let suffix = if i >= CAST.len() {
            format!(" #{}", i / CAST.len() + 1)
        } else {
            String::new()
        };
        self.identities.insert(
            key,
            Identity {
                host_pid: pid,
                ns_pid: pid,
                name: "python3".into(),
                cmdline: format!("python3 {script} --scenario {name}"),
                user: user.into(),
                uid: Some(1000),
                label: format!("{script}{suffix}"),
                alive: true,
            },
        );
        self.sources.insert(
            key,
            Source {
                mode: Mode::Exact,
                segment: Some(format!("/dev/shm/vramscope-1000-{pid}")),
                producer: Some("TorchExact".into()),
                framework: Some("torch 2.11.0+cu130".into()),
                delivered: ran.delivered,
                lost,
                commands: true,
            },
        );
        ran.last_nvml.map(|used| GpuProcess {
            pid,
            gpu: (i % 2) as u32,
            used: Some(used),
        })
    }

    /// Feeds scenario `name` into the model as `key`, a quarter second at a
    /// time, with an NVML figure at each step when `nvml`.
    fn run_scenario(&mut self, key: ProcessKey, name: &str, nvml: bool) -> Ran {
        let mut runner = ScenarioRunner::new(Scenario::by_name(name).expect("known scenario"));
        let mut events: Vec<Event> = Vec::new();
        let mut ran = Ran::default();
        while !runner.is_finished() {
            ran.end_ns += 250_000_000;
            runner.advance_to(ran.end_ns, &mut events);
            for ev in &mut events {
                ev.time_ns += BASE_NS;
            }
            ran.delivered += events.len() as u64;
            self.model.apply_all(key, events.iter());
            events.clear();
            if nvml {
                let used = runner.allocator().stats().reserved + CONTEXT;
                self.model.note_nvml(key, BASE_NS + ran.end_ns, used);
                ran.last_nvml = Some(used);
            }
        }
        ran
    }

    /// A process without the agent: NVML knows it, nothing else does.
    fn add_unattached(&mut self) -> GpuProcess {
        let key = ProcessKey {
            pid: 4242,
            start_time: 777,
        };
        self.model.set_mode(key, Mode::NvmlOnly);
        for k in 0..40u64 {
            let used = 3 * GIB + (k % 4) * 64 * MIB;
            self.model
                .note_nvml(key, self.now_ns - (40 - k) * 500_000_000, used);
        }
        self.model.note_nvml(key, self.now_ns, 3 * GIB + 128 * MIB);
        self.identities.insert(
            key,
            Identity {
                host_pid: 4242,
                ns_pid: 4242,
                name: "tritonserver".into(),
                cmdline: "tritonserver --model-repository=/models".into(),
                user: "svc".into(),
                uid: Some(998),
                label: String::new(),
                alive: true,
            },
        );
        self.sources.insert(key, Source::unattached(Mode::NvmlOnly));
        GpuProcess {
            pid: 4242,
            gpu: 1,
            used: Some(3 * GIB + 128 * MIB),
        }
    }

    /// The snapshot the hub would publish at `now_ns`.
    pub fn snapshot(&self, opts: &ViewOptions) -> Snapshot {
        let view = self.model.view(self.now_ns, opts);
        Snapshot {
            version: super::state::SNAPSHOT_VERSION,
            taken_ns: self.now_ns,
            machine: self.machine.clone(),
            processes: view
                .processes
                .into_iter()
                .map(|v| ProcessEntry {
                    identity: self.identities.get(&v.key).cloned().unwrap_or_default(),
                    source: self
                        .sources
                        .get(&v.key)
                        .cloned()
                        .unwrap_or_else(|| Source::unattached(v.mode)),
                    view: v,
                    advice: None,
                })
                .collect(),
            problems: Vec::new(),
            dropped: Default::default(),
            cleaned: Vec::new(),
        }
    }

    /// The key of the process running scenario `name` (first of them).
    pub fn key_of(&self, scenario: &str) -> Option<ProcessKey> {
        self.identities
            .iter()
            .filter(|(_, id)| id.cmdline.ends_with(&format!("--scenario {scenario}")))
            .map(|(k, _)| *k)
            .min()
    }
}

/// What feeding one scenario left.
#[derive(Default)]
struct Ran {
    /// Simulated time at its end.
    end_ns: u64,
    /// Events fed into the model.
    delivered: u64,
    /// The last NVML figure noted.
    last_nvml: Option<u64>,
}

/// Two GPUs with `processes` on them (NVML's figures).
fn machine(processes: Vec<GpuProcess>, now_ns: u64) -> Machine {
    let gpus = (0..2u32)
        .map(|g| {
            let used: u64 = processes
                .iter()
                .filter(|p| p.gpu == g)
                .filter_map(|p| p.used)
                .sum::<u64>()
                + 512 * MIB;
            gpu(g, used)
        })
        .collect();
    // Host figures as /proc gives them: a busy trainer, a quiet server.
    let host = processes
        .iter()
        .map(|p| HostProcess {
            pid: p.pid,
            cpu_percent: Some(if p.pid == 4242 {
                12.5
            } else {
                98.0 + f64::from(p.pid % 7) * 3.0
            }),
            rss: Some(GIB + u64::from(p.pid % 5) * 300 * MIB),
            elapsed_ns: Some(3_600_000_000_000 + u64::from(p.pid) * 1_000_000_000),
        })
        .collect();
    Machine {
        nvml_error: None,
        driver_version: Some("580.95.05".into()),
        gpus,
        processes,
        sampled_ns: Some(now_ns),
        host,
    }
}

/// GPU `g` (0 busy, 1 quiet) with `used` bytes in use.
fn gpu(g: u32, used: u64) -> Gpu {
    let busy = g == 0;
    Gpu {
        index: g,
        name: "NVIDIA H100 80GB HBM3".into(),
        uuid: Some(format!("GPU-0000000{g}-fixture")),
        total: Some(80 * GIB),
        used: Some(used),
        free: Some(80 * GIB - used),
        util_gpu: Some(if busy { 87 } else { 12 }),
        util_mem: Some(if busy { 41 } else { 3 }),
        temperature_c: Some(if busy { 64 } else { 38 }),
        power_w: Some(if busy { 512.0 } else { 96.5 }),
    }
}
