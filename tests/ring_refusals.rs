//! Every refusal of FORMAT.md "Liveness and hygiene", each with a message that
//! names the file and what is wrong; stale segments are cleaned up.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use vramscope_wire::ring::discover::{self, current_uid, segment_name, Liveness};
use vramscope_wire::ring::layout::{HEADER_SIZE, OFF_MAGIC, OFF_MAJOR, OFF_PID, OFF_START_TIME};
use vramscope_wire::ring::{Producer, RingError, SegmentConfig, SegmentReader, SegmentWriter};

fn writer(dir: &Path, tag: &str) -> SegmentWriter {
    let mut cfg = SegmentConfig::new(dir, Producer::Test, 1, 64);
    cfg.tag = Some(tag.into());
    SegmentWriter::create(&cfg).unwrap()
}

/// A copy of a good segment's bytes under another segment name, mode 0600,
/// after `edit` has changed them.
fn forged(dir: &Path, pid: u32, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let good = writer(dir, "good");
    let mut bytes = std::fs::read(good.path()).unwrap();
    edit(&mut bytes);
    let path = dir.join(segment_name(current_uid(), pid, Some("forged")).unwrap());
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

fn open_err(path: &Path) -> String {
    let e = SegmentReader::open(path).err().expect("must be refused");
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message names the file: {msg}"
    );
    msg
}

fn put(bytes: &mut [u8], off: usize, v: &[u8]) {
    bytes[off..off + v.len()].copy_from_slice(v);
}

#[test]
fn wrong_magic_version_size_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = std::process::id();
    let p = forged(d, me, |b| put(b, OFF_MAGIC, b"NOTVRAMS"));
    assert!(open_err(&p).contains("bad magic"));
    let p = forged(d, me, |b| put(b, OFF_MAJOR, &[9, 0, 0, 0]));
    assert!(open_err(&p).contains("format version 9.0"));
    let p = forged(d, me, |b| b.truncate(b.len() - 4096));
    assert!(open_err(&p).contains("the file has"));
    let p = forged(d, me, |b| b.truncate(100));
    assert!(open_err(&p).contains("smaller than the 256-byte header"));
    // Ring 1's offset moved past the end of the segment.
    let p = forged(d, me, |b| {
        let len = b.len() as u64;
        put(b, HEADER_SIZE + 32, &len.to_le_bytes())
    });
    assert!(open_err(&p).contains("outside the ring area"));
    // Ring 0's slot count made huge: its slots would run past the end.
    let p = forged(d, me, |b| {
        put(b, HEADER_SIZE + 8, &(1u32 << 24).to_le_bytes())
    });
    assert!(open_err(&p).contains("ring 0"));
    // The header's uid disagrees with the owner.
    let p = forged(d, me, |b| {
        put(b, OFF_PID + 4, &(current_uid() ^ 1).to_le_bytes())
    });
    assert!(open_err(&p).contains("header names uid"));
    // All zero: still initialising, not an error about its contents.
    let p = forged(d, me, |b| b.fill(0));
    assert!(matches!(
        SegmentReader::open(&p),
        Err(RingError::Initialising(_))
    ));
}

#[test]
fn permissions_symlinks_and_non_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let w = writer(d, "perm");
    std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(open_err(w.path()).contains("mode 644"));
    std::fs::set_permissions(w.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(SegmentReader::open(w.path()).is_ok());

    let link = d.join(segment_name(current_uid(), 1, Some("link")).unwrap());
    std::os::unix::fs::symlink(w.path(), &link).unwrap();
    assert!(open_err(&link).contains("symbolic link"));

    let fifo = d.join(segment_name(current_uid(), 1, Some("fifo")).unwrap());
    let st = std::process::Command::new("mkfifo")
        .arg("-m")
        .arg("600")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    assert!(open_err(&fifo).contains("not a regular file"));
}

