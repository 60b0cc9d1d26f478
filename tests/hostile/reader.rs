//! Hostile inputs: reader. What another process does to a mapped segment
//! (truncating it, making it sparse with huge heads) must not kill or bloat
//! the reader; misuse of the mapping API from safe code must not read out of
//! bounds. Crashing bodies run in a child process (this test binary, re-run
//! for one test), so a failure cannot take the test runner down.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use vramscope_wire::ring::discover::{current_uid, segment_name, Liveness};
use vramscope_wire::ring::layout::{
    self, Header, RingEntry, MAGIC, OFF_MAGIC, OFF_STATE, RING_OFF_HEAD, ROLE_DEVICE, STATE_CLOSED,
};
use vramscope_wire::ring::shm::Shared;
use vramscope_wire::ring::{Producer, RingError, SegmentConfig, SegmentReader, SegmentWriter};

const CHILD_ENV: &str = "VRAMSCOPE_HOSTILE_CHILD";

/// Runs `body` in a child process when called from the test `name` (its full
/// path, e.g. `reader::item_05_…`): returns the child's output in the parent,
/// never returns in the child.
fn in_child(name: &str, body: impl FnOnce()) -> Output {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        println!("CHILD-OK");
        std::process::exit(0);
    }
    Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .unwrap()
}

fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn child_ok(out: &Output) -> bool {
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("CHILD-OK")
}

/// A directory on tmpfs (`/dev/shm`), where segments live for real, if any.
fn shm_tempdir() -> Option<tempfile::TempDir> {
    let dev_shm = Path::new("/dev/shm");
    dev_shm
        .is_dir()
        .then(|| tempfile::tempdir_in(dev_shm).ok())
        .flatten()
}

/// Resident set size of this process, KiB.
fn rss_kib() -> u64 {
    crate::common::proc_status::status_bytes("self", "VmRSS:").unwrap() / 1024
}

#[test]
fn item_05_truncated_segment_does_not_kill_the_reader() {
    let out = in_child(
        "reader::item_05_truncated_segment_does_not_kill_the_reader",
        || {
            let dir = shm_tempdir().unwrap_or_else(|| tempfile::tempdir().unwrap());
            let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 1 << 12);
            cfg.tag = Some("trunc".into());
            let seg = SegmentWriter::create(&cfg).unwrap();
            let ring = seg.ring(1);
            for i in 0..3000u64 {
                ring.write(&[1, i, 0x1000 + i, 4096, 0, 0, 0]);
            }
            let mut r = SegmentReader::open(seg.path()).unwrap();
            let first = r.drain_ring_raw(1, 10, false, |_, _| {});
            assert_eq!(first.delivered, 10);
            // Another process cuts the file to its first page while we hold
            // it mapped: every slot now lies past the end of the file.
            let st = Command::new("truncate")
                .args(["-s", "4096"])
                .arg(seg.path())
                .status()
                .unwrap();
            assert!(st.success());
            let mut delivered = 0;
            for _ in 0..3 {
                let done = r.drain(usize::MAX, |_, _| delivered += 1);
                assert_eq!(done.delivered + done.lost, 0, "{done:?}");
            }
            assert_eq!(delivered, 0);
            let why = r.broken().expect("the reader noticed the truncation");
            assert!(why.contains("truncated by another process"), "{why}");
            assert_eq!(r.liveness(), Liveness::Dead);
            // The header page is still there and readable; no panic.
            let _ = r.state();
            let _ = r.head(1);
            println!("broken: {why}");
        },
    );
    assert!(child_ok(&out), "{}", describe(&out));
}

