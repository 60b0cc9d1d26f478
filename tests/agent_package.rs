//! `assets/agent/pyproject.toml`: `pip install ./assets/agent` installs the
//! agent with its C++ sources inside the package (where `_build.py` looks
//! first), at the agent's own version.

use std::path::Path;
use std::process::Command;

fn agent_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/agent")
}

#[test]
fn pyproject_version_is_the_agents() {
    let py = std::fs::read_to_string(agent_dir().join("pyproject.toml")).unwrap();
    let build = std::fs::read_to_string(agent_dir().join("vramscope/_build.py")).unwrap();
    let agent = build
        .lines()
        .find_map(|l| l.strip_prefix("AGENT_VERSION = "))
        .expect("AGENT_VERSION in _build.py");
    let project = py
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .expect("version in pyproject.toml");
    assert_eq!(project, agent);
}

#[test]
fn pip_builds_a_wheel_with_the_tracker_sources() {
    if Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .map_or(true, |o| !o.status.success())
    {
        println!("SKIPPED: pip_builds_a_wheel: python3 -m pip is not available");
        return;
    }
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("python3")
        .args(["-m", "pip", "wheel", "--no-deps", "--quiet", "-w"])
        .arg(out_dir.path())
        .arg(agent_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success()
        && (err.contains("No matching distribution found for hatchling")
            || err.contains("Could not find a version that satisfies"))
    {
        println!(
            "SKIPPED: pip_builds_a_wheel: the build backend (hatchling) cannot be fetched: {err}"
        );
        return;
    }
    assert!(out.status.success(), "{err}");
    let wheel = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .expect("a wheel");
    let list = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile; print('\\n'.join(zipfile.ZipFile(sys.argv[1]).namelist()))",
        ])
        .arg(&wheel)
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&list.stdout);
    for f in [
        "vramscope/__init__.py",
        "vramscope/_build.py",
        "vramscope/tracker.cpp",
        "vramscope/fastcall.cpp",
        "vramscope/outside.cpp",
        "vramscope/_outside.py",
        "vramscope/vramscope_ring.h",
    ] {
        assert!(names.lines().any(|l| l == f), "{f} not in {names}");
    }
    // Never a sitecustomize: installing one would change every Python run.
    assert!(!names.contains("sitecustomize"), "{names}");
}
