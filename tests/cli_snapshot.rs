//! End to end without a GPU: a Rust writer stands in for an instrumented
//! process; `vramscope snapshot --json` reports its figures exactly.

use std::process::Command as Proc;

use serde_json::Value;
use vramscope_wire::event::{BlockState, EventKind, Place, Stats};
use vramscope_wire::ring::{Command, Producer, SegmentConfig, SegmentWriter, Status};

mod common;
use common::{answering, succeeded, vramscope, write_at as write, write_snapshot};

#[test]
fn snapshot_json_reports_a_writers_figures_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 1024);
    cfg.label = "train.py".into();
    cfg.framework = "torch 2.11.0+cu130".into();
    let seg = SegmentWriter::create(&cfg).unwrap();
    let place = Place::default();
    let seg_addr = 0x7f00_0000_0000u64;
    let t0 = vramscope_wire::ring::monotonic_ns();
    // State before attach, as a snapshot: one 20 MiB segment, 4 MiB allocated.
    let blocks = [
        (4 << 20, BlockState::Allocated),
        (16 << 20, BlockState::Inactive),
    ];
    write_snapshot(&seg, 1, t0, seg_addr, &blocks);
    // Then events: a 2 MiB tensor is carved from the free block.
    write(
        &seg,
        1,
        EventKind::Alloc {
            place,
            addr: seg_addr + (4 << 20),
            size: 2 << 20,
        },
        t0 + 1,
    );
    let (six, twenty) = (6 << 20, 20 << 20);
    let stats = Stats {
        allocated: six,
        reserved: twenty,
        active: six,
        inactive_split: 14 << 20,
        requested: six,
        allocated_peak: six,
        reserved_peak: twenty,
        active_peak: six,
        segments: 1,
        ..Stats::default()
    };
    write(&seg, 0, EventKind::Stats { device: 0, stats }, t0 + 2);

    // The "process" answers the snapshot command the collector sends.
    let answer = |req: &vramscope_wire::ring::control::Request| {
        assert_eq!(req.command, Command::Snapshot { device: None });
        (Status::Ok, 2, 0)
    };
    let out = answering(&seg, answer, || {
        vramscope()
            .args(["snapshot", "--json", "--blocks", "--no-nvml", "--shm-dir"])
            .arg(dir.path())
            .output()
            .unwrap()
    });
    let out = succeeded(out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], 1);
    assert!(v["machine"]["nvml_error"]
        .as_str()
        .unwrap()
        .contains("NVML"));
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{v}");
    let p = &procs[0];
    assert_eq!(p["identity"]["host_pid"], std::process::id());
    assert_eq!(p["identity"]["label"], "train.py");
    assert_eq!(p["source"]["framework"], "torch 2.11.0+cu130");
    assert_eq!(p["source"]["mode"], "exact");
    assert_eq!(p["source"]["lost"], 0);
    let f = &p["view"]["figures"];
    assert_eq!(f["allocated"], 6u64 << 20);
    assert_eq!(f["reserved"], 20u64 << 20);
    assert!(f["nvml_used"].is_null(), "absent without NVML, never 0");
    let dev = &p["view"]["devices"][0];
    assert_eq!(
        dev["figures"]["fragmentation"]["inactive_split"],
        14u64 << 20
    );
    let blocks = dev["segments"][0]["blocks"].as_array().unwrap();
    let states: Vec<(u64, &str)> = blocks
        .iter()
        .map(|b| (b["size"].as_u64().unwrap(), b["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![
            (4 << 20, "Allocated"),
            (2 << 20, "Allocated"),
            (14 << 20, "Inactive")
        ]
    );
}

#[test]
fn snapshot_reports_a_refused_segment_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let name = vramscope_wire::ring::discover::segment_name(
        vramscope_wire::ring::discover::current_uid(),
        std::process::id(),
        Some("junk"),
    )
    .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, vec![0xAB; 8192]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Proc::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["snapshot", "--json", "--no-nvml", "--shm-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let problems = v["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0]["message"]
            .as_str()
            .unwrap()
            .contains("bad magic"),
        "{v}"
    );
    assert!(path.exists(), "a refused file is reported, never deleted");
}

