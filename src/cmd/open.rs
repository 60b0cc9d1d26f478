//! `vramscope open FILE`: a PyTorch memory snapshot file
//! (`torch.cuda.memory._dump_snapshot`, an OOM observer's dump) in the
//! dashboard, at the file's state, with its trace as the timeline; or, with
//! `--json`, its figures and state (and with `--trace` every trace event
//! with its stack); with `--at N`, the state after the trace's first N
//! events, rebuilt by the model; with `--frames ADDR`, the stacks that
//! allocated and freed the block at ADDR.
use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use vramscope_collect::given::Given;
use vramscope_collect::trace::{Stepper, TraceStatus};
use vramscope_collect::Hub;
use vramscope_core::model::ViewOptions;
use vramscope_core::snapfile::inputs::{self, Plan, Timed};
use vramscope_core::snapfile::lines;
use vramscope_core::snapfile::{self, Action, SnapshotFile, Totals};

use super::dashboard::UiFlags;
use super::out;
use super::value::Index;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The snapshot file (a pickle written by torch.cuda.memory._dump_snapshot).
    file: PathBuf,
    /// Print the file's figures and state as JSON instead of opening the dashboard.
    #[arg(long)]
    json: bool,
    /// With --json: every trace event, with the stacks and frames they name.
    #[arg(long, requires = "json")]
    trace: bool,
    /// The state after the trace's first N events (0: before the first; at
    /// most the trace's length).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
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

pub(crate) fn run(args: Args) -> Result<()> {
    let name = args.file.display().to_string();
    let given = Given::open(&args.file)?;
    if given.is_recording() {
        bail!("{name} is a vramscope recording, not a PyTorch snapshot file: see it with `vramscope replay {name}`");
    }
    let file = given.snapshot()?;
    let events: usize = file.traces.iter().map(Vec::len).sum();
    if let Some(n) = args.at.filter(|n| n.get() > events as u64) {
        bail!(
            "--at {n}: {name} has {events} trace events; give 0 (before the first) to {events} (after the last)"
        );
    }
    let plan = Plan {
        upto: args.at.map(|n| n.get() as usize),
    };
    if let Some(addr) = args.frames {
        // Nothing at the address: one line, exit 1, as for any failure.
        if !has_frames(&file, addr) {
            bail!("--frames 0x{addr:x}: no block and no trace event at that address in {name}");
        }
        let mut o = out::stream();
        write_frames(&mut o, &file, addr)
            .and_then(|()| o.flush())
            .map_err(out::wrap)?;
        return Ok(());
    }
    if args.json {
        let hub = Hub::default();
        let mut last = 0;
        let start = inputs::starting_state(&file);
        inputs::feed(&file, &name, plan, &start, &mut |t, input| {
            last = t;
            hub.apply(input);
        });
        drop(start);
        let view = ViewOptions {
            block_map: true,
            recent_events: 0,
            timeline: None,
        };
        let timeline = inputs::timeline(&file);
        let state = hub.snapshot_at(last, &view);
        let report = Report::new(&file, &name, plan, &timeline, state, args.trace);
        // Written as it is made: a trace of millions of events is never
        // one string in memory.
        let mut o = out::stream();
        return serde_json::to_writer_pretty(&mut o, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| o.write_all(b"\n"))
            .and_then(|()| o.flush())
            .map_err(out::wrap);
    }
    // The dashboard, at event N (--at) or the file's state; the trace is
    // stepped through with keys, each step rebuilding the state.
    let hub = Arc::new(Hub::default());
    let mut stepper = Stepper::new(file, &name);
    let at = plan.upto.unwrap_or(usize::MAX);
    stepper.seek(&hub, at, vramscope_wire::ring::monotonic_ns());
    let mut opts = args.view.options()?;
    opts.readonly = true;
    opts.initial_process.get_or_insert(inputs::KEY.pid);
    let driver = Arc::new(FileDriver {
        rt: vramscope_collect::runtime().context("starting the signal handler")?,
        hub: hub.clone(),
        stepper: Mutex::new(stepper),
    });
    vramscope_ui::run(hub, driver, None, opts)
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

impl vramscope_ui::Driver for FileDriver {
    fn refusal(&self) -> Option<&str> {
        Some("a snapshot file cannot be sent commands")
    }
    fn on_signal(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _guard = self.rt.enter();
        vramscope_collect::signals::forward(f);
    }
    fn trace(&self) -> Option<TraceStatus> {
        Some(self.stepper().status())
    }
    fn seek(&self, at: usize) -> Option<TraceStatus> {
        let now = vramscope_wire::ring::monotonic_ns();
        Some(self.stepper().seek(&self.hub, at, now))
    }
}

/// What `open --json` prints. The parts that grow with the trace (the
/// events, the OOMs, their stacks) are written as they are serialized,
/// never held whole.
#[derive(Serialize)]
struct Report<'a> {
    file: &'a str,
    format: &'a str,
    /// The figures PyTorch reports for the file's state, per device.
    devices: Vec<Totals>,
    allocator_settings: Settings<'a>,
    trace: TraceSummary<'a>,
    /// The model's state: the file's own, or after `--at N` events.
    state: vramscope_collect::Snapshot,
    /// `external_annotations` (`record_function` regions: `name`,
    /// `stage`, `device`, `time_us`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    annotations: &'a [snapfile::Annotation],
    /// Pinned host memory (`host_segments`, `host_traces`).
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<&'a snapfile::HostMemory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<Events<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stacks: Option<&'a snapfile::Stacks>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frames: Option<&'a [snapfile::Frame]>,
}

