//! `vramscope advise RECORDING`: the job's allocation requests replayed
//! under every allocator setting it could use, best first, with the
//! `PYTORCH_CUDA_ALLOC_CONF=` line of the recommendation
//! (`vramscope::sim::advise`).
//!
//! The job's own setting is `--conf` / `--fraction`; without `--conf`,
//! a recording whose allocator mapped pages had `expandable_segments:True`,
//! else the defaults. Its replay (with the addresses the real segments
//! had) is compared with the statistics the job recorded: a replay that
//! does not reproduce them says so, and names the flags to check.
use std::path::PathBuf;

use anyhow::{Context, Result};

use vramscope::sim::advice_text::{env_line, own_line, table, verdict};
use vramscope::sim::advise::{self, Job};
use vramscope::sim::{AllocConf, SimConfig};
use vramscope::text::format::bytes;
use vramscope::text::format::bytes as bytes_fmt;

use super::out;
use super::sim::{from_recording, Process, DEFAULT_CAPACITY};
use super::value::{Fraction, Gib};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// A recording made by `vramscope record` (from before the job
    /// started).
    recording: PathBuf,
    #[command(flatten)]
    process: Process,
    /// The job's own PYTORCH_CUDA_ALLOC_CONF (default: what the recording
    /// shows, else PyTorch's defaults).
    #[arg(long, value_name = "CONF")]
    conf: Option<String>,
    /// The job's memory fraction (torch.cuda.set_per_process_memory_fraction).
    #[arg(long, allow_negative_numbers = true, value_name = "F")]
    fraction: Option<Fraction>,
    /// Device memory in GiB (default: the total NVML reported for the
    /// process's GPU in the recording, else 80).
    #[arg(long, allow_negative_numbers = true, value_name = "GIB")]
    capacity_gib: Option<Gib>,
    /// The advice as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let rec = from_recording(&args.recording, args.process.pid, args.process.device)?;
    let conf = match (&args.conf, rec.expandable) {
        (Some(c), _) => c.clone(),
        (None, true) => {
            vramscope::text::stderr_line(format_args!(
                "note: the job's allocator mapped pages: its own setting is taken as expandable_segments:True (--conf sets it)"
            ));
            "expandable_segments:True".into()
        }
        (None, false) => String::new(),
    };
    let alloc = AllocConf::parse(&conf).with_context(|| format!("--conf {conf:?}"))?;
    let mut capacity = match (args.capacity_gib, rec.capacity) {
        (Some(g), _) => g.bytes(),
        (None, Some((b, _))) => b,
        (None, None) => DEFAULT_CAPACITY,
    };
    // The limit the job's agent stated (device memory × its memory
    // fraction) is the one its allocator had; flags still win.
    let mut fraction = args.fraction.map(Fraction::get);
    match rec.limit {
        Some((bytes, true)) if args.capacity_gib.is_none() => capacity = bytes,
        Some((bytes, false)) if fraction.is_none() && capacity > 0 => {
            let f = (bytes as f64 / capacity as f64).min(1.0);
            vramscope::text::stderr_line(format_args!(
                "note: the job stated a memory limit of {}: taken as a memory fraction of {f:.6} of {} (--fraction sets it)",
                bytes_fmt(bytes),
                bytes_fmt(capacity)
            ));
            fraction = Some(f);
        }
        _ => {}
    }
    let job = Job {
        requests: rec.requests,
        conf: conf.clone(),
        cfg: SimConfig {
            device: args.process.device,
            capacity,
            alloc,
            memory_fraction: fraction,
        },
        torch: rec.framework.as_deref().and_then(advise::torch_version),
        graph_pools: rec.graph_pools,
        ooms: rec.ooms,
        placed: rec.placed,
        recorded: rec.recorded,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let advice = advise::advise(&job, threads);
    if args.json {
        let mut v = serde_json::to_value(&advice)?;
        v["pid"] = rec.pid.into();
        v["cmdline"] = rec.cmdline.clone().into();
        v["framework"] = rec.framework.clone().into();
        v["conf"] = conf.clone().into();
        v["recommended_env"] = advice
            .recommendation()
            .map(|o| env_line(&o.candidate.conf))
            .into();
        return out::print(&format!("{v}\n"));
    }
    let mut text = String::new();
    let what = if rec.cmdline.is_empty() {
        String::new()
    } else {
        format!(" ({})", vramscope::text::printable(&rec.cmdline))
    };
    text.push_str(&format!(
        "process {}{what}{}: {} requests on device {}, {} of device memory{}\n",
        rec.pid,
        rec.framework
            .as_deref()
            .map(|f| format!(", {f}"))
            .unwrap_or_default(),
        advice.requests,
        args.process.device,
        bytes(advice.capacity),
        advice
            .memory_fraction
            .map(|f| format!(", memory fraction {f}"))
            .unwrap_or_default()
    ));
    text.push_str(&own_line(&advice, &conf));
    text.push('\n');
    text.push_str(&table(&advice));
    text.push('\n');
    text.push_str(&verdict(&advice));
    out::print(&text)
}
