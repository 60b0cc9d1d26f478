//! `vramscope open FILE`: a PyTorch memory snapshot file
//! (`torch.cuda.memory._dump_snapshot`, an OOM observer's dump) in the
//! dashboard, at the file's state, with its trace as the timeline; or, with
//! `--json`, its figures and state (and with `--trace` every trace event
//! with its stack); with `--at N`, the state after the trace's first N
//! events, rebuilt by the model; with `--frames ADDR`, the stacks that
//! allocated and freed the block at ADDR.
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde::Serialize;

use vramscope::collect::Hub;
use vramscope::model::{ProcessKey, ViewOptions};
use vramscope::ring::{Command, Outcome};
use vramscope::snapfile::inputs::{self, Plan};
use vramscope::snapfile::step::{self, Stepper, TraceStatus};
use vramscope::snapfile::{self, Action, SnapshotFile, Totals};

use super::dashboard::UiFlags;
use super::out;
use super::value::Index;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot file (a pickle written by torch.cuda.memory._dump_snapshot).
    file: PathBuf,
    /// Print the file's figures and state as JSON instead of opening the dashboard.
    #[arg(long)]
    json: bool,
    /// With --json: every trace event, with the stacks and frames they name.
    #[arg(long, requires = "json")]
    trace: bool,
    /// The state after the trace's first N events (0: before the first).
    #[arg(long, value_name = "N")]
    at: Option<Index>,
    /// Print the stacks of the block at (or containing) ADDR: the state's,
    /// and every trace event of that address.
    #[arg(long, value_name = "ADDR", value_parser = parse_addr, conflicts_with = "json")]
    frames: Option<u64>,
    #[command(flatten)]
    view: UiFlags,
}

/// An address, in decimal or 0x-hex.
fn parse_addr(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("'{s}' is not an address (decimal or 0x-hex)"))
}

pub fn run(args: Args) -> Result<()> {
    let file = snapfile::read(&args.file)?;
    let name = args.file.display().to_string();
    let plan = Plan {
        upto: args.at.map(|n| n.get() as usize),
    };
    if let Some(addr) = args.frames {
        return out::print(&frames_text(&file, addr));
    }
    if args.json {
        let hub = Hub::default();
        let mut last = 0;
        for (t, input) in inputs::inputs(&file, &name, plan) {
            last = t;
            hub.apply(input);
        }
        let view = ViewOptions {
            block_map: true,
            recent_events: 0,
            timeline: None,
        };
        let report = Report::new(&file, &name, plan, hub.snapshot_at(last, &view), args.trace);
        return out::line(&serde_json::to_string_pretty(&report)?);
    }
    // The dashboard, at event N (--at) or the file's state; the trace is
    // stepped through with keys, each step rebuilding the state.
    let hub = Arc::new(Hub::default());
    let mut stepper = Stepper::new(file, &name);
    let at = plan.upto.unwrap_or(usize::MAX);
    stepper.seek(&hub, at, vramscope::ring::monotonic_ns());
    let mut opts = args.view.options()?;
    opts.readonly = true;
    opts.initial_process.get_or_insert(inputs::KEY.pid);
    let driver = Arc::new(FileDriver {
        rt: vramscope::collect::runtime().context("starting the signal handler")?,
        hub: hub.clone(),
        stepper: Mutex::new(stepper),
    });
    vramscope::ui::run(hub, driver, None, opts)
}

/// A snapshot file cannot be sent commands; signals still end the
/// dashboard; its trace is stepped through on the dashboard's thread.
struct FileDriver {
    rt: tokio::runtime::Runtime,
    hub: Arc<Hub>,
    stepper: Mutex<Stepper>,
}

impl FileDriver {
    fn stepper(&self) -> std::sync::MutexGuard<'_, Stepper> {
        self.stepper.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl vramscope::ui::Driver for FileDriver {
    fn request(
        &self,
        _key: ProcessKey,
        _command: Command,
        done: Box<dyn FnOnce(Result<Outcome, String>) + Send>,
    ) {
        done(Err("a snapshot file cannot be sent commands".into()));
    }
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _guard = self.rt.enter();
        vramscope::collect::signals::forward(f);
    }
    fn trace(&self) -> Option<TraceStatus> {
        Some(self.stepper().status())
    }
    fn seek(&self, at: usize) -> Option<TraceStatus> {
        let now = vramscope::ring::monotonic_ns();
        Some(self.stepper().seek(&self.hub, at, now))
    }
}

