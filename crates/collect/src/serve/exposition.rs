//! The collector's published picture ([`Snapshot`]) as Prometheus metrics:
//! the text exposition format 0.0.4, or OpenMetrics 1.0 when the scraper
//! asks for it. Pure: a snapshot in, text out.
//!
//! Names follow Prometheus's conventions: a `vramscope_` prefix, base units
//! (`_bytes`, `_ratio` for 0..1), counters end in `_total`. Every family
//! has HELP and TYPE. A figure the collector does not have is left out,
//! never written as 0 (NVML absent, a leak verdict not reached yet).
//!
//! Labels: `host` on every series; a GPU's `gpu` (NVML index), `uuid` and
//! `name`; a process's `pid` (host pid), `user`, `process` (its label, else
//! its name) and `mode`; a process's device `device` (the CUDA ordinal the
//! process uses) and, where NVML shows the process on exactly that one GPU,
//! its `gpu` and `uuid` (under `CUDA_VISIBLE_DEVICES` the ordinal alone
//! does not say which GPU it is).
//!
//! Attribution (a producer that tags allocations with contexts, FORMAT
//! 1.1): a process's live bytes by `module`, its [`TOP_MODULES`] largest
//! modules and one `(other)` row for the rest (`(none)`: outside every
//! module), so a model with thousands of modules adds at most 11 series
//! per process; and by `phase` (five values at most). By `role` (seven
//! values at most: parameter, buffer, gradient, optimizer_state from the
//! agent's role lists, FORMAT 1.2; activation, temporary, other by
//! lifetime, `model::roles`).
//!
//! Label values are unambiguous: those the exporter makes up, `(other)`
//! and `(none)`, are never a producer's. A module path is the producer's
//! text, so one that begins with `(` is written with one more `(` in front
//! (`(other)` → `((other)`, `((x` → `(((x`): a value that begins with
//! exactly one `(` is always one of the exporter's ([`module_label`]).

use std::fmt::Write;

use crate::state::{ProcessEntry, Snapshot};
use vramscope_core::model::Mode;

/// Which exposition format a scrape gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain; version=0.0.4`.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// The format a scraper's `Accept` header asks for: OpenMetrics when it
    /// names it (with a non-zero weight), else the Prometheus text format.
    pub(crate) fn from_accept(accept: Option<&str>) -> Format {
        let asks = accept.is_some_and(|a| {
            a.split(',').any(|part| {
                let mut it = part.split(';').map(str::trim);
                let ty = it.next().unwrap_or("");
                let zero = it.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f64>().ok())
                        .is_some_and(|q| q <= 0.0)
                });
                ty.eq_ignore_ascii_case("application/openmetrics-text") && !zero
            })
        });
        if asks {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// One metric family: its name (a counter's ends in `_total`), type, help.
struct Def {
    name: &'static str,
    kind: Kind,
    help: &'static str,
}

const fn gauge(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Gauge,
        help,
    }
}

const fn counter(name: &'static str, help: &'static str) -> Def {
    Def {
        name,
        kind: Kind::Counter,
        help,
    }
}

