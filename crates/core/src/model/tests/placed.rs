//! Snapshots placed by ring positions, and attaching mid-run (FORMAT.md,
//! "Positions" and "Attaching mid-run").
use super::*;
use crate::model::device::Problem;
use crate::model::{Bounds, Watch};
use vramscope_wire::event::RingPos;
use vramscope_wire::event::RingSpan;

/// The device ring of device 0 (ring 0 is the agent's).
const RING: u32 = 1;

/// A workload on the reference allocator: live tensors and cached blocks,
/// growing segments, frees in another order than allocations.
fn work(r: &mut RefAlloc, n: u64, salt: u64) -> Vec<u64> {
    let mut live = Vec::new();
    for i in 0..n {
        let size = if (i + salt) % 3 == 0 {
            2 * MIB + (i + salt) * 4096
        } else {
            600 + (i + salt) * 96
        };
        live.push(r.alloc(size));
        if i % 3 == 2 {
            let a = live.remove((i as usize * 7) % live.len());
            r.free(a);
        }
    }
    live
}

/// Device events numbered from `first` in the device ring.
fn positioned(events: Vec<Event>, first: u64) -> Vec<(Event, RingPos)> {
    (events.into_iter().enumerate())
        .map(|(i, e)| {
            let position = first + i as u64;
            (
                e,
                RingPos {
                    ring: RING,
                    position,
                },
            )
        })
        .collect()
}

/// A snapshot of `r` placed at `before..after` of the device ring, its
/// records in the agent ring.
fn placed_snapshot(r: &mut RefAlloc, id: u32, before: u64, after: u64) -> Vec<(Event, RingPos)> {
    let mut snap = r.snapshot(id);
    if let EventKind::SnapshotBegin { at, .. } = &mut snap[0].kind {
        *at = Some(RingSpan {
            ring: RING as u8,
            before,
            after,
            exact: before == after,
            ambiguous: before < after,
        });
    }
    (snap.into_iter().enumerate())
        .map(|(i, e)| {
            (
                e,
                RingPos {
                    ring: 0,
                    position: 1_000 + i as u64,
                },
            )
        })
        .collect()
}

fn apply(m: &mut Model, batch: &[(Event, RingPos)]) {
    let (events, at): (Vec<Event>, Vec<RingPos>) = batch.iter().cloned().unzip();
    m.apply_all_at(KEY, &events, &at);
    for d in m.process(KEY).unwrap().devices() {
        d.check_invariants().unwrap();
    }
}

fn watch(m: &mut Model, device_ring_start: u64) {
    m.watch(
        KEY,
        &Watch {
            began_ns: Some(1),
            mid_run: device_ring_start > 0,
            ring_starts: vec![0, device_ring_start],
            anchor_snapshot: None,
        },
    );
}

#[test]
fn attaching_mid_run_holds_the_backlog_and_anchors_without_inconsistencies() {
    let mut r = RefAlloc::new();
    work(&mut r, 300, 0);
    let before = positioned(r.take(), 0);
    let n = before.len() as u64;
    // The reader came late: the ring kept only the second half.
    let start = n / 2;
    let backlog = &before[start as usize..];
    let mut m = model();
    watch(&mut m, start);
    apply(&mut m, backlog);
    let p = m.process(KEY).unwrap();
    assert!(p.view(0, &Default::default()).watch.waiting_for_anchor);
    assert_eq!(
        p.inconsistencies(),
        0,
        "held, not applied to an empty state"
    );
    assert!(m.needs_resync(KEY));

    // The anchor, taken at position n; events after it were drained before
    // its records arrived (another ring, another order).
    let snap = placed_snapshot(&mut r, 7, n, n);
    work(&mut r, 200, 1);
    let after = positioned(r.take(), n);
    let (early, late) = after.split_at(after.len() / 2);
    apply(&mut m, early);
    apply(&mut m, &snap);
    apply(&mut m, late);

    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 0);
    assert_eq!(p.lost_events(), 0);
    assert!(!m.needs_resync(KEY));
    assert!(!p.view(0, &Default::default()).watch.waiting_for_anchor);
    assert_eq!(rows(dev(&m)), r.rows());
    assert_eq!(dev(&m).derived().allocated, r.allocated());
}

