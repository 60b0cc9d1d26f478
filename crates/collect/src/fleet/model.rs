//! The fleet as Prometheus knows it: nodes (scrape targets), their GPUs and
//! their instrumented processes, built from instant-query answers. Pure: no
//! I/O, no clock.
//!
//! Building is O(n log n) in the answers' series: every node, GPU and
//! process is found by its key in a map, never by a scan. Values are those
//! [`prom`](super::prom) let through: finite and bounded.

use std::collections::{BTreeMap, BTreeSet};

use super::prom::Sample;
use crate::metrics::{self, label, Def};

/// A family the fleet view reads, and where a sample's value goes.
type Figure<T> = (&'static Def, fn(&mut T, f64));

/// A GPU's figures the fleet view reads.
const GPU_FIGURES: &[Figure<Gpu>] = &[
    (&metrics::GPU_TOTAL, |g, v| g.total = Some(v)),
    (&metrics::GPU_USED, |g, v| g.used = Some(v)),
    (&metrics::GPU_UTIL, |g, v| g.util = Some(v)),
];

/// A process's figures the fleet view reads (series without a `device`
/// label).
const PROCESS_FIGURES: &[Figure<Proc>] = &[
    (&metrics::P_RUNNING, |p, v| p.running = v == 1.0),
    (&metrics::P_NVML_USED, |p, v| p.nvml_used = Some(v)),
    (&metrics::P_UNEXPLAINED, |p, v| p.unexplained = Some(v)),
    (&metrics::P_LEAK, |p, v| p.leak = Some(v == 1.0)),
    (&metrics::P_LEAK_GROWTH, |p, v| p.leak_growth = Some(v)),
    (&metrics::P_OOMS, |p, v| p.ooms = Some(v)),
    (&metrics::P_LOST, |p, v| p.lost = Some(v)),
];

/// A process's figures on one device (series with a `device` label).
const DEVICE_FIGURES: &[Figure<Proc>] = &[
    (&metrics::D_ALLOCATED, |p, v| p.allocated = Some(v)),
    (&metrics::D_RESERVED, |p, v| p.reserved = Some(v)),
    (&metrics::D_FRAGMENTATION, |p, v| p.fragmentation = Some(v)),
];

/// Where a sample of family `name` goes, if `figures` has the family.
fn setter<T>(figures: &[Figure<T>], name: &str) -> Option<fn(&mut T, f64)> {
    figures
        .iter()
        .find(|(d, _)| d.name == name)
        .map(|(_, f)| *f)
}

/// The PromQL of the three instant queries of one refresh: targets (`up`),
/// the figures (every family of [`GPU_FIGURES`], [`PROCESS_FIGURES`] and
/// [`DEVICE_FIGURES`]), and step rates.
pub fn queries(job: &str) -> [String; 3] {
    let job = escape(job);
    let names: Vec<&str> = (GPU_FIGURES.iter().map(|(d, _)| d.name))
        .chain(PROCESS_FIGURES.iter().map(|(d, _)| d.name))
        .chain(DEVICE_FIGURES.iter().map(|(d, _)| d.name))
        .collect();
    [
        format!("up{{job=\"{job}\"}}"),
        format!("{{job=\"{job}\",__name__=~\"{}\"}}", names.join("|")),
        format!("rate({}{{job=\"{job}\"}}[1m])", metrics::P_STEPS.name),
    ]
}

/// The range queries of one process's time series (allocated, reserved).
pub fn series_queries(job: &str, instance: &str, pid: &str) -> [String; 2] {
    let sel = format!(
        "job=\"{}\",instance=\"{}\",{}=\"{}\"",
        escape(job),
        escape(instance),
        label::PID,
        escape(pid)
    );
    [
        format!("sum({}{{{sel}}})", metrics::D_ALLOCATED.name),
        format!("sum({}{{{sel}}})", metrics::D_RESERVED.name),
    ]
}

/// A string inside a PromQL double-quoted literal.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Gpu {
    pub index: String,
    pub name: String,
    pub uuid: String,
    pub total: Option<f64>,
    pub used: Option<f64>,
    pub util: Option<f64>,
}

/// One instrumented process on one device (the exporter's series).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Proc {
    pub instance: String,
    pub host: String,
    pub pid: String,
    pub user: String,
    pub process: String,
    pub mode: String,
    /// The process's CUDA device ordinal ("" for an NVML-only process).
    pub device: String,
    pub gpu: String,
    pub allocated: Option<f64>,
    pub reserved: Option<f64>,
    pub fragmentation: Option<f64>,
    pub nvml_used: Option<f64>,
    /// NVML's bytes − reserved − what the agent named outside the caching
    /// allocator (issue 47; absent from an exporter that does not say).
    pub unexplained: Option<f64>,
    pub leak: Option<bool>,
    pub leak_growth: Option<f64>,
    pub ooms: Option<f64>,
    pub lost: Option<f64>,
    pub steps_per_sec: Option<f64>,
    pub running: bool,
}

