//! Behaviour tests of `SimAllocator` against the rules of PyTorch's
//! `CUDACachingAllocator.cpp`, plus a property test of its invariants.

use proptest::prelude::*;

use super::allocator::{NullSink, SegmentInfo, SimAllocator, SimConfig};
use super::conf::AllocConf;
use crate::model::device::HeldSegment;
use vramscope_wire::event::{BlockState, Event, EventKind, SegmentPool};

const MIB: u64 = 1 << 20;

/// A fresh allocator with `PYTORCH_CUDA_ALLOC_CONF=conf` on a device of
/// `capacity` bytes, and an empty list for its events.
fn sim(conf: &str, capacity: u64) -> (SimAllocator, Vec<Event>) {
    sim_with_fraction(conf, capacity, None)
}

/// [`sim`] with a per-process memory fraction.
fn sim_with_fraction(
    conf: &str,
    capacity: u64,
    memory_fraction: Option<f64>,
) -> (SimAllocator, Vec<Event>) {
    let a = SimAllocator::new(SimConfig {
        capacity,
        alloc: AllocConf::parse(conf).unwrap(),
        memory_fraction,
        ..SimConfig::default()
    });
    (a, Vec::new())
}

fn kinds(ev: &[Event]) -> Vec<&'static str> {
    ev.iter()
        .map(|e| match e.kind {
            EventKind::Alloc { .. } => "alloc",
            EventKind::FreeRequested { .. } => "free_requested",
            EventKind::FreeCompleted { .. } => "free_completed",
            EventKind::SegmentAlloc { .. } => "segment_alloc",
            EventKind::SegmentFree { .. } => "segment_free",
            EventKind::SegmentMap { .. } => "segment_map",
            EventKind::SegmentUnmap { .. } => "segment_unmap",
            EventKind::Oom { .. } => "oom",
            _ => "other",
        })
        .collect()
}

/// The invariants of one segment's block structure.
fn check_segment(s: &SegmentInfo) {
    assert!(!s.blocks.is_empty());
    // Blocks tile the segment exactly.
    let mut at = s.addr;
    for b in &s.blocks {
        assert_eq!(b.addr, at, "gap or overlap in segment {:#x}", s.addr);
        assert!(b.size >= 512 && b.size % 512 == 0);
        at += b.size;
    }
    assert_eq!(at, s.addr + s.size);
    // Free neighbours are always merged.
    for w in s.blocks.windows(2) {
        assert!(
            !(w[0].state == BlockState::Inactive && w[1].state == BlockState::Inactive),
            "two adjacent free blocks"
        );
    }
    if !s.expandable {
        let expect = match s.pool {
            SegmentPool::Small => s.size == 2 * MIB,
            SegmentPool::Large => s.size > MIB && s.size % (2 * MIB) == 0,
        };
        assert!(expect, "segment size {} for {:?}", s.size, s.pool);
    }
    if s.pool == SegmentPool::Small && !s.expandable {
        for b in &s.blocks {
            assert!(b.size <= 2 * MIB);
        }
    }
}

/// Checks every invariant tying the statistics to the block structure.
pub(super) fn check_invariants(a: &SimAllocator) {
    let st = a.stats();
    let segs: Vec<SegmentInfo> = a.segments();
    let mut allocated = 0;
    let mut active = 0;
    let mut reserved = 0;
    let mut inactive_split = 0;
    let mut requested = 0;
    let mut prev_end = 0;
    for s in &segs {
        assert!(s.addr >= prev_end, "segments overlap");
        prev_end = s.addr + s.size;
        reserved += s.size;
        check_segment(s);
        for b in &s.blocks {
            match b.state {
                BlockState::Allocated => {
                    allocated += b.size;
                    active += b.size;
                    requested += b.requested;
                    assert!(b.requested <= b.size);
                }
                BlockState::PendingFree => {
                    active += b.size;
                    requested += b.requested;
                }
                BlockState::Inactive => {
                    if !s.expandable && s.blocks.len() > 1 {
                        inactive_split += b.size;
                    }
                }
            }
        }
    }
    assert_eq!(st.allocated, allocated, "allocated");
    assert_eq!(st.active, active, "active");
    assert_eq!(st.reserved, reserved, "reserved = sum of segment sizes");
    assert_eq!(st.inactive_split, inactive_split, "inactive_split");
    assert_eq!(st.requested, requested, "requested");
    assert_eq!(
        st.segments,
        segs.iter().filter(|s| !s.expandable).count() as u64,
        "segment count (cudaMalloc segments)"
    );
    assert!(st.allocated <= st.active && st.active <= st.reserved);
    assert!(st.allocated <= st.allocated_peak && st.reserved <= st.reserved_peak);
    assert!(st.active <= st.active_peak);
    assert_eq!(a.device_free(), a.config().capacity - st.reserved);
}

