//! The Python agent in sampled mode, end to end, without a GPU: a fake
//! `torch` package (written by this test) stands in for PyTorch; the agent
//! (as embedded in the binary and extracted) creates a segment in Python that
//! the Rust reader validates and drains; commands travel through the control
//! block. Also: one warning and a running job when the segment directory is
//! unwritable; forked children never write into the parent's segment.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command as Proc, Stdio};
use std::time::{Duration, Instant};

use vramscope_wire::event::{BlockState, EventKind, SegmentPool, Stats};
use vramscope_wire::ring::{Command, Producer, SegmentReader, Status};

/// A fake torch: two devices, fixed statistics and a fixed snapshot;
/// `empty_cache` drops reserved to allocated (and records the device it ran
/// under); `torch.cuda.graphs.CUDAGraph` counts captures.
const FAKE_TORCH: &str = r#"
__version__ = "2.11.0+fake"
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
from . import cuda
"#;

const FAKE_CUDA: &str = r#"
import contextlib, os, threading
_initialized = os.environ.get("FAKE_CUDA_INIT", "1") == "1"
_queued = []
_lock = threading.Lock()
calls = []
MiB = 1 << 20
_st = {
    0: dict(allocated=3 * MiB, reserved=24 * MiB, active=4 * MiB, inactive_split=1 * MiB, requested=3 * MiB - 100,
            allocated_peak=10 * MiB, reserved_peak=30 * MiB, active_peak=11 * MiB, retries=2, ooms=1, segments=3),
    1: dict(allocated=0, reserved=0, active=0, inactive_split=0, requested=0,
            allocated_peak=0, reserved_peak=0, active_peak=0, retries=0, ooms=0, segments=0),
}
_current = [0]

def is_initialized():
    return _initialized

def _lazy_call(fn, **kw):
    with _lock:
        if _initialized:
            fn()
        else:
            _queued.append(fn)

def init():
    global _initialized
    with _lock:
        for fn in _queued:
            fn()
        _initialized = True

def device_count():
    return 2

def memory_stats(device=None):
    if not _initialized:
        return {}
    s = _st[device or 0]
    return {
        "allocated_bytes.all.current": s["allocated"], "reserved_bytes.all.current": s["reserved"],
        "active_bytes.all.current": s["active"], "inactive_split_bytes.all.current": s["inactive_split"],
        "requested_bytes.all.current": s["requested"], "allocated_bytes.all.peak": s["allocated_peak"],
        "reserved_bytes.all.peak": s["reserved_peak"], "active_bytes.all.peak": s["active_peak"],
        "num_alloc_retries": s["retries"], "num_ooms": s["ooms"], "segment.all.current": s["segments"],
        "segment.all.allocated": s["segments"], "allocation.all.allocated": 5 if s["reserved"] else 0,
    }

def memory_snapshot():
    big = 0x7f0000000000
    return [
        {"device": 0, "address": big, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "is_expandable": False,
         "blocks": [{"address": big, "size": 2 * MiB, "requested_size": 2 * MiB - 100, "state": "active_allocated"},
                    {"address": big + 2 * MiB, "size": 18 * MiB, "requested_size": 0, "state": "inactive"}]},
        {"device": 0, "address": big + 64 * MiB, "total_size": 2 * MiB, "stream": 7, "segment_type": "small",
         "segment_pool_id": (1, 5), "is_expandable": True,
         "blocks": [{"address": big + 64 * MiB, "size": 1 * MiB, "requested_size": 1000, "state": "active_pending_free"},
                    {"address": big + 65 * MiB, "size": 1 * MiB, "requested_size": 0, "state": "inactive"}]},
    ]

def empty_cache():
    calls.append(("empty_cache", _current[0]))
    for s in _st.values():
        s["reserved"] = s["allocated"]

def reset_peak_memory_stats(device=None):
    s = _st[device or 0]
    s["allocated_peak"] = s["allocated"]

@contextlib.contextmanager
def device(d):
    old = _current[0]
    _current[0] = d
    try:
        yield
    finally:
        _current[0] = old

