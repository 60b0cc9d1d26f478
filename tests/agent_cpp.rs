//! The PyTorch tracker's C++ (`assets/agent/tracker.cpp`) without a GPU:
//! compiled against stand-in torch headers (`tests/agent_cpp/fake_torch`)
//! with a fake allocator (`tests/agent_cpp/tracker_test.cpp`), then run.
//! It checks the block tag table against a map, the context and step tags
//! the callback writes, a snapshot's definitions and block tags, a
//! statistics sample's place in the ring (STATS_C) and command 5. Needs a
//! C++ compiler (`c++`, or `$CXX`); without one the test says SKIPPED.

use std::path::Path;
use std::process::Command;

#[test]
fn tracker_logic_without_a_gpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: tracker_logic_without_a_gpu: no C++ compiler ({cxx})");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("tracker_test");
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg("-I")
        .arg(root.join("assets/agent"))
        .arg("-isystem")
        .arg(root.join("tests/agent_cpp/fake_torch"))
        .arg(root.join("tests/agent_cpp/tracker_test.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling tracker.cpp failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shm = tempfile::tempdir().unwrap();
    let run = Command::new(&exe).arg(shm.path()).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        6,
        "{text}"
    );
    // The tracker closed and removed its segment.
    assert_eq!(std::fs::read_dir(shm.path()).unwrap().count(), 0);
}

/// The accounting outside the caching allocator (`assets/agent/outside.cpp`,
/// issue 47) without a GPU: built against the stand-in CUPTI
/// (`tests/agent_cpp/fake_cupti`) with `tests/agent_cpp/outside_test.cpp`,
/// which calls its CUPTI callback as CUPTI would and checks each record it
/// writes (NCCL's VMM handle and its release, the caching allocator's own
/// memory left to the tracker, a failed call, pinned host memory, a
/// stream's and a module's measured drops, a drop no module makes, the
/// context, a flood of allocations, stepping aside for another client).
#[test]
fn outside_accounting_without_a_gpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: outside_accounting_without_a_gpu: no C++ compiler ({cxx})");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("outside_test");
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pthread",
        ])
        .arg("-I")
        .arg(root.join("assets/agent"))
        .arg("-isystem")
        .arg(root.join("tests/agent_cpp/fake_cupti"))
        .arg(root.join("tests/agent_cpp/outside_test.cpp"))
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling outside.cpp failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        18,
        "{text}"
    );
}
