//! Recording-format compatibility: one committed recording per format
//! version, each replayed by today's vramscope.
//!
//! - `v1.0-demo-leak.vsrec`: made by vramscope 0.1.0 (`vramscope record` of
//!   `vramscope demo leak`); `v1.0-demo-leak.replay.json` is what 0.1.0's
//!   `replay --json` printed for it.
//! - `v1.1-synthetic.vsrec`: written by [`write_v1_1`] below with every
//!   1.1 addition (watch start, ring positions, a placed statistics sample,
//!   tagged events, definitions, step sources, DROPPED records and a
//!   `Dropped` input).
//! - `v1.2-synthetic.vsrec`: written by [`write_v1_2`] below with the 1.2
//!   addition (a `PeaksReset` input between allocations).
//!
//! Regenerate them (only when adding a version's file, never to "fix" a
//! test) with `VRAMSCOPE_WRITE_FIXTURE=1 cargo test --test recording_compat`
//! (a test checks that each committed file is exactly what it writes).

use std::path::{Path, PathBuf};
use std::process::Command as Proc;

use serde_json::Value;
use vramscope_core::input::{EventBatch, Identity, Input, Source};
use vramscope_core::model::Watch;
use vramscope_core::model::{Mode, ProcessKey};
use vramscope_core::recording::{Recorder, Replayer};
use vramscope_wire::event::RingPos;
use vramscope_wire::event::{
    BlockState, CtxTag, DropWhat, Event, EventKind, MarkSource, Phase, Place, PoolId, RingSpan,
    SegmentPool, Stats,
};

const MIB: u64 = 1 << 20;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings")
        .join(name)
}

