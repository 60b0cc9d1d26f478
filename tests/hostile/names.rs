//! Hostile inputs: names. Who a segment says its producer is (pid, start
//! time, pid namespace), which file a deletion removes, and the text it
//! carries into every output.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramscope_collect::{Collector, Config, Snapshot};
use vramscope_core::model::ViewOptions;
use vramscope_wire::ring::discover::{self, current_uid, proc_start_time, segment_name, Liveness};
use vramscope_wire::ring::layout::{OFF_LABEL, OFF_MAGIC, OFF_PID, OFF_START_TIME};
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentWriter};

fn vramscope() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
}

fn writer(dir: &Path, tag: &str) -> SegmentWriter {
    let mut cfg = SegmentConfig::new(dir, Producer::Test, 1, 64);
    cfg.tag = Some(tag.into());
    SegmentWriter::create(&cfg).unwrap()
}

fn put(bytes: &mut [u8], off: usize, v: &[u8]) {
    bytes[off..off + v.len()].copy_from_slice(v);
}

/// A good segment's bytes, with header `pid` and `start_time`, after
/// `edit`, written as `vramscope-<uid>-<name_pid>-<tag>`, mode 0600.
fn forged(
    dir: &Path,
    name_pid: u32,
    tag: &str,
    pid: u32,
    start_time: u64,
    edit: impl FnOnce(&mut Vec<u8>),
) -> PathBuf {
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let good = writer(&src, &format!("{tag}src"));
    let mut bytes = std::fs::read(good.path()).unwrap();
    put(&mut bytes, OFF_PID, &pid.to_le_bytes());
    put(&mut bytes, OFF_START_TIME, &start_time.to_le_bytes());
    edit(&mut bytes);
    let path = dir.join(segment_name(current_uid(), name_pid, Some(tag)).unwrap());
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A child that runs until killed.
struct Sleeper(Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `python3` (after `prefix`, e.g. `unshare …`) that maps `path`, as a
/// producer does, and sleeps; once it has mapped it. None without python3.
fn mapper(prefix: &[&str], path: &Path) -> Option<Sleeper> {
    use std::io::BufRead;
    let code = "import mmap,sys,time\nf=open(sys.argv[1],'r+b')\nm=mmap.mmap(f.fileno(),0)\nprint('mapped',flush=True)\ntime.sleep(60)";
    let mut cmd = Command::new(prefix.first().copied().unwrap_or("python3"));
    if !prefix.is_empty() {
        cmd.args(&prefix[1..]).arg("python3");
    }
    let mut child = cmd
        .args(["-c", code])
        .arg(path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut line = String::new();
    let out = child.stdout.take().unwrap();
    std::io::BufReader::new(out).read_line(&mut line).ok()?;
    let s = Sleeper(child);
    (line.trim() == "mapped").then_some(s)
}

/// Writes the header's start time of the segment at `path` in place.
fn set_start(path: &Path, start_time: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&start_time.to_le_bytes(), OFF_START_TIME as u64)
        .unwrap();
}

/// Writes the header's pid of the segment at `path` in place.
fn put_pid(path: &Path, pid: u32) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&pid.to_le_bytes(), OFF_PID as u64).unwrap();
}

/// This process maps the file at `path` (as its producer would).
fn map_here(path: &Path) -> vramscope_wire::ring::shm::Shared {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let len = f.metadata().unwrap().len() as usize;
    vramscope_wire::ring::shm::Shared::map(&f, len).unwrap()
}

fn sleeper(cmd: &mut Command) -> Option<Sleeper> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Sleeper)
}

fn collector(dir: &Path, linger: Duration) -> Collector {
    let mut cfg = Config::new(dir.to_path_buf());
    cfg.nvml = false;
    cfg.discover_interval = Duration::from_millis(10);
    cfg.ring_interval = Duration::from_millis(10);
    cfg.exited_linger = linger;
    Collector::new(cfg)
}

fn snap(c: &Collector) -> Snapshot {
    c.hub().snapshot(&ViewOptions::default())
}

