//! The collector end to end on a real segment: the live loop drains it, and
//! when events were lost the model's wish for a resync (state the collector
//! reads after each step) becomes a snapshot request through the control
//! block — the one channel back. A replay's processes refuse commands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vramscope_collect::{Collector, Config};
use vramscope_core::model::{ProcessKey, ViewOptions};
use vramscope_wire::event::{Event, EventKind, Place};
use vramscope_wire::ring::client::{self, Expect};
use vramscope_wire::ring::codec::encode;
use vramscope_wire::ring::{Command, Producer, SegmentConfig, SegmentWriter, Status};

mod common;

/// A small-ring segment of this process, as an exact-mode agent makes.
fn segment(dir: &std::path::Path) -> SegmentWriter {
    SegmentWriter::create(&SegmentConfig::new(dir, Producer::TorchExact, 1, 64)).unwrap()
}

/// A collector on `dir`, without NVML.
fn collector(dir: &std::path::Path, tick: Duration) -> Collector {
    let mut cfg = Config::new(dir.to_path_buf());
    cfg.nvml = false;
    cfg.discover_interval = tick;
    cfg.ring_interval = tick;
    Collector::new(cfg)
}

/// An allocation event; the ring may be full (that is the point).
fn alloc(seg: &SegmentWriter, addr: u64) {
    let mut words = Vec::new();
    let kind = EventKind::Alloc {
        place: Place::default(),
        addr,
        size: 512,
    };
    let time_ns = vramscope_wire::ring::monotonic_ns();
    encode(&Event { time_ns, kind }, 0, &mut words);
    seg.ring(1).write(&words[0]);
}

#[test]
fn loss_makes_the_collector_ask_for_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path());
    let mut collector = collector(dir.path(), Duration::from_millis(20));
    let hub = collector.hub().clone();
    let asked: Mutex<Vec<Command>> = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let rt = vramscope_collect::runtime().unwrap();
    std::thread::scope(|s| {
        // The producer's side: answers commands, and floods its 64-slot ring
        // once the collector is attached.
        s.spawn(|| {
            let server = seg.command_server();
            let start = Instant::now();
            let mut flooded = false;
            while !done.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(20) {
                if let Some(req) = server.poll() {
                    asked.lock().unwrap().push(req.command);
                    server.answer(req, Status::Ok, 1, 0);
                }
                let attached = !hub.snapshot(&ViewOptions::default()).processes.is_empty();
                if attached && !flooded {
                    flooded = true;
                    for i in 0..10_000u64 {
                        alloc(&seg, 0x1000 + i * 512);
                    }
                }
                seg.heartbeat();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        rt.block_on(collector.run_until(async {
            let start = Instant::now();
            while asked.lock().unwrap().is_empty() && start.elapsed() < Duration::from_secs(15) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
        done.store(true, Ordering::Release);
    });
    let asked = asked.into_inner().unwrap();
    assert_eq!(
        asked.first(),
        Some(&Command::Snapshot { device: None }),
        "{asked:?}"
    );
    let snap = hub.snapshot(&ViewOptions::default());
    assert!(
        snap.processes[0].source.lost > 0,
        "{:?}",
        snap.processes[0].source
    );
}

#[test]
fn requests_reach_a_process_and_a_replay_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path());
    let mut collector = collector(dir.path(), Duration::from_millis(50));
    collector.step();
    let me = std::process::id();
    let key = collector
        .find_pid(me)
        .expect("the writer's process is attached");
    // The segment the snapshot shows for it, as the dashboard sends to it.
    let snap = collector.hub().snapshot(&ViewOptions::default());
    let entry = snap.processes.iter().find(|p| p.key() == key).unwrap();
    let path = std::path::PathBuf::from(entry.source.segment.clone().unwrap());
    let expect = |key: ProcessKey| Expect {
        pid: key.pid,
        start_time: key.start_time,
    };
    let out = common::answering(
        &seg,
        |_| (Status::Ok, 7 << 20, 3 << 20),
        || {
            client::command(
                &path,
                Some(expect(key)),
                Command::EmptyCache { device: None },
                Duration::from_secs(5),
            )
        },
    );
    let out = out.unwrap();
    assert_eq!(
        (out.status, out.result0, out.result1),
        (Status::Ok, 7 << 20, 3 << 20)
    );
    // A process that is not there: an error naming it, not a hang.
    let ghost = ProcessKey {
        pid: 999_999_999,
        start_time: 1,
    };
    let err = client::command(
        &path,
        Some(expect(ghost)),
        Command::Ping { value: 1 },
        Duration::from_secs(1),
    )
    .unwrap_err();
    assert!(err.to_string().contains("999999999"), "{err}");
    // A replayed recording's processes cannot be sent commands.
    let rec = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/recordings/v1.0-demo-leak.vsrec");
    let live = vramscope_collect::Live::replay(
        vramscope_core::recording::Replayer::open(&rec).unwrap(),
        std::sync::Arc::new(vramscope_collect::replay::Control::new(1000.0)),
        Default::default(),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let ping = Command::Ping { value: 1 };
    vramscope_ui::send_command(&live, live.hub(), &tx, key, me, path, ping);
    let vramscope_ui::AppEvent::CommandDone(r) = rx.recv_timeout(Duration::from_secs(5)).unwrap()
    else {
        panic!("not an answer")
    };
    assert!(r.result.unwrap_err().contains("cannot be sent commands"));
}

/// Issue 30, item 7: without NVML the host figures (CPU%, RSS, TIME) of a
/// watched process are still read at every NVML tick, as htop reads them
/// each refresh (they were read every 30 s: CPU% was "—" for 30 s).
#[test]
fn host_figures_refresh_without_nvml() {
    let dir = tempfile::tempdir().unwrap();
    let _seg = segment(dir.path());
    let mut cfg = Config::new(dir.path().to_path_buf());
    cfg.nvml = false;
    cfg.nvml_interval = Duration::from_millis(300);
    let live = vramscope_collect::Live::start(cfg).unwrap();
    let me = std::process::id();
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) {
        let snap = live.hub().snapshot(&ViewOptions::default());
        if let Some(h) = snap.machine.host.iter().find(|h| h.pid == me) {
            if h.cpu_percent.is_some() {
                seen.push(h.elapsed_ns);
                if seen.len() >= 2 && seen[0] != seen[seen.len() - 1] {
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // CPU% known (two readings) and TIME moving, within seconds.
    assert!(seen.len() >= 2, "host figures not read again: {seen:?}");
    assert_ne!(seen[0], seen[seen.len() - 1], "TIME did not move: {seen:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