#[test]
fn reuses_cached_block() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let p = a.malloc(1000, 0, &mut ev).unwrap();
    assert_eq!(kinds(&ev), ["segment_alloc", "alloc"]);
    assert_eq!(a.block_size(p), Some(1024));
    match ev[1].kind {
        EventKind::Alloc { size, addr, .. } => {
            assert_eq!(size, 1000, "ALLOC carries the caller's request");
            assert_eq!(addr, p);
        }
        _ => unreachable!(),
    }
    a.free(p, &mut ev).unwrap();
    ev.clear();
    let q = a.malloc(1000, 0, &mut ev).unwrap();
    assert_eq!(p, q);
    assert_eq!(kinds(&ev), ["alloc"], "no new segment");
    assert_eq!(a.stats().segments, 1);
    assert_eq!(a.stats().reserved, 2 * MIB);
    check_invariants(&a);
}

#[test]
fn split_and_merge() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let x = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    assert_eq!(
        a.stats().reserved,
        20 * MIB,
        "5 MiB request gets a 20 MiB segment"
    );
    assert_eq!(a.stats().inactive_split, 15 * MIB);
    let y = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    assert_eq!(y, x + 5 * MIB, "second block split from the same segment");
    assert_eq!(a.stats().inactive_split, 10 * MIB);
    assert_eq!(a.inactive_split_blocks(), 1);
    check_invariants(&a);
    a.free(x, &mut ev).unwrap();
    assert_eq!(a.stats().inactive_split, 15 * MIB);
    assert_eq!(a.inactive_split_blocks(), 2);
    check_invariants(&a);
    a.free(y, &mut ev).unwrap();
    // Merged back into one unsplit free block.
    assert_eq!(a.stats().inactive_split, 0);
    assert_eq!(a.inactive_split_blocks(), 0);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].blocks.len(), 1);
    assert_eq!(segs[0].blocks[0].size, 20 * MIB);
    assert_eq!(a.stats().reserved, 20 * MIB);
    assert_eq!(a.largest_free_block(), 20 * MIB);
    check_invariants(&a);
}

#[test]
fn large_segments_round_to_2mib_and_small_pool() {
    let (mut a, mut ev) = sim("", 1 << 30);
    a.malloc(15 * MIB, 0, &mut ev).unwrap();
    assert_eq!(a.stats().reserved, 16 * MIB, "15 MiB gets a 16 MiB segment");
    a.malloc(MIB, 0, &mut ev).unwrap();
    let segs = a.segments();
    assert!(segs
        .iter()
        .any(|s| s.pool == SegmentPool::Small && s.size == 2 * MIB));
    a.malloc(MIB + 1, 0, &mut ev).unwrap();
    let segs = a.segments();
    assert!(segs
        .iter()
        .any(|s| s.pool == SegmentPool::Large && s.size == 20 * MIB));
    assert_eq!(a.stats().reserved, 16 * MIB + 2 * MIB + 20 * MIB);
    // 15 MiB in a 16 MiB segment: 1 MiB remains, not > 1 MiB, no split.
    let s16 = segs.iter().find(|s| s.size == 16 * MIB).unwrap();
    assert_eq!(s16.blocks.len(), 1);
    check_invariants(&a);
}

#[test]
fn best_fit_picks_smallest_sufficient_block() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let big = a.malloc(40 * MIB, 0, &mut ev).unwrap();
    let small = a.malloc(12 * MIB, 0, &mut ev).unwrap();
    a.free(big, &mut ev).unwrap();
    a.free(small, &mut ev).unwrap();
    // 11 MiB fits both cached segments; best fit takes the 12 MiB one.
    let p = a.malloc(11 * MIB, 0, &mut ev).unwrap();
    assert_eq!(p, small);
    check_invariants(&a);
}

