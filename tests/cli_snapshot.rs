//! End to end without a GPU: a Rust writer stands in for an instrumented
//! process; `vramscope snapshot --json` reports its figures exactly.

use std::process::Command as Proc;
use std::time::Duration;

use serde_json::Value;
use vramscope::event::{BlockState, Event, EventKind, Place, PoolId, SegmentPool, Stats};
use vramscope::ring::codec::encode;
use vramscope::ring::{Command, Producer, SegmentConfig, SegmentWriter, Status};

fn write(seg: &SegmentWriter, ring: usize, e: EventKind, t: u64) {
    let mut words = Vec::new();
    encode(
        &Event {
            time_ns: t,
            kind: e,
        },
        1,
        &mut words,
    );
    for w in &words {
        assert!(seg.ring(ring).write(w));
    }
}

#[test]
fn snapshot_json_reports_a_writers_figures_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 1024);
    cfg.label = "train.py".into();
    cfg.framework = "torch 2.11.0+cu130".into();
    let seg = SegmentWriter::create(&cfg).unwrap();
    let place = Place {
        device: 0,
        stream: 0,
        pool: PoolId(0, 0),
        ctx: Default::default(),
    };
    let seg_addr = 0x7f00_0000_0000u64;
    let t0 = vramscope::ring::monotonic_ns();
    // State before attach, as a snapshot: one 20 MiB segment, 4 MiB allocated.
    write(
        &seg,
        0,
        EventKind::SnapshotBegin {
            device: 0,
            id: 1,
            segments: 1,
            blocks: 2,
            at: None,
        },
        t0,
    );
    write(
        &seg,
        0,
        EventKind::SnapshotSegment {
            id: 1,
            place,
            addr: seg_addr,
            size: 20 << 20,
            pool_kind: SegmentPool::Large,
            expandable: false,
        },
        t0,
    );
    for (addr, size, state) in [
        (seg_addr, 4u64 << 20, BlockState::Allocated),
        (seg_addr + (4 << 20), 16 << 20, BlockState::Inactive),
    ] {
        write(
            &seg,
            0,
            EventKind::SnapshotBlock {
                id: 1,
                device: 0,
                addr,
                size,
                requested: size,
                state,
                ctx: Default::default(),
            },
            t0,
        );
    }
    write(&seg, 0, EventKind::SnapshotEnd { device: 0, id: 1 }, t0);
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
    let stats = Stats {
        allocated: 6 << 20,
        reserved: 20 << 20,
        active: 6 << 20,
        inactive_split: 14 << 20,
        requested: 6 << 20,
        allocated_peak: 6 << 20,
        reserved_peak: 20 << 20,
        active_peak: 6 << 20,
        alloc_retries: 0,
        ooms: 0,
        segments: 1,
    };
    write(&seg, 0, EventKind::Stats { device: 0, stats }, t0 + 2);

    // The "process" answers the snapshot command the collector sends.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            let server = seg.command_server();
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                if let Some(req) = server.poll() {
                    assert_eq!(req.command, Command::Snapshot { device: None });
                    server.answer(req, Status::Ok, 2, 0);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let out = Proc::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(["snapshot", "--json", "--blocks", "--no-nvml", "--shm-dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::Release);
        out
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let name = vramscope::ring::discover::segment_name(
        vramscope::ring::discover::current_uid(),
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
