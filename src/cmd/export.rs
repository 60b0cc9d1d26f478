//! `vramscope export FILE.vsr -o OUT.pickle`: a recording (from `record`)
//! written as a PyTorch memory snapshot, the file
//! `torch.cuda.memory._dump_snapshot()` writes: the process's segments and
//! blocks at the end of the recording, and its allocator events as the
//! trace, each block and event with the frames of the context it was
//! tagged with (its module, phase and step, and the stack captured there:
//! `snapfile::write::Attributor`); a live block's last frame names its
//! role (`role:parameter`, `role:activation`, ...); its step boundaries
//! are annotations. PyTorch's viewer and `torch.cuda.memory._memory_viz`
//! read it, so a job vramscope watched never needs
//! `_record_memory_history`; `open` and `diff` read it back as `replay`
//! shows the recording (`snapfile::ours`).
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use vramscope_collect::given::Given;
use vramscope_core::input::Input;
use vramscope_core::model::device::AnchoredFrom;
use vramscope_core::model::{Model, Process, ProcessKey};
use vramscope_core::recording::census::Census;
use vramscope_core::snapfile::write;
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{Class, Event};

use super::value::Count;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The recording (written by `vramscope record`).
    file: PathBuf,
    /// Where to write the snapshot pickle.
    #[arg(short, long, value_name = "OUT.pickle")]
    output: PathBuf,
    /// The process to export, by its host pid or the pid it sees itself as
    /// in its container (default: the one with the most allocator events).
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Keep at most this many of the newest events in the trace (PyTorch's
    /// `max_entries`).
    #[arg(long, default_value = "1000000", value_name = "N")]
    max_entries: Count,
}

/// An allocator event, with the process's step when it was read.
type Stepped = (Event, Option<u64>);

/// A marker, and the index of the trace event it came before.
type Placed = (usize, Event);

/// An allocator event, where it was in its ring (when the recording says),
/// and the process's step when it was read.
type Kept = (Event, Option<RingPos>, Option<u64>);

pub(crate) fn run(args: Args) -> Result<()> {
    let mut reader = Given::open(&args.file)?.replayer()?;
    let max = args.max_entries.get() as usize;
    let mut model = Model::default();
    // Per process: events seen, and the newest `max` with the process's
    // step when each was read (what its step tag resolves against).
    let mut events: HashMap<ProcessKey, (u64, VecDeque<Kept>)> = HashMap::new();
    // Per process: its markers (step boundaries, memory limits), each with
    // the number of its allocator events before it.
    let mut marks: HashMap<ProcessKey, Vec<(u64, Event)>> = HashMap::new();
    let mut census = Census::default();
    while let Some((_, input)) = reader.next_input()? {
        census.add(&input);
        match input {
            Input::Attach {
                key, source, watch, ..
            } => {
                model.set_mode(key, source.mode);
                // A process already running when the recording began: its
                // state starts at an anchor snapshot, as in `replay`.
                model.watch(key, &watch);
            }
            Input::Events(b) => {
                let key = b.key;
                model.apply_all_at(key, b.events.iter(), &b.at);
                if b.lost_now > 0 {
                    model.note_loss(key, b.lost_now);
                }
                let step = model.process(key).and_then(|p| p.step());
                let (n, kept) = events.entry(key).or_default();
                let marked = marks.entry(key).or_default();
                for (e, pos) in b.positioned() {
                    if e.kind.starts_run() {
                        // A new run of the job (a demo starting its
                        // scenario over) starts from an empty allocator:
                        // the state exported is the last run's, and so
                        // is the trace.
                        kept.clear();
                        marked.clear();
                        continue;
                    }
                    if e.kind.class() == Class::Marker {
                        marked.push((*n, e));
                        continue;
                    }
                    if !e.kind.class().is_allocator() {
                        continue;
                    }
                    *n += 1;
                    if kept.len() >= max {
                        kept.pop_front();
                    }
                    kept.push_back((e, pos, step));
                }
            }
            Input::Forget { key } => {
                // Keep what was seen: the export is of the whole recording.
                let _ = key;
            }
            _ => {}
        }
    }
    let chosen = census
        .choose(args.pid)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    let key = chosen.key;
    let Some(process) = model.process(key) else {
        bail!("{}: {chosen} has no state", args.file.display());
    };
    let (seen, kept) = events.remove(&key).unwrap_or_default();
    let first = seen - kept.len() as u64;
    let kept: Vec<Kept> = kept.into();
    // The markers among the events kept: each with the index of the event
    // it came before (of those before the first kept, the last one, at 0:
    // the step the trace starts in). An event `from_anchor` drops moves
    // the markers after it down.
    let marked = marks.remove(&key).unwrap_or_default();
    let before = marked.iter().rposition(|(at, _)| *at < first);
    let marked: Vec<(u64, Event)> = (marked.into_iter().enumerate())
        .filter(|(i, (at, _))| *at >= first || Some(*i) == before)
        .map(|(_, (at, e))| (at.saturating_sub(first), e))
        .collect();
    let (trace, marked) = from_anchor(process, kept, marked)
        .map_err(|why| anyhow::anyhow!("{}: {chosen}: {why}", args.file.display()))?;
    let snap = write::from_model(process, &trace, &marked, 0);
    let out = std::fs::File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    write::write(&snap, out).with_context(|| format!("writing {}", args.output.display()))?;
    let t = &snap.totals();
    vramscope_text::stderr_line(format_args!(
        "wrote {}: {chosen}, {} segments, {} blocks, {} trace events, {} frames",
        args.output.display(),
        t.iter().map(|t| t.segments).sum::<u64>(),
        t.iter().map(|t| t.blocks).sum::<u64>(),
        trace.len(),
        snap.frames.len()
    ));
    Ok(())
}