class graphs:
    class CUDAGraph:
        def capture_begin(self, *a, **k):
            pass
        def capture_end(self):
            pass
"#;

/// A user script driven line by line over stdin.
const SCRIPT: &str = r#"
import json, os, sys, time
import torch
import vramscope
print(json.dumps({"attached": vramscope.attach()}), flush=True)
for _ in range(400):
    if vramscope.status()["mode"] not in (None, "pending"):
        break
    time.sleep(0.01)
print(json.dumps(vramscope.status()), flush=True)
vramscope.mark(7)
g = None
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "capture":
        g = torch.cuda.graphs.CUDAGraph(); g.capture_begin(); print("capturing", flush=True)
    elif cmd == "end":
        g.capture_end(); print("ended", flush=True)
    elif cmd == "calls":
        print(json.dumps(torch.cuda.calls), flush=True)
    elif cmd == "fork":
        pid = os.fork()
        if pid == 0:
            vramscope.mark(5)
            time.sleep(0.3)
            vramscope.mark(6)
            os._exit(0)
        os.waitpid(pid, 0)
        print("forked", flush=True)
    elif cmd == "done":
        break
print("finished", flush=True)
"#;

pub fn python() -> Option<String> {
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Proc::new(&py)
        .arg("-c")
        .arg("import sys; assert sys.version_info >= (3, 8)")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    ok.then_some(py)
}

struct Env {
    _tmp: tempfile::TempDir,
    fake: PathBuf,
    agent: PathBuf,
    shm: PathBuf,
    cache: PathBuf,
    script: PathBuf,
}

fn setup() -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake");
    std::fs::create_dir_all(fake.join("torch/cuda")).unwrap();
    std::fs::write(fake.join("torch/__init__.py"), FAKE_TORCH).unwrap();
    std::fs::write(fake.join("torch/cuda/__init__.py"), FAKE_CUDA).unwrap();
    let agent = vramscope_collect::agent::extract_to(&tmp.path().join("cache")).unwrap();
    let shm = tmp.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let script = tmp.path().join("train_fake.py");
    std::fs::write(&script, SCRIPT).unwrap();
    Env {
        fake,
        agent,
        shm,
        cache: tmp.path().join("xdg"),
        script,
        _tmp: tmp,
    }
}

impl Env {
    /// `py script` with the fake torch and the agent importable and the
    /// segment directory `shm`.
    fn python(&self, py: &str, script: &Path, shm: &Path) -> Proc {
        let mut cmd = Proc::new(py);
        cmd.arg(script)
            .env(
                "PYTHONPATH",
                format!("{}:{}", self.fake.display(), self.agent.display()),
            )
            .env("VRAMSCOPE_SHM_DIR", shm)
            .env("XDG_CACHE_HOME", &self.cache);
        cmd
    }

    /// Writes a script beside the main one.
    fn script(&self, name: &str, text: &str) -> PathBuf {
        let script = self.script.with_file_name(name);
        std::fs::write(&script, text).unwrap();
        script
    }
}

