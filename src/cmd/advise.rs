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

use vramscope::sim::advise::{self, Advice, Job, OomFate, Outcome};
use vramscope::sim::spread::Range;
use vramscope::sim::{AllocConf, SimConfig};
use vramscope::text::format::{bytes, percent};

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
    let capacity = match (args.capacity_gib, rec.capacity) {
        (Some(g), _) => g.bytes(),
        (None, Some((b, _))) => b,
        (None, None) => DEFAULT_CAPACITY,
    };
    let job = Job {
        requests: rec.requests,
        conf: conf.clone(),
        cfg: SimConfig {
            device: args.process.device,
            capacity,
            alloc,
            memory_fraction: args.fraction.map(Fraction::get),
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

/// The environment line a user copies.
pub fn env_line(conf: &str) -> String {
    format!("PYTORCH_CUDA_ALLOC_CONF={conf}")
}

fn shown(conf: &str) -> &str {
    if conf.is_empty() {
        "(defaults)"
    } else {
        conf
    }
}

/// What the job's own replay says of the recording.
fn own_line(a: &Advice, conf: &str) -> String {
    let o = &a.own;
    let samples = if o.compared == 0 {
        "the recording has no statistics samples to compare with".to_string()
    } else {
        format!(
            "{} of {} recorded statistics samples match",
            o.matching, o.compared
        )
    };
    let mut s = format!(
        "the job's own setting {} replayed: {samples}; OOMs {} (the job: {})\n",
        shown(conf),
        o.replay_ooms,
        o.job_ooms
    );
    if !o.reproduces() {
        s.push_str(&format!(
            "warning: the replay does not reproduce the job{}: pass the setting it ran with (--conf, --fraction, --capacity-gib); the figures below are relative to the replay\n",
            o.first_difference
                .as_deref()
                .map(|d| format!(" (first difference: {d})"))
                .unwrap_or_default()
        ));
    }
    s
}

fn range_bytes(r: Range) -> String {
    if r.is_spread() {
        format!("{} to {}", bytes(r.lo), bytes(r.hi))
    } else {
        bytes(r.lo)
    }
}

fn range_count(r: Range) -> String {
    if r.is_spread() {
        format!("{} to {}", r.lo, r.hi)
    } else {
        r.lo.to_string()
    }
}

fn signed_bytes(d: i64) -> String {
    match d.cmp(&0) {
        std::cmp::Ordering::Less => format!("-{}", bytes(d.unsigned_abs())),
        std::cmp::Ordering::Equal => "same".into(),
        std::cmp::Ordering::Greater => format!("+{}", bytes(d as u64)),
    }
}

/// The job's OOMs under a candidate: "avoided 1 of 1", "fail", …
fn fates(o: &Outcome) -> String {
    if o.job_ooms.is_empty() {
        return "—".into();
    }
    let n = o.job_ooms.len();
    let count = |f: OomFate| o.job_ooms.iter().filter(|(_, x)| *x == f).count();
    let (avoided, depends) = (count(OomFate::Avoided), count(OomFate::Depends));
    let mut s = format!("avoids {avoided} of {n}");
    if depends > 0 {
        s.push_str(&format!(" ({depends} by placement)"));
    }
    s
}

fn table(a: &Advice) -> String {
    let w = a
        .outcomes
        .iter()
        .map(|o| shown(&o.candidate.conf).len() + if o.candidate.own { 6 } else { 0 })
        .max()
        .unwrap_or(0)
        .max("PYTORCH_CUDA_ALLOC_CONF".len());
    let mut s = format!(
        "{:>3}  {:<w$} {:>22} {:>11} {:>22} {:>22} {:>7} {:>6}  {}\n",
        "#",
        "PYTORCH_CUDA_ALLOC_CONF",
        "peak reserved",
        "vs own",
        "reserved at end",
        "split at end",
        "retries",
        "OOMs",
        "job's OOMs"
    );
    for (i, o) in a.outcomes.iter().enumerate() {
        let c = &o.candidate;
        let mut name = shown(&c.conf).to_string();
        if c.own {
            name.push_str(" (own)");
        }
        s.push_str(&format!(
            "{:>3}  {:<w$} {:>22} {:>11} {:>22} {:>22} {:>7} {:>6}  {}\n",
            if c.unusable.is_some() {
                "-".to_string()
            } else {
                (i + 1).to_string()
            },
            name,
            range_bytes(o.totals.reserved_peak),
            signed_bytes(o.peak_change),
            range_bytes(o.totals.reserved_now),
            range_bytes(o.totals.inactive_split_now),
            range_count(o.totals.alloc_retries),
            range_count(o.totals.ooms),
            fates(o),
        ));
        if let Some(why) = &c.unusable {
            s.push_str(&format!("     not usable: {why}\n"));
        }
    }
    s
}

/// The last lines: what to do.
fn verdict(a: &Advice) -> String {
    let ties = a.outcomes.iter().any(|o| o.tied_steps > 0);
    let mut s = String::new();
    match a.recommendation() {
        Some(best) => {
            let own = a.outcomes.iter().find(|o| o.candidate.own);
            let own_peak = own.map_or(0, |o| o.totals.reserved_peak.hi);
            let saving = own_peak.saturating_sub(best.totals.reserved_peak.hi);
            s.push_str(&format!(
                "recommended: {}\n",
                env_line(&best.candidate.conf)
            ));
            s.push_str(&format!(
                "  peak reserved {} instead of {} ({}{}){}\n",
                range_bytes(best.totals.reserved_peak),
                bytes(own_peak),
                if saving > 0 { "saves " } else { "" },
                if saving > 0 {
                    format!(
                        "{}, {}",
                        bytes(saving),
                        percent(saving as f64 / own_peak.max(1) as f64)
                    )
                } else {
                    "no more memory, fewer out-of-memory errors".into()
                },
                if best.job_ooms.is_empty() {
                    String::new()
                } else {
                    format!("; the job's OOMs: {}", fates(best))
                }
            ));
        }
        None => s.push_str(
            "recommended: keep the job's own setting (no usable candidate does better)\n",
        ),
    }
    if ties {
        s.push_str(&format!(
            "segments go where the driver puts most of them; \"A to B\" is the range over {} placements where a tie between equal free blocks decides\n",
            vramscope::sim::spread::BESIDE + 1
        ));
    }
    s
}
