//! Loss, contradictions and snapshot re-synchronisation.
use super::*;
use crate::model::Problem;

/// A workload on the reference allocator: some live tensors, some cached.
fn workload(r: &mut RefAlloc, n: u64) -> Vec<u64> {
    let mut live = Vec::new();
    for i in 0..n {
        let a = r.alloc(if i % 3 == 0 {
            3 * MIB + i * 512
        } else {
            700 + i * 64
        });
        live.push(a);
        if i % 4 == 1 {
            let a = live.remove(0);
            r.free(a);
        }
    }
    live
}

#[test]
fn fresh_process_needs_a_seed_snapshot() {
    let mut m = model();
    let mut r = RefAlloc::new();
    workload(&mut r, 10);
    let events = r.take();
    // Attached late: the events alone (first half missing) leave it untrusted.
    feed(&mut m, &events[events.len() / 2..]);
    assert!(m.needs_resync(KEY));
    assert_eq!(m.resync_wanted().collect::<Vec<_>>(), vec![KEY]);
    feed(&mut m, &r.snapshot(1));
    assert!(!m.needs_resync(KEY));
    assert_eq!(rows(dev(&m)), r.rows());
    assert_eq!(m.resync_wanted().count(), 0);
}

#[test]
fn snapshot_requests_are_rate_limited() {
    const S: u64 = 1_000_000_000;
    let mut m = model();
    // Unknown processes are not due, and a request for one creates nothing.
    assert!(m.resync_due(0).is_empty());
    m.resync_requested(KEY, 0);
    assert!(m.process(KEY).is_none());

    let mut r = RefAlloc::new();
    workload(&mut r, 4);
    feed(&mut m, &r.take());
    let t0 = 100 * S;
    assert_eq!(m.resync_due(t0), vec![KEY], "never asked: due at once");
    m.resync_requested(KEY, t0);
    assert_eq!(m.process(KEY).unwrap().last_resync_request(), Some(t0));
    assert!(m.resync_due(t0).is_empty());
    assert!(m.resync_due(t0 + 2 * S - 1).is_empty());
    assert_eq!(m.resync_due(t0 + 2 * S), vec![KEY]);
    // Still wanted throughout: the limit is on asking, not on wanting.
    assert_eq!(m.resync_wanted().collect::<Vec<_>>(), vec![KEY]);
    // A clock that went back does not hold the request back.
    assert_eq!(m.resync_due(t0 - 1), vec![KEY]);

    // Not due while a snapshot is in flight, nor once it is installed.
    let snap = r.snapshot(1);
    m.apply_all(KEY, &snap[..1]);
    assert!(m.resync_due(t0 + 10 * S).is_empty());
    assert_eq!(m.resync_wanted().count(), 0);
    m.apply_all(KEY, &snap[1..]);
    assert!(!m.needs_resync(KEY));
    assert!(m.resync_due(t0 + 10 * S).is_empty());

    // The interval is configurable.
    let mut m = Model::new(ModelConfig {
        resync_interval_ns: 5 * S,
        ..ModelConfig::default()
    });
    workload(&mut r, 2);
    feed(&mut m, &r.take());
    m.resync_requested(KEY, t0);
    assert!(m.resync_due(t0 + 4 * S).is_empty());
    assert_eq!(m.resync_due(t0 + 5 * S), vec![KEY]);
}

#[test]
fn loss_then_snapshot_restores_exact_state() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let live = workload(&mut r, 12);
    feed(&mut m, &r.take());
    assert_eq!(rows(dev(&m)), r.rows());

    // More work, but a chunk of its events is lost on the wire.
    for &a in &live[..4] {
        r.free(a);
    }
    workload(&mut r, 6);
    let events = r.take();
    let (kept_a, rest) = events.split_at(3);
    let (lost, kept_b) = rest.split_at(rest.len() / 2);
    m.apply_all(KEY, kept_a);
    m.note_loss(KEY, lost.len() as u64);
    m.apply_all(KEY, kept_b);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.lost_events(), lost.len() as u64);
    assert!(p.needs_resync());
    assert_ne!(rows(dev(&m)), r.rows(), "the map is wrong after loss");

    feed(&mut m, &r.snapshot(9));
    let p = m.process(KEY).unwrap();
    assert!(!p.needs_resync());
    assert_eq!(p.snapshots_installed(), 2);
    assert_eq!(rows(dev(&m)), r.rows());
    let d = dev(&m).derived();
    assert_eq!(
        (d.allocated, d.active, d.reserved),
        (r.allocated(), r.active(), r.reserved())
    );

    // Events after the snapshot apply cleanly on the restored map.
    let before = m.process(KEY).unwrap().inconsistencies();
    workload(&mut r, 8);
    feed(&mut m, &r.take());
    assert_eq!(rows(dev(&m)), r.rows());
    assert_eq!(m.process(KEY).unwrap().inconsistencies(), before);
}