struct Job {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Job {
    fn line(&mut self) -> String {
        self.lines.next().expect("a line").unwrap()
    }
    fn send(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
        self.stdin.flush().unwrap();
    }
    fn finish(mut self) -> (i32, String) {
        self.send("done");
        drop(self.stdin);
        let mut rest = Vec::new();
        for l in self.lines {
            rest.push(l.unwrap());
        }
        assert!(
            rest.iter().any(|l| l == "finished"),
            "script ran on: {rest:?}"
        );
        let out = self.child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn start(py: &str, env: &Env, extra: &[(&str, &str)]) -> Job {
    let mut cmd = env.python(py, &env.script, &env.shm);
    cmd.env("VRAMSCOPE_STATS_MS", "50")
        .env("VRAMSCOPE_SLOTS", "4096")
        .env_remove("VRAMSCOPE_MODE")
        .env_remove("VRAMSCOPE_AUTO")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    Job {
        child,
        stdin,
        lines,
    }
}

fn expected_stats() -> Stats {
    const MIB: u64 = 1 << 20;
    Stats {
        allocated: 3 * MIB,
        reserved: 24 * MIB,
        active: 4 * MIB,
        inactive_split: MIB,
        requested: 3 * MIB - 100,
        allocated_peak: 10 * MIB,
        reserved_peak: 30 * MIB,
        active_peak: 11 * MIB,
        alloc_retries: 2,
        ooms: 1,
        segments: 3,
    }
}

/// The agent's own lines on stderr.
fn our_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("vramscope:"))
        .collect()
}

fn drain_all(r: &mut SegmentReader) -> Vec<EventKind> {
    let mut out = Vec::new();
    r.drain(usize::MAX, |_, e| out.push(e.kind));
    out
}

macro_rules! need_python {
    () => {
        match python() {
            Some(p) => p,
            None => {
                println!("SKIPPED: the agent tests need python3");
                return;
            }
        }
    };
}

#[test]
fn sampled_mode_segment_is_read_and_commands_are_answered() {
    let py = need_python!();
    let env = setup();
    let mut job = start(&py, &env, &[]);
    let path = attached_segment(&mut job, &env);
    let mut r = SegmentReader::open(&path).expect("the Python segment validates");
    check_header(&r, &job);

    std::thread::sleep(Duration::from_millis(300));
    let events = drain_all(&mut r);
    check_stats(&events);
    assert_eq!(r.dropped_samples(), 0);
    check_first_snapshot(&events);
    assert!(events
        .iter()
        .any(|e| matches!(e, EventKind::SnapshotEnd { device: 1, .. })));
    assert!(events
        .iter()
        .any(|e| matches!(e, EventKind::Marker { value: 7, .. })));

    check_commands(&mut r, &mut job);
    check_fork(&mut r, &mut job);

    let (code, stderr) = job.finish();
    assert_eq!(code, 0);
    let ours = our_lines(&stderr);
    assert_eq!(ours.len(), 1, "one announcement line, got: {stderr}");
    assert!(ours[0].contains("sampled mode"), "{}", ours[0]);
    assert!(ours[0].contains("torch headers missing"), "{}", ours[0]);
    // Closed and unlinked at exit.
    assert!(!path.exists());
    assert_eq!(r.state(), 2);
}

/// The script attached and reports sampled mode; returns its segment's path
/// (in the test's segment directory).
fn attached_segment(job: &mut Job, env: &Env) -> PathBuf {
    assert_eq!(job.line(), r#"{"attached": true}"#);
    let status: serde_json::Value = serde_json::from_str(&job.line()).unwrap();
    assert_eq!(status["mode"], "sampled", "{status}");
    let path = PathBuf::from(status["path"].as_str().unwrap());
    assert_eq!(path.parent().unwrap(), env.shm);
    path
}

fn check_header(r: &SegmentReader, job: &Job) {
    let h = r.header();
    assert_eq!(h.producer, Producer::TorchSampled);
    // (1.2's role lists come from the exact agent only.)
    assert_eq!(h.minor, 3, "the Python agent writes format 1.3");
    assert_eq!(h.pid, job.child.id());
    assert_eq!(h.framework, "torch 2.11.0+fake");
    assert!(h.label.starts_with("train_fake.py"), "{}", h.label);
    assert_eq!(h.flags, 2);
    assert_eq!(h.rings.len(), 3);
    assert_eq!(h.rings[0].slot_count, 4096);
}

/// Statistics: exactly what the fake returned, for device 0; device 1
/// (never used) too, with zeros.
fn check_stats(events: &[EventKind]) {
    let stats0: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::Stats { device: 0, stats } => Some(*stats),
            _ => None,
        })
        .collect();
    assert!(stats0.len() >= 2, "{events:?}");
    assert!(stats0.iter().all(|s| *s == expected_stats()));
    assert!(events
        .iter()
        .any(|e| matches!(e, EventKind::Stats { device: 1, stats } if *stats == Stats::default())));
}

