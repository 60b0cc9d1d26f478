//! Block-map reconstruction from events.
use super::*;
use crate::model::BlockRules;
use vramscope_wire::event::BlockState::{Allocated as A, Inactive as I, PendingFree as P};

#[test]
fn alloc_free_request_free_complete() {
    let mut m = synced_model();
    let mut e = Ev::new();
    let evs = [e.seg_alloc(BASE, 2 * MIB), e.alloc(BASE, 1000)];
    feed(&mut m, &evs);
    assert_eq!(
        rows(dev(&m)),
        vec![(BASE, 1024, A, 1000), (BASE + 1024, 2 * MIB - 1024, I, 0)]
    );
    let d = dev(&m).derived();
    assert_eq!((d.allocated, d.active, d.reserved), (1024, 1024, 2 * MIB));

    feed(&mut m, &[e.free_req(BASE, 1000)]);
    assert_eq!(rows(dev(&m))[0], (BASE, 1024, P, 1000));
    let d = dev(&m).derived();
    assert_eq!((d.allocated, d.active), (0, 1024));

    feed(&mut m, &[e.free_done(BASE, 1000)]);
    assert_eq!(
        rows(dev(&m)),
        vec![(BASE, 2 * MIB, I, 0)],
        "merged back into one free block"
    );
    assert_eq!(dev(&m).derived().active, 0);

    feed(&mut m, &[e.seg_free(BASE, 2 * MIB)]);
    assert!(rows(dev(&m)).is_empty());
    assert_eq!(dev(&m).derived(), Default::default());
    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 0);
    assert!(!p.needs_resync());
}

#[test]
fn merge_with_both_neighbours_only_when_inactive() {
    let mut m = synced_model();
    let mut e = Ev::new();
    let evs = [
        e.seg_alloc(BASE, 2 * MIB),
        e.alloc(BASE, 512),
        e.alloc(BASE + 512, 512),
        e.alloc(BASE + 1024, 512),
        // Middle block pending, outer ones freed: no merge across the pending one.
        e.free_req(BASE + 512, 512),
        e.free_req(BASE, 512),
        e.free_done(BASE, 512),
    ];
    feed(&mut m, &evs);
    assert_eq!(
        rows(dev(&m)),
        vec![
            (BASE, 512, I, 0),
            (BASE + 512, 512, P, 512),
            (BASE + 1024, 512, A, 512),
            (BASE + 1536, 2 * MIB - 1536, I, 0)
        ]
    );
    feed(&mut m, &[e.free_done(BASE + 512, 512)]);
    assert_eq!(
        rows(dev(&m)),
        vec![
            (BASE, 1024, I, 0),
            (BASE + 1024, 512, A, 512),
            (BASE + 1536, 2 * MIB - 1536, I, 0)
        ]
    );
    feed(
        &mut m,
        &[e.free_req(BASE + 1024, 512), e.free_done(BASE + 1024, 512)],
    );
    assert_eq!(rows(dev(&m)), vec![(BASE, 2 * MIB, I, 0)]);
}

#[test]
fn small_pool_split_rules() {
    let mut m = synced_model();
    let mut e = Ev::new();
    // Fill a small segment so that exactly 1024 B stay free at its end.
    let evs = [
        e.seg_alloc(BASE, 2 * MIB),
        e.alloc(BASE, MIB),
        e.alloc(BASE + MIB, MIB - 1024),
    ];
    feed(&mut m, &evs);
    assert_eq!(rows(dev(&m))[2], (BASE + 2 * MIB - 1024, 1024, I, 0));
    // 100 B rounds to 512; the 512 B remainder is split off (≥ 512).
    feed(&mut m, &[e.alloc(BASE + 2 * MIB - 1024, 100)]);
    assert_eq!(
        rows(dev(&m))[2..],
        [
            (BASE + 2 * MIB - 1024, 512, A, 100),
            (BASE + 2 * MIB - 512, 512, I, 0)
        ]
    );
    // Free it again, then 600 B rounds to 1024: exactly the hole.
    feed(
        &mut m,
        &[
            e.free_req(BASE + 2 * MIB - 1024, 100),
            e.free_done(BASE + 2 * MIB - 1024, 100),
        ],
    );
    feed(&mut m, &[e.alloc(BASE + 2 * MIB - 1024, 600)]);
    assert_eq!(rows(dev(&m))[2..], [(BASE + 2 * MIB - 1024, 1024, A, 600)]);
    assert_eq!(dev(&m).derived().allocated, 2 * MIB);
}

