//! Plain-text reports for the headless commands (`snapshot`, `demo --headless`).
use std::fmt::Write;

use vramscope::collect::Snapshot;
use vramscope::demo::HeadlessReport;

/// `1.50 GiB`, `512 B`.
pub fn bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", U[i])
    }
}

fn opt(b: Option<u64>) -> String {
    b.map(bytes).unwrap_or_else(|| "—".into())
}

pub fn snapshot(s: &Snapshot) -> String {
    let mut o = String::new();
    match &s.machine.nvml_error {
        Some(e) => writeln!(o, "{e}").unwrap(),
        None => {
            for g in &s.machine.gpus {
                writeln!(
                    o,
                    "GPU {} {}: used {} of {}, util {}",
                    g.index,
                    g.name,
                    opt(g.used),
                    opt(g.total),
                    g.util_gpu
                        .map(|u| format!("{u}%"))
                        .unwrap_or_else(|| "—".into())
                )
                .unwrap();
            }
        }
    }
    writeln!(
        o,
        "{:>7} {:<20} {:<9} {:>11} {:>11} {:>11} {:>11}",
        "PID", "NAME", "MODE", "NVML USED", "RESERVED", "ALLOCATED", "PEAK ALLOC"
    )
    .unwrap();
    for p in &s.processes {
        let f = &p.view.figures;
        let name = if p.identity.label.is_empty() {
            &p.identity.name
        } else {
            &p.identity.label
        };
        writeln!(
            o,
            "{:>7} {:<20.20} {:<9} {:>11} {:>11} {:>11} {:>11}",
            p.identity.host_pid,
            name,
            format!("{:?}", p.view.mode),
            opt(f.nvml_used),
            bytes(f.reserved),
            bytes(f.allocated),
            bytes(f.peak_allocated),
        )
        .unwrap();
    }
    for pr in &s.problems {
        writeln!(o, "! {}: {}", pr.path, pr.message).unwrap();
    }
    o
}

pub fn headless(r: &HeadlessReport) -> String {
    let mut o = String::new();
    let f = &r.process.view.figures;
    writeln!(
        o,
        "scenario   {}{}",
        r.scenario,
        r.conf
            .as_ref()
            .map(|c| format!(" ({c})"))
            .unwrap_or_default()
    )
    .unwrap();
    writeln!(
        o,
        "simulated  {:.1} s{}",
        r.simulated_s,
        if r.finished { " (finished)" } else { "" }
    )
    .unwrap();
    writeln!(o, "now        {}", r.caption).unwrap();
    writeln!(
        o,
        "allocated  {} (peak {})",
        bytes(f.allocated),
        bytes(f.peak_allocated)
    )
    .unwrap();
    writeln!(
        o,
        "reserved   {} (peak {})",
        bytes(f.reserved),
        bytes(f.peak_reserved)
    )
    .unwrap();
    for d in &r.process.view.devices {
        let fr = &d.figures.fragmentation;
        writeln!(
            o,
            "device {}   {} segments, inactive split {} ({}), largest free block {}",
            d.figures.device,
            d.figures.segments,
            bytes(fr.inactive_split),
            fr.share_of_reserved
                .map(|s| format!("{:.1}% of reserved", s * 100.0))
                .unwrap_or_else(|| "—".into()),
            opt(fr.largest_free_large.max(fr.largest_free_small)),
        )
        .unwrap();
    }
    writeln!(
        o,
        "events     {} delivered, {} lost",
        r.process.source.delivered, r.process.source.lost
    )
    .unwrap();
    writeln!(o, "OOMs       {}", r.process.view.ooms_total).unwrap();
    let leak = &r.process.view.leak;
    if leak.flagged {
        writeln!(
            o,
            "LEAK       allocated floor rises {} per step over {} steps",
            bytes(leak.floor_slope_bytes_per_step.max(0.0) as u64),
            leak.window_steps
        )
        .unwrap();
        for s in leak.top_sizes.iter().take(3) {
            writeln!(
                o,
                "           {} blocks: {} live, +{:.2}/step",
                bytes(s.requested),
                s.live,
                s.live_growth_per_step
            )
            .unwrap();
        }
    } else {
        writeln!(
            o,
            "leak       not flagged ({} steps seen)",
            leak.steps_observed
        )
        .unwrap();
    }
    o
}

/// `vramscope doctor`: one line per check, with what to do; exits non-zero
/// when a check failed.
pub fn doctor(checks: &[vramscope::agent::Check], json: bool) -> anyhow::Result<()> {
    use vramscope::agent::Level;
    if json {
        for c in checks {
            println!("{}", serde_json::to_string(c)?);
        }
    } else {
        for c in checks {
            let mark = match c.level {
                Level::Ok => "ok  ",
                Level::Warn => "warn",
                Level::Fail => "FAIL",
            };
            println!("[{mark}] {}: {}", c.name, c.detail);
            if !c.fix.is_empty() {
                println!("       -> {}", c.fix);
            }
        }
    }
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed");
    }
    Ok(())
}