#[test]
fn streams_do_not_share_blocks() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let p = a.malloc(4096, 0, &mut ev).unwrap();
    a.free(p, &mut ev).unwrap();
    ev.clear();
    let q = a.malloc(4096, 7, &mut ev).unwrap();
    assert_ne!(p, q);
    assert_eq!(kinds(&ev), ["segment_alloc", "alloc"]);
    assert_eq!(a.stats().segments, 2);
    match ev[0].kind {
        EventKind::SegmentAlloc { place, .. } => assert_eq!(place.stream, 7),
        _ => unreachable!(),
    }
    check_invariants(&a);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole() {
    let (mut a, mut ev) = sim("max_split_size_mb:40", 1 << 30);
    let p = a.malloc(64 * MIB, 0, &mut ev).unwrap();
    a.free(p, &mut ev).unwrap();
    // A request below max_split_size never takes the oversize block.
    ev.clear();
    let q = a.malloc(30 * MIB, 0, &mut ev).unwrap();
    assert_ne!(p, q);
    assert_eq!(kinds(&ev), ["segment_alloc", "alloc"]);
    // An oversize request more than 20 MiB smaller does not take it either.
    ev.clear();
    let r = a.malloc(44 * MIB, 0, &mut ev).unwrap();
    assert_ne!(r, p);
    assert_eq!(kinds(&ev), ["segment_alloc", "alloc"]);
    // Within 20 MiB it does, unsplit: the whole 64 MiB counts as allocated.
    ev.clear();
    let before = a.stats().allocated;
    let s = a.malloc(50 * MIB, 0, &mut ev).unwrap();
    assert_eq!(s, p);
    assert_eq!(kinds(&ev), ["alloc"]);
    assert_eq!(a.stats().allocated - before, 64 * MIB);
    assert_eq!(a.block_size(s), Some(64 * MIB));
    check_invariants(&a);
}

#[test]
fn max_split_release_available_frees_oversize_blocks_first() {
    // 200 MiB device; cache two oversize blocks, then ask for more than fits.
    let (mut a, mut ev) = sim("max_split_size_mb:20", 200 * MIB);
    let x = a.malloc(60 * MIB, 0, &mut ev).unwrap();
    let y = a.malloc(70 * MIB, 0, &mut ev).unwrap();
    let _keep = a.malloc(30 * MIB, 0, &mut ev).unwrap();
    a.free(x, &mut ev).unwrap();
    a.free(y, &mut ev).unwrap();
    ev.clear();
    // 100 MiB: no cached fit, cudaMalloc fails (160 + 100 > 200); no single
    // oversize block is large enough, so the largest are freed until 100 MiB.
    a.malloc(100 * MIB, 0, &mut ev).unwrap();
    assert_eq!(
        kinds(&ev),
        ["segment_free", "segment_free", "segment_alloc", "alloc"]
    );
    assert_eq!(
        a.stats().alloc_retries,
        0,
        "release_available_cached_blocks is not a retry"
    );
    check_invariants(&a);
}

#[test]
fn expandable_segments_map_and_unmap() {
    let (mut a, mut ev) = sim("expandable_segments:True", 1 << 30);
    let x = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    assert_eq!(kinds(&ev), ["segment_map", "alloc"]);
    match ev[0].kind {
        EventKind::SegmentMap { addr, size, .. } => {
            assert_eq!(size, 20 * MIB, "large pool maps 20 MiB pages");
            assert_eq!(addr, x);
        }
        _ => unreachable!(),
    }
    assert_eq!(a.stats().reserved, 20 * MIB);
    assert_eq!(a.stats().segments, 0, "mapping is not a cudaMalloc segment");
    assert_eq!(
        a.stats().inactive_split,
        0,
        "expandable segments are excluded"
    );
    ev.clear();
    let y = a.malloc(30 * MIB, 0, &mut ev).unwrap();
    assert_eq!(y, x + 5 * MIB, "grows in place after the first block");
    assert_eq!(kinds(&ev), ["segment_map", "alloc"]);
    assert_eq!(a.stats().reserved, 40 * MIB);
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].expandable);
    assert_eq!(segs[0].size, 40 * MIB);
    let sizes: Vec<u64> = segs[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(sizes, [5 * MIB, 30 * MIB, 5 * MIB]);
    check_invariants(&a);
    // Small pool uses 2 MiB pages.
    ev.clear();
    a.malloc(4096, 0, &mut ev).unwrap();
    match ev[0].kind {
        EventKind::SegmentMap { size, .. } => assert_eq!(size, 2 * MIB),
        _ => unreachable!(),
    }
    ev.clear();
    a.free(x, &mut ev).unwrap();
    a.free(y, &mut ev).unwrap();
    ev.clear();
    a.empty_cache(&mut ev);
    let unmaps: Vec<(u64, u64)> = ev
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::SegmentUnmap { addr, size, .. } => Some((addr, size)),
            _ => None,
        })
        .collect();
    assert_eq!(unmaps, [(x, 40 * MIB)], "the large segment's pages go back");
    assert_eq!(
        a.stats().reserved,
        2 * MIB,
        "the small pool page is still in use"
    );
    check_invariants(&a);
}

