//! Figures, peaks, OOM records, events/s and the serialisable view.
use super::*;
use crate::model::view::FigureSource;
use crate::model::{Mode, TimelineRequest, ViewOptions};
use vramscope_wire::event::Stats;

#[test]
fn headline_from_block_map_then_stats() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let a = r.alloc(3 * MIB);
    r.alloc(100);
    r.free(a);
    feed(&mut m, &r.take());
    let p = m.process(KEY).unwrap();
    let f = p.device_figures(dev(&m));
    assert_eq!(f.source, FigureSource::BlockMap);
    assert_eq!((f.allocated, f.reserved), (512, 22 * MIB));
    // Inactive split: the small segment's free tail; the large segment is
    // whole again (not split) so it does not count.
    assert_eq!(f.fragmentation.inactive_split, 2 * MIB - 512);
    assert_eq!(f.fragmentation.largest_free_large, Some(20 * MIB));
    assert_eq!(f.fragmentation.largest_free_small, Some(2 * MIB - 512));
    assert_eq!(f.fragmentation.free_blocks, 2);
    assert!(
        (f.fragmentation.share_of_reserved.unwrap()
            - (2.0 * MIB as f64 - 512.0) / (22.0 * MIB as f64))
            .abs()
            < 1e-9
    );
    assert_eq!(f.peak_allocated, 3 * MIB + 512);

    let s = Stats {
        allocated: 512,
        reserved: 22 * MIB,
        active: 512,
        allocated_peak: 9 * MIB,
        ..Stats::default()
    };
    let mut e = Ev::new();
    e.t = r.ev.t;
    m.apply(KEY, &e.stats(s));
    let f = m.process(KEY).unwrap().device_figures(dev(&m));
    assert_eq!(f.source, FigureSource::Stats);
    assert_eq!(f.peak_allocated, 9 * MIB);
}

/// The reserved total the step forecast takes at each step boundary
/// (`DeviceState::reserved_figure`, no block summary) is the one the
/// figures show: the block map's, then the statistics sample's.
#[test]
fn the_forecast_takes_the_reserved_figure_shown() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    r.alloc(3 * MIB);
    feed(&mut m, &r.take());
    let d = dev(&m);
    let shown = m.process(KEY).unwrap().device_figures(d).reserved;
    assert_eq!((d.reserved_figure(), shown), (20 * MIB, 20 * MIB));
    let s = Stats {
        allocated: 3 * MIB,
        reserved: 40 * MIB,
        active: 3 * MIB,
        ..Stats::default()
    };
    let mut e = Ev::new();
    e.t = r.ev.t;
    m.apply(KEY, &e.stats(s));
    let d = dev(&m);
    let shown = m.process(KEY).unwrap().device_figures(d).reserved;
    assert_eq!((d.reserved_figure(), shown), (40 * MIB, 40 * MIB));
}

#[test]
fn non_pytorch_remainder_absent_without_nvml() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    r.alloc(5 * MIB);
    feed(&mut m, &r.take());
    let f = m.process(KEY).unwrap().figures(r.ev.t);
    assert_eq!(f.nvml_used, None);
    assert_eq!(f.non_pytorch, None);
    m.note_nvml(KEY, r.ev.t, 500 * MIB);
    let f = m.process(KEY).unwrap().figures(r.ev.t);
    assert_eq!(f.nvml_used, Some(500 * MIB));
    assert_eq!(f.non_pytorch, Some((480 * MIB) as i64));
}

/// Issue 10, item 4: NVML's reading is paired with the reserved bytes of
/// the same instant, not with whatever reserved is when it is shown; a
/// remainder that would be negative is absent, never shown as true.
#[test]
fn non_pytorch_pairs_nvml_with_reserved_of_the_same_instant() {
    let mut m = model();
    let mut e = Ev::new();
    let stats = |reserved| Stats {
        reserved,
        allocated: reserved / 2,
        ..Stats::default()
    };
    m.apply(KEY, &e.stats(stats(1 << 30)));
    m.note_nvml(KEY, e.t, (3 << 30) / 2);
    // Reserved grows after NVML's reading (NVML is read once a second).
    m.apply(KEY, &e.stats(stats(3 << 30)));
    let f = m.process(KEY).unwrap().figures(e.t);
    assert_eq!(f.reserved, 3 << 30);
    assert_eq!(
        f.non_pytorch,
        Some(1 << 29),
        "used − reserved at the reading"
    );
    // A reading below what the allocator held then: not a figure.
    m.note_nvml(KEY, e.t, 1 << 30);
    assert_eq!(m.process(KEY).unwrap().figures(e.t).non_pytorch, None);
}

