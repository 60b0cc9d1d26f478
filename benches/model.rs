//! Model throughput and memory.
//!
//! `cargo bench --bench model` prints, besides criterion's figures:
//! - events applied per second over 10 million events on one core, and
//! - the model's own size accounting for the process after them, and
//! - the same under a flood of 4 million orphan allocations (issue 11,
//!   item 7: bounded, the rest counted as dropped).

use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use vramscope_core::model::{Model, ModelConfig, Process, ProcessKey, ViewOptions};
use vramscope_wire::event::{Event, EventKind, Place, PoolId, Stats};

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

/// Every event of the workload happens in this place.
const PLACE: Place = Place {
    device: 0,
    stream: 0,
    pool: PoolId(0, 0),
    ctx: vramscope_wire::event::CtxTag::NONE,
};

/// A list of events `dt` apart; `t` is the time of the last one.
struct Events {
    out: Vec<Event>,
    t: u64,
    dt: u64,
}

impl Events {
    fn push(&mut self, kind: EventKind) {
        self.t += self.dt;
        self.out.push(Event {
            time_ns: self.t,
            kind,
        });
    }
    fn segment(&mut self, addr: u64, size: u64) {
        self.push(EventKind::SegmentAlloc {
            place: PLACE,
            addr,
            size,
        });
    }
    fn alloc(&mut self, addr: u64, size: u64) {
        self.push(EventKind::Alloc {
            place: PLACE,
            addr,
            size,
        });
    }
    /// A free, requested then completed.
    fn free(&mut self, addr: u64, size: u64) {
        self.push(EventKind::FreeRequested {
            place: PLACE,
            addr,
            size,
        });
        self.push(EventKind::FreeCompleted {
            place: PLACE,
            addr,
            size,
        });
    }
}

/// A consistent, repeating allocator workload: per cycle 8 small tensors
/// allocated and freed in reverse, 3 large ones allocated and freed in
/// order, a marker, and a stats sample now and then. Each cycle leaves the
/// state as it found it, so the list can be replayed with shifted times.
fn workload(cycles: u64, dt: u64) -> (Vec<Event>, u64) {
    let mut w = Events {
        out: Vec::new(),
        t: 0,
        dt,
    };
    setup(&mut w);
    assert_eq!(w.out.len(), SETUP);
    for c in 0..cycles {
        cycle(&mut w, c);
    }
    (w.out, w.t)
}

/// The [`SETUP`] events: an empty snapshot, the segments the cycles use,
/// and a background of 5,000 live tensors in 50 other segments, so the
/// block map has a realistic depth.
fn setup(w: &mut Events) {
    w.push(EventKind::SnapshotBegin {
        device: 0,
        id: 1,
        segments: 0,
        blocks: 0,
        at: None,
    });
    w.push(EventKind::SnapshotEnd { device: 0, id: 1 });
    w.segment(SMALL, 2 * MIB);
    w.segment(LARGE, 20 * MIB);
    for s in 0..50u64 {
        let base = BACKGROUND + s * 2 * MIB;
        w.segment(base, 2 * MIB);
        for i in 0..100 {
            w.alloc(base + i * 4096, 4096);
        }
    }
}

/// Cycle `c` of the repeating body.
fn cycle(w: &mut Events, c: u64) {
    w.push(EventKind::Marker {
        value: c,
        source: Default::default(),
    });
    for i in 0..8 {
        w.alloc(SMALL + i * 4096, 4000);
    }
    for i in (0..8).rev() {
        w.free(SMALL + i * 4096, 4000);
    }
    for i in 0..3 {
        w.alloc(LARGE + i * 4 * MIB, 4 * MIB);
    }
    for i in 0..3 {
        w.free(LARGE + i * 4 * MIB, 4 * MIB);
    }
    if c % 400 == 0 {
        let stats = Stats {
            allocated: 5_000 * 4096,
            reserved: 122 * MIB,
            ..Stats::default()
        };
        w.push(EventKind::Stats { device: 0, stats });
    }
}

