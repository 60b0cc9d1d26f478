//! Hostile inputs: containers (item 8 of the reliability issue). A
//! container owns its own files: it can put a device node or a FIFO where a
//! segment would be, and make its segment directory a symbolic link. The
//! host's reader checks a file's type before it opens anything read-write,
//! and never follows a link out of the container's root
//! (`/proc/<pid>/root`), so it neither reads nor cleans a host directory
//! of the container's choosing.
//!
//! The container is a process in a mount namespace of its own (`unshare
//! --mount`) that `chroot`s into a directory of the test: its
//! `/proc/<pid>/root` is that directory. Without root or `unshare` those
//! parts print `SKIPPED: …`.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramscope_collect::{Collector, Config, Snapshot};
use vramscope_wire::ring::discover::{self, current_uid, segment_name, Liveness};
use vramscope_wire::ring::layout::OFF_PID;
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

/// A child killed when the test ends.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A FIFO at `path`, and a process that opens it for writing: that `open`
/// returns only once someone opens the FIFO for reading (read-write
/// included, however briefly), and then it creates `mark`. While `mark`
/// does not exist, nobody opened the FIFO.
fn watched_fifo(path: &Path, mark: &Path) -> Kill {
    let ok = Command::new("mkfifo")
        .arg("-m")
        .arg("600")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
    let watcher = Command::new("sh")
        .args(["-c", "exec 3>\"$0\"; touch \"$1\""])
        .arg(path)
        .arg(mark)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    Kill(watcher)
}