/// Writes a valid header for `rings` (slot counts) into a new sparse file of
/// the full segment size at `path`, closed (`state` 2: nobody will finish
/// an incomplete slot), each ring's head set to `heads[i]`. Only the header
/// page and the ring-header pages are written.
fn sparse_segment(path: &Path, rings: &[u64], heads: &[u64]) -> usize {
    let spec: Vec<_> = rings.iter().map(|&n| (n, ROLE_DEVICE, 0)).collect();
    let (entries, size) = layout::plan(&spec).unwrap();
    let header = Header {
        minor: layout::MINOR,
        segment_size: size,
        pid: std::process::id(),
        uid: current_uid(),
        start_time: 0,
        producer: Producer::Test,
        flags: layout::FLAG_EVENTS,
        created_ns: 0,
        control_offset: layout::control_offset_for(entries.len()),
        framework: String::new(),
        label: "sparse".into(),
        rings: entries.clone(),
    };
    let mut buf = vec![0u8; layout::prefix_len(entries.len())];
    layout::encode_header(&header, &mut buf);
    buf[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
    buf[OFF_STATE..OFF_STATE + 4].copy_from_slice(&STATE_CLOSED.to_le_bytes());
    let f = File::create(path).unwrap();
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .unwrap();
    f.set_len(size as u64).unwrap();
    f.write_all_at(&buf, 0).unwrap();
    for (e, &h) in entries.iter().zip(heads) {
        f.write_all_at(&h.to_le_bytes(), (e.offset + RING_OFF_HEAD) as u64)
            .unwrap();
    }
    size
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

const HUGE_HEADS: [u64; 4] = [u64::MAX, u64::MAX / 2 + 12_345, 1 << 40, u64::MAX - 3];

#[test]
fn item_06_sparse_segment_with_huge_heads_stays_small() {
    let out = in_child(
        "reader::item_06_sparse_segment_with_huge_heads_stays_small",
        || {
            let name = segment_name(current_uid(), std::process::id(), Some("sparse")).unwrap();
            // About 3.5 GiB, all holes: three rings of 2^24 slots, one of 2^23.
            let rings = [1 << 24, 1 << 24, 1 << 24, 1 << 23];
            let rss0 = rss_kib();

            // On tmpfs (where segments live): refused before a slot is read,
            // and the file's allocated blocks stay those we wrote.
            match shm_tempdir() {
                None => println!("SKIPPED (tmpfs part): no /dev/shm"),
                Some(dir) => {
                    let path = dir.path().join(&name);
                    let size = sparse_segment(&path, &rings, &HUGE_HEADS);
                    assert!(size > 3 << 30);
                    let before = allocated(&path);
                    match SegmentReader::open(&path) {
                        Err(RingError::Refused { why, .. }) => {
                            assert!(why.contains("sparse"), "{why}")
                        }
                        Err(e) => panic!("{e}"),
                        Ok(mut r) => {
                            r.drain(65_536, |_, _| {});
                            panic!(
                                "a sparse tmpfs segment was accepted; {} bytes allocated",
                                allocated(&path)
                            );
                        }
                    }
                    assert!(allocated(&path) <= before.max(1 << 20));
                }
            }

            // Elsewhere (a sparse file on a disk file system is accepted):
            // each drain passes at most `max` positions per ring, and the
            // positions more than a ring behind the head are counted without
            // reading them.
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(&name);
            sparse_segment(&path, &rings, &HUGE_HEADS);
            let before = allocated(&path);
            let mut r = match SegmentReader::open(&path) {
                Ok(r) => r,
                Err(RingError::Refused { why, .. }) if why.contains("sparse") => {
                    println!("SKIPPED (disk part): the temporary directory is on tmpfs");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            for _ in 0..3 {
                let done = r.drain(1000, |_, _| panic!("nothing was written"));
                assert!(done.lost + done.skipped <= 4 * 1000, "{done:?}");
            }
            for (i, (&n, &head)) in rings.iter().zip(&HUGE_HEADS).enumerate() {
                let c = r.counts(i);
                // Opened at the oldest position still held (head - n): all
                // of that is skipped; then three drains of 1000 positions.
                assert_eq!(c.skipped, head - n, "ring {i}");
                assert_eq!(c.delivered, 0);
                assert_eq!(c.lost, 3000, "ring {i}: {c:?}");
            }
            let grown = rss_kib().saturating_sub(rss0);
            assert!(grown < 64 * 1024, "RSS grew by {grown} KiB");
            assert!(allocated(&path) <= before.max(1 << 20));
            // Over the cap: refused outright.
            let big = dir
                .path()
                .join(segment_name(current_uid(), std::process::id(), Some("big")).unwrap());
            sparse_segment(&big, &[1 << 24; 5], &HUGE_HEADS);
            match SegmentReader::open(&big) {
                Err(RingError::Refused { why, .. }) => assert!(why.contains("larger"), "{why}"),
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("a 5 GiB segment was accepted"),
            }
        },
    );
    assert!(child_ok(&out), "{}", describe(&out));
}

fn file_of(dir: &Path, len: u64) -> (PathBuf, File) {
    let path = dir.join("f");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(len).unwrap();
    (path, f)
}

/// `Shared` is public safe API: no input may make it read out of bounds or
/// die. A ring entry with 0 slots (or a size that is not a power of two) is
/// refused; a mapping longer than its file reads zeros past the end and
/// says it is not intact.
#[test]
fn item_18_shared_is_safe_to_misuse() {
    let out = in_child("reader::item_18_shared_is_safe_to_misuse", || {
        let dir = tempfile::tempdir().unwrap();
        let (_path, f) = file_of(dir.path(), 4096);
        f.write_all_at(&42u64.to_le_bytes(), 0).unwrap();
        // Library misuse: twice the file's length. The second page is past
        // the end of the file.
        let shared = Shared::map(&f, 8192).unwrap();
        assert_eq!(
            shared.u64_at(0).load(std::sync::atomic::Ordering::Acquire),
            42
        );
        assert!(!shared.poisoned());
        let past = shared
            .u64_at(4096 + 64)
            .load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(past, 0);
        assert!(shared.poisoned());
        assert!(shared.intact().is_err());
        // The first page is untouched.
        assert_eq!(
            shared.u64_at(0).load(std::sync::atomic::Ordering::Acquire),
            42
        );
        for slot_count in [0, 3, 1 << 40] {
            let entry = RingEntry {
                offset: 0,
                slot_count,
                role: 0,
                device: 0,
            };
            let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                shared
                    .ring(&entry)
                    .slot(5)
                    .seq
                    .load(std::sync::atomic::Ordering::Relaxed)
            }));
            let msg = got
                .err()
                .and_then(|p| p.downcast::<String>().ok())
                .map(|s| *s)
                .unwrap_or_default();
            assert!(
                msg.contains("not a power-of-two ring"),
                "slot_count {slot_count}: {msg:?}"
            );
        }
        // A valid one-slot ring is fine: every position maps to slot 0.
        let one = RingEntry {
            offset: 0,
            slot_count: 1,
            role: 0,
            device: 0,
        };
        let v = shared.ring(&one);
        assert_eq!(v.slot_count(), 1);
        let _ = v
            .slot(u64::MAX)
            .seq
            .load(std::sync::atomic::Ordering::Relaxed);
    });
    assert!(child_ok(&out), "{}", describe(&out));
}

/// Recordings the `recording` fuzz target found: a positions frame whose runs
/// announced billions of positions made the reader allocate up to 64 GiB.
/// Each is now one error naming the file and the offset, at once.
#[test]
fn fuzz_found_recordings_are_one_error_not_an_allocation() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().contains("recording-") {
            continue;
        }
        seen += 1;
        let started = std::time::Instant::now();
        let mut r = vramscope_core::recording::Replayer::open(&path).unwrap();
        let err = loop {
            match r.next_input() {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("{} read to the end without an error", path.display()),
                Err(e) => break e.to_string(),
            }
        };
        assert!(err.contains(&*path.to_string_lossy()), "{err}");
        assert!(err.contains("offset"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }
    assert_eq!(seen, 3);
}
