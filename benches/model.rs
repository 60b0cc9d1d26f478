//! Model throughput and memory.
//!
//! `cargo bench --bench model` prints, besides criterion's figures:
//! - events applied per second over 10 million events on one core, and
//! - the model's own size accounting for the process after them.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use vramscope::event::{Event, EventKind, Place, PoolId, Stats};
use vramscope::model::{Model, ModelConfig, ProcessKey};

const KEY: ProcessKey = ProcessKey {
    pid: 1,
    start_time: 1,
};
const MIB: u64 = 1 << 20;
const SMALL: u64 = 0x7f00_0000_0000;
const LARGE: u64 = 0x7f00_1000_0000;
const BACKGROUND: u64 = 0x7f00_2000_0000;
/// Events before the repeating body.
const SETUP: usize = 4 + 50 * 101;

/// A consistent, repeating allocator workload: per cycle 8 small tensors
/// allocated and freed in reverse, 3 large ones allocated and freed in
/// order, a marker, and a stats sample now and then. Each cycle leaves the
/// state as it found it, so the list can be replayed with shifted times.
fn workload(cycles: u64, dt: u64) -> (Vec<Event>, u64) {
    let place = Place {
        device: 0,
        stream: 0,
        pool: PoolId(0, 0),
        ctx: Default::default(),
    };
    let mut t = 0u64;
    let mut out = Vec::new();
    let mut push = |out: &mut Vec<Event>, kind| {
        t += dt;
        out.push(Event { time_ns: t, kind });
    };
    push(
        &mut out,
        EventKind::SnapshotBegin {
            device: 0,
            id: 1,
            segments: 0,
            blocks: 0,
            at: None,
        },
    );
    push(&mut out, EventKind::SnapshotEnd { device: 0, id: 1 });
    push(
        &mut out,
        EventKind::SegmentAlloc {
            place,
            addr: SMALL,
            size: 2 * MIB,
        },
    );
    push(
        &mut out,
        EventKind::SegmentAlloc {
            place,
            addr: LARGE,
            size: 20 * MIB,
        },
    );
    // A background of 5,000 live tensors in 50 other segments, so the
    // block map has a realistic depth.
    for s in 0..50u64 {
        let base = BACKGROUND + s * 2 * MIB;
        push(
            &mut out,
            EventKind::SegmentAlloc {
                place,
                addr: base,
                size: 2 * MIB,
            },
        );
        for i in 0..100 {
            push(
                &mut out,
                EventKind::Alloc {
                    place,
                    addr: base + i * 4096,
                    size: 4096,
                },
            );
        }
    }
    assert_eq!(out.len(), SETUP);
    for c in 0..cycles {
        push(
            &mut out,
            EventKind::Marker {
                value: c,
                source: Default::default(),
            },
        );
        for i in 0..8 {
            push(
                &mut out,
                EventKind::Alloc {
                    place,
                    addr: SMALL + i * 4096,
                    size: 4000,
                },
            );
        }
        for i in (0..8).rev() {
            push(
                &mut out,
                EventKind::FreeRequested {
                    place,
                    addr: SMALL + i * 4096,
                    size: 4000,
                },
            );
            push(
                &mut out,
                EventKind::FreeCompleted {
                    place,
                    addr: SMALL + i * 4096,
                    size: 4000,
                },
            );
        }
        for i in 0..3 {
            push(
                &mut out,
                EventKind::Alloc {
                    place,
                    addr: LARGE + i * 4 * MIB,
                    size: 4 * MIB,
                },
            );
        }
        for i in 0..3 {
            push(
                &mut out,
                EventKind::FreeRequested {
                    place,
                    addr: LARGE + i * 4 * MIB,
                    size: 4 * MIB,
                },
            );
            push(
                &mut out,
                EventKind::FreeCompleted {
                    place,
                    addr: LARGE + i * 4 * MIB,
                    size: 4 * MIB,
                },
            );
        }
        if c % 400 == 0 {
            let stats = Stats {
                allocated: 5_000 * 4096,
                reserved: 122 * MIB,
                ..Stats::default()
            };
            push(&mut out, EventKind::Stats { device: 0, stats });
        }
    }
    (out, t)
}

/// Apply `total` events: the setup once, then the repeating body with
/// shifted times. Returns the model.
fn run(events: &[Event], setup: usize, span: u64, total: u64) -> Model {
    let mut m = Model::new(ModelConfig::default());
    let p = m.process_mut(KEY);
    for ev in &events[..setup] {
        p.apply(ev);
    }
    let body = &events[setup..];
    let mut done = setup as u64;
    let mut offset = 0;
    while done < total {
        for ev in body {
            let mut e = ev.clone();
            e.time_ns += offset;
            p.apply(black_box(&e));
        }
        done += body.len() as u64;
        offset += span;
    }
    m
}

fn report(label: &str, dt: u64) {
    let (events, span) = workload(20_000, dt);
    let total = 10_000_000u64;
    let start = Instant::now();
    let m = run(&events, SETUP, span, total);
    let secs = start.elapsed().as_secs_f64();
    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 0);
    let d = &p.devices()[0];
    println!(
        "model [{label}]: {} events in {:.2} s = {:.1} M events/s on one core; {} blocks; \
         memory per process {} bytes ({:.2} MiB); leak flagged: {}",
        p.events(),
        secs,
        p.events() as f64 / secs / 1e6,
        d.block_summary().blocks,
        p.memory_bytes(),
        p.memory_bytes() as f64 / MIB as f64,
        p.leak_report(0).flagged
    );
}

fn bench(c: &mut Criterion) {
    let (events, span) = workload(2_000, 100);
    let mut g = c.benchmark_group("model");
    g.throughput(Throughput::Elements((events.len() - SETUP) as u64));
    g.bench_function("apply", |b| {
        let mut m = Model::new(ModelConfig::default());
        let p = m.process_mut(KEY);
        for ev in &events[..SETUP] {
            p.apply(ev);
        }
        let mut offset = 0;
        b.iter(|| {
            for ev in &events[SETUP..] {
                let mut e = ev.clone();
                e.time_ns += offset;
                p.apply(black_box(&e));
            }
            offset += span;
        });
    });
    g.finish();
}

fn main() {
    // 10 M events in 1 s of writer time, and the same spread over 3 days
    // (every series tier filled).
    report("dense, 100 ns apart", 100);
    report("sparse, 26 us apart = 3 days", 26_000);
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