const EXPORTER_INFO: Def = gauge(
    "vramscope_exporter_info",
    "Always 1: the vramscope exporter on this host, and its version.",
);
const NVML_UP: Def = gauge(
    "vramscope_nvml_up",
    "1 when NVML could be read on this host, else 0.",
);
const PROCESSES: Def = gauge(
    "vramscope_processes",
    "Processes shown: instrumented ones, and GPU processes NVML reports.",
);
const PROBLEMS: Def = gauge(
    "vramscope_segment_problems",
    "Segments the collector could not use (see `vramscope rings`).",
);
const GPU_TOTAL: Def = gauge(
    "vramscope_gpu_memory_total_bytes",
    "Device memory of the GPU (NVML).",
);
const GPU_USED: Def = gauge(
    "vramscope_gpu_memory_used_bytes",
    "Device memory in use on the GPU, by every process (NVML).",
);
const GPU_UTIL: Def = gauge(
    "vramscope_gpu_utilization_ratio",
    "Share of the last sample period during which a kernel ran (NVML), 0 to 1.",
);
const GPU_MEM_UTIL: Def = gauge(
    "vramscope_gpu_memory_utilization_ratio",
    "Share of the last sample period during which device memory was read or written (NVML), 0 to 1.",
);
const P_RUNNING: Def = gauge(
    "vramscope_process_running",
    "1 while the process runs; 0 for an exited one still shown.",
);
const P_NVML_USED: Def = gauge(
    "vramscope_process_nvml_used_bytes",
    "Device memory NVML attributes to the process, all GPUs.",
);
const P_NON_PYTORCH: Def = gauge(
    "vramscope_process_non_pytorch_bytes",
    "NVML's used memory minus the allocator's reserved memory of the same instant: CUDA context, NCCL, cuBLAS workspaces.",
);
const P_EVENTS: Def = counter(
    "vramscope_process_events_total",
    "Allocator events received from the process.",
);
const P_LOST: Def = counter(
    "vramscope_process_lost_events_total",
    "Allocator events the process wrote that were overwritten before they were read.",
);
const P_OOMS: Def = counter(
    "vramscope_process_ooms_total",
    "Out-of-memory errors of the caching allocator seen in the process.",
);
const P_STEPS: Def = counter(
    "vramscope_process_steps_total",
    "Training steps seen (vramscope.mark(), else optimizer steps, else the period of the allocation pattern); rate() of it is the step rate.",
);
const P_LEAK: Def = gauge(
    "vramscope_process_leak_suspected",
    "1 when the floor of allocated memory keeps rising step after step (a leak), 0 when not; absent until enough steps were seen.",
);
const P_LEAK_GROWTH: Def = gauge(
    "vramscope_process_leak_growth_bytes_per_step",
    "Robust slope of the allocated floor per step (Theil-Sen); absent until enough steps were seen.",
);
const P_OOM_STEP: Def = gauge(
    "vramscope_process_oom_forecast_step",
    "While a leak is flagged, or reserved memory grew at each of the last 8 step boundaries: the step at which the allocator would run out of memory, projected from that growth against the memory limit the agent states (the device's memory times the memory fraction); absent otherwise.",
);
const P_OOM_SECONDS: Def = gauge(
    "vramscope_process_oom_forecast_seconds",
    "While vramscope_process_oom_forecast_step is given: seconds until that step at the measured step period; absent otherwise.",
);
const P_ADVICE_SAVING: Def = gauge(
    "vramscope_process_advice_saving_bytes",
    "The live advisor's recommendation (serve --advise): bytes of peak reserved memory the setting in the conf label saves against the job's own, replaying the job's requests from where the advisor began (negative where it trades memory for fewer out-of-memory errors); conf=\"\" and 0 where the job's own setting is best; absent until the advisor has chosen its candidates.",
);
const P_ADVICE_OOMS: Def = gauge(
    "vramscope_process_advice_ooms",
    "Out-of-memory errors the replay of a setting had: candidate=\"own\" the job's own, candidate=\"best\" the recommendation (conf label as in vramscope_process_advice_saving_bytes).",
);
const P_ADVICE_REQUESTS: Def = counter(
    "vramscope_process_advice_requests_total",
    "Allocation requests the live advisor replayed under every candidate; it stops growing where the advisor stopped following the job to stay within its share of a core (vramscope_process_advice_following 0).",
);
const P_ADVICE_FOLLOWING: Def = gauge(
    "vramscope_process_advice_following",
    "1 while the live advisor follows the process's allocator events, 0 once it stopped (its advice then covers the requests before).",
);
const P_MODULE: Def = gauge(
    "vramscope_process_module_allocated_bytes",
    "Bytes of live tensors allocated while the module ran (its dotted path); the largest modules of the process, the rest summed in module=\"(other)\", allocations outside every module in module=\"(none)\"; a path that begins with ( has one more ( in front.",
);
const P_PHASE: Def = gauge(
    "vramscope_process_phase_allocated_bytes",
    "Bytes of live tensors by the phase they were allocated in (forward, backward, optimizer, other, unknown).",
);
const P_ROLE: Def = gauge(
    "vramscope_process_role_allocated_bytes",
    "Bytes of live tensors by role: parameter, buffer, gradient, optimizer_state (exact, from the role lists the agent sends, FORMAT 1.2), activation, temporary, other (by lifetime).",
);
/// Modules a process exposes one by one; the rest are summed.
pub(crate) const TOP_MODULES: usize = 10;
const D_ALLOCATED: Def = gauge(
    "vramscope_process_allocated_bytes",
    "Bytes held by tensors (torch.cuda.memory_allocated) on the device.",
);
const D_RESERVED: Def = gauge(
    "vramscope_process_reserved_bytes",
    "Bytes the caching allocator holds from CUDA (torch.cuda.memory_reserved) on the device.",
);
const D_ACTIVE: Def = gauge(
    "vramscope_process_active_bytes",
    "Bytes in active blocks (allocated, or freed but still used by a stream) on the device.",
);
const D_SPLIT: Def = gauge(
    "vramscope_process_inactive_split_bytes",
    "Cached bytes in split segments, which empty_cache cannot return.",
);
const D_PEAK_ALLOCATED: Def = gauge(
    "vramscope_process_allocated_peak_bytes",
    "Peak of allocated bytes on the device since start or the last peak reset.",
);
const D_PEAK_RESERVED: Def = gauge(
    "vramscope_process_reserved_peak_bytes",
    "Peak of reserved bytes on the device since start or the last peak reset.",
);
const D_PEAK_ACTIVE: Def = gauge(
    "vramscope_process_active_peak_bytes",
    "Peak of active bytes on the device since start or the last peak reset.",
);
const D_LARGEST_FREE: Def = gauge(
    "vramscope_process_largest_free_block_bytes",
    "Largest cached free block on the device: the largest request served without asking CUDA.",
);
const D_FRAGMENTATION: Def = gauge(
    "vramscope_process_fragmentation_ratio",
    "Inactive split bytes as a share of reserved bytes, 0 to 1.",
);
const D_RETRIES: Def = counter(
    "vramscope_process_alloc_retries_total",
    "Allocations that failed, freed the cache and retried (num_alloc_retries).",
);

