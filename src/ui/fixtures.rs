//! Deterministic pictures for tests, benchmarks and documentation
//! screenshots: workshop scenarios run to a fixed point and fed into a
//! [`Model`], with hand-written identities and NVML figures. No clocks.

use std::collections::HashMap;

use crate::collect::{Identity, Machine, ProcessEntry, Snapshot, Source};
use crate::event::Event;
use crate::input::{Gpu, GpuProcess};
use crate::model::{Mode, Model, ModelConfig, ProcessKey, ViewOptions};
use crate::sim::scenario::{Scenario, ScenarioRunner};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Simulated time is shifted so that "now" is well past zero.
pub const BASE_NS: u64 = 100_000_000_000;
/// NVML's share of a process beyond what the allocator reserved (context).
const CONTEXT: u64 = 600 * MIB;

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
    pub machine: Machine,
    pub identities: HashMap<ProcessKey, Identity>,
    pub sources: HashMap<ProcessKey, Source>,
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
        let mut model = Model::new(ModelConfig::default());
        let mut identities = HashMap::new();
        let mut sources = HashMap::new();
        let mut gpu_procs = Vec::new();
        let mut now_ns = BASE_NS;
        for i in 0..instrumented {
            let (name, script, user) = CAST[i % CAST.len()];
            let pid = 2000 + 17 * i as u32;
            let key = ProcessKey {
                pid,
                start_time: 50_000 + i as u64,
            };
            let mut runner = ScenarioRunner::new(Scenario::by_name(name).expect("known scenario"));
            let mut events: Vec<Event> = Vec::new();
            let mut delivered = 0u64;
            let mut t = 0u64;
            let mut last_nvml = None;
            while !runner.is_finished() {
                t += 250_000_000;
                runner.advance_to(t, &mut events);
                for ev in &mut events {
                    ev.time_ns += BASE_NS;
                }
                delivered += events.len() as u64;
                model.apply_all(key, events.iter());
                events.clear();
                if nvml {
                    let used = runner.allocator().stats().reserved + CONTEXT;
                    model.note_nvml(key, BASE_NS + t, used);
                    last_nvml = Some(used);
                }
            }
            now_ns = now_ns.max(BASE_NS + t);
            let lost = if name == "fragmentation" { 17 } else { 0 };
            if lost > 0 {
                model.note_loss(key, lost);
            }
            let suffix = if i >= CAST.len() {
                format!(" #{}", i / CAST.len() + 1)
            } else {
                String::new()
            };
            identities.insert(
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
            sources.insert(
                key,
                Source {
                    mode: Mode::Exact,
                    segment: Some(format!("/dev/shm/vramscope-1000-{pid}")),
                    producer: Some("TorchExact".into()),
                    framework: Some("torch 2.11.0+cu130".into()),
                    delivered,
                    lost,
                    commands: true,
                },
            );
            if let Some(used) = last_nvml {
                gpu_procs.push(GpuProcess {
                    pid,
                    gpu: (i % 2) as u32,
                    used: Some(used),
                });
            }
        }
        // A process without the agent: NVML knows it, nothing else does.
        if nvml {
            let key = ProcessKey {
                pid: 4242,
                start_time: 777,
            };
            model.set_mode(key, Mode::NvmlOnly);
            for k in 0..40u64 {
                let used = 3 * GIB + (k % 4) * 64 * MIB;
                model.note_nvml(key, now_ns - (40 - k) * 500_000_000, used);
            }
            model.note_nvml(key, now_ns, 3 * GIB + 128 * MIB);
            identities.insert(
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
            sources.insert(key, Source::unattached(Mode::NvmlOnly));
            gpu_procs.push(GpuProcess {
                pid: 4242,
                gpu: 1,
                used: Some(3 * GIB + 128 * MIB),
            });
        }
        let machine = if nvml {
            let mut gpus = Vec::new();
            for g in 0..2u32 {
                let used: u64 = gpu_procs
                    .iter()
                    .filter(|p| p.gpu == g)
                    .filter_map(|p| p.used)
                    .sum::<u64>()
                    + 512 * MIB;
                gpus.push(Gpu {
                    index: g,
                    name: "NVIDIA H100 80GB HBM3".into(),
                    uuid: Some(format!("GPU-0000000{g}-fixture")),
                    total: Some(80 * GIB),
                    used: Some(used),
                    free: Some(80 * GIB - used),
                    util_gpu: Some(if g == 0 { 87 } else { 12 }),
                    util_mem: Some(if g == 0 { 41 } else { 3 }),
                    temperature_c: Some(if g == 0 { 64 } else { 38 }),
                    power_w: Some(if g == 0 { 512.0 } else { 96.5 }),
                });
            }
            Machine {
                nvml_error: None,
                driver_version: Some("580.95.05".into()),
                gpus,
                processes: gpu_procs,
                sampled_ns: Some(now_ns),
            }
        } else {
            Machine {
                nvml_error: Some("NVML library not found (libnvidia-ml.so.1)".into()),
                ..Machine::default()
            }
        };
        Fixture {
            model,
            machine,
            identities,
            sources,
            now_ns,
        }
    }

    /// The snapshot the hub would publish at `now_ns`.
    pub fn snapshot(&self, opts: &ViewOptions) -> Snapshot {
        let view = self.model.view(self.now_ns, opts);
        Snapshot {
            version: crate::collect::state::SNAPSHOT_VERSION,
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
                })
                .collect(),
            problems: Vec::new(),
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

/// An app showing `fx` with the view options it asks for (fixed clock).
pub fn app_with(
    fx: &Fixture,
    config: crate::ui::AppConfig,
    width: u16,
    height: u16,
) -> crate::ui::App {
    let mut app = crate::ui::App::new(config);
    app.size = ratatui::layout::Rect::new(0, 0, width, height);
    app.clock.now_ns = fx.now_ns;
    app.clock.changed_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
    app
}

/// Takes a new snapshot of `fx` for what `app` shows now.
pub fn refresh(app: &mut crate::ui::App, fx: &Fixture) {
    app.clock.now_ns = fx.now_ns;
    app.set_snapshot(fx.snapshot(&app.view_options()));
}
