//! Item 1 of the reliability issue: a job whose agent runs in sampled mode
//! is seen by every reader. End to end and without a GPU: the stand-in torch
//! (`tests/fixtures/fake_torch.py`, as `torch.py` on PYTHONPATH) and
//! `VRAMSCOPE_MODE=sampled`, a small training loop under `vramscope run`,
//! then `vramscope snapshot --json`, `vramscope empty-cache PID` and the
//! dashboard in a pseudo-terminal, each checked against what the stand-in
//! torch itself reports.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use portable_pty::CommandBuilder;
use serde_json::Value;

const FAKE_TORCH: &str = include_str!("fixtures/fake_torch.py");

/// A small loop: weights that stay, activations made and freed each step
/// (so the cache holds more than is allocated), step marks; then, quiescent,
/// it writes torch's own figures to `state.json` and waits for `go` in its
/// control directory; then it writes torch's figures again to `after.json`.
const TRAIN: &str = r#"
import json, os, sys, time
import torch
import vramscope

MiB = 1 << 20
ctl = sys.argv[1]

def figures(name):
    cuda = torch.cuda
    cuda.synchronize()
    d = {"pid": os.getpid(), "reserved": cuda.memory_reserved(), "allocated": cuda.memory_allocated(),
         "calls": list(cuda.calls)}
    tmp = os.path.join(ctl, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(d, f)
    os.rename(tmp, os.path.join(ctl, name))

torch.cuda._alloc(10 * MiB)  # weights
for step in range(20):
    torch.cuda._alloc(30 * MiB)  # activations
    torch.cuda._free(30 * MiB)
    vramscope.mark(step)
    time.sleep(0.01)
time.sleep(0.3)  # statistics of the quiescent state are out (every 50 ms)
figures("state.json")
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(ctl, "go")) and time.monotonic() < deadline:
    time.sleep(0.02)
figures("after.json")
"#;

fn python() -> Option<String> {
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    std::process::Command::new(&py)
        .args(["-c", "import sys; assert sys.version_info >= (3, 8)"])
        .status()
        .is_ok_and(|s| s.success())
        .then_some(py)
}