#[test]
fn expandable_unmap_keeps_partially_used_pages() {
    let (mut a, mut ev) = sim("expandable_segments:True", 1 << 30);
    let x = a.malloc(30 * MIB, 0, &mut ev).unwrap(); // pages 0-1
    let y = a.malloc(15 * MIB, 0, &mut ev).unwrap(); // [30, 45) -> pages 1-2
    assert_eq!(a.stats().reserved, 60 * MIB);
    a.free(x, &mut ev).unwrap();
    ev.clear();
    a.empty_cache(&mut ev);
    // Only page 0 is wholly free: [0, 20) unmapped, [20, 30) stays mapped.
    assert_eq!(kinds(&ev), ["segment_unmap"]);
    assert_eq!(a.stats().reserved, 40 * MIB);
    let segs = a.segments();
    assert_eq!(segs.len(), 1, "one contiguous mapped range");
    assert_eq!(segs[0].addr, x + 20 * MIB);
    check_invariants(&a);
    // Freed low pages are refilled first.
    ev.clear();
    let z = a.malloc(25 * MIB, 0, &mut ev).unwrap();
    assert_eq!(z, x, "lowest address first");
    assert_eq!(kinds(&ev), ["segment_map", "alloc"]);
    a.free(y, &mut ev).unwrap();
    check_invariants(&a);
}

#[test]
fn oom_retry_frees_cache_and_succeeds() {
    let (mut a, mut ev) = sim("", 100 * MIB);
    let p = a.malloc(60 * MIB, 0, &mut ev).unwrap();
    a.free(p, &mut ev).unwrap();
    ev.clear();
    a.malloc(70 * MIB, 0, &mut ev).unwrap();
    assert_eq!(kinds(&ev), ["segment_free", "segment_alloc", "alloc"]);
    let st = a.stats();
    assert_eq!(st.alloc_retries, 1);
    assert_eq!(st.ooms, 0);
    assert_eq!(st.reserved, 70 * MIB);
    check_invariants(&a);
}

#[test]
fn oom_with_fragmented_free_memory() {
    let (mut a, mut ev) = sim("", 100 * MIB);
    // Four 20 MiB segments, each with one live 5 MiB tensor and 15 MiB free.
    let mut live = Vec::new();
    for _ in 0..4 {
        live.push(a.malloc(5 * MIB, 0, &mut ev).unwrap());
        let filler = a.malloc(15 * MIB, 0, &mut ev).unwrap();
        live.push(filler);
    }
    for f in live.iter().skip(1).step_by(2) {
        a.free(*f, &mut ev).unwrap();
    }
    assert_eq!(a.stats().reserved, 80 * MIB);
    assert_eq!(a.stats().allocated, 20 * MIB);
    ev.clear();
    let err = a.malloc(30 * MIB, 0, &mut ev).unwrap_err();
    assert_eq!(
        kinds(&ev),
        ["oom"],
        "nothing releasable: every segment is split"
    );
    match ev[0].kind {
        EventKind::Oom {
            device_free,
            request,
            ..
        } => {
            assert_eq!(device_free, 20 * MIB);
            assert_eq!(request, 30 * MIB);
        }
        _ => unreachable!(),
    }
    assert_eq!(err.device_free, 20 * MIB);
    assert_eq!(err.reserved - err.allocated, 60 * MIB);
    assert!(err
        .to_string()
        .contains("60.00 MiB is reserved by PyTorch but unallocated"));
    let st = a.stats();
    assert_eq!(st.ooms, 1);
    assert_eq!(st.alloc_retries, 1);
    check_invariants(&a);
}