#[test]
fn contradictions_are_counted_and_fixed_by_the_next_snapshot() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    workload(&mut r, 8);
    feed(&mut m, &r.take());
    let mut e = Ev::new();
    e.t = r.ev.t;
    let far = BASE + (1 << 40);
    let bad = [
        e.free_req(far, 512),             // free of an unknown address
        e.seg_free(far, 2 * MIB),         // segment free of an unknown segment
        e.alloc(far + 4096, 1000),        // block outside any segment (orphan)
        e.seg_alloc(BASE + MIB, 4 * MIB), // overlaps known segments
    ];
    m.apply_all(KEY, &bad);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 4);
    assert!(p.needs_resync());
    assert!(matches!(
        p.last_problem().unwrap().problem,
        Problem::OverlappingSegment { .. }
    ));
    assert_eq!(dev(&m).orphans().count(), 1);
    for d in p.devices() {
        d.check_invariants().unwrap();
    }
    assert_ne!(dev(&m).derived().reserved, r.reserved());

    feed(&mut m, &r.snapshot(2));
    let p = m.process(KEY).unwrap();
    assert!(!p.needs_resync());
    assert_eq!(p.inconsistencies(), 4, "the count is history");
    assert_eq!(rows(dev(&m)), r.rows());
    assert_eq!(dev(&m).orphans().count(), 0);
    let f = p.figures(r.ev.t);
    assert_eq!((f.allocated, f.reserved), (r.allocated(), r.reserved()));
}

#[test]
fn incomplete_snapshots_are_discarded() {
    let mut m = model();
    let mut r = RefAlloc::new();
    workload(&mut r, 8);
    let _ = r.take();
    let snap = r.snapshot(3);
    assert!(snap.len() > 4);

    // A block record missing.
    let mut short = snap.clone();
    short.remove(3);
    feed(&mut m, &short);
    let p = m.process(KEY).unwrap();
    assert!(p.needs_resync());
    assert_eq!((p.snapshots_installed(), p.snapshots_discarded()), (0, 1));
    assert_eq!(dev(&m).segments().count(), 0, "nothing installed");

    // Loss reported between begin and end.
    m.apply_all(KEY, &snap[..4]);
    m.note_loss(KEY, 1);
    m.apply_all(KEY, &snap[4..]);
    let p = m.process(KEY).unwrap();
    assert!(p.needs_resync());
    assert_eq!(p.snapshots_discarded(), 2);

    // An end with another id, and records of another snapshot id.
    let mut wrong = snap.clone();
    let last = wrong.len() - 1;
    wrong[last].kind = EventKind::SnapshotEnd { device: 0, id: 99 };
    feed(&mut m, &wrong);
    assert_eq!(m.process(KEY).unwrap().snapshots_discarded(), 3);

    // A block outside the segment it follows.
    let mut outside = snap.clone();
    if let EventKind::SnapshotBlock { addr, .. } = &mut outside[2].kind {
        *addr += 1 << 40;
    }
    feed(&mut m, &outside);
    assert_eq!(m.process(KEY).unwrap().snapshots_discarded(), 4);
    assert!(m.needs_resync(KEY));

    // The complete one is installed.
    feed(&mut m, &snap);
    assert!(!m.needs_resync(KEY));
    assert_eq!(rows(dev(&m)), r.rows());
}

#[test]
fn events_during_a_snapshot_are_replayed_on_it() {
    let mut m = model();
    let mut r = RefAlloc::new();
    workload(&mut r, 6);
    let _ = r.take();
    let snap = r.snapshot(5);
    // Work that happens after the snapshot was taken, written while the
    // snapshot records are still being written.
    let a = r.alloc(5000);
    r.free(a);
    r.alloc(6 * MIB);
    let during = r.take();
    let mut stream = snap[..3].to_vec();
    stream.extend(during);
    stream.extend_from_slice(&snap[3..]);
    feed(&mut m, &stream);
    assert!(!m.needs_resync(KEY));
    assert_eq!(rows(dev(&m)), r.rows());
}

#[test]
fn lasting_drift_from_stats_asks_for_resync() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    workload(&mut r, 6);
    feed(&mut m, &r.take());
    let stats = |allocated, reserved| Stats {
        allocated,
        reserved,
        ..Stats::default()
    };
    let mut e = Ev::new();
    e.t = r.ev.t;
    // Matching samples (current or recent totals) are fine.
    let ok = stats(r.allocated(), r.reserved());
    for _ in 0..5 {
        m.apply(KEY, &e.stats(ok));
    }
    assert!(!m.needs_resync(KEY));
    // Two stray samples are tolerated (sampling skew); three in a row are drift.
    let off = stats(r.allocated() + 512, r.reserved());
    for (sample, drift) in [
        (off, false),
        (ok, false),
        (off, false),
        (off, false),
        (off, true),
    ] {
        m.apply(KEY, &e.stats(sample));
        assert_eq!(m.needs_resync(KEY), drift);
    }
    let p = m.process(KEY).unwrap();
    assert!(p.needs_resync());
    assert!(matches!(
        p.last_problem().unwrap().problem,
        Problem::Drift { .. }
    ));
    // Headline figures come from the stats meanwhile.
    assert_eq!(p.figures(e.t).allocated, r.allocated() + 512);
}