/// A writer with one 20 MiB segment (4 MiB allocated, 16 MiB cached) and
/// its statistics, in `dir`.
fn small_writer(dir: &std::path::Path) -> SegmentWriter {
    let mut cfg = SegmentConfig::new(dir, Producer::TorchExact, 1, 1024);
    cfg.label = "train.py".into();
    let seg = SegmentWriter::create(&cfg).unwrap();
    let t0 = vramscope_wire::ring::monotonic_ns();
    let blocks = [
        (4 << 20, BlockState::Allocated),
        (16 << 20, BlockState::Inactive),
    ];
    write_snapshot(&seg, 1, t0, 0x7f00_0000_0000, &blocks);
    let stats = Stats {
        allocated: 4 << 20,
        reserved: 20 << 20,
        active: 4 << 20,
        inactive_split: 16 << 20,
        allocated_peak: 4 << 20,
        reserved_peak: 20 << 20,
        segments: 1,
        ..Stats::default()
    };
    write(&seg, 0, EventKind::Stats { device: 0, stats }, t0 + 2);
    seg
}

#[test]
fn the_plain_table_has_the_dashboards_figures_and_blocks_without_json() {
    let dir = tempfile::tempdir().unwrap();
    let seg = small_writer(dir.path());
    let out = answering(
        &seg,
        |_| (Status::Ok, 2, 0),
        || {
            vramscope()
                .args(["snapshot", "--blocks", "--no-nvml", "--shm-dir"])
                .arg(dir.path())
                .output()
                .unwrap()
        },
    );
    let text = String::from_utf8(succeeded(out).stdout).unwrap();
    let header = text.lines().find(|l| l.contains("PID")).unwrap();
    for col in ["FRAG", "OOMS", "FLAGS", "PEAK"] {
        assert!(header.contains(col), "{header}");
    }
    let row = text.lines().find(|l| l.contains("train.py")).unwrap();
    // FRAG as the dashboard gives it: 16 of 20 MiB.
    assert!(row.contains("80%"), "{row}");
    assert!(
        row.contains("20.0 MiB") && row.contains("4.00 MiB"),
        "{row}"
    );
    // --blocks without --json: the segment and its blocks by state.
    assert!(
        text.contains("allocated 1 (4.00 MiB), pending-free 0 (0 B), inactive 1 (16.0 MiB)"),
        "{text}"
    );
}

#[test]
fn an_unreadable_segment_directory_is_an_error() {
    let out = vramscope()
        .args([
            "snapshot",
            "--no-nvml",
            "--shm-dir",
            "/nonexistent/vramscope",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(err.matches("/nonexistent/vramscope").count(), 1, "{err}");
}

#[test]
fn watch_looks_again_until_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = vramscope()
        .args([
            "snapshot",
            "--watch",
            "0.1",
            "--json",
            "--no-nvml",
            "--shm-dir",
        ])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    // Each look is one JSON document on one line.
    for _ in 0..3 {
        let l = lines.next().unwrap().unwrap();
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["version"], 1);
    }
    // A closed pipe ends it quietly.
    drop(lines);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Issue 46, item 20: `--watch` says why NVML is unavailable once, not at
/// every look.
#[test]
fn watch_says_why_nvml_is_unavailable_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = vramscope()
        .args(["snapshot", "--watch", "0.1", "--no-nvml", "--shm-dir"])
        .arg(dir.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let (mut looks, mut said) = (0, 0);
    while looks < 3 {
        let l = lines.next().unwrap().unwrap();
        looks += usize::from(l.trim_start().starts_with("PID NAME"));
        said += usize::from(l.contains("NVML disabled"));
    }
    drop(lines);
    let _ = child.wait();
    assert_eq!((looks, said), (3, 1));
}