/// A label set, written in order.
#[derive(Clone, Default)]
struct Labels(Vec<(&'static str, String)>);

impl Labels {
    fn with(&self, name: &'static str, value: impl ToString) -> Labels {
        let mut l = self.clone();
        l.0.push((name, value.to_string()));
        l
    }
}

/// A sample's value: integers stay exact.
enum Value {
    U(u64),
    I(i64),
    F(f64),
}

struct Family {
    def: &'static Def,
    samples: String,
}

/// Families in the order first written, each with its samples.
#[derive(Default)]
struct Out {
    families: Vec<Family>,
}

impl Out {
    fn put(&mut self, def: &'static Def, labels: &Labels, v: Value) {
        let fam = match self.families.iter().position(|f| f.def.name == def.name) {
            Some(i) => &mut self.families[i],
            None => {
                self.families.push(Family {
                    def,
                    samples: String::new(),
                });
                self.families.last_mut().expect("just pushed")
            }
        };
        let s = &mut fam.samples;
        s.push_str(def.name);
        if !labels.0.is_empty() {
            s.push('{');
            for (i, (k, val)) in labels.0.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                s.push_str(k);
                s.push_str("=\"");
                escape_label(val, s);
                s.push('"');
            }
            s.push('}');
        }
        s.push(' ');
        let _ = match v {
            Value::U(n) => write!(s, "{n}"),
            Value::I(n) => write!(s, "{n}"),
            Value::F(x) if x.is_nan() => write!(s, "NaN"),
            Value::F(x) if x.is_infinite() => write!(s, "{}Inf", if x > 0.0 { '+' } else { '-' }),
            Value::F(x) => write!(s, "{x}"),
        };
        s.push('\n');
    }

    fn finish(self, format: Format) -> String {
        let mut o =
            String::with_capacity(self.families.iter().map(|f| f.samples.len() + 200).sum());
        for f in &self.families {
            // OpenMetrics names a counter family without its `_total`.
            let name = match (format, f.def.kind) {
                (Format::OpenMetrics, Kind::Counter) => {
                    f.def.name.strip_suffix("_total").unwrap_or(f.def.name)
                }
                _ => f.def.name,
            };
            let ty = match f.def.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            let _ = writeln!(o, "# HELP {name} {}", escape_help(f.def.help));
            let _ = writeln!(o, "# TYPE {name} {ty}");
            if format == Format::OpenMetrics && name.ends_with("_bytes") {
                let _ = writeln!(o, "# UNIT {name} bytes");
            }
            o.push_str(&f.samples);
        }
        if format == Format::OpenMetrics {
            o.push_str("# EOF\n");
        }
        o
    }
}

/// A label value as the exposition formats want it: `\`, `"` and newlines
/// escaped.
/// A label value by the exposition format's rules (a backslash, a double
/// quote and a line feed escaped), and printable: any other character
/// [`vramscope_text::printable`] replaces (a carriage return, a page break, a
/// line separator, an escape) is U+FFFD, whatever the label's source (a
/// job's setting is its own text: issue 44, item 5).
fn escape_label(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if vramscope_text::unsafe_char(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
}

fn escape_help(h: &str) -> String {
    h.replace('\\', "\\\\").replace('\n', "\\n")
}

fn mode_label(m: Mode) -> &'static str {
    match m {
        Mode::Exact => "exact",
        Mode::Sampled => "sampled",
        Mode::NvmlOnly => "nvml_only",
    }
}

/// The exposition of `snap` for `host`, in `format`.
pub(crate) fn render(snap: &Snapshot, host: &str, format: Format) -> String {
    let mut out = Out::default();
    let node = Labels::default().with("host", host);
    out.put(
        &EXPORTER_INFO,
        &node.with("version", env!("CARGO_PKG_VERSION")),
        Value::U(1),
    );
    let m = &snap.machine;
    // Before NVML's first reading nothing is known of it: absent.
    if m.nvml_error.is_some() || m.sampled_ns.is_some() {
        out.put(&NVML_UP, &node, Value::U(u64::from(m.nvml_error.is_none())));
    }
    out.put(&PROCESSES, &node, Value::U(snap.processes.len() as u64));
    out.put(&PROBLEMS, &node, Value::U(snap.problems.len() as u64));
    for g in &m.gpus {
        let l = node
            .with("gpu", g.index)
            .with("uuid", g.uuid.as_deref().unwrap_or(""))
            .with("name", &g.name);
        if let Some(v) = g.total {
            out.put(&GPU_TOTAL, &l, Value::U(v));
        }
        if let Some(v) = g.used {
            out.put(&GPU_USED, &l, Value::U(v));
        }
        if let Some(u) = g.util_gpu {
            out.put(&GPU_UTIL, &l, Value::F(f64::from(u) / 100.0));
        }
        if let Some(u) = g.util_mem {
            out.put(&GPU_MEM_UTIL, &l, Value::F(f64::from(u) / 100.0));
        }
    }
    for p in &snap.processes {
        process(&mut out, &node, snap, p);
    }
    out.finish(format)
}

fn process(out: &mut Out, node: &Labels, snap: &Snapshot, p: &ProcessEntry) {
    let id = &p.identity;
    let name = if id.label.is_empty() {
        &id.name
    } else {
        &id.label
    };
    let l = node
        .with("pid", id.host_pid)
        .with("user", &id.user)
        .with("process", name)
        .with("mode", mode_label(p.view.mode));
    let f = &p.view.figures;
    out.put(&P_RUNNING, &l, Value::U(u64::from(id.alive)));
    if let Some(v) = f.nvml_used {
        out.put(&P_NVML_USED, &l, Value::U(v));
    }
    if let Some(v) = f.non_pytorch {
        out.put(&P_NON_PYTORCH, &l, Value::I(v));
    }
    if p.view.mode != Mode::NvmlOnly {
        out.put(&P_EVENTS, &l, Value::U(f.events_total));
        out.put(&P_LOST, &l, Value::U(f.lost_events));
        out.put(&P_OOMS, &l, Value::U(p.view.ooms_total));
        let leak = &p.view.leak;
        out.put(&P_STEPS, &l, Value::U(leak.steps_observed));
        if leak.steps_observed >= p.view.leak_criterion.min_steps as u64 {
            out.put(&P_LEAK, &l, Value::U(u64::from(leak.flagged)));
            out.put(
                &P_LEAK_GROWTH,
                &l,
                Value::F(leak.floor_slope_bytes_per_step),
            );
        }
        if let Some(f) = &p.view.forecast {
            out.put(&P_OOM_STEP, &l, Value::U(f.oom_step));
            if let Some(ns) = f.in_ns {
                out.put(&P_OOM_SECONDS, &l, Value::F(ns as f64 / 1e9));
            }
        }
        attribution(out, &l, &p.view.attribution);
        if let Some(a) = &p.advice {
            advice(out, &l, a);
        }
    }
    // The GPUs NVML shows this process on: a device of the process is
    // named after one only when the pairing is unambiguous.
    let mut on: Vec<u32> = snap
        .machine
        .processes
        .iter()
        .filter(|g| g.pid == id.host_pid)
        .map(|g| g.gpu)
        .collect();
    on.sort_unstable();
    on.dedup();
    let paired = p.view.devices.len() == 1 && on.len() == 1;
    for d in &p.view.devices {
        let df = &d.figures;
        let mut dl = l.with("device", df.device);
        let gpu = paired
            .then(|| snap.machine.gpus.iter().find(|g| g.index == on[0]))
            .flatten();
        if let Some(g) = gpu {
            dl = dl
                .with("gpu", g.index)
                .with("uuid", g.uuid.as_deref().unwrap_or(""));
        }
        out.put(&D_ALLOCATED, &dl, Value::U(df.allocated));
        out.put(&D_RESERVED, &dl, Value::U(df.reserved));
        out.put(&D_ACTIVE, &dl, Value::U(df.active));
        out.put(&D_SPLIT, &dl, Value::U(df.fragmentation.inactive_split));
        out.put(&D_PEAK_ALLOCATED, &dl, Value::U(df.peak_allocated));
        out.put(&D_PEAK_RESERVED, &dl, Value::U(df.peak_reserved));
        out.put(&D_PEAK_ACTIVE, &dl, Value::U(df.peak_active));
        let fr = &df.fragmentation;
        if let Some(b) = fr.largest_free_small.max(fr.largest_free_large) {
            out.put(&D_LARGEST_FREE, &dl, Value::U(b));
        }
        if let Some(s) = fr.share_of_reserved {
            out.put(&D_FRAGMENTATION, &dl, Value::F(s));
        }
        if let Some(st) = &df.stats {
            out.put(&D_RETRIES, &dl, Value::U(st.alloc_retries));
        }
    }
}

/// The `module` label of the modules past the [`TOP_MODULES`] largest.
pub(crate) const OTHER_MODULES: &str = "(other)";
/// The `module` label of allocations made outside every module.
pub(crate) const NO_MODULE: &str = "(none)";

/// The `module` label value of module path `path` (the producer's text):
/// [`NO_MODULE`] for none (""), else the path, with one more `(` in front
/// when it begins with `(`. So no path's value is [`OTHER_MODULES`] or
/// [`NO_MODULE`], and two paths never share one.
pub(crate) fn module_label(path: &str) -> std::borrow::Cow<'_, str> {
    if path.is_empty() {
        NO_MODULE.into()
    } else if path.starts_with('(') {
        format!("({path}").into()
    } else {
        path.into()
    }
}