#[test]
fn events_drained_after_the_snapshot_they_are_in_are_not_applied_twice() {
    let mut r = RefAlloc::new();
    let seed = placed_snapshot(&mut r, 1, 0, 0);
    let mut m = model();
    watch(&mut m, 0);
    apply(&mut m, &seed);
    work(&mut r, 200, 2);
    let ev = positioned(r.take(), 0);
    let n = ev.len() as u64;
    let snap = placed_snapshot(&mut r, 2, n, n);
    work(&mut r, 100, 3);
    let more = positioned(r.take(), n);
    // The agent ring was drained first: the snapshot arrives before the
    // events it already reflects, then the later ones.
    apply(&mut m, &ev[..10]);
    apply(&mut m, &snap);
    apply(&mut m, &ev[10..]);
    apply(&mut m, &more);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 0);
    assert_eq!(rows(dev(&m)), r.rows());
    // The snapshot waited for its ring to reach it (issue 44, item 4): the
    // events below it went on the state it replaced, and the last of them,
    // which brought the ring there, was dropped as already in it.
    assert_eq!(dev(&m).reflected_events(), 1);
    assert_eq!(p.snapshots_installed(), 2);
}

/// Issue 44, item 4: a producer's snapshot placed a billion records past
/// its device ring's head (`before = after = head + 10^9`). Installed, it
/// dropped every later event as already in it: allocated 0, no problem
/// said, nothing to resync. Now it waits for its ring to reach it; the
/// first record below its position written after it proves the position
/// false: refused, said (a problem, the resync flag), and the events are
/// held for an anchor that holds.
#[test]
fn item4_an_anchor_past_the_rings_head_is_refused_and_said() {
    let mut r = RefAlloc::new();
    work(&mut r, 100, 8);
    let backlog = positioned(r.take(), 0);
    let head = backlog.len() as u64;
    // Attached mid-run at the head; the lying snapshot, then the job's
    // next events, written after it.
    let mut m = model();
    watch(&mut m, head);
    let lie = placed_snapshot(&mut r, 9, head + 1_000_000_000, head + 1_000_000_000);
    apply(&mut m, &lie);
    let p = m.process(KEY).unwrap();
    assert!(p.view(0, &Default::default()).watch.waiting_for_anchor);
    let mut later = RefAlloc::new();
    std::mem::swap(&mut later, &mut r);
    work(&mut later, 40, 9);
    let mut after = positioned(later.take(), head);
    for (e, _) in &mut after {
        e.time_ns += 10_000_000_000; // written well after the snapshot ended
    }
    apply(&mut m, &after);
    let p = m.process(KEY).unwrap();
    let v = p.view(0, &Default::default());
    assert_eq!(p.snapshots_installed(), 0);
    assert_eq!(p.snapshots_discarded(), 1);
    assert!(v.needs_resync, "the SYNC flag");
    assert!(v.watch.waiting_for_anchor);
    assert_eq!(
        p.last_problem().map(|r| r.problem),
        Some(Problem::AnchorPastHead {
            ring: RING as u8,
            before: head + 1_000_000_000,
            reached: Some(head),
        })
    );
    // An honest snapshot anchors the held events.
    let n = head + after.len() as u64;
    let honest = placed_snapshot(&mut later, 10, n, n);
    apply(&mut m, &honest);
    let p = m.process(KEY).unwrap();
    assert!(!p.view(0, &Default::default()).watch.waiting_for_anchor);
    assert_eq!(rows(dev(&m)), later.rows());
    assert_eq!(dev(&m).derived().allocated, later.allocated());
}

#[test]
fn an_anchor_older_than_the_reader_start_is_refused_and_a_newer_one_used() {
    let mut r = RefAlloc::new();
    work(&mut r, 100, 4);
    let first = positioned(r.take(), 0);
    let old = placed_snapshot(&mut r, 3, first.len() as u64, first.len() as u64);
    work(&mut r, 100, 5);
    let second = positioned(r.take(), first.len() as u64);
    let n = (first.len() + second.len()) as u64;
    // The reader started inside `second`: the old snapshot's records are
    // still in the agent ring, but events after it are gone.
    let start = first.len() as u64 + 5;
    let mut m = model();
    watch(&mut m, start);
    apply(&mut m, &old);
    apply(&mut m, &second[5..]);
    let p = m.process(KEY).unwrap();
    assert!(p.view(0, &Default::default()).watch.waiting_for_anchor);
    assert_eq!(p.inconsistencies(), 0);
    let new = placed_snapshot(&mut r, 4, n, n);
    apply(&mut m, &new);
    assert!(!m.needs_resync(KEY));
    assert_eq!(rows(dev(&m)), r.rows());
}