fn replay_json(file: &Path) -> Value {
    let out = Proc::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["replay", "--json"])
        .arg(file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn v1_0_recording_of_vramscope_0_1_0_replays_to_the_same_figures() {
    let file = fixture("v1.0-demo-leak.vsrec");
    let want: Value =
        serde_json::from_slice(&std::fs::read(fixture("v1.0-demo-leak.replay.json")).unwrap())
            .unwrap();
    let got = replay_json(&file);
    let (w, g) = (&want["processes"][0], &got["processes"][0]);
    for p in [
        "/view/figures/allocated",
        "/view/figures/reserved",
        "/view/figures/active",
        "/view/figures/peak_allocated",
        "/view/figures/peak_reserved",
        "/view/figures/events_total",
        "/view/figures/lost_events",
        "/view/figures/inconsistencies",
        "/view/devices/0/figures/segments",
        "/view/devices/0/figures/blocks",
        "/view/devices/0/figures/synced",
        "/view/devices/0/figures/stats",
        "/view/devices/0/figures/fragmentation",
        "/view/snapshots_installed",
        "/source/delivered",
        "/source/lost",
        "/identity/label",
    ] {
        assert_eq!(g.pointer(p), w.pointer(p), "{p}");
        assert!(w.pointer(p).is_some(), "{p} in the 0.1.0 output");
    }
    // The leak verdict: every field 0.1.0 printed (later ones only add).
    let leak = w["view"]["leak"].as_object().unwrap();
    assert!(leak.len() >= 9);
    for (k, v) in leak {
        assert_eq!(&g["view"]["leak"][k], v, "leak.{k}");
    }
    // The block map: every segment and block, every field 0.1.0 printed
    // (later ones only add: a block's role).
    let (gs, ws) = (
        g["view"]["devices"][0]["segments"].as_array().unwrap(),
        w["view"]["devices"][0]["segments"].as_array().unwrap(),
    );
    assert_eq!(gs.len(), ws.len());
    for (gseg, wseg) in gs.iter().zip(ws) {
        for (k, v) in wseg.as_object().unwrap() {
            if k != "blocks" {
                assert_eq!(&gseg[k], v, "segment {k}");
            }
        }
        let (gb, wb) = (gseg["blocks"].as_array(), wseg["blocks"].as_array());
        assert_eq!(gb.map(Vec::len), wb.map(Vec::len));
        for (gblock, wblock) in gb.unwrap().iter().zip(wb.unwrap()) {
            for (k, v) in wblock.as_object().unwrap() {
                assert_eq!(&gblock[k], v, "block {k}");
            }
        }
    }
    // The file is 1.0, read by a 1.1 reader.
    let mut r = Replayer::open(&file).unwrap();
    assert_eq!(r.minor(), 0);
    while r.next_input().unwrap().is_some() {}
    assert_eq!(r.skipped_inputs(), 0);
}

fn key() -> ProcessKey {
    ProcessKey {
        pid: 4242,
        start_time: 777,
    }
}

const T0: u64 = 5_000_000_000;
/// The first segment's address; the second's is 1 GiB above.
const B: u64 = 0x7f00_0000_0000;

fn ev(dt: u64, kind: EventKind) -> Event {
    Event {
        time_ns: T0 + dt,
        kind,
    }
}

fn tag() -> CtxTag {
    CtxTag {
        context: 1,
        step_tag: CtxTag::step_tag_of(1),
    }
}

fn place() -> Place {
    Place {
        device: 0,
        stream: 0,
        pool: PoolId(0, 0),
        ctx: tag(),
    }
}

/// The inputs of the 1.1 fixture: a process watched from mid-run, anchored
/// on snapshot 1, then tagged events and a statistics sample placed exactly.
fn v1_1_inputs() -> Vec<(u64, Input)> {
    // Ring 0 (agent) from position 3, ring 1 (device 0) from position 5.
    let agent_at: Vec<RingPos> = (3..10)
        .map(|position| RingPos { ring: 0, position })
        .collect();
    let first = Input::Events(EventBatch {
        key: key(),
        events: agent_events(),
        delivered: 7,
        lost: 0,
        lost_now: 0,
        at: agent_at,
    });
    let mut at: Vec<RingPos> = (5..10)
        .map(|position| RingPos { ring: 1, position })
        .collect();
    // Agent ring: the sample is positions 10 and 11 (its STATS_B at 11),
    // its STATS_C 12, the marker 13, DROPPED 14.
    at.extend([11, 12, 13, 14].map(|position| RingPos { ring: 0, position }));
    let second = Input::Events(EventBatch {
        key: key(),
        events: device_events(),
        delivered: 16,
        lost: 0,
        lost_now: 0,
        at,
    });
    let dropped = Input::Dropped {
        key: Some(key()),
        what: "recent events".into(),
        count: 3,
    };
    vec![
        (T0, attach()),
        (T0 + 10, first),
        (T0 + 10_000, second),
        (T0 + 20_000, dropped),
    ]
}

/// Watching began at `T0`, mid-run, anchored on snapshot 1.
fn attach() -> Input {
    let mut source = Source::unattached(Mode::Exact);
    source.segment = Some("/dev/shm/vramscope-1000-4242".into());
    source.producer = Some("TorchExact".into());
    Input::Attach {
        key: key(),
        identity: Identity {
            host_pid: 4242,
            ns_pid: 4242,
            name: "python3".into(),
            label: "train.py".into(),
            alive: true,
            ..Identity::default()
        },
        source,
        watch: Watch {
            began_ns: Some(T0),
            mid_run: true,
            ring_starts: vec![3, 5],
            anchor_snapshot: Some(1),
        },
    }
}

/// The agent ring's first records: a string, a context, snapshot 1.
fn agent_events() -> Vec<Event> {
    let (tag, place) = (tag(), place());
    let mut name = [0u8; 32];
    name[..12].copy_from_slice(b"model.layer1");
    vec![
        ev(
            0,
            EventKind::StringChunk {
                id: 1,
                len: 12,
                offset: 0,
                bytes: name,
            },
        ),
        ev(
            1,
            EventKind::Context {
                id: 1,
                module: 1,
                phase: Phase::Forward,
                stack: 0,
                step: None,
            },
        ),
        ev(
            2,
            EventKind::SnapshotBegin {
                device: 0,
                id: 1,
                segments: 1,
                blocks: 2,
                at: Some(RingSpan {
                    ring: 1,
                    before: 5,
                    after: 5,
                    exact: true,
                    ambiguous: false,
                }),
            },
        ),
        ev(
            2,
            EventKind::SnapshotSegment {
                id: 1,
                place: Place {
                    ctx: CtxTag::NONE,
                    ..place
                },
                addr: B,
                size: 20 * MIB,
                pool_kind: SegmentPool::Large,
                expandable: false,
            },
        ),
        ev(
            2,
            EventKind::SnapshotBlock {
                id: 1,
                device: 0,
                addr: B,
                size: 4 * MIB,
                requested: 4 * MIB,
                state: BlockState::Allocated,
                ctx: tag,
            },
        ),
        ev(
            2,
            EventKind::SnapshotBlock {
                id: 1,
                device: 0,
                addr: B + 4 * MIB,
                size: 16 * MIB,
                requested: 0,
                state: BlockState::Inactive,
                ctx: CtxTag::NONE,
            },
        ),
        ev(2, EventKind::SnapshotEnd { device: 0, id: 1 }),
    ]
}

/// Device 0's events, then the agent ring's sample, marker and DROPPED.
fn device_events() -> Vec<Event> {
    let place = place();
    let s2 = B + (1 << 30);
    vec![
        ev(
            1_000,
            EventKind::Alloc {
                place,
                addr: B + 4 * MIB,
                size: 2 * MIB,
            },
        ),
        ev(
            2_000,
            EventKind::SegmentAlloc {
                place,
                addr: s2,
                size: 20 * MIB,
            },
        ),
        ev(
            3_000,
            EventKind::Alloc {
                place,
                addr: s2,
                size: 8 * MIB,
            },
        ),
        ev(
            4_000,
            EventKind::FreeRequested {
                place,
                addr: B,
                size: 4 * MIB,
            },
        ),
        ev(
            5_000,
            EventKind::FreeCompleted {
                place,
                addr: B,
                size: 4 * MIB,
            },
        ),
        ev(
            6_000,
            EventKind::Stats {
                device: 0,
                stats: Stats {
                    allocated: 10 * MIB,
                    reserved: 40 * MIB,
                    active: 10 * MIB,
                    requested: 10 * MIB,
                    allocated_peak: 14 * MIB,
                    reserved_peak: 40 * MIB,
                    active_peak: 14 * MIB,
                    segments: 2,
                    ..Stats::default()
                },
            },
        ),
        ev(
            6_000,
            EventKind::StatsPosition {
                device: 0,
                at: RingSpan {
                    ring: 1,
                    before: 10,
                    after: 10,
                    exact: true,
                    ambiguous: false,
                },
            },
        ),
        ev(
            7_000,
            EventKind::Marker {
                value: 1,
                source: MarkSource::OptimizerStep { optimizer: 1 },
            },
        ),
        ev(
            8_000,
            EventKind::Dropped {
                device: 0xffff,
                what: DropWhat::Stacks,
                count: 2,
                bound: 64,
            },
        ),
    ]
}

/// `inputs` written by today's recorder, in a file whose header says
/// format 1.`minor`: inputs that use nothing a later minor added are
/// written as that minor's recorder wrote them (a minor only adds).
fn write_as(path: &Path, inputs: Vec<(u64, Input)>, minor: u16) {
    let mut rec = Recorder::create(path).unwrap();
    for (t, i) in inputs {
        rec.write(t, &i).unwrap();
    }
    rec.finish().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    bytes[10..12].copy_from_slice(&minor.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

fn write_v1_1(path: &Path) {
    write_as(path, v1_1_inputs(), 1);
}

fn write_v1_2(path: &Path) {
    write_as(path, v1_2_inputs(), 2);
}

/// The committed fixture `name` is exactly what `write` writes today (so
/// it can be made again); `VRAMSCOPE_WRITE_FIXTURE=1` rewrites it.
fn reproducible(name: &str, write: fn(&Path)) {
    let committed = fixture(name);
    if std::env::var_os("VRAMSCOPE_WRITE_FIXTURE").is_some() {
        write(&committed);
    }
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join(name);
    write(&fresh);
    assert!(
        std::fs::read(&fresh).unwrap() == std::fs::read(&committed).unwrap(),
        "{} differs from what today's writer makes of its inputs",
        committed.display()
    );
}

#[test]
fn v1_1_fixture_is_reproducible() {
    reproducible("v1.1-synthetic.vsrec", write_v1_1);
}

#[test]
fn v1_2_fixture_is_reproducible() {
    reproducible("v1.2-synthetic.vsrec", write_v1_2);
}

#[test]
fn v1_1_recording_replays_with_every_new_field() {
    let file = fixture("v1.1-synthetic.vsrec");
    assert!(std::fs::metadata(&file).unwrap().len() <= 200 << 10);
    // Read back exactly what was written.
    let mut r = Replayer::open(&file).unwrap();
    assert_eq!(r.minor(), 1);
    let mut got = Vec::new();
    while let Some(x) = r.next_input().unwrap() {
        got.push(x);
    }
    assert_eq!(got, v1_1_inputs());
    assert_eq!(r.skipped_inputs(), 0);
    // And the figures: the anchor snapshot, then the events after it.
    let v = replay_json(&file);
    let p = &v["processes"][0]["view"];
    assert_eq!(p["figures"]["allocated"], 10 * MIB, "{p}");
    assert_eq!(p["figures"]["reserved"], 40 * MIB);
    assert_eq!(p["figures"]["peak_allocated"], 14 * MIB);
    assert_eq!(p["devices"][0]["figures"]["segments"], 2);
    assert_eq!(p["devices"][0]["figures"]["blocks"], 5);
    assert_eq!(p["devices"][0]["figures"]["synced"], true);
    assert_eq!(p["figures"]["inconsistencies"], 0);
    assert_eq!(p["snapshots_installed"], 1);
    assert_eq!(v["processes"][0]["identity"]["label"], "train.py");
}

/// A file written today, read the way vramscope 0.1.0 reads (it skips frame
/// kinds it does not know; the events frames are unchanged): replaying only
/// the frames 1.0 knew gives the same figures.
#[test]
fn a_1_1_recording_without_its_new_frames_gives_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let full = fixture("v1.1-synthetic.vsrec");
    let bytes = std::fs::read(&full).unwrap();
    let mut old = bytes[..16].to_vec();
    old[10] = 0; // minor 0
    let mut at = 16;
    let mut kinds = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = bytes[at + 4];
        kinds.push(kind);
        if kind <= 2 {
            old.extend_from_slice(&bytes[at..at + 4 + len]);
        }
        at += 4 + len;
    }
    assert_eq!(
        kinds,
        vec![1, 2, 3, 2, 3, 4],
        "attach, events+positions x2, dropped"
    );
    let stripped = dir.path().join("as-1.0.vsrec");
    std::fs::write(&stripped, old).unwrap();
    let (a, b) = (replay_json(&full), replay_json(&stripped));
    for p in [
        "/processes/0/view/figures",
        "/processes/0/view/devices/0/figures",
        "/processes/0/view/leak",
    ] {
        let strip = |v: &Value| {
            let mut v = v.pointer(p).unwrap().clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("events_per_sec");
            }
            v
        };
        assert_eq!(strip(&a), strip(&b), "{p}");
    }
}

