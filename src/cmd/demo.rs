//! `vramscope demo [SCENARIO]`: a simulated training job whose caching
//! allocator behaves like PyTorch's, and the dashboard on it; or, with
//! `--headless`, its final state printed.
use std::fmt::Write;

use anyhow::Result;

use vramscope_collect::demo::HeadlessReport;
use vramscope_text::format::bytes;
use vramscope_ui::diagnosis;

use super::common::CollectFlags;
use super::dashboard::{ExitedFlag, UiFlags};
use super::out;
use super::value::{Runs, Seconds, Speed};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The scenario (see --list).
    #[arg(
        default_value = "healthy",
        value_parser = clap::builder::PossibleValuesParser::new(
            vramscope_collect::demo::list().iter().map(|(name, _)| *name)
        )
    )]
    scenario: String,
    /// List the scenarios, one per line, name first.
    #[arg(long)]
    list: bool,
    /// Allocator settings, as in PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True).
    #[arg(long, value_name = "CONF")]
    conf: Option<String>,
    /// Simulated seconds per second, 0.001 to 1000000 (default 1; 0.2 for `oom`).
    #[arg(long, allow_negative_numbers = true)]
    speed: Option<Speed>,
    /// No terminal: run as fast as possible and print the final state.
    #[arg(long)]
    headless: bool,
    /// With --headless: simulated seconds to run (default: the whole scenario).
    #[arg(long, allow_negative_numbers = true, value_name = "SECS")]
    duration: Option<Seconds>,
    /// With --headless: print JSON.
    #[arg(long)]
    json: bool,
    /// With --headless: run the scenario this many times in a row in one
    /// process, as the dashboard's demo loops (1 to 1000; default 1).
    #[arg(long, value_name = "N")]
    runs: Option<Runs>,
    /// With --headless --screenshot: keys pressed before the picture is
    /// taken, e.g. `M` (the By module table) or `c` (the block map by
    /// module); `\n` is Enter.
    #[arg(long, value_name = "KEYS", requires = "headless")]
    keys: Option<String>,
    /// Back every simulated segment with real GPU memory (CUDA device 0), so
    /// NVML and nvidia-smi see it too.
    #[arg(long)]
    gpu: bool,
    #[command(flatten)]
    collect: CollectFlags,
    #[command(flatten)]
    exited: ExitedFlag,
    #[command(flatten)]
    ui: UiFlags,
}

pub(crate) fn run(args: Args) -> Result<()> {
    if args.list {
        let mut o = String::new();
        for (name, about) in vramscope_collect::demo::list() {
            let _ = writeln!(o, "{name:<14} {about}");
        }
        return out::print(&o);
    }
    let sc = vramscope_collect::demo::scenario(&args.scenario, args.conf.as_deref())?;
    if args.headless {
        let duration = args.duration.map(Seconds::secs);
        // The settings file is the dashboard's: only a screenshot draws it
        // (issue 30, item 12: a broken one stopped the headless demo).
        let mut opts = if args.ui.screenshot.is_some() {
            args.ui.options()?
        } else {
            vramscope_ui::UiOptions::default()
        };
        opts.keys = args.keys.clone().unwrap_or_default().replace("\\n", "\n");
        let shot = |hub: &vramscope_collect::Hub, status, (end_ns, ran_ns)| {
            let Some(path) = &args.ui.screenshot else {
                return Ok(());
            };
            // The simulated job's own view, as the dashboard opens it,
            // with the whole run in the timeline's window.
            opts.initial_process = opts.initial_process.or(Some(std::process::id()));
            let still = vramscope_ui::Still {
                size: opts.size.unwrap_or(vramscope_ui::run::FALLBACK_SIZE),
                now_ns: end_ns,
                window_ns: Some(ran_ns),
                path,
            };
            vramscope_ui::screenshot_now(hub, Some(status), &opts, still)
        };
        let runs = args.runs.map_or(1, Runs::get);
        let report = vramscope_collect::demo::run_headless_then(
            sc,
            args.conf.as_deref(),
            (duration, runs),
            args.gpu,
            shot,
        )?;
        return if args.json {
            out::line(&serde_json::to_string_pretty(&report)?)
        } else {
            out::print(&text(&report))
        };
    }
    let backing = if args.gpu {
        let g = vramscope_collect::demo::gpu::GpuBacking::new(0)
            .map_err(|e| anyhow::anyhow!("--gpu: {e}"))?;
        Some(g)
    } else {
        None
    };
    let speed = args
        .speed
        .map(Speed::factor)
        .unwrap_or_else(|| vramscope_collect::demo::default_speed(&args.scenario));
    let cfg = args.exited.collector(&args.collect)?;
    let demo = vramscope_collect::demo::start(sc, &cfg.shm_dir, speed, backing)?;
    let mut opts = args.ui.options()?;
    // The simulated job is what a workshop watches: open its view (Esc goes
    // back to the overview).
    opts.initial_process = opts.initial_process.or(Some(std::process::id()));
    // Stopped however the dashboard ends, a panic unwinding included: the
    // demo's thread removes its segment as it stops.
    let _stop = StopOnDrop(demo.clone());
    super::dashboard::open(cfg, Some(demo.clone()), opts, false)
}

