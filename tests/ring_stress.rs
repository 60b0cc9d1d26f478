//! Many writer threads, a deliberately slow reader, millions of records:
//! accounting is exact and no torn record is ever accepted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

/// Every word derives from (thread, i); `w[6]` ties them together.
fn record(thread: u64, i: u64) -> [u64; 7] {
    let x = thread << 40 | i;
    let w2 = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let w3 = !x;
    let w4 = x.rotate_left(17);
    let w5 = x.wrapping_add(0x1234_5678);
    [thread << 16 | 1, x, w2, w3, w4, w5, w2 ^ w3 ^ w4 ^ w5]
}

fn stress(threads: u64, per_thread: u64, slots: u64, reader_nap: Duration) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, slots);
    cfg.tag = Some(format!("stress{threads}"));
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut reader = SegmentReader::open(seg.path()).unwrap();
    let stop = AtomicBool::new(false);
    let mut next = vec![0u64; threads as usize];
    let mut accepted = 0u64;
    std::thread::scope(|s| {
        let seg = &seg;
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let ring = seg.ring(1);
                    let mut ok = 0u64;
                    for i in 0..per_thread {
                        ok += ring.write(&record(t, i)) as u64;
                    }
                    ok
                })
            })
            .collect();
        let stop = &stop;
        s.spawn(move || {
            for w in writers {
                w.join().unwrap();
            }
            stop.store(true, Ordering::Release);
        });
        // The slow reader: small batches, naps between them.
        let mut deadline: Option<Instant> = None;
        let later = || Instant::now() + Duration::from_secs(10);
        loop {
            let finished = stop.load(Ordering::Acquire);
            let done = reader.drain_ring_raw(1, 512, false, |_, w| {
                let t = w[0] >> 16;
                let i = w[1] & ((1 << 40) - 1);
                assert_eq!(w[1] >> 40, t);
                assert_eq!(w, &record(t, i), "torn record accepted");
                assert!(i >= next[t as usize], "order within a thread");
                next[t as usize] = i + 1;
                accepted += 1;
            });
            // Done when every position is accounted for. A write abandoned
            // at the tail (its slot was held) stays incomplete until the
            // reader's stall limit counts it lost: under load that is more
            // than one empty drain away, so an empty drain is not the end.
            let c = reader.counts(1);
            let passed = c.skipped + c.delivered + c.lost;
            let settled = passed == reader.head(1);
            if finished
                && done.delivered == 0
                && done.lost == 0
                && (settled || Instant::now() > *deadline.get_or_insert_with(later))
            {
                break;
            }
            std::thread::sleep(reader_nap);
        }
    });
    let c = reader.counts(1);
    let head = reader.head(1);
    assert_eq!(head, threads * per_thread);
    assert_eq!(c.delivered, accepted);
    assert_eq!(
        c.skipped + c.delivered + c.lost,
        head,
        "exact accounting: {c:?}"
    );
    // The reader was slow: it must have lost some, and still read many.
    assert!(c.lost > 0, "{c:?}");
    assert!(c.delivered >= slots, "{c:?}");
    eprintln!(
        "{threads} writers x {per_thread}: delivered {} lost {} skipped {} (writer drops {})",
        c.delivered,
        c.lost,
        c.skipped,
        reader.writer_dropped(1)
    );
}

#[test]
fn four_writers_slow_reader_four_million_records() {
    stress(4, 1_000_000, 4096, Duration::from_micros(300));
}

#[test]
fn eight_writers_tiny_ring_heavy_contention() {
    // A 64-slot ring makes writers collide on slots: abandoned writes must be
    // counted as lost by the reader, never delivered half-written.
    stress(8, 250_000, 64, Duration::from_micros(50));
}