#[derive(Serialize)]
struct TraceSummary<'a> {
    /// Trace entries per device.
    entries: Vec<usize>,
    /// Events the state was rebuilt to (`--at`), if not the whole trace.
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<usize>,
    unknown_actions: u64,
    annotations: usize,
    /// The OOMs the trace records, the last one last.
    ooms: Ooms<'a>,
    /// The stacks the OOMs name, by id, each once: `file:line name` lines,
    /// innermost first (at most 128, each at most 512 bytes).
    oom_stacks: OomStacks<'a>,
    /// The trace ends in an OOM, `snapshot` entries after it aside (the
    /// file is an OOM observer's dump).
    ends_in_oom: bool,
}

/// `allocator_settings`, as a JSON object of strings, in the file's order.
struct Settings<'a>(&'a [(String, String)]);

impl Serialize for Settings<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

#[derive(Serialize)]
struct OomOut {
    device: u16,
    index: usize,
    requested: u64,
    device_free: u64,
    time_us: Option<i64>,
    /// Its stack in `oom_stacks`.
    stack: Option<u32>,
}

/// The OOMs of a timeline.
struct Ooms<'a>(&'a [Timed<'a>]);

impl Serialize for Ooms<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let ooms = self.0.iter().enumerate();
        ser.collect_seq(
            ooms.filter(|(_, t)| t.entry.action == Action::Oom)
                .map(|(i, t)| OomOut {
                    device: t.device,
                    index: i,
                    requested: t.entry.size,
                    device_free: t.entry.addr,
                    time_us: t.entry.time_us,
                    stack: t.entry.stack,
                }),
        )
    }
}

/// The lines of each stack an OOM names, by id.
struct OomStacks<'a> {
    file: &'a SnapshotFile,
    ids: BTreeSet<u32>,
}

impl Serialize for OomStacks<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_map(self.ids.iter().map(|&id| {
            let lines = StackLines {
                file: self.file,
                stack: Some(id),
            };
            (id.to_string(), lines)
        }))
    }
}

/// A stack's lines, made as they are written.
struct StackLines<'a> {
    file: &'a SnapshotFile,
    stack: Option<u32>,
}

impl Serialize for StackLines<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(lines::stack_line_iter(self.file, self.stack))
    }
}

#[derive(Serialize)]
struct EventOut<'a> {
    device: u16,
    time_ns: u64,
    #[serde(flatten)]
    entry: &'a snapfile::TraceEntry,
}

/// Every event of a timeline (`--trace`).
struct Events<'a>(&'a [Timed<'a>]);

impl Serialize for Events<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq(self.0.iter().map(|t| EventOut {
            device: t.device,
            time_ns: t.time_ns,
            entry: t.entry,
        }))
    }
}

