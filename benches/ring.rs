//! Ring throughput: ns per record written (one thread, four threads) and
//! records per second drained by one reader.
//!
//!   cargo bench --bench ring

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

const SLOTS: u64 = 1 << 16;

fn segment(dir: &std::path::Path, slots: u64, tag: &str) -> SegmentWriter {
    let mut cfg = SegmentConfig::new(dir, Producer::Test, 1, slots);
    cfg.tag = Some(tag.into());
    SegmentWriter::create(&cfg).unwrap()
}

fn write(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), SLOTS, "w");
    let mut g = c.benchmark_group("ring_write");
    g.throughput(Throughput::Elements(1));
    g.bench_function("1_thread", |b| {
        let ring = seg.ring(1);
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            black_box(ring.write(black_box(&[1, i, i, 4096, 0, 0, 0])))
        })
    });
    g.bench_function("1_thread_exclusive", |b| {
        let ring = seg.ring(1);
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            ring.write_exclusive(black_box(&[1, i, i, 4096, 0, 0, 0]))
        })
    });
    // Four threads share one ring; time per record = wall time / records.
    g.bench_function("4_threads", |b| {
        b.iter_custom(|iters| {
            let per = iters.div_ceil(4);
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let ring = seg.ring(1);
                    s.spawn(move || {
                        for i in 0..per {
                            black_box(ring.write(&[1, t, i, 4096, 0, 0, 0]));
                        }
                    });
                }
            });
            t0.elapsed().mul_f64(iters as f64 / (per * 4) as f64)
        })
    });
    g.finish();
}

fn drain(c: &mut Criterion) {
    const N: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), N, "d");
    let ring = seg.ring(1);
    for i in 0..N {
        ring.write(&[1, i, i, 4096, 0, 0, 0]);
    }
    let mut g = c.benchmark_group("ring_drain");
    g.throughput(Throughput::Elements(N));
    g.bench_function("1_reader_raw", |b| {
        b.iter_batched(
            || SegmentReader::open(seg.path()).unwrap(),
            |mut r| {
                let mut sum = 0u64;
                let done =
                    r.drain_ring_raw(1, usize::MAX, false, |_, w| sum = sum.wrapping_add(w[2]));
                assert_eq!(done.delivered, N);
                black_box(sum)
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("1_reader_decoded", |b| {
        b.iter_batched(
            || SegmentReader::open(seg.path()).unwrap(),
            |mut r| {
                let mut n = 0u64;
                r.drain(usize::MAX, |_, e| {
                    n += 1;
                    black_box(e);
                });
                assert_eq!(n, N);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = write, drain
}
criterion_main!(benches);
