//! The orphan flood of issue 11, item 7, measured: a producer writes ALLOC
//! records at new addresses outside every segment as fast as it can into a
//! real segment, while the real collector (its live loop, as the dashboard
//! runs it) drains it into the hub and a dashboard-like reader takes a
//! snapshot (with the block map) ten times a second. Every few seconds it
//! prints this process's RSS (`VmRSS`), the model's own accounting, and
//! what the model's bounds dropped.
//!
//!   cargo run --release --example orphan_flood -- SECONDS [DIR]
//!
//! SECONDS defaults to 60, DIR (where the segment is made) to /dev/shm.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vramscope_collect::{Config, Live};
use vramscope_core::model::ViewOptions;
use vramscope_wire::event::{Event, EventKind, Place};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::{monotonic_ns, Producer, SegmentConfig, SegmentWriter};

/// This process's resident set size in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60.0);
    let base = args.get(2).cloned().unwrap_or_else(|| "/dev/shm".into());
    let dir = std::path::Path::new(&base).join(format!("vramscope-flood-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("segment directory");

    let seg = SegmentWriter::create(&SegmentConfig::new(&dir, Producer::TorchExact, 1, 1 << 16))
        .expect("segment");
    let mut cfg = Config::new(dir.clone());
    cfg.nvml = false;
    cfg.clean_stale = false;
    let live = Live::start(cfg).expect("collector");
    let hub = live.hub().clone();

    let stop = AtomicBool::new(false);
    let written = AtomicU64::new(0);
    let start = Instant::now();
    let rss0 = rss_mib();
    println!("start: RSS {rss0:.1} MiB");
    std::thread::scope(|s| {
        // The producer: one ALLOC record per new address, 512 bytes apart,
        // far from any segment; as fast as the ring takes them.
        s.spawn(|| {
            let mut words = Vec::new();
            let mut addr = 0x7f00_0000_0000u64;
            let mut n = 0u64;
            let mut t = monotonic_ns();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..1024 {
                    words.clear();
                    let kind = EventKind::Alloc {
                        place: Place::default(),
                        addr,
                        size: 512,
                    };
                    encode(&Event { time_ns: t, kind }, 0, &mut words);
                    for w in &words {
                        seg.ring(1).write(w);
                    }
                    addr = addr.wrapping_add(512);
                    n += 1;
                }
                t = monotonic_ns();
                written.store(n, Ordering::Relaxed);
            }
        });
        // The reader: a dashboard frame's snapshot ten times a second.
        let opts = ViewOptions::default();
        let mut next_print = Duration::from_secs(5);
        let mut last_written = 0;
        let mut last_at = Duration::ZERO;
        while start.elapsed().as_secs_f64() < secs {
            let snap = hub.snapshot(&opts);
            let at = start.elapsed();
            if at >= next_print {
                next_print += Duration::from_secs(5);
                let w = written.load(Ordering::Relaxed);
                let rate = (w - last_written) as f64 / (at - last_at).as_secs_f64();
                (last_written, last_at) = (w, at);
                match snap.processes.first() {
                    Some(p) => {
                        let v = &p.view;
                        println!(
                            "{:>5.0} s: RSS {:.1} MiB; written {:.1} M ({:.0} k/s); \
                             applied {:.1} M, lost {:.1} M; model {:.1} MiB; \
                             orphans kept {}; dropped {} orphans (bound {})",
                            at.as_secs_f64(),
                            rss_mib(),
                            w as f64 / 1e6,
                            rate / 1e3,
                            v.figures.events_total as f64 / 1e6,
                            v.figures.lost_events as f64 / 1e6,
                            v.memory_bytes as f64 / (1 << 20) as f64,
                            v.devices.first().map_or(0, |d| d.orphans.len()),
                            v.dropped.orphans,
                            v.bounds.orphans,
                        );
                    }
                    None => println!(
                        "{:>5.0} s: RSS {:.1} MiB; not attached yet",
                        at.as_secs_f64(),
                        rss_mib()
                    ),
                }
            }
            drop(snap);
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
    });
    println!("end: RSS {:.1} MiB (start {rss0:.1} MiB)", rss_mib());
    drop(seg);
    let _ = std::fs::remove_dir_all(&dir);
    // Exit with the collector still running, as the dashboard does
    // (dropping its runtime under a pending sleep panics in tokio).
    std::mem::forget(live);
    std::process::exit(0);
}
