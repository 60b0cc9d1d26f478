//! Segment-format compatibility across versions (FORMAT.md, "Versions"):
//!
//! - an agent of the previous version (the 1.0 C header as it was at commit
//!   e1cdefb, frozen in `tests/compat/v1_0/`) is watched by today's reader
//!   and model, with exact figures;
//! - today's writers (Rust and the C header) writing every 1.1 record kind
//!   are read by the previous version's reader: the 1.0 codec and header
//!   parser, frozen in `tests/compat/v1_0/` and compiled here as they were;
//! - a segment of another major is refused with one line.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;

use serde_json::Value;
use vramscope_collect::Hub;
use vramscope_core::input::{EventBatch, Identity, Input, Source};
use vramscope_core::model::{Mode, ProcessKey, ViewOptions};
use vramscope_wire::event as new;
use vramscope_wire::ring::codec::{self as new_codec, Decoder as NewDecoder};
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

#[path = "common/c_writer.rs"]
mod c_writer;

// ---- the 1.0 reader side, frozen ------------------------------------------

/// The 1.0 `crate::event` (e1cdefb:crates/wire/src/event.rs).
#[allow(dead_code, unused_imports, unreachable_pub, clippy::all)]
#[path = "compat/v1_0/event.rs.frozen"]
mod event;

/// The 1.0 slot codec (e1cdefb:crates/wire/src/ring/codec.rs).
#[allow(dead_code, unused_imports, unreachable_pub, clippy::all)]
#[path = "compat/v1_0/codec.rs.frozen"]
mod codec;

/// The 1.0 header parser (e1cdefb:crates/wire/src/ring/layout.rs).
#[allow(dead_code, unused_imports, unreachable_pub, clippy::all)]
#[path = "compat/v1_0/layout.rs.frozen"]
mod layout;

/// What the frozen layout needs of 1.0's `ring::RingError`.
#[derive(Debug)]
#[allow(dead_code)]
enum RingError {
    Invalid(String),
    ShortCopy { needed: usize },
}

impl std::fmt::Display for RingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

const MIB: u64 = 1 << 20;

/// Builds a C producer (`tests/compat`), starts it and returns it with its
/// segment once written.
fn start(src: &str, dir: &Path) -> (Child, PathBuf) {
    let shm = dir.join("shm");
    std::fs::create_dir(&shm).unwrap();
    let exe = dir.join(Path::new(src).file_stem().unwrap());
    c_writer::compile(src, &exe, &["cc", "-std=gnu11"], &[]);
    let w = c_writer::start(&exe, &[&shm]);
    (w.child, w.path)
}

fn stop(mut child: Child) {
    writeln!(child.stdin.as_mut().unwrap(), "done").unwrap();
    assert!(child.wait().unwrap().success());
}

/// Every record of every ring, raw, in ring order.
fn raw(r: &mut SegmentReader) -> Vec<(usize, [u64; 7])> {
    let mut out = Vec::new();
    for i in 0..r.header().rings.len() {
        r.drain_ring_raw(i, usize::MAX, true, |_, w| out.push((i, *w)));
    }
    out
}

/// Today's model fed with what today's reader decoded; its JSON view.
fn model_of(path: &Path, r: &SegmentReader, events: Vec<new::Event>) -> Value {
    let key = ProcessKey {
        pid: r.header().pid,
        start_time: r.header().start_time,
    };
    let hub = Hub::default();
    let mut source = Source::unattached(Mode::Exact);
    source.segment = Some(path.display().to_string());
    hub.apply(Input::Attach {
        key,
        identity: Identity::default(),
        source,
        watch: Default::default(),
    });
    let n = events.len() as u64;
    hub.apply(Input::Events(EventBatch {
        key,
        events,
        delivered: n,
        lost: 0,
        lost_now: 0,
        at: Vec::new(),
    }));
    let snap = hub.snapshot(&ViewOptions {
        block_map: true,
        recent_events: 0,
        timeline: None,
    });
    serde_json::to_value(&snap).unwrap()["processes"][0]["view"].clone()
}

fn u(v: &Value, p: &str) -> u64 {
    v.pointer(p)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{p} in {v}"))
}