/// Live bytes by module (the largest [`TOP_MODULES`], then `(other)`) and
/// by phase, when the producer tags its allocations.
/// The longest `conf` label value (a job's own setting is its own text).
const MAX_CONF_LABEL: usize = 256;

fn advice(out: &mut Out, l: &Labels, a: &vramscope_core::sim::live::LiveAdvice) {
    out.put(&P_ADVICE_REQUESTS, l, Value::U(a.coverage.requests));
    out.put(
        &P_ADVICE_FOLLOWING,
        l,
        Value::U(u64::from(a.coverage.stopped.is_none())),
    );
    let Some(advice) = &a.advice else {
        return;
    };
    let conf = |c: &str| c.chars().take(MAX_CONF_LABEL).collect::<String>();
    let (best_conf, saving, best_ooms) = match a.best() {
        Some((b, saving)) => (conf(&b.candidate.conf), saving, Some(b.totals.ooms.hi)),
        None => (String::new(), 0, None),
    };
    out.put(
        &P_ADVICE_SAVING,
        &l.with("conf", best_conf.clone()),
        Value::I(saving),
    );
    if let Some(own) = advice.outcomes.iter().find(|o| o.candidate.own) {
        let own_l = l
            .with("candidate", "own")
            .with("conf", conf(&own.candidate.conf));
        out.put(&P_ADVICE_OOMS, &own_l, Value::U(own.totals.ooms.hi));
    }
    if let Some(n) = best_ooms {
        let best_l = l.with("candidate", "best").with("conf", best_conf);
        out.put(&P_ADVICE_OOMS, &best_l, Value::U(n));
    }
}

