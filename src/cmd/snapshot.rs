//! `vramscope snapshot`: one look at every GPU (NVML) and every instrumented
//! process, as a table or as JSON; `--blocks` adds each process's block
//! map, `--watch SECS` looks again every SECS seconds (until Ctrl-C), and
//! `--screenshot FILE.svg` draws the dashboard's overview of it with no
//! terminal.
use std::fmt::Write;
use std::time::Duration;

use anyhow::{Context, Result};

use vramscope_collect::{Collector, Snapshot};
use vramscope_core::model::outside;
use vramscope_core::model::ViewOptions;
use vramscope_text::format::{self, bytes};
use vramscope_ui::diagnosis;
use vramscope_ui::rows::{mode_name, Row};

use super::common::NvmlFlag;
use super::common::ShmFlag;
use super::value::{Seconds, TermSize};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("time").args(["watch_for", "watch"]).multiple(true)))]
pub(crate) struct Args {
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Include each process's block map (segments and blocks): in the JSON,
    /// or as one line per segment under the table.
    #[arg(long)]
    blocks: bool,
    /// Watch this many seconds before printing (default: one look). A job
    /// already running is watched from an anchor snapshot on, so its leak
    /// verdict needs the steps seen in that time (at least 8).
    #[arg(long = "for", allow_negative_numbers = true, value_name = "SECS")]
    watch_for: Option<Seconds>,
    /// Run the live advisor on every process while watching (with --for or
    /// --watch): each one's recommended setting and saving under it, and
    /// as `advice` in the JSON.
    #[arg(long, requires = "time")]
    advise: bool,
    /// Look again every this many seconds, until Ctrl-C (a table, or one
    /// JSON document per line).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    watch: Option<Seconds>,
    /// Also draw the dashboard's overview of this look as SVG to this file.
    #[arg(long, value_name = "FILE.svg")]
    screenshot: Option<std::path::PathBuf>,
    /// With --screenshot: its size (default 120x40).
    #[arg(long, value_name = "COLSxROWS", requires = "screenshot")]
    size: Option<TermSize>,
    #[command(flatten)]
    shm: ShmFlag,
    #[command(flatten)]
    nvml: NvmlFlag,
}

pub(crate) fn run(args: Args) -> Result<()> {
    // A directory that cannot be read is an error (as for `rings`), not an
    // empty machine.
    let dir = args.shm.dir();
    std::fs::read_dir(&dir).with_context(|| format!("segment directory {}", dir.display()))?;
    let mut collector = Collector::new(super::common::collect_config(&args.shm, &args.nvml, None));
    let share = Some(vramscope_collect::ADVISOR_CPU_SHARE);
    if args.advise {
        collector.hub().enable_advisor(true, true, share);
    } else {
        // A job heading for its limit, looked at again (`--watch`): its
        // forecast by simulation.
        collector.hub().advise_forecasts(true, share);
    }
    let rt = super::common::runtime()?;
    if let Some(secs) = args.watch_for {
        rt.block_on(collector.look(Duration::from_secs(1)));
        rt.block_on(async {
            let until = tokio::time::sleep(secs.duration());
            collector.run_until(until).await
        });
    }
    let opts = ViewOptions {
        block_map: args.blocks,
        recent_events: 16,
        timeline: None,
    };
    // With --watch, why NVML is unavailable is said once (again only if
    // it changes), not at every look.
    let mut nvml_said: Option<String> = None;
    loop {
        rt.block_on(collector.look(Duration::from_secs(1)));
        let snap = collector.hub().snapshot(&opts);
        if let Some(path) = &args.screenshot {
            let size = args.size.map_or((120, 40), |s| (s.cols, s.rows));
            let still = vramscope_ui::Still {
                size,
                now_ns: snap.taken_ns,
                window_ns: None,
                path,
            };
            let ui = vramscope_ui::UiOptions::default();
            vramscope_ui::screenshot_now(collector.hub(), None, &ui, still)?;
        }
        match (args.json, args.watch.is_some()) {
            (true, false) => super::out::line(&serde_json::to_string_pretty(&snap)?)?,
            (true, true) => super::out::line(&serde_json::to_string(&snap)?)?,
            (false, _) => {
                let said = std::mem::replace(&mut nvml_said, snap.machine.nvml_error.clone());
                let mut t = if said.is_some() && said == snap.machine.nvml_error {
                    table_after(&snap, false)
                } else {
                    table(&snap)
                };
                if args.blocks {
                    t.push_str(&blocks(&snap));
                }
                if args.watch.is_some() {
                    t.push('\n');
                }
                super::out::print(&t)?;
            }
        }
        match args.watch {
            Some(every) => std::thread::sleep(every.duration()),
            None => return Ok(()),
        }
    }
}

