//! The control block: commands reach the producer once, results come back,
//! a second poster is told "busy", and dead or stuck writers cost only the
//! slots they held.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use vramscope_wire::ring::control::Request;
use vramscope_wire::ring::{
    Command, Producer, RingError, SegmentConfig, SegmentReader, SegmentWriter, Status,
};

mod common;

fn segment(dir: &std::path::Path, slots: u64) -> SegmentWriter {
    SegmentWriter::create(&SegmentConfig::new(dir, Producer::Test, 1, slots)).unwrap()
}

#[test]
fn second_poster_is_busy_until_the_first_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 64);
    let a = SegmentReader::open(seg.path()).unwrap();
    let b = SegmentReader::open(seg.path()).unwrap();
    let answered = AtomicBool::new(false);
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            a.command(
                Command::EmptyCache { device: Some(0) },
                Duration::from_secs(10),
            )
        });
        // Wait until the first command is visible to the producer.
        let server = seg.command_server();
        let req: Request = loop {
            if let Some(r) = server.poll() {
                break r;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(req.command, Command::EmptyCache { device: Some(0) });
        // A second poster now: busy, and nothing is posted.
        let e = b
            .command(Command::Ping { value: 5 }, Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(e, RingError::Busy { .. }), "{e}");
        assert_eq!(
            server.poll(),
            Some(req),
            "the first command is still the pending one"
        );
        server.answer(req, Status::Ok, 3 << 30, 1 << 30);
        answered.store(true, Ordering::Release);
        let out = first.join().unwrap().unwrap();
        assert_eq!(
            (out.status, out.result0, out.result1),
            (Status::Ok, 3 << 30, 1 << 30)
        );
        assert_eq!(server.poll(), None, "answered commands are not seen again");
        // Now the second poster gets through.
        let s2 = s.spawn(|| b.command(Command::Ping { value: 5 }, Duration::from_secs(10)));
        let req = loop {
            if let Some(r) = server.poll() {
                break r;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        server.answer(req, Status::Ok, 5, 0);
        assert_eq!(s2.join().unwrap().unwrap().result0, 5);
    });
    assert!(answered.load(Ordering::Acquire));
}

#[test]
fn many_posters_no_command_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 64);
    let stop = AtomicBool::new(false);
    let executed = Mutex::new(Vec::new());
    let busy = AtomicU64::new(0);
    let succeeded = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let server = seg.command_server();
            while !stop.load(Ordering::Acquire) {
                if let Some(req) = server.poll() {
                    if let Command::Ping { value } = req.command {
                        executed.lock().unwrap().push(value);
                        server.answer(req, Status::Ok, value, 0);
                    }
                }
                std::thread::yield_now();
            }
        });
        let posters: Vec<_> = (0..4u64)
            .map(|t| {
                let path = seg.path().to_path_buf();
                let busy = &busy;
                let succeeded = &succeeded;
                s.spawn(move || {
                    let r = SegmentReader::open(&path).unwrap();
                    for i in 0..200u64 {
                        let v = t << 32 | i;
                        loop {
                            match r.command(Command::Ping { value: v }, Duration::from_secs(10)) {
                                Ok(out) => {
                                    assert_eq!(out.result0, v, "answer belongs to its command");
                                    succeeded.lock().unwrap().push(v);
                                    break;
                                }
                                Err(RingError::Busy { .. }) => {
                                    busy.fetch_add(1, Ordering::Relaxed);
                                    std::thread::yield_now();
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                })
            })
            .collect();
        for p in posters {
            p.join().unwrap();
        }
        stop.store(true, Ordering::Release);
    });
    let executed = executed.into_inner().unwrap();
    let succeeded: HashSet<u64> = succeeded.into_inner().unwrap().into_iter().collect();
    assert_eq!(executed.len(), 800, "each command executed exactly once");
    assert_eq!(executed.iter().copied().collect::<HashSet<_>>(), succeeded);
    assert!(busy.load(Ordering::Relaxed) > 0, "posters did collide");
}

#[test]
fn unanswered_command_times_out_and_blocks_no_one_forever() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 64);
    let r = SegmentReader::open(seg.path()).unwrap();
    let t0 = Instant::now();
    let e = r
        .command(
            Command::Snapshot { device: None },
            Duration::from_millis(50),
        )
        .unwrap_err();
    assert!(matches!(e, RingError::Timeout(_)));
    assert!(t0.elapsed() < Duration::from_secs(5));
    // The producer answers late: the pending command is still the snapshot.
    let server = seg.command_server();
    let req = server.poll().unwrap();
    assert_eq!(req.command, Command::Snapshot { device: None });
    server.answer(req, Status::Ok, 1, 0);
    let out = r.command(Command::Ping { value: 9 }, Duration::from_millis(10));
    // Nobody serves now: a timeout, not a wrong answer.
    assert!(matches!(out, Err(RingError::Timeout(_))));
}

