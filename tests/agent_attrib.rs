//! The agent's module attribution (`assets/agent/vramscope/_attrib.py`) with
//! no torch and no GPU: the real module against the stand-in torch in
//! `tests/agent_attrib/fake_torch` and a stand-in tracker library
//! (`tests/agent_attrib/test_attrib.py`): module paths, the forward,
//! backward, optimizer and other phases per thread, leaves without
//! parameters, exceptions, compiled regions, stack capture (command 5),
//! wrappers and the id bound; then the same with module calls through the
//! native path (`assets/agent/fastcall.cpp`, built here), and built with
//! `-DVS_TORCH` against stand-in torch headers (its C++ backward
//! pre-hooks). Needs python3 and, for the native runs, a C++ compiler and
//! Python.h; without them a test says SKIPPED.

use std::path::Path;
use std::process::Command;

/// Runs test_attrib.py in `mode` and checks it passed all `oks` checks as
/// `label`; SKIPPED (printed) when the mode cannot be built here.
fn passes(mode: Option<&str>, label: &str, oks: usize) {
    let Some(text) = run(mode) else { return };
    assert!(
        text.contains(&format!("test_attrib.py: all passed ({label})")),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        oks,
        "{text}"
    );
}

fn run(mode: Option<&str>) -> Option<String> {
    run_script("test_attrib.py", mode)
}

fn run_script(script: &str, mode: Option<&str>) -> Option<String> {
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
        .arg(root.join("tests/agent_attrib").join(script))
        .env("PYTHONPATH", path)
        .env("XDG_CACHE_HOME", cache.path());
    if let Some(m) = mode {
        cmd.arg(m);
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

/// Role lists (`assets/agent/vramscope/_roles.py`): what the walk finds
/// (parameters, buffers, gradients, optimizer state by module; tied
/// weights once; CPU tensors left out), when it writes a list, its bound,
/// the background thread for loops without steps (and never while steps
/// come: a snapshot then waits for the next boundary), a failure, and
/// attribution installed while a forward runs (a late start, an attach).
#[test]
fn role_lists_without_torch() {
    let Some(text) = run_script("test_roles.py", None) else {
        return;
    };
    assert!(text.contains("test_roles.py: all passed"), "{text}");
    assert_eq!(text.lines().filter(|l| l.starts_with("ok ")).count(), 26);
}

#[test]
fn attribution_logic_without_torch() {
    passes(None, "python", 31);
}

/// The same checks with module calls through the native path
/// (`assets/agent/fastcall.cpp`, built for this Python), and its own: what
/// Dynamo reads, the fast path taken, a patcher undone, capture.
#[test]
fn attribution_native_call_path() {
    passes(Some("--native"), "native", 39);
}

/// The native path built with `-DVS_TORCH` against the stand-in torch
/// headers (`tests/agent_attrib/fake_torch_include`): the C++ backward
/// pre-hooks, registered by the fast path and by the Python wrapper (roots,
/// first calls), run by the test's "backward" on another thread into a real
/// thread-local word, and a recompute returning to them.
#[test]
fn attribution_native_backward_hooks() {
    passes(Some("--native-torch"), "native with torch", 44);
}