#[test]
fn a_1_0_agent_is_watched_by_todays_reader_with_exact_figures() {
    let dir = tempfile::tempdir().unwrap();
    let (child, path) = start("tests/compat/writer_1_0.c", dir.path());
    let mut r = SegmentReader::open(&path).expect("a 1.0 segment opens");
    assert_eq!(r.header().minor, 0);
    assert_eq!(r.header().framework, "c-writer 1.0");
    let mut events = Vec::new();
    let mut d = [NewDecoder::default(), NewDecoder::default()];
    for (ring, w) in raw(&mut r) {
        events.extend(d[ring].decode(&w));
    }
    assert_eq!(r.totals().lost, 0);
    assert_eq!(events.len(), 5 + 5 + 2, "{events:#?}");
    // 1.1's additions read as "not given" from a 1.0 producer.
    for e in &events {
        match &e.kind {
            new::EventKind::SnapshotBegin { at, .. } => assert_eq!(*at, None),
            new::EventKind::SnapshotBlock { ctx, .. } => assert!(ctx.is_none()),
            new::EventKind::Marker { value, source } => {
                assert_eq!((*value, *source), (3, new::MarkSource::Unknown))
            }
            new::EventKind::Alloc { place, .. } => assert!(place.ctx.is_none()),
            _ => {}
        }
    }
    let v = model_of(&path, &r, events);
    stop(child);
    // 4 + 2 + 8 - 4 MiB allocated in two 20 MiB segments, five blocks.
    assert_eq!(u(&v, "/figures/allocated"), 10 * MIB, "{v}");
    assert_eq!(u(&v, "/figures/reserved"), 40 * MIB);
    assert_eq!(u(&v, "/devices/0/figures/segments"), 2);
    assert_eq!(u(&v, "/devices/0/figures/blocks"), 5);
    assert_eq!(v["devices"][0]["figures"]["synced"], Value::Bool(true));
    assert_eq!(u(&v, "/figures/inconsistencies"), 0);
    assert_eq!(u(&v, "/devices/0/figures/stats/allocated_peak"), 14 * MIB);
}

// ---- today's writers, the 1.0 reader ---------------------------------------

/// What the 1.0 decoder must make of a record that today's codec wrote for
/// `e`: the same event with the 1.1 fields dropped, or Unknown for a 1.1 kind.
fn as_1_0(e: &new::Event) -> event::Event {
    use event::EventKind as O;
    use new::EventKind as N;
    /// The allocator events, the same in both but for the place's context.
    macro_rules! placed {
        ($($v:ident),*) => {
            match &e.kind {
                $(N::$v { place, addr, size } => Some(O::$v {
                    place: place_1_0(place),
                    addr: *addr,
                    size: *size,
                }),)*
                _ => None,
            }
        };
    }
    let placed = placed!(
        Alloc,
        FreeRequested,
        FreeCompleted,
        SegmentAlloc,
        SegmentFree,
        SegmentMap,
        SegmentUnmap
    );
    let kind = placed.unwrap_or_else(|| match &e.kind {
        N::Oom {
            place,
            device_free,
            request,
        } => O::Oom {
            place: place_1_0(place),
            device_free: *device_free,
            request: *request,
        },
        N::Stats { device, stats: s } => O::Stats {
            device: *device,
            stats: stats_1_0(s),
        },
        N::Marker { value, .. } => O::Marker { value: *value },
        N::Unknown { kind } => O::Unknown { kind: *kind },
        k => snapshot_1_0(k).unwrap_or_else(|| O::Unknown { kind: kind_1_1(k) }),
    });
    event::Event {
        time_ns: e.time_ns,
        kind,
    }
}

fn place_1_0(p: &new::Place) -> event::Place {
    event::Place {
        device: p.device,
        stream: p.stream,
        pool: event::PoolId(p.pool.0, p.pool.1),
    }
}

fn stats_1_0(s: &new::Stats) -> event::Stats {
    event::Stats {
        allocated: s.allocated,
        reserved: s.reserved,
        active: s.active,
        inactive_split: s.inactive_split,
        requested: s.requested,
        allocated_peak: s.allocated_peak,
        reserved_peak: s.reserved_peak,
        active_peak: s.active_peak,
        alloc_retries: s.alloc_retries,
        ooms: s.ooms,
        segments: s.segments,
    }
}