/// Stops the demo (its segment removed) when dropped.
struct StopOnDrop(std::sync::Arc<vramscope_collect::demo::DemoControl>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// `demo --headless` as text.
pub(crate) fn text(r: &HeadlessReport) -> String {
    let mut o = String::new();
    let f = &r.process.view.figures;
    let conf = r
        .conf
        .as_ref()
        .map(|c| format!(" ({c})"))
        .unwrap_or_default();
    let _ = writeln!(o, "scenario   {}{conf}", r.scenario);
    let finished = if r.finished { " (finished)" } else { "" };
    let _ = writeln!(o, "simulated  {:.1} s{finished}", r.simulated_s);
    let _ = writeln!(o, "now        {}", r.caption);
    let _ = writeln!(
        o,
        "allocated  {} (peak {})",
        bytes(f.allocated),
        bytes(f.peak_allocated)
    );
    let _ = writeln!(
        o,
        "reserved   {} (peak {})",
        bytes(f.reserved),
        bytes(f.peak_reserved)
    );
    for d in &r.process.view.devices {
        let fr = &d.figures.fragmentation;
        let share = fr
            .share_of_reserved
            .map(|s| format!("{} of reserved", vramscope_text::format::percent(s)))
            .unwrap_or_else(|| "—".into());
        let largest = fr.largest_free_large.max(fr.largest_free_small);
        // torch's own count where it differs (none under expandable segments).
        let torch = match d.figures.stats.map(|s| s.segments) {
            Some(s) if s != d.figures.segments => format!(" (torch counts {s})"),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "device {}   {} segments{torch}, inactive split {} ({share}), largest free block {}",
            d.figures.device,
            d.figures.segments,
            bytes(fr.inactive_split),
            largest.map(bytes).unwrap_or_else(|| "—".into()),
        );
    }
    // What the simulated job names outside the caching allocator.
    let v = &r.process.view;
    if let Some(line) = vramscope_core::model::outside::line(&v.outside, f.unexplained) {
        let _ = writeln!(o, "outside    {line}");
    }
    let src = &r.process.source;
    let _ = writeln!(
        o,
        "events     {} delivered, {} lost",
        src.delivered, src.lost
    );
    let _ = writeln!(o, "OOMs       {}", r.process.view.ooms_total);
    let v = &r.process.view;
    let leak = &v.leak;
    let (_, verdict) = diagnosis::verdict_text(leak, &v.leak_criterion);
    let _ = writeln!(o, "leak       {verdict}");
    let _ = writeln!(o, "           {}", diagnosis::steps_text(leak));
    if let Some(runs) = diagnosis::runs_text(leak) {
        let _ = writeln!(o, "           {runs}");
    }
    if leak.flagged {
        for text in diagnosis::origins_text(leak, " <- ") {
            let _ = writeln!(o, "           {text}");
        }
        if let Some(text) = diagnosis::roles_text(&v.attribution) {
            let _ = writeln!(o, "           {text}");
        }
        for s in leak.top_sizes.iter().take(3) {
            let _ = writeln!(
                o,
                "           {} blocks: {} live, +{:.2}/step since step {}",
                bytes(s.requested),
                s.live,
                s.live_growth_per_step,
                s.first_step
            );
        }
    }
    o
}