#[test]
fn large_pool_split_rules() {
    let mut m = synced_model();
    let mut e = Ev::new();
    // 19 MiB in a 20 MiB segment: the 1 MiB remainder is not > 1 MiB, so
    // the whole segment is handed out.
    feed(
        &mut m,
        &[e.seg_alloc(BASE, 20 * MIB), e.alloc(BASE, 19 * MIB)],
    );
    assert_eq!(rows(dev(&m)), vec![(BASE, 20 * MIB, A, 19 * MIB)]);
    assert_eq!(dev(&m).derived().allocated, 20 * MIB);
    // 18 MiB leaves 2 MiB: split.
    let s2 = BASE + 64 * MIB;
    feed(&mut m, &[e.seg_alloc(s2, 20 * MIB), e.alloc(s2, 18 * MIB)]);
    assert_eq!(
        rows(dev(&m))[1..],
        [(s2, 18 * MIB, A, 18 * MIB), (s2 + 18 * MIB, 2 * MIB, I, 0)]
    );
    // The freed 2 MiB block serves a 1.5 MiB request whole (remainder 0.5 MiB).
    feed(&mut m, &[e.alloc(s2 + 18 * MIB, 3 * MIB / 2)]);
    assert_eq!(rows(dev(&m))[2], (s2 + 18 * MIB, 2 * MIB, A, 3 * MIB / 2));
    // Pool kinds were guessed from segment sizes and confirmed by allocations.
    assert!(dev(&m)
        .segments()
        .all(|s| s.pool_kind == SegmentPool::Large && s.pool_kind_known));
}

#[test]
fn max_split_size_hands_out_whole_blocks() {
    let cfg = ModelConfig {
        rules: BlockRules {
            max_split_size: 8 * MIB,
        },
        ..ModelConfig::default()
    };
    let mut m = Model::new(cfg);
    let mut e = Ev::new();
    feed(
        &mut m,
        &[e.seg_alloc(BASE, 40 * MIB), e.alloc(BASE, 12 * MIB)],
    );
    assert_eq!(rows(dev(&m)), vec![(BASE, 40 * MIB, A, 12 * MIB)]);
}

#[test]
fn small_segment_kind_from_allocation() {
    let mut m = synced_model();
    let mut e = Ev::new();
    feed(&mut m, &[e.seg_alloc(BASE, 2 * MIB), e.alloc(BASE, 4)]);
    let s = dev(&m).segments().next().copied().unwrap();
    assert_eq!((s.pool_kind, s.pool_kind_known), (SegmentPool::Small, true));
    let f = dev(&m).block_summary();
    assert_eq!(f.largest_free_small, Some(2 * MIB - 512));
    assert_eq!(f.largest_free_large, None);
    assert_eq!(f.inactive_split, 2 * MIB - 512);
}

#[test]
fn expandable_segments_map_and_unmap() {
    let mut m = synced_model();
    let mut e = Ev::new();
    feed(&mut m, &[e.map(BASE, 20 * MIB), e.alloc(BASE, 3 * MIB)]);
    // Expandable segments split like the small pool: 17 MiB remain free.
    assert_eq!(
        rows(dev(&m)),
        vec![
            (BASE, 3 * MIB, A, 3 * MIB),
            (BASE + 3 * MIB, 17 * MIB, I, 0)
        ]
    );
    // Growing the mapping extends the segment and the free tail.
    feed(&mut m, &[e.map(BASE + 20 * MIB, 20 * MIB)]);
    let segs: Vec<_> = dev(&m)
        .segments()
        .map(|s| (s.addr, s.size, s.expandable))
        .collect();
    assert_eq!(segs, vec![(BASE, 40 * MIB, true)]);
    assert_eq!(rows(dev(&m))[1], (BASE + 3 * MIB, 37 * MIB, I, 0));
    assert_eq!(dev(&m).derived().reserved, 40 * MIB);
    // Free, then unmap the upper pages.
    feed(
        &mut m,
        &[
            e.free_req(BASE, 3 * MIB),
            e.free_done(BASE, 3 * MIB),
            e.unmap(BASE + 20 * MIB, 20 * MIB),
        ],
    );
    assert_eq!(rows(dev(&m)), vec![(BASE, 20 * MIB, I, 0)]);
    assert_eq!(dev(&m).derived().reserved, 20 * MIB);
    // Map more, unmap a hole in the middle: two mapped ranges, two segments.
    feed(
        &mut m,
        &[
            e.map(BASE + 20 * MIB, 40 * MIB),
            e.unmap(BASE + 20 * MIB, 20 * MIB),
        ],
    );
    let segs: Vec<_> = dev(&m).segments().map(|s| (s.addr, s.size)).collect();
    assert_eq!(segs, vec![(BASE, 20 * MIB), (BASE + 40 * MIB, 20 * MIB)]);
    assert_eq!(
        rows(dev(&m)),
        vec![(BASE, 20 * MIB, I, 0), (BASE + 40 * MIB, 20 * MIB, I, 0)]
    );
    // Mapping the hole again joins everything into one segment and one block.
    feed(&mut m, &[e.map(BASE + 20 * MIB, 20 * MIB)]);
    let segs: Vec<_> = dev(&m).segments().map(|s| (s.addr, s.size)).collect();
    assert_eq!(segs, vec![(BASE, 60 * MIB)]);
    assert_eq!(rows(dev(&m)), vec![(BASE, 60 * MIB, I, 0)]);
    // Unmapping everything removes the segment.
    feed(&mut m, &[e.unmap(BASE, 60 * MIB)]);
    assert_eq!(dev(&m).segments().count(), 0);
    assert_eq!(dev(&m).derived(), Default::default());
    assert_eq!(m.process(KEY).unwrap().inconsistencies(), 0);
}

