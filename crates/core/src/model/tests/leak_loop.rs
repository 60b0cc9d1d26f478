//! Leak detection on synthetic training loops.
use super::*;
use crate::model::{StepSource, ViewOptions};
use vramscope_wire::event::MarkSource;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A training loop on the reference allocator: weights once, then per step
/// forward activations, a 4-byte `loss`, backward frees. `keep_loss` keeps
/// every step's loss alive (the classic `losses.append(loss)` leak);
/// `noise` adds temporaries of random size living 1–3 steps.
fn training_loop(steps: u64, keep_loss: bool, noise: bool, markers: bool) -> Model {
    training_loop_with(steps, keep_loss, noise, markers, None)
}

/// [`training_loop`], with a snapshot (another reader attaching) after
/// every `snapshot_every` steps.
fn training_loop_with(
    steps: u64,
    keep_loss: bool,
    noise: bool,
    markers: bool,
    snapshot_every: Option<u64>,
) -> Model {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let mut rng = Rng(99);
    r.alloc(64 * MIB); // weights
    let mut temps: Vec<(u64, u64)> = Vec::new();
    for step in 0..steps {
        if markers {
            let ev = r.ev.at(EventKind::Marker {
                value: step,
                source: Default::default(),
            });
            r.out.push(ev);
        }
        let acts: Vec<u64> = (0..6)
            .map(|i| {
                let size = if noise {
                    2 * MIB + rng.next() % (6 * MIB)
                } else {
                    (4 + i) * MIB
                };
                r.alloc(size)
            })
            .collect();
        let loss = r.alloc(4);
        for a in acts.into_iter().rev() {
            r.free(a);
        }
        if !keep_loss {
            r.free(loss);
        }
        if noise {
            temps.retain(|&(a, until)| {
                if until <= step {
                    r.free(a);
                    false
                } else {
                    true
                }
            });
            if rng.next() % 2 == 0 {
                let a = r.alloc(64 * 1024 + rng.next() % (512 * 1024));
                temps.push((a, step + 1 + rng.next() % 3));
            }
        }
        feed(&mut m, &r.take());
        if snapshot_every.is_some_and(|k| step % k == k - 1) {
            let snap = r.snapshot(step as u32 + 1);
            feed(&mut m, &snap);
        }
    }
    m
}

#[test]
fn kept_loss_tensors_are_flagged_and_named() {
    for markers in [false, true] {
        let m = training_loop(120, true, false, markers);
        let p = m.process(KEY).unwrap();
        let rep = p.leak_report(u64::MAX / 2);
        assert!(rep.flagged, "markers={markers}: {rep:?}");
        assert_eq!(
            rep.source,
            if markers {
                StepSource::Markers
            } else {
                StepSource::AllocationPeriod
            }
        );
        assert!(rep.steps_observed >= 100);
        assert!(
            (rep.floor_slope_bytes_per_step - 512.0).abs() < 1.0,
            "{rep:?}"
        );
        let top = &rep.top_sizes[0];
        assert_eq!((top.requested, top.block_size), (4, 512));
        assert!((top.live_growth_per_step - 1.0).abs() < 1e-9);
        assert_eq!(top.live, 120);
        assert!(top.oldest_age_ns.is_some());
        assert_eq!(p.inconsistencies(), 0);
        // Its origin, with steps from markers or from the allocation
        // period alike (issue 26: origins were empty without step tags):
        // outside every module, one 512-byte block a step.
        let o = rep.origins.first().unwrap_or_else(|| panic!("{rep:?}"));
        assert_eq!((o.module.as_str(), o.bytes_per_step), ("", 512), "{rep:?}");
        assert!(o.steps_with_survivors * 4 >= o.window_steps * 3);
    }
}

/// Another reader's snapshot (a dashboard attaching, `vramscope
/// snapshot`) dates its blocks at its own time; the blocks this reader
/// already knew keep their birth, so a loop with steps from the
/// allocation period (an inference loop) still has its leak's origin, and
/// the leak is no older than it was.
#[test]
fn a_snapshot_from_another_reader_keeps_the_leak_origin() {
    for every in [7, 40] {
        let m = training_loop_with(120, true, false, false, Some(every));
        let p = m.process(KEY).unwrap();
        let rep = p.leak_report(u64::MAX / 2);
        assert_eq!(rep.source, StepSource::AllocationPeriod, "{rep:?}");
        assert!(rep.flagged, "every {every}: {rep:?}");
        let o = rep.origins.first().unwrap_or_else(|| panic!("{rep:?}"));
        assert_eq!((o.module.as_str(), o.bytes_per_step), ("", 512), "{rep:?}");
        assert!(rep.survivors.flagged, "{:?}", rep.survivors);
        assert_eq!(p.inconsistencies(), 0);
    }
    // Without the births kept, every block would be born at the last
    // snapshot: the test above fails (origins empty) when `keep_births`
    // does nothing.
}

