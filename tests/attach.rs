//! `vramscope attach PID` on running stand-in jobs (python3 with the
//! stand-in torch, `tests/fixtures/fake_torch.py`, and a file named
//! `libc10.so` mapped as a real torch maps its library): the first attach
//! instruments the job (sampled mode: the stand-in has no headers), the
//! next ones are no-ops, and the job keeps running and ends as it would
//! have; jobs blocked in a system call (a sleep, a read on a pipe) go on
//! after the injection; every refusal is one line and exit 1, with the
//! target unharmed.
//!
//! The jobs allow any process of this user to trace them
//! (`prctl(PR_SET_PTRACER_ANY)`), so that the tests run where Yama's
//! ptrace_scope is 1; where ptrace is refused all the same, the tests
//! that inject say SKIPPED.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FAKE_TORCH: &str = include_str!("fixtures/fake_torch.py");

/// The stand-in job. argv: control directory, mode (busy, sleep, input,
/// plain: no torch and no libc10, libc10: the library mapped but torch
/// not imported). It writes its iteration count to `progress` (by
/// rename) as it goes, and ends with status 7 when `stop` appears,
/// printing its count.
const JOB: &str = r#"
import mmap, os, sys, time
ctl, mode = sys.argv[1], sys.argv[2]
try:  # Yama ptrace_scope 1: the vramscope under test is not our parent
    import ctypes
    ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)
except Exception:
    pass
if mode in ("busy", "sleep", "input"):
    import torch
if mode != "plain":
    f = open(os.path.join(ctl, "user", "torch", "lib", "libc10.so"), "rb")
    keep = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)

def progress(n):
    tmp = os.path.join(ctl, "progress.tmp")
    with open(tmp, "w") as f:
        f.write(str(n))
    os.replace(tmp, os.path.join(ctl, "progress"))

progress(0)
if mode == "input":
    line = input()
    print("got", repr(line), flush=True)
    import vramscope
    for _ in range(500):
        if vramscope.status()["mode"] not in (None, "pending"):
            break
        time.sleep(0.01)
    print("mode", vramscope.status()["mode"], flush=True)
    sys.exit(7)
stop = os.path.join(ctl, "stop")
n, last, x = 0, time.monotonic(), 0.0
while not os.path.exists(stop):
    n += 1
    if mode == "sleep":
        time.sleep(0.5)
    else:
        x += sum(range(50)) * 0.5
    now = time.monotonic()
    if mode == "sleep" or now - last > 0.01:
        progress(n)
        last = now
assert x == sum(range(50)) * 0.5 * (0 if mode == "sleep" else n), "floating point state damaged"
print("count", n, flush=True)
sys.exit(7)
"#;

fn python() -> Option<String> {
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    Command::new(&py)
        .args(["-c", "import sys; assert sys.version_info >= (3, 8)"])
        .status()
        .is_ok_and(|s| s.success())
        .then_some(py)
}

/// A running stand-in job, killed if the test ends first.
struct Job {
    child: Child,
    dir: tempfile::TempDir,
    pid: u32,
}

