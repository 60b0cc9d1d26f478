//! The reader side: open a segment after every check, drain its rings with
//! exact loss accounting, post commands.

use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::codec::{Decoder, Words};
use super::control::{Command, CommandClient, Outcome};
use super::discover::{self, FileId, Liveness};
use super::error::RingError;
use super::layout::{self, Header, OFF_HEARTBEAT, OFF_STATE, RING_HEADER_SIZE, SLOT_SIZE};
use super::shm::Shared;
use crate::event::Event;

/// How long a claimed but incomplete position may hold up a ring before the
/// reader counts it lost (a writer preempted mid-write, or one that died).
pub(crate) const DEFAULT_STALL_LIMIT: Duration = Duration::from_millis(100);

/// Consumed slots let go of at a time (256 KiB of a ring): a watcher maps
/// at most this much of each ring behind its cursor.
pub(crate) const RELEASE_SLOTS: u64 = 4096;

/// The largest segment a reader maps (FORMAT.md, "Reader limits"): 4 GiB,
/// e.g. nine rings of 2^22 slots, far above the 4 MiB rings producers make
/// by default. Larger files are refused before a ring is touched.
pub(crate) const MAX_READER_SEGMENT: usize = 4 << 30;

/// Where a new reader starts in each ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// At the oldest record still in the ring; positions before it are
    /// `skipped` (they were gone before this reader came), not lost.
    Oldest,
    /// At the current head: only records written from now on.
    Now,
}

/// A reader's accounting for one ring. `skipped + delivered + lost` equals
/// the positions the cursor has passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RingCounts {
    pub skipped: u64,
    pub delivered: u64,
    pub lost: u64,
}

impl RingCounts {
    fn add(&mut self, o: &RingCounts) {
        self.skipped += o.skipped;
        self.delivered += o.delivered;
        self.lost += o.lost;
    }
}

struct Cursor {
    pos: u64,
    /// Where the reader started.
    start: u64,
    /// The head when this reader opened: records below it were written
    /// before the reader came, so missing them is `skipped`, not `lost`.
    opened_at: u64,
    stall: Option<(u64, Instant)>,
    counts: RingCounts,
    decoder: Decoder,
    /// Slots below this position have been let go of
    /// ([`SegmentReader::release_consumed`]).
    released: u64,
}

/// An open, validated segment.
pub struct SegmentReader {
    /// Where it was opened (tests check which segment a search found).
    #[cfg(test)]
    path: std::path::PathBuf,
    /// The file that was validated and mapped (device and inode).
    file: FileId,
    shared: Shared,
    header: Header,
    cursors: Vec<Cursor>,
    stall_limit: Duration,
    /// Rings read faster than a lap in this keep their pages mapped.
    /// Why the segment can no longer be read (truncated, holes punched),
    /// once found; reading stops for good then.
    broken: Option<String>,
    /// How often the file is checked (an fstat) on drains: every drain
    /// (zero, the default), or at most this often (the SIGBUS `poisoned`
    /// flag catches a truncation in between); and when it last was.
    intact_every: Duration,
    intact_at: Option<Instant>,
    /// The latest look at the producer's process, and when
    /// ([`Self::liveness_every`]).
    live_at: Option<(Instant, Liveness)>,
}

impl SegmentReader {
    /// Opens `path`, refusing anything FORMAT.md says to refuse, and starts at
    /// the oldest record still held.
    pub fn open(path: &Path) -> Result<Self, RingError> {
        Self::open_at(path, Start::Oldest)
    }

    pub(crate) fn open_at(path: &Path, start: Start) -> Result<Self, RingError> {
        let (shared, header, file) = discover::open_mapped_id(path)?;
        Self::from_mapped(path, file, shared, header, start)
    }

    /// Opens `name` in the directory `dir`, already opened (the files of a
    /// container's directory are reached through it, never by path).
    pub fn open_in(
        dir: &discover::SegmentDir,
        name: &str,
        start: Start,
    ) -> Result<Self, RingError> {
        let (shared, header, file) = dir.open_mapped(name)?;
        Self::from_mapped(&dir.join(name), file, shared, header, start)
    }