#[test]
fn the_same_loop_without_keeping_loss_is_not_flagged() {
    for markers in [false, true] {
        let m = training_loop(120, false, false, markers);
        let rep = m.process(KEY).unwrap().leak_report(0);
        assert!(rep.steps_observed >= 100, "{rep:?}");
        assert!(!rep.flagged, "{rep:?}");
        assert_eq!(rep.floor_slope_bytes_per_step, 0.0);
        assert!(rep.top_sizes.is_empty(), "{:?}", rep.top_sizes);
    }
}

#[test]
fn a_noisy_steady_loop_is_not_flagged() {
    let m = training_loop(200, false, true, true);
    let rep = m.process(KEY).unwrap().leak_report(0);
    assert!(rep.steps_observed >= 100, "{rep:?}");
    assert!(!rep.flagged, "{rep:?}");
    assert!(rep.trend.abs() < 0.6);
}

/// Without markers, a loop whose every allocation has a random size shows
/// no period: no steps and no verdict, rather than steps made up.
#[test]
fn random_sizes_without_markers_give_no_steps_rather_than_wrong_ones() {
    let m = training_loop(200, true, true, false);
    let rep = m.process(KEY).unwrap().leak_report(0);
    assert_eq!(rep.source, StepSource::None, "{rep:?}");
    assert!(!rep.flagged);
}

/// The steps found from the allocation pattern match the loop's own count
/// (±2 %), leaking or not.
#[test]
fn steps_from_the_allocation_pattern_match_the_loop() {
    for keep_loss in [false, true] {
        let m = training_loop(300, keep_loss, false, false);
        let rep = m.process(KEY).unwrap().leak_report(0);
        assert_eq!(rep.source, StepSource::AllocationPeriod);
        assert!(rep.steps_observed.abs_diff(300) <= 6, "{rep:?}");
        assert!(rep.step_confidence > 0.95, "{rep:?}");
        assert_eq!(rep.period_allocations, Some(7));
    }
}

#[test]
fn a_noisy_leaking_loop_is_still_flagged() {
    let m = training_loop(200, true, true, true);
    let rep = m.process(KEY).unwrap().leak_report(0);
    // The floor noise (64–576 KiB temporaries) dwarfs 512 B per step over a
    // 64-step window, so the floor test may not fire; the kept size is still named.
    assert_eq!(
        rep.top_sizes.first().map(|s| s.requested),
        Some(4),
        "{rep:?}"
    );
}

#[test]
fn too_few_steps_give_no_verdict() {
    let m = training_loop(5, true, false, true);
    let rep = m.process(KEY).unwrap().leak_report(0);
    assert!(!rep.flagged);
    assert!(rep.top_sizes.is_empty());
}

/// A reader that began mid-job names runs as the producer numbers them
/// (MARKER source 5's value), even before its anchor snapshot, and lists
/// no run of which it counted no step (issue 30, item 2).
#[test]
fn a_reader_that_began_mid_job_numbers_runs_as_the_producer() {
    use crate::model::Watch;
    use vramscope_wire::event::MarkSource;
    let mut m = model();
    m.watch(
        KEY,
        &Watch {
            began_ns: Some(1),
            mid_run: true,
            ring_starts: vec![500, 9_000],
            anchor_snapshot: None,
        },
    );
    let run = |value| Event {
        time_ns: value,
        kind: EventKind::Marker {
            value,
            source: MarkSource::Run,
        },
    };
    feed(&mut m, &[run(27), run(28)]);
    let p = m.process(KEY).unwrap();
    assert!(p.view(0, &Default::default()).watch.waiting_for_anchor);
    let report = p.leak_report(100);
    assert_eq!(report.run, 28);
    assert!(report.earlier_runs.is_empty(), "{:?}", report.earlier_runs);
}

/// What a healthy job does beside its steps (issue 26, item 3): none of
/// it may be taken for a leak by the survivor test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Beside {
    Nothing,
    /// Every step's logits kept until the next step ends (for logging).
    PreviousLogits,
    /// Gradients accumulated over 4 micro-batches per optimizer step.
    Accumulation,
    /// An evaluation pass every 10 steps.
    Evaluation,
    /// A cache that grows for 30 steps, then holds (e.g. a compile cache).
    GrowingThenStableCache,
    /// `torch.cuda.empty_cache()` every 25 steps.
    EmptyCache,
}

