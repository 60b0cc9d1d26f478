//! The build lifecycle of the agent's native parts (issue 43, item 1), with
//! a stand-in torch (`tests/fixtures/fake_torch.py` plus `version.cuda` and
//! the header the builder looks for) and a stand-in compiler (a shell
//! script that logs each call, waits, then writes its output): `vramscope
//! run` builds before the job and keeps the job's exit status; runs started
//! at once build once and the others say they wait; a build that is killed
//! or ended leaves no temporary file; a job that imports the agent without
//! `run` has it built by a detached builder that outlives the job; `agent
//! build` and `doctor` say what is built.
//!
//! Each test has its own cache (XDG_CACHE_HOME), segment directory and
//! stand-ins, and sets them on the commands it starts (never on this
//! process). Needs python3; without it each test says SKIPPED.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const FAKE_TORCH: &str = include_str!("fixtures/fake_torch.py");

/// A stand-in C++ compiler: logs the output path it was asked for, waits
/// `FAKE_CXX_SLEEP` seconds (as a real build takes its 20 s), then writes
/// the output; `FAKE_CXX_FAIL` makes it fail as a compile error does.
const FAKE_CXX: &str = r#"#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$out" >> "$FAKE_CXX_LOG"
sleep "${FAKE_CXX_SLEEP:-0}"
if [ -n "${FAKE_CXX_FAIL:-}" ]; then echo "x.cpp:1:1: error: stand-in failure"; exit 1; fi
printf 'stand-in library\n' > "$out"
"#;

/// A job: imports torch, allocates, waits `argv[1]` seconds, then exits
/// with status `argv[2]`.
const JOB: &str = r#"
import sys, time
import torch
torch.cuda._alloc(1 << 20)
time.sleep(float(sys.argv[1]))
print("job done", flush=True)
sys.exit(int(sys.argv[2]))
"#;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
}

impl Env {
    fn new() -> Option<Env> {
        let ok = Command::new("python3")
            .args(["-c", "pass"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            println!("SKIPPED: the build lifecycle tests need python3");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let torch = root.join("site/torch");
        std::fs::create_dir_all(torch.join("include/c10/cuda")).unwrap();
        std::fs::create_dir_all(torch.join("lib")).unwrap();
        std::fs::write(
            torch.join("include/c10/cuda/CUDACachingAllocator.h"),
            "// stand-in\n",
        )
        .unwrap();
        std::fs::write(
            torch.join("__init__.py"),
            format!("{FAKE_TORCH}\n\nclass version:\n    cuda = \"13.0\"\n"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("cuda/crt")).unwrap();
        std::fs::write(root.join("cuda/cuda_runtime_api.h"), "").unwrap();
        std::fs::write(root.join("cuda/crt/host_config.h"), "").unwrap();
        let cxx = root.join("cxx");
        std::fs::write(&cxx, FAKE_CXX).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cxx, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("job.py"), JOB).unwrap();
        std::fs::create_dir_all(root.join("shm")).unwrap();
        std::fs::write(root.join("cxx.log"), "").unwrap();
        Some(Env { _tmp: tmp, root })
    }

    fn cache(&self) -> PathBuf {
        self.root.join("cache/vramscope")
    }

    /// `cmd` with this test's stand-ins and cache.
    fn setup(&self, mut cmd: Command, sleep: f64) -> Command {
        cmd.env("XDG_CACHE_HOME", self.root.join("cache"))
            .env("PYTHONPATH", self.root.join("site"))
            .env("VRAMSCOPE_CXX", self.root.join("cxx"))
            .env("VRAMSCOPE_CUDA_INCLUDE", self.root.join("cuda"))
            .env("VRAMSCOPE_SHM_DIR", self.root.join("shm"))
            .env("FAKE_CXX_LOG", self.root.join("cxx.log"))
            .env("FAKE_CXX_SLEEP", sleep.to_string())
            .env_remove("VRAMSCOPE_PYTHON")
            .env_remove("VRAMSCOPE_MODE")
            .env_remove("CXX");
        cmd
    }

    fn vramscope(&self, sleep: f64) -> Command {
        self.setup(common::vramscope(), sleep)
    }

    fn run_job(&self, sleep: f64, job_s: f64, status: i32) -> Command {
        let mut cmd = self.vramscope(sleep);
        cmd.args(["run", "--", "python3"])
            .arg(self.root.join("job.py"))
            .args([job_s.to_string(), status.to_string()]);
        cmd
    }

    /// How many times the stand-in compiler was asked for a tracker.
    fn tracker_compiles(&self) -> usize {
        self.compiles("tracker-")
    }

    /// How many times the stand-in compiler was asked for a library whose
    /// name has `what` (`tracker-`, `outside-`).
    fn compiles(&self, what: &str) -> usize {
        std::fs::read_to_string(self.root.join("cxx.log"))
            .unwrap()
            .lines()
            .filter(|l| l.contains(what))
            .count()
    }

    /// Temporary files of builds in the cache.
    fn temporaries(&self) -> Vec<String> {
        std::fs::read_dir(self.cache())
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(".building-") || n.starts_with(".tmp-"))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn tracker_built(&self) -> bool {
        std::fs::read_dir(self.cache()).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("tracker-") && n.ends_with(".so")
            })
        })
    }
}