/// Why a GPU's reading may be below what its processes show: NVML's
/// reading is the latest (a recording's last, at its end), while a process
/// that exited keeps the figure NVML last gave it. For GPU `gpu`, names
/// the exited processes NVML no longer lists: ` (read after pid 6379
/// exited; it last used 1.01 GiB)`; else nothing.
fn read_after_exit(s: &Snapshot, gpu: u32) -> String {
    let listed = |pid: u32| s.machine.processes.iter().any(|p| p.pid == pid);
    let on_gpu = |r: &Row| {
        let gpus = r.gpus.as_deref().unwrap_or_default();
        gpus.split(',').any(|g| g == gpu.to_string())
    };
    let gone: Vec<(u32, u64)> = (s.processes.iter())
        .map(|p| Row::new(s, p))
        .filter(|r| !r.alive && !listed(r.pid) && on_gpu(r))
        .filter_map(|r| Some((r.pid, r.nvml.filter(|&n| n > 0)?)))
        .collect();
    match gone.as_slice() {
        [] => String::new(),
        [(pid, used)] => format!(
            " (read after pid {pid} exited; it last used {})",
            bytes(*used)
        ),
        _ => {
            let pids: Vec<String> = gone.iter().map(|(p, _)| p.to_string()).collect();
            let used = gone.iter().map(|(_, u)| u).sum::<u64>();
            format!(
                " (read after pids {} exited; they last used {} together)",
                pids.join(", "),
                bytes(used)
            )
        }
    }
}

fn opt(b: Option<u64>) -> String {
    b.map(bytes).unwrap_or_else(|| "—".into())
}

/// The snapshot as a table: GPUs, then one line per process (the
/// dashboard's figures: fragmentation, OOMs, the flags with the leak
/// verdict), then problems.
pub(crate) fn table(s: &Snapshot) -> String {
    table_after(s, true)
}