#[test]
fn other_users_segments_are_refused() {
    if current_uid() != 0 {
        eprintln!("SKIPPED other_users_segments_are_refused: needs root to chown a file");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let w = writer(dir.path(), "owner");
    std::os::unix::fs::chown(w.path(), Some(4242), None).unwrap();
    assert!(open_err(w.path()).contains("owned by uid 4242"));
    // A file named for another uid is not even listed, only counted.
    let theirs = dir.path().join(segment_name(4242, 1, None).unwrap());
    std::fs::write(&theirs, b"x").unwrap();
    let (found, others) = discover::list(dir.path()).unwrap();
    assert_eq!(others, 1);
    assert!(found.iter().all(|f| f.name.uid == current_uid()));
}

#[test]
fn stale_segments_are_told_apart_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let live = writer(d, "live");
    // A producer that has exited: its pid no longer exists.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = forged(d, dead_pid, |b| put(b, OFF_PID, &dead_pid.to_le_bytes()));
    // A pid that was reused: ours, with another start time.
    let reused = {
        let good = writer(d, "reusedsrc");
        let mut bytes = std::fs::read(good.path()).unwrap();
        put(&mut bytes, OFF_START_TIME, &1u64.to_le_bytes());
        let p = d.join(segment_name(current_uid(), std::process::id(), Some("reused")).unwrap());
        std::fs::write(&p, &bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p
    };
    assert_eq!(
        discover::inspect(live.path()).unwrap().liveness,
        Liveness::Alive
    );
    assert_eq!(discover::inspect(&dead).unwrap().liveness, Liveness::Dead);
    assert_eq!(
        discover::inspect(&reused).unwrap().liveness,
        Liveness::Reused
    );

    let mut removed = discover::remove_stale(d).unwrap();
    removed.sort();
    let mut want = vec![dead.clone(), reused.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert!(live.path().exists());
    // A clean exit marks the segment closed and removes it.
    let path = live.path().to_path_buf();
    let reader = SegmentReader::open(&path).unwrap();
    drop(live);
    assert!(!path.exists());
    assert_eq!(reader.liveness(), Liveness::Dead);
}

/// A writer takes its name back from a stale segment of its own; a live
/// one, even of this very process, is never replaced (item 9 of the
/// reliability issue): the second writer takes a tagged name beside it.
#[test]
fn a_writer_replaces_its_own_stale_name() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let first = writer(dir.path(), "again");
    let path = first.path().to_path_buf();
    std::mem::forget(first); // not cleaned up, and still alive
    let beside = writer(dir.path(), "again");
    assert_ne!(beside.path(), path);
    assert!(beside.notice().is_some_and(|n| n.contains("is taken")));
    // Closed (state 2), as a producer that died after closing it leaves it.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&2u32.to_le_bytes(), 80).unwrap();
    let second = writer(dir.path(), "again");
    assert_eq!(second.path(), path);
    assert!(second.notice().is_none());
    assert!(SegmentReader::open(&path).is_ok());
}

/// A dead producer's segment is removed with a word (issue 30, item 12):
/// the collector lists it in its snapshots, and the dashboard says so in
/// its footer, once.
#[test]
fn a_removed_stale_segment_is_said() {
    use vramscope_collect::{Config, Live};
    use vramscope_core::model::ViewOptions;
    use vramscope_ui::app::{App, AppConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = forged(dir.path(), dead_pid, |b| {
        put(b, OFF_PID, &dead_pid.to_le_bytes())
    });
    let mut cfg = Config::new(dir.path().to_path_buf());
    cfg.nvml = false;
    let live = Live::start(cfg).unwrap();
    let t0 = std::time::Instant::now();
    let mut snap = live.hub().snapshot(&ViewOptions::default());
    while snap.cleaned.is_empty() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(50));
        snap = live.hub().snapshot(&ViewOptions::default());
    }
    assert!(!dead.exists());
    assert_eq!(snap.cleaned.len(), 1, "{:?}", snap.cleaned);
    assert_eq!(snap.cleaned[0].pid, dead_pid);
    assert_eq!(snap.cleaned[0].path, dead.display().to_string());
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["cleaned"][0]["pid"], dead_pid);

    let mut app = App::new(AppConfig::default());
    app.set_snapshot(snap.clone());
    let said = app.message.clone().unwrap_or_default();
    assert_eq!(
        said,
        format!(
            "removed {}: its producer (pid {dead_pid}) is gone",
            dead.display()
        )
    );
    // Said once: the same list again says nothing new.
    app.message = None;
    app.set_snapshot(snap);
    assert_eq!(app.message, None);
}