/// One scrape target.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Node {
    /// Prometheus's `instance` label: the target's address.
    pub instance: String,
    /// The exporter's `host` label (absent while the node is down).
    pub host: String,
    /// The last scrape succeeded.
    pub up: bool,
    pub gpus: Vec<Gpu>,
    pub procs: Vec<Proc>,
}

impl Node {
    /// What the node is called: its host, else its address.
    pub fn name(&self) -> &str {
        if self.host.is_empty() {
            &self.instance
        } else {
            &self.host
        }
    }

    fn sum(&self, f: impl Fn(&Proc) -> Option<f64>) -> Option<f64> {
        self.procs
            .iter()
            .filter_map(f)
            .fold(None, |a, v| Some(a.unwrap_or(0.0) + v))
    }

    pub fn allocated(&self) -> Option<f64> {
        self.sum(|p| p.allocated)
    }
    pub fn reserved(&self) -> Option<f64> {
        self.sum(|p| p.reserved)
    }
    pub fn gpu_used(&self) -> Option<f64> {
        self.gpus
            .iter()
            .filter_map(|g| g.used)
            .fold(None, |a, v| Some(a.unwrap_or(0.0) + v))
    }
    pub fn gpu_total(&self) -> Option<f64> {
        self.gpus
            .iter()
            .filter_map(|g| g.total)
            .fold(None, |a, v| Some(a.unwrap_or(0.0) + v))
    }
    /// The largest fragmentation share of any process's device.
    pub fn fragmentation(&self) -> Option<f64> {
        self.procs
            .iter()
            .filter_map(|p| p.fragmentation)
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))
    }
    /// Processes flagged as leaking (each counted once).
    pub fn leaks(&self) -> usize {
        let pids: BTreeSet<&str> = self
            .procs
            .iter()
            .filter(|p| p.leak == Some(true))
            .map(|p| p.pid.as_str())
            .collect();
        pids.len()
    }
    /// OOMs of its processes (each process counted once).
    pub fn ooms(&self) -> f64 {
        let mut by_pid: BTreeMap<&str, f64> = BTreeMap::new();
        for p in &self.procs {
            by_pid.entry(&p.pid).or_insert(p.ooms.unwrap_or(0.0));
        }
        by_pid.values().sum()
    }
    /// Distinct processes.
    pub fn jobs(&self) -> usize {
        let mut pids: Vec<&str> = self.procs.iter().map(|p| p.pid.as_str()).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.len()
    }
}

/// Everything one refresh learned.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fleet {
    /// By instance.
    pub nodes: Vec<Node>,
}

impl Fleet {
    /// The fleet from the three answers of [`queries`]. Series of a target
    /// that `up` does not list are still shown (under their instance).
    pub fn build(up: &[Sample], figures: &[Sample], rates: &[Sample]) -> Fleet {
        let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
        for s in up {
            let inst = s.label("instance").to_string();
            let n = nodes.entry(inst.clone()).or_default();
            n.instance = inst;
            n.up = s.value == 1.0;
        }
        // GPUs by (instance, index); per-process figures (no device label),
        // to copy onto each of the process's devices, by (instance, pid);
        // device rows by (instance, pid, device).
        let mut gpus: BTreeMap<(String, String), Gpu> = BTreeMap::new();
        let mut per_proc: BTreeMap<(String, String), Proc> = BTreeMap::new();
        let mut per_dev: BTreeMap<(String, String, String), Proc> = BTreeMap::new();
        for s in figures {
            let inst = s.label("instance");
            let node = match nodes.get_mut(inst) {
                Some(n) => n,
                None => nodes.entry(inst.to_string()).or_insert_with(|| Node {
                    instance: inst.to_string(),
                    up: true,
                    ..Node::default()
                }),
            };
            if node.host.is_empty() {
                node.host = s.label(label::HOST).to_string();
            }
            let name = s.label("__name__");
            if let Some(set) = setter(GPU_FIGURES, name) {
                let index = s.label(label::GPU);
                let g = gpus
                    .entry((inst.to_string(), index.to_string()))
                    .or_insert_with(|| Gpu {
                        index: index.to_string(),
                        name: s.label(label::NAME).to_string(),
                        uuid: s.label(label::UUID).to_string(),
                        ..Gpu::default()
                    });
                set(g, s.value);
                continue;
            }
            // A process's series: its own figures, or those of one of its
            // devices (a `device` label).
            let (proc_set, dev_set) = (setter(PROCESS_FIGURES, name), setter(DEVICE_FIGURES, name));
            if proc_set.is_none() && dev_set.is_none() {
                continue;
            }
            let base = |s: &Sample| Proc {
                instance: inst.to_string(),
                host: s.label(label::HOST).to_string(),
                pid: s.label(label::PID).to_string(),
                user: s.label(label::USER).to_string(),
                process: s.label(label::PROCESS).to_string(),
                mode: s.label(label::MODE).to_string(),
                running: true,
                ..Proc::default()
            };
            let pid = s.label(label::PID).to_string();
            let device = s.label(label::DEVICE);
            if device.is_empty() {
                let p = per_proc
                    .entry((inst.to_string(), pid))
                    .or_insert_with(|| base(s));
                if let Some(set) = proc_set {
                    set(p, s.value);
                }
            } else {
                let p = per_dev
                    .entry((inst.to_string(), pid, device.to_string()))
                    .or_insert_with(|| {
                        let mut p = base(s);
                        p.device = device.to_string();
                        p.gpu = s.label(label::GPU).to_string();
                        p
                    });
                if let Some(set) = dev_set {
                    set(p, s.value);
                }
            }
        }
        for s in rates {
            let key = (
                s.label("instance").to_string(),
                s.label(label::PID).to_string(),
            );
            if let Some(p) = per_proc.get_mut(&key) {
                p.steps_per_sec = Some(s.value);
            }
        }
        for ((inst, _), g) in gpus {
            if let Some(n) = nodes.get_mut(&inst) {
                n.gpus.push(g);
            }
        }
        // Each device row carries its process's figures; a process without
        // device rows (NVML only) is one row of its own.
        let mut with_devices: BTreeSet<(String, String)> = BTreeSet::new();
        for ((inst, pid, _), mut d) in per_dev {
            let key = (inst, pid);
            if let Some(p) = per_proc.get(&key) {
                d.running = p.running;
                d.nvml_used = p.nvml_used;
                d.unexplained = p.unexplained;
                d.leak = p.leak;
                d.leak_growth = p.leak_growth;
                d.ooms = p.ooms;
                d.lost = p.lost;
                d.steps_per_sec = p.steps_per_sec;
            }
            if let Some(n) = nodes.get_mut(&key.0) {
                n.procs.push(d);
            }
            with_devices.insert(key);
        }
        for (key, p) in per_proc {
            if with_devices.contains(&key) {
                continue;
            }
            if let Some(n) = nodes.get_mut(&key.0) {
                n.procs.push(p);
            }
        }
        for n in nodes.values_mut() {
            n.gpus.sort_by(|a, b| natural(&a.index, &b.index));
            n.procs
                .sort_by(|a, b| natural(&a.pid, &b.pid).then(natural(&a.device, &b.device)));
        }
        Fleet {
            nodes: nodes.into_values().collect(),
        }
    }

