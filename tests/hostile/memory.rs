//! Hostile inputs: memory. A flood of allocations at new addresses outside
//! every known segment (orphans), applied straight to the model, must leave
//! the model's memory within its bounds, with what was dropped counted and
//! shown; the collector's own drop counts (`Input::Dropped`) reach the view.

use vramscope_collect::Hub;
use vramscope_core::input::{EventBatch, Input};
use vramscope_core::model::{Bounds, Model, ModelConfig, ProcessKey, ViewOptions};
use vramscope_wire::event::{Event, EventKind, Place};

const KEY: ProcessKey = ProcessKey {
    pid: 7,
    start_time: 7,
};
const MIB: usize = 1 << 20;

/// This process's resident set size in bytes (`VmRSS`), if readable.
fn rss() -> Option<usize> {
    crate::common::proc_status::status_bytes("self", "VmRSS:").map(|b| b as usize)
}

/// `n` allocations of 512 bytes at new addresses no segment holds,
/// starting at event `from`.
fn orphans(from: u64, n: u64) -> Vec<Event> {
    (from..from + n)
        .map(|i| Event {
            time_ns: 1_000 + i * 100,
            kind: EventKind::Alloc {
                place: Place::default(),
                addr: 0x7f00_0000_0000 + i * 512,
                size: 512,
            },
        })
        .collect()
}

/// Runs the test named `name` of this binary alone in a child process
/// (`CHILD` set), so that an RSS it measures is its own and not that of
/// the tests running beside it; true in the child.
fn in_a_process_of_its_own(name: &str) -> bool {
    const CHILD: &str = "VRAMSCOPE_TEST_ALONE";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} in a process of its own:\n{text}"
    );
    assert!(text.contains("1 passed"), "{name} did not run:\n{text}");
    false
}

#[test]
fn item_07_orphan_flood_is_bounded_and_counted() {
    if !in_a_process_of_its_own("memory::item_07_orphan_flood_is_bounded_and_counted") {
        return;
    }
    const FLOOD: u64 = 4_000_000;
    const BATCH: u64 = 100_000;
    let bounds = Bounds::default();
    let mut m = Model::new(ModelConfig::default());
    let rss_before = rss();
    let mut memory_peak = 0;
    let mut from = 0;
    while from < FLOOD {
        let batch = orphans(from, BATCH);
        m.apply_all(KEY, batch.iter());
        from += BATCH;
        memory_peak = memory_peak.max(m.memory_bytes());
    }
    let rss_after = rss();

    // The model's own accounting stays within its bound: the orphans it
    // keeps (BTreeMap entries of 72 bytes, nodes two-thirds full), the
    // recent-event history (full: a VecDeque grown by doubling), the three
    // series, the leak table and the rest in a few MiB.
    let p = m.process(KEY).unwrap();
    let d = &p.devices()[0];
    assert_eq!(d.orphan_count(), bounds.orphans);
    let history =
        ModelConfig::default().recent_events.next_power_of_two() * std::mem::size_of::<Event>();
    let bound = bounds.orphans * 72 * 3 / 2 + history + 8 * MIB;
    assert!(
        memory_peak <= bound,
        "model memory {memory_peak} > bound {bound}"
    );

    // What the bound dropped is counted and in the view (and so in
    // `snapshot --json` and the dashboard).
    let view = m.view(0, &ViewOptions::default());
    let pv = &view.processes[0];
    let dropped = FLOOD - bounds.orphans as u64;
    assert_eq!(pv.dropped.orphans, dropped);
    assert_eq!(pv.bounds.orphans, bounds.orphans);
    assert!(pv.dropped.any());
    assert!(pv.needs_resync, "a drop leaves the block map untrusted");
    // Only the kept orphans are counted in the totals.
    assert_eq!(pv.figures.allocated, bounds.orphans as u64 * 512);
    let json = serde_json::to_value(pv).unwrap();
    assert_eq!(json["dropped"]["orphans"], dropped);
    let lines = vramscope_ui::stats::dropped_lines(&pv.dropped, &pv.bounds);
    assert_eq!(lines, vec!["dropped: 3.9M orphan blocks (bound 65,536)"]);

    // The process's RSS grew by far less than 4 M orphans would take
    // (≈ 430 MiB unbounded); measured in a process of its own.
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        let growth = b.saturating_sub(a);
        assert!(growth <= 96 * MIB, "RSS grew by {} MiB", growth / MIB);
    }
}