/// Steps `c` until `done` holds of its snapshot (or `limit` passes).
fn step_until(c: &mut Collector, limit: Duration, done: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let start = Instant::now();
    loop {
        c.step();
        let s = snap(c);
        if done(&s) || start.elapsed() > limit {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rings_json(dir: &Path, prefix: &[&str], clean: bool) -> String {
    let mut cmd = if prefix.is_empty() {
        vramscope()
    } else {
        let mut c = Command::new(prefix[0]);
        c.args(&prefix[1..]).arg(env!("CARGO_BIN_EXE_vramscope"));
        c
    };
    cmd.arg("rings").arg("--json").arg("--shm-dir").arg(dir);
    if clean {
        cmd.arg("--clean");
    }
    let out = crate::common::succeeded(cmd.output().unwrap());
    String::from_utf8(out.stdout).unwrap()
}

fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn item_02_producer_in_another_pid_namespace_is_never_cleaned() {
    if !unshare_works() {
        eprintln!("SKIPPED: item_02: `unshare --pid --fork --mount-proc` does not work here");
        return;
    }
    if !discover::in_root_pid_namespace() {
        eprintln!("SKIPPED: item_02: the tests do not run in the root pid namespace");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A producer that is pid 1 of its own namespace, its segment mapped.
    let seg = forged(d, 1, "contained", 1, 1, |_| {});
    let Some(ns) = mapper(&["unshare", "--pid", "--fork", "--mount-proc"], &seg) else {
        eprintln!("SKIPPED: item_02: python3 is needed to map a segment in a namespace");
        return;
    };
    let host = crate::common::namespace_init(ns.0.id(), Duration::from_secs(5))
        .expect("the namespace's pid 1");
    let st = proc_start_time(host).unwrap();
    set_start(&seg, st);
    let info = discover::inspect(&seg).unwrap();
    assert_eq!(info.liveness, Liveness::Alive);
    assert_eq!(discover::locate(1, st), discover::Located::Here(host));
    let out = rings_json(d, &[], true);
    assert!(
        seg.exists(),
        "rings --clean removed a live contained producer's segment"
    );
    assert!(out.contains("\"liveness\":\"Alive\""), "{out}");
    // The collector shows it, under its host pid.
    let mut c = collector(d, Duration::from_secs(60));
    let s = step_until(&mut c, Duration::from_secs(3), |s| !s.processes.is_empty());
    assert_eq!(s.processes.len(), 1, "{:?}", s.problems);
    assert_eq!(s.processes[0].identity.host_pid, host);
    assert_eq!(s.processes[0].identity.ns_pid, 1);

    // A reader in a pid namespace of its own cannot see this test's process
    // (the producer of `ours`): it cannot tell, and removes nothing.
    let ours = writer(d, "host");
    let inside = ["unshare", "--pid", "--fork", "--mount-proc"];
    let out = rings_json(d, &inside, true);
    assert!(
        ours.path().exists(),
        "a reader in a namespace removed a producer it cannot see"
    );
    assert!(seg.exists());
    assert!(out.contains("\"liveness\":\"CannotTell\""), "{out}");
    assert!(out.contains("pid namespace"), "{out}");

    // Once the producer is gone, its segment is stale, and cleaned.
    // (`unshare` does not pass its SIGKILL on: the namespace's init is killed.)
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    drop(ns);
    let start = Instant::now();
    while proc_start_time(host) == Some(st) && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_ne!(discover::inspect(&seg).unwrap().liveness, Liveness::Alive);
    rings_json(d, &[], true);
    assert!(!seg.exists());
}

#[test]
fn item_03_linger_cleanup_spares_a_new_producer_at_the_same_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The old producer: a child, whose segment has the path that this
    // process's segment tagged "reuse" will have.
    let seg = forged(d, std::process::id(), "reuse", 0, 1, |_| {});
    let Some(old) = mapper(&[], &seg) else {
        eprintln!("SKIPPED: item_03: python3 is needed to map a segment");
        return;
    };
    let old_pid = old.0.id();
    put_pid(&seg, old_pid);
    set_start(&seg, proc_start_time(old_pid).unwrap());
    let mut c = collector(d, Duration::from_millis(400));
    let s = step_until(&mut c, Duration::from_secs(3), |s| {
        s.processes.iter().any(|p| p.identity.ns_pid == old_pid)
    });
    assert!(
        s.processes.iter().any(|p| p.identity.ns_pid == old_pid),
        "{:?}",
        s.problems
    );
    drop(old);
    // It exited; within the linger a new producer gets the same path (the
    // writer replaces the dead one's file).
    step_until(&mut c, Duration::from_millis(100), |_| false);
    let new = writer(d, "reuse");
    assert_eq!(new.path(), seg.as_path());
    let ino = std::fs::metadata(&seg).unwrap().ino();
    let me = std::process::id();
    let s = step_until(&mut c, Duration::from_secs(3), |s| {
        s.processes.iter().any(|p| p.identity.ns_pid == me)
    });
    assert!(
        s.processes.iter().any(|p| p.identity.ns_pid == me),
        "the new producer is not shown while the old one lingers"
    );
    // Past the linger: the old one is forgotten, the new file stays.
    let s = step_until(&mut c, Duration::from_secs(3), |s| {
        !s.processes.iter().any(|p| p.identity.ns_pid == old_pid)
    });
    assert!(!s.processes.iter().any(|p| p.identity.ns_pid == old_pid));
    step_until(&mut c, Duration::from_millis(100), |_| false);
    assert_eq!(
        std::fs::metadata(&seg).map(|m| m.ino()).ok(),
        Some(ino),
        "the linger cleanup removed the new producer's segment"
    );
    assert!(snap(&c).processes.iter().any(|p| p.identity.ns_pid == me));
    // The deletion itself checks the file: a different inode is kept.
    let other = discover::FileId { dev: 0, ino: 1 };
    assert!(!discover::remove_if_same(&seg, other));
    assert!(seg.exists());
    assert!(std::fs::read_dir(d).unwrap().flatten().all(|e| !e
        .file_name()
        .to_string_lossy()
        .starts_with(".vramscope-unlink")));
}

#[test]
fn item_14_clean_removes_only_files_that_validate_as_segments() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    // Not a segment, named like one, with a dead pid.
    let junk = d.join(segment_name(current_uid(), dead, Some("notes")).unwrap());
    std::fs::write(&junk, b"my notes, not a segment").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    // A stale segment beside it is removed.
    let stale = forged(d, dead, "stale", dead, 1, |_| {});
    let out = vramscope()
        .args(["rings", "--clean", "--shm-dir"])
        .arg(d)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        junk.exists(),
        "rings --clean removed a file that is not a segment"
    );
    assert_eq!(std::fs::read(&junk).unwrap(), b"my notes, not a segment");
    assert!(!stale.exists());
    assert!(discover::remove_stale(d).unwrap().is_empty());
}

fn overview_text(s: &Snapshot) -> String {
    use ratatui::backend::TestBackend;
    let mut t = ratatui::Terminal::new(TestBackend::new(160, 16)).unwrap();
    let state = vramscope_ui::state::OverviewState::default();
    let theme = vramscope_ui::Theme::new(true, false);
    t.draw(|f| vramscope_ui::overview::render(f, f.area(), s, &state, (false, false), &theme))
        .unwrap();
    t.backend().to_string()
}

#[test]
fn item_15_refused_and_initialising_segments_are_shown() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = std::process::id();
    let st = proc_start_time(me).unwrap();
    // Never initialised: magic 0.
    let init = forged(d, me, "init", me, st, |b| put(b, OFF_MAGIC, &[0; 8]));
    // Reused pid: our pid, another start time.
    let reused = forged(d, me, "reused", me, st - 1, |_| {});
    let mut c = collector(d, Duration::from_secs(60));
    let s = step_until(&mut c, Duration::from_millis(500), |s| {
        !s.problems.is_empty()
    });
    assert!(s
        .problems
        .iter()
        .any(|p| p.path == reused.display().to_string()));
    let text = overview_text(&s);
    assert!(text.contains("not shown"), "{text}");
    assert!(
        text.contains("`vramscope rings --clean` removes stale segments"),
        "{text}"
    );
    let path = init.display().to_string();
    assert!(
        !s.problems.iter().any(|p| p.path == path),
        "reported before 5 s"
    );
    let s = step_until(&mut c, Duration::from_secs(7), |s| {
        s.problems.iter().any(|p| p.path == path)
    });
    let p = s
        .problems
        .iter()
        .find(|p| p.path == path)
        .expect("magic 0 is reported after 5 s");
    assert!(p.message.contains("magic is still 0"), "{}", p.message);
    assert!(init.exists());
}

