//! The collector's published picture ([`Snapshot`]) as Prometheus metrics:
//! the text exposition format 0.0.4, or OpenMetrics 1.0 when the scraper
//! asks for it. Pure: a snapshot in, text out.
//!
//! The families (name, type, help) and the label names are those of the
//! table in [`metrics`], which the fleet view reads too. Names
//! follow Prometheus's conventions: a `vramscope_` prefix, base units
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

use crate::metrics::{self, label, Def, Kind};
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

/// Modules a process exposes one by one; the rest are summed.
pub(crate) const TOP_MODULES: usize = 10;

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
    let node = Labels::default().with(label::HOST, host);
    out.put(
        &metrics::EXPORTER_INFO,
        &node.with(label::VERSION, env!("CARGO_PKG_VERSION")),
        Value::U(1),
    );
    let m = &snap.machine;
    // Before NVML's first reading nothing is known of it: absent.
    if m.nvml_error.is_some() || m.sampled_ns.is_some() {
        out.put(
            &metrics::NVML_UP,
            &node,
            Value::U(u64::from(m.nvml_error.is_none())),
        );
    }
    out.put(
        &metrics::PROCESSES,
        &node,
        Value::U(snap.processes.len() as u64),
    );
    out.put(
        &metrics::PROBLEMS,
        &node,
        Value::U(snap.problems.len() as u64),
    );
    for g in &m.gpus {
        let l = node
            .with(label::GPU, g.index)
            .with(label::UUID, g.uuid.as_deref().unwrap_or(""))
            .with(label::NAME, &g.name);
        if let Some(v) = g.total {
            out.put(&metrics::GPU_TOTAL, &l, Value::U(v));
        }
        if let Some(v) = g.used {
            out.put(&metrics::GPU_USED, &l, Value::U(v));
        }
        if let Some(u) = g.util_gpu {
            out.put(&metrics::GPU_UTIL, &l, Value::F(f64::from(u) / 100.0));
        }
        if let Some(u) = g.util_mem {
            out.put(&metrics::GPU_MEM_UTIL, &l, Value::F(f64::from(u) / 100.0));
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
        .with(label::PID, id.host_pid)
        .with(label::USER, &id.user)
        .with(label::PROCESS, name)
        .with(label::MODE, mode_label(p.view.mode));
    let f = &p.view.figures;
    out.put(&metrics::P_RUNNING, &l, Value::U(u64::from(id.alive)));
    if let Some(v) = f.nvml_used {
        out.put(&metrics::P_NVML_USED, &l, Value::U(v));
    }
    if let Some(v) = f.non_pytorch {
        out.put(&metrics::P_NON_PYTORCH, &l, Value::I(v));
    }
    if let Some(v) = f.unexplained {
        out.put(&metrics::P_UNEXPLAINED, &l, Value::I(v));
    }
    outside(out, &l, &p.view.outside);
    if p.view.mode != Mode::NvmlOnly {
        out.put(&metrics::P_EVENTS, &l, Value::U(f.events_total));
        out.put(&metrics::P_LOST, &l, Value::U(f.lost_events));
        out.put(&metrics::P_OOMS, &l, Value::U(p.view.ooms_total));
        let leak = &p.view.leak;
        out.put(&metrics::P_STEPS, &l, Value::U(leak.steps_total));
        if leak.steps_observed >= p.view.leak_criterion.min_steps as u64 {
            out.put(&metrics::P_LEAK, &l, Value::U(u64::from(leak.flagged)));
            out.put(
                &metrics::P_LEAK_GROWTH,
                &l,
                Value::F(leak.floor_slope_bytes_per_step),
            );
        }
        if let Some(f) = &p.view.forecast {
            out.put(&metrics::P_OOM_STEP, &l, Value::U(f.oom_step));
            let simulated = f.method == vramscope_core::model::forecast::Method::Simulation;
            out.put(
                &metrics::P_OOM_SIMULATED,
                &l,
                Value::U(u64::from(simulated)),
            );
            if let Some(ns) = f.in_ns {
                out.put(&metrics::P_OOM_SECONDS, &l, Value::F(ns as f64 / 1e9));
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
        let mut dl = l.with(label::DEVICE, df.device);
        let gpu = paired
            .then(|| snap.machine.gpus.iter().find(|g| g.index == on[0]))
            .flatten();
        if let Some(g) = gpu {
            dl = dl
                .with(label::GPU, g.index)
                .with(label::UUID, g.uuid.as_deref().unwrap_or(""));
        }
        out.put(&metrics::D_ALLOCATED, &dl, Value::U(df.allocated));
        out.put(&metrics::D_RESERVED, &dl, Value::U(df.reserved));
        out.put(&metrics::D_ACTIVE, &dl, Value::U(df.active));
        out.put(
            &metrics::D_SPLIT,
            &dl,
            Value::U(df.fragmentation.inactive_split),
        );
        out.put(&metrics::D_PEAK_ALLOCATED, &dl, Value::U(df.peak_allocated));
        out.put(&metrics::D_PEAK_RESERVED, &dl, Value::U(df.peak_reserved));
        out.put(&metrics::D_PEAK_ACTIVE, &dl, Value::U(df.peak_active));
        let fr = &df.fragmentation;
        if let Some(b) = fr.largest_free_small.max(fr.largest_free_large) {
            out.put(&metrics::D_LARGEST_FREE, &dl, Value::U(b));
        }
        if let Some(s) = fr.share_of_reserved {
            out.put(&metrics::D_FRAGMENTATION, &dl, Value::F(s));
        }
        if let Some(st) = &df.stats {
            out.put(&metrics::D_RETRIES, &dl, Value::U(st.alloc_retries));
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

/// Parts of memory outside the caching allocator a process exposes one
/// by one; the rest are summed.
pub(crate) const TOP_OUTSIDE: usize = 16;

/// Memory outside the caching allocator (issue 47): one series per part
/// (device, what, kind), the [`TOP_OUTSIDE`] largest, the rest summed in
/// `what="(other)",kind="(other)"`. `what` is the producer's text where it
/// names a library by its file: escaped as module paths are
/// ([`module_label`]), so `(other)` is only ever the sum.
fn outside(out: &mut Out, l: &Labels, parts: &[vramscope_core::model::outside::OutsidePart]) {
    // `parts` is sorted, most bytes first.
    for p in parts.iter().take(TOP_OUTSIDE) {
        let mut pl = l.clone();
        if let Some(d) = p.device {
            pl = pl.with(label::DEVICE, d);
        }
        let pl = pl
            .with(label::WHAT, module_label(p.what()))
            .with(label::KIND, &p.kind);
        out.put(&metrics::P_OUTSIDE, &pl, Value::U(p.bytes));
    }
    if parts.len() > TOP_OUTSIDE {
        let rest = (parts[TOP_OUTSIDE..].iter()).fold(0u64, |s, p| s.saturating_add(p.bytes));
        let rl = l
            .with(label::WHAT, OTHER_MODULES)
            .with(label::KIND, OTHER_MODULES);
        out.put(&metrics::P_OUTSIDE, &rl, Value::U(rest));
    }
}

/// Live bytes by module (the largest [`TOP_MODULES`], then `(other)`) and
/// by phase, when the producer tags its allocations.
/// The longest `conf` label value (a job's own setting is its own text).
const MAX_CONF_LABEL: usize = 256;

fn advice(out: &mut Out, l: &Labels, a: &vramscope_core::sim::live::LiveAdvice) {
    out.put(
        &metrics::P_ADVICE_REQUESTS,
        l,
        Value::U(a.coverage.requests),
    );
    out.put(
        &metrics::P_ADVICE_FOLLOWING,
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
        &metrics::P_ADVICE_SAVING,
        &l.with(label::CONF, best_conf.clone()),
        Value::I(saving),
    );
    if let Some(own) = advice.outcomes.iter().find(|o| o.candidate.own) {
        let own_l = l
            .with(label::CANDIDATE, "own")
            .with(label::CONF, conf(&own.candidate.conf));
        out.put(
            &metrics::P_ADVICE_OOMS,
            &own_l,
            Value::U(own.totals.ooms.hi),
        );
    }
    if let Some(n) = best_ooms {
        let best_l = l
            .with(label::CANDIDATE, "best")
            .with(label::CONF, best_conf);
        out.put(&metrics::P_ADVICE_OOMS, &best_l, Value::U(n));
    }
}

fn attribution(out: &mut Out, l: &Labels, a: &vramscope_core::model::attrib::Attribution) {
    // Roles: exact ones need role lists, the others context tags.
    if a.tagged() || a.role_lists.lists > 0 {
        for r in &a.roles {
            out.put(
                &metrics::P_ROLE,
                &l.with(label::ROLE, r.role.name()),
                Value::U(r.bytes),
            );
        }
    }
    if !a.tagged() {
        return;
    }
    // `by_module` is sorted, most bytes first.
    for m in a.by_module.iter().take(TOP_MODULES) {
        let name = module_label(&m.module);
        out.put(
            &metrics::P_MODULE,
            &l.with(label::MODULE, name),
            Value::U(m.bytes),
        );
    }
    if a.by_module.len() > TOP_MODULES {
        let rest = (a.by_module[TOP_MODULES..].iter()).fold(0u64, |s, m| s.saturating_add(m.bytes));
        out.put(
            &metrics::P_MODULE,
            &l.with(label::MODULE, OTHER_MODULES),
            Value::U(rest),
        );
    }
    for p in &a.by_phase {
        out.put(
            &metrics::P_PHASE,
            &l.with(label::PHASE, p.phase.name()),
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

    /// Issue 48: the forecast's step says how it was found: 1 for the
    /// simulator's, 0 for a projection; neither without a forecast.
    #[test]
    fn the_forecast_says_whether_it_was_simulated() {
        use vramscope_core::model::forecast::{Cause, Forecast, Method};
        let mut snap = crate::fixtures::Fixture::new(1).snapshot(&Default::default());
        let shown = |snap: &Snapshot| -> Vec<String> {
            (render(snap, "h", Format::Prometheus).lines())
                .filter(|l| l.starts_with("vramscope_process_oom_forecast_"))
                .map(|l| {
                    let (name, rest) = l.split_once('{').unwrap();
                    format!("{name} {}", rest.rsplit(' ').next().unwrap())
                })
                .collect()
        };
        snap.processes.truncate(1);
        snap.processes[0].view.forecast = None;
        assert!(shown(&snap).is_empty());
        let mut f = Forecast {
            oom_step: 51,
            steps_left: 20,
            in_ns: None,
            limit: 1 << 30,
            reserved: 1 << 29,
            growth_per_step: 1 << 20,
            fraction: true,
            request: Some(1 << 20),
            cause: Cause::Leak,
            method: Method::Simulation,
        };
        snap.processes[0].view.forecast = Some(f);
        assert_eq!(
            shown(&snap),
            [
                "vramscope_process_oom_forecast_step 51",
                "vramscope_process_oom_forecast_simulated 1"
            ]
        );
        f.method = Method::Projection;
        snap.processes[0].view.forecast = Some(f);
        assert_eq!(
            shown(&snap)[1],
            "vramscope_process_oom_forecast_simulated 0"
        );
    }

    /// Issue 45: every family the fleet view asks Prometheus for (read
    /// from its queries, not listed here) is one the exporter writes: a
    /// name in a query that the exposition of a fixture machine never
    /// has (a typo, a family renamed on one side) fails.
    #[test]
    fn every_family_the_fleet_asks_for_is_served() {
        let snap = crate::fixtures::Fixture::new(6).snapshot(&Default::default());
        let text = render(&snap, "h", Format::Prometheus);
        let served: std::collections::BTreeSet<&str> = (text.lines())
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let fleet = crate::fleet::model::queries("j");
        let series = crate::fleet::model::series_queries("j", "i:1", "7");
        let mut asked = std::collections::BTreeSet::new();
        for q in fleet.iter().chain(&series) {
            let words = q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
            asked.extend(words.filter(|w| w.starts_with("vramscope_")));
        }
        // The figures, the step rates and the two series at least.
        assert!(asked.len() >= 13, "{asked:?}");
        let missing: Vec<&&str> = asked.iter().filter(|n| !served.contains(**n)).collect();
        assert!(missing.is_empty(), "asked for, never served: {missing:?}");
    }

    /// Issue 47: what a process holds outside the caching allocator, one
    /// series per part (a fixture's simulated job: its context and
    /// cuBLAS's workspace on device 0), and what no one named (the
    /// fixture's NVML figure has 4 MiB more); at most 16 parts one by one,
    /// the rest summed in `(other)`, a library's file name escaped as a
    /// module path is.
    #[test]
    fn outside_parts_and_what_no_one_named() {
        use vramscope_core::model::outside::OutsidePart;
        let snap = crate::fixtures::Fixture::new(1).snapshot(&Default::default());
        let text = render(&snap, "h", Format::Prometheus);
        let rows: Vec<&str> = (text.lines())
            .filter(|l| {
                l.starts_with("vramscope_process_outside_bytes{")
                    || l.starts_with("vramscope_process_unexplained_bytes{")
            })
            .map(|l| l.split_once("mode=\"exact\"").unwrap().1)
            .collect();
        assert_eq!(
            rows,
            [
                "} 4194304",
                ",device=\"0\",what=\"context\",kind=\"context\"} 524288000",
                ",device=\"0\",what=\"cuBLAS\",kind=\"allocations\"} 33554432",
            ],
            "{text}"
        );
        assert!(text.contains("# TYPE vramscope_process_outside_bytes gauge\n"));
        // Without NVML: the parts, and no unexplained figure.
        let snap = crate::fixtures::Fixture::without_nvml(1).snapshot(&Default::default());
        let text = render(&snap, "h", Format::Prometheus);
        assert!(text.contains("what=\"cuBLAS\""), "{text}");
        assert!(
            !text.contains("vramscope_process_unexplained_bytes"),
            "{text}"
        );
        // A producer naming many libraries by their files.
        let mut parts: Vec<OutsidePart> = (0..20u64)
            .map(|i| OutsidePart {
                device: Some(0),
                library: format!("lib{i}.so"),
                kind: "allocations".into(),
                bytes: 100 - i,
            })
            .collect();
        parts[0].library = "(other)".into();
        parts[1].device = None;
        parts[1].kind = "pinned host".into();
        let mut out = Out::default();
        outside(&mut out, &Labels::default(), &parts);
        let text = out.finish(Format::Prometheus);
        let rows: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), TOP_OUTSIDE + 1, "{text}");
        assert_eq!(
            rows[0],
            "vramscope_process_outside_bytes{device=\"0\",what=\"((other)\",kind=\"allocations\"} 100"
        );
        assert_eq!(
            rows[1],
            "vramscope_process_outside_bytes{what=\"lib1.so\",kind=\"pinned host\"} 99"
        );
        // lib16 .. lib19: 84 + 83 + 82 + 81.
        assert_eq!(
            rows[TOP_OUTSIDE],
            "vramscope_process_outside_bytes{what=\"(other)\",kind=\"(other)\"} 330"
        );
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