/// What `open --json` prints.
#[derive(Serialize)]
struct Report<'a> {
    file: &'a str,
    format: &'a str,
    /// The figures PyTorch reports for the file's state, per device.
    devices: Vec<Totals>,
    allocator_settings: serde_json::Map<String, serde_json::Value>,
    trace: TraceSummary,
    /// The model's state: the file's own, or after `--at N` events.
    state: vramscope::collect::Snapshot,
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<Vec<EventOut<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stacks: Option<&'a snapfile::Stacks>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<&'a [snapfile::Frame]>,
}

#[derive(Serialize)]
struct TraceSummary {
    /// Trace entries per device.
    entries: Vec<usize>,
    /// Events the state was rebuilt to (`--at`), if not the whole trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<usize>,
    unknown_actions: u64,
    annotations: usize,
    /// The OOMs the trace records, the last one last.
    ooms: Vec<OomOut>,
    /// The trace ends in an OOM, `snapshot` entries after it aside (the
    /// file is an OOM observer's dump).
    ends_in_oom: bool,
}

#[derive(Serialize)]
struct OomOut {
    device: u16,
    index: usize,
    requested: u64,
    device_free: u64,
    time_us: Option<i64>,
    stack: Vec<String>,
}

#[derive(Serialize)]
struct EventOut<'a> {
    device: u16,
    time_ns: u64,
    #[serde(flatten)]
    entry: &'a snapfile::TraceEntry,
}

impl<'a> Report<'a> {
    fn new(
        file: &'a SnapshotFile,
        name: &'a str,
        plan: Plan,
        state: vramscope::collect::Snapshot,
        trace: bool,
    ) -> Self {
        let timeline = inputs::timeline(file);
        let ooms = timeline
            .iter()
            .enumerate()
            .filter(|(_, t)| t.entry.action == Action::Oom)
            .map(|(i, t)| OomOut {
                device: t.device,
                index: i,
                requested: t.entry.size,
                device_free: t.entry.addr,
                time_us: t.entry.time_us,
                stack: step::stack_lines(file, t.entry.stack),
            })
            .collect();
        // `snapshot` entries (each `memory_snapshot()` call, the dump's own
        // included, records one) come after the OOM in an observer's dump.
        let ends_in_oom = file.traces.iter().any(|t| {
            t.iter()
                .rev()
                .find(|e| e.action != Action::Snapshot)
                .is_some_and(|e| e.action == Action::Oom)
        });
        Report {
            file: name,
            format: &file.format,
            devices: file.totals(),
            allocator_settings: file
                .allocator_settings
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
            trace: TraceSummary {
                entries: file.traces.iter().map(Vec::len).collect(),
                at: plan.upto,
                unknown_actions: file.unknown_actions,
                annotations: file.annotations,
                ooms,
                ends_in_oom,
            },
            state,
            events: trace.then(|| {
                timeline
                    .iter()
                    .map(|t| EventOut {
                        device: t.device,
                        time_ns: t.time_ns,
                        entry: t.entry,
                    })
                    .collect()
            }),
            stacks: trace.then_some(&file.stacks),
            frames: trace.then_some(&file.frames[..]),
        }
    }
}

/// `--frames ADDR`: the block's stack in the state, then every trace event
/// at that address with its stack.
fn frames_text(file: &SnapshotFile, addr: u64) -> String {
    use vramscope::ui::format::bytes;
    let mut out = String::new();
    let block = file.segments.iter().find_map(|s| {
        s.blocks
            .iter()
            .find(|b| b.address <= addr && addr < b.address.saturating_add(b.size))
            .map(|b| (s, b))
    });
    match block {
        Some((s, b)) => {
            out.push_str(&format!(
                "block 0x{:x} ({}, {:?}) in segment 0x{:x} of device {}\n",
                b.address,
                bytes(b.size),
                b.state,
                s.address,
                s.device
            ));
            push_stack(&mut out, file, b.stack.or(s.stack));
        }
        None => out.push_str(&format!("no block at 0x{addr:x} in the file's state\n")),
    }
    let at = block.map_or(addr, |(_, b)| b.address);
    for (i, t) in inputs::timeline(file).iter().enumerate() {
        if t.entry.addr == at && t.entry.action != Action::Oom {
            out.push_str(&format!(
                "event {i}: {} of {} on device {}\n",
                t.entry.action.name(),
                bytes(t.entry.size),
                t.device
            ));
            push_stack(&mut out, file, t.entry.stack);
        }
    }
    out
}

fn push_stack(out: &mut String, file: &SnapshotFile, stack: Option<u32>) {
    let lines = step::stack_lines(file, stack);
    if lines.is_empty() {
        out.push_str("    (no stack recorded)\n");
    }
    for l in lines {
        out.push_str("    ");
        out.push_str(&l);
        out.push('\n');
    }
}
