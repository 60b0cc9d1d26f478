//! The control block: one command at a time from a reader to the producer,
//! and its result back (`FORMAT.md`, "Control block").

use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::RingError;
use super::layout::{
    CTL_ACK_SEQ, CTL_CMD_ARG, CTL_CMD_KIND, CTL_CMD_SEQ, CTL_LOCK, CTL_LOCK_NS, CTL_POSTED_NS,
    CTL_RESULT0, CTL_RESULT1, CTL_RESULT2, CTL_STATUS,
};
use super::shm::monotonic_ns;
use super::shm::Shared;

/// A lock or a pending command older than this may be taken over.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);

/// What a reader can ask a producer to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Command {
    /// `torch.cuda.empty_cache()`; `device` None means every device in use.
    EmptyCache { device: Option<u16> },
    /// `torch.cuda.reset_peak_memory_stats()`.
    ResetPeaks { device: Option<u16> },
    /// Write a full state snapshot into the agent ring.
    Snapshot { device: Option<u16> },
    /// Echo `value` back; proves the producer's command thread is alive.
    Ping { value: u64 },
    /// Capture Python stacks for the next `steps` steps (0: stop), at most
    /// `depth` frames each (0: the producer's default). Added in 1.1: older
    /// producers answer `Unsupported`.
    CaptureStacks { steps: u32, depth: u16 },
    /// A kind this build does not know (received by a producer).
    Unknown { kind: u64, arg: u64 },
}

fn dev_arg(d: Option<u16>) -> u64 {
    d.map_or(u64::MAX, u64::from)
}

fn arg_dev(a: u64) -> Option<u16> {
    u16::try_from(a).ok()
}

impl Command {
    pub fn encode(self) -> (u64, u64) {
        match self {
            Command::EmptyCache { device } => (1, dev_arg(device)),
            Command::ResetPeaks { device } => (2, dev_arg(device)),
            Command::Snapshot { device } => (3, dev_arg(device)),
            Command::Ping { value } => (4, value),
            Command::CaptureStacks { steps, depth } => (5, steps as u64 | (depth as u64) << 32),
            Command::Unknown { kind, arg } => (kind, arg),
        }
    }
    pub(crate) fn decode(kind: u64, arg: u64) -> Self {
        match kind {
            1 => Command::EmptyCache {
                device: arg_dev(arg),
            },
            2 => Command::ResetPeaks {
                device: arg_dev(arg),
            },
            3 => Command::Snapshot {
                device: arg_dev(arg),
            },
            4 => Command::Ping { value: arg },
            5 => Command::CaptureStacks {
                steps: arg as u32,
                depth: (arg >> 32) as u16,
            },
            kind => Command::Unknown { kind, arg },
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Status {
    Ok,
    Unsupported,
    Failed,
    Refused,
    Other(u64),
}

impl Status {
    pub fn as_u64(self) -> u64 {
        match self {
            Status::Ok => 0,
            Status::Unsupported => 1,
            Status::Failed => 2,
            Status::Refused => 3,
            Status::Other(v) => v,
        }
    }
    pub fn from_u64(v: u64) -> Self {
        match v {
            0 => Status::Ok,
            1 => Status::Unsupported,
            2 => Status::Failed,
            3 => Status::Refused,
            v => Status::Other(v),
        }
    }
}

/// The producer's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub status: Status,
    /// Empty cache: reserved bytes before. Ping: the echo. Snapshot: its id.
    pub result0: u64,
    /// Empty cache: reserved bytes after.
    pub result1: u64,
    /// Producer's monotonic time when done, ns.
    pub result2: u64,
}

/// The reader's end: posts one command and waits for its outcome.
pub(crate) struct CommandClient<'a> {
    shm: &'a Shared,
    base: usize,
}

fn token() -> u64 {
    use std::sync::atomic::AtomicU32;
    static NONCE: AtomicU32 = AtomicU32::new(1);
    let nonce = NONCE.fetch_add(1, Ordering::Relaxed).max(1) ^ (monotonic_ns() as u32 | 1);
    (std::process::id() as u64) << 32 | nonce.max(1) as u64
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}

impl<'a> CommandClient<'a> {
    pub(crate) fn new(shm: &'a Shared, base: usize) -> Self {
        CommandClient { shm, base }
    }