/// The snapshot records without their 1.1 fields (position span, context).
fn snapshot_1_0(k: &new::EventKind) -> Option<event::EventKind> {
    use event::EventKind as O;
    use new::EventKind as N;
    Some(match k {
        N::SnapshotBegin {
            device,
            id,
            segments,
            blocks,
            ..
        } => O::SnapshotBegin {
            device: *device,
            id: *id,
            segments: *segments,
            blocks: *blocks,
        },
        N::SnapshotSegment {
            id,
            place,
            addr,
            size,
            pool_kind,
            expandable,
        } => O::SnapshotSegment {
            id: *id,
            place: place_1_0(place),
            addr: *addr,
            size: *size,
            pool_kind: match pool_kind {
                new::SegmentPool::Small => event::SegmentPool::Small,
                new::SegmentPool::Large => event::SegmentPool::Large,
            },
            expandable: *expandable,
        },
        N::SnapshotBlock {
            id,
            device,
            addr,
            size,
            requested,
            state,
            ..
        } => O::SnapshotBlock {
            id: *id,
            device: *device,
            addr: *addr,
            size: *size,
            requested: *requested,
            state: match state {
                new::BlockState::Allocated => event::BlockState::Allocated,
                new::BlockState::PendingFree => event::BlockState::PendingFree,
                new::BlockState::Inactive => event::BlockState::Inactive,
            },
        },
        N::SnapshotEnd { device, id } => O::SnapshotEnd {
            device: *device,
            id: *id,
        },
        _ => return None,
    })
}

/// The kind number of a record 1.1 added (1.0 reads it as Unknown).
fn kind_1_1(k: &new::EventKind) -> u16 {
    use new::EventKind as N;
    match k {
        N::StatsPosition { .. } => new_codec::K_STATS_C,
        N::Dropped { .. } => new_codec::K_DROPPED,
        N::StringChunk { .. } => new_codec::K_STRING,
        N::Frame { .. } => new_codec::K_FRAME,
        N::Stack { .. } => new_codec::K_STACK,
        N::Context { .. } => new_codec::K_CONTEXT,
        N::Roles { .. } => new_codec::K_ROLES,
        N::Role { .. } => new_codec::K_ROLE,
        N::RolesEnd { .. } => new_codec::K_ROLES_END,
        N::Outside(o) => match o.op {
            new::OutsideOp::Alloc => new_codec::K_OUTSIDE_ALLOC,
            new::OutsideOp::Free => new_codec::K_OUTSIDE_FREE,
            new::OutsideOp::Total => new_codec::K_OUTSIDE_TOTAL,
        },
        other => panic!("{other:?} is no 1.1, 1.2 or 1.3 kind"),
    }
}

/// Every record kind of 1.2 and 1.1 with every new field set, and every
/// 1.0 kind.
fn every_kind() -> Vec<new::Event> {
    use new::*;
    let tag = CtxTag {
        context: 77,
        step_tag: CtxTag::step_tag_of(41),
    };
    let place = Place {
        device: 0,
        stream: 9,
        pool: PoolId(1, 2),
        ctx: tag,
    };
    let span = RingSpan {
        ring: 1,
        before: 10,
        after: 12,
        exact: false,
        ambiguous: true,
    };
    let a = 0x7f00_0000_0000u64;
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(b"model.fc");
    let mut kinds = allocator_kinds(place, a);
    kinds.extend([
        EventKind::Stats {
            device: 0,
            stats: Stats {
                allocated: 1,
                reserved: 2,
                ooms: 3,
                segments: 4,
                ..Stats::default()
            },
        },
        EventKind::StatsPosition {
            device: 0,
            at: span,
        },
        EventKind::Marker {
            value: 41,
            source: MarkSource::OptimizerStep { optimizer: 1 },
        },
        EventKind::SnapshotBegin {
            device: 0,
            id: 2,
            segments: 1,
            blocks: 1,
            at: Some(span),
        },
        EventKind::SnapshotSegment {
            id: 2,
            place: Place {
                ctx: CtxTag::NONE,
                ..place
            },
            addr: a,
            size: 20 * MIB,
            pool_kind: SegmentPool::Large,
            expandable: true,
        },
        EventKind::SnapshotBlock {
            id: 2,
            device: 0,
            addr: a,
            size: 20 * MIB,
            requested: 0,
            state: BlockState::Inactive,
            ctx: tag,
        },
        EventKind::SnapshotEnd { device: 0, id: 2 },
        EventKind::Dropped {
            device: 0,
            what: DropWhat::BlockTags,
            count: 3,
            bound: 4096,
        },
        EventKind::StringChunk {
            id: 1,
            len: 8,
            offset: 0,
            bytes,
        },
        EventKind::Frame {
            id: 1,
            file: 1,
            function: 1,
            line: 3,
        },
        EventKind::Stack {
            id: 1,
            frame: 1,
            parent: 0,
        },
        EventKind::Context {
            id: 77,
            module: 1,
            phase: Phase::Forward,
            stack: 1,
            step: Some(41),
        },
        // 1.2: a role list of one tensor, and its drop count.
        EventKind::Roles { list: 3, count: 1 },
        EventKind::Role {
            list: 3,
            device: 0,
            addr: a,
            bytes: 4096,
            held: Held::OptimizerState,
            module: 1,
        },
        EventKind::RolesEnd { list: 3, count: 1 },
        EventKind::Dropped {
            device: 0,
            what: DropWhat::Roles,
            count: 2,
            bound: 16384,
        },
        // 1.3: memory outside the caching allocator.
        EventKind::Outside(Outside {
            op: OutsideOp::Alloc,
            device: 0,
            library: Library::Nccl,
            kind: OutsideKind::Physical,
            addr: a,
            bytes: 64 * MIB,
            name: name24("libnccl.so.2"),
        }),
        EventKind::Outside(Outside {
            op: OutsideOp::Total,
            device: 0,
            library: Library::Cuda,
            kind: OutsideKind::Context,
            addr: 0,
            bytes: 500 * MIB,
            name: [0; 24],
        }),
    ]);
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            time_ns: 100 + i as u64,
            kind,
        })
        .collect()
}

