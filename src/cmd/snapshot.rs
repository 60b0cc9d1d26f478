//! `vramscope snapshot`: one look at every GPU (NVML) and every instrumented
//! process, as a table or as JSON.
use std::fmt::Write;
use std::time::Duration;

use anyhow::Result;

use vramscope::collect::{Collector, Snapshot};
use vramscope::model::ViewOptions;
use vramscope::ui::diagnosis;
use vramscope::ui::format::bytes;

use super::value::Seconds;
use super::{NvmlFlag, ShmFlag};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Include each process's block map (segments and blocks) in the JSON.
    #[arg(long)]
    blocks: bool,
    /// Watch this many seconds before printing (default: one look). A job
    /// already running is watched from an anchor snapshot on, so its leak
    /// verdict needs the steps seen in that time (at least 8).
    #[arg(long = "for", allow_negative_numbers = true, value_name = "SECS")]
    watch_for: Option<Seconds>,
    #[command(flatten)]
    shm: ShmFlag,
    #[command(flatten)]
    nvml: NvmlFlag,
}

pub fn run(args: Args) -> Result<()> {
    let mut collector = Collector::new(super::collect_config(&args.shm, &args.nvml, None));
    let rt = super::runtime()?;
    rt.block_on(collector.look(Duration::from_secs(1)));
    if let Some(secs) = args.watch_for {
        rt.block_on(async {
            let until = tokio::time::sleep(secs.duration());
            collector.run_until(until).await
        });
        rt.block_on(collector.look(Duration::from_secs(1)));
    }
    let snap = collector.hub().snapshot(&ViewOptions {
        block_map: args.blocks,
        recent_events: 16,
        timeline: None,
    });
    if args.json {
        super::out::line(&serde_json::to_string_pretty(&snap)?)
    } else {
        super::out::print(&table(&snap))
    }
}

fn opt(b: Option<u64>) -> String {
    b.map(bytes).unwrap_or_else(|| "—".into())
}

/// The snapshot as a table: GPUs, then one line per process, then problems.
pub fn table(s: &Snapshot) -> String {
    let mut o = String::new();
    match &s.machine.nvml_error {
        Some(e) => {
            let _ = writeln!(o, "{e}");
        }
        None => {
            for g in &s.machine.gpus {
                let util = g.util_gpu.map(|u| format!("{u}%")).unwrap_or("—".into());
                let (used, total) = (opt(g.used), opt(g.total));
                let _ = writeln!(
                    o,
                    "GPU {} {}: used {used} of {total}, util {util}",
                    g.index, g.name
                );
            }
        }
    }
    let _ = writeln!(
        o,
        "{:>7} {:<20} {:<9} {:>11} {:>11} {:>11} {:>11}",
        "PID", "NAME", "MODE", "NVML USED", "RESERVED", "ALLOCATED", "PEAK ALLOC"
    );
    for p in &s.processes {
        let f = &p.view.figures;
        let name = if p.identity.label.is_empty() {
            &p.identity.name
        } else {
            &p.identity.label
        };
        let _ = writeln!(
            o,
            "{:>7} {:<20.20} {:<9} {:>11} {:>11} {:>11} {:>11}",
            p.identity.host_pid,
            name,
            format!("{:?}", p.view.mode),
            opt(f.nvml_used),
            bytes(f.reserved),
            bytes(f.allocated),
            bytes(f.peak_allocated),
        );
        // The verdict in the words of the dashboard's diagnosis pane.
        let leak = &p.view.leak;
        let (_, verdict) = diagnosis::verdict_text(leak, &p.view.leak_criterion);
        let _ = writeln!(o, "        {verdict}");
        let _ = writeln!(o, "        {}", diagnosis::steps_text(leak));
    }
    for pr in &s.problems {
        let _ = writeln!(o, "! {}: {}", pr.path, pr.message);
    }
    if s.problems.iter().any(|p| p.message.starts_with("stale")) {
        let _ = writeln!(o, "`vramscope rings --clean` removes stale segments");
    }
    o
}
