//! A busy stand-in process for measurements: the simulator allocating and
//! freeing as fast as it can, writing real allocator events into a segment.
//!
//!   cargo run --release --example busy_writer -- DIR SECONDS
use std::time::{Duration, Instant};

use vramscope_core::sim::{SimAllocator, SimConfig};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::{monotonic_ns, Producer, SegmentConfig, SegmentWriter};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = args.get(1).cloned().unwrap_or_else(|| "/dev/shm".into());
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let seg =
        SegmentWriter::create(&SegmentConfig::new(&dir, Producer::TorchExact, 1, 1 << 16)).unwrap();
    let mut a = SimAllocator::new(SimConfig {
        capacity: 80 << 30,
        ..SimConfig::default()
    });
    let (mut ev, mut words, mut held) = (Vec::new(), Vec::new(), Vec::new());
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut sample = 0u32;
    let mut last_stats = Instant::now();
    while t0.elapsed() < Duration::from_secs_f64(secs) {
        a.set_time(monotonic_ns());
        n += 1;
        if held.len() > 2000 || (n % 3 == 0 && !held.is_empty()) {
            let p = held.swap_remove((n as usize * 7919) % held.len());
            a.free(p, &mut ev).unwrap();
        } else {
            held.push(a.malloc((n * 104_729) % (8 << 20) + 1, 0, &mut ev).unwrap());
        }
        if last_stats.elapsed() > Duration::from_millis(100) {
            a.emit_stats(&mut ev);
            last_stats = Instant::now();
        }
        for e in ev.drain(..) {
            words.clear();
            sample += 1;
            encode(&e, sample, &mut words);
            let ring = if matches!(e.kind, vramscope_wire::event::EventKind::Stats { .. }) {
                0
            } else {
                1
            };
            for w in &words {
                seg.ring(ring).write(w);
            }
        }
    }
    eprintln!("{} events/s", seg.ring(1).head() as f64 / secs);
}