/// Issue 10, item 5: a process lists the devices it uses, not every one its
/// agent sees (a DDP rank on GPU 1 also reports all-zero figures for GPU 0).
#[test]
fn devices_never_used_are_not_listed() {
    let mut m = model();
    let mut e = Ev::new();
    m.apply(KEY, &e.stats(Stats::default()));
    e.place = place(1, 0);
    let used = Stats {
        reserved: 20 * MIB,
        reserved_peak: 20 * MIB,
        allocated: MIB,
        allocated_peak: MIB,
        segments: 1,
        ..Stats::default()
    };
    m.apply(KEY, &e.stats(used));
    let v = m.process(KEY).unwrap().view(e.t, &ViewOptions::default());
    let listed: Vec<u16> = v.devices.iter().map(|d| d.figures.device).collect();
    assert_eq!(listed, vec![1]);
    assert_eq!(v.figures.reserved, 20 * MIB);
    // A device used once and emptied since stays listed (its peak says so).
    e.place = place(1, 0);
    let emptied = Stats {
        reserved_peak: 20 * MIB,
        allocated_peak: MIB,
        ..Stats::default()
    };
    m.apply(KEY, &e.stats(emptied));
    let v = m.process(KEY).unwrap().view(e.t, &ViewOptions::default());
    assert_eq!(v.devices.len(), 1);
}

#[test]
fn peaks_and_reset() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let a = r.alloc(30 * MIB);
    r.free(a);
    r.empty_cache();
    feed(&mut m, &r.take());
    m.note_nvml(KEY, 1, 900 * MIB);
    m.note_nvml(KEY, 2, 400 * MIB);
    let f = m.process(KEY).unwrap().figures(r.ev.t);
    assert_eq!(
        (f.allocated, f.peak_allocated, f.peak_reserved),
        (0, 30 * MIB, 30 * MIB)
    );
    assert_eq!(f.nvml_peak, Some(900 * MIB));
    m.reset_peaks(KEY);
    let f = m.process(KEY).unwrap().figures(r.ev.t);
    assert_eq!(
        (f.peak_allocated, f.peak_reserved, f.nvml_peak),
        (0, 0, Some(400 * MIB))
    );
}

#[test]
fn oom_record_has_context() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let mut keep = Vec::new();
    for i in 0..40u64 {
        let a = r.alloc(4 * MIB);
        if i % 2 == 0 {
            keep.push(a);
        } else {
            r.free(a);
        }
    }
    feed(&mut m, &r.take());
    let oom = r.ev.at(EventKind::Oom {
        place: place(0, 0),
        device_free: 3 * MIB,
        request: 64 * MIB,
    });
    m.apply(KEY, &oom);
    let p = m.process(KEY).unwrap();
    let o = p.ooms().next().expect("an OOM record");
    assert_eq!((o.request, o.device_free), (64 * MIB, 3 * MIB));
    assert_eq!(o.recent.len(), 32);
    assert!(matches!(
        o.recent.last().unwrap().kind,
        EventKind::FreeCompleted { .. }
    ));
    let largest = dev(&m)
        .blocks()
        .filter(|(_, b)| b.state == BlockState::Inactive)
        .map(|(_, b)| b.size)
        .max();
    assert_eq!(o.largest_free_in_pool, largest);
    assert_eq!(o.allocated, r.allocated());
}

#[test]
fn events_per_second_and_view_round_trip() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    for _ in 0..100 {
        let a = r.alloc(1000);
        r.free(a);
    }
    let events = r.take();
    // 300 events over 0.3 ms of writer time.
    let t_end = events.last().unwrap().time_ns;
    feed(&mut m, &events);
    m.set_mode(KEY, Mode::Exact);
    let eps = m
        .process(KEY)
        .unwrap()
        .figures(t_end)
        .events_per_sec
        .unwrap();
    assert!(eps > 1_000.0, "{eps}");

    let opts = ViewOptions {
        block_map: true,
        recent_events: 10,
        timeline: Some(TimelineRequest {
            from_ns: 0,
            to_ns: t_end + 1,
            columns: 40,
        }),
    };
    let v = m.view(t_end, &opts);
    assert_eq!(v.processes.len(), 1);
    let pv = &v.processes[0];
    assert_eq!(pv.recent_events.len(), 10);
    assert_eq!(pv.devices[0].segments.len(), 1);
    let tl = pv.devices[0].timeline.as_ref().unwrap();
    assert_eq!(tl.allocated.len(), 40);
    assert_eq!(
        tl.allocated.iter().flatten().map(|c| c.max).max(),
        Some(1024)
    );
    assert!(pv.memory_bytes > 0);
    let json = serde_json::to_string(&v).unwrap();
    let back: crate::model::ModelView = serde_json::from_str(&json).unwrap();
    assert_eq!(back, v);
}

