//! `agent::run` injects the agent with no change to the script (chaining the
//! user's own sitecustomize) and preserves the exit code; `extract` is
//! idempotent and safe under concurrency; `doctor` reports; the tracker
//! compiles against real torch headers when they are here.
//!
//! Only `run_injects_sitecustomize_and_keeps_the_exit_code` changes this
//! process's environment (PYTHONPATH, XDG_CACHE_HOME); `doctor` reads them
//! (it extracts the agent into the cache), so the two hold [`ENV`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command as Proc;

use vramscope_collect::agent::{self, Level};

mod common;

/// Held by the tests that set or read the process's environment: the
/// doctor's agent must not be extracted into the run test's cache while
/// that test removes it.
static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn python() -> Option<String> {
    let py = std::env::var("VRAMSCOPE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    Proc::new(&py)
        .arg("-c")
        .arg("pass")
        .status()
        .ok()
        .filter(|s| s.success())
        .map(|_| py)
}

/// A stand-in `torch` package for the agent without a GPU.
const FAKE_TORCH: &str = include_str!("fixtures/fake_torch.py");

#[test]
fn run_injects_sitecustomize_and_keeps_the_exit_code() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let Some(py) = python() else {
        println!("SKIPPED: the agent tests need python3");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let user = tmp.path().join("user");
    std::fs::create_dir_all(user.join("torch")).unwrap();
    std::fs::write(user.join("torch/__init__.py"), FAKE_TORCH).unwrap();
    // The user's own sitecustomize, shadowed by ours: it must still run.
    std::fs::write(
        user.join("sitecustomize.py"),
        "import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n",
    )
    .unwrap();
    let shm = tmp.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let script = tmp.path().join("train.py");
    std::fs::write(
        &script,
        r#"
import json, os, sys, time
assert "torch" not in sys.modules, "torch imported before the script did"
assert os.environ.get("USER_SITECUSTOMIZE") == "ran", "user sitecustomize did not run"
import torch
import vramscope
for _ in range(400):
    if vramscope.status()["mode"] not in (None, "pending"):
        break
    time.sleep(0.01)
st = vramscope.status()
print(json.dumps(st), flush=True)
assert st["mode"] == "sampled", st
assert os.path.exists(st["path"])
assert os.path.dirname(st["path"]) == sys.argv[1]
sys.exit(int(sys.argv[2]))
"#,
    )
    .unwrap();
    std::env::set_var("PYTHONPATH", &user);
    std::env::set_var("XDG_CACHE_HOME", tmp.path().join("cache"));
    let argv: Vec<OsString> = vec![
        py.clone().into(),
        script.clone().into(),
        shm.clone().into(),
        "3".into(),
    ];
    let status = agent::run(&argv, Some(&shm)).unwrap();
    assert_eq!(status.code(), Some(3));
    // The segment was closed and removed at exit.
    assert_eq!(std::fs::read_dir(&shm).unwrap().count(), 0);
    // Extracted under XDG_CACHE_HOME.
    assert!(tmp
        .path()
        .join("cache/vramscope")
        .join(agent::dir_name())
        .join("sitecustomize.py")
        .is_file());

    // A command that is not Python: exit codes pass through too.
    let argv: Vec<OsString> = vec!["sh".into(), "-c".into(), "exit 7".into()];
    assert_eq!(agent::run(&argv, None).unwrap().code(), Some(7));
    assert!(agent::run(&[], None).is_err());
}

#[test]
fn extract_is_idempotent_and_repairs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = agent::extract_to(tmp.path()).unwrap();
    let b = agent::extract_to(tmp.path()).unwrap();
    assert_eq!(a, b);
    for (name, body) in agent::FILES {
        assert_eq!(&std::fs::read_to_string(a.join(name)).unwrap(), body);
    }
    // A damaged extraction is replaced.
    std::fs::remove_file(a.join("vramscope/_segment.py")).unwrap();
    let c = agent::extract_to(tmp.path()).unwrap();
    assert_eq!(c, a);
    assert!(a.join("vramscope/_segment.py").is_file());
    // Concurrent extractions agree and leave no temporary directories.
    let tmp2 = tempfile::tempdir().unwrap();
    let root: PathBuf = tmp2.path().to_path_buf();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let r = root.clone();
            std::thread::spawn(move || agent::extract_to(&r).unwrap())
        })
        .collect();
    let dirs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(dirs.iter().all(|d| *d == dirs[0]));
    let entries: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries, vec![OsString::from(agent::dir_name())]);
}

