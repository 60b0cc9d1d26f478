//! Property tests over hostile bytes: the header parser, the reader and the
//! record decoder never panic, and what they accept is consistent.

use std::os::unix::fs::PermissionsExt;

use proptest::prelude::*;
use vramscope_wire::ring::codec::Decoder;
use vramscope_wire::ring::discover::{current_uid, segment_name};
use vramscope_wire::ring::layout::{self, parse_header, Parsed, MAGIC};
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn header_parser_never_panics_and_checks_geometry(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        magic in any::<bool>(),
        file_size in prop_oneof![Just(None), (0u64..1 << 40).prop_map(Some)],
    ) {
        if magic && bytes.len() >= 8 {
            bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
            // Give the generator a chance at a plausible version too.
            if bytes.len() >= 16 { bytes[8..10].copy_from_slice(&1u16.to_le_bytes()); }
        }
        let size = file_size.unwrap_or(bytes.len() as u64);
        if let Ok(Parsed::Ready(h)) = parse_header(&bytes, size) {
            prop_assert_eq!(h.segment_size as u64, size);
            for (i, r) in h.rings.iter().enumerate() {
                prop_assert!(r.slot_count.is_power_of_two());
                prop_assert!(r.offset + r.bytes() <= h.segment_size);
                prop_assert!(r.offset >= h.control_offset + layout::CONTROL_SIZE);
                for s in &h.rings[..i] {
                    prop_assert!(r.offset >= s.offset + s.bytes() || s.offset >= r.offset + r.bytes());
                }
            }
        }
    }

    #[test]
    fn decoder_never_panics(words in proptest::collection::vec(any::<[u64; 7]>(), 0..64)) {
        let mut d = Decoder::default();
        for w in &words {
            let _ = d.decode(w);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// A real segment with random bytes overwritten anywhere (header, table,
    /// control block, ring headers, slots) is refused or read without panic,
    /// and the reader's accounting still adds up.
    #[test]
    fn corrupted_segments_never_panic_the_reader(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u64>()), 1..16),
        records in 0u64..200,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 64);
        cfg.tag = Some("src".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        for i in 0..records {
            seg.ring(1).write(&[1, i, i, i, 0, 0, 0]);
        }
        let mut bytes = std::fs::read(seg.path()).unwrap();
        let words = bytes.len() / 8;
        for (at, v) in &edits {
            let w = at.index(words);
            bytes[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        let path = dir.path().join(segment_name(current_uid(), 1, Some("bad")).unwrap());
        std::fs::write(&path, &bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        if let Ok(mut r) = SegmentReader::open(&path) {
            let mut n = 0u64;
            r.drain(1000, |_, _| n += 1);
            r.drain(1000, |_, _| n += 1);
            for i in 0..r.header().rings.len() {
                let c = r.counts(i);
                prop_assert!(c.delivered <= r.head(i).max(c.delivered));
                let passed = c.skipped + c.delivered + c.lost;
                // Either the cursor reached the head, or it is stalled below it.
                prop_assert!(passed <= r.head(i) || r.head(i) < c.skipped + 1);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Item 6: whatever a head says, one drain passes at most `max` and at
    /// most one lap of positions, counts every position it passes exactly
    /// once, and a gap of more than a lap is counted without being walked.
    #[test]
    fn a_drain_passes_at_most_max_and_one_lap(
        written in 0u64..40,
        head in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
        max in 0usize..64,
        gone in any::<bool>(),
        rounds in 1usize..4,
    ) {
        use std::os::unix::fs::FileExt;
        const SLOTS: u64 = 16;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, SLOTS);
        cfg.tag = Some("bound".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        let ring = seg.ring(1);
        for i in 0..written {
            ring.write(&[1, i, i, 4096, 0, 0, 0]);
        }
        let head = head.map_or(written, |h| h.max(written));
        let entry = seg.header().rings[1];
        std::fs::OpenOptions::new()
            .write(true)
            .open(seg.path())
            .unwrap()
            .write_all_at(&head.to_le_bytes(), (entry.offset + layout::RING_OFF_HEAD) as u64)
            .unwrap();
        let mut r = SegmentReader::open(seg.path()).unwrap();
        let at_open = r.counts(1);
        prop_assert_eq!(at_open.skipped, head.saturating_sub(SLOTS));
        let mut before = at_open;
        for _ in 0..rounds {
            let done = r.drain_ring_raw(1, max, gone, |_, _| {});
            let after = r.counts(1);
            let passed = done.skipped + done.delivered + done.lost;
            prop_assert!(passed <= (max as u64).min(SLOTS), "{:?} with max {}", done, max);
            prop_assert_eq!(
                after.skipped + after.delivered + after.lost,
                before.skipped + before.delivered + before.lost + passed
            );
            prop_assert!(after.skipped + after.delivered + after.lost <= head);
            before = after;
        }
    }
}