    fn w(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.shm.u64_at(self.base + off)
    }

    /// Takes the lock, or takes over a stale one; `Busy` otherwise.
    fn lock(&self) -> Result<u64, RingError> {
        let me = token();
        let lock = self.w(CTL_LOCK);
        let mut held = match lock.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => 0,
            Err(h) => h,
        };
        if held != 0 {
            // lock_ns is 0 between a holder's compare-exchange and its store
            // of the time: such a lock is fresh, not stale.
            let since = self.w(CTL_LOCK_NS).load(Ordering::Acquire);
            let age = if since == 0 {
                0
            } else {
                monotonic_ns().saturating_sub(since)
            };
            let holder = (held >> 32) as u32;
            let stale = !pid_alive(holder) || age > STALE_AFTER.as_nanos() as u64;
            if !stale
                || lock
                    .compare_exchange(held, me, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
            {
                return Err(RingError::Busy { holder_pid: holder });
            }
            held = 0;
        }
        debug_assert_eq!(held, 0);
        self.w(CTL_LOCK_NS).store(monotonic_ns(), Ordering::Release);
        Ok(me)
    }

    fn unlock(&self, me: u64) {
        self.w(CTL_LOCK_NS).store(0, Ordering::Release);
        let _ = self
            .w(CTL_LOCK)
            .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Posts `cmd` and waits up to `timeout` for the outcome. A second reader
    /// posting at the same time gets `RingError::Busy`.
    pub(crate) fn call(&self, cmd: Command, timeout: Duration) -> Result<Outcome, RingError> {
        let me = self.lock()?;
        let result = self.post_and_wait(cmd, timeout);
        self.unlock(me);
        result
    }

    fn post_and_wait(&self, cmd: Command, timeout: Duration) -> Result<Outcome, RingError> {
        let seq = self.w(CTL_CMD_SEQ);
        let ack = self.w(CTL_ACK_SEQ);
        let current = seq.load(Ordering::Acquire);
        let acked = ack.load(Ordering::Acquire);
        if acked != current {
            // An earlier command is unanswered: leave it unless its poster
            // gave up long ago (we hold the lock, so nobody else is waiting).
            if current & 1 == 0 && !self.earlier_is_stale() {
                return Err(RingError::Busy { holder_pid: 0 });
            }
        }
        // Number our command above both words: an `ack_seq` left ahead of
        // `cmd_seq` (an abandoned post, a confused party) must never pass for
        // the answer to our command.
        let top = current.max(acked);
        let posted_seq = (top / 2 + 1).wrapping_mul(2);
        if posted_seq == 0 {
            return Err(RingError::Invalid(format!(
                "the control block's sequence is exhausted (cmd_seq {current:#x}, ack_seq {acked:#x})"
            )));
        }
        let (kind, arg) = cmd.encode();
        self.w(CTL_POSTED_NS)
            .store(monotonic_ns(), Ordering::Relaxed);
        seq.store(posted_seq.wrapping_sub(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.w(CTL_CMD_KIND).store(kind, Ordering::Relaxed);
        self.w(CTL_CMD_ARG).store(arg, Ordering::Relaxed);
        seq.store(posted_seq, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(50);
        loop {
            if ack.load(Ordering::Acquire) == posted_seq {
                let status = self.w(CTL_STATUS).load(Ordering::Relaxed);
                let r0 = self.w(CTL_RESULT0).load(Ordering::Relaxed);
                let r1 = self.w(CTL_RESULT1).load(Ordering::Relaxed);
                let r2 = self.w(CTL_RESULT2).load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if ack.load(Ordering::Relaxed) != posted_seq {
                    return Err(RingError::Superseded);
                }
                return Ok(Outcome {
                    status: Status::from_u64(status),
                    result0: r0,
                    result1: r1,
                    result2: r2,
                });
            }
            if Instant::now() >= deadline {
                return Err(RingError::Timeout(timeout));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    fn earlier_is_stale(&self) -> bool {
        let posted = self.w(CTL_POSTED_NS).load(Ordering::Acquire);
        monotonic_ns().saturating_sub(posted) > STALE_AFTER.as_nanos() as u64
    }
}

/// The producer's end: polls for a new command and answers it.
pub struct CommandServer<'a> {
    shm: &'a Shared,
    base: usize,
}

/// A command the producer has read and must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub(crate) seq: u64,
    pub command: Command,
}

impl<'a> CommandServer<'a> {
    pub(crate) fn new(shm: &'a Shared, base: usize) -> Self {
        CommandServer { shm, base }
    }

    fn w(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        self.shm.u64_at(self.base + off)
    }

    /// The next unanswered command, if one was posted completely.
    pub fn poll(&self) -> Option<Request> {
        let seq = self.w(CTL_CMD_SEQ);
        let s1 = seq.load(Ordering::Acquire);
        if s1 & 1 == 1 || s1 == 0 || s1 == self.w(CTL_ACK_SEQ).load(Ordering::Acquire) {
            return None;
        }
        let kind = self.w(CTL_CMD_KIND).load(Ordering::Relaxed);
        let arg = self.w(CTL_CMD_ARG).load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if seq.load(Ordering::Relaxed) != s1 {
            return None;
        }
        Some(Request {
            seq: s1,
            command: Command::decode(kind, arg),
        })
    }

    /// Publishes the outcome of `req`.
    pub fn answer(&self, req: Request, status: Status, result0: u64, result1: u64) {
        let ack = self.w(CTL_ACK_SEQ);
        ack.store(req.seq.wrapping_sub(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.w(CTL_STATUS).store(status.as_u64(), Ordering::Relaxed);
        self.w(CTL_RESULT0).store(result0, Ordering::Relaxed);
        self.w(CTL_RESULT1).store(result1, Ordering::Relaxed);
        self.w(CTL_RESULT2).store(monotonic_ns(), Ordering::Relaxed);
        ack.store(req.seq, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::super::layout::Producer;
    use super::super::layout::{CTL_ACK_SEQ, CTL_CMD_SEQ, CTL_RESULT0, CTL_STATUS};
    use super::super::reader::SegmentReader;
    use super::super::writer::{SegmentConfig, SegmentWriter};
    use super::*;

    /// Found while writing the `control` fuzz target: an abandoned post (`cmd_seq` odd)
    /// with `ack_seq` one ahead made the next command "answered" at once,
    /// with the stale status and results.
    #[test]
    fn an_ack_left_ahead_is_not_taken_for_the_answer() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = SegmentConfig::new(dir.path(), Producer::Test, 1, 16);
        cfg.tag = Some("ack".into());
        let seg = SegmentWriter::create(&cfg).unwrap();
        let r = SegmentReader::open(seg.path()).unwrap();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(seg.path())
            .unwrap();
        let base = seg.header().control_offset as u64;
        for (off, v) in [
            (CTL_CMD_SEQ, 3u64),
            (CTL_ACK_SEQ, 4),
            (CTL_STATUS, 2),
            (CTL_RESULT0, 99),
        ] {
            f.write_all_at(&v.to_le_bytes(), base + off as u64).unwrap();
        }
        // The producer answers our command; the stale words must not be
        // taken for its answer.
        std::thread::scope(|s| {
            s.spawn(|| {
                let server = seg.command_server();
                for _ in 0..2000 {
                    if let Some(req) = server.poll() {
                        server.answer(req, Status::Ok, 7, 0);
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            let got = r.command(Command::Ping { value: 7 }, Duration::from_secs(2));
            assert!(
                matches!(
                    got,
                    Ok(Outcome {
                        status: Status::Ok,
                        result0: 7,
                        ..
                    })
                ),
                "{got:?}"
            );
        });
    }
}