#[test]
fn doctor_reports_every_check() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let py = python().unwrap_or_else(|| "python3".into());
    let checks = agent::doctor_with(py.as_ref(), Some(tmp.path()), false);
    for c in &checks {
        println!("{:?} {}: {} {}", c.level, c.name, c.detail, c.fix);
    }
    let get = |n: &str| checks.iter().find(|c| c.name == n);
    assert!(get("NVML").is_some());
    assert_eq!(get("segment directory").unwrap().level, Level::Ok);
    assert_eq!(get("permissions").unwrap().level, Level::Ok);
    assert!(get("free space").is_some());
    if python().is_some() {
        assert!(get("C++ compiler").is_some(), "{checks:?}");
        assert!(get("CUDA headers").is_some());
        assert!(get("torch").is_some());
    }
    let bad = agent::doctor_with(py.as_ref(), Some(Path::new("/nonexistent/x")), false);
    let seg = bad.iter().find(|c| c.name == "segment directory").unwrap();
    assert_eq!(seg.level, Level::Fail);
    assert!(!seg.fix.is_empty());
}

/// Compiles tracker.cpp with -fsyntax-only (both variants) against the torch
/// headers of `$VRAMSCOPE_TEST_PYTHON` / python3, using the agent's own
/// header search. Skips visibly when there are no torch or CUDA headers.
#[test]
fn tracker_compiles_against_real_torch_headers() {
    let Some(py) = python() else {
        println!("SKIPPED: tracker syntax check needs python3");
        return;
    };
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/agent");
    let mut probe = Proc::new(&py);
    probe
        .arg("-c")
        .arg(
            r#"
import json, os
from vramscope import _build
root = _build.torch_root_without_import()
inc, why = _build.find_cuda_include()
cxx, _ = _build.find_compiler()
ver = None
if root:
    for line in open(os.path.join(root, "version.py")):
        if line.startswith("__version__"):
            ver = line.split("=")[1].strip().strip("'\"")
print(json.dumps({"root": root, "inc": inc, "why": why, "cxx": cxx, "ver": ver, "std": _build.cxx_std(ver or "0")}))
"#,
        )
        .env("PYTHONPATH", &assets);
    let out = common::succeeded(probe.output().unwrap());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let Some(root) = v["root"].as_str() else {
        println!("SKIPPED: tracker syntax check: no torch headers for {py} (set VRAMSCOPE_TEST_PYTHON to a Python with torch)");
        return;
    };
    let Some(incs) = v["inc"].as_array() else {
        println!("SKIPPED: tracker syntax check: {}", v["why"]);
        return;
    };
    let Some(cxx) = v["cxx"].as_str() else {
        println!("SKIPPED: tracker syntax check: no C++ compiler");
        return;
    };
    let ver = v["ver"].as_str().unwrap_or("0");
    let std = v["std"].as_str().unwrap_or("c++17");
    for variant in [None, Some("-DVS_EMPTY_TRACKER")] {
        let mut cmd = Proc::new(cxx);
        cmd.args(["-fsyntax-only", "-Wall", "-Wextra", "-Werror"])
            .arg(format!("-std={std}"))
            .arg("-D_GLIBCXX_USE_CXX11_ABI=1")
            .arg("-I")
            .arg(&assets)
            .arg("-isystem")
            .arg(format!("{root}/include"))
            .arg("-isystem")
            .arg(format!("{root}/include/torch/csrc/api/include"));
        for i in incs {
            cmd.arg("-isystem").arg(i.as_str().unwrap());
        }
        if let Some(v) = variant {
            cmd.arg(v);
        }
        let o = cmd.arg(assets.join("tracker.cpp")).output().unwrap();
        assert!(
            o.status.success(),
            "tracker.cpp {variant:?} against torch {ver}:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    println!("tracker.cpp compiles against torch {ver} at {root} ({std})");
}