#[test]
fn item_16_spoofed_pids_and_start_times_are_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = std::process::id();
    // Start time 0, and one in the future: cannot verify, never attached
    // nor removed.
    let zero = forged(d, me, "zero", me, 0, |_| {});
    let future = forged(d, me, "future", me, u64::MAX / 2, |_| {});
    for p in [&zero, &future] {
        assert_eq!(discover::inspect(p).unwrap().liveness, Liveness::CannotTell);
    }
    let mut c = collector(d, Duration::from_secs(60));
    let s = step_until(&mut c, Duration::from_millis(500), |s| {
        s.problems.len() >= 2
    });
    assert!(
        s.processes.is_empty(),
        "an unverifiable segment was shown as a process"
    );
    for p in [&zero, &future] {
        let pr = s
            .problems
            .iter()
            .find(|x| x.path == p.display().to_string())
            .unwrap();
        assert!(pr.message.contains("cannot be verified"), "{}", pr.message);
    }
    discover::remove_stale(d).unwrap();
    assert!(zero.exists() && future.exists());

    // pid 1 with its true start time: init is never shown as the producer
    // (another user's, or ours but not mapping the segment).
    if let Some(st1) = proc_start_time(1) {
        let init = forged(d, 1, "init", 1, st1, |_| {});
        let path = init.display().to_string();
        let s = step_until(&mut c, Duration::from_secs(2), |s| {
            s.problems.iter().any(|p| p.path == path)
        });
        assert!(
            !s.processes.iter().any(|p| p.identity.host_pid == 1),
            "pid 1 was shown with the segment's figures"
        );
        let pr = s.problems.iter().find(|p| p.path == path).unwrap();
        assert!(
            pr.message.contains("pid 1 belongs to another user")
                || pr.message.contains("pid 1 does not map this segment")
                || pr
                    .message
                    .contains("cannot verify that pid 1 maps this segment"),
            "{}",
            pr.message
        );
    }

    // Another user's process: its pid and start time in our segment.
    if current_uid() != 0 {
        eprintln!("SKIPPED: item_16 (other user): needs root to start a process as nobody");
        return;
    }
    let Some(theirs) = sleeper(Command::new("setpriv").args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "sleep",
        "60",
    ])) else {
        eprintln!("SKIPPED: item_16 (other user): setpriv is missing");
        return;
    };
    let pid = theirs.0.id();
    let start = Instant::now();
    while vramscope_collect::procfs::owner(pid) != Some(65534)
        && start.elapsed() < Duration::from_secs(3)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let spoof = forged(d, pid, "spoof", pid, proc_start_time(pid).unwrap(), |_| {});
    let path = spoof.display().to_string();
    let s = step_until(&mut c, Duration::from_secs(2), |s| {
        s.problems.iter().any(|p| p.path == path)
    });
    assert!(
        !s.processes.iter().any(|p| p.identity.host_pid == pid),
        "another user's process was shown with the segment's figures"
    );
    let pr = s
        .problems
        .iter()
        .find(|p| p.path == path)
        .expect("reported");
    assert!(
        pr.message
            .contains(&format!("pid {pid} belongs to another user")),
        "{}",
        pr.message
    );
}