    fn from_mapped(
        path: &Path,
        file: FileId,
        shared: super::shm::Shared,
        header: super::layout::Header,
        start: Start,
    ) -> Result<Self, RingError> {
        if header.segment_size > MAX_READER_SEGMENT {
            return Err(RingError::refused(
                path,
                format!(
                    "{} bytes is larger than the {MAX_READER_SEGMENT} bytes a reader maps",
                    header.segment_size
                ),
            ));
        }
        shared
            .intact()
            .map_err(|why| RingError::refused(path, why))?;
        let cursors = header
            .rings
            .iter()
            .map(|entry| {
                let head = shared.ring(entry).head().load(Ordering::Acquire);
                let pos = match start {
                    Start::Oldest => head.saturating_sub(entry.slot_count),
                    Start::Now => head,
                };
                Cursor {
                    pos,
                    start: pos,
                    opened_at: head,
                    stall: None,
                    counts: RingCounts {
                        skipped: pos,
                        ..Default::default()
                    },
                    decoder: Decoder::default(),
                    released: pos,
                }
            })
            .collect();
        Ok(SegmentReader {
            #[cfg(test)]
            path: path.to_path_buf(),
            file,
            shared,
            header,
            cursors,
            stall_limit: DEFAULT_STALL_LIMIT,
            broken: None,
            intact_every: Duration::ZERO,
            intact_at: None,
            live_at: None,
        })
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file that was validated and mapped.
    pub(crate) fn file(&self) -> FileId {
        self.file
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn set_stall_limit(&mut self, limit: Duration) {
        self.stall_limit = limit;
    }

    /// Header `state`: initialising, live or closed.
    pub fn state(&self) -> u32 {
        self.shared.u32_at(OFF_STATE).load(Ordering::Acquire)
    }

    /// The producer's last heartbeat (its `CLOCK_MONOTONIC` ns).
    pub fn heartbeat_ns(&self) -> u64 {
        self.shared.u64_at(OFF_HEARTBEAT).load(Ordering::Acquire)
    }

    /// Why this segment can no longer be read, if another process broke it
    /// (truncated it or punched holes in it while it was mapped). Checked on
    /// every drain; once set, drains deliver nothing and [`Self::liveness`]
    /// says `Dead`, so a collector lets the segment go.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// Checks the file at most every `every` on drains (an fstat each);
    /// between checks, a truncation is caught by the SIGBUS flag
    /// (`poisoned`). Zero (the default): on every drain.
    pub fn set_integrity_interval(&mut self, every: Duration) {
        self.intact_every = every;
    }

    /// Checks the file still backs the mapping (when due: see
    /// [`Self::set_integrity_interval`]); remembers the first problem.
    fn still_intact(&mut self) -> bool {
        if self.broken.is_none() {
            let due = self.shared.poisoned()
                || self.intact_every.is_zero()
                || self
                    .intact_at
                    .is_none_or(|t| t.elapsed() >= self.intact_every);
            if due {
                self.intact_at = Some(Instant::now());
                if let Err(why) = self.shared.intact() {
                    self.broken = Some(why);
                }
            }
        }
        self.broken.is_none()
    }

    /// Whether the producer still runs (closed counts as gone, and so does
    /// a segment another process broke: see [`Self::broken`]).
    pub fn liveness(&self) -> Liveness {
        if self.broken.is_some() || self.shared.poisoned() {
            return Liveness::Dead;
        }
        discover::segment_liveness(self.header.pid, self.header.start_time, self.state())
    }

    /// [`Self::liveness`], with the producer's process (`/proc`) looked at
    /// no more often than `every`: a broken, poisoned or closed segment is
    /// seen at once, and a process found gone stays gone.
    pub fn liveness_every(&mut self, every: Duration) -> Liveness {
        if self.broken.is_some() || self.shared.poisoned() || self.state() == layout::STATE_CLOSED {
            return Liveness::Dead;
        }
        match &self.live_at {
            Some((t, l))
                if matches!(l, Liveness::Dead | Liveness::Reused) || t.elapsed() < every =>
            {
                *l
            }
            _ => {
                let l = self.liveness();
                self.live_at = Some((Instant::now(), l));
                l
            }
        }
    }

    /// Where this reader started in ring `i` (positions before it were
    /// skipped: written before the reader came).
    pub fn start(&self, i: usize) -> u64 {
        self.cursors[i].start
    }

    /// The rings in the segment's ring table.
    pub fn ring_count(&self) -> usize {
        self.cursors.len()
    }

    pub fn counts(&self, i: usize) -> RingCounts {
        self.cursors[i].counts
    }

    /// Accounting summed over all rings.
    pub fn totals(&self) -> RingCounts {
        let mut t = RingCounts::default();
        for c in &self.cursors {
            t.add(&c.counts);
        }
        t
    }

    /// Statistics samples dropped because half of one was lost.
    pub fn dropped_samples(&self) -> u64 {
        self.cursors.iter().map(|c| c.decoder.dropped_samples).sum()
    }

    /// Positions claimed in ring `i` so far.
    pub fn head(&self, i: usize) -> u64 {
        self.shared
            .ring(&self.header.rings[i])
            .head()
            .load(Ordering::Acquire)
    }

    /// Records writers abandoned in ring `i` because their slot was held.
    pub fn writer_dropped(&self, i: usize) -> u64 {
        self.shared
            .ring(&self.header.rings[i])
            .dropped()
            .load(Ordering::Relaxed)
    }

    /// Delivers complete records of ring `i` in position order, as
    /// `(position, words)`, passing at most `max` positions and never more
    /// than the ring's slot count in one call (delivered, lost or skipped:
    /// the work and the pages touched are bounded whatever the head says).
    /// Positions more than a ring behind the head are counted without
    /// touching their slots. `producer_gone` makes incomplete positions count
    /// as lost at once (nobody will finish them). Returns what this call did;
    /// nothing once the segment is [broken](Self::broken).
    pub fn drain_ring_raw(
        &mut self,
        i: usize,
        max: usize,
        producer_gone: bool,
        mut f: impl FnMut(u64, &Words),
    ) -> RingCounts {
        if !self.still_intact() {
            return RingCounts::default();
        }
        let view = self.shared.ring(&self.header.rings[i]);
        let n = view.slot_count();
        let cur = &mut self.cursors[i];
        let mut done = RingCounts::default();
        let head = view.head().load(Ordering::Acquire);
        if head.saturating_sub(cur.pos) > n {
            let to = head - n;
            // Overwritten before we read them: lost, unless they were written
            // before this reader opened (then they were never ours to read).
            let before_open = cur.opened_at.clamp(cur.pos, to) - cur.pos;
            done.skipped += before_open;
            done.lost += to - cur.pos - before_open;
            cur.pos = to;
            cur.stall = None;
        }
        let mut words = [0u64; layout::PAYLOAD_WORDS];
        // Positions this call may pass: at most `max`, at most one lap.
        let budget = (max as u64).min(n);
        let end = head.min(cur.pos.saturating_add(budget));
        while cur.pos < end {
            let t = cur.pos;
            let slot = view.slot(t);
            let done_seq = t.wrapping_mul(2).wrapping_add(2);
            let s1 = slot.seq.load(Ordering::Acquire);
            if s1 == done_seq {
                for (dst, src) in words.iter_mut().zip(&slot.w) {
                    *dst = src.load(Ordering::Relaxed);
                }
                fence(Ordering::Acquire);
                if slot.seq.load(Ordering::Relaxed) == s1 {
                    done.delivered += 1;
                    f(t, &words);
                } else if t < cur.opened_at {
                    done.skipped += 1;
                } else {
                    done.lost += 1;
                }
            } else if s1 > done_seq {
                if t < cur.opened_at {
                    done.skipped += 1;
                } else {
                    done.lost += 1;
                }
            } else {
                // Claimed, not complete: wait for it unless it has waited too long.
                let now = Instant::now();
                let since = match cur.stall {
                    Some((p, since)) if p == t => since,
                    _ => {
                        cur.stall = Some((t, now));
                        now
                    }
                };
                if producer_gone || now.duration_since(since) >= self.stall_limit {
                    done.lost += 1;
                } else {
                    break;
                }
            }
            cur.pos += 1;
            cur.stall = None;
        }
        cur.counts.add(&done);
        self.release_consumed(i);
        if self.shared.poisoned() {
            // A page vanished under this drain: what it read there was zeros
            // (never delivered), and nothing more is read from this file.
            self.still_intact();
        }
        done
    }

    /// Lets go of the pages of ring `i` that hold only consumed slots, once
    /// [`RELEASE_SLOTS`] of them have piled up: a watcher's resident memory
    /// then holds a few pages of each producer's ring, not the whole ring
    /// (which it would after the ring's first lap), however many producers
    /// it watches. The pages stay the producer's; reading them again maps
    /// them again. That costs about 1.3 µs a page on the project's VM
    /// (3 % of the watcher's time at 8 real jobs on one H200, 8 % at 8 ×
    /// 100 k events/s on the VM) and saves 4 MiB per busy ring.
    fn release_consumed(&mut self, i: usize) {
        let cur = &mut self.cursors[i];
        if cur.pos.saturating_sub(cur.released) < RELEASE_SLOTS {
            return;
        }
        let n = self.header.rings[i].slot_count;
        // At most one lap: older positions share these slots.
        let from = cur.released.max(cur.pos.saturating_sub(n));
        let to = cur.pos;
        cur.released = to;
        for (off, len) in self.slot_bytes(i, from, to) {
            self.shared.release(off, len);
        }
    }

    /// The bytes of ring `i` that hold positions `[from, to)` (at most one
    /// lap), as up to two `(offset, length)` ranges of the mapping.
    fn slot_bytes(&self, i: usize, from: u64, to: u64) -> impl Iterator<Item = (usize, usize)> {
        let entry = &self.header.rings[i];
        let n = entry.slot_count;
        debug_assert!(from <= to && to - from <= n);
        let byte = |slot: u64| entry.offset + RING_HEADER_SIZE + slot as usize * SLOT_SIZE;
        let (a, b) = (from & (n - 1), to & (n - 1));
        let ranges = if to == from {
            [None, None]
        } else if to - from == n {
            [Some((byte(0), byte(n) - byte(0))), None]
        } else if a < b {
            [Some((byte(a), byte(b) - byte(a))), None]
        } else {
            [
                Some((byte(a), byte(n) - byte(a))),
                Some((byte(0), byte(b) - byte(0))),
            ]
        };
        ranges.into_iter().flatten()
    }

    /// Drains every ring (up to `max_per_ring` records each) and decodes the
    /// records into events, ring by ring.
    pub fn drain(&mut self, max_per_ring: usize, mut f: impl FnMut(usize, Event)) -> RingCounts {
        self.drain_at(max_per_ring, |i, _, e| f(i, e))
    }

    /// [`drain`](Self::drain), with each event's position in its ring (the
    /// position of its last record: a statistics sample's STATS_B).
    pub(crate) fn drain_at(
        &mut self,
        max_per_ring: usize,
        f: impl FnMut(usize, u64, Event),
    ) -> RingCounts {
        let gone = self.liveness() != Liveness::Alive;
        self.drain_given(max_per_ring, gone, f)
    }

    /// [`drain_at`](Self::drain_at), told whether the producer is gone
    /// (`producer_gone`: see [`Self::drain_ring_raw`]) by a caller that
    /// looked already.
    pub fn drain_given(
        &mut self,
        max_per_ring: usize,
        gone: bool,
        mut f: impl FnMut(usize, u64, Event),
    ) -> RingCounts {
        let mut total = RingCounts::default();
        for i in 0..self.cursors.len() {
            let mut decoder = std::mem::take(&mut self.cursors[i].decoder);
            let done = self.drain_ring_raw(i, max_per_ring, gone, |p, w| {
                if let Some(e) = decoder.decode(w) {
                    f(i, p, e);
                }
            });
            self.cursors[i].decoder = decoder;
            total.add(&done);
        }
        total
    }

    /// Posts a command to the producer and waits for its outcome.
    pub fn command(&self, cmd: Command, timeout: Duration) -> Result<Outcome, RingError> {
        CommandClient::new(&self.shared, self.header.control_offset).call(cmd, timeout)
    }
}