impl Job {
    fn start(py: &str, mode: &str) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let torch = dir.path().join("user/torch");
        std::fs::create_dir_all(torch.join("lib")).unwrap();
        std::fs::write(torch.join("__init__.py"), FAKE_TORCH).unwrap();
        std::fs::write(torch.join("lib/libc10.so"), vec![0u8; 4096]).unwrap();
        std::fs::write(dir.path().join("job.py"), JOB).unwrap();
        std::fs::create_dir(dir.path().join("shm")).unwrap();
        let child = Command::new(py)
            .arg(dir.path().join("job.py"))
            .arg(dir.path())
            .arg(mode)
            .env("PYTHONPATH", dir.path().join("user"))
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env_remove("VRAMSCOPE_SHM_DIR")
            .env_remove("VRAMSCOPE_MODE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut job = Job { child, dir, pid };
        let start = Instant::now();
        while job.progress().is_none() {
            if let Ok(Some(s)) = job.child.try_wait() {
                panic!("the job exited ({s}) before it started: {}", job.stderr());
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "the job did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        job
    }

    fn ctl(&self) -> &Path {
        self.dir.path()
    }

    fn shm(&self) -> PathBuf {
        self.ctl().join("shm")
    }

    fn progress(&self) -> Option<u64> {
        std::fs::read_to_string(self.ctl().join("progress"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Alive, and its count passes `than` within a few seconds.
    fn goes_on(&mut self, than: u64) -> u64 {
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                panic!("the job ended ({s}): {}", self.stderr());
            }
            let n = self.progress().unwrap_or(0);
            if n > than {
                return n;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the job made no progress past {than} in 5 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn segment(&self) -> PathBuf {
        self.shm().join(format!("vramscope-{}-{}", uid(), self.pid))
    }

    /// Asks it to stop; its exit status and stdout.
    fn stop(self) -> (i32, String, String) {
        std::fs::write(self.ctl().join("stop"), "").unwrap();
        self.finish()
    }

    fn finish(mut self) -> (i32, String, String) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the job did not end"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let err = self.stderr();
        (status.code().unwrap_or(-1), out, err)
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(mut s) = self.child.stderr.take() {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = s.read_to_string(&mut err);
            }
        }
        err
    }

    fn attach(&self, extra: &[&str]) -> Output {
        attach_pid(
            &self.pid.to_string(),
            &self.shm(),
            &self.ctl().join("cache"),
            extra,
        )
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn attach_pid(pid: &str, shm: &Path, cache: &Path, extra: &[&str]) -> Output {
    common::vramscope()
        .args(["attach", pid, "--shm-dir"])
        .arg(shm)
        .args(extra)
        .env("XDG_CACHE_HOME", cache)
        .env_remove("VRAMSCOPE_SHM_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The output of a refusal: nothing on stdout, one `vramscope:` line on
/// stderr, exit `code`. Returns the line.
fn one_line(out: &Output, code: i32) -> String {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("vramscope: "), "{stderr}");
    stderr.trim_end().to_string()
}

/// The first attach's output, or None (and SKIPPED) where this machine
/// refuses ptrace.
fn first_attach(job: &Job, extra: &[&str]) -> Option<Output> {
    let out = job.attach(extra);
    let err = text(&out.stderr);
    if err.contains("ptrace refused") {
        println!("SKIPPED: {err}");
        return None;
    }
    Some(out)
}

#[test]
fn attach_instruments_once_then_is_a_no_op_and_the_job_goes_on() {
    let Some(py) = python() else {
        println!("SKIPPED: no python3");
        return;
    };
    let started = Instant::now();
    let mut job = Job::start(&py, "busy");
    let mut n = job.goes_on(0);
    let Some(out) = first_attach(&job, &[]) else {
        return;
    };
    let line = text(&out.stdout);
    assert!(out.status.success(), "{line}{}", text(&out.stderr));
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with(&format!("process {} (", job.pid))
            && line.contains("instrumented, sampled mode"),
        "{line}"
    );
    assert!(
        job.segment().exists(),
        "no segment {} while the job runs",
        job.segment().display()
    );
    let first = started.elapsed();
    n = job.goes_on(n);
    for i in 2..=50 {
        let out = job.attach(&[]);
        let line = text(&out.stdout);
        assert!(
            out.status.success(),
            "attach {i}: {line}{}",
            text(&out.stderr)
        );
        assert_eq!(
            line.trim_end(),
            format!(
                "process {} ({}): already instrumented (mode sampled)",
                job.pid,
                comm(job.pid)
            ),
            "attach {i}"
        );
        n = job.goes_on(n);
    }
    // Through another segment directory the command finds no segment and
    // injects: the agent inside says it was attached already.
    let other = job.ctl().join("shm2");
    std::fs::create_dir(&other).unwrap();
    for i in 0..3 {
        let out = attach_pid(&job.pid.to_string(), &other, &job.ctl().join("cache"), &[]);
        let line = text(&out.stdout);
        assert!(out.status.success(), "{line}{}", text(&out.stderr));
        assert!(
            line.contains("already instrumented (mode sampled)"),
            "{i}: {line}"
        );
        n = job.goes_on(n);
    }
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
    let segment = job.segment();
    let (code, out, err) = job.stop();
    assert_eq!(code, 7, "{out}{err}");
    let count: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("count "))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no count in {out:?} (stderr {err})"));
    assert!(count >= n);
    // The agent's one line (sampled mode), nothing else: no traceback.
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("vramscope: sampled mode"), "{err}");
    assert!(!segment.exists(), "the segment is removed at exit");
    println!("first attach {first:?}, all {:?}", started.elapsed());
}

fn uid() -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap())
}

/// The real uid of a process (`Uid:` of its status).
fn status_uid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A process whose real uid is not `me`, if this machine shows one.
fn other_users_process(me: u32) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| status_uid(pid).is_some_and(|u| u != me))
}