#[test]
fn empty_cache_frees_only_whole_free_segments() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let a1 = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    let _a2 = a.malloc(5 * MIB, 0, &mut ev).unwrap(); // same segment as a1
    let b1 = a.malloc(30 * MIB, 0, &mut ev).unwrap();
    let c1 = a.malloc(100, 0, &mut ev).unwrap();
    a.free(a1, &mut ev).unwrap();
    a.free(b1, &mut ev).unwrap();
    a.free(c1, &mut ev).unwrap();
    ev.clear();
    a.empty_cache(&mut ev);
    let freed: Vec<u64> = ev
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::SegmentFree { size, .. } => Some(size),
            _ => None,
        })
        .collect();
    // Large pool first, then small; the split 20 MiB segment stays.
    assert_eq!(freed, [30 * MIB, 2 * MIB]);
    assert_eq!(a.stats().reserved, 20 * MIB);
    assert_eq!(a.stats().segments, 1);
    check_invariants(&a);
}

#[test]
fn record_stream_defers_free() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let p = a.malloc(3 * MIB, 0, &mut ev).unwrap();
    a.record_stream(p, 9).unwrap();
    ev.clear();
    a.free(p, &mut ev).unwrap();
    assert_eq!(kinds(&ev), ["free_requested"]);
    let segs = a.segments();
    assert_eq!(segs[0].blocks[0].state, BlockState::PendingFree);
    assert_eq!(a.stats().allocated, 0);
    assert_eq!(a.stats().active, 3 * MIB);
    check_invariants(&a);
    ev.clear();
    a.synchronize(&mut ev);
    assert_eq!(kinds(&ev), ["free_completed"]);
    assert_eq!(a.stats().active, 0);
    check_invariants(&a);
}

#[test]
fn garbage_collection_threshold_reclaims_old_blocks() {
    let run = |conf: &str| {
        let (mut a, mut ev) = sim_with_fraction(conf, 100 * MIB, Some(1.0));
        let x = a.malloc(30 * MIB, 0, &mut ev).unwrap();
        let y = a.malloc(30 * MIB, 0, &mut ev).unwrap();
        a.free(x, &mut ev).unwrap();
        a.free(y, &mut ev).unwrap();
        ev.clear();
        a.malloc(40 * MIB, 0, &mut ev).unwrap();
        check_invariants(&a);
        (kinds(&ev), a.stats())
    };
    let (k, st) = run("garbage_collection_threshold:0.5");
    assert_eq!(
        k,
        ["segment_free", "segment_free", "segment_alloc", "alloc"]
    );
    assert_eq!(st.reserved, 40 * MIB);
    assert_eq!(st.alloc_retries, 0);
    let (k, st) = run("");
    assert_eq!(k, ["segment_alloc", "alloc"]);
    assert_eq!(st.reserved, 100 * MIB);
}

#[test]
fn memory_fraction_limits_reserved() {
    let (mut a, mut ev) = sim_with_fraction("", 100 * MIB, Some(0.5));
    a.malloc(40 * MIB, 0, &mut ev).unwrap();
    assert!(a.malloc(20 * MIB, 0, &mut ev).is_err());
    assert_eq!(a.stats().ooms, 1);
}

#[test]
fn snapshot_events_match_segments() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let p = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    a.malloc(100, 1, &mut ev).unwrap();
    a.malloc(7 * MIB, 0, &mut ev).unwrap();
    a.free(p, &mut ev).unwrap();
    ev.clear();
    let id = a.snapshot(&mut ev);
    let segs = a.segments();
    let nblocks: usize = segs.iter().map(|s| s.blocks.len()).sum();
    assert_eq!(ev.len(), 2 + segs.len() + nblocks);
    match ev[0].kind {
        EventKind::SnapshotBegin {
            id: i,
            segments,
            blocks,
            ..
        } => {
            assert_eq!(i, id);
            assert_eq!(segments as usize, segs.len());
            assert_eq!(blocks as usize, nblocks);
        }
        _ => panic!("begin first"),
    }
    assert!(matches!(
        ev.last().unwrap().kind,
        EventKind::SnapshotEnd { .. }
    ));
    let mut i = 1;
    for s in &segs {
        match ev[i].kind {
            EventKind::SnapshotSegment {
                addr,
                size,
                pool_kind,
                place,
                ..
            } => {
                assert_eq!(
                    (addr, size, pool_kind, place.stream),
                    (s.addr, s.size, s.pool, s.stream)
                );
            }
            _ => panic!("segment expected"),
        }
        i += 1;
        for b in &s.blocks {
            match ev[i].kind {
                EventKind::SnapshotBlock {
                    addr, size, state, ..
                } => {
                    assert_eq!((addr, size, state), (b.addr, b.size, b.state));
                }
                _ => panic!("block expected"),
            }
            i += 1;
        }
    }
}