#[test]
fn writer_dead_mid_write_costs_only_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 16);
    let ring = seg.ring(1);
    let mut r = SegmentReader::open(seg.path()).unwrap();
    r.set_stall_limit(Duration::from_millis(200));
    ring.write(&[1, 0, 0, 0, 0, 0, 1]);
    ring.write_and_die_midway(&[2, 0, 0, 0, 0, 0, 2]);
    ring.write(&[3, 0, 0, 0, 0, 0, 3]);
    let mut got = Vec::new();
    // A live producer: the reader waits at the incomplete position...
    let c = r.drain_ring_raw(1, 100, false, |p, w| got.push((p, w[0])));
    assert_eq!((c.delivered, c.lost), (1, 0));
    let c = r.drain_ring_raw(1, 100, false, |p, w| got.push((p, w[0])));
    assert_eq!(
        (c.delivered, c.lost),
        (0, 0),
        "still within the stall limit"
    );
    // ...until the stall limit passes, then counts it lost and goes on.
    std::thread::sleep(Duration::from_millis(250));
    let c = r.drain_ring_raw(1, 100, false, |p, w| got.push((p, w[0])));
    assert_eq!((c.delivered, c.lost), (1, 1));
    assert_eq!(got, vec![(0, 1), (2, 3)]);
    // A dead producer: incomplete positions are lost at once.
    ring.write_and_die_midway(&[4, 0, 0, 0, 0, 0, 4]);
    let c = r.drain_ring_raw(1, 100, true, |_, _| {});
    assert_eq!((c.delivered, c.lost), (0, 1));
    let t = r.counts(1);
    assert_eq!(t.delivered + t.lost + t.skipped, r.head(1));
}

#[test]
fn records_written_before_a_reader_opened_are_skipped_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 16);
    let ring = seg.ring(1);
    for i in 0..100u64 {
        ring.write(&[i, 0, 0, 0, 0, 0, 0]);
    }
    let mut r = SegmentReader::open(seg.path()).unwrap();
    // The writer laps the reader before its first drain.
    for i in 100..120u64 {
        ring.write(&[i, 0, 0, 0, 0, 0, 0]);
    }
    let mut got = Vec::new();
    r.drain_ring_raw(1, 1000, false, |p, _| got.push(p));
    let c = r.counts(1);
    assert_eq!(got, (104..120).collect::<Vec<_>>());
    // 0..84 were gone at open, 84..100 were written before it: skipped.
    // 100..104 were written after it and overwritten: lost.
    assert_eq!((c.skipped, c.delivered, c.lost), (100, 16, 4));
}

/// The one way to a process: `ring::client::command` opens the segment,
/// posts the command once and returns the producer's answer; meant for
/// another producer than the header names (a path taken over by a newer
/// process), it is refused and nothing reaches the producer.
#[test]
fn the_client_gets_the_answer_of_the_producer_it_was_meant_for() {
    use vramscope_wire::ring::client::{command, Expect};
    let dir = tempfile::tempdir().unwrap();
    let seg = segment(dir.path(), 16);
    let h = seg.header();
    let (pid, start_time) = (h.pid, h.start_time);
    let asked = std::sync::Mutex::new(Vec::new());
    let ask = |start_time| {
        command(
            seg.path(),
            Some(Expect { pid, start_time }),
            Command::EmptyCache { device: None },
            Duration::from_secs(5),
        )
    };
    let (ours, newer) = common::answering(
        &seg,
        |req| {
            asked.lock().unwrap().push(req.command);
            (Status::Ok, 7 << 20, 3 << 20)
        },
        || (ask(start_time), ask(start_time + 1)),
    );
    let out = ours.unwrap();
    assert_eq!(
        (out.status, out.result0, out.result1),
        (Status::Ok, 7 << 20, 3 << 20)
    );
    assert!(matches!(newer, Err(RingError::Refused { .. })), "{newer:?}");
    assert_eq!(
        *asked.lock().unwrap(),
        vec![Command::EmptyCache { device: None }]
    );
}