/// A model whose process [`KEY`] has seen the first `setup` events.
fn primed(events: &[Event], setup: usize) -> Model {
    let mut m = Model::new(ModelConfig::default());
    let p = m.process_mut(KEY).expect("within the process bound");
    for ev in &events[..setup] {
        p.apply(ev);
    }
    m
}

/// Applies `body` to `p` with every time shifted by `offset`.
fn apply_shifted(p: &mut Process, body: &[Event], offset: u64) {
    for ev in body {
        let mut e = *ev;
        e.time_ns += offset;
        p.apply(black_box(&e));
    }
}

/// Apply `total` events: the setup once, then the repeating body with
/// shifted times. Returns the model.
fn run(events: &[Event], setup: usize, span: u64, total: u64) -> Model {
    let mut m = primed(events, setup);
    let p = m.process_mut(KEY).expect("within the process bound");
    let body = &events[setup..];
    let mut done = setup as u64;
    let mut offset = 0;
    while done < total {
        apply_shifted(p, body, offset);
        done += body.len() as u64;
        offset += span;
    }
    m
}

/// `cargo bench` passes `--bench`; `cargo test --all-targets` runs this
/// binary without it, in a debug build, as a smoke test: then the reports
/// run a thousandth of the events (the figures are only meaningful from
/// `cargo bench`).
fn benching() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `n` when benching, else `n / 1000` (at least 1000).
fn scaled(n: u64) -> u64 {
    if benching() {
        n
    } else {
        (n / 1000).max(1000)
    }
}

fn report(label: &str, dt: u64) {
    let (events, span) = workload(if benching() { 20_000 } else { 20 }, dt);
    let total = scaled(10_000_000);
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

/// The orphan flood of issue 11 (item 7): `total` allocations at new
/// addresses outside every segment. The model keeps `Bounds::orphans` of
/// them and counts the rest as dropped.
fn report_orphan_flood(total: u64) {
    let mut m = Model::new(ModelConfig::default());
    let p = m.process_mut(KEY).expect("within the process bound");
    let start = Instant::now();
    for i in 0..total {
        p.apply(black_box(&Event {
            time_ns: i * 100,
            kind: EventKind::Alloc {
                place: PLACE,
                addr: 0x7f00_0000_0000 + i * 512,
                size: 512,
            },
        }));
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "model [orphan flood]: {} events in {:.2} s = {:.1} M events/s on one core; \
         memory per process {} bytes ({:.2} MiB); dropped {} orphans",
        p.events(),
        secs,
        p.events() as f64 / secs / 1e6,
        p.memory_bytes(),
        p.memory_bytes() as f64 / MIB as f64,
        p.dropped().orphans
    );
}

fn bench(c: &mut Criterion) {
    let (events, span) = workload(2_000, 100);
    let mut g = c.benchmark_group("model");
    g.throughput(Throughput::Elements((events.len() - SETUP) as u64));
    g.bench_function("apply", |b| {
        let mut m = primed(&events, SETUP);
        let p = m.process_mut(KEY).expect("within the process bound");
        let mut offset = 0;
        b.iter(|| {
            apply_shifted(p, &events[SETUP..], offset);
            offset += span;
        });
    });
    g.finish();
    // What a view of the process costs (the dashboard takes one per
    // process each frame; `serve` one per scrape): figures, the leak
    // verdict and attribution by module, phase and role over its 5,052
    // blocks; then with the block map (the selected process).
    let m = run(&events, SETUP, span, scaled(200_000));
    let p = m.process(KEY).expect("primed");
    let mut g = c.benchmark_group("model");
    let brief = ViewOptions {
        block_map: false,
        recent_events: 0,
        timeline: None,
    };
    g.bench_function("view", |b| b.iter(|| black_box(p.view(0, &brief))));
    let full = ViewOptions {
        block_map: true,
        ..brief
    };
    g.bench_function("view_block_map", |b| b.iter(|| black_box(p.view(0, &full))));
    g.finish();
}

fn main() {
    // 10 M events in 1 s of writer time, and the same spread over 3 days
    // (every series tier filled).
    report("dense, 100 ns apart", 100);
    report("sparse, 26 us apart = 3 days", 26_000);
    report_orphan_flood(scaled(4_000_000));
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