#[test]
fn zero_byte_request_is_a_null_pointer() {
    let (mut a, mut ev) = sim("", 1 << 30);
    assert_eq!(a.malloc(0, 0, &mut ev), Ok(0));
    a.free(0, &mut ev).unwrap();
    assert!(ev.is_empty());
    assert_eq!(a.stats().reserved, 0);
}

#[test]
fn free_of_unknown_address_is_an_error() {
    let (mut a, mut ev) = sim("", 1 << 30);
    let p = a.malloc(100, 0, &mut ev).unwrap();
    a.free(p, &mut ev).unwrap();
    assert!(a.free(p, &mut ev).is_err());
    assert!(a.free(12345, &mut ev).is_err());
}

#[test]
fn small_pool_expandable_segment_grows_past_one_page() {
    // Found by the property test: small-pool expandable segments map 2 MiB
    // pages, and free space may span several of them.
    let (mut a, mut ev) = sim("expandable_segments:True", 1 << 30);
    let ps: Vec<u64> = (0..5)
        .map(|_| a.malloc(900 * 1024, 0, &mut ev).unwrap())
        .collect();
    assert_eq!(a.stats().reserved, 6 * MIB, "three 2 MiB pages");
    for p in &ps[..4] {
        a.free(*p, &mut ev).unwrap();
    }
    let segs = a.segments();
    assert_eq!(segs.len(), 1);
    assert!(segs[0].blocks[0].size > 2 * MIB);
    check_invariants(&a);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: u64, stream: u64 },
    Free(usize),
    RecordStream(usize),
    EmptyCache,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        1u64..4096,
        4096u64..(1 << 20),
        (1u64 << 20)..(10 << 20),
        (10u64 << 20)..(120 << 20),
    ];
    prop_oneof![
        6 => (size, 0u64..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        5 => any::<prop::sample::Index>().prop_map(|i| Op::Free(i.index(1 << 16))),
        1 => any::<prop::sample::Index>().prop_map(|i| Op::RecordStream(i.index(1 << 16))),
        1 => Just(Op::EmptyCache),
    ]
}

/// `a`'s segments as a block map shows them (a block pending free is
/// free, as the advisor takes it).
fn held(a: &SimAllocator) -> Vec<HeldSegment> {
    (a.segments().iter())
        .map(|s| HeldSegment {
            addr: s.addr,
            stream: s.stream,
            pool: s.pool,
            blocks: (s.blocks.iter())
                .map(|b| {
                    let held = (b.state == BlockState::Allocated).then_some(b.requested);
                    (b.size, held)
                })
                .collect(),
        })
        .collect()
}

/// Block maps no device holds (sizes that would overflow a figure,
/// overlapping or empty segments) are refused whole, nothing changed.
#[test]
fn an_impossible_block_map_is_refused() {
    let (mut a, _) = sim("", 512 * MIB);
    let seg = |addr: u64, blocks: Vec<(u64, Option<u64>)>| HeldSegment {
        addr,
        stream: 0,
        pool: SegmentPool::Large,
        blocks,
    };
    assert!(a.install(&seg(
        0x1000_0000,
        vec![(20 * MIB, Some(MIB)), (20 * MIB, None)]
    )));
    let before = figures(&a);
    for bad in [
        seg(0x2000_0000, vec![(u64::MAX, Some(1))]),
        seg(0x2000_0000, vec![(1 << 62, None), (1 << 62, None)]),
        seg(
            0x2000_0000,
            vec![(2 * MIB, Some(u64::MAX)), (2 * MIB, Some(u64::MAX))],
        ),
        seg(u64::MAX - MIB, vec![(2 * MIB, None)]),
        seg(0x1000_0000 + MIB, vec![(2 * MIB, None)]),
        seg(0x3000_0000, vec![]),
        seg(0x3000_0000, vec![(0, Some(0))]),
    ] {
        assert!(!a.install(&bad), "{bad:?}");
        assert_eq!(figures(&a), before);
    }
    check_invariants(&a);
}