/// A collector on `dir` that cleans stale segments, stepped for a second.
fn collect(dir: &Path) -> Snapshot {
    let mut cfg = Config::new(dir.to_path_buf());
    cfg.nvml = false;
    cfg.clean_stale = true;
    cfg.discover_interval = Duration::from_millis(20);
    cfg.ring_interval = Duration::from_millis(20);
    cfg.exited_linger = Duration::from_millis(1);
    let mut c = Collector::new(cfg);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(1) {
        c.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    c.hub().snapshot(&Default::default())
}

fn private_dir(p: &Path) -> PathBuf {
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
    p.to_path_buf()
}

/// A valid segment of this user whose producer is dead (its pid beyond any
/// pid the kernel gives), at `dir/vramscope-<uid>-<name_pid>`.
fn dead_segment(dir: &Path, name_pid: u32) -> PathBuf {
    let src = private_dir(&dir.join(".src"));
    let mut cfg = SegmentConfig::new(&src, Producer::Test, 1, 64);
    cfg.label = "dead".into();
    let w = SegmentWriter::create(&cfg).unwrap();
    let mut bytes = std::fs::read(w.path()).unwrap();
    drop(w);
    std::fs::remove_dir(&src).unwrap();
    bytes[OFF_PID..OFF_PID + 4].copy_from_slice(&(u32::MAX - 7).to_le_bytes());
    let path = dir.join(segment_name(current_uid(), name_pid, None).unwrap());
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(discover::inspect(&path).unwrap().liveness, Liveness::Dead);
    path
}

/// Item 8, the FIFO, in the host's own segment directory (no root
/// needed): every reader refuses it in one line, promptly, and none opens
/// it (its writer stays blocked).
#[test]
fn item8_a_fifo_named_like_a_segment_is_refused_unopened() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = private_dir(&tmp.path().join("shm"));
    let fifo = dir.join(segment_name(current_uid(), 4_000_001, None).unwrap());
    let mark = tmp.path().join("opened");
    let _watcher = watched_fifo(&fifo, &mark);
    let t0 = Instant::now();

    let err = SegmentReader::open(&fifo)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("is not a regular file"), "{err}");
    assert!(discover::inspect(&fifo).is_err());
    assert!(discover::remove_stale(&dir).unwrap().is_empty());
    let snap = collect(&dir);
    assert!(snap.processes.is_empty());
    let about: Vec<_> = snap
        .problems
        .iter()
        .filter(|p| p.path == fifo.display().to_string())
        .collect();
    assert_eq!(about.len(), 1, "{:?}", snap.problems);
    assert!(
        about[0].message.contains("is not a regular file") && !about[0].message.contains('\n'),
        "{}",
        about[0].message
    );
    for args in [&["rings"][..], &["snapshot", "--no-nvml"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .arg("--shm-dir")
            .arg(&dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<_> = text
            .lines()
            .filter(|l| l.contains("is not a regular file"))
            .collect();
        assert_eq!(lines.len(), 1, "{args:?}: {text}");
    }
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "readers took {:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(!mark.exists(), "a reader opened the FIFO");
    assert!(fifo.exists(), "the FIFO was removed");
}

/// Root, `unshare --mount` and python3, to make a container.
fn container_or_skip(what: &str) -> Option<String> {
    if current_uid() != 0 {
        println!("SKIPPED: {what}: a container (unshare --mount, chroot) needs root");
        return None;
    }
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new("unshare")
        .args(["--mount", &py, "-c", "pass"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIPPED: {what}: `unshare --mount` with python3 is refused here");
        return None;
    }
    Some(py)
}

/// A process in a mount namespace of its own whose root is `root` (it
/// `chroot`s there): a container, as the host's reader sees it.
fn container(py: &str, root: &Path) -> Kill {
    let (child, line) = crate::stand_in::start_reading_a_line(
        Command::new("unshare")
            .args(["--mount", py, "-c"])
            .arg("import os, sys; os.chroot(sys.argv[1]); os.chdir('/'); print('ready', flush=True); sys.stdin.read()")
            .arg(root)
            .stdin(Stdio::piped()),
    );
    assert_eq!(line.trim(), "ready");
    Kill(child)
}

/// `path` (absolute) as it lies inside the container root `root`.
fn inside(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap())
}

/// Item 8, the link: the container's segment directory (the host's
/// segment directory path, as the container sees it) is a symbolic link
/// to a host directory holding a dead segment of the user, absolute or
/// climbing out with `..`. The host's reader neither reads that directory
/// nor cleans it: the link is resolved inside the container's root, where
/// it leads nowhere.
#[test]
fn item8_a_container_segment_dir_linking_out_of_its_root_is_neither_read_nor_cleaned() {
    let Some(py) = container_or_skip("item 8, link out of the root") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let host_dir = private_dir(&t.join("host_dir"));
    let dead = dead_segment(&host_dir, 4_000_002);
    let dead_ino = std::fs::metadata(&dead).unwrap().ino();
    let shm = private_dir(&t.join("shm"));
    let depth = shm.components().count() - 1;
    let climb = "../".repeat(depth + 3) + host_dir.strip_prefix("/").unwrap().to_str().unwrap();
    let cases = [
        ("absolute", host_dir.clone()),
        ("climbing with ..", PathBuf::from(climb)),
    ];
    for (i, (how, target)) in cases.into_iter().enumerate() {
        let root = t.join(format!("root{i}"));
        let link = inside(&root, &shm);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        symlink(&target, &link).unwrap();
        let c = container(&py, &root);

        let opened: Vec<PathBuf> = discover::container_dirs(&shm)
            .iter()
            .filter(|d| d.id() == discover::SegmentDir::open(&host_dir).unwrap().id())
            .map(|d| d.path().to_path_buf())
            .collect();
        assert!(
            opened.is_empty(),
            "{how}: the host directory was opened as {opened:?}"
        );
        let snap = collect(&shm);
        assert!(
            std::fs::metadata(&dead).is_ok_and(|m| m.ino() == dead_ino),
            "{how}: the dead segment in the host directory was removed"
        );
        assert!(snap.processes.is_empty(), "{how}");
        let host = host_dir.display().to_string();
        assert!(
            snap.problems
                .iter()
                .all(|p| !p.message.contains(&host) && !p.path.contains("host_dir")),
            "{how}: {:?}",
            snap.problems
        );
        drop(c);
    }
}

/// Item 8, a FIFO and a device node in a container's own segment
/// directory: seen through `/proc/<pid>/root`, each refused in one line;
/// the FIFO is never opened (its writer stays blocked).
#[test]
fn item8_a_fifo_or_device_in_a_containers_segment_dir_is_refused_unopened() {
    let Some(py) = container_or_skip("item 8, FIFO in a container") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let shm = private_dir(&t.join("shm"));
    let root = t.join("root");
    let theirs = private_dir(&inside(&root, &shm));
    let fifo = theirs.join(segment_name(current_uid(), 4_000_003, None).unwrap());
    let mark = t.join("opened");
    let _watcher = watched_fifo(&fifo, &mark);
    // And a device node (root may make one in its container): /dev/null's.
    let device = theirs.join(segment_name(current_uid(), 4_000_004, None).unwrap());
    let made = Command::new("mknod")
        .args(["-m", "600"])
        .arg(&device)
        .args(["c", "1", "3"])
        .status()
        .unwrap();
    assert!(made.success(), "mknod");
    let c = container(&py, &root);
    let t0 = Instant::now();
    let snap = collect(&shm);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    for planted in [&fifo, &device] {
        let seen = Path::new("/proc")
            .join(c.0.id().to_string())
            .join("root")
            .join(planted.strip_prefix(&root).unwrap());
        let about: Vec<_> = snap
            .problems
            .iter()
            .filter(|p| Path::new(&p.path) == seen)
            .collect();
        assert_eq!(about.len(), 1, "{:?}", snap.problems);
        assert!(
            about[0].message.contains("is not a regular file"),
            "{}",
            about[0].message
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(!mark.exists(), "the reader opened the container's FIFO");
    assert!(fifo.exists());
    drop(c);
}
