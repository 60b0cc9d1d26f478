//! The agent's module attribution (`assets/agent/vramscope/_attrib.py`) with
//! no torch and no GPU: the real module against the stand-in torch in
//! `tests/agent_attrib/fake_torch` and a stand-in tracker library
//! (`tests/agent_attrib/test_attrib.py`): module paths, the forward,
//! backward, optimizer and other phases per thread, leaves without
//! parameters, exceptions, compiled regions, stack capture (command 5),
//! wrappers and the id bound. Needs python3; without it the test says
//! SKIPPED.

use std::path::Path;
use std::process::Command;

fn run(native: bool) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if Command::new("python3").arg("--version").output().is_err() {
        println!("SKIPPED: attribution tests: no python3");
        return None;
    }
    let path = std::env::join_paths([
        root.join("tests/agent_attrib/fake_torch"),
        root.join("assets/agent"),
    ])
    .unwrap();
    // The native path is built into a cache of this test's own.
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg("-B")
        .arg(root.join("tests/agent_attrib/test_attrib.py"))
        .env("PYTHONPATH", path)
        .env("XDG_CACHE_HOME", cache.path());
    if native {
        cmd.arg("--native");
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Some(line) = text.lines().find(|l| l.starts_with("SKIPPED")) {
        println!("{line}");
        return None;
    }
    Some(text)
}

#[test]
fn attribution_logic_without_torch() {
    let Some(text) = run(false) else { return };
    assert!(
        text.contains("test_attrib.py: all passed (python)"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        24,
        "{text}"
    );
}

/// The same checks with module calls through the native path
/// (`assets/agent/fastcall.cpp`, built for this Python), and its own: what
/// Dynamo reads, the fast path taken, a patcher undone, capture.
#[test]
fn attribution_native_call_path() {
    let Some(text) = run(true) else { return };
    assert!(
        text.contains("test_attrib.py: all passed (native)"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        31,
        "{text}"
    );
}