/// The allocator events of [`every_kind`], all at `place` and address `a`.
fn allocator_kinds(place: new::Place, a: u64) -> Vec<new::EventKind> {
    use new::EventKind;
    vec![
        EventKind::SegmentAlloc {
            place,
            addr: a,
            size: 20 * MIB,
        },
        EventKind::Alloc {
            place,
            addr: a,
            size: 4096,
        },
        EventKind::SegmentMap {
            place,
            addr: a,
            size: 2 * MIB,
        },
        EventKind::SegmentUnmap {
            place,
            addr: a,
            size: 2 * MIB,
        },
        EventKind::Oom {
            place,
            device_free: 5,
            request: 6,
        },
        EventKind::FreeRequested {
            place,
            addr: a,
            size: 4096,
        },
        EventKind::FreeCompleted {
            place,
            addr: a,
            size: 4096,
        },
        EventKind::SegmentFree {
            place,
            addr: a,
            size: 20 * MIB,
        },
    ]
}

#[test]
fn todays_rust_writer_is_read_by_the_1_0_reader() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 256);
    let seg = SegmentWriter::create(&cfg).unwrap();
    assert_eq!(seg.header().minor, 3);
    // The 1.0 header check accepts a 1.3 header.
    let bytes = std::fs::read(seg.path()).unwrap();
    match layout::parse_header(&bytes, bytes.len() as u64).unwrap() {
        layout::Parsed::Ready(h) => {
            assert_eq!(h.minor, 3);
            assert_eq!(h.rings.len(), 2);
        }
        layout::Parsed::Initialising => panic!("published"),
    }
    let events = every_kind();
    let mut words = Vec::new();
    for e in &events {
        new_codec::encode(e, 5, &mut words);
    }
    for w in &words {
        assert!(seg.ring(0).write(w));
    }
    let mut r = SegmentReader::open(seg.path()).unwrap();
    let recs: Vec<[u64; 7]> = raw(&mut r).into_iter().map(|(_, w)| w).collect();
    assert_eq!(recs, words);
    // The 1.0 decoder: 1.0 kinds as before, 1.1 kinds Unknown (and so
    // skipped by the 1.0 model), no statistics sample dropped.
    let mut old = codec::Decoder::default();
    let got: Vec<event::Event> = recs.iter().filter_map(|w| old.decode(w)).collect();
    let want: Vec<event::Event> = events.iter().map(as_1_0).collect();
    assert_eq!(got, want);
    assert_eq!(old.dropped_samples, 0);
    // Today's decoder gets everything back.
    let mut d = NewDecoder::default();
    let back: Vec<new::Event> = recs.iter().filter_map(|w| d.decode(w)).collect();
    assert_eq!(back, events);
}