fn text(out: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Python builder under a `vramscope agent build` (its child).
fn builder_of(parent: &Child) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", parent.id())).ok()?;
    children.split_whitespace().next()?.parse().ok()
}

#[test]
fn run_builds_before_the_job_once_and_keeps_its_exit_status() {
    let Some(env) = Env::new() else { return };
    let out = env.run_job(1.0, 0.0, 7).output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("building the tracker"))
        .unwrap_or_else(|| panic!("no progress line: {}", text(&out)));
    assert!(line.contains("first run only"), "{line}");
    assert!(line.contains(" s "), "no elapsed time: {line}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("job done"),
        "the job ran after the build: {}",
        text(&out)
    );
    assert_eq!(env.tracker_compiles(), 1);
    assert!(env.tracker_built());
    // Once built: nothing more is compiled or said, and the exit status
    // is still the job's (a signal death too).
    let again = env.run_job(5.0, 0.0, 0).output().unwrap();
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    assert!(
        !String::from_utf8_lossy(&again.stderr).contains("building"),
        "{}",
        text(&again)
    );
    assert_eq!(env.tracker_compiles(), 1);
    let mut killed = env.vramscope(0.0);
    killed.args(["run", "--", "sh", "-c", "kill -TERM $$"]);
    let out = killed.output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(15), "{}", text(&out));
    assert!(env.temporaries().is_empty(), "{:?}", env.temporaries());
}

#[test]
fn runs_started_at_once_build_once_and_the_others_say_they_wait() {
    let Some(env) = Env::new() else { return };
    let children: Vec<Child> = (0..4)
        .map(|i| {
            env.run_job(1.5, 0.0, 10 + i)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(10 + i as i32), "{}", text(out));
    }
    assert_eq!(env.tracker_compiles(), 1, "built more than once");
    let waited = outs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("waiting for process"))
        .count();
    let built = outs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("vramscope: building the tracker"))
        .count();
    assert_eq!(built, 1, "one process builds");
    assert!(waited >= 1, "the others say they wait");
    assert!(env.temporaries().is_empty(), "{:?}", env.temporaries());
}

