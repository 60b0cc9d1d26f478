//! Cross-language: the C writer (assets/agent/vramscope_ring.h), compiled by
//! this test with the system C compiler (and as C++), drives the Rust reader.

use std::path::{Path, PathBuf};
use std::time::Duration;

use vramscope_wire::event::{EventKind, Stats};
use vramscope_wire::ring::discover::Liveness;
use vramscope_wire::ring::{Command, Producer, SegmentReader, Status};

#[path = "common/c_writer.rs"]
mod c_writer;

fn compile(out: &Path, cxx: bool) -> PathBuf {
    let (exe, lang) = if cxx {
        ("writer_cxx", &["c++", "-x", "c++", "-std=gnu++17"][..])
    } else {
        ("writer_c", &["cc", "-std=gnu11"][..])
    };
    c_writer::compile("tests/c/writer.c", &out.join(exe), lang, &["-pthread"])
}

/// Builds writer.c and starts it with `args` (THREADS PER_THREAD SLOTS);
/// returns it with its segment open, and the segment directory.
fn start(dir: &Path, cxx: bool, args: &[String]) -> (c_writer::Writer, SegmentReader, PathBuf) {
    let exe = compile(dir, cxx);
    let shm = dir.join("shm");
    std::fs::create_dir(&shm).unwrap();
    let mut all = vec![shm.display().to_string()];
    all.extend_from_slice(args);
    let writer = c_writer::start(&exe, &all);
    let reader = SegmentReader::open(&writer.path).expect("the C segment validates");
    (writer, reader, shm)
}

/// Mirrors `make` in writer.c.
fn expected(thread: u64, i: u64) -> [u64; 6] {
    let x = (thread << 40) | i;
    let w2 = x.wrapping_mul(0x9E3779B97F4A7C15);
    let w3 = !x;
    let w4 = x ^ 0x5555555555555555;
    let w5 = x + 1;
    [x, w2, w3, w4, w5, w2 ^ w3 ^ w4 ^ w5]
}

/// The header writer.c wrote, read as today's reader reads it.
fn check_header(reader: &SegmentReader, pid: u32, slots: u64) {
    let h = reader.header().clone();
    assert_eq!(h.pid, pid);
    assert_eq!(h.producer, Producer::Test);
    assert_eq!(h.minor, 3, "vramscope_ring.h writes format 1.3");
    assert_eq!(h.framework, "c-writer 1.0");
    assert_eq!(h.label, "cross-language test é");
    assert_eq!(h.rings.len(), 2);
    assert_eq!(h.rings[1].slot_count, slots);
    assert_eq!(
        Some(h.start_time),
        vramscope_wire::ring::discover::proc_start_time(pid),
        "the C writer's start time is field 22 of /proc/<pid>/stat"
    );
    assert_eq!(reader.liveness(), Liveness::Alive);
}