/// The 1.2 fixture: a process watched from its start, on device 0 with no
/// statistics (its figures are the block map's): 48 MiB allocated and
/// freed, 8 MiB kept, its peaks reset, 4 MiB more.
fn v1_2_inputs() -> Vec<(u64, Input)> {
    let place = Place::default();
    let batch = |dt: u64, kinds: Vec<EventKind>| {
        let events: Vec<Event> = kinds.into_iter().map(|k| ev(dt, k)).collect();
        Input::Events(EventBatch {
            key: key(),
            delivered: events.len() as u64,
            events,
            lost: 0,
            lost_now: 0,
            at: Vec::new(),
        })
    };
    let Input::Attach {
        identity, source, ..
    } = attach()
    else {
        unreachable!("attach() is an Attach")
    };
    let attach = Input::Attach {
        key: key(),
        identity,
        source,
        watch: Watch {
            began_ns: Some(T0),
            ..Watch::default()
        },
    };
    let before = batch(
        1_000,
        vec![
            EventKind::SegmentAlloc {
                place,
                addr: B,
                size: 64 * MIB,
            },
            EventKind::Alloc {
                place,
                addr: B,
                size: 48 * MIB,
            },
            EventKind::FreeRequested {
                place,
                addr: B,
                size: 48 * MIB,
            },
            EventKind::FreeCompleted {
                place,
                addr: B,
                size: 48 * MIB,
            },
            EventKind::Alloc {
                place,
                addr: B,
                size: 8 * MIB,
            },
        ],
    );
    let after = batch(
        3_000,
        vec![EventKind::Alloc {
            place,
            addr: B + 8 * MIB,
            size: 4 * MIB,
        }],
    );
    vec![
        (T0, attach),
        (T0 + 1_000, before),
        (T0 + 2_000, Input::PeaksReset { key: key() }),
        (T0 + 3_000, after),
    ]
}

