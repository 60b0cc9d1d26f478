//! Item 9 of the reliability issue: two producers that want one segment
//! name (two pid-1 processes of their own pid namespaces sharing a
//! directory, `docker --ipc=host`). Only a stale segment may be replaced
//! (FORMAT.md, "Naming and creation"): the second producer keeps the first
//! one's live segment and takes a tagged name, and readers show both. For
//! each writer: the C header (`vramscope_ring.h`, compiled here), the
//! Python agent (sampled mode, stand-in torch) and the Rust writer.
//!
//! Without namespaces, a producer is made to find its name taken: it is
//! started through `sh`, which waits until the test has put a segment at
//! the name its pid gives (`exec` keeps the pid). With `unshare` (root),
//! the case as reported: two producers that are each pid 1.

#[path = "common/c_writer.rs"]
mod c_writer;
mod common;
mod stand_in;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use vramscope_wire::ring::discover::{self, current_uid};
use vramscope_wire::ring::{Producer, SegmentConfig, SegmentReader, SegmentWriter};

#[test]
#[ignore = "a stand-in producer, run by the other tests as a process of its own"]
fn stand_in_producer() {
    stand_in::main();
}

/// A producer of the Python agent (sampled mode): prints its status (the
/// segment's path in it), waits for a line on stdin.
const PY_JOB: &str = include_str!("fixtures/sampled_job.py");

const FAKE_TORCH: &str = include_str!("fixtures/fake_torch.py");

const SHAPE: stand_in::Shape = stand_in::Shape {
    base: 64 << 20,
    leak: 0,
    steps: 2,
    reserved: 128 << 20,
    inactive_split: 0,
    alloc_retries: 0,
    period_ms: 100,
};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    C,
    Python,
}

/// What the producers need: the C writer built, the agent and the
/// stand-in torch on disk.
struct Kit {
    _tmp: tempfile::TempDir,
    c_writer: Option<PathBuf>,
    python: Option<String>,
    pythonpath: String,
    job: PathBuf,
    cache: PathBuf,
}

impl Kit {
    fn new() -> Kit {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        // The C header's producer (tests/c/holder.c): DIR LABEL.
        let built = c_writer::have_cc().then(|| {
            c_writer::compile(
                "tests/c/holder.c",
                &t.join("writer"),
                &["cc", "-std=gnu11"],
                &[],
            )
        });
        let python = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
        let python = Command::new(&python)
            .args(["-c", "import sys; assert sys.version_info >= (3, 8)"])
            .status()
            .is_ok_and(|s| s.success())
            .then_some(python);
        let agent = vramscope_collect::agent::extract_to(&t.join("cache")).unwrap();
        std::fs::create_dir(t.join("user")).unwrap();
        std::fs::write(t.join("user/torch.py"), FAKE_TORCH).unwrap();
        let job = t.join("job.py");
        std::fs::write(&job, PY_JOB).unwrap();
        let pythonpath = format!("{}:{}", t.join("user").display(), agent.display());
        Kit {
            c_writer: built,
            python,
            pythonpath,
            job,
            cache: t.join("xdg"),
            _tmp: tmp,
        }
    }

    /// The kinds this machine can run, saying which it cannot.
    fn kinds(&self, test: &str) -> Vec<Kind> {
        let mut v = Vec::new();
        match self.c_writer {
            Some(_) => v.push(Kind::C),
            None => println!("SKIPPED: {test}, C writer: no C compiler (cc)"),
        }
        match self.python {
            Some(_) => v.push(Kind::Python),
            None => println!("SKIPPED: {test}, Python agent: no python3"),
        }
        v
    }

    /// The producer of `kind` labelled `label`, writing into `d`, started
    /// through `sh`, which waits until `plant` (given its pid: `exec` keeps
    /// it) has put what the producer is to find at the name its pid gives;
    /// with what `plant` returned.
    fn start_after<T>(
        &self,
        kind: Kind,
        d: &Path,
        label: &str,
        plant: impl FnOnce(u32) -> T,
    ) -> (Running, T) {
        let ready = d.join(".ready");
        let wrapper = ["sh", "-c", WAIT_THEN_EXEC, ready.to_str().unwrap()];
        let p = Running::start(kind, self.command(kind, &wrapper, d, label));
        let planted = plant(p.child.id());
        std::fs::write(&ready, b"").unwrap();
        (p, planted)
    }