#[test]
fn item_09_terminal_escapes_in_labels_are_made_printable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let me = std::process::id();
    let evil = b"\x1b]0;pwned\x07\x1b[2J\revil\xc2\x9b31m\xe2\x80\xae";
    let seg = forged(d, me, "evil", me, proc_start_time(me).unwrap(), |b| {
        put(b, OFF_LABEL, &[0; 64]);
        put(b, OFF_LABEL, evil)
    });
    let _mapped = map_here(&seg);
    let clean = |s: &str| {
        !s.chars()
            .any(|c| c.is_control() && c != '\n' || c == '\u{202e}')
    };
    let out = vramscope()
        .args(["rings", "--shm-dir"])
        .arg(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("evil"), "{text}");
    assert!(clean(&text), "rings printed a raw escape: {text:?}");
    let out = vramscope()
        .args(["snapshot", "--no-nvml", "--shm-dir"])
        .arg(d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("evil"), "{text}");
    assert!(clean(&text), "snapshot printed a raw escape: {text:?}");
    // A command line from /proc.
    let child =
        sleeper(Command::new("bash").args(["-c", "exec -a $'\\e[31mred\\e]0;x\\a' sleep 60"]))
            .unwrap();
    let start = Instant::now();
    let mut id = None;
    while start.elapsed() < Duration::from_secs(3) {
        id =
            vramscope_collect::procfs::identity(child.0.id()).filter(|i| i.cmdline.contains("red"));
        if id.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let id = id.expect("the child's command line");
    assert!(clean(&id.cmdline), "{:?}", id.cmdline);
    // A recording (what `replay` reads).
    let json = r#"{"Problems":{"problems":[{"path":"\u001b[2Jp","message":"m\u009b1m"}]}}"#;
    let input: vramscope_core::input::Input = serde_json::from_str(json).unwrap();
    let vramscope_core::input::Input::Problems { problems } = input else {
        panic!()
    };
    assert!(
        clean(&problems[0].path) && clean(&problems[0].message),
        "{problems:?}"
    );
}