#[test]
fn an_ambiguous_window_is_resolved_whatever_prefix_the_snapshot_reflects() {
    let mut r = RefAlloc::new();
    let live = work(&mut r, 120, 6);
    let prefix = positioned(r.take(), 0);
    let p0 = prefix.len() as u64;
    // While the state was read: new allocations, then frees of older tensors.
    for i in 0..12 {
        r.alloc(MIB + i * 8192);
    }
    for a in live.iter().step_by(2).take(10) {
        r.free(*a);
    }
    let window = positioned(r.take(), p0);
    let q = p0 + window.len() as u64;
    let seed = placed_snapshot(&mut RefAlloc::new(), 1, 0, 0);
    for k in 0..=window.len() {
        // The truth: the state after the first k events of the window.
        let mut truth = model();
        watch(&mut truth, 0);
        apply(&mut truth, &seed);
        apply(&mut truth, &prefix);
        apply(&mut truth, &window[..k]);
        let snap = snapshot_of(dev(&truth), 2, p0, q);

        let mut m = model();
        watch(&mut m, 0);
        apply(&mut m, &seed);
        apply(&mut m, &prefix[..prefix.len() / 2]);
        apply(&mut m, &snap);
        apply(&mut m, &prefix[prefix.len() / 2..]);
        apply(&mut m, &window);
        let p = m.process(KEY).unwrap();
        assert_eq!(
            p.inconsistencies(),
            0,
            "k = {k} of {}: {:?}; window {:?}",
            window.len(),
            p.view(0, &Default::default()).last_problem,
            window.iter().map(|(e, _)| &e.kind).collect::<Vec<_>>()
        );
        assert_eq!(rows(dev(&m)), r.rows(), "k = {k}");
    }
}

/// The snapshot records a producer would write for the state `d`, placed
/// at `before..after` of the device ring.
fn snapshot_of(d: &DeviceState, id: u32, before: u64, after: u64) -> Vec<(Event, RingPos)> {
    let blocks = d.blocks().count() as u64;
    let mut out = vec![EventKind::SnapshotBegin {
        device: 0,
        id,
        segments: d.segments().count() as u64,
        blocks,
        at: Some(RingSpan {
            ring: RING as u8,
            before,
            after,
            exact: false,
            ambiguous: true,
        }),
    }];
    for s in d.segments() {
        out.push(EventKind::SnapshotSegment {
            id,
            place: place(0, s.stream),
            addr: s.addr,
            size: s.size,
            pool_kind: s.pool_kind,
            expandable: s.expandable,
        });
        for (addr, b) in d.blocks_of(s) {
            out.push(EventKind::SnapshotBlock {
                id,
                device: 0,
                addr,
                size: b.size,
                requested: b.requested,
                state: b.state,
                ctx: Default::default(),
            });
        }
    }
    out.push(EventKind::SnapshotEnd { device: 0, id });
    (out.into_iter().enumerate())
        .map(|(i, kind)| {
            let e = Event {
                time_ns: 9_000_000 + i as u64,
                kind,
            };
            (
                e,
                RingPos {
                    ring: 0,
                    position: 5_000 + i as u64,
                },
            )
        })
        .collect()
}

/// A hostile `watch` (a recording can say anything) keeps at most one start
/// per ring a byte can name.
#[test]
fn a_watch_with_a_million_ring_starts_keeps_256() {
    let mut m = model();
    m.watch(
        KEY,
        &Watch {
            began_ns: Some(1),
            mid_run: true,
            ring_starts: vec![7; 1 << 20],
            anchor_snapshot: None,
        },
    );
    assert_eq!(m.process(KEY).unwrap().watching().ring_starts.len(), 256);
}

#[test]
fn an_anchor_whose_later_events_the_log_let_go_of_is_refused_and_a_newer_one_used() {
    let mut r = RefAlloc::new();
    let seed = placed_snapshot(&mut r, 1, 0, 0);
    // The log keeps 50 events (the history shows none).
    let cfg = ModelConfig {
        recent_events: 0,
        bounds: Bounds {
            replay: 50,
            ..Bounds::default()
        },
        ..ModelConfig::default()
    };
    let mut m = Model::new(cfg);
    watch(&mut m, 0);
    apply(&mut m, &seed);
    work(&mut r, 30, 6);
    let first = positioned(r.take(), 0);
    let old = placed_snapshot(&mut r, 2, first.len() as u64, first.len() as u64);
    work(&mut r, 100, 7);
    let second = positioned(r.take(), first.len() as u64);
    assert!(second.len() > 50);
    let n = (first.len() + second.len()) as u64;
    apply(&mut m, &first);
    apply(&mut m, &second);
    // The old snapshot's records come late: the events after it are no
    // longer all in the log, so installing it would lose some.
    apply(&mut m, &old);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.snapshots_discarded(), 1);
    assert_eq!(p.inconsistencies(), 0);
    let new = placed_snapshot(&mut r, 3, n, n);
    apply(&mut m, &new);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.snapshots_discarded(), 1);
    assert_eq!(rows(dev(&m)), r.rows());
    // The history shows none of it, the OOM context and placement aside.
    let all = crate::model::ViewOptions {
        recent_events: usize::MAX,
        ..Default::default()
    };
    assert!(p.view(0, &all).recent_events.is_empty());
}