/// The first snapshot of device 0: complete, as the fake described it.
fn check_first_snapshot(events: &[EventKind]) {
    let begin = events
        .iter()
        .position(|e| matches!(e, EventKind::SnapshotBegin { device: 0, .. }))
        .expect("snapshot begin");
    let snap: Vec<_> = events[begin..]
        .iter()
        .take_while(|e| !matches!(e, EventKind::SnapshotEnd { device: 0, .. }))
        .cloned()
        .collect();
    assert!(matches!(
        snap[0],
        EventKind::SnapshotBegin {
            segments: 2,
            blocks: 4,
            ..
        }
    ));
    let segs: Vec<_> = snap
        .iter()
        .filter_map(|e| match e {
            EventKind::SnapshotSegment {
                place,
                size,
                pool_kind,
                expandable,
                ..
            } => Some((place.stream, place.pool, *size, *pool_kind, *expandable)),
            _ => None,
        })
        .collect();
    assert_eq!(segs.len(), 2);
    assert_eq!(segs[0].2, 20 << 20);
    assert_eq!(segs[0].3, SegmentPool::Large);
    assert_eq!(
        (segs[1].0, segs[1].1 .0, segs[1].1 .1, segs[1].3, segs[1].4),
        (7, 1, 5, SegmentPool::Small, true)
    );
    let states: Vec<_> = snap
        .iter()
        .filter_map(|e| match e {
            EventKind::SnapshotBlock {
                state, requested, ..
            } => Some((*state, *requested)),
            _ => None,
        })
        .collect();
    assert_eq!(
        states,
        vec![
            (BlockState::Allocated, (2 << 20) - 100),
            (BlockState::Inactive, 0),
            (BlockState::PendingFree, 1000),
            (BlockState::Inactive, 0)
        ]
    );
}