    pub fn down(&self) -> usize {
        self.nodes.iter().filter(|n| !n.up).count()
    }
}

/// Numbers compared as numbers, the rest as text.
pub(crate) fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(labels: &[(&str, &str)], value: f64) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            value,
        }
    }

    #[test]
    fn a_fleet_is_built_from_the_answers() {
        let up = [
            s(&[("instance", "a:1"), ("job", "v")], 1.0),
            s(&[("instance", "b:1"), ("job", "v")], 0.0),
        ];
        let p = |name: &str, dev: &str, v: f64| {
            let mut l = vec![
                ("__name__", name),
                ("instance", "a:1"),
                ("host", "node-a"),
                ("pid", "42"),
                ("process", "train"),
            ];
            if !dev.is_empty() {
                l.push(("device", dev));
            }
            s(&l, v)
        };
        let figures = [
            p("vramscope_process_allocated_bytes", "0", 100.0),
            p("vramscope_process_reserved_bytes", "0", 300.0),
            p("vramscope_process_allocated_bytes", "1", 50.0),
            p("vramscope_process_leak_suspected", "", 1.0),
            p("vramscope_process_ooms_total", "", 2.0),
            p("vramscope_process_unexplained_bytes", "", 4194304.0),
            s(
                &[
                    ("__name__", "vramscope_gpu_memory_total_bytes"),
                    ("instance", "a:1"),
                    ("gpu", "0"),
                ],
                80.0,
            ),
        ];
        let rates = [s(&[("instance", "a:1"), ("pid", "42")], 2.5)];
        let f = Fleet::build(&up, &figures, &rates);
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(f.down(), 1);
        let a = &f.nodes[0];
        assert_eq!((a.name(), a.up), ("node-a", true));
        assert_eq!(a.procs.len(), 2);
        assert_eq!(a.allocated(), Some(150.0));
        assert_eq!(a.reserved(), Some(300.0));
        assert_eq!((a.leaks(), a.ooms(), a.jobs()), (1, 2.0, 1));
        assert_eq!(a.procs[1].steps_per_sec, Some(2.5));
        // What no one named outside the allocator (issue 47): the process's.
        assert_eq!(a.procs[0].unexplained, Some(4194304.0));
        assert_eq!(a.gpu_total(), Some(80.0));
        let b = &f.nodes[1];
        assert_eq!((b.name(), b.up, b.procs.len()), ("b:1", false, 0));
    }

    #[test]
    fn labels_in_queries_are_escaped() {
        let q = series_queries("j\"x", "a:1", "4\\2");
        assert!(q[0].contains("job=\"j\\\"x\""), "{}", q[0]);
        assert!(q[0].contains("pid=\"4\\\\2\""), "{}", q[0]);
    }
}
