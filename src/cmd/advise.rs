//! `vramscope advise RECORDING`: the job's allocation requests replayed
//! under every allocator setting it could use, best first, with the
//! `PYTORCH_CUDA_ALLOC_CONF=` line of the recommendation
//! (`vramscope_core::sim::advise`).
//!
//! The job's own setting is `--conf` / `--fraction`; without `--conf`,
//! a recording whose allocator mapped pages had `expandable_segments:True`,
//! else the defaults. Its replay (with the addresses the real segments
//! had) is compared with the statistics the job recorded: a replay that
//! does not reproduce them says so, and names the flags to check.
use std::path::PathBuf;

use anyhow::{Context, Result};

use vramscope_core::sim::advice_text::{env_line, own_line, table, verdict};
use vramscope_core::sim::advise::{self, Job};
use vramscope_core::sim::{AllocConf, SimConfig};
use vramscope_text::format::bytes;
use vramscope_text::format::bytes as bytes_fmt;

use vramscope_collect::recorded::Recorded;

use super::common::CollectFlags;
use super::out;
use super::sim::{recorded, say_notes, Process, DEFAULT_CAPACITY};
use super::value::{Fraction, Gib, Seconds};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A recording made by `vramscope record` (from before the job
    /// started), or the pid of a running instrumented job: its requests
    /// are followed from now by the live advisor.
    #[arg(value_name = "RECORDING|PID")]
    target: PathBuf,
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
    /// With a PID: the steps to follow before answering (the job's step
    /// marks; it also answers when the job exits or on Ctrl-C).
    #[arg(long, default_value_t = 20, value_name = "N")]
    steps: u64,
    /// With a PID: the longest to follow it.
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value = "300",
        value_name = "S"
    )]
    seconds: Seconds,
    #[command(flatten)]
    collect: CollectFlags,
}

