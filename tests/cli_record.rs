//! `record` / `replay` round trip, replay's errors, and `empty-cache PID`.

use std::time::Duration;

use serde_json::Value;
use vramscope_wire::event::{EventKind, Place, Stats};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::{Command, Producer, SegmentConfig, SegmentWriter, Status};

mod common;
use common::{answering, succeeded, vramscope as bin, write};

/// `vramscope record` of the segments in `shm` into `rec`, for 3 seconds.
fn record_for_3s(rec: &std::path::Path, shm: &std::path::Path) -> std::process::Child {
    bin()
        .args(["record", "--no-nvml", "--duration", "3", "-o"])
        .arg(rec)
        .arg("--shm-dir")
        .arg(shm)
        .spawn()
        .unwrap()
}

/// A 20 MiB segment, a 3 MiB and a 5 MiB tensor, the first freed, and the
/// statistics that say so: 5 events and one sample (two records).
fn write_small_job(seg: &SegmentWriter) {
    let place = Place::default();
    let base = 0x7f00_0000_0000u64;
    write(
        seg,
        1,
        EventKind::SegmentAlloc {
            place,
            addr: base,
            size: 20 << 20,
        },
    );
    write(
        seg,
        1,
        EventKind::Alloc {
            place,
            addr: base,
            size: 3 << 20,
        },
    );
    write(
        seg,
        1,
        EventKind::Alloc {
            place,
            addr: base + (3 << 20),
            size: 5 << 20,
        },
    );
    write(
        seg,
        1,
        EventKind::FreeRequested {
            place,
            addr: base,
            size: 3 << 20,
        },
    );
    write(
        seg,
        1,
        EventKind::FreeCompleted {
            place,
            addr: base,
            size: 3 << 20,
        },
    );
    let stats = Stats {
        allocated: 5 << 20,
        reserved: 20 << 20,
        segments: 1,
        ..Stats::default()
    };
    write(seg, 0, EventKind::Stats { device: 0, stats });
}

#[test]
fn record_then_replay_gives_the_same_figures() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.vsrec");
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let mut cfg = SegmentConfig::new(&shm, Producer::Test, 1, 4096);
    cfg.label = "recorded.py".into();
    let seg = SegmentWriter::create(&cfg).unwrap();
    let mut child = record_for_3s(&rec, &shm);
    std::thread::sleep(Duration::from_millis(600));
    // Events arrive while recording: a segment and two tensors, one freed.
    write_small_job(&seg);
    assert!(child.wait().unwrap().success());

    let out = bin().args(["replay", "--json"]).arg(&rec).output().unwrap();
    let out = succeeded(out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["processes"][0];
    assert_eq!(p["identity"]["label"], "recorded.py");
    assert_eq!(p["view"]["figures"]["allocated"], 5u64 << 20);
    assert_eq!(p["view"]["figures"]["reserved"], 20u64 << 20);
    assert_eq!(p["source"]["delivered"], 6u64 + 1); // 5 events + 2 stats records
                                                    // Paced replay at 100x still ends in the same state.
    let paced = bin()
        .args(["replay", "--json", "--speed", "100"])
        .arg(&rec)
        .output()
        .unwrap();
    let w: Value = serde_json::from_slice(&paced.stdout).unwrap();
    assert_eq!(w["processes"][0]["view"]["figures"], p["view"]["figures"]);

    // A truncated file is read up to its last complete frame; one line
    // names the file and where it stopped (tests/runfiles.rs, item 9).
    let bytes = std::fs::read(&rec).unwrap();
    let cut = dir.path().join("cut.vsrec");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let out = bin().args(["replay"]).arg(&cut).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cut.vsrec") && err.contains("cut short at byte"),
        "{err}"
    );
    // A newer major version is refused, naming the version.
    let mut newer = bytes.clone();
    newer[8] = 2;
    newer[10] = 0; // minor 0: "version 2.0"
    let nv = dir.path().join("newer.vsrec");
    std::fs::write(&nv, &newer).unwrap();
    let out = bin().args(["replay"]).arg(&nv).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("newer.vsrec") && err.contains("version 2.0"),
        "{err}"
    );
}