/// A loop whose floors swing by about half: each step keeps its random
/// 40–120 MiB activations alive into the next step's start. With `leak`,
/// 256 KiB of it stays alive for good, every step.
fn swinging_loop(steps: u64, leak: bool, beside: Beside) -> Model {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let mut rng = Rng(7);
    r.alloc(200 * MIB); // weights
    let mut carried: Option<u64> = None;
    let mut logits: Option<u64> = None;
    let mut cache = Vec::new();
    for step in 0..steps {
        let ev = r.ev.at(EventKind::Marker {
            value: step,
            source: Default::default(),
        });
        r.out.push(ev);
        let big = r.alloc(40 * MIB + rng.next() % (80 * MIB));
        if let Some(a) = carried.take() {
            r.free(a);
        }
        let micro = if beside == Beside::Accumulation { 4 } else { 1 };
        let mut grads = Vec::new();
        for _ in 0..micro {
            let acts: Vec<u64> = (0..4)
                .map(|_| r.alloc(2 * MIB + rng.next() % MIB))
                .collect();
            for a in acts.into_iter().rev() {
                r.free(a);
            }
            if grads.is_empty() {
                grads = (0..3).map(|_| r.alloc(4 * MIB)).collect();
            }
        }
        for g in grads {
            r.free(g);
        }
        if leak {
            r.alloc(256 * 1024);
        }
        match beside {
            Beside::PreviousLogits => {
                if let Some(l) = logits.replace(r.alloc(3 * MIB)) {
                    r.free(l);
                }
            }
            Beside::Evaluation if step % 10 == 9 => {
                let e: Vec<u64> = (0..6).map(|_| r.alloc(5 * MIB)).collect();
                for a in e {
                    r.free(a);
                }
            }
            Beside::GrowingThenStableCache if (5..35).contains(&step) => {
                cache.push(r.alloc(MIB + step * 4096));
            }
            Beside::EmptyCache if step % 25 == 24 => r.empty_cache(),
            _ => {}
        }
        carried = Some(big);
        feed(&mut m, &r.take());
    }
    m
}

#[test]
fn a_slow_leak_under_swinging_floors_is_flagged_by_its_survivors() {
    let m = swinging_loop(64, true, Beside::Nothing);
    let rep = m.process(KEY).unwrap().leak_report(0);
    assert!(rep.flagged, "{rep:?}");
    assert!(rep.survivors.flagged, "{:?}", rep.survivors);
    assert_eq!(rep.survivors.window_steps, 48);
    assert!(rep.flagged_at_step.unwrap() <= 64, "{rep:?}");
    // The same loop without the leak: the floors alone do not flag either.
    let m = swinging_loop(64, false, Beside::Nothing);
    let rep = m.process(KEY).unwrap().leak_report(0);
    assert!(!rep.flagged, "{rep:?}");
}

#[test]
fn healthy_loops_with_noise_are_never_flagged_in_300_steps() {
    for beside in [
        Beside::Nothing,
        Beside::PreviousLogits,
        Beside::Accumulation,
        Beside::Evaluation,
        Beside::GrowingThenStableCache,
        Beside::EmptyCache,
    ] {
        let m = swinging_loop(300, false, beside);
        let rep = m.process(KEY).unwrap().leak_report(0);
        assert!(rep.steps_observed >= 290, "{beside:?}: {rep:?}");
        assert!(!rep.flagged, "{beside:?}: {rep:?}");
        assert!(rep.flagged_at_step.is_none(), "{beside:?}: {rep:?}");
        assert!(!rep.survivors.flagged, "{beside:?}: {:?}", rep.survivors);
        // With the leak beside the same noise, it is flagged.
        let m = swinging_loop(300, true, beside);
        let rep = m.process(KEY).unwrap().leak_report(0);
        assert!(
            rep.flagged && rep.flagged_at_step.unwrap() <= 64,
            "{beside:?}: {rep:?}"
        );
    }
}

/// The producer states a memory limit of `limit` bytes on device 0 (a
/// memory fraction's: MARKER source 6).
fn state_limit(r: &mut RefAlloc, limit: u64) {
    let ev = r.ev.at(EventKind::Marker {
        value: limit,
        source: MarkSource::MemoryLimit {
            device: 0,
            whole_device: false,
        },
    });
    r.out.push(ev);
}