fn figures(a: &SimAllocator) -> [u64; 6] {
    let s = a.stats();
    [
        s.allocated,
        s.reserved,
        s.segments,
        s.inactive_split,
        s.requested,
        a.inactive_split_blocks(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A job already running: an allocator that installs another's
    /// segments (its block map) has its figures, and goes on exactly as
    /// it does, request by request, addresses included.
    #[test]
    fn an_installed_allocator_goes_on_as_the_one_it_was_read_from(
        conf in prop_oneof![Just(""), Just("max_split_size_mb:32"), Just("roundup_power2_divisions:4")],
        before in prop::collection::vec(op_strategy(), 1..120),
        after in prop::collection::vec(op_strategy(), 1..120),
    ) {
        let (mut a, _) = sim(conf, 512 * MIB);
        let mut live: Vec<u64> = Vec::new();
        let run = |a: &mut SimAllocator, ops: &[Op], live: &mut Vec<u64>, b: Option<&mut SimAllocator>| {
            let mut b = b;
            for op in ops {
                match *op {
                    Op::Alloc { size, stream } => {
                        let got = a.malloc(size, stream, &mut NullSink).ok();
                        if let Some(b) = b.as_deref_mut() {
                            // The copy's new segments where the first's went.
                            let segs: Vec<u64> = a.segments().iter().map(|s| s.addr).collect();
                            let new = segs.iter().find(|x| !b.segments().iter().any(|s| s.addr == **x)).copied();
                            b.set_segment_addr(new);
                            assert_eq!(b.malloc(size, stream, &mut NullSink).ok(), got);
                        }
                        live.extend(got);
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let p = live.swap_remove(i % live.len());
                        a.free(p, &mut NullSink).unwrap();
                        if let Some(b) = b.as_deref_mut() {
                            b.free(p, &mut NullSink).unwrap();
                        }
                    }
                    Op::EmptyCache => {
                        a.empty_cache(&mut NullSink);
                        if let Some(b) = b.as_deref_mut() {
                            b.empty_cache(&mut NullSink);
                        }
                    }
                    _ => {}
                }
                if let Some(b) = b.as_deref() {
                    assert_eq!(figures(b), figures(a));
                }
            }
        };
        run(&mut a, &before, &mut live, None);
        let (mut b, _) = sim(conf, 512 * MIB);
        for seg in held(&a) {
            prop_assert!(b.install(&seg));
        }
        prop_assert_eq!(figures(&b), figures(&a));
        check_invariants(&b);
        run(&mut a, &after, &mut live, Some(&mut b));
        check_invariants(&b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        // Keep the crate root clean; found cases become unit tests instead.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn invariants_hold_for_random_sequences(
        conf in prop_oneof![
            Just(""),
            Just("expandable_segments:True"),
            Just("max_split_size_mb:32"),
            Just("roundup_power2_divisions:4,max_split_size_mb:64"),
            Just("garbage_collection_threshold:0.6"),
        ],
        ops in prop::collection::vec(op_strategy(), 1..150),
    ) {
        let fraction = if conf.contains("garbage") { Some(0.9) } else { None };
        let (mut a, mut ev) = sim_with_fraction(conf, 512 * MIB, fraction);
        let mut live: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    if let Ok(p) = a.malloc(size, stream, &mut ev) {
                        prop_assert!(a.block_size(p).unwrap() >= size);
                        live.push(p);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let p = live.swap_remove(i % live.len());
                    a.free(p, &mut ev).unwrap();
                }
                Op::RecordStream(i) if !live.is_empty() => {
                    let p = live[i % live.len()];
                    a.record_stream(p, 5).unwrap();
                }
                Op::EmptyCache => a.empty_cache(&mut ev),
                _ => {}
            }
            check_invariants(&a);
        }
        // Freeing everything and emptying the cache returns all memory.
        for p in live {
            a.free(p, &mut ev).unwrap();
        }
        a.empty_cache(&mut ev);
        check_invariants(&a);
        prop_assert_eq!(a.stats().reserved, 0);
        prop_assert_eq!(a.stats().segments, 0);
        prop_assert!(a.segments().is_empty());
    }
}

#[test]
fn segment_addresses_from_a_trace_break_ties_as_pytorch_does() {
    let (mut a, mut ev) = sim("", 1 << 30);
    // Two 20 MiB segments; the real driver put the second one lower.
    a.set_segment_addr(Some(0x7f80_c000_0000));
    let x = a.malloc(12 * MIB, 0, &mut ev).unwrap();
    a.set_segment_addr(Some(0x7f80_b000_0000));
    let y = a.malloc(12 * MIB, 0, &mut ev).unwrap();
    assert_eq!((x, y), (0x7f80_c000_0000, 0x7f80_b000_0000));
    a.free(x, &mut ev).unwrap();
    a.free(y, &mut ev).unwrap();
    // Equal free blocks: the lower address wins, as in PyTorch's
    // BlockComparatorSize.
    assert_eq!(a.malloc(12 * MIB, 0, &mut ev).unwrap(), 0x7f80_b000_0000);
    assert_eq!(a.malloc(12 * MIB, 0, &mut ev).unwrap(), 0x7f80_c000_0000);
}

#[test]
fn ties_broken_high_take_the_other_equal_block() {
    // The counterfactual sim::diff replays beside PyTorch's rule: among free
    // blocks of equal size, the highest address.
    let (mut a, mut ev) = sim("", 1 << 30);
    let x = a.malloc(12 * MIB, 0, &mut ev).unwrap();
    let y = a.malloc(12 * MIB, 0, &mut ev).unwrap();
    let (lo, hi) = (x.min(y), x.max(y));
    a.free(x, &mut ev).unwrap();
    a.free(y, &mut ev).unwrap();
    a.break_ties_high(true);
    assert_eq!(a.malloc(12 * MIB, 0, &mut ev).unwrap(), hi);
    a.break_ties_high(false);
    assert_eq!(a.malloc(12 * MIB, 0, &mut ev).unwrap(), lo);
}

#[test]
fn a_segment_address_is_used_once_and_only_where_it_fits() {
    let (mut a, mut ev) = sim("", 1 << 30);
    a.set_segment_addr(Some(0x7f80_0000_0000));
    let x = a.malloc(MIB, 0, &mut ev).unwrap();
    assert_eq!(x, 0x7f80_0000_0000);
    // Overlapping a live segment, misaligned: the simulator's own address.
    a.set_segment_addr(Some(0x7f80_0010_0000));
    let y = a.malloc(MIB, 1, &mut ev).unwrap();
    a.set_segment_addr(Some(0x7f90_0000_0100));
    let z = a.malloc(MIB, 2, &mut ev).unwrap();
    for p in [y, z] {
        assert!(p >> 40 == 0x7f && p != 0x7f80_0010_0000 && p != 0x7f90_0000_0100);
    }
    // A malloc served from the cache leaves the hint unused, and clears it.
    a.set_segment_addr(Some(0x7fa0_0000_0000));
    let w = a.malloc(512, 0, &mut ev).unwrap();
    assert_eq!(w, x + 1024 * 1024);
    let v = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    assert_ne!(v, 0x7fa0_0000_0000);
    let segs = a.segments();
    for s in &segs {
        check_segment(s);
    }
    let mut ranges: Vec<(u64, u64)> = segs.iter().map(|s| (s.addr, s.addr + s.size)).collect();
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "{ranges:x?}");
}

