//! A small tool for the agent's tests: reads a segment with the real reader
//! and prints JSON lines.
//!
//! ```text
//! ring_dump find <dir> <pid> [timeout_s]   print the segment path of <pid>
//! ring_dump dump <path>                    every record still held, then a summary
//! ring_dump cmd <path> <kind> [arg]        post a command (ping, empty_cache, reset_peaks,
//!                                           snapshot, capture_stacks), print the outcome
//!            kind: ping | empty_cache | reset_peaks | snapshot
//! ```
//!
//! `dump` prints `{"ring":i,"ev":<Event>}` per record, then
//! `{"summary":{...}}` with the header and the loss accounting.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use vramscope_wire::ring::discover;
use vramscope_wire::ring::{Command, SegmentReader};

fn usage() -> ! {
    eprintln!(
        "usage: ring_dump find <dir> <pid> [timeout_s] | dump <path> | cmd <path> <kind> [arg]"
    );
    std::process::exit(2)
}

fn find(dir: &Path, pid: u32, timeout: Duration) -> Option<PathBuf> {
    let start = Instant::now();
    loop {
        if let Ok((found, _)) = discover::list(dir) {
            if let Some(f) = found
                .into_iter()
                .find(|f| f.name.pid == pid && f.name.tag.is_none())
            {
                if SegmentReader::open(&f.path).is_ok() {
                    return Some(f.path);
                }
            }
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn dump(path: &Path) -> anyhow::Result<()> {
    let mut r = SegmentReader::open(path)?;
    let h = r.header().clone();
    let mut quiet_rounds = 0;
    let start = Instant::now();
    while quiet_rounds < 3 && start.elapsed() < Duration::from_secs(10) {
        let done = r.drain(usize::MAX, |ring, ev| {
            println!("{}", json!({"ring": ring, "ev": ev}));
        });
        if done.delivered == 0 && done.lost == 0 {
            quiet_rounds += 1;
            std::thread::sleep(Duration::from_millis(40));
        } else {
            quiet_rounds = 0;
        }
    }
    let rings: Vec<_> = (0..h.rings.len())
        .map(|i| {
            json!({
                "role": h.rings[i].role,
                "device": h.rings[i].device,
                "slots": h.rings[i].slot_count,
                "head": r.head(i),
                "writer_dropped": r.writer_dropped(i),
                "counts": r.counts(i),
            })
        })
        .collect();
    println!(
        "{}",
        json!({"summary": {
            "path": path,
            "pid": h.pid,
            "producer": format!("{:?}", h.producer),
            "flags": h.flags,
            "framework": h.framework,
            "label": h.label,
            "state": r.state(),
            "heartbeat_ns": r.heartbeat_ns(),
            "now_ns": vramscope_wire::ring::monotonic_ns(),
            "rings": rings,
            "totals": r.totals(),
            "dropped_samples": r.dropped_samples(),
        }})
    );
    Ok(())
}

fn cmd(path: &Path, kind: &str, arg: Option<&str>) -> anyhow::Result<()> {
    let dev = arg.and_then(|a| a.parse::<u16>().ok());
    let c = match kind {
        "ping" => Command::Ping {
            value: arg.and_then(|a| a.parse().ok()).unwrap_or(42),
        },
        "empty_cache" => Command::EmptyCache { device: dev },
        "reset_peaks" => Command::ResetPeaks { device: dev },
        "snapshot" => Command::Snapshot { device: dev },
        "capture_stacks" => Command::CaptureStacks {
            steps: arg.and_then(|a| a.parse().ok()).unwrap_or(10),
            depth: 0,
        },
        _ => usage(),
    };
    let r = SegmentReader::open(path)?;
    let t0 = Instant::now();
    match r.command(c, Duration::from_secs(30)) {
        Ok(o) => println!(
            "{}",
            json!({"outcome": o, "ms": t0.elapsed().as_secs_f64() * 1e3})
        ),
        Err(e) => println!("{}", json!({"error": e.to_string()})),
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("find") if args.len() >= 3 => {
            let t = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(30.0);
            match find(
                Path::new(&args[1]),
                args[2].parse()?,
                Duration::from_secs_f64(t),
            ) {
                Some(p) => println!("{}", p.display()),
                None => std::process::exit(1),
            }
        }
        Some("dump") if args.len() == 2 => dump(Path::new(&args[1]))?,
        Some("cmd") if args.len() >= 3 => cmd(
            Path::new(&args[1]),
            &args[2],
            args.get(3).map(String::as_str),
        )?,
        _ => usage(),
    }
    Ok(())
}
