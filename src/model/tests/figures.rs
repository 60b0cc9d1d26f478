//! Figures, peaks, OOM records, events/s and the serialisable view.
use super::*;
use crate::event::Stats;
use crate::model::view::FigureSource;
use crate::model::{Mode, TimelineRequest, ViewOptions};

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