    /// `wrapper` then the producer of `kind`, writing into `dir`.
    fn command(&self, kind: Kind, wrapper: &[&str], dir: &Path, label: &str) -> Command {
        let mut cmd = Command::new(wrapper[0]);
        cmd.args(&wrapper[1..]);
        match kind {
            Kind::C => {
                cmd.arg(self.c_writer.as_ref().unwrap()).arg(dir).arg(label);
            }
            Kind::Python => {
                cmd.arg(self.python.as_ref().unwrap())
                    .arg(&self.job)
                    .arg(label)
                    .env("PYTHONPATH", &self.pythonpath)
                    .env("VRAMSCOPE_MODE", "sampled")
                    .env("VRAMSCOPE_SHM_DIR", dir)
                    .env("XDG_CACHE_HOME", &self.cache);
            }
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

/// A running producer; killed if the test ends first.
struct Running {
    kind: Kind,
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Running {
    fn start(kind: Kind, mut cmd: Command) -> Running {
        let mut child = cmd.spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Running { kind, child, lines }
    }

    /// The segment it created (what it prints first).
    fn segment(&mut self) -> PathBuf {
        let first = self.lines.next().map(|l| l.unwrap()).unwrap_or_default();
        let path = match self.kind {
            Kind::C => first.trim().to_string(),
            Kind::Python => {
                let st: Value = serde_json::from_str(&first)
                    .unwrap_or_else(|_| panic!("python producer printed {first:?}"));
                assert_eq!(st["mode"], "sampled", "{st}");
                st["path"].as_str().unwrap().to_string()
            }
        };
        if path.is_empty() {
            let kind = self.kind;
            panic!("{kind:?} producer printed nothing: {}", self.stop().1);
        }
        PathBuf::from(path)
    }

    /// Tells it to finish; its exit status and stderr.
    fn stop(&mut self) -> (Option<i32>, String) {
        use std::io::Write;
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = writeln!(stdin);
        }
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let status = self.child.wait().unwrap();
        (status.code(), err)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `sh` waiting for the file `$0`, then `exec`ing the rest (same pid).
const WAIT_THEN_EXEC: &str = "while [ ! -e \"$0\" ]; do sleep 0.01; done; exec \"$@\"";

fn segment_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn name_for(pid: u32) -> String {
    discover::segment_name(current_uid(), pid, None).unwrap()
}

/// A live segment of this process (the Rust writer), moved to `name`:
/// what a second producer finds at the name it wants.
fn live_segment_at(dir: &Path, name: &str) -> (SegmentWriter, PathBuf) {
    let mut cfg = SegmentConfig::new(dir, Producer::Test, 1, 64);
    cfg.tag = Some("first".into());
    cfg.label = "first".into();
    let w = SegmentWriter::create(&cfg).unwrap();
    let at = dir.join(name);
    std::fs::rename(w.path(), &at).unwrap();
    (w, at)
}

/// `vramscope rings --json` and `snapshot --json` on `dir`: the rows and
/// the processes shown.
fn readers(dir: &Path) -> (Vec<Value>, Vec<Value>) {
    let run = |args: &[&str]| {
        let out = common::succeeded(
            common::vramscope()
                .args(args)
                .arg("--shm-dir")
                .arg(dir)
                .env_remove("VRAMSCOPE_SHM_DIR")
                .output()
                .unwrap(),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let rows = run(&["rings", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let snap: Value = serde_json::from_str(&run(&["snapshot", "--json", "--no-nvml"])).unwrap();
    let procs = snap["processes"].as_array().unwrap().clone();
    assert!(
        snap["problems"].as_array().is_none_or(|p| p.is_empty()),
        "{}",
        snap["problems"]
    );
    (rows, procs)
}

/// Both segments listed alive by `rings`, both producers shown by
/// `snapshot` with their host pids.
fn assert_both_shown(dir: &Path, segments: [&Path; 2], host_pids: [u32; 2]) {
    let (rows, procs) = readers(dir);
    for seg in segments {
        let row = rows
            .iter()
            .find(|r| r["path"] == seg.to_str().unwrap())
            .unwrap_or_else(|| panic!("rings does not list {}: {rows:?}", seg.display()));
        assert_eq!(row["liveness"], "Alive", "{row}");
    }
    let mut shown: Vec<u64> = procs
        .iter()
        .map(|p| p["identity"]["host_pid"].as_u64().unwrap())
        .collect();
    shown.sort();
    let mut want: Vec<u64> = host_pids.iter().map(|&p| p.into()).collect();
    want.sort();
    assert_eq!(shown, want, "snapshot shows both producers");
}

/// The `vramscope:` lines that say a name was taken.
fn taken_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("vramscope:") && l.contains("is taken"))
        .collect()
}

#[test]
fn item9_a_live_segment_at_a_producers_name_is_kept_and_both_are_shown() {
    let kit = Kit::new();
    for kind in kit.kinds("item 9") {
        let dir = segment_dir();
        let d = dir.path();
        let (mut second, (first, planted, planted_ino)) =
            kit.start_after(kind, d, "second", |pid| {
                let (first, planted) = live_segment_at(d, &name_for(pid));
                let ino = std::fs::metadata(&planted).unwrap().ino();
                (first, planted, ino)
            });
        let pid = second.child.id();
        let seg = second.segment();
        assert_ne!(seg, planted, "{kind:?}: took the live segment's name");
        assert!(
            seg.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&format!("{}-r", name_for(pid))),
            "{kind:?}: {}",
            seg.display()
        );
        assert_eq!(
            std::fs::metadata(&planted).unwrap().ino(),
            planted_ino,
            "{kind:?}: the first producer's live segment was replaced"
        );
        assert_eq!(SegmentReader::open(&seg).unwrap().header().pid, pid);
        assert_both_shown(d, [&planted, &seg], [std::process::id(), pid]);
        let (code, stderr) = second.stop();
        assert_eq!(code, Some(0), "{kind:?}: {stderr}");
        let lines = taken_lines(&stderr);
        assert_eq!(lines.len(), 1, "{kind:?}: one line says why: {stderr}");
        assert!(lines[0].contains(&name_for(pid)), "{}", lines[0]);
        drop(first);
    }

    // The Rust writer, in this process: the name its pid gives is held by
    // the live segment of a C producer.
    if kit.c_writer.is_none() {
        return;
    }
    let dir = segment_dir();
    let d = dir.path();
    let mut c = Running::start(Kind::C, kit.command(Kind::C, &["env"], d, "first"));
    let c_seg = c.segment();
    let planted = d.join(name_for(std::process::id()));
    std::fs::rename(&c_seg, &planted).unwrap();
    let w = SegmentWriter::create(&SegmentConfig::new(d, Producer::Test, 1, 64)).unwrap();
    assert_ne!(w.path(), planted);
    assert!(w.notice().is_some_and(|n| n.contains("is taken")));
    assert_eq!(
        SegmentReader::open(&planted).unwrap().header().pid,
        c.child.id(),
        "the C producer's live segment is still there"
    );
    assert_both_shown(d, [&planted, w.path()], [c.child.id(), std::process::id()]);
    drop(w);
    assert_eq!(c.stop().0, Some(0));
}

/// A copy of a valid segment of this user at `dir/name`, its header made
/// stale: its pid `pid` with start time 1 (the pid reused since), or its
/// state closed.
fn stale_segment_at(dir: &Path, name: &str, pid: u32, closed: bool) -> PathBuf {
    let mut cfg = SegmentConfig::new(dir, Producer::Test, 1, 64);
    cfg.tag = Some("template".into());
    cfg.label = "stale".into();
    let w = SegmentWriter::create(&cfg).unwrap();
    let mut bytes = std::fs::read(w.path()).unwrap();
    drop(w);
    bytes[24..28].copy_from_slice(&pid.to_le_bytes());
    if closed {
        bytes[80..84].copy_from_slice(&2u32.to_le_bytes());
    } else {
        bytes[32..40].copy_from_slice(&1u64.to_le_bytes());
    }
    let at = dir.join(name);
    std::fs::write(&at, &bytes).unwrap();
    std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o600)).unwrap();
    let info = discover::inspect(&at).unwrap();
    assert!(
        matches!(
            info.liveness,
            discover::Liveness::Dead | discover::Liveness::Reused
        ),
        "the planted segment is stale: {info:?}"
    );
    at
}

#[test]
fn item9_a_stale_segment_at_a_producers_name_is_replaced() {
    if !discover::in_root_pid_namespace() {
        println!("SKIPPED: item 9, stale: staleness is decided only from the root pid namespace");
        return;
    }
    let kit = Kit::new();
    for kind in kit.kinds("item 9, stale") {
        for closed in [false, true] {
            let dir = segment_dir();
            let d = dir.path();
            let (mut p, at) = kit.start_after(kind, d, "new", |pid| {
                let owner = if closed { std::process::id() } else { pid };
                stale_segment_at(d, &name_for(pid), owner, closed)
            });
            let pid = p.child.id();
            let seg = p.segment();
            assert_eq!(
                seg, at,
                "{kind:?} (closed: {closed}): the stale name is reused"
            );
            let h = SegmentReader::open(&seg).unwrap().header().clone();
            assert_eq!(
                (h.pid, h.start_time, h.label.ends_with("new")),
                (pid, discover::proc_start_time(pid).unwrap(), true),
                "{kind:?}: the producer's own segment now ({})",
                h.label
            );
            let (code, stderr) = p.stop();
            assert_eq!(code, Some(0), "{stderr}");
            assert!(taken_lines(&stderr).is_empty(), "{kind:?}: {stderr}");
            let left: Vec<_> = std::fs::read_dir(d)
                .unwrap()
                .flatten()
                .map(|e| e.file_name())
                .filter(|n| n != ".ready")
                .collect();
            assert!(left.is_empty(), "{kind:?}: left behind: {left:?}");
        }
    }
    // The Rust writer, in this process.
    for closed in [false, true] {
        let dir = segment_dir();
        let d = dir.path();
        let me = std::process::id();
        let at = stale_segment_at(d, &name_for(me), me, closed);
        let w = SegmentWriter::create(&SegmentConfig::new(d, Producer::Test, 1, 64)).unwrap();
        assert_eq!(w.path(), at);
        assert!(w.notice().is_none());
        assert_eq!(
            SegmentReader::open(&at).unwrap().header().start_time,
            discover::proc_start_time(me).unwrap()
        );
    }
}

/// `unshare` making a pid namespace (with its own /proc).
fn unshare_works() -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

const UNSHARE: &[&str] = &["unshare", "--pid", "--fork", "--mount-proc"];

/// Waits until `dir` holds `n` segments; returns their paths.
fn wait_segments(dir: &Path, n: usize) -> Vec<PathBuf> {
    let start = Instant::now();
    loop {
        let (found, _) = discover::list(dir).unwrap();
        if found.len() >= n || start.elapsed() > Duration::from_secs(20) {
            return found.into_iter().map(|f| f.path).collect();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As reported: two producers, each pid 1 of its own pid namespace, one
/// segment directory. The second keeps the first's segment and takes a
/// tagged name; from the host both are shown, under their host pids.
#[test]
fn item9_two_pid1_producers_sharing_a_directory_are_both_shown() {
    if !discover::in_root_pid_namespace() {
        println!("SKIPPED: item 9, pid 1 twice: the tests do not run in the root pid namespace");
        return;
    }
    if !unshare_works() {
        println!("SKIPPED: item 9, pid 1 twice: `unshare --pid` is refused here (needs root)");
        return;
    }
    let kit = Kit::new();
    let name = name_for(1);
    for kind in kit.kinds("item 9, pid 1 twice") {
        let dir = segment_dir();
        let d = dir.path();
        let mut a = Running::start(kind, kit.command(kind, UNSHARE, d, "first"));
        let a_seg = a.segment();
        assert_eq!(a_seg, d.join(&name), "{kind:?}");
        let a_ino = std::fs::metadata(&a_seg).unwrap().ino();
        let a_host = common::namespace_init(a.child.id(), Duration::from_secs(5)).unwrap();
        // A later clock tick: the two start times differ.
        std::thread::sleep(Duration::from_millis(50));
        let mut b = Running::start(kind, kit.command(kind, UNSHARE, d, "second"));
        let b_seg = b.segment();
        let b_host = common::namespace_init(b.child.id(), Duration::from_secs(5)).unwrap();
        assert_ne!(b_seg, a_seg, "{kind:?}: the second took the first's name");
        assert_eq!(
            std::fs::metadata(&a_seg).map(|m| m.ino()).ok(),
            Some(a_ino),
            "{kind:?}: the first producer's live segment was replaced"
        );
        assert_both_shown(d, [&a_seg, &b_seg], [a_host, b_host]);
        let (_, procs) = readers(d);
        assert!(
            procs.iter().all(|p| p["identity"]["ns_pid"] == 1),
            "{procs:?}"
        );
        let (code, stderr) = b.stop();
        assert_eq!(code, Some(0), "{kind:?}: {stderr}");
        assert_eq!(taken_lines(&stderr).len(), 1, "{kind:?}: {stderr}");
        let (code, stderr) = a.stop();
        assert_eq!(code, Some(0), "{kind:?}: {stderr}");
        assert!(taken_lines(&stderr).is_empty(), "{stderr}");
    }

    // The Rust writer (the stand-in producer, this test binary).
    let dir = segment_dir();
    let d = dir.path();
    let a = stand_in::spawn_through(UNSHARE, d, "first", SHAPE);
    let a_seg = wait_segments(d, 1);
    assert_eq!(a_seg, vec![d.join(&name)]);
    std::thread::sleep(Duration::from_millis(50));
    let b = stand_in::spawn_through(UNSHARE, d, "second", SHAPE);
    let both = wait_segments(d, 2);
    assert_eq!(both.len(), 2, "{both:?}");
    let hosts =
        [a.pid(), b.pid()].map(|p| common::namespace_init(p, Duration::from_secs(5)).unwrap());
    assert_both_shown(d, [&both[0], &both[1]], hosts);
}

/// Pid 1 of a pid namespace (`outer`, the Rust writer: the stand-in)
/// whose C producer (`nested`) runs as pid 1 of a namespace nested in it:
/// the writer finds the name its pid gives taken by a producer that
/// calls itself the same. `apart`: the nested one starts a clock tick
/// later, so their start times differ. Returns the segments' labels by
/// name (the nested one first), which must be those two (the nested
/// producer's segment kept), and what `snapshot` shows: the labels of the
/// processes and the problems.
fn nested_pid_1(apart: bool) -> Option<(Vec<String>, Vec<Value>)> {
    if !discover::in_root_pid_namespace() || !unshare_works() {
        println!(
            "SKIPPED: item 9, nested: needs the root pid namespace and `unshare --pid` (root)"
        );
        return None;
    }
    let kit = Kit::new();
    let Some(writer) = &kit.c_writer else {
        println!("SKIPPED: item 9, nested: no C compiler (cc)");
        return None;
    };
    let dir = segment_dir();
    let d = dir.path();
    // The outer pid 1 (sh) starts the C producer as pid 1 of a namespace
    // of its own, waits for its segment to be published (its magic), then
    // becomes the Rust writer (exec: the same pid and start time).
    let script = format!(
        "{}(sleep 60) | unshare --pid --fork --mount-proc \"$1\" \"$2\" nested >/dev/null 2>&1 &
        t=0; while [ \"$(head -c 8 \"$2/$3\" 2>/dev/null)\" != VMScope1 ] && [ $t -lt 1000 ]; do sleep 0.01; t=$((t+1)); done
        shift 3; exec \"$@\"",
        if apart { "sleep 0.05; " } else { "" }
    );
    let name = name_for(1);
    let wrapper = [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        &script,
        "sh",
        writer.to_str().unwrap(),
        d.to_str().unwrap(),
        &name,
    ];
    let outer = stand_in::spawn_through(&wrapper, d, "outer", SHAPE);
    let mut found = wait_segments(d, 2);
    found.sort_by_key(|p| p.to_str().map(str::len));
    let labels: Vec<String> = found
        .iter()
        .map(|p| match SegmentReader::open(p) {
            Ok(r) => r.header().label.clone(),
            Err(e) => e.to_string(),
        })
        .collect();
    assert_eq!(found.len(), 2, "{found:?} {labels:?}");
    assert_eq!(found[0], d.join(&name), "{found:?}");
    let out = common::succeeded(
        common::vramscope()
            .args(["snapshot", "--json", "--no-nvml", "--shm-dir"])
            .arg(d)
            .output()
            .unwrap(),
    );
    let snap: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut shown: Vec<String> = snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["identity"]["label"].as_str().unwrap().to_string())
        .collect();
    shown.sort();
    drop(outer);
    assert_eq!(
        labels,
        ["nested", "outer"],
        "the nested producer's segment was replaced"
    );
    Some((shown, snap["problems"].as_array().unwrap().clone()))
}

/// A producer in a pid namespace nested in the writer's, whose pid in there
/// is the writer's own pid (both are pid 1): the writer finds it running,
/// under another pid, and keeps its segment. (The Rust writer used to take
/// any running producer of its own pid for a leftover of its own.)
#[test]
fn item9_the_rust_writer_keeps_the_segment_of_a_nested_namespaces_pid_1() {
    let Some((shown, problems)) = nested_pid_1(true) else {
        return;
    };
    assert_eq!(shown, ["nested", "outer"], "{problems:?}");
    assert!(problems.is_empty(), "{problems:?}");
}

/// The same, the two started in the same clock tick (as often as not):
/// both call themselves pid 1 with one start time, and only their
/// mappings tell them apart. Whatever the timing, readers never mix them:
/// both are shown, or one is, and the other is reported in one line
/// saying why (never as "does not map this segment", never merged).
#[test]
fn item9_producers_alike_in_pid_and_start_time_are_never_merged() {
    let Some((shown, problems)) = nested_pid_1(false) else {
        return;
    };
    match shown.len() {
        2 => assert!(problems.is_empty(), "{problems:?}"),
        1 => {
            assert_eq!(problems.len(), 1, "{problems:?}");
            let msg = problems[0]["message"].as_str().unwrap();
            assert!(msg.contains("same clock tick"), "{msg}");
        }
        _ => panic!("shown: {shown:?}, problems: {problems:?}"),
    }
}
