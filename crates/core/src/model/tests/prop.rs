//! Random alloc/free sequences against the naive reference allocator.
use super::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    /// Free request and completion at once.
    Free(usize),
    /// Free request only (stream still using the block).
    Request(usize),
    /// Complete a pending free.
    Complete(usize),
    EmptyCache,
    Stream(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..4096).prop_map(Op::Alloc),
        2 => (4096u64..(2 * MIB)).prop_map(Op::Alloc),
        2 => ((2 * MIB)..(40 * MIB)).prop_map(Op::Alloc),
        4 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Request),
        2 => any::<usize>().prop_map(Op::Complete),
        1 => Just(Op::EmptyCache),
        1 => (0u64..2).prop_map(Op::Stream),
    ]
}

proptest! {
    // 128 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128),
        ..ProptestConfig::default()
    })]

    #[test]
    fn model_tracks_reference(ops in proptest::collection::vec(op(), 1..150)) {
        let mut m = synced_model();
        let mut r = RefAlloc::new();
        let mut live: Vec<u64> = Vec::new();
        let mut pending: Vec<u64> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(size) => live.push(r.alloc(size)),
                Op::Free(i) if !live.is_empty() => {
                    let a = live.swap_remove(i % live.len());
                    r.free(a);
                }
                Op::Request(i) if !live.is_empty() => {
                    let a = live.swap_remove(i % live.len());
                    r.free_request(a);
                    pending.push(a);
                }
                Op::Complete(i) if !pending.is_empty() => {
                    let a = pending.swap_remove(i % pending.len());
                    r.complete(a);
                }
                Op::EmptyCache => r.empty_cache(),
                Op::Stream(s) => r.ev.place.stream = s,
                _ => {}
            }
            feed(&mut m, &r.take()); // checks non-overlap, tiling and counters
            let d = dev(&m).derived();
            prop_assert_eq!(d.allocated, r.allocated());
            prop_assert_eq!(d.active, r.active());
            prop_assert_eq!(d.reserved, r.reserved());
        }
        prop_assert_eq!(rows(dev(&m)), r.rows());
        prop_assert_eq!(m.process(KEY).unwrap().inconsistencies(), 0);
    }

    /// Arbitrary (mostly contradictory) events never panic and never break
    /// the invariants; a snapshot afterwards restores the truth.
    #[test]
    fn garbage_never_breaks_invariants(raw in proptest::collection::vec((0u8..7, 0u64..64, 0u64..8), 1..80)) {
        let mut m = synced_model();
        let mut e = Ev::new();
        for (k, slot, sz) in raw {
            let addr = BASE + slot * MIB / 2;
            let size = (sz + 1) * MIB / 2;
            let ev = match k {
                0 => e.alloc(addr, size),
                1 => e.free_req(addr, size),
                2 => e.free_done(addr, size),
                3 => e.seg_alloc(addr, size),
                4 => e.seg_free(addr, size),
                5 => e.map(addr, size),
                _ => e.unmap(addr, size),
            };
            feed(&mut m, &[ev]);
        }
        let mut r = RefAlloc::new();
        r.alloc(3000);
        let _ = r.take();
        feed(&mut m, &r.snapshot(7));
        prop_assert_eq!(rows(dev(&m)), r.rows());
        prop_assert!(!m.needs_resync(KEY));
    }
}
