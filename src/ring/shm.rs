//! The shared mapping, seen as atomic words, and the two system calls the
//! wire needs (the monotonic clock, reserving file space). This is the only
//! file in vramscope with `unsafe`: it turns byte offsets inside a mapped
//! segment into references to atomics, after checking bounds and alignment.
//!
//! Why atomics: the memory is shared with another process that writes it at
//! any time, so every access must be atomic for a Rust reader to be sound
//! under the language's memory model (a plain read racing a write is
//! undefined behaviour, whatever the hardware does).

use std::fs::File;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use super::layout::{RingEntry, PAYLOAD_WORDS, RING_HEADER_SIZE, RING_OFF_DROPPED, RING_OFF_HEAD};

/// One 64-byte slot: the sequence word and seven payload words.
#[repr(C, align(64))]
pub struct Slot {
    pub seq: AtomicU64,
    pub w: [AtomicU64; PAYLOAD_WORDS],
}

/// A segment mapped shared, read-write.
pub struct Shared {
    map: MmapRaw,
}

impl Shared {
    /// Maps `len` bytes of `file` shared. The caller has checked that the file
    /// is at least `len` bytes long.
    pub fn map(file: &File, len: usize) -> std::io::Result<Self> {
        let map = MmapOptions::new().len(len).map_raw(file)?;
        Ok(Shared { map })
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    fn check(&self, off: usize, size: usize) {
        assert!(
            off % size == 0 && off.checked_add(size).is_some_and(|end| end <= self.len()),
            "offset {off} (+{size}) outside the {}-byte mapping or misaligned",
            self.len()
        );
    }

    /// The 64-bit word at byte offset `off`.
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: the mapping starts on a page boundary and `off` is a multiple
        // of 8 inside it (checked above), so the pointer is aligned and valid for
        // 8 bytes for as long as `self` (which owns the mapping) lives.
        // `AtomicU64` has the size and alignment of `u64`, and every party
        // accesses shared words atomically only (FORMAT.md), so handing out a
        // shared reference to an atomic is sound even while another process
        // writes the word.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The 32-bit word at byte offset `off`.
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: as for `u64_at`, with 4-byte alignment and size.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    /// The ring described by `entry`: its head, its drop counter and its slots.
    /// `entry` must come from a validated header (it lies inside the mapping).
    pub fn ring(&self, entry: &RingEntry) -> RingView<'_> {
        let slots_off = entry.offset + RING_HEADER_SIZE;
        let n = entry.slot_count as usize;
        assert!(
            entry.offset % 128 == 0
                && n.checked_mul(64)
                    .and_then(|b| b.checked_add(slots_off))
                    .is_some_and(|end| end <= self.len()),
            "ring at {} with {n} slots outside the {}-byte mapping",
            entry.offset,
            self.len()
        );
        // SAFETY: `slots_off` is 128-aligned plus 128, so 64-aligned as `Slot`
        // requires; the `n` slots end inside the mapping (checked above), which
        // lives as long as the returned borrow. `Slot` is made of atomics only,
        // so shared references to it are sound while other processes write it.
        let slots = unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(slots_off) as *const Slot, n)
        };
        RingView {
            head: self.u64_at(entry.offset + RING_OFF_HEAD),
            dropped: self.u64_at(entry.offset + RING_OFF_DROPPED),
            slots,
            mask: entry.slot_count - 1,
        }
    }

    /// A private copy of the first `n` bytes, read word by word with atomic
    /// loads, for parsing and validation away from the shared memory.
    pub fn copy_prefix(&self, n: usize) -> Vec<u8> {
        let n = n.min(self.len()) / 8 * 8;
        let mut out = Vec::with_capacity(n);
        for off in (0..n).step_by(8) {
            out.extend_from_slice(&self.u64_at(off).load(Ordering::Acquire).to_le_bytes());
        }
        out
    }

    /// Stores `bytes` (a multiple of 8 long) at offset 0 with relaxed atomic
    /// stores; used by a writer before it publishes the magic word.
    pub fn store_prefix(&self, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
            self.u64_at(i * 8).store(v, Ordering::Relaxed);
        }
    }
}

/// One ring inside a mapping.
#[derive(Clone, Copy)]
pub struct RingView<'a> {
    head: &'a AtomicU64,
    dropped: &'a AtomicU64,
    // Private: `slot` relies on `slots.len() == mask + 1`.
    slots: &'a [Slot],
    mask: u64,
}

impl<'a> RingView<'a> {
    /// The next position to claim.
    pub fn head(&self) -> &'a AtomicU64 {
        self.head
    }

    /// Writes abandoned because their slot was held.
    pub fn dropped(&self) -> &'a AtomicU64 {
        self.dropped
    }

    pub fn slot_count(&self) -> u64 {
        self.mask + 1
    }

    #[inline]
    pub fn slot(&self, position: u64) -> &Slot {
        let i = (position & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `Shared::ring` built `slots` with exactly `mask + 1` entries
        // (`slot_count`, a validated power of two), so `position & mask` is
        // always in bounds. This is the writer's hot path: no bounds check.
        unsafe { self.slots.get_unchecked(i) }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock every timestamp on the wire
/// uses (the C writer reads the same clock).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call only writes `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reserves `len` bytes of backing store for `file` now, so that a full
/// tmpfs is an error here rather than a SIGBUS on a later write.
pub fn reserve(file: &File, len: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open and owned by `file` for the whole call;
    // posix_fallocate only reads its arguments.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}