/// [`table`]; `nvml_why`: whether to say why NVML is unavailable (a
/// `--watch` look after the first says it only when it changed).
fn table_after(s: &Snapshot, nvml_why: bool) -> String {
    let mut o = String::new();
    match &s.machine.nvml_error {
        Some(e) => {
            if nvml_why {
                let _ = writeln!(o, "{e}");
            }
        }
        None => {
            for g in &s.machine.gpus {
                let util = g.util_gpu.map(|u| format!("{u}%")).unwrap_or("—".into());
                let (used, total) = (opt(g.used), opt(g.total));
                let _ = writeln!(
                    o,
                    "GPU {} {}: used {used} of {total}, util {util}{}",
                    g.index,
                    g.name,
                    read_after_exit(s, g.index)
                );
            }
        }
    }
    let _ = writeln!(
        o,
        "{:>7} {:<20} {:<5} {:>10} {:>10} {:>10} {:>10} {:>5} {:>4}  FLAGS",
        "PID", "NAME", "MODE", "NVML", "RESERVED", "ALLOCATED", "PEAK", "FRAG", "OOMS"
    );
    for p in &s.processes {
        let r = Row::new(s, p);
        let name = format::truncate(&vramscope_text::printable(&r.name), 20, "…");
        let _ = writeln!(
            o,
            "{:>7} {:<20} {:<5} {:>10} {:>10} {:>10} {:>10} {:>5} {:>4}  {}",
            r.pid,
            name,
            mode_name(r.mode),
            opt(r.nvml),
            opt(r.reserved),
            opt(r.allocated),
            opt(r.peak),
            r.frag.map_or_else(|| "—".into(), format::percent),
            r.ooms,
            r.flags(),
        );
        // What the producer named outside the caching allocator (issue 47).
        if let Some(line) = outside::line(&p.view.outside, p.view.figures.unexplained) {
            let _ = writeln!(o, "        outside   {line}");
        }
        // The verdict in the words of the dashboard's diagnosis pane.
        let leak = &p.view.leak;
        let (_, verdict) = diagnosis::verdict_text(leak, &p.view.leak_criterion);
        let _ = writeln!(o, "        {verdict}");
        let _ = writeln!(o, "        {}", diagnosis::steps_text(leak));
        if let Some(f) = &p.view.forecast {
            let _ = writeln!(o, "        {}", diagnosis::forecast_text(f));
        }
        if leak.flagged {
            for text in diagnosis::origins_text(leak, " <- ") {
                let _ = writeln!(o, "        {text}");
            }
            if let Some(text) = diagnosis::roles_text(&p.view.attribution) {
                let _ = writeln!(o, "        {text}");
            }
        }
        if let Some(a) = &p.advice {
            use vramscope_core::sim::advice_text::{coverage_line, summary};
            let _ = writeln!(
                o,
                "        advice: {}",
                vramscope_text::printable(&summary(a))
            );
            let _ = writeln!(
                o,
                "          over {}",
                vramscope_text::printable(&coverage_line(&a.coverage))
            );
        }
    }
    for pr in &s.problems {
        // The message names the path already when it starts with it.
        if pr.message.starts_with(&pr.path) {
            let _ = writeln!(o, "! {}", pr.message);
        } else {
            let _ = writeln!(o, "! {}: {}", pr.path, pr.message);
        }
    }
    if s.problems.iter().any(|p| p.message.starts_with("stale")) {
        let _ = writeln!(o, "`vramscope rings --clean` removes stale segments");
    }
    o
}

/// Each process's block map as text: per device, one line per segment
/// (pool, stream, size, and its blocks by state).
pub(crate) fn blocks(s: &Snapshot) -> String {
    use vramscope_wire::event::BlockState;
    let mut o = String::new();
    for p in &s.processes {
        for d in &p.view.devices {
            let _ = writeln!(
                o,
                "\npid {} cuda:{}: {} segments, {} reserved, {} allocated",
                p.identity.host_pid,
                d.figures.device,
                d.segments.len(),
                bytes(d.figures.reserved),
                bytes(d.figures.allocated)
            );
            for seg in &d.segments {
                let sum = |st: BlockState| -> (usize, u64) {
                    seg.blocks
                        .iter()
                        .filter(|b| b.block.state == st)
                        .fold((0, 0), |(n, b), x| (n + 1, b + x.block.size))
                };
                let (na, ba) = sum(BlockState::Allocated);
                let (np, bp) = sum(BlockState::PendingFree);
                let (ni, bi) = sum(BlockState::Inactive);
                let pool = match seg.segment.pool_kind {
                    vramscope_wire::event::SegmentPool::Small => "S",
                    _ => "L",
                };
                let _ = writeln!(
                    o,
                    "  {pool}{} {:#014x} {:>10}  allocated {na} ({}), pending-free {np} ({}), inactive {ni} ({})",
                    if seg.segment.expandable { "x" } else { " " },
                    seg.segment.addr,
                    bytes(seg.segment.size),
                    bytes(ba),
                    bytes(bp),
                    bytes(bi),
                );
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 47: under each process, what its agent names outside the
    /// caching allocator and what no one named, on one line (a fixture's
    /// simulated job: its context and cuBLAS's workspace; its NVML figure
    /// has 4 MiB more); nothing for a process that names nothing.
    #[test]
    fn the_table_says_what_is_outside_the_allocator() {
        let fx = vramscope_collect::fixtures::Fixture::new(1);
        let t = table(&fx.snapshot(&ViewOptions::default()));
        let lines: Vec<&str> = t.lines().filter(|l| l.contains("outside ")).collect();
        assert_eq!(
            lines,
            ["        outside   context 500 MiB · cuBLAS 32.0 MiB · unexplained 4.00 MiB"],
            "{t}"
        );
    }
}