#[test]
fn unmap_of_pages_in_use_is_a_contradiction() {
    let mut m = synced_model();
    let mut e = Ev::new();
    feed(
        &mut m,
        &[
            e.map(BASE, 20 * MIB),
            e.alloc(BASE, 3 * MIB),
            e.unmap(BASE, 20 * MIB),
        ],
    );
    let p = m.process(KEY).unwrap();
    assert_eq!(p.inconsistencies(), 1);
    assert!(p.needs_resync());
    // Totals stay consistent with the (now empty) map.
    assert_eq!(dev(&m).derived(), Default::default());
}

#[test]
fn streams_pools_and_adjacent_segments() {
    let mut m = synced_model();
    let mut e = Ev::new();
    let s1 = Place {
        device: 0,
        stream: 0x10,
        pool: PoolId(0, 0),
        ctx: Default::default(),
    };
    let s2 = Place {
        device: 0,
        stream: 0x20,
        pool: PoolId(3, 1),
        ctx: Default::default(),
    };
    e.place = s1;
    let mut evs = vec![e.seg_alloc(BASE, 2 * MIB), e.alloc(BASE, 512)];
    e.place = s2;
    // A second segment right after the first, on another stream and pool.
    evs.extend([
        e.seg_alloc(BASE + 2 * MIB, 2 * MIB),
        e.alloc(BASE + 2 * MIB, 512),
    ]);
    feed(&mut m, &evs);
    let d = dev(&m);
    let blocks: Vec<_> = d.blocks().map(|(a, b)| (a, b.stream, b.pool)).collect();
    assert_eq!(blocks[0], (BASE, 0x10, PoolId(0, 0)));
    assert_eq!(blocks[2], (BASE + 2 * MIB, 0x20, PoolId(3, 1)));
    let segs: Vec<_> = d.segments().map(|s| (s.stream, s.pool)).collect();
    assert_eq!(segs, vec![(0x10, PoolId(0, 0)), (0x20, PoolId(3, 1))]);
    // Freeing both: the free tail of the first segment and the head of the
    // second are adjacent in memory but never merge.
    e.place = s1;
    let mut evs = vec![e.free_req(BASE, 512), e.free_done(BASE, 512)];
    e.place = s2;
    evs.extend([
        e.free_req(BASE + 2 * MIB, 512),
        e.free_done(BASE + 2 * MIB, 512),
    ]);
    feed(&mut m, &evs);
    assert_eq!(
        rows(dev(&m)),
        vec![(BASE, 2 * MIB, I, 0), (BASE + 2 * MIB, 2 * MIB, I, 0)]
    );
}

#[test]
fn several_devices_are_separate() {
    let mut m = synced_model();
    let mut e = Ev::new();
    e.place = place(1, 0);
    feed(&mut m, &[e.seg_alloc(BASE, 2 * MIB), e.alloc(BASE, 512)]);
    let p = m.process(KEY).unwrap();
    assert_eq!(p.device(0).unwrap().derived().allocated, 0);
    assert_eq!(p.device(1).unwrap().derived().allocated, 512);
    // Device 1 has never been snapshotted: a resync is wanted.
    assert!(p.needs_resync());
}

#[test]
fn reference_allocator_workload_matches_exactly() {
    let mut m = synced_model();
    let mut r = RefAlloc::new();
    let mut live = Vec::new();
    let mut x = 12345u64;
    for i in 0..2_000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let size = match x >> 62 {
            0 => (x >> 40) % 4096 + 1,
            1 => (x >> 40) % (MIB * 3 / 2) + 1,
            _ => (x >> 40) % (24 * MIB) + 1,
        };
        if live.len() < 40 && (x >> 33) % 3 != 0 {
            live.push(r.alloc(size));
        } else if !live.is_empty() {
            let a = live.swap_remove((x >> 20) as usize % live.len());
            r.free(a);
        }
        if i % 500 == 499 {
            r.empty_cache();
        }
        feed(&mut m, &r.take());
        assert_eq!(rows(dev(&m)), r.rows(), "step {i}");
    }
    let d = dev(&m).derived();
    assert_eq!(
        (d.allocated, d.active, d.reserved),
        (r.allocated(), r.active(), r.reserved())
    );
    assert_eq!(m.process(KEY).unwrap().inconsistencies(), 0);
}