fn attribution(out: &mut Out, l: &Labels, a: &vramscope_core::model::attrib::Attribution) {
    // Roles: exact ones need role lists, the others context tags.
    if a.tagged() || a.role_lists.lists > 0 {
        for r in &a.roles {
            out.put(&P_ROLE, &l.with("role", r.role.name()), Value::U(r.bytes));
        }
    }
    if !a.tagged() {
        return;
    }
    // `by_module` is sorted, most bytes first.
    for m in a.by_module.iter().take(TOP_MODULES) {
        let name = module_label(&m.module);
        out.put(&P_MODULE, &l.with("module", name), Value::U(m.bytes));
    }
    if a.by_module.len() > TOP_MODULES {
        let rest = (a.by_module[TOP_MODULES..].iter()).fold(0u64, |s, m| s.saturating_add(m.bytes));
        out.put(&P_MODULE, &l.with("module", OTHER_MODULES), Value::U(rest));
    }
    for p in &a.by_phase {
        out.put(
            &P_PHASE,
            &l.with("phase", p.phase.name()),
            Value::U(p.bytes),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_core::model::attrib::{Attribution, PhaseKey};

    /// One allocation context in `module`, in `phase`.
    fn context(
        module: &str,
        phase: vramscope_core::model::attrib::PhaseKey,
    ) -> vramscope_core::model::attrib::ContextView {
        vramscope_core::model::attrib::ContextView {
            id: 1,
            module: module.into(),
            phase,
            step: None,
            stack: vec![],
        }
    }

    /// What the exporter writes for `a`, as process 7's.
    fn exposed(a: &Attribution) -> String {
        let mut out = Out::default();
        attribution(&mut out, &Labels::default().with("pid", 7), a);
        out.finish(Format::Prometheus)
    }

    /// The per-module rows of an exposition.
    fn module_rows(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with("vramscope_process_module_allocated_bytes{"))
            .collect()
    }

    #[test]
    fn accept_header_picks_the_format() {
        let prom = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert_eq!(Format::from_accept(Some(prom)), Format::OpenMetrics);
        assert_eq!(Format::from_accept(None), Format::Prometheus);
        assert_eq!(
            Format::from_accept(Some("text/plain;version=0.0.4")),
            Format::Prometheus
        );
        assert_eq!(
            Format::from_accept(Some("application/openmetrics-text;q=0")),
            Format::Prometheus
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        escape_label("a\\b\"c\nd", &mut s);
        assert_eq!(s, "a\\\\b\\\"c\\nd");
    }

    /// Issue 44, item 5: the other line and page breaks, escapes and
    /// bidirectional overrides, whatever the label's source.
    #[test]
    fn item5_label_values_carry_no_control_character() {
        let mut s = String::new();
        escape_label(
            "a\rb\x0bc\x0cd\u{85}e\u{2028}f\u{2029}g\x1b[2Jh\u{202e}\ti",
            &mut s,
        );
        assert_eq!(
            s,
            "a\u{fffd}b\u{fffd}c\u{fffd}d\u{fffd}e\u{fffd}f\u{fffd}g\u{fffd}[2Jh\u{fffd}\u{fffd}i"
        );
    }

    #[test]
    fn fixture_exposition_has_help_type_and_labels() {
        let snap = crate::fixtures::Fixture::new(3).snapshot(&Default::default());
        let text = render(&snap, "node\"1", Format::Prometheus);
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "no TYPE for {name}"
            );
            assert!(line.contains("host=\"node\\\"1\""), "{line}");
        }
        assert!(text.contains("vramscope_process_allocated_bytes{"));
        assert!(!text.contains("# EOF"));
        let om = render(&snap, "n", Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("# TYPE vramscope_process_events counter\n"));
        assert!(om.contains("\nvramscope_process_events_total{"));
    }

    /// At most ten modules one by one, the rest in `(other)`; outside
    /// every module is `(none)`; nothing from an untagged producer.
    #[test]
    fn top_modules_then_other() {
        use vramscope_core::model::attrib::{ModuleBytes, PhaseBytes};
        let mut a = Attribution {
            by_module: (0..13)
                .map(|i| ModuleBytes {
                    module: if i == 0 {
                        String::new()
                    } else {
                        format!("m.{i}")
                    },
                    bytes: 100 - i,
                    blocks: 1,
                })
                .collect(),
            by_phase: vec![PhaseBytes {
                phase: PhaseKey::Backward,
                bytes: 7,
                blocks: 1,
            }],
            contexts: vec![context("m.1", PhaseKey::Backward)],
            ..Attribution::default()
        };
        a.roles = vec![vramscope_core::model::attrib::RoleTotal {
            role: vramscope_core::model::roles::Role::OptimizerState,
            bytes: 64,
            blocks: 2,
        }];
        let text = exposed(&a);
        assert!(text.contains(
            "vramscope_process_role_allocated_bytes{pid=\"7\",role=\"optimizer_state\"} 64"
        ));
        let rows = module_rows(&text);
        assert_eq!(rows.len(), 11, "{text}");
        assert_eq!(
            rows[0],
            "vramscope_process_module_allocated_bytes{pid=\"7\",module=\"(none)\"} 100"
        );
        // m.10, m.11, m.12: 90 + 89 + 88.
        assert_eq!(
            rows[10],
            "vramscope_process_module_allocated_bytes{pid=\"7\",module=\"(other)\"} 267"
        );
        assert!(text
            .contains("vramscope_process_phase_allocated_bytes{pid=\"7\",phase=\"backward\"} 7"));
        a.contexts.clear();
        a.roles.clear();
        let mut out = Out::default();
        attribution(&mut out, &Labels::default(), &a);
        assert_eq!(out.finish(Format::Prometheus), "");
    }

    /// Item 11: modules a producer names `(other)` and `(none)` (and any
    /// path beginning with `(`) are series of their own, never the
    /// aggregates': every module row of a process has its own value.
    #[test]
    fn item11_module_label_values_are_unambiguous() {
        use vramscope_core::model::attrib::ModuleBytes;
        let tricky = [
            "",
            "(none)",
            "(other)",
            "((other)",
            "(((other)",
            "(",
            "((",
            "a",
            "(a",
            "((a",
            "(none",
        ];
        let mut seen = std::collections::BTreeSet::new();
        for path in tricky {
            let v = module_label(path).into_owned();
            assert!(seen.insert(v.clone()), "{path:?} shares {v:?}");
            if !path.is_empty() {
                assert!(v != NO_MODULE && v != OTHER_MODULES, "{path:?} is {v:?}");
            }
        }
        assert_eq!(module_label("(other)"), "((other)");
        assert_eq!(module_label("model.layers.0"), "model.layers.0");
        // A process whose largest modules are named like the aggregates,
        // with allocations outside every module and more than ten modules.
        let mut names = vec!["(other)".to_string(), "(none)".to_string(), String::new()];
        names.extend((0..12).map(|i| format!("m.{i}")));
        let a = Attribution {
            by_module: (names.iter().enumerate())
                .map(|(i, m)| ModuleBytes {
                    module: m.clone(),
                    bytes: 1000 - i as u64,
                    blocks: 1,
                })
                .collect(),
            contexts: vec![context("(other)", PhaseKey::Forward)],
            ..Attribution::default()
        };
        let text = exposed(&a);
        let values: Vec<&str> = module_rows(&text)
            .into_iter()
            .map(|l| {
                l.split("module=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap()
            })
            .collect();
        let distinct: std::collections::BTreeSet<&str> = values.iter().copied().collect();
        assert_eq!((values.len(), distinct.len()), (11, 11), "{text}");
        for v in ["((other)", "((none)", "(none)", "(other)"] {
            assert!(distinct.contains(v), "{v} missing: {text}");
        }
        assert!(text.contains("module=\"(none)\"} 998"), "{text}");
        assert!(text.contains("module=\"((none)\"} 999"), "{text}");
    }
}