/// The peaks `replay --json` prints of the fixture's process: its own and
/// its device's, allocated and reserved.
fn replayed_peaks(file: &Path) -> Vec<Value> {
    let v = replay_json(file);
    let p = &v["processes"][0]["view"];
    [
        "/figures/allocated",
        "/figures/peak_allocated",
        "/figures/peak_reserved",
        "/devices/0/figures/peak_allocated",
        "/devices/0/figures/peak_active",
    ]
    .iter()
    .map(|at| {
        p.pointer(at)
            .cloned()
            .unwrap_or_else(|| panic!("{at}: {p}"))
    })
    .collect()
}

/// Issue 45: a peak reset replays: the peaks after it are those since the
/// reset. The file is 1.2, read back exactly as written.
#[test]
fn v1_2_recording_replays_its_peak_reset() {
    let file = fixture("v1.2-synthetic.vsrec");
    let mut r = Replayer::open(&file).unwrap();
    assert_eq!(r.minor(), 2);
    let mut got = Vec::new();
    while let Some(x) = r.next_input().unwrap() {
        got.push(x);
    }
    assert_eq!(got, v1_2_inputs());
    assert_eq!(r.skipped_inputs(), 0);
    let m = |n: u64| Value::from(n * MIB);
    assert_eq!(replayed_peaks(&file), [m(12), m(12), m(64), m(12), m(12)]);
}

