//! `vramscope sim --trace FILE`: allocation requests replayed under any
//! allocator configuration — a JSON-lines trace, or a recording of a real
//! process (then compared with the statistics it reported).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use vramscope::event::{Event, Stats};
use vramscope::input::Input;
use vramscope::model::ProcessKey;
use vramscope::recording::{Replayer, MAGIC};
use vramscope::sim::{self, Request, StepReport};
use vramscope::ui::format::bytes;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A JSON-lines request file (see `src/sim/trace.rs`), or a recording
    /// made by `vramscope record` of a real process.
    #[arg(long, value_name = "FILE")]
    trace: PathBuf,
    /// With a recording: the process to replay (default: the one with the
    /// most events).
    #[arg(long, value_name = "PID")]
    pid: Option<u32>,
    /// With a recording: the CUDA device to replay.
    #[arg(long, default_value_t = 0)]
    device: u16,
    /// Allocator settings, as in PYTORCH_CUDA_ALLOC_CONF.
    #[arg(long, value_name = "CONF")]
    conf: Option<String>,
    /// Device memory in GiB.
    #[arg(long, default_value_t = 80.0)]
    capacity_gib: f64,
    /// One JSON object per request.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let (reqs, recorded) = requests(&args.trace, args.pid, args.device)?;
    let alloc = match &args.conf {
        Some(c) => sim::AllocConf::parse(c).with_context(|| format!("--conf {c:?}"))?,
        None => sim::AllocConf::default(),
    };
    let cfg = sim::SimConfig {
        alloc,
        capacity: (args.capacity_gib * (1u64 << 30) as f64) as u64,
        ..sim::SimConfig::default()
    };
    let reports = sim::replay(&reqs, &cfg);
    if args.json {
        for (i, r) in reports.iter().enumerate() {
            let mut v = serde_json::to_value(r)?;
            if let Some(Some(s)) = recorded.as_ref().map(|rec| rec[i]) {
                v["recorded"] = serde_json::to_value(s)?;
            }
            println!("{v}");
        }
    } else {
        print!("{}", sim::render_table(&reports));
    }
    if let Some(rec) = &recorded {
        compare_summary(&reports, rec, args.conf.as_deref());
    }
    Ok(())
}

/// The statistics a recorded process reported after each request.
type Recorded = Vec<Option<Stats>>;

/// The requests to replay from `path`: a JSON-lines trace, or a recording
/// (then also the statistics the process reported after each request).
fn requests(
    path: &Path,
    pid: Option<u32>,
    device: u16,
) -> Result<(Vec<Request>, Option<Recorded>)> {
    let mut magic = [0u8; 8];
    let is_recording = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == MAGIC;
    if !is_recording {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let reqs = sim::parse_trace(&text).with_context(|| format!("in {}", path.display()))?;
        return Ok((reqs, None));
    }
    let mut r = Replayer::open(path)?;
    let mut by_process: BTreeMap<ProcessKey, Vec<Event>> = BTreeMap::new();
    while let Some((_, input)) = r.next_input()? {
        if let Input::Events { key, events, .. } = input {
            by_process.entry(key).or_default().extend(events);
        }
    }
    let chosen = match pid {
        Some(p) => by_process.keys().find(|k| k.pid == p).copied(),
        None => by_process
            .iter()
            .max_by_key(|(_, e)| e.len())
            .map(|(k, _)| *k),
    };
    let Some(key) = chosen else {
        bail!(
            "{}: no events of {} in this recording",
            path.display(),
            pid.map_or("any process".into(), |p| format!("process {p}"))
        );
    };
    let mut events = by_process.remove(&key).unwrap_or_default();
    events.sort_by_key(|e| e.time_ns);
    let got = sim::from_events::requests_from_events(&events, device);
    if got.unknown_frees > 0 {
        eprintln!(
            "note: {} frees of tensors allocated before the recording started were skipped",
            got.unknown_frees
        );
    }
    Ok((got.requests, Some(got.recorded)))
}

/// Compares a replay with what the recorded process reported, on stderr.
fn compare_summary(reports: &[StepReport], recorded: &[Option<Stats>], conf: Option<&str>) {
    let mut total = 0;
    let mut same = 0;
    let mut first_diff = None;
    for (r, s) in reports.iter().zip(recorded) {
        let Some(s) = s else { continue };
        total += 1;
        if (r.allocated, r.reserved, r.segments) == (s.allocated, s.reserved, s.segments) {
            same += 1;
        } else if first_diff.is_none() {
            first_diff = Some((r.step, r.reserved, s.reserved));
        }
    }
    let under = conf.map_or("the default configuration".to_string(), |c| {
        format!("--conf {c}")
    });
    eprintln!("under {under}: {same} of {total} recorded statistics samples match the replay exactly (allocated, reserved, segments)");
    if let Some((step, sim, real)) = first_diff {
        eprintln!(
            "first difference at request {step}: reserved {} simulated vs {} recorded",
            bytes(sim),
            bytes(real)
        );
    }
    let ooms = reports.iter().filter(|r| r.oom.is_some()).count();
    eprintln!("out-of-memory requests in the replay: {ooms}");
}