#[test]
fn item_08_figures_near_u64_max_saturate_and_are_flagged() {
    use crate::model::Problem;
    const HALF: u64 = 1 << 63;
    // Two allocations of 2^63 bytes (outside any segment): the allocated
    // total saturates (it used to wrap to 0 under a peak of 2^63) and is
    // flagged, not shown as true.
    let mut m = model();
    let mut e = Ev::new();
    m.apply(KEY, &e.alloc(0x1000, HALF));
    m.apply(KEY, &e.alloc(0x2000, HALF));
    let p = m.process(KEY).unwrap();
    let f = p.device_figures(dev(&m));
    assert_eq!(f.allocated, u64::MAX);
    assert!(f.implausible.saturated);
    assert!(f.peak_allocated >= f.allocated, "peak below current");
    assert!(p.figures(0).implausible.saturated);
    assert!(matches!(
        p.last_problem().unwrap().problem,
        Problem::Overflow { addr: 0x2000, .. }
    ));

    // A block whose end is past u64::MAX: cut there, flagged.
    let mut m = model();
    let mut e = Ev::new();
    m.apply(KEY, &e.alloc(u64::MAX - 100, 4096));
    let p = m.process(KEY).unwrap();
    let (addr, b) = dev(&m).orphans().next().unwrap();
    assert!(addr.checked_add(b.size).is_some());
    assert!(p.device_figures(dev(&m)).implausible.saturated);
    assert!(matches!(
        p.last_problem().unwrap().problem,
        Problem::Overflow { .. }
    ));
    // So is a segment.
    m.apply(KEY, &e.seg_alloc(u64::MAX - 1000, 1 << 20));
    let d = dev(&m);
    assert_eq!(d.segments().next().unwrap().end(), u64::MAX);
    d.check_invariants().unwrap();

    // A statistics sample that cannot be true: inactive split above
    // reserved (a "share of 200 %"), peaks below current figures.
    let mut m = model();
    let mut e = Ev::new();
    let s = Stats {
        allocated: 10 * MIB,
        reserved: 10 * MIB,
        active: 10 * MIB,
        inactive_split: 20 * MIB,
        allocated_peak: HALF,
        reserved_peak: 1,
        active_peak: HALF,
        ..Stats::default()
    };
    m.apply(KEY, &e.stats(s));
    let f = m.process(KEY).unwrap().device_figures(dev(&m));
    assert_eq!(f.fragmentation.share_of_reserved, None);
    assert!(f.implausible.share_above_100);
    assert!(f.implausible.peak_below_current);

    // Sums over devices and NVML's remainder saturate too.
    let mut m = model();
    for device in 0..2 {
        let mut e = Ev::new();
        e.place = place(device, 0);
        let s = Stats {
            allocated: HALF,
            reserved: HALF,
            active: HALF,
            allocated_peak: HALF,
            reserved_peak: HALF,
            active_peak: HALF,
            ..Stats::default()
        };
        m.apply(KEY, &e.stats(s));
    }
    m.note_nvml(KEY, 1, u64::MAX);
    let f = m.process(KEY).unwrap().figures(0);
    assert_eq!(f.reserved, u64::MAX);
    assert_eq!(f.allocated, u64::MAX);
    assert!(f.implausible.saturated);
    assert!(!m
        .process(KEY)
        .unwrap()
        .device_figures(dev(&m))
        .implausible
        .any());
    assert_eq!(f.non_pytorch, Some(0));
    m.note_nvml(KEY, 2, u64::MAX);
    let mut m2 = model();
    m2.note_nvml(KEY, 1, u64::MAX);
    let f = m2.process(KEY).unwrap().figures(0);
    assert_eq!(f.non_pytorch, Some(i64::MAX));
}

/// What the producer says it dropped of its records outside the caching
/// allocator (DROPPED `what` 8, a running count) is counted with what the
/// model refused, in `dropped.outside`; an older, lower count changes
/// nothing.
#[test]
fn the_producers_outside_drops_are_counted() {
    use vramscope_wire::event::{DropWhat, Library, Outside, OutsideKind, OutsideOp};
    let mut m = synced_model();
    let mut e = Ev::new();
    let too_big = Outside {
        op: OutsideOp::Alloc,
        device: 0,
        library: Library::Cublas,
        kind: OutsideKind::Allocation,
        addr: 0x1000,
        bytes: u64::MAX,
        name: [0; 24],
    };
    m.apply(KEY, &e.at(EventKind::Outside(too_big)));
    for count in [7, 5] {
        let drop = EventKind::Dropped {
            device: 0xffff,
            what: DropWhat::Outside,
            count,
            bound: 0,
        };
        m.apply(KEY, &e.at(drop));
    }
    let p = m.process(KEY).unwrap();
    assert_eq!(p.dropped().outside, 1 + 7);
    assert!(
        p.view(e.t, &ViewOptions::default()).dropped.outside == 8,
        "the view says it too"
    );
}