#[test]
fn todays_c_header_writes_what_the_rust_codec_reads_and_the_1_0_reader_skips() {
    let dir = tempfile::tempdir().unwrap();
    let (child, path) = start("tests/compat/writer_1_1.c", dir.path());
    let bytes = std::fs::read(&path).unwrap();
    match layout::parse_header(&bytes, bytes.len() as u64).unwrap() {
        layout::Parsed::Ready(h) => assert_eq!(h.minor, 3),
        layout::Parsed::Initialising => panic!("published"),
    }
    let mut r = SegmentReader::open(&path).unwrap();
    assert_eq!(r.header().minor, 3);
    let flags = r.header().flags;
    assert_eq!(flags & vramscope_wire::ring::layout::FLAG_POSITIONS, 8);
    assert_eq!(flags & vramscope_wire::ring::layout::FLAG_CONTEXTS, 16);
    let recs = raw(&mut r);
    stop(child);
    let mut d = [NewDecoder::default(), NewDecoder::default()];
    let mut old = [codec::Decoder::default(), codec::Decoder::default()];
    let mut new_events = Vec::new();
    let mut old_events = Vec::new();
    for (ring, w) in &recs {
        new_events.extend(d[*ring].decode(w));
        old_events.extend(old[*ring].decode(w));
    }
    // The 1.0 reader: the same events as today's, new kinds Unknown.
    let want: Vec<event::Event> = new_events.iter().map(as_1_0).collect();
    assert_eq!(old_events, want);
    assert_eq!(old[0].dropped_samples + old[1].dropped_samples, 0);
    // Today's reader: what the C helpers wrote, field for field.
    let (strings, seen) = strings_apart(&new_events);
    assert_eq!(strings.get(1), Some("transformer.h.3.attn"));
    assert_eq!(
        strings.get(2),
        Some("/home/u/train.py:an exceptionally long path name, longer than one chunk")
    );
    assert_eq!(seen, written_by_writer_1_1());
    // The model's view of the 1.3 records: the context, NCCL's buffer gone
    // again, the host memory by its (cut) file name.
    let view = model_of(&path, &r, new_events);
    let outside = view["outside"].as_array().expect("an outside list");
    let parts: Vec<(&str, &str, u64)> = outside
        .iter()
        .map(|p| {
            (
                p["library"].as_str().unwrap(),
                p["kind"].as_str().unwrap(),
                p["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        parts,
        [
            ("CUDA", "context", 500 * MIB),
            ("libcudnn_engines_runtime", "pinned host", 4096)
        ],
        "{outside:?}"
    );
    assert_eq!(outside[1]["device"], Value::Null);
    assert_eq!(u(&view, "/figures/outside_named"), 500 * MIB);
}

/// A library's name as OUTSIDE records carry it: its first 24 bytes.
fn name24(s: &str) -> [u8; 24] {
    let mut n = [0u8; 24];
    let b = s.as_bytes();
    n[..b.len().min(24)].copy_from_slice(&b[..b.len().min(24)]);
    n
}

/// The strings the STRING records define, and the other events' kinds.
fn strings_apart(events: &[new::Event]) -> (new_codec::Strings, Vec<new::EventKind>) {
    let mut strings = new_codec::Strings::default();
    let mut seen = Vec::new();
    for e in events {
        match &e.kind {
            new::EventKind::StringChunk {
                id,
                len,
                offset,
                bytes,
            } => {
                strings.add(*id, *len, *offset, bytes);
            }
            k => seen.push(*k),
        }
    }
    (strings, seen)
}

/// What tests/compat/writer_1_1.c writes, but its strings: the agent ring,
/// then the device ring.
fn written_by_writer_1_1() -> Vec<new::EventKind> {
    use new::EventKind as K;
    let tag = new::CtxTag {
        context: 5,
        step_tag: new::CtxTag::step_tag_of(41),
    };
    let place = new::Place {
        device: 0,
        stream: 0,
        pool: new::PoolId(0, 0),
        ctx: tag,
    };
    let span = new::RingSpan {
        ring: 1,
        before: 1,
        after: 2,
        exact: false,
        ambiguous: true,
    };
    vec![
        K::Frame {
            id: 1,
            file: 2,
            function: 1,
            line: 118,
        },
        K::Stack {
            id: 1,
            frame: 1,
            parent: 0,
        },
        K::Context {
            id: 5,
            module: 1,
            phase: new::Phase::Forward,
            stack: 1,
            step: None,
        },
        K::Context {
            id: 6,
            module: 0,
            phase: new::Phase::Optimizer,
            stack: 0,
            step: Some(41),
        },
        K::Marker {
            value: 41,
            source: new::MarkSource::OptimizerStep { optimizer: 1 },
        },
        K::Marker {
            value: 7,
            source: new::MarkSource::User,
        },
        K::Stats {
            device: 0,
            stats: new::Stats {
                allocated: 4096,
                reserved: 20 * MIB,
                active: 4096,
                requested: 4096,
                allocated_peak: 4096,
                reserved_peak: 20 * MIB,
                active_peak: 4096,
                segments: 1,
                ..Default::default()
            },
        },
        K::StatsPosition {
            device: 0,
            at: new::RingSpan {
                before: 2,
                after: 2,
                exact: true,
                ambiguous: false,
                ..span
            },
        },
        K::SnapshotBegin {
            device: 0,
            id: 3,
            segments: 1,
            blocks: 1,
            at: Some(span),
        },
        K::SnapshotSegment {
            id: 3,
            place: new::Place {
                ctx: new::CtxTag::NONE,
                ..place
            },
            addr: 0x7f00_0000_0000,
            size: 20 * MIB,
            pool_kind: new::SegmentPool::Large,
            expandable: false,
        },
        K::SnapshotBlock {
            id: 3,
            device: 0,
            addr: 0x7f00_0000_0000,
            size: 20 * MIB,
            requested: 4096,
            state: new::BlockState::Allocated,
            ctx: tag,
        },
        K::SnapshotEnd { device: 0, id: 3 },
        K::Dropped {
            device: new_codec::NO_DEVICE,
            what: new::DropWhat::Stacks,
            count: 12,
            bound: 64,
        },
        K::Roles { list: 1, count: 1 },
        K::Role {
            list: 1,
            device: 0,
            addr: 0x7f00_0000_0000,
            bytes: 4096,
            held: new::Held::Parameter,
            module: 1,
        },
        K::RolesEnd { list: 1, count: 1 },
        K::Dropped {
            device: new_codec::NO_DEVICE,
            what: new::DropWhat::Roles,
            count: 5,
            bound: 16384,
        },
        K::Outside(new::Outside {
            op: new::OutsideOp::Total,
            device: 0,
            library: new::Library::Cuda,
            kind: new::OutsideKind::Context,
            addr: 0,
            bytes: 500 * MIB,
            name: [0; 24],
        }),
        K::Outside(new::Outside {
            op: new::OutsideOp::Alloc,
            device: 0,
            library: new::Library::Nccl,
            kind: new::OutsideKind::Physical,
            addr: 0x7f20_0000_0000,
            bytes: 64 * MIB,
            name: name24("libnccl.so.2"),
        }),
        K::Outside(new::Outside {
            op: new::OutsideOp::Free,
            device: 0,
            library: new::Library::Nccl,
            kind: new::OutsideKind::Physical,
            addr: 0x7f20_0000_0000,
            bytes: 64 * MIB,
            name: name24("libnccl.so.2"),
        }),
        // A name longer than 24 bytes: its first 24 sent.
        K::Outside(new::Outside {
            op: new::OutsideOp::Alloc,
            device: new_codec::NO_DEVICE,
            library: new::Library::Other(0),
            kind: new::OutsideKind::Host,
            addr: 0x5500,
            bytes: 4096,
            name: name24("libcudnn_engines_runtime_compiled.so.9"),
        }),
        // The device ring, drained after the agent ring.
        K::SegmentAlloc {
            place,
            addr: 0x7f00_0000_0000,
            size: 20 * MIB,
        },
        K::Alloc {
            place,
            addr: 0x7f00_0000_0000,
            size: 4096,
        },
    ]
}

#[test]
fn a_segment_of_another_major_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 16);
    cfg.tag = Some("good".into());
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut bytes = std::fs::read(seg.path()).unwrap();
    bytes[8..12].copy_from_slice(&[2, 0, 0, 0]); // major 2, minor 0
    let path = dir.path().join(
        vramscope_wire::ring::discover::segment_name(
            vramscope_wire::ring::discover::current_uid(),
            std::process::id(),
            Some("major2"),
        )
        .unwrap(),
    );
    std::fs::write(&path, &bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let msg = SegmentReader::open(&path).err().unwrap().to_string();
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("format version 2.0"), "{msg}");
    assert!(msg.contains("reads 1.0 to 1.3"), "{msg}");
    // The 1.0 reader refused it too.
    assert!(layout::parse_header(&bytes, bytes.len() as u64).is_err());
}