/// The kernel's name of a process (`/proc/PID/comm`), as the line shows it.
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn jobs_blocked_in_a_system_call_go_on() {
    let Some(py) = python() else {
        println!("SKIPPED: no python3");
        return;
    };
    // A sleep: the pending call runs when it ends; the loop goes on.
    let mut job = Job::start(&py, "sleep");
    let n = job.goes_on(0);
    let Some(out) = first_attach(&job, &[]) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("instrumented, sampled mode"));
    job.goes_on(n + 1);
    let (code, out, err) = job.stop();
    assert_eq!(code, 7, "{out}{err}");
    assert!(out.starts_with("count "), "{out}");

    // A read on a pipe: nothing runs Python until a line comes; the
    // command says the call is queued, and the job reads its line whole.
    let mut job = Job::start(&py, "input");
    std::thread::sleep(Duration::from_millis(100)); // inside input()
    let out = job.attach(&["--timeout", "0.5"]);
    let line = one_line(&out, 1);
    assert!(line.contains("queued but did not run within"), "{line}");
    {
        let mut stdin = job.child.stdin.take().unwrap();
        stdin.write_all(b"hello from the test\n").unwrap();
    }
    let (code, out, err) = job.finish();
    assert_eq!(code, 7, "{out}{err}");
    assert_eq!(out, "got 'hello from the test'\nmode sampled\n", "{err}");
}

#[test]
fn refusals_are_one_line_and_leave_the_target_alone() {
    let Some(py) = python() else {
        println!("SKIPPED: no python3");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (shm, cache) = (tmp.path().join("shm"), tmp.path().join("cache"));
    std::fs::create_dir(&shm).unwrap();

    // A Python without torch: refused before anything is touched.
    let mut job = Job::start(&py, "plain");
    let n = job.goes_on(0);
    let line = one_line(&job.attach(&[]), 1);
    assert!(line.contains("has no torch"), "{line}");
    job.goes_on(n);
    let (code, out, err) = job.stop();
    assert_eq!((code, err.as_str()), (7, ""), "{out}");

    // torch's library mapped but torch not imported: the agent inside
    // says so; the job goes on unharmed.
    let mut job = Job::start(&py, "libc10");
    let n = job.goes_on(0);
    if let Some(out) = first_attach(&job, &[]) {
        let line = one_line(&out, 1);
        assert!(
            line.contains("has no torch: the process has not imported torch"),
            "{line}"
        );
        job.goes_on(n);
        let (code, out, err) = job.stop();
        assert_eq!((code, err.as_str()), (7, ""), "{out}");
        assert!(out.starts_with("count "), "{out}");
    }

    // Not a Python.
    let mut sleep = Command::new("sleep").arg("60").spawn().unwrap();
    let line = one_line(&attach_pid(&sleep.id().to_string(), &shm, &cache, &[]), 1);
    assert!(line.contains("is not a CPython process"), "{line}");
    assert!(
        sleep.try_wait().unwrap().is_none(),
        "sleep is still running"
    );
    sleep.kill().unwrap();
    sleep.wait().unwrap();

    // Another user's process: refused, even for root.
    let me = uid();
    let mut made = None;
    let other = other_users_process(me).or_else(|| {
        // Root can make one.
        let child = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sleep",
                "30",
            ])
            .spawn()
            .ok()?;
        let pid = child.id();
        made = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if status_uid(pid).is_some_and(|u| u != me) && comm(pid) == "sleep" {
                return Some(pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    });
    match other {
        Some(pid) => {
            let line = one_line(&attach_pid(&pid.to_string(), &shm, &cache, &[]), 1);
            assert!(line.contains("belongs to another user"), "{line}");
            println!("{line}");
        }
        None => println!("SKIPPED: no process of another user to try"),
    }
    if let Some(mut c) = made {
        let _ = c.kill();
        let _ = c.wait();
    }

    // A dead pid, and pids no process can have.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let line = one_line(&attach_pid(&dead.to_string(), &shm, &cache, &[]), 1);
    assert_eq!(line, format!("vramscope: no such process: {dead}"));
    let line = one_line(&attach_pid("0", &shm, &cache, &[]), 1);
    assert_eq!(line, "vramscope: no such process: 0");
    let line = one_line(&attach_pid("4194305", &shm, &cache, &[]), 1);
    assert_eq!(line, "vramscope: no such process: 4194305");
    let line = one_line(&attach_pid("4294967296", &shm, &cache, &[]), 2);
    assert!(line.contains("4294967296"), "{line}");
    let line = one_line(&attach_pid("python", &shm, &cache, &[]), 2);
    assert!(line.contains("invalid value"), "{line}");
}