#[test]
fn item_07_every_growing_structure_is_bounded() {
    let bounds = Bounds {
        processes: 2,
        devices: 2,
        segments: 4,
        blocks: 8,
        orphans: 4,
        replay: 4,
        leak_sizes: 4,
        collector_drop_names: 2,
        definitions: 2,
        string_bytes: 64,
        places: 2,
        roles: 2,
    };
    let cfg = ModelConfig {
        bounds,
        ..ModelConfig::default()
    };
    let mut m = Model::new(cfg);
    let place = |device| Place {
        device,
        ..Place::default()
    };
    let ev = |t: u64, kind| Event { time_ns: t, kind };
    // A 1 MiB segment at `addr` on `dev`, at time `t`.
    let segment = |t, dev, addr| {
        let (place, size) = (place(dev), 1 << 20);
        ev(t, EventKind::SegmentAlloc { place, addr, size })
    };
    // An allocation of `size` bytes at `addr` on `dev`, at time `t`.
    let alloc = |t, dev, addr, size| {
        let place = place(dev);
        ev(t, EventKind::Alloc { place, addr, size })
    };
    let mut events = Vec::new();
    // Devices: 0 and 1 are kept, 2 and 3 dropped.
    events.extend((0..4u16).map(|dev| segment(1, dev, 1 << 30)));
    // Segments on device 0: 4 kept (one above), 6 dropped.
    events.extend((1..10u64).map(|s| segment(2, 0, (1 << 30) + s * (1 << 21))));
    // Blocks: allocations splitting the first segment; 8 blocks at most
    // (4 segments hold 4 already).
    events.extend((0..10u64).map(|i| alloc(3, 0, (1 << 30) + i * 512, 512 + i)));
    // Orphans on device 1 (its segment is at 1 << 30): 4 kept, 6 dropped.
    events.extend((0..10u64).map(|i| alloc(4, 1, (1 << 40) + i * 512, 1000 + i)));
    m.apply_all(KEY, events.iter());
    // Processes: a third one is not followed.
    let other = ProcessKey {
        pid: 8,
        start_time: 8,
    };
    m.apply_all(other, events[..1].iter());
    let third = ProcessKey {
        pid: 9,
        start_time: 9,
    };
    m.apply_all(third, events[..1].iter());
    assert!(m.process(third).is_none());
    assert_eq!(m.dropped_events(), 1);

    let p = m.process(KEY).unwrap();
    assert_eq!(p.devices().len(), 2);
    let d0 = &p.devices()[0];
    assert_eq!(d0.segments().count(), 4);
    assert!(d0.blocks().count() <= 8);
    d0.check_invariants().unwrap();
    p.devices()[1].check_invariants().unwrap();
    assert_eq!(p.devices()[1].orphan_count(), 4);
    let v = p.view(0, &ViewOptions::default());
    assert_eq!(v.dropped.devices, 2);
    assert_eq!(v.dropped.segments, 6);
    assert_eq!(v.dropped.orphans, 6);
    assert!(v.dropped.blocks > 0);
    // Leak sizes: 4 tracked; the others (10 + 4 distinct requests kept) not.
    assert!(v.dropped.leak_sizes > 0);
    assert!(p.leak().tracked_sizes() <= 4);

    // A snapshot announcing more than the bounds is given up at once, and
    // events beyond the replay bound are dropped (not buffered).
    let mut snap = vec![ev(
        5,
        EventKind::SnapshotBegin {
            device: 0,
            id: 1,
            segments: 100,
            blocks: 100,
            at: None,
        },
    )];
    snap.push(ev(6, EventKind::SnapshotEnd { device: 0, id: 1 }));
    snap.push(ev(
        7,
        EventKind::SnapshotBegin {
            device: 0,
            id: 2,
            segments: 1,
            blocks: 1,
            at: None,
        },
    ));
    for i in 0..10u64 {
        snap.push(ev(
            8,
            EventKind::FreeRequested {
                place: place(0),
                addr: (1 << 30) + i * 512,
                size: 512,
            },
        ));
    }
    m.apply_all(KEY, snap.iter());
    let v = m.process(KEY).unwrap().view(0, &ViewOptions::default());
    assert_eq!(v.dropped.snapshots, 1);
    assert_eq!(v.dropped.replay, 6);

    // Attribution definitions: 2 of each kind kept, string bytes bounded.
    let mut defs = Vec::new();
    for id in 1..=5u32 {
        defs.push(ev(
            9,
            EventKind::Context {
                id,
                module: 0,
                phase: vramscope_wire::event::Phase::Forward,
                stack: 0,
                step: None,
            },
        ));
        defs.push(ev(
            9,
            EventKind::Frame {
                id,
                file: 1,
                function: 1,
                line: id,
            },
        ));
        defs.push(ev(
            9,
            EventKind::Stack {
                id,
                frame: 1,
                parent: 0,
            },
        ));
        defs.push(ev(
            9,
            EventKind::StringChunk {
                id,
                len: 40,
                offset: 0,
                bytes: [b'x'; 32],
            },
        ));
    }
    m.apply_all(KEY, defs.iter());
    let v = m.process(KEY).unwrap().view(0, &ViewOptions::default());
    // 3 of 5 contexts, frames and stacks, and 4 of 5 strings (64 bytes
    // hold one of 40).
    assert_eq!(v.dropped.definitions, 3 * 3 + 4);
    let lines = vramscope_ui::stats::dropped_lines(&v.dropped, &v.bounds);
    assert!(
        lines.contains(&"dropped: 13 attribution definitions (bound 2)".to_string()),
        "{lines:?}"
    );

    // Role lists: 2 tensors of a list of 5 kept.
    let mut roles = vec![ev(9, EventKind::Roles { list: 1, count: 5 })];
    roles.extend((0..5u64).map(|i| {
        ev(
            9,
            EventKind::Role {
                list: 1,
                device: 0,
                addr: (1 << 30) + i * 512,
                bytes: 512,
                held: vramscope_wire::event::Held::Parameter,
                module: 0,
            },
        )
    }));
    roles.push(ev(9, EventKind::RolesEnd { list: 1, count: 5 }));
    m.apply_all(KEY, roles.iter());
    let v = m.process(KEY).unwrap().view(0, &ViewOptions::default());
    assert_eq!(v.dropped.roles, 3);
    assert_eq!(v.attribution.role_lists.tensors, 2);
    let lines = vramscope_ui::stats::dropped_lines(&v.dropped, &v.bounds);
    assert!(
        lines.contains(&"dropped: 3 role list tensors (bound 2)".to_string()),
        "{lines:?}"
    );

    // The event log names 2 places (device 0 and 1 on stream 0): the
    // events of devices 2 and 3 and of three more streams are not kept.
    let streams = (1..=3u64).map(|stream| {
        let place = Place { stream, ..place(0) };
        ev(
            10,
            EventKind::FreeCompleted {
                place,
                addr: 1 << 30,
                size: 512,
            },
        )
    });
    m.apply_all(KEY, streams.collect::<Vec<_>>().iter());
    let all = ViewOptions {
        recent_events: usize::MAX,
        ..ViewOptions::default()
    };
    let v = m.process(KEY).unwrap().view(0, &all);
    assert_eq!(v.dropped.history, 2 + 3);
    assert!(v
        .recent_events
        .iter()
        .all(|e| e.kind.place().is_none_or(|p| p.device < 2 && p.stream == 0)));
    let lines = vramscope_ui::stats::dropped_lines(&v.dropped, &v.bounds);
    assert!(
        lines.contains(&"dropped: 5 events of extra places (bound 2)".to_string()),
        "{lines:?}"
    );
}

#[test]
fn item_07_collector_drops_reach_the_view() {
    let hub = Hub::new(ModelConfig::default());
    hub.apply(Input::Events(EventBatch {
        key: KEY,
        events: orphans(0, 1),
        delivered: 1,
        lost: 0,
        lost_now: 0,
        at: Vec::new(),
    }));
    for count in [3, 17] {
        hub.apply(Input::Dropped {
            key: Some(KEY),
            what: "events".into(),
            count,
        });
    }
    hub.apply(Input::Dropped {
        key: None,
        what: "segments".into(),
        count: 2,
    });
    let snap = hub.snapshot_at(0, &ViewOptions::default());
    let pv = &snap.processes[0].view;
    // Cumulative: the latest count replaces the earlier one.
    assert_eq!(pv.dropped.collector.get("events"), Some(&17));
    assert!(pv.dropped.any());
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(
        json["processes"][0]["view"]["dropped"]["collector"]["events"],
        17
    );
    assert_eq!(hub.dropped().get("segments"), Some(&2));
    let lines = vramscope_ui::stats::dropped_lines(&pv.dropped, &pv.bounds);
    assert_eq!(lines, vec!["collector dropped: 17 events"]);
}
