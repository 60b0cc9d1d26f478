//! The reader's end of the control block (`FORMAT.md`, "Control block") on
//! arbitrary words: `scripts/fuzz.sh control 600`.
//!
//! One segment per fuzzing process, in a temporary directory. For every
//! input, the first 128 bytes become the control block (lock, sequence,
//! ack, status and result words as a crashed, stale or hostile producer or
//! reader may have left them); the next byte picks who answers:
//!
//! - 0: nobody (the client must give up by its timeout and free the lock);
//! - 1: an honest producer that answers with the status and results taken
//!   from the input: an `Ok` outcome must carry exactly those;
//! - 2: a hostile producer that keeps storing words from the input into
//!   `ack_seq`, `status` and the results while the client waits: no panic,
//!   no hang, the lock freed.
#![no_main]
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use vramscope_wire::ring::layout::{CONTROL_SIZE, CTL_ACK_SEQ, CTL_LOCK, CTL_RESULT0, CTL_STATUS};
use vramscope_wire::ring::{
    Command, Producer, RingError, SegmentConfig, SegmentReader, SegmentWriter, Status,
};

struct Fixture {
    _dir: tempfile::TempDir,
    writer: SegmentWriter,
    reader: SegmentReader,
    file: std::fs::File,
    base: u64,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 16);
        cfg.tag = Some("ctl".into());
        let writer = SegmentWriter::create(&cfg).unwrap();
        let reader = SegmentReader::open(writer.path()).unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(writer.path())
            .unwrap();
        let base = writer.header().control_offset as u64;
        Fixture {
            _dir: dir,
            writer,
            reader,
            file,
            base,
        }
    })
}

fn word(data: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    for (k, x) in b.iter_mut().enumerate() {
        *x = data.get(i * 8 + k).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fn read_word(fx: &Fixture, off: usize) -> u64 {
    let mut b = [0u8; 8];
    fx.file.read_exact_at(&mut b, fx.base + off as u64).unwrap();
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let fx = fixture();
    let mut block = [0u8; CONTROL_SIZE];
    let n = data.len().min(CONTROL_SIZE);
    block[..n].copy_from_slice(&data[..n]);
    fx.file.write_all_at(&block, fx.base).unwrap();
    let rest = data.get(CONTROL_SIZE..).unwrap_or(&[]);
    let mode = rest.first().copied().unwrap_or(0) % 3;
    let words = rest.get(1..).unwrap_or(&[]);
    let answer = (word(words, 0), word(words, 1), word(words, 2));
    let timeout = Duration::from_millis([1, 50, 5][mode as usize]);
    let lock_before = read_word(fx, CTL_LOCK);
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let got = std::thread::scope(|s| {
        match mode {
            1 => {
                s.spawn(|| {
                    let server = fx.writer.command_server();
                    while !stop.load(Ordering::Relaxed) {
                        if let Some(req) = server.poll() {
                            server.answer(req, Status::from_u64(answer.0), answer.1, answer.2);
                            return;
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                });
            }
            2 => {
                s.spawn(|| {
                    let words: Vec<u64> = (0..rest.len() / 8).map(|i| word(rest, i)).collect();
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) && !words.is_empty() {
                        let off = [CTL_ACK_SEQ, CTL_STATUS, CTL_RESULT0][i % 3];
                        let w = words[i % words.len()];
                        fx.file
                            .write_all_at(&w.to_le_bytes(), fx.base + off as u64)
                            .unwrap();
                        i += 1;
                        std::thread::sleep(Duration::from_micros(20));
                    }
                });
            }
            _ => {}
        }
        let got = fx.reader.command(Command::Ping { value: 7 }, timeout);
        stop.store(true, Ordering::Relaxed);
        got
    });
    let took = t0.elapsed();
    assert!(
        took < timeout + Duration::from_secs(2),
        "the client waited {took:?} with a {timeout:?} timeout"
    );
    match &got {
        Err(RingError::Busy { .. }) => {
            // We never held it: the lock is as it was (or taken over and
            // released when stale).
            let now = read_word(fx, CTL_LOCK);
            assert!(
                now == lock_before || now == 0,
                "lock {now:#x} (was {lock_before:#x})"
            );
        }
        other => {
            assert_eq!(read_word(fx, CTL_LOCK), 0, "lock left held after {other:?}");
        }
    }
    if mode == 1 {
        if let Ok(o) = got {
            assert_eq!(
                (o.status.as_u64(), o.result0, o.result1),
                answer,
                "an outcome that is not the producer's answer"
            );
        }
    }
});