pub(crate) fn run(args: Args) -> Result<()> {
    if let Some(pid) = as_pid(&args.target) {
        return live::run(pid, &args);
    }
    let given = vramscope_collect::given::Given::open(&args.target)?;
    let rec = recorded(&given, &args.process)?;
    say_notes(&rec);
    let (conf, cfg) = setting(
        args.conf.as_deref(),
        args.fraction,
        args.capacity_gib,
        args.process.device,
        &rec,
    )?;
    let (process, got) = (rec.process, rec.got);
    let job = Job {
        requests: got.requests,
        conf: conf.clone(),
        cfg,
        torch: process.framework.as_deref().and_then(advise::torch_version),
        graph_pools: got.graph_pools,
        ooms: got.ooms,
        placed: got.placed,
        recorded: got.recorded,
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let advice = advise::advise(&job, threads);
    if args.json {
        let mut v = serde_json::to_value(&advice)?;
        v["pid"] = process.host_pid.into();
        v["ns_pid"] = process.ns_pid().into();
        v["cmdline"] = process.cmdline.clone().into();
        v["framework"] = process.framework.clone().into();
        v["conf"] = conf.clone().into();
        v["recommended_env"] = advice
            .recommendation()
            .map(|o| env_line(&o.candidate.conf))
            .into();
        return out::print(&format!("{v}\n"));
    }
    let mut text = String::new();
    let what = if process.cmdline.is_empty() {
        String::new()
    } else {
        format!(" ({})", vramscope_text::printable(&process.cmdline))
    };
    text.push_str(&format!(
        "{process}{what}{}: {} requests on device {}, {} of device memory{}\n",
        process
            .framework
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

/// The job's own setting and limit, as `advise` and `fit` replay it: the
/// flags, else what the recording shows (pages mapped: expandable
/// segments; the limit its agent stated; its GPU's total memory), else
/// PyTorch's defaults on an 80 GiB device. Says on stderr what it took
/// from the recording.
pub(super) fn setting(
    conf: Option<&str>,
    fraction: Option<Fraction>,
    capacity_gib: Option<Gib>,
    device: u16,
    rec: &Recorded,
) -> Result<(String, SimConfig)> {
    let conf = match (conf, rec.got.expandable) {
        (Some(c), _) => c.to_string(),
        (None, true) => {
            vramscope_text::stderr_line(format_args!(
                "note: the job's allocator mapped pages: its own setting is taken as expandable_segments:True (--conf sets it)"
            ));
            "expandable_segments:True".into()
        }
        (None, false) => String::new(),
    };
    let alloc = AllocConf::parse(&conf).with_context(|| format!("--conf {conf:?}"))?;
    let mut capacity = match (capacity_gib, rec.capacity) {
        (Some(g), _) => g.bytes(),
        (None, Some((b, _))) => b,
        (None, None) => DEFAULT_CAPACITY,
    };
    // The limit the job's agent stated (device memory × its memory
    // fraction) is the one its allocator had; flags still win.
    let mut fraction = fraction.map(Fraction::get);
    match rec.limit {
        Some((bytes, true)) if capacity_gib.is_none() => capacity = bytes,
        Some((bytes, false)) if fraction.is_none() && capacity > 0 => {
            let f = (bytes as f64 / capacity as f64).min(1.0);
            vramscope_text::stderr_line(format_args!(
                "note: the job stated a memory limit of {}: taken as a memory fraction of {f:.6} of {} (--fraction sets it)",
                bytes_fmt(bytes),
                bytes_fmt(capacity)
            ));
            fraction = Some(f);
        }
        _ => {}
    }
    Ok((
        conf,
        SimConfig {
            device,
            capacity,
            alloc,
            memory_fraction: fraction,
        },
    ))
}

/// A pid given in place of a recording: digits only, and no file of that
/// name here.
fn as_pid(target: &std::path::Path) -> Option<u32> {
    let s = target.to_str()?;
    if target.exists() || s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `vramscope advise PID`: the live advisor on a running job.
mod live {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use anyhow::{bail, Result};

    use vramscope_collect::{Live, ADVISOR_CPU_SHARE};
    use vramscope_core::model::ViewOptions;
    use vramscope_core::sim::advice_text::{coverage_line, own_line, table, verdict};
    use vramscope_core::sim::live::LiveAdvice;
    use vramscope_text::printable;

    use super::super::out;
    use super::Args;

    /// How long the job's segment and state may take to appear.
    const FIND: Duration = Duration::from_secs(10);

    pub(super) fn run(pid: u32, args: &Args) -> Result<()> {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            bail!("{pid}: no such process, and no such recording");
        }
        let live = Live::start(args.collect.config())?;
        let hub = live.hub().clone();
        let stop = Arc::new(AtomicBool::new(false));
        live.on_signal({
            let stop = stop.clone();
            move || stop.store(true, Ordering::Relaxed)
        });
        hub.enable_advisor(false, true, Some(ADVISOR_CPU_SHARE));
        // The job's segment is found, then its state read (a snapshot
        // asked of it): the advisor starts from the tensors it holds.
        let began = Instant::now();
        let key = loop {
            let why = match hub.find_pid(pid) {
                None => format!(
                    "process {pid} has no vramscope segment in {} (is it running with the agent? `vramscope doctor` checks)",
                    args.collect.config().shm_dir.display()
                ),
                Some(key) => match hub.advise(key) {
                    Ok(()) => break key,
                    Err(e) => format!("process {pid}: {e}"),
                },
            };
            if began.elapsed() > FIND || stop.load(Ordering::Relaxed) {
                bail!(why);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let limit = args.seconds.duration();
        let opts = ViewOptions {
            block_map: false,
            recent_events: 0,
            timeline: None,
        };
        let began = Instant::now();
        let (entry, why) = loop {
            std::thread::sleep(Duration::from_millis(200));
            let snap = hub.snapshot_for(&opts, Some(key));
            let Some(p) = snap.processes.into_iter().find(|p| p.key() == key) else {
                bail!("process {pid} went away before the advisor saw anything");
            };
            let steps = p.advice.as_ref().map_or(0, |a| a.coverage.steps);
            let why = if steps >= args.steps {
                Some(format!("for {steps} steps"))
            } else if !p.identity.alive {
                Some("until the job exited".into())
            } else if p
                .advice
                .as_ref()
                .is_some_and(|a| a.coverage.stopped.is_some())
            {
                Some("until the advisor stopped following".into())
            } else if began.elapsed() >= limit {
                Some(format!("for --seconds {}", args.seconds.secs()))
            } else if stop.load(Ordering::Relaxed) {
                Some("until interrupted".into())
            } else {
                None
            };
            if let Some(why) = why {
                break (p, why);
            }
        };
        hub.advisor_flush(Duration::from_secs(5));
        let snap = hub.snapshot_for(&opts, Some(key));
        let p = snap
            .processes
            .into_iter()
            .find(|p| p.key() == key)
            .unwrap_or(entry);
        let Some(a) = p.advice else {
            bail!("process {pid}: the advisor has no advice (followed {why})");
        };
        if args.json {
            let mut v = serde_json::to_value(&a)?;
            v["pid"] = pid.into();
            v["cmdline"] = p.identity.cmdline.clone().into();
            v["framework"] = p.source.framework.clone().into();
            v["recommended_env"] = a
                .best()
                .map(|(o, _)| super::env_line(&o.candidate.conf))
                .into();
            return out::print(&format!("{v}\n"));
        }
        out::print(&text(pid, &p.identity.cmdline, &why, &a))
    }

    fn text(pid: u32, cmdline: &str, why: &str, a: &LiveAdvice) -> String {
        let mut s = format!("process {pid} ({}): followed {why}\n", printable(cmdline));
        s.push_str(&format!(
            "over {}\n",
            printable(&coverage_line(&a.coverage))
        ));
        let Some(advice) = &a.advice else {
            s.push_str("no advice: too few requests to choose the candidates from\n");
            return s;
        };
        if a.coverage.from_start {
            s.push_str(&own_line(advice, &a.conf));
        } else {
            s.push_str(&format!(
                "the job's own setting {} (from its environment): every setting, its own included, replayed from the tensors it held when the advisor began\n",
                vramscope_core::sim::advice_text::shown(&a.conf)
            ));
        }
        s.push('\n');
        s.push_str(&table(advice));
        s.push('\n');
        s.push_str(&verdict(advice));
        s.push_str(
            "the live advisor runs one placement per setting (the driver's order); `vramscope record` and `advise RECORDING` give ranges over seven\n",
        );
        s
    }
}