#[test]
fn exclusive_writer_with_a_slow_reader() {
    // One writer thread using the read-modify-write-free path: the same
    // exact accounting and no torn record.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 1024);
    cfg.tag = Some("excl".into());
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut reader = SegmentReader::open(seg.path()).unwrap();
    let stop = AtomicBool::new(false);
    let mut accepted = 0u64;
    std::thread::scope(|s| {
        let (seg, stop) = (&seg, &stop);
        s.spawn(move || {
            let ring = seg.ring(1);
            for i in 0..2_000_000 {
                ring.write_exclusive(&record(0, i));
            }
            stop.store(true, Ordering::Release);
        });
        let mut next = 0u64;
        loop {
            let finished = stop.load(Ordering::Acquire);
            let done = reader.drain_ring_raw(1, 256, false, |_, w| {
                let i = w[1] & ((1 << 40) - 1);
                assert_eq!(w, &record(0, i), "torn record accepted");
                assert!(i >= next);
                next = i + 1;
                accepted += 1;
            });
            if finished && done.delivered == 0 && done.lost == 0 {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    });
    let c = reader.counts(1);
    assert_eq!(c.delivered, accepted);
    assert_eq!(c.skipped + c.delivered + c.lost, 2_000_000);
    assert!(c.lost > 0 && c.delivered > 1024, "{c:?}");
}

/// Item 5 under load: four writer threads and a draining reader in one
/// process while another process truncates the segment. Nothing dies (the
/// run is a child process, so a SIGBUS cannot take the test runner down),
/// no torn record is accepted before the cut, and the reader stops reading
/// the file and says why.
#[test]
fn truncation_under_load_is_survived() {
    const NAME: &str = "truncation_under_load_is_survived";
    const ENV: &str = "VRAMSCOPE_STRESS_CHILD";
    if std::env::var(ENV).as_deref() != Ok(NAME) {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(ENV, NAME)
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("CHILD-OK"),
            "{:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        tempfile::tempdir_in("/dev/shm").unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 1 << 14);
    cfg.tag = Some("trunc_load".into());
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut reader = SegmentReader::open(seg.path()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let seg = &seg;
        let stop = &stop;
        for t in 0..4u64 {
            s.spawn(move || {
                let ring = seg.ring(1);
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    ring.write(&record(t, i));
                    i += 1;
                }
            });
        }
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let st = std::process::Command::new("truncate")
                .args(["-s", "4096"])
                .arg(seg.path())
                .status()
                .unwrap();
            assert!(st.success());
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, Ordering::Relaxed);
        });
        while !stop.load(Ordering::Relaxed) {
            reader.drain_ring_raw(1, 4096, false, |_, w| {
                assert_eq!(w[6], w[2] ^ w[3] ^ w[4] ^ w[5], "torn record {w:?}");
            });
        }
    });
    reader.drain(usize::MAX, |_, _| {});
    let why = reader.broken().expect("the reader noticed the cut");
    assert!(why.contains("truncated"), "{why}");
    println!("CHILD-OK: {why}");
}

/// The resident pages of every mapping of `path` in this process, in bytes.
fn resident_by_mapping(path: &std::path::Path) -> Vec<u64> {
    let want = std::fs::canonicalize(path).unwrap();
    let maps = procfs::process::Process::myself().unwrap().smaps().unwrap();
    maps.into_iter()
        .filter(|m| matches!(&m.pathname, procfs::process::MMapPath::Path(p) if *p == want))
        .map(|m| m.extension.map.get("Rss").copied().unwrap_or(0))
        .collect()
}

/// Writes four laps of a 4 MiB ring (in well under a second), read as they
/// are written; returns the resident bytes of the reader's mapping and of
/// the writer's.
fn resident_after_four_laps() -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let slots = 65_536u64;
    let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, slots);
    cfg.tag = Some("resident".into());
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut reader = SegmentReader::open(seg.path()).unwrap();
    let ring = seg.ring(1);
    let mut delivered = 0u64;
    for i in 0..4 * slots {
        assert!(ring.write(&record(0, i)));
        if i % 1000 == 999 {
            delivered += reader
                .drain_ring_raw(1, 1 << 20, false, |_, _| {})
                .delivered;
        }
    }
    delivered += reader
        .drain_ring_raw(1, 1 << 20, false, |_, _| {})
        .delivered;
    assert_eq!(delivered, 4 * slots);
    let mut rss = resident_by_mapping(seg.path());
    rss.sort();
    assert_eq!(
        rss.len(),
        2,
        "the writer's mapping and the reader's: {rss:?}"
    );
    let ring_bytes = slots * 64;
    assert!(rss[1] >= ring_bytes, "the writer holds its ring: {rss:?}");
    (rss[0], rss[1])
}

/// A reader lets go of the ring pages it has consumed: after four laps of
/// a 4 MiB ring, read at many laps a second, the reader's mapping holds
/// well under a lap in its resident set, while the writer's holds the
/// whole ring.
#[test]
fn a_reader_does_not_keep_the_ring_it_consumed_resident() {
    let ring_bytes = 65_536 * 64;
    let (reader, writer) = resident_after_four_laps();
    assert!(
        reader <= ring_bytes / 4,
        "the reader holds {} KiB of a {} KiB ring (the writer {} KiB)",
        reader / 1024,
        ring_bytes / 1024,
        writer / 1024
    );
}