#[test]
fn an_expandable_segment_starts_where_the_real_reservation_did() {
    // cuMemAddressReserve aligns to the 2 MiB granularity, not to the
    // 20 MiB page: an address 2 MiB-aligned is taken as it is.
    let (mut a, mut ev) = sim("expandable_segments:True", 1 << 30);
    let base = 0x19_4000_0000 + 2 * MIB;
    a.set_segment_addr(Some(base));
    let x = a.malloc(30 * MIB, 0, &mut ev).unwrap();
    assert_eq!(x, base);
    let y = a.malloc(5 * MIB, 0, &mut ev).unwrap();
    assert_eq!(y, base + 30 * MIB);
    assert_eq!(a.stats().reserved, 40 * MIB);
    a.free(x, &mut ev).unwrap();
    a.free(y, &mut ev).unwrap();
    a.empty_cache(&mut ev);
    assert_eq!(a.stats().reserved, 0);
    assert!(a.segments().is_empty());
}

#[test]
fn absurd_capacities_and_sizes_are_an_oom_not_a_panic() {
    // Up to a 1 PiB device (the most sim::diff accepts): the address space
    // of an expandable segment is 1 1/8 of the device without overflowing.
    for conf in ["", "expandable_segments:True"] {
        for capacity in [1 << 30, 1 << 50] {
            let (mut a, mut ev) = sim(conf, capacity);
            assert!(a.malloc(u64::MAX, 0, &mut ev).is_err(), "{conf} {capacity}");
            assert!(
                a.malloc(capacity + 1, 0, &mut ev).is_err(),
                "{conf} {capacity}"
            );
            let x = a.malloc(3 * MIB, 0, &mut ev).unwrap();
            a.free(x, &mut ev).unwrap();
            a.empty_cache(&mut ev);
            assert_eq!(a.stats().reserved, 0);
        }
    }
}