/// Commands through the control block, empty_cache refused during a CUDA
/// graph capture and run once after it.
fn check_commands(r: &mut SegmentReader, job: &mut Job) {
    let t = Duration::from_secs(10);
    let o = r.command(Command::Ping { value: 99 }, t).unwrap();
    assert_eq!((o.status, o.result0), (Status::Ok, 99));
    // 1.1's capture-stacks command: sampled mode has no allocator callback
    // to tag, so it answers unsupported (FORMAT.md, "Versions").
    let o = r
        .command(Command::CaptureStacks { steps: 2, depth: 0 }, t)
        .unwrap();
    assert_eq!(o.status, Status::Unsupported);
    let o = r.command(Command::Snapshot { device: None }, t).unwrap();
    assert_eq!(o.status, Status::Ok);
    assert!(o.result0 >= 2, "snapshot id {}", o.result0);
    let o = r
        .command(Command::ResetPeaks { device: Some(0) }, t)
        .unwrap();
    assert_eq!(o.status, Status::Ok);
    let o = r.command(Command::Unknown { kind: 77, arg: 0 }, t).unwrap();
    assert_eq!(o.status, Status::Unsupported);
    // During a CUDA graph capture, empty_cache is refused.
    job.send("capture");
    assert_eq!(job.line(), "capturing");
    let o = r.command(Command::EmptyCache { device: None }, t).unwrap();
    assert_eq!(o.status, Status::Refused);
    job.send("end");
    assert_eq!(job.line(), "ended");
    let o = r.command(Command::EmptyCache { device: None }, t).unwrap();
    assert_eq!(
        (o.status, o.result0, o.result1),
        (Status::Ok, 24 << 20, 3 << 20)
    );
    // It ran once, under device 0 (the only device in use).
    job.send("calls");
    assert_eq!(job.line(), r#"[["empty_cache", 0]]"#);
    std::thread::sleep(Duration::from_millis(200));
    let after = drain_all(r);
    assert!(after.iter().any(|e| matches!(e, EventKind::Stats { device: 0, stats } if stats.reserved == 3 << 20 && stats.allocated_peak == 3 << 20)));
    assert!(after
        .iter()
        .any(|e| matches!(e, EventKind::SnapshotEnd { id, .. } if *id >= 2)));
}

/// A forked child never writes into the parent's segment.
fn check_fork(r: &mut SegmentReader, job: &mut Job) {
    job.send("fork");
    assert_eq!(job.line(), "forked");
    std::thread::sleep(Duration::from_millis(150));
    let later = drain_all(r);
    assert!(!later
        .iter()
        .any(|e| matches!(e, EventKind::Marker { value: 5 | 6, .. })));
    assert_eq!(r.totals().lost, 0);
}

#[test]
fn forced_sampled_mode_and_deferred_cuda_init() {
    let py = need_python!();
    let env = setup();
    // CUDA not initialised at attach: the agent waits for torch's lazy init.
    let script = env.script(
        "deferred.py",
        r#"
import json, sys, time, torch, vramscope
vramscope.attach()
time.sleep(0.3)
print(json.dumps(vramscope.status()), flush=True)
torch.cuda.init()
for _ in range(400):
    if vramscope.status()["mode"] != "pending":
        break
    time.sleep(0.01)
print(json.dumps(vramscope.status()), flush=True)
sys.stdin.readline()
"#,
    );
    let mut cmd = env.python(&py, &script, &env.shm);
    cmd.env("VRAMSCOPE_MODE", "sampled")
        .env("FAKE_CUDA_INIT", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["mode"], "pending");
    assert!(std::fs::read_dir(&env.shm).unwrap().next().is_none());
    let second: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(second["mode"], "sampled");
    let path = PathBuf::from(second["path"].as_str().unwrap());
    let mut r = SegmentReader::open(&path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = false;
    while !seen && Instant::now() < deadline {
        seen = drain_all(&mut r).iter().any(
            |e| matches!(e, EventKind::Stats { device: 0, stats } if *stats == expected_stats()),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen);
    writeln!(child.stdin.as_mut().unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("VRAMSCOPE_MODE=sampled"), "{stderr}");
}

fn run_plain(py: &str, env: &Env, shm: &Path) -> (i32, String, String) {
    let script = env.script(
        "plain.py",
        r#"
import torch, vramscope, time
print("attach:", vramscope.attach(), flush=True)
time.sleep(0.5)
vramscope.mark(1)
print("status:", vramscope.status()["mode"], flush=True)
print("job finished", flush=True)
raise SystemExit(0)
"#,
    );
    let out = env
        .python(py, &script, shm)
        .env("VRAMSCOPE_MODE", "sampled")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn unwritable_segment_dir_warns_once_and_the_job_runs() {
    let py = need_python!();
    let env = setup();
    let (code, stdout, stderr) = run_plain(&py, &env, Path::new("/nonexistent/vramscope-shm"));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("job finished"), "{stdout}");
    assert!(stdout.contains("status: failed"), "{stdout}");
    let ours = our_lines(&stderr);
    assert_eq!(ours.len(), 1, "{stderr}");
    assert!(ours[0].contains("cannot create the segment"), "{stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
}

/// Issue 47: the Python writer's OUTSIDE_TOTAL (the sampled agent sends
/// each device's CUDA context with it, measured by NVML) is read by the
/// Rust reader as the C header's is: the library, the kind, the bytes, and
/// a name past 24 bytes cut there.
#[test]
fn the_python_writer_writes_the_outside_total_the_reader_reads() {
    let Some(py) = python() else {
        println!(
            "SKIPPED: the_python_writer_writes_the_outside_total_the_reader_reads: no python3"
        );
        return;
    };
    let env = setup();
    let script = env.script(
        "outside.py",
        r#"
import sys
from vramscope import _segment as S
seg = S.Segment(S.PRODUCER_TEST, S.FLAG_STATS, "py", "outside", [(64, S.ROLE_AGENT, 0xFFFFFFFF)])
seg.rings[0].write(S.outside_total_words(1, S.LIB_CUDA, S.OUT_CONTEXT, 530 << 20))
seg.rings[0].write(S.outside_total_words(0, 3, 3, (1 << 64) - (2 << 20), b"libnccl.so.2-a-name-past-24-bytes"))
print(seg.path, flush=True)
sys.stdin.readline()
seg.close()
"#,
    );
    let (minor, events) = script_segment(&py, &env, &script);
    assert_eq!(minor, 3);
    let outside: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EventKind::Outside(o) => Some(*o),
            _ => None,
        })
        .collect();
    assert_eq!(outside.len(), 2, "{events:?}");
    use vramscope_wire::event::{Library, OutsideKind, OutsideOp};
    let (a, b) = (outside[0], outside[1]);
    assert_eq!(
        (a.op, a.device, a.library, a.kind, a.bytes),
        (
            OutsideOp::Total,
            1,
            Library::Cuda,
            OutsideKind::Context,
            530 << 20
        )
    );
    assert_eq!(a.name, [0; 24]);
    assert_eq!((b.library, b.kind), (Library::Nccl, OutsideKind::Physical));
    assert_eq!(
        b.bytes as i64,
        -(2 << 20),
        "a total below 0, two's complement"
    );
    assert_eq!(&b.name, b"libnccl.so.2-a-name-past");
}

/// Runs `script`, which makes a segment, prints its path, waits for a line
/// on stdin and closes it: the segment's minor version and every event it
/// holds, read while it is open; the script must then end well.
fn script_segment(py: &str, env: &Env, script: &Path) -> (u16, Vec<EventKind>) {
    let mut child = env
        .python(py, script, &env.shm)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let path = PathBuf::from(lines.next().expect("a path").unwrap());
    let mut r = SegmentReader::open(&path).expect("the script's segment validates");
    let events = drain_all(&mut r);
    writeln!(child.stdin.take().unwrap()).unwrap();
    assert!(child.wait().unwrap().success());
    (r.header().minor, events)
}

/// Sampled mode calls what it measured outside the allocator the context
/// only on a device torch had not allocated on yet by the end of the
/// reading; on one it had (a late start: libraries may hold some of it),
/// "context and earlier" (kind 9). NVML's reading is stood in for.
#[test]
fn sampled_mode_calls_a_late_measurement_the_context_and_earlier() {
    let Some(py) = python() else {
        println!(
            "SKIPPED: sampled_mode_calls_a_late_measurement_the_context_and_earlier: no python3"
        );
        return;
    };
    let env = setup();
    let script = env.script(
        "late.py",
        r#"
import os, sys, torch
from vramscope import _outside
from vramscope._sampled import Sampler
# Device 0 has allocated (the stand-in torch says 5 allocations), device 1 not.
_outside.contexts_by_nvml = lambda torch, named=None: {0: 700 << 20, 1: 530 << 20}
s = Sampler(torch, "late", os.environ["VRAMSCOPE_SHM_DIR"])
s.create()
s.write_contexts()
print(s.seg.path, flush=True)
sys.stdin.readline()
s.seg.close()
"#,
    );
    let (_, events) = script_segment(&py, &env, &script);
    use vramscope_wire::event::{Library, OutsideKind};
    let mut got: Vec<_> = (events.iter())
        .filter_map(|e| match e {
            EventKind::Outside(o) => Some((o.device, o.library, o.kind, o.bytes >> 20)),
            _ => None,
        })
        .collect();
    got.sort_by_key(|g| g.0);
    assert_eq!(
        got,
        [
            (0, Library::Cuda, OutsideKind::Before, 700),
            (1, Library::Cuda, OutsideKind::Context, 530)
        ],
        "{events:?}"
    );
}

/// The exact mode's start tells the accounting outside the allocator
/// whether CUDA was just starting (the context alone) or had started before
/// `attach()` (a late start: "context and earlier"). torch's `_lazy_call`
/// runs its callable at once when CUDA is initialised already, which must
/// not pass for a start at CUDA's initialisation.
#[test]
fn an_attach_after_cuda_started_is_a_late_start() {
    let Some(py) = python() else {
        println!("SKIPPED: an_attach_after_cuda_started_is_a_late_start: no python3");
        return;
    };
    let env = setup();
    let script = env.script(
        "starts.py",
        r#"
import json, os, time, torch, vramscope
seen = []
def start_exact(self, lib_path, at_init=False):
    seen.append(at_init)
    vramscope._st["mode"] = "exact"
    return 0, ""
vramscope._Starter._cached = lambda self: "/a/cached/tracker.so"
vramscope._Starter._start_exact = start_exact
vramscope.attach()
torch.cuda.init()
for _ in range(200):
    if seen:
        break
    time.sleep(0.01)
print(json.dumps(seen), flush=True)
"#,
    );
    for (init, want) in [("1", "[false]"), ("0", "[true]")] {
        let out = env
            .python(&py, &script, &env.shm)
            .env("FAKE_CUDA_INIT", init)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            text.trim(),
            want,
            "CUDA initialised before attach(): {init}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The accounting outside the allocator counts memory taken between its
/// calls as the driver's only on a device where NVML lists this process
/// alone: the agent says so per device (another process, NVML failing to
/// answer, or a list without this process is "not alone"). NVML is stood
/// in for.
#[test]
fn the_driver_s_memory_between_calls_is_counted_only_where_the_process_is_alone() {
    let Some(py) = python() else {
        println!("SKIPPED: the_driver_s_memory_between_calls_is_counted_only_where_the_process_is_alone: no python3");
        return;
    };
    let env = setup();
    let script = env.script(
        "alone.py",
        r#"
import json, os
from vramscope import _outside
class NV:
    def nvmlDeviceGetComputeRunningProcesses_v3(self, h, pn, arr):
        if h == "broken":
            return 999
        pids = {"mine": [os.getpid()], "shared": [os.getpid(), 4242], "empty": []}[h]
        for i, p in enumerate(pids):
            arr[i].pid = p
        pn._obj.value = len(pids)
        return 0
class Lib:
    said = []
    def vs_outside_alone(self, d, alone):
        self.said.append([d, alone])
a = _outside._Alone.__new__(_outside._Alone)
a.nv = NV()
a.handles = {0: "mine", 1: "shared", 2: "broken", 3: "empty"}
lib = Lib()
a.tell(lib)
print(json.dumps(lib.said), flush=True)
"#,
    );
    let out = env.python(&py, &script, &env.shm).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[[0, 1], [1, 0], [2, 0], [3, 0]]",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// After torch.profiler, where CUPTI is still held (Kineto keeps it unless
/// TEARDOWN_CUPTI=1; before CUPTI 13.2 it takes one client), the
/// accounting outside the allocator says so once, naming TEARDOWN_CUPTI,
/// and tries again on its own, never while a profile runs, until it is
/// back. outside.cpp is stood in for: CUPTI refuses it twice.
#[test]
fn the_accounting_comes_back_once_the_profiler_gives_cupti_back() {
    let Some(py) = python() else {
        println!(
            "SKIPPED: the_accounting_comes_back_once_the_profiler_gives_cupti_back: no python3"
        );
        return;
    };
    let env = setup();
    let script = env.script(
        "back.py",
        r#"
import json, time
from vramscope import _outside
class Lib:
    tries = 0
    stops = 0
    def vs_outside_stop(self):
        self.stops += 1
        return 0
    def vs_outside_start(self, write, why, n):
        self.tries += 1
        return 0 if self.tries >= 3 else 23
lib = Lib()
_outside.RETRY_S = 0.05
_outside.HELD_TRIES = 1
_outside._st["lib"] = lib
_outside._step_aside()
aside = _outside.status()
_outside._come_back()
held = _outside.status()
_outside._step_aside()          # a second profile at once
time.sleep(0.4)
during = lib.tries
_outside._come_back()
for _ in range(300):
    if _outside.status() is True:
        break
    time.sleep(0.01)
print(json.dumps([aside, held, during, _outside.status(), lib.tries, lib.stops]), flush=True)
"#,
    );
    // Without TEARDOWN_CUPTI=1 it says so at once, naming it; with it
    // (CUPTI given back at the job's next CUDA call) only after HELD_TRIES
    // tries (1 here: the third try, the first of the retries, succeeds).
    for (teardown, said) in [("0", "With TEARDOWN_CUPTI=1"), ("1", "")] {
        let out = (env.python(&py, &script, &env.shm))
            .env("TEARDOWN_CUPTI", teardown)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
        assert_eq!(got[0], "stepped aside for torch.profiler", "{err}");
        let held = got[1].as_str().unwrap_or_default();
        assert!(
            held.starts_with("stepped aside after torch.profiler: CUPTI is still held (error 23)"),
            "{held}"
        );
        assert_eq!(got[2], 1, "no try while the second profile runs");
        assert_eq!(got[3], true, "back: {got}");
        assert_eq!((got[4].clone(), got[5].clone()), (3.into(), 1.into()));
        let lines: Vec<&str> = our_lines(&err);
        if said.is_empty() {
            assert!(lines.is_empty(), "TEARDOWN_CUPTI=1, back in time: {err}");
        } else {
            assert_eq!(lines.len(), 1, "said once: {err}");
            assert!(lines[0].contains(said), "{err}");
        }
    }
}

/// With TEARDOWN_CUPTI=1 and CUPTI still held HELD_TRIES tries after the
/// profile (another client keeps it), the agent says so once.
#[test]
fn cupti_still_held_despite_teardown_is_said_once() {
    let Some(py) = python() else {
        println!("SKIPPED: cupti_still_held_despite_teardown_is_said_once: no python3");
        return;
    };
    let env = setup();
    let script = env.script(
        "held.py",
        r#"
import time
from vramscope import _outside
class Lib:
    tries = 0
    def vs_outside_stop(self):
        return 0
    def vs_outside_start(self, write, why, n):
        self.tries += 1
        return 23
lib = Lib()
_outside.RETRY_S = 0.02
_outside.HELD_TRIES = 3
_outside._st["lib"] = lib
_outside._step_aside()
_outside._come_back()
while lib.tries < 8:
    time.sleep(0.01)
print(lib.tries, flush=True)
"#,
    );
    let out = (env.python(&py, &script, &env.shm))
        .env("TEARDOWN_CUPTI", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let lines = our_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0]
            .contains("still held (error 23) 3 tries after the profile, although TEARDOWN_CUPTI=1"),
        "{err}"
    );
}

/// CUDA creates the context after torch's initialisation, where the
/// accounting begins, and NVML lists the process only then: the context's
/// measurement reads again until it does, and what it measures is the
/// context however late (the accounting has followed every call since);
/// after a late start it is "context and earlier"; never listed, nothing
/// (after the wait). NVML's reading is stood in for.
#[test]
fn the_context_is_measured_once_nvml_lists_the_process() {
    let Some(py) = python() else {
        println!("SKIPPED: the_context_is_measured_once_nvml_lists_the_process: no python3");
        return;
    };
    let env = setup();
    let script = env.script(
        "ctx.py",
        r#"
import json, sys, time
from vramscope import _outside
listed_from, at_init = int(sys.argv[1]), sys.argv[2] == "1"
reads = []
def contexts(torch, named=None):
    reads.append(named(0))
    return {0: 530 << 20} if len(reads) >= listed_from else {}
_outside.contexts_by_nvml = contexts
class Lib:
    said = []
    def vs_outside_named(self, d):
        return 7
    def vs_outside_context(self, d, n, kind):
        self.said.append([d, n >> 20, kind])
lib = Lib()
t0 = time.monotonic()
_outside._measure_contexts(lib, None, at_init, wait_s=1.0)
waited = time.monotonic() - t0 >= 0.99
print(json.dumps([min(len(reads), 3), lib.said, waited]), flush=True)
"#,
    );
    for (listed_from, at_init, want) in [
        ("1", "1", "[1, [[0, 530, 1]], false]"),
        ("3", "1", "[3, [[0, 530, 1]], false]"),
        ("3", "0", "[3, [[0, 530, 9]], false]"),
        ("99", "1", "[3, [], true]"),
    ] {
        let out = (env.python(&py, &script, &env.shm))
            .args([listed_from, at_init])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            want,
            "listed from reading {listed_from}, at CUDA's start {at_init}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