/// The job under `vramscope run`; killed if the test fails before it ends.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `path` (a JSON file the script writes by rename).
fn wait_json(path: &Path, job: &mut Job) -> Value {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        if let Ok(text) = std::fs::read_to_string(path) {
            return serde_json::from_str(&text).unwrap();
        }
        if let Ok(Some(status)) = job.0.try_wait() {
            panic!(
                "the job exited ({status}) before writing {}",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no {} within 30 s", path.display());
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn run_ok(args: &[&str], shm: &Path) -> String {
    let out = common::vramscope()
        .args(args)
        .arg("--shm-dir")
        .arg(shm)
        .env_remove("VRAMSCOPE_SHM_DIR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "vramscope {args:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// The snapshot's entry for `pid`, or a failure naming what it shows instead.
fn snapshot_entry(shm: &Path, pid: u64) -> Value {
    let out = run_ok(&["snapshot", "--json", "--no-nvml"], shm);
    let snap: Value = serde_json::from_str(&out).unwrap();
    snap["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["identity"]["host_pid"] == pid)
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "snapshot does not show the job (pid {pid}); problems: {}",
                snap["problems"]
            )
        })
}

/// The dashboard's screen, opened on `pid`, once it shows `needles` (or
/// after 20 s); then `q`. Returns the screen's text.
fn dashboard_screen(shm: &Path, pid: u64, needles: &[&str]) -> String {
    let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_vramscope"));
    for a in [
        "--no-nvml",
        "--no-mouse",
        "--pid",
        &pid.to_string(),
        "--shm-dir",
    ] {
        cmd.arg(a);
    }
    cmd.arg(shm);
    cmd.env_remove("VRAMSCOPE_SHM_DIR");
    let common::Pty {
        mut child,
        master: _master,
        keys: mut writer,
        output,
    } = common::in_pty(cmd, 30, 120);
    let screen = || {
        common::screen(&output.lock().unwrap(), 30, 120)
            .screen()
            .contents()
    };
    let start = Instant::now();
    let mut text = screen();
    while start.elapsed() < Duration::from_secs(20) && !needles.iter().all(|n| text.contains(n)) {
        std::thread::sleep(Duration::from_millis(50));
        text = screen();
    }
    writer.write_all(b"q").unwrap();
    writer.flush().unwrap();
    let quit = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if quit.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("the dashboard did not quit on q; screen:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    text
}

#[test]
fn item1_a_sampled_mode_job_is_seen_by_snapshot_empty_cache_and_the_dashboard() {
    let Some(py) = python() else {
        println!("SKIPPED: item 1: the agent tests need python3");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let user = t.join("user");
    let (shm, ctl) = (t.join("shm"), t.join("ctl"));
    for d in [&user, &shm, &ctl] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(user.join("torch.py"), FAKE_TORCH).unwrap();
    let script = t.join("train.py");
    std::fs::write(&script, TRAIN).unwrap();
    let job = common::vramscope()
        .arg("run")
        .arg("--shm-dir")
        .arg(&shm)
        .arg("--")
        .arg(&py)
        .arg(&script)
        .arg(&ctl)
        .env("PYTHONPATH", &user)
        .env("VRAMSCOPE_MODE", "sampled")
        .env("VRAMSCOPE_STATS_MS", "50")
        .env("XDG_CACHE_HOME", t.join("cache"))
        .env_remove("VRAMSCOPE_SHM_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut job = Job(job);
    let state = wait_json(&ctl.join("state.json"), &mut job);
    let pid = u(&state["pid"]);
    assert_eq!(pid, u64::from(job.0.id()), "`vramscope run` execs the job");
    let (reserved, allocated) = (u(&state["reserved"]), u(&state["allocated"]));
    assert!(reserved > allocated, "the stand-in caches memory: {state}");

    // (a) snapshot --json shows the job with torch's own figures.
    let p = snapshot_entry(&shm, pid);
    assert_eq!(p["source"]["mode"], "sampled", "{p}");
    let fig = &p["view"]["figures"];
    assert_eq!(
        (u(&fig["reserved"]), u(&fig["allocated"])),
        (reserved, allocated),
        "snapshot's reserved and allocated against torch's: {fig}"
    );
    assert!(
        p["identity"]["label"]
            .as_str()
            .is_some_and(|l| l.starts_with("train.py")),
        "{p}"
    );

    // (c) the dashboard, opened on the job, shows its pid and its mode.
    let screen = dashboard_screen(&shm, pid, &[&format!("pid {pid}"), "sampled"]);
    assert!(
        screen.contains(&format!("pid {pid}")) && screen.contains("sampled"),
        "the dashboard does not show pid {pid} in sampled mode:\n{screen}"
    );

    // (b) empty-cache PID: the agent thread answers, torch's cache is
    // emptied once, and what it prints is what torch reports.
    let out = run_ok(&["empty-cache", &pid.to_string()], &shm);
    let seen = snapshot_entry(&shm, pid);
    std::fs::write(ctl.join("go"), b"").unwrap();
    let after = wait_json(&ctl.join("after.json"), &mut job);
    assert_eq!(
        after["calls"],
        serde_json::json!(["empty_cache"]),
        "{after}"
    );
    let now = u(&after["reserved"]);
    assert!(now < reserved, "the stand-in released nothing: {after}");
    use vramscope_text::format::bytes;
    let want = format!(
        "process {pid}: released {} (reserved {} -> {})",
        bytes(reserved - now),
        bytes(reserved),
        bytes(now)
    );
    assert_eq!(out.trim_end(), want);
    // And the next look shows what torch reports now.
    let fig = &seen["view"]["figures"];
    assert_eq!(
        (u(&fig["reserved"]), u(&fig["allocated"])),
        (now, u(&after["allocated"])),
        "snapshot after empty-cache against torch's: {fig}"
    );

    let status = job.0.wait().unwrap();
    let stderr = {
        use std::io::Read;
        let mut s = String::new();
        job.0.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        s
    };
    assert!(status.success(), "{status}: {stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&shm).unwrap().count(),
        0,
        "the segment is removed at exit"
    );
}