/// A 1.2 file as older readers read it: the reset is in a frame of kind 4
/// (1.0 skips the kind, 1.1 the variant it does not know), and without it
/// the replay is the same but for the peaks, which are those since the
/// start, as before 1.2.
#[test]
fn a_1_2_recording_without_its_peak_reset_keeps_the_peaks_from_the_start() {
    let bytes = std::fs::read(fixture("v1.2-synthetic.vsrec")).unwrap();
    let mut old = bytes[..16].to_vec();
    old[10] = 1; // minor 1
    let mut at = 16;
    let mut kinds = Vec::new();
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = bytes[at + 4];
        kinds.push(kind);
        if kind == 4 {
            let json = &bytes[at + 13..at + 4 + len];
            assert!(json.starts_with(br#"{"PeaksReset":"#), "{json:?}");
        } else {
            old.extend_from_slice(&bytes[at..at + 4 + len]);
        }
        at += 4 + len;
    }
    assert_eq!(kinds, vec![1, 2, 4, 2], "attach, events, reset, events");
    let dir = tempfile::tempdir().unwrap();
    let stripped = dir.path().join("as-1.1.vsrec");
    std::fs::write(&stripped, old).unwrap();
    let m = |n: u64| Value::from(n * MIB);
    assert_eq!(
        replayed_peaks(&stripped),
        [m(12), m(48), m(64), m(48), m(48)]
    );
}