#[test]
fn empty_cache_pid_prints_what_was_released() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 64);
    let seg = SegmentWriter::create(&cfg).unwrap();
    let answer = |req: &vramscope_wire::ring::control::Request| {
        assert_eq!(req.command, Command::EmptyCache { device: None });
        (Status::Ok, 3 << 30, 1 << 30)
    };
    let out = answering(&seg, answer, || {
        bin()
            .args(["empty-cache", &std::process::id().to_string(), "--shm-dir"])
            .arg(dir.path())
            .output()
            .unwrap()
    });
    let out = succeeded(out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("released 2.00 GiB (reserved 3.00 GiB -> 1.00 GiB)"),
        "{text}"
    );
    // A pid with no agent: a clear error.
    let out = bin()
        .args(["empty-cache", "1", "--shm-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no vramscope agent segment"));
}

/// A copy of `seg` at `name` in `dir` whose header names `pid` and
/// `start_time`: the segment of a producer that is gone.
fn left_behind(seg: &SegmentWriter, dir: &std::path::Path, name: &str, pid: u32, start_time: u64) {
    use std::os::unix::fs::PermissionsExt;
    use vramscope_wire::ring::layout::{OFF_PID, OFF_START_TIME};
    let mut bytes = std::fs::read(seg.path()).unwrap();
    bytes[OFF_PID..OFF_PID + 4].copy_from_slice(&pid.to_le_bytes());
    bytes[OFF_START_TIME..OFF_START_TIME + 8].copy_from_slice(&start_time.to_le_bytes());
    let path = dir.join(name);
    std::fs::write(&path, &bytes).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `empty-cache PID` in a directory of 50 other segments (49 left by
/// processes that are gone, and one of an earlier process with this pid,
/// listed first): the segment whose producer runs as PID gets the command,
/// once, and its answer is printed; nothing else is read or changed.
#[test]
fn empty_cache_pid_finds_its_segment_among_many() {
    use vramscope_wire::ring::discover::{current_uid, segment_name};
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id();
    let mut cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 64);
    cfg.tag = Some("z".into());
    let seg = SegmentWriter::create(&cfg).unwrap();
    for i in 0..49 {
        let pid = 999_999_000 + i;
        let name = segment_name(current_uid(), pid, None).unwrap();
        left_behind(&seg, dir.path(), &name, pid, seg.header().start_time);
    }
    let earlier = segment_name(current_uid(), me, Some("a")).unwrap();
    left_behind(&seg, dir.path(), &earlier, me, 1);
    let files = || {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = files();
    assert_eq!(before.len(), 51);
    let asked = std::sync::atomic::AtomicU32::new(0);
    let started = std::time::Instant::now();
    let out = answering(
        &seg,
        |_| {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (Status::Ok, 3 << 30, 1 << 30)
        },
        || {
            bin()
                .args(["empty-cache", &me.to_string(), "--shm-dir"])
                .arg(dir.path())
                .output()
                .unwrap()
        },
    );
    let out = succeeded(out);
    eprintln!("empty-cache among 51 segments: {:?}", started.elapsed());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("released 2.00 GiB"), "{text}");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(files(), before, "no segment was removed or added");
}

#[test]
fn sim_replays_a_recorded_process_and_matches_its_figures() {
    use vramscope_core::sim::{SimAllocator, SimConfig};
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("job.vsrec");
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let seg =
        SegmentWriter::create(&SegmentConfig::new(&shm, Producer::TorchExact, 1, 1 << 16)).unwrap();
    let mut child = record_for_3s(&rec, &shm);
    std::thread::sleep(Duration::from_millis(700));
    // A "process" whose allocator is the simulator, on an 80 GiB device.
    let mut a = SimAllocator::new(SimConfig {
        capacity: 80 << 30,
        ..SimConfig::default()
    });
    let mut ev = Vec::new();
    let mut held = Vec::new();
    for i in 0..400u64 {
        a.set_time(vramscope_wire::ring::monotonic_ns());
        if i % 4 == 3 {
            let p = held.remove((i as usize * 7) % held.len());
            a.free(p, &mut ev).unwrap();
        } else {
            held.push(
                a.malloc((i * 104_729 % (30 << 20)) + 1, i % 2, &mut ev)
                    .unwrap(),
            );
        }
        if i % 100 == 99 {
            a.empty_cache(&mut ev);
        }
        a.emit_stats(&mut ev);
    }
    let mut words = Vec::new();
    for (n, e) in ev.iter().enumerate() {
        words.clear();
        encode(e, n as u32, &mut words);
        let ring = if matches!(e.kind, EventKind::Stats { .. }) {
            0
        } else {
            1
        };
        for w in &words {
            assert!(seg.ring(ring).write(w));
        }
    }
    assert!(child.wait().unwrap().success());
    let out = bin()
        .args(["sim", "--json", "--trace"])
        .arg(&rec)
        .output()
        .unwrap();
    let out = succeeded(out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("400 of 400 recorded statistics samples match"),
        "{err}"
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.iter().filter(|l| l.get("recorded").is_some()).count() == 400);
    // Another configuration: a different answer, still a clean run.
    let out = bin()
        .args(["sim", "--conf", "expandable_segments:True", "--trace"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("400 of 400"));
}

/// The demo's `leak` scenario as a recording (its events in batches of 64,
/// as a collector delivers them).
fn leak_recording(path: &std::path::Path) {
    leak_recording_of(path, |_| true);
}

/// [`leak_recording`] of the events `keep` keeps.
fn leak_recording_of(path: &std::path::Path, keep: impl Fn(&vramscope_wire::event::Event) -> bool) {
    use vramscope_core::input::{EventBatch, Input};
    use vramscope_core::model::ProcessKey;
    use vramscope_core::sim::{Scenario, ScenarioRunner};
    let mut events = Vec::new();
    ScenarioRunner::new(Scenario::by_name("leak").unwrap()).run_to_end(&mut events);
    events.retain(|e| keep(e));
    let key = ProcessKey {
        pid: 4242,
        start_time: 1,
    };
    let mut rec = vramscope_core::recording::Recorder::create(path).unwrap();
    for (i, batch) in events.chunks(64).enumerate() {
        let input = Input::Events(EventBatch {
            key,
            events: batch.to_vec(),
            delivered: (i * 64 + batch.len()) as u64,
            lost: 0,
            lost_now: 0,
            at: Vec::new(),
        });
        rec.write(batch[0].time_ns, &input).unwrap();
    }
    rec.finish().unwrap();
}

/// Issue 47: `diff` puts what each run held outside the caching
/// allocator side by side (the demo's job names its CUDA context and
/// cuBLAS's workspace; the same job whose producer names nothing, none),
/// and says nothing of it where neither run names any.
#[test]
fn diff_shows_memory_outside_the_allocator_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("named.vsrec"),
        dir.path().join("unnamed.vsrec"),
        dir.path().join("unnamed2.vsrec"),
    );
    let unnamed = |e: &vramscope_wire::event::Event| !matches!(e.kind, EventKind::Outside(_));
    leak_recording(&a);
    leak_recording_of(&b, unnamed);
    leak_recording_of(&c, unnamed);
    let diff = |x: &std::path::Path, y: &std::path::Path, json: bool| {
        let mut cmd = bin();
        cmd.arg("diff").arg(x).arg(y);
        if json {
            cmd.arg("--json");
        }
        String::from_utf8(succeeded(cmd.output().unwrap()).stdout).unwrap()
    };
    let text = diff(&a, &b, false);
    let at = text
        .find("outside PyTorch's allocator, at each run's end:")
        .unwrap_or_else(|| panic!("{text}"));
    let table: Vec<String> = text[at..]
        .lines()
        .skip(2)
        .take(2)
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        table,
        [
            "context 500 MiB 0 B -500 MiB (-100%)",
            "cuBLAS 32.0 MiB 0 B -32.0 MiB (-100%)"
        ],
        "{text}"
    );
    let v: Value = serde_json::from_str(&diff(&a, &b, true)).unwrap();
    assert_eq!(v["outside"][0]["name"], "context", "{v}");
    assert_eq!(v["outside"][0]["a"], 524_288_000u64, "{v}");
    assert_eq!(v["outside"][1]["b"], 0, "{v}");
    // Neither run names any: no table, no rows.
    assert!(!diff(&b, &c, false).contains("outside PyTorch"));
    let v: Value = serde_json::from_str(&diff(&b, &c, true)).unwrap();
    assert_eq!(v["outside"], Value::Array(vec![]), "{v}");
}