/// The trace of a process: every event it kept, or, for a process that was
/// already running when the recording began, only the events after each
/// device's anchor snapshot (the state they are applied on). Events from
/// the rings' backlog before it would land on blocks the state already
/// holds. A device never anchored has no state to start from: an error.
/// The markers (each with the index of the kept event it came before)
/// are given back with the indices of the trace.
fn from_anchor(
    process: &Process,
    kept: Vec<Kept>,
    marks: Vec<(u64, Event)>,
) -> Result<(Vec<Stepped>, Vec<Placed>), String> {
    let at = |m: Vec<(u64, Event)>| -> Vec<Placed> {
        m.into_iter().map(|(i, e)| (i as usize, e)).collect()
    };
    if !process.watching().mid_run {
        return Ok((
            kept.into_iter().map(|(e, _, s)| (e, s)).collect(),
            at(marks),
        ));
    }
    let mut anchors: HashMap<u16, AnchoredFrom> = HashMap::new();
    for d in process.devices() {
        match d.anchored_from() {
            Some(a) => {
                anchors.insert(d.device(), a);
            }
            None => {
                return Err(format!(
                    "it was already running when the recording began, and no snapshot of GPU {}'s state followed (the agent answers one when asked: record with a live collector, not a copied ring)",
                    d.device()
                ))
            }
        }
    }
    let keep: Vec<bool> = (kept.iter())
        .map(|(e, at, _)| {
            e.kind
                .place()
                .and_then(|p| anchors.get(&p.device))
                .is_some_and(|a| a.keeps(*at, e.time_ns))
        })
        .collect();
    // Each marker's index among the events kept.
    let mut kept_before = Vec::with_capacity(keep.len() + 1);
    kept_before.push(0usize);
    for k in &keep {
        kept_before.push(kept_before.last().copied().unwrap_or(0) + usize::from(*k));
    }
    let marks = (marks.into_iter())
        .map(|(i, e)| (kept_before[(i as usize).min(keep.len())], e))
        .collect();
    let trace = (kept.into_iter().zip(keep))
        .filter(|(_, k)| *k)
        .map(|((e, _, s), _)| (e, s))
        .collect();
    Ok((trace, marks))
}