impl<'a> Report<'a> {
    fn new(
        file: &'a SnapshotFile,
        name: &'a str,
        plan: Plan,
        timeline: &'a [Timed<'a>],
        state: vramscope_collect::Snapshot,
        trace: bool,
    ) -> Self {
        let oom_stacks = OomStacks {
            file,
            ids: (timeline.iter())
                .filter(|t| t.entry.action == Action::Oom)
                .filter_map(|t| t.entry.stack)
                .collect(),
        };
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
            allocator_settings: Settings(&file.allocator_settings),
            trace: TraceSummary {
                entries: file.traces.iter().map(Vec::len).collect(),
                at: plan.upto,
                unknown_actions: file.unknown_actions,
                annotations: file.annotations.len(),
                ooms: Ooms(timeline),
                oom_stacks,
                ends_in_oom,
            },
            state,
            annotations: &file.annotations,
            host: file.host.as_ref(),
            events: trace.then_some(Events(timeline)),
            stacks: trace.then_some(&file.stacks),
            frames: trace.then_some(&file.frames[..]),
        }
    }
}

/// The block holding `addr` in the file's state, if any.
fn block_at(file: &SnapshotFile, addr: u64) -> Option<(&snapfile::Segment, &snapfile::Block)> {
    file.segments.iter().find_map(|s| {
        s.blocks
            .iter()
            .find(|b| b.address <= addr && addr < b.address.saturating_add(b.size))
            .map(|b| (s, b))
    })
}

/// Whether `--frames ADDR` has anything to show: a block there, or a
/// trace event at the address.
fn has_frames(file: &SnapshotFile, addr: u64) -> bool {
    let at = block_at(file, addr).map_or(addr, |(_, b)| b.address);
    block_at(file, addr).is_some()
        || (inputs::timeline(file).iter())
            .any(|t| t.entry.addr == at && t.entry.action != Action::Oom)
}

/// `--frames ADDR`: the block's stack in the state, then every trace event
/// at that address with its stack; a stack shown already is named, not
/// shown again.
fn write_frames(out: &mut impl Write, file: &SnapshotFile, addr: u64) -> std::io::Result<()> {
    use vramscope_text::format::bytes;
    // Where each stack shown was first shown.
    let mut shown: HashMap<u32, String> = HashMap::new();
    let block = block_at(file, addr);
    match block {
        Some((s, b)) => {
            let pool = match s.pool {
                p if p == Default::default() => String::new(),
                p => format!(" (private pool ({}, {}))", p.0, p.1),
            };
            writeln!(
                out,
                "block 0x{:x} ({}, {:?}) in segment 0x{:x} of device {}{pool}",
                b.address,
                bytes(b.size),
                b.state,
                s.address,
                s.device
            )?;
            write_stack(out, file, b.stack.or(s.stack), "the block", &mut shown)?;
        }
        None => writeln!(out, "no block at 0x{addr:x} in the file's state")?,
    }
    let at = block.map_or(addr, |(_, b)| b.address);
    for (i, t) in inputs::timeline(file).iter().enumerate() {
        if t.entry.addr == at && t.entry.action != Action::Oom {
            writeln!(
                out,
                "event {i}: {} of {} on device {}",
                t.entry.action.name(),
                bytes(t.entry.size),
                t.device
            )?;
            for line in t.entry.meta_lines() {
                writeln!(out, "    {line}")?;
            }
            write_stack(out, file, t.entry.stack, &format!("event {i}"), &mut shown)?;
        }
    }
    Ok(())
}

/// A stack's lines, indented; or, when `shown` has it, where it was.
fn write_stack(
    out: &mut impl Write,
    file: &SnapshotFile,
    stack: Option<u32>,
    here: &str,
    shown: &mut HashMap<u32, String>,
) -> std::io::Result<()> {
    let Some(id) = stack.filter(|&s| file.stacks.get(s).is_some_and(|f| !f.is_empty())) else {
        return writeln!(out, "    (no stack recorded)");
    };
    if let Some(first) = shown.get(&id) {
        return writeln!(out, "    (the same stack as {first})");
    }
    for line in lines::stack_line_iter(file, Some(id)) {
        writeln!(out, "    {line}")?;
    }
    shown.insert(id, here.to_string());
    Ok(())
}
