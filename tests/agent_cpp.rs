//! The agent's C++ without a GPU, each part compiled against stand-ins and
//! run:
//! - the PyTorch tracker (`assets/agent/tracker.cpp`) against stand-in
//!   torch headers (`tests/agent_cpp/fake_torch`) with a fake allocator
//!   (`tests/agent_cpp/tracker_test.cpp`). It checks the block tag table
//!   against a map, the context and step tags the callback writes, a
//!   snapshot's definitions and block tags, a statistics sample's place in
//!   the ring (STATS_C) and command 5;
//! - the accounting outside the caching allocator (`assets/agent/outside.cpp`)
//!   against a stand-in CUPTI (`tests/agent_cpp/fake_cupti`).
//!
//! Needs a C++ compiler (`c++`, or `$CXX`); without one each test says
//! SKIPPED.

use std::path::Path;
use std::process::Command;

/// Compiles `tests/agent_cpp/TEST.cpp` (with `assets/agent` and the
/// stand-in directory `fake` on the include path), runs it with `args`
/// and returns what it printed, after checking that it succeeded and said
/// "ok ..." `oks` times. None (SKIPPED said) without a compiler.
fn build_and_run(
    test: &str,
    fake: &str,
    link: &[&str],
    args: &[&Path],
    oks: usize,
) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_err() {
        println!("SKIPPED: {test}: no C++ compiler ({cxx})");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join(test);
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
        .arg(root.join("tests/agent_cpp").join(fake))
        .arg(root.join("tests/agent_cpp").join(format!("{test}.cpp")))
        .arg("-o")
        .arg(&exe)
        .args(link)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "compiling {test}.cpp failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        oks,
        "{text}"
    );
    Some(text)
}

#[test]
fn tracker_logic_without_a_gpu() {
    let shm = tempfile::tempdir().unwrap();
    if build_and_run("tracker_test", "fake_torch", &[], &[shm.path()], 6).is_none() {
        return;
    }
    // The tracker closed and removed its segment.
    assert_eq!(std::fs::read_dir(shm.path()).unwrap().count(), 0);
}

/// The accounting outside the caching allocator (`assets/agent/outside.cpp`,
/// issue 47) without a GPU: `tests/agent_cpp/outside_test.cpp` calls its
/// CUPTI callback as CUPTI would and checks each record it writes (NCCL's
/// VMM handle and its release, the caching allocator's own memory left to
/// the tracker, a failed call, pinned host memory, a stream's and a
/// module's measured drops, a drop no module makes, the context, a flood
/// of allocations, stepping aside for another client, and what a late
/// start found sent as its own kind).
#[test]
fn outside_accounting_without_a_gpu() {
    build_and_run("outside_test", "fake_cupti", &["-ldl"], &[], 37);
}

/// Built against CUPTI 13.2's callback API (the stand-in's
/// `FAKE_CUPTI_13_2`), the accounting subscribes with multiple subscribers
/// allowed: a profiler that allows them too runs beside it and it comes
/// back after stepping aside (before 13.2 it cannot: see above).
#[test]
fn outside_accounting_shares_cupti_where_it_is_13_2() {
    build_and_run("outside_multi_test", "fake_cupti", &["-ldl"], &[], 7);
}
