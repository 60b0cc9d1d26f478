//! A producer in a container of its own: its own pid namespace (it is pid
//! 1 there) and its own mount namespace with a private segment directory
//! (a tmpfs mounted over it, as a container's own `/dev/shm`). From the
//! host, the collector finds its segment through `/proc/<pid>/root`, shows
//! it under its host pid and its name, and never takes it for stale (its
//! header's pid, 1, is the host's init). Needs `unshare` with the rights to
//! make namespaces and mount (root); skipped visibly otherwise.

mod common;
mod stand_in;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stand_in::Shape;
use vramscope_collect::{Collector, Config};
use vramscope_wire::ring::discover;

#[test]
#[ignore = "a stand-in producer, run by the other tests as a process of its own"]
fn stand_in_producer() {
    stand_in::main();
}

const SHAPE: Shape = Shape {
    base: 256 << 20,
    leak: 0,
    steps: 2,
    reserved: 512 << 20,
    inactive_split: 0,
    alloc_retries: 0,
    period_ms: 100,
};

/// `unshare` making a pid and a mount namespace, with a tmpfs mounted.
fn unshare_can_mount(dir: &Path) -> bool {
    Command::new("unshare")
        .args(["--pid", "--fork", "--mount", "--mount-proc", "sh", "-c"])
        .arg("mount -t tmpfs tmpfs \"$0\"")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_producer_in_its_own_pid_and_mount_namespace_is_found_named_and_never_cleaned() {
    if !discover::in_root_pid_namespace() {
        eprintln!("SKIPPED: fleet_containers: the tests do not run in the root pid namespace");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    if !unshare_can_mount(dir) {
        eprintln!("SKIPPED: fleet_containers: `unshare --pid --mount` with a tmpfs mount is refused here (needs root)");
        return;
    }
    // The stand-in runs as pid 1 of a new pid namespace, in a mount
    // namespace where `dir` is a private tmpfs: its segment is invisible
    // in the host's `dir`.
    let dir_s = dir.to_str().unwrap();
    let wrapper = [
        "unshare",
        "--pid",
        "--fork",
        "--mount",
        "--mount-proc",
        "sh",
        "-c",
        "mount -t tmpfs -o mode=1777 tmpfs \"$0\" && exec \"$@\"",
        dir_s,
    ];
    let contained = stand_in::spawn_through(&wrapper, dir, "contained", SHAPE);
    let host = common::namespace_init(contained.pid(), Duration::from_secs(5))
        .expect("the namespace's pid 1");
    assert_eq!(
        std::fs::read_dir(dir).unwrap().count(),
        0,
        "the segment is in the container's own directory, not the host's"
    );

    let mut cfg = Config::new(dir.to_path_buf());
    cfg.nvml = false;
    cfg.discover_interval = Duration::from_millis(20);
    cfg.ring_interval = Duration::from_millis(20);
    let mut c = Collector::new(cfg);
    let start = Instant::now();
    let snap = loop {
        c.step();
        let s = c.hub().snapshot(&Default::default());
        if !s.processes.is_empty() || start.elapsed() > Duration::from_secs(5) {
            break s;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(snap.processes.len(), 1, "problems: {:?}", snap.problems);
    let p = &snap.processes[0];
    assert_eq!(p.identity.host_pid, host);
    assert_eq!(p.identity.ns_pid, 1);
    assert_eq!(p.identity.label, "contained");
    assert!(
        !p.identity.name.is_empty() && p.identity.alive,
        "{:?}",
        p.identity
    );
    let seg = p.source.segment.clone().unwrap();
    assert!(
        seg.starts_with("/proc/") && seg.contains("/root/"),
        "found through the container's root: {seg}"
    );
    assert_eq!(p.view.figures.allocated, SHAPE.allocated());
    assert!(snap.problems.is_empty(), "{:?}", snap.problems);

    // Steps later, with stale cleaning on, the segment is still there and
    // still read: its pid (1 in its namespace) was never taken for the
    // host's init.
    for _ in 0..20 {
        c.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    let inside = std::fs::read_dir(format!("/proc/{host}/root{dir_s}"))
        .unwrap()
        .count();
    assert_eq!(inside, 1, "the live producer's segment was removed");
    let s = c.hub().snapshot(&Default::default());
    assert_eq!(s.processes.len(), 1);
    assert!(s.processes[0].identity.alive);
    assert!(s.problems.is_empty(), "{:?}", s.problems);
}