#[test]
fn replay_diff_names_what_a_step_left_alive() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("leak.vsrec");
    leak_recording(&rec);
    const MIB: u64 = 1 << 20;
    let out = bin()
        .args(["replay", "--json", "--diff", "3..10"])
        .arg(&rec)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&succeeded(out).stdout).unwrap();
    let p = &v[0];
    assert_eq!(p["reached"], true, "{p}");
    assert_eq!((p["born"].as_u64(), p["at"].as_u64()), (Some(3), Some(10)));
    // Step 3's validation graph stays alive: one 16 MiB activation per
    // layer, its 4 MiB input and the 4-byte loss; nothing else of step 3
    // (its gradients died at step 4's zero_grad).
    let rows = p["rows"].as_array().unwrap();
    let layers: Vec<&Value> = (rows.iter())
        .filter(|r| {
            r["module"]
                .as_str()
                .is_some_and(|m| m.starts_with("model.layers."))
        })
        .collect();
    assert_eq!(layers.len(), 12, "{rows:?}");
    for r in &layers {
        assert_eq!(r["phase"], "forward");
        // Alive steps after its own: not an activation any more (roles).
        assert_eq!(r["role"], "other");
        assert_eq!(
            (r["size"].as_u64(), r["blocks"].as_u64()),
            (Some(16 * MIB), Some(1))
        );
    }
    let rest: Vec<(String, String, u64)> = (rows.iter())
        .filter(|r| {
            !r["module"]
                .as_str()
                .is_some_and(|m| m.starts_with("model.layers."))
        })
        .map(|r| {
            // Outside every module: null (issue 26, item 4).
            let module = r["module"].as_str().unwrap_or("(null)").to_string();
            let phase = r["phase"].as_str().unwrap().to_string();
            (module, phase, r["size"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        rest,
        vec![
            ("(null)".into(), "unknown".into(), 4 * MIB),
            ("model.head".into(), "forward".into(), 4),
        ]
    );
    // The table; a step the recording never reached.
    let out = bin()
        .args(["replay", "--diff", "3..10"])
        .arg(&rec)
        .output()
        .unwrap();
    let text = String::from_utf8(succeeded(out).stdout).unwrap();
    assert!(
        text.contains("born in step 3 and alive at the end of step 10"),
        "{text}"
    );
    assert!(text.contains("model.layers.11"), "{text}");
    // Issue 46, item 18: a step no process reached is not found: one line
    // on stderr naming where the recording ends, exit 1, nothing on stdout.
    let out = bin()
        .args(["replay", "--diff", "3..99"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(out.stdout.is_empty());
    let err = common::exited_with(1, out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--diff 3..99: step 99 not reached (pid ") && err.contains("last step 16)"),
        "{err}"
    );
    let out = bin()
        .args(["replay", "--diff", "9..3"])
        .arg(&rec)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn stacks_pid_posts_command_5_and_says_what_came_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SegmentConfig::new(dir.path(), Producer::TorchExact, 1, 64);
    let seg = SegmentWriter::create(&cfg).unwrap();
    let pid = std::process::id().to_string();
    let ask = |args: &[&str]| {
        bin()
            .args(["stacks", &pid])
            .args(args)
            .arg("--shm-dir")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    // Steps in bits 0-31, depth in bits 32-47 of the argument.
    let answer = |req: &vramscope_wire::ring::control::Request| {
        assert_eq!(
            req.command,
            Command::CaptureStacks {
                steps: 25,
                depth: 8
            }
        );
        assert_eq!(req.command.encode(), (5, 25 | 8 << 32));
        (Status::Ok, 20, 117)
    };
    let out = succeeded(answering(&seg, answer, || {
        ask(&["--steps", "25", "--depth", "8"])
    }));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("process {pid}: capturing stacks for 20 steps from step 117 (asked 25; the producer's bound)")
    );
    // An older producer: one line, exit 1.
    let out = answering(&seg, |_| (Status::Unsupported, 0, 0), || ask(&[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("does not capture stacks"), "{err}");
    // A depth that does not fit 16 bits: exit 2, naming the flag.
    let out = ask(&["--depth", "70000"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--depth") && err.contains("65535"), "{err}");
}

/// Issue 30, item 12: a recording's GPU line is NVML's last reading, taken
/// after the job exited (used 0 B), while the job's row keeps what NVML
/// last gave it (1.01 GiB): the GPU line says so.
#[test]
fn replay_says_a_gpu_was_read_after_its_process_exited() {
    let rec = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/diag/gpt2-fast.mid.vsrec");
    let out = common::succeeded(
        common::vramscope()
            .arg("replay")
            .arg(&rec)
            .output()
            .expect("runs"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let gpu = text
        .lines()
        .find(|l| l.starts_with("GPU 0"))
        .expect("a GPU line");
    assert!(
        gpu.ends_with(
            "used 0 B of 79.6 GiB, util 0% (read after pid 6379 exited; it last used 1.01 GiB)"
        ),
        "{text}"
    );
}

/// A job that ran before `record` started: a 64 MiB segment holding fifty
/// 1 MiB tensors (51 records in the device ring) and its statistics (2 in
/// the agent ring).
const BACKLOG_RECORDS: u64 = 53;
const BASE: u64 = 0x7f00_0000_0000;
const LATER: u64 = 0x7f10_0000_0000;

fn write_backlog(seg: &SegmentWriter) {
    let place = Place::default();
    write(
        seg,
        1,
        EventKind::SegmentAlloc {
            place,
            addr: BASE,
            size: 64 << 20,
        },
    );
    for i in 0..50u64 {
        let addr = BASE + (i << 20);
        write(
            seg,
            1,
            EventKind::Alloc {
                place,
                addr,
                size: 1 << 20,
            },
        );
    }
    let stats = Stats {
        allocated: 50 << 20,
        reserved: 64 << 20,
        segments: 1,
        ..Stats::default()
    };
    write(seg, 0, EventKind::Stats { device: 0, stats });
}

/// What the job does while it is recorded: a 20 MiB segment and a 3 MiB
/// tensor in it (two records).
fn write_after_start(seg: &SegmentWriter) {
    let place = Place::default();
    let segment = EventKind::SegmentAlloc {
        place,
        addr: LATER,
        size: 20 << 20,
    };
    write(seg, 1, segment);
    let tensor = EventKind::Alloc {
        place,
        addr: LATER,
        size: 3 << 20,
    };
    write(seg, 1, tensor);
}

/// `record` (3 s, `extra` flags) of a job (`producer`) with a backlog that answers a
/// snapshot command with its state (the fifty tensors in one block, the
/// rest free); the replay's process as JSON, and the snapshots asked for.
fn record_job_with_backlog(producer: Producer, extra: &[&str]) -> (Value, usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("job.vsrec");
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let seg = SegmentWriter::create(&SegmentConfig::new(&shm, producer, 1, 4096)).unwrap();
    write_backlog(&seg);
    let snapshots = AtomicUsize::new(0);
    let answer = |req: &vramscope_wire::ring::control::Request| {
        if let Command::Snapshot { .. } = req.command {
            snapshots.fetch_add(1, Ordering::Relaxed);
            let id = snapshots.load(Ordering::Relaxed) as u32;
            let blocks = [
                (50 << 20, vramscope_wire::event::BlockState::Allocated),
                (14 << 20, vramscope_wire::event::BlockState::Inactive),
            ];
            common::write_snapshot(
                &seg,
                id,
                vramscope_wire::ring::monotonic_ns(),
                BASE,
                &blocks,
            );
        }
        (Status::Ok, 0, 0)
    };
    answering(&seg, answer, || {
        let mut child = bin()
            .args(["record", "--no-nvml", "--duration", "3", "-o"])
            .arg(&rec)
            .arg("--shm-dir")
            .arg(&shm)
            .args(extra)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        write_after_start(&seg);
        assert!(child.wait().unwrap().success());
    });
    let out = succeeded(bin().args(["replay", "--json"]).arg(&rec).output().unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["processes"][0].clone(), snapshots.into_inner())
}

/// Issue 34, item B: a recording starts now. The job's backlog is skipped
/// (neither read nor lost); the recording anchors on the snapshot `record`
/// asks for, as the dashboard does when it attaches mid-run, and holds it
/// and what came after: the figures are the whole job's.
#[test]
fn a_recording_starts_now_and_anchors_on_a_snapshot() {
    let (p, snapshots) = record_job_with_backlog(Producer::TorchExact, &[]);
    assert!(snapshots >= 1, "no snapshot asked for");
    let source = &p["source"];
    assert_eq!(source["lost"], 0u64, "{source}");
    // The snapshot (begin, a segment, two blocks, end) and the two records
    // written after the start; none of the backlog.
    let delivered = source["delivered"].as_u64().unwrap();
    assert!((2..BACKLOG_RECORDS).contains(&delivered), "{source}");
    let figures = &p["view"]["figures"];
    assert_eq!(figures["allocated"], 53u64 << 20, "{figures}");
    assert_eq!(figures["reserved"], 84u64 << 20, "{figures}");
    assert!(figures["events_total"].as_u64().unwrap() < 51, "{figures}");
    assert_eq!(
        p["view"]["watch"]["mid_run"], true,
        "{}",
        p["view"]["watch"]
    );
}

/// `--backlog` records what the rings held before the start as well (the
/// whole job read from position 0: no snapshot needed).
#[test]
fn record_backlog_keeps_what_the_rings_held() {
    let (p, _) = record_job_with_backlog(Producer::TorchExact, &["--backlog"]);
    let source = &p["source"];
    let delivered = source["delivered"].as_u64().unwrap();
    assert!(delivered >= BACKLOG_RECORDS + 2, "{source}");
    // The fifty-one allocator events of the backlog and the two after (the
    // figures are the backlog's statistics sample, the latest).
    let figures = &p["view"]["figures"];
    assert_eq!(figures["events_total"], 53u64, "{figures}");
    assert_eq!(
        p["view"]["watch"]["mid_run"], false,
        "{}",
        p["view"]["watch"]
    );
}

/// A process that starts while `record` runs (its segment found after the
/// first scan) is read from its first record, however long the collector
/// took to find it: its whole life is after the start.
#[test]
fn a_process_that_starts_while_recording_is_read_from_its_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("new.vsrec");
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let mut child = record_for_3s(&rec, &shm);
    std::thread::sleep(Duration::from_millis(800));
    let seg =
        SegmentWriter::create(&SegmentConfig::new(&shm, Producer::TorchExact, 1, 4096)).unwrap();
    // Written at once: the next scan (every 500 ms) finds them in the ring.
    write_small_job(&seg);
    assert!(child.wait().unwrap().success());
    let out = succeeded(bin().args(["replay", "--json"]).arg(&rec).output().unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["processes"][0];
    assert_eq!(p["source"]["delivered"], 7u64, "{}", p["source"]);
    assert_eq!(p["view"]["figures"]["allocated"], 5u64 << 20);
    assert_eq!(p["view"]["watch"]["mid_run"], false);
}

/// A producer that takes no commands cannot be asked for a snapshot to
/// anchor on: its backlog is recorded (it may hold one) whatever the flag.
#[test]
fn a_producer_without_commands_is_recorded_with_its_backlog() {
    let (p, snapshots) = record_job_with_backlog(Producer::Test, &[]);
    assert_eq!(snapshots, 0);
    let delivered = p["source"]["delivered"].as_u64().unwrap();
    assert!(delivered >= BACKLOG_RECORDS + 2, "{}", p["source"]);
    assert_eq!(p["view"]["figures"]["events_total"], 53u64);
    assert_eq!(p["view"]["watch"]["mid_run"], false);
}

/// Issue 44, item 4: a producer whose snapshots say `before = after =
/// head + 10^9` of its device ring. `record` trusted the anchor: every
/// later event counted as "already in the snapshot", the replay showed
/// allocated 0 and peak 0, no SYNC flag, no problem, and `record` exited 0
/// without a word. Now the anchor is refused and said (a problem, the SYNC
/// flag), and a recording whose process never anchored says so on
/// standard error and in the recording (its replay shows the events that
/// had no state to go on).
#[test]
fn item4_record_refuses_an_anchor_past_the_rings_head_and_says_so() {
    use vramscope_wire::event::RingSpan;
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("job.vsrec");
    let shm = dir.path().join("shm");
    std::fs::create_dir(&shm).unwrap();
    let seg =
        SegmentWriter::create(&SegmentConfig::new(&shm, Producer::TorchExact, 1, 4096)).unwrap();
    write_backlog(&seg);
    let answer = |req: &vramscope_wire::ring::control::Request| {
        if let Command::Snapshot { .. } = req.command {
            let lie = seg.ring(1).head() + 1_000_000_000;
            let at = RingSpan {
                ring: 1,
                before: lie,
                after: lie,
                exact: true,
                ambiguous: false,
            };
            let blocks = [(50 << 20, vramscope_wire::event::BlockState::Allocated)];
            let t = vramscope_wire::ring::monotonic_ns();
            common::write_snapshot_at(&seg, 1, t, BASE, &blocks, Some(at));
        }
        (Status::Ok, 0, 0)
    };
    let out = answering(&seg, answer, || {
        let child = bin()
            .args(["record", "--no-nvml", "--duration", "3", "-o"])
            .arg(&rec)
            .arg("--shm-dir")
            .arg(&shm)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        write_after_start(&seg);
        child.wait_with_output().unwrap()
    });
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let pid = std::process::id();
    assert!(
        err.lines()
            .any(|l| l.contains(&format!("process {pid}")) && l.contains("no usable anchor")),
        "{err}"
    );
    let out = succeeded(bin().args(["replay", "--json"]).arg(&rec).output().unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = &v["processes"][0]["view"];
    assert_eq!(
        p["last_problem"]["problem"]["kind"], "anchor_past_head",
        "{p}"
    );
    assert_eq!(p["needs_resync"], true, "the SYNC flag: {p}");
    assert_eq!(p["watch"]["waiting_for_anchor"], true, "{}", p["watch"]);
    let held = &p["dropped"]["collector"]["events_without_an_anchor"];
    assert!(held.as_u64().is_some_and(|n| n >= 2), "{}", p["dropped"]);
}

/// Issue 46, item 21: `record`'s first line says what it records from, in
/// words that do not read as if `--backlog` were on when it is not.
#[test]
fn the_record_banner_says_whether_the_backlog_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    for (backlog, want) in [
        (
            false,
            "from now (what the rings hold from before is left out; --backlog keeps it)",
        ),
        (true, "from the oldest record the rings hold (--backlog)"),
    ] {
        let rec = dir.path().join(format!("r{backlog}.vsrec"));
        let mut cmd = bin();
        cmd.args(["record", "--no-nvml", "--duration", "1", "-o"])
            .arg(&rec)
            .arg("--shm-dir")
            .arg(dir.path());
        if backlog {
            cmd.arg("--backlog");
        }
        let out = succeeded(cmd.output().unwrap());
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or_default();
        assert!(first.contains(want), "{err}");
    }
}