#[test]
fn a_killed_or_ended_build_leaves_no_temporary_file() {
    let Some(env) = Env::new() else { return };
    for signal in ["-TERM", "-INT", "-KILL"] {
        let mut cmd = env.vramscope(30.0);
        cmd.args(["agent", "build"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        wait_for(
            "the build's temporary file",
            Duration::from_secs(20),
            || !env.temporaries().is_empty(),
        );
        let builder = builder_of(&child).expect("the builder process");
        let _ = Command::new("kill")
            .arg(signal)
            .arg(builder.to_string())
            .status();
        let status = child.wait().unwrap();
        assert!(!status.success(), "{signal}: {status:?}");
        if signal != "-KILL" {
            // It removed its own temporary file on the way out.
            assert!(
                env.temporaries().is_empty(),
                "{signal}: {:?}",
                env.temporaries()
            );
        }
        assert!(!env.tracker_built(), "{signal}");
    }
    // What SIGKILL left goes with the next start (not even a build: the
    // next `run` of anything).
    let out = env
        .vramscope(0.0)
        .args(["run", "--", "sh", "-c", "exit 4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out));
    assert!(env.temporaries().is_empty(), "{:?}", env.temporaries());

    // (That `run` built the tracker for python3: `sh` is not a Python.)
    assert!(env.tracker_built());
}

#[test]
fn a_failed_build_is_kept_and_tried_again_only_when_forced() {
    let Some(env) = Env::new() else { return };
    // A compile error: no temporary file, one line saying why, and jobs do
    // not try again (the failure is kept) until `agent build --force`.
    let mut failing = env.vramscope(0.0);
    failing.env("FAKE_CXX_FAIL", "1").args(["agent", "build"]);
    let out = failing.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stand-in failure"),
        "{}",
        text(&out)
    );
    assert!(env.temporaries().is_empty(), "{:?}", env.temporaries());
    let compiles = env.tracker_compiles();
    let job = env.run_job(0.0, 0.0, 5).output().unwrap();
    assert_eq!(job.status.code(), Some(5), "{}", text(&job));
    assert_eq!(env.tracker_compiles(), compiles, "a job tried again");
    let forced = env
        .vramscope(0.0)
        .args(["agent", "build", "--force"])
        .output()
        .unwrap();
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced));
    assert!(env.tracker_built());
}

#[test]
fn a_job_without_run_has_it_built_by_a_detached_builder_that_outlives_it() {
    let Some(env) = Env::new() else { return };
    let agent = String::from_utf8(
        env.vramscope(0.0)
            .args(["agent", "path"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let mut job = env.setup(Command::new("python3"), 2.0);
    job.env(
        "PYTHONPATH",
        format!("{}:{}", agent.trim(), env.root.join("site").display()),
    )
    .env("VRAMSCOPE_AUTO", "1")
    .arg(env.root.join("job.py"))
    .args(["0.3", "9"]);
    let out = job.output().unwrap();
    // The job ended first, with its own status, having said once that it
    // runs sampled while the tracker is built.
    assert_eq!(out.status.code(), Some(9), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("built in the background").count(),
        1,
        "{}",
        text(&out)
    );
    assert!(!env.tracker_built(), "built before the job ended?");
    // The builder goes on without it, and leaves the build for the next job.
    wait_for("the detached build", Duration::from_secs(30), || {
        env.tracker_built() && env.temporaries().is_empty()
    });
    assert_eq!(env.tracker_compiles(), 1);
    // `doctor` says what is built.
    let doc = env
        .vramscope(0.0)
        .args(["doctor", "--json", "--shm-dir"])
        .arg(env.root.join("shm"))
        .env("VRAMSCOPE_PYTHON", "python3")
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&doc.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&doc)));
    let check = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tracker build")
        .unwrap_or_else(|| panic!("no tracker build check: {v}"))
        .clone();
    assert_eq!(check["level"], "ok", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("built for torch"),
        "{check}"
    );
}

/// Where CUPTI is found, `run` also builds the accounting outside the
/// allocator before the job (so that the agent subscribes as CUDA starts
/// and what it measures then is the context alone), once, and says so;
/// `VRAMSCOPE_OUTSIDE=0` builds none.
#[test]
fn run_builds_the_accounting_outside_the_allocator_before_the_job() {
    let Some(env) = Env::new() else { return };
    let home = env.root.join("cudahome");
    let cupti = home.join("extras/CUPTI");
    std::fs::create_dir_all(cupti.join("include")).unwrap();
    std::fs::create_dir_all(cupti.join("lib64")).unwrap();
    std::fs::write(cupti.join("include/cupti.h"), "// stand-in\n").unwrap();
    std::fs::write(cupti.join("lib64/libcupti.so.13"), "stand-in\n").unwrap();
    let run = |outside: &str| {
        let mut cmd = env.run_job(0.0, 0.0, 0);
        cmd.env("CUDA_HOME", &home)
            .env("VRAMSCOPE_OUTSIDE", outside);
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    run("0");
    assert_eq!(env.compiles("outside-"), 0, "off: not built");
    assert_eq!(env.tracker_compiles(), 1);
    let err = run("1");
    assert_eq!(env.compiles("outside-"), 1);
    assert_eq!(env.tracker_compiles(), 1, "the tracker was cached already");
    assert!(
        err.lines().any(|l| l.contains("building the tracker")
            && l.contains("the accounting outside the allocator")),
        "{err}"
    );
    let again = run("1");
    assert_eq!(env.compiles("outside-"), 1, "cached: {again}");
    assert!(!again.contains("building"), "{again}");
    // The doctor says it is built, and what a job started with it off
    // shows; where it is not built yet, what the job will call it.
    let doctor = |outside: &str, home: &Path| {
        let out = (env.vramscope(0.0))
            .arg("doctor")
            .env("VRAMSCOPE_PYTHON", "python3")
            .env("CUDA_HOME", home)
            .env("VRAMSCOPE_OUTSIDE", outside)
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.lines())
            .find(|l| l.contains("outside memory"))
            .unwrap_or_else(|| panic!("the doctor says nothing of it:\n{out}"))
            .to_string()
    };
    let built = doctor("1", &home);
    assert!(
        built.starts_with("[ok  ]") && built.contains("named by CUPTI"),
        "{built}"
    );
    assert!(doctor("0", &home).contains("off (VRAMSCOPE_OUTSIDE=0)"));
    // No CUPTI under CUDA_HOME: none here (a machine with a toolkit in
    // /usr/local/cuda or CUPTI's wheel finds that one, not built yet).
    let none = doctor("1", &env.root.join("no-cuda-here"));
    assert!(
        none.starts_with("[warn]") && (none.contains("no CUPTI") || none.contains("not built yet")),
        "{none}"
    );
}

#[test]
fn agent_build_says_what_it_did() {
    let Some(env) = Env::new() else { return };
    let first = env
        .vramscope(0.0)
        .args(["agent", "build"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    assert!(
        String::from_utf8_lossy(&first.stderr).contains("the tracker is built: "),
        "{}",
        text(&first)
    );
    let second = env
        .vramscope(0.0)
        .args(["agent", "build"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("already built"),
        "{}",
        text(&second)
    );
    // A Python without torch: nothing to build, exit 3, one line.
    let none = env
        .vramscope(0.0)
        .env("PYTHONPATH", env.root.join("nothing-here"))
        .args(["agent", "build"])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(3), "{}", text(&none));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("nothing to build"),
        "{}",
        text(&none)
    );
    assert!(Path::new(&env.root).exists());
}

/// The README's first-run instructions are true: each `vramscope ...`
/// line of the install section's block (building ahead, then the doctor)
/// runs as written, with the stand-ins, and the doctor then says the
/// tracker is built.
#[test]
fn the_readme_s_first_run_instructions_are_true() {
    let Some(env) = Env::new() else { return };
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let at = readme
        .find("to do it ahead of time")
        .expect("the install section says how to build ahead");
    let lines: Vec<&str> = readme[at..]
        .lines()
        .skip_while(|l| !l.starts_with("    "))
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .collect();
    assert!(lines.contains(&"vramscope agent build"), "{lines:?}");
    let mut last = String::new();
    for line in &lines {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"vramscope"), "{line}");
        let out = env
            .vramscope(0.0)
            .args(&words[1..])
            .env("VRAMSCOPE_PYTHON", "python3")
            .env("VRAMSCOPE_SHM_DIR", env.root.join("shm"))
            .output()
            .unwrap();
        assert!(out.status.success(), "`{line}`: {}", text(&out));
        last = String::from_utf8_lossy(&out.stdout).into_owned();
    }
    let check = last
        .lines()
        .find(|l| l.contains("tracker build"))
        .unwrap_or_else(|| panic!("the doctor says nothing of the build:\n{last}"));
    assert!(
        check.starts_with("[ok  ]") && check.contains("built for torch"),
        "{check}"
    );
}