/// Drains the device ring slowly while the writers run, checking every
/// record; returns how many were delivered.
fn drain_checked(reader: &mut SegmentReader, threads: u64, per_thread: u64) -> u64 {
    let mut next = vec![0u64; threads as usize];
    let mut delivered = 0u64;
    let mut check = |_: u64, w: &[u64; 7]| {
        let t = (w[0] >> 16) & 0xffff;
        let x = w[1];
        assert_eq!(x >> 40, t, "record of thread {t} carries x {x:#x}");
        let i = x & ((1 << 40) - 1);
        assert_eq!(&w[1..], &expected(t, i), "torn record accepted");
        assert!(i >= next[t as usize], "thread {t}: record {i} out of order");
        next[t as usize] = i + 1;
        delivered += 1;
    };
    // Until the reader has passed every position: the head alone can be
    // reached while a writer thread that claimed a slot has not yet
    // written it (seen under load).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = reader.drain_ring_raw(1, 4096, false, &mut check);
        if done.delivered == 0 && done.lost == 0 {
            let c = reader.counts(1);
            if c.skipped + c.delivered + c.lost == threads * per_thread {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the reader did not pass every position: {c:?}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    delivered
}

/// The statistics sample and marker writer.c puts in the agent ring.
fn check_agent_ring(reader: &mut SegmentReader) {
    let mut events = Vec::new();
    reader.drain(100, |ring, e| {
        if ring == 0 {
            events.push(e.kind)
        }
    });
    let stats = Stats {
        allocated: 100,
        reserved: 200,
        active: 150,
        inactive_split: 50,
        requested: 90,
        allocated_peak: 101,
        reserved_peak: 201,
        active_peak: 151,
        alloc_retries: 3,
        ooms: 2,
        segments: 7,
    };
    let marker = EventKind::Marker {
        value: 42,
        source: Default::default(),
    };
    assert_eq!(events, vec![EventKind::Stats { device: 0, stats }, marker]);
}

/// writer.c's commands: ping echoes, empty cache says 300 -> 100, the rest
/// is unsupported, ping 0 ends it.
fn check_commands(reader: &mut SegmentReader) {
    let t = Duration::from_secs(10);
    let pong = reader.command(Command::Ping { value: 77 }, t).unwrap();
    assert_eq!((pong.status, pong.result0), (Status::Ok, 77));
    let ec = reader
        .command(Command::EmptyCache { device: None }, t)
        .unwrap();
    assert_eq!((ec.status, ec.result0, ec.result1), (Status::Ok, 300, 100));
    let un = reader
        .command(Command::ResetPeaks { device: Some(1) }, t)
        .unwrap();
    assert_eq!(un.status, Status::Unsupported);
    reader.command(Command::Ping { value: 0 }, t).unwrap();
}

fn run_writer(cxx: bool, threads: u64, per_thread: u64, slots: u64) {
    let dir = tempfile::tempdir().unwrap();
    let args = [threads, per_thread, slots].map(|n| n.to_string());
    let (mut w, mut reader, _) = start(dir.path(), cxx, &args);
    check_header(&reader, w.child.id(), slots);

    w.tell("go");
    let delivered = drain_checked(&mut reader, threads, per_thread);
    // The writer prints "written" after the agent ring records.
    assert_eq!(w.lines.next().unwrap().unwrap(), "written");
    let c = reader.counts(1);
    assert_eq!(c.delivered, delivered);
    assert_eq!(
        c.skipped + c.delivered + c.lost,
        threads * per_thread,
        "{c:?}"
    );
    assert_eq!(reader.head(1), threads * per_thread);

    check_agent_ring(&mut reader);
    check_commands(&mut reader);
    assert!(w.child.wait().unwrap().success());
    assert!(!w.path.exists(), "a clean exit removes the segment");
    assert_eq!(reader.state(), vramscope_wire::ring::layout::STATE_CLOSED);
}

#[test]
fn c_writer_four_threads_small_ring_exact_accounting() {
    // A 1024-slot ring and 4 x 200k records: the reader falls behind and loses
    // some; every position is still delivered or counted lost, exactly once.
    run_writer(false, 4, 200_000, 1024);
}

/// One writer thread: writer.c uses `vs_ring_write_exclusive`.
#[test]
fn cxx_writer_one_thread_big_ring() {
    run_writer(true, 1, 50_000, 1 << 16);
}

#[test]
fn c_writer_killed_mid_run_costs_only_what_it_held() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["4", "100000000", "4096"].map(String::from);
    let (mut w, mut reader, shm) = start(dir.path(), false, &args);
    w.tell("go");
    let mut delivered = 0u64;
    for _ in 0..20 {
        reader.drain_ring_raw(1, 1000, false, |_, _| delivered += 1);
        std::thread::sleep(Duration::from_millis(2));
    }
    w.child.kill().unwrap(); // SIGKILL, possibly in the middle of a write
    w.child.wait().unwrap();
    assert_eq!(reader.liveness(), Liveness::Dead);
    // Everything left is delivered or counted lost; nothing waits forever.
    let mut n = 0;
    loop {
        let done = reader.drain(usize::MAX, |_, _| n += 1);
        if done.delivered == 0 && done.lost == 0 {
            break;
        }
    }
    let c = reader.counts(1);
    assert!(c.delivered > 0);
    assert_eq!(c.skipped + c.delivered + c.lost, reader.head(1), "{c:?}");
    // The killed writer left its file: it is stale now, and cleanup removes it.
    assert!(w.path.exists());
    let removed = vramscope_wire::ring::discover::remove_stale(&shm).unwrap();
    assert_eq!(removed, vec![w.path]);
}
