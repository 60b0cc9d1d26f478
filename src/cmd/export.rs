//! `vramscope export FILE.vsr -o OUT.pickle`: a recording (from `record`)
//! written as a PyTorch memory snapshot, the file
//! `torch.cuda.memory._dump_snapshot()` writes: the process's segments and
//! blocks at the end of the recording, and its allocator events as the
//! trace, each block and event with the frames of the context it was
//! tagged with (its module, phase and step, and the stack captured there:
//! `snapfile::write::Attributor`). PyTorch's viewer and
//! `torch.cuda.memory._memory_viz` read it, so a job vramscope watched
//! never needs `_record_memory_history`.
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use vramscope::event::Event;
use vramscope::input::Input;
use vramscope::model::{Model, ProcessKey};
use vramscope::recording::Replayer;
use vramscope::snapfile::write;

use super::value::Count;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The recording (written by `vramscope record`).
    file: PathBuf,
    /// Where to write the snapshot pickle.
    #[arg(short, long, value_name = "OUT.pickle")]
    output: PathBuf,
    /// The process to export (default: the one with the most events).
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// Keep at most this many of the newest events in the trace (PyTorch's
    /// `max_entries`).
    #[arg(long, default_value = "1000000", value_name = "N")]
    max_entries: Count,
}

/// An allocator event, with the process's step when it was read.
type Stepped = (Event, Option<u64>);

pub fn run(args: Args) -> Result<()> {
    let mut reader = Replayer::open(&args.file)?;
    let max = args.max_entries.get() as usize;
    let mut model = Model::default();
    // Per process: events seen, and the newest `max` with the process's
    // step when each was read (what its step tag resolves against).
    let mut events: HashMap<ProcessKey, (u64, VecDeque<Stepped>)> = HashMap::new();
    while let Some((_, input)) = reader.next_input()? {
        match input {
            Input::Attach { key, source, .. } => {
                model.set_mode(key, source.mode);
            }
            Input::Events {
                key, events: ev, ..
            } => {
                model.apply_all(key, ev.iter());
                let step = model.process(key).and_then(|p| p.step());
                let (n, kept) = events.entry(key).or_default();
                for e in ev.into_iter().filter(is_allocator_event) {
                    *n += 1;
                    if kept.len() >= max {
                        kept.pop_front();
                    }
                    kept.push_back((e, step));
                }
            }
            Input::Forget { key } => {
                // Keep what was seen: the export is of the whole recording.
                let _ = key;
            }
            _ => {}
        }
    }
    let key = match args.pid {
        Some(pid) => model
            .processes()
            .map(|p| p.key())
            .find(|k| k.pid == pid)
            .with_context(|| {
                format!(
                    "{}: no process {pid} in the recording (it has {})",
                    args.file.display(),
                    pids(&model)
                )
            })?,
        None => match events
            .iter()
            .max_by_key(|(k, (n, _))| (*n, std::cmp::Reverse(**k)))
        {
            Some((k, _)) => *k,
            None => bail!(
                "{}: the recording holds no allocator events of any process",
                args.file.display()
            ),
        },
    };
    let Some(process) = model.process(key) else {
        bail!("{}: process {} has no state", args.file.display(), key.pid);
    };
    let trace: Vec<Stepped> = events
        .remove(&key)
        .map(|(_, v)| v.into())
        .unwrap_or_default();
    let snap = write::from_model(process, &trace, 0);
    let out = std::fs::File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    write::write(&snap, out).with_context(|| format!("writing {}", args.output.display()))?;
    let t = &snap.totals();
    eprintln!(
        "wrote {}: process {}, {} segments, {} blocks, {} trace events, {} frames",
        args.output.display(),
        key.pid,
        t.iter().map(|t| t.segments).sum::<u64>(),
        t.iter().map(|t| t.blocks).sum::<u64>(),
        trace.len(),
        snap.frames.len()
    );
    Ok(())
}

fn is_allocator_event(e: &Event) -> bool {
    use vramscope::event::EventKind as K;
    matches!(
        e.kind,
        K::Alloc { .. }
            | K::FreeRequested { .. }
            | K::FreeCompleted { .. }
            | K::SegmentAlloc { .. }
            | K::SegmentFree { .. }
            | K::SegmentMap { .. }
            | K::SegmentUnmap { .. }
            | K::Oom { .. }
    )
}

fn pids(model: &Model) -> String {
    let v: Vec<String> = model.processes().map(|p| p.key().pid.to_string()).collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