/// A loop that keeps 8 MiB a step, under a memory limit the producer
/// states (MARKER source 6): once the leak is flagged, the view forecasts
/// the step the allocator runs out at, from the room left over the growth;
/// the forecast moves as the steps pass and keeps its step. Without the
/// limit, no forecast.
#[test]
fn a_flagged_leak_forecasts_the_step_it_runs_out_at() {
    let limit = 2048 * MIB;
    let mut forecasts = Vec::new();
    for with_limit in [true, false] {
        let mut m = synced_model();
        let mut r = RefAlloc::new();
        r.alloc(64 * MIB); // weights
        if with_limit {
            state_limit(&mut r, limit);
        }
        for step in 0..60u64 {
            let ev = r.ev.at(EventKind::Marker {
                value: step,
                source: MarkSource::User,
            });
            r.out.push(ev);
            let acts: Vec<u64> = (0..4).map(|i| r.alloc((20 + i) * MIB)).collect();
            r.alloc(8 * MIB); // kept: the leak
            for a in acts.into_iter().rev() {
                r.free(a);
            }
            feed(&mut m, &r.take());
            let v = m.view(u64::MAX / 2, &ViewOptions::default());
            let p = &v.processes[0];
            if let Some(f) = p.forecast {
                forecasts.push((step, f, p.figures.reserved));
            }
        }
        if !with_limit {
            let v = m.view(u64::MAX / 2, &ViewOptions::default());
            assert!(v.processes[0].leak.flagged);
            assert!(v.processes[0].forecast.is_none());
        }
    }
    let (first_step, first, reserved) = forecasts[0];
    assert!(first_step < 20, "flagged late: step {first_step}");
    assert!(first.fraction);
    assert_eq!(first.limit, limit);
    // The step's largest request: the fourth activation.
    assert_eq!(first.request, Some(23 * MIB));
    assert_eq!(first.reserved, reserved);
    // The room left, in steps of the growth.
    let expect = (limit - reserved - 23 * MIB) / first.growth_per_step;
    assert!(first.steps_left.abs_diff(expect) <= 1, "{first:?}");
    // Two 8 MiB blocks fill a 20 MiB segment and nothing else fits its
    // last 4 MiB: reserved memory grows 10 MiB a step, more than the
    // floor's 8. Once reserved has been measured over enough steps the
    // forecast grows by that, and the step it names stays put.
    let last = forecasts.last().unwrap().1;
    assert!(
        last.growth_per_step.abs_diff(10 * MIB) * 50 <= 10 * MIB,
        "{last:?}"
    );
    let settled: Vec<u64> = forecasts
        .iter()
        .rev()
        .take(10)
        .map(|f| f.1.oom_step)
        .collect();
    assert!(
        settled.iter().all(|s| s.abs_diff(last.oom_step) <= 1),
        "{settled:?}"
    );
    // The first forecast, from the floor alone, was within 25 % of it.
    assert!(
        first.oom_step.abs_diff(last.oom_step) * 4 <= last.oom_step,
        "{first:?} {last:?}"
    );
}

/// A loop whose activations grow every step (a sequence length that keeps
/// rising): nothing outlives its step, so no leak is flagged, but the
/// cache cannot reuse the smaller blocks and reserved memory rises at
/// every boundary. Under a stated limit it is forecast, and says why; the
/// same loop at one size is not.
#[test]
fn reserved_memory_that_grows_every_step_is_forecast_without_a_leak() {
    let limit = 2048 * MIB;
    for growing in [true, false] {
        let mut m = synced_model();
        let mut r = RefAlloc::new();
        r.alloc(64 * MIB); // weights
        state_limit(&mut r, limit);
        let mut first = None;
        for step in 0..40u64 {
            let ev = r.ev.at(EventKind::Marker {
                value: step,
                source: MarkSource::User,
            });
            r.out.push(ev);
            let size = if growing {
                (30 + 2 * step) * MIB
            } else {
                30 * MIB
            };
            let a = r.alloc(size);
            r.free(a);
            feed(&mut m, &r.take());
            let v = m.view(u64::MAX / 2, &ViewOptions::default());
            let p = &v.processes[0];
            assert!(!p.leak.flagged, "step {step}: {:?}", p.leak);
            if let (Some(f), None) = (p.forecast, first) {
                first = Some((step, f));
            }
        }
        match (growing, first) {
            (true, Some((step, f))) => {
                assert_eq!(f.cause, crate::model::forecast::Cause::ReservedGrowth);
                // Four steps of warm-up, then nine boundaries that rose.
                assert!(step <= 15, "first forecast at step {step}");
                assert!(f.growth_per_step > 0 && f.oom_step > step, "{f:?}");
            }
            (false, None) => {}
            other => panic!("growing {growing}: {other:?}"),
        }
    }
}
