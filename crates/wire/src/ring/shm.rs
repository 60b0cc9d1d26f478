//! The shared mapping, seen as atomic words, and the system calls the wire
//! needs (the monotonic clock, reserving file space, surviving a truncated
//! file). This is the only file in vramscope with `unsafe`: it turns byte
//! offsets inside a mapped segment into references to atomics, after
//! checking bounds and alignment, and it keeps those references valid
//! whatever another process does to the file.
//!
//! Why atomics: the memory is shared with another process that writes it at
//! any time, so every access must be atomic for a Rust reader to be sound
//! under the language's memory model (a plain read racing a write is
//! undefined behaviour, whatever the hardware does).
//!
//! Why a SIGBUS handler: any process of the same user can `ftruncate` a
//! segment (or punch a hole in it) while we have it mapped. Touching a page
//! of a shared file mapping that now lies past the end of the file raises
//! SIGBUS, whose default action kills the whole dashboard, leaving the
//! terminal raw. Two ways out were weighed:
//!
//! - reading slots with `pread`: a system call per drain batch at best, and a
//!   copy of every slot; the seqlock needs the sequence word re-read after the
//!   payload, so a batch read is not enough and a drain at the ≥ 50 M
//!   records/s target is out of reach; the writer and the control block need
//!   the mapping anyway.
//! - a SIGBUS handler (chosen): every mapping made here is entered in a
//!   lock-free static registry. When SIGBUS hits an address inside a
//!   registered mapping, the handler maps an anonymous zero page over the
//!   faulting page (`MAP_FIXED`), marks the mapping *poisoned* and returns:
//!   the access is retried and reads 0 (`seq` 0: never written, so nothing
//!   is delivered from it; stores land in the private page and go nowhere).
//!   The mapping thus stays valid memory for as long as the [`Shared`] lives,
//!   which is what every reference handed out below relies on. The reader
//!   checks [`Shared::intact`] on each drain (the poisoned flag, and `fstat`
//!   for a file that shrank or, on tmpfs, lost blocks) and drops the segment
//!   as "truncated by another process". A SIGBUS outside our mappings, or one
//!   sent with `kill`, goes to the handler that was installed before ours
//!   (the standard library's stack-overflow handler, which falls back to the
//!   default action: the process dies as it would without us).
//!   The fast path costs nothing: no check happens on a read.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;

use memmap2::{MmapOptions, MmapRaw};

use super::layout::{RingEntry, PAYLOAD_WORDS, RING_HEADER_SIZE, RING_OFF_DROPPED, RING_OFF_HEAD};

/// One 64-byte slot: the sequence word and seven payload words.
#[repr(C, align(64))]
pub struct Slot {
    pub seq: AtomicU64,
    pub(crate) w: [AtomicU64; PAYLOAD_WORDS],
}

// ---------------------------------------------------------------------------
// The registry of live mappings, read by the SIGBUS handler.

const FREE: u8 = 0;
const CLAIMED: u8 = 1;
const ACTIVE: u8 = 2;

/// At most this many segments mapped at once by one process.
pub(crate) const MAX_MAPPINGS: usize = 1024;

struct Entry {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    poisoned: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Entry = Entry {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    poisoned: AtomicBool::new(false),
};

static REGISTRY: [Entry; MAX_MAPPINGS] = [EMPTY; MAX_MAPPINGS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// The SIGBUS action that was in place before ours (set once, before ours
/// is installed, then only read, from the handler too: an atomic load).
static PREVIOUS: OnceLock<Result<libc::sigaction, i32>> = OnceLock::new();

fn register(start: usize, len: usize) -> Option<usize> {
    for (i, e) in REGISTRY.iter().enumerate() {
        if e.state
            .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            e.start.store(start, Ordering::Relaxed);
            e.len.store(len, Ordering::Relaxed);
            e.poisoned.store(false, Ordering::Relaxed);
            e.state.store(ACTIVE, Ordering::Release);
            return Some(i);
        }
    }
    None
}

fn install_handler() -> std::io::Result<()> {
    let prev = PREVIOUS.get_or_init(|| {
        PAGE_SIZE.store(page_size(), Ordering::Relaxed);
        // SAFETY: a zeroed `sigaction` is a valid value to pass (all fields
        // are plain integers, a bit set and an optional function pointer).
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: queries only (act is null); `old` is valid and writable.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        // SAFETY: as above for the zeroed value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // SAFETY: `act.sa_mask` is a valid sigset to clear; then `act` names a
        // handler that only does async-signal-safe work (atomic loads and
        // stores, mmap, sigaction, raise, or the previous handler), and
        // `PREVIOUS` is complete before it can run (this closure returns
        // right after, and the handler only acts on addresses registered
        // after this returns).
        unsafe {
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(old)
    });
    prev.map(|_| ()).map_err(std::io::Error::from_raw_os_error)
}

fn page_size() -> usize {
    // SAFETY: sysconf only reads its argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The SIGBUS handler: zero pages over faults inside our mappings, the
/// previous action for anything else.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // si_code > 0: raised by the kernel for a memory access (BUS_ADRERR, …);
    // <= 0: sent by a process, with no address to repair.
    if code > 0 {
        let page = PAGE_SIZE.load(Ordering::Relaxed);
        for e in REGISTRY.iter() {
            if e.state.load(Ordering::Acquire) != ACTIVE {
                continue;
            }
            let start = e.start.load(Ordering::Relaxed);
            let len = e.len.load(Ordering::Relaxed);
            if addr >= start && addr - start < len {
                let at = addr & !(page - 1);
                // SAFETY: `at` is the page holding `addr`, and that page lies
                // inside a mapping this process made and still holds (an
                // entry is ACTIVE from after the mmap until before the
                // munmap, and the faulting access proves the mapping is in
                // use). Replacing the page with a private anonymous one
                // changes what it reads (zeros from now on), not whether it
                // is mapped, so no reference into the mapping dangles.
                let r = unsafe {
                    libc::mmap(
                        at as *mut libc::c_void,
                        page,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if r != libc::MAP_FAILED {
                    e.poisoned.store(true, Ordering::Release);
                    return;
                }
                break;
            }
        }
    }
    // Not ours: whatever was there before.
    match PREVIOUS.get() {
        Some(Ok(prev))
            if prev.sa_sigaction != libc::SIG_DFL && prev.sa_sigaction != libc::SIG_IGN =>
        {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the previous action was installed with SA_SIGINFO,
                // so `sa_sigaction` is a handler of this signature; it is
                // called with the arguments the kernel gave us.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: without SA_SIGINFO `sa_sigaction` is a plain handler.
                let f: extern "C" fn(libc::c_int) =
                    unsafe { std::mem::transmute(prev.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // SAFETY: resets SIGBUS to its default action with a valid
            // zeroed sigaction (sa_sigaction 0 = SIG_DFL); raise is
            // async-signal-safe. A fault re-executes the access and dies by
            // the default action; a sent signal is re-raised, blocked until
            // this handler returns, then fatal.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                if code <= 0 {
                    libc::raise(libc::SIGBUS);
                }
            }
        }
    }
}

const TMPFS_MAGIC: i64 = 0x0102_1994;

fn on_tmpfs(file: &File) -> bool {
    // SAFETY: a zeroed statfs is a valid out-parameter.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the whole call; `st` is writable.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type as i64 == TMPFS_MAGIC
}

// ---------------------------------------------------------------------------

/// A segment mapped shared, read-write.
///
/// The mapping stays valid memory for as long as this value lives, even if
/// another process truncates the file: pages that fall past its end read as
/// zeros from then on (see the module documentation), and [`Shared::intact`]
/// says so.
pub struct Shared {
    map: MmapRaw,
    /// Our registry entry (the SIGBUS handler's view of `map`).
    entry: usize,
    /// A descriptor of the mapped file, for `fstat`.
    file: File,
    tmpfs: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Leave the registry before `map` is unmapped (fields drop after this
        // body), so the handler never repairs an address that is no longer
        // ours.
        REGISTRY[self.entry].state.store(FREE, Ordering::Release);
    }
}

impl Shared {
    /// Maps `len` bytes of `file` shared. `len` may exceed the file's size:
    /// pages past its end read as zeros and make [`Shared::intact`] fail.
    pub fn map(file: &File, len: usize) -> std::io::Result<Self> {
        install_handler()?;
        let file = file.try_clone()?;
        let tmpfs = on_tmpfs(&file);
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        let entry = register(map.as_ptr() as usize, map.len()).ok_or_else(|| {
            std::io::Error::other(format!("more than {MAX_MAPPINGS} segments mapped at once"))
        })?;
        Ok(Shared {
            map,
            entry,
            file,
            tmpfs,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether a page of the mapping was found missing (the file was cut
    /// while mapped) and replaced by zeros.
    pub fn poisoned(&self) -> bool {
        REGISTRY[self.entry].poisoned.load(Ordering::Acquire)
    }

    /// Checks that the mapped file still backs every mapped byte: not
    /// poisoned, not shorter than the mapping, and on tmpfs without holes
    /// (a hole is filled, from everyone's shared memory, by the first read).
    /// Returns why not.
    pub fn intact(&self) -> Result<(), String> {
        let len = self.len() as u64;
        if self.poisoned() {
            return Err(
                "truncated by another process while mapped: its pages now read as zeros".into(),
            );
        }
        let meta = self.file.metadata().map_err(|e| format!("fstat: {e}"))?;
        if meta.len() < len {
            return Err(format!(
                "truncated by another process to {} bytes (was {len})",
                meta.len()
            ));
        }
        if self.tmpfs {
            use std::os::unix::fs::MetadataExt;
            let allocated = meta.blocks().saturating_mul(512);
            if allocated < len {
                return Err(format!(
                    "sparse: {allocated} of its {len} bytes are allocated (its producer did not reserve it, or another process punched holes in it); reading the holes would fill the shared memory"
                ));
            }
        }
        Ok(())
    }

    fn check(&self, off: usize, size: usize) {
        assert!(
            off % size == 0 && off.checked_add(size).is_some_and(|end| end <= self.len()),
            "offset {off} (+{size}) outside the {}-byte mapping or misaligned",
            self.len()
        );
    }

    /// Lets go of this process's view of the whole pages inside
    /// `[off, off + len)`: they leave its resident set, and a later read
    /// maps them again from the file (their contents stay the file's). A
    /// reader calls it on ring slots it has consumed, so that the producer's
    /// ring does not count in the watcher's memory. Ranges outside the
    /// mapping are cut to it; an error of the call is ignored (the pages
    /// just stay mapped).
    pub(crate) fn release(&self, off: usize, len: usize) {
        let page = page_size();
        let end = off.saturating_add(len).min(self.len()) / page * page;
        let start = off.div_ceil(page) * page;
        if start >= end {
            return;
        }
        // SAFETY: `[start, end)` is page-aligned and inside our mapping. The
        // mapping is `MAP_SHARED` of a file, so MADV_DONTNEED only drops this
        // process's page-table entries: the data stays in the file (tmpfs or
        // the page cache) and the next access maps it again, exactly as the
        // first one did. No Rust reference into the mapping is invalidated:
        // every access goes through atomics (`u64_at`, `Slot`) that read the
        // file's current contents whenever they run.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }

    /// The 64-bit word at byte offset `off`.
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check(off, 8);
        // SAFETY: the mapping starts on a page boundary and `off` is a multiple
        // of 8 inside it (checked above), so the pointer is aligned and points
        // into memory mapped for as long as `self` lives: `self` owns the
        // mapping, and a truncation of the file by another process cannot
        // unmap it (our SIGBUS handler replaces a vanished page with a zero
        // page; the module documentation). `AtomicU64` has the size and
        // alignment of `u64`, and every party accesses shared words
        // atomically only (FORMAT.md), so handing out a shared reference to
        // an atomic is sound even while another process writes the word.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The 32-bit word at byte offset `off`.
    pub(crate) fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check(off, 4);
        // SAFETY: as for `u64_at` (bounds, lifetime, truncation), with 4-byte
        // alignment and size.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU32) }
    }

    /// The ring described by `entry`: its head, its drop counter and its slots.
    ///
    /// Panics unless `entry` describes a ring inside the mapping: 128-aligned,
    /// with a power-of-two `slot_count` whose slots end inside it. (Entries
    /// from a validated header always do; the check makes a hand-made entry
    /// a panic, never an out-of-bounds read.)
    pub fn ring(&self, entry: &RingEntry) -> RingView<'_> {
        let n = entry.slot_count;
        let end = entry
            .offset
            .checked_add(RING_HEADER_SIZE)
            .and_then(|s| usize::try_from(n).ok()?.checked_mul(64)?.checked_add(s));
        assert!(
            n.is_power_of_two()
                && entry.offset % 128 == 0
                && end.is_some_and(|end| end <= self.len()),
            "ring at {} with slot_count {n} is not a power-of-two ring inside the {}-byte mapping",
            entry.offset,
            self.len()
        );
        let slots_off = entry.offset + RING_HEADER_SIZE;
        // SAFETY: `slots_off` is 128-aligned plus 128, so 64-aligned as `Slot`
        // requires; the `n` slots end inside the mapping (checked above),
        // which stays mapped as long as the returned borrow of `self` lives,
        // truncation included (see `u64_at`). `Slot` is made of atomics only,
        // so shared references to it are sound while other processes write
        // it.
        let slots = unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(slots_off) as *const Slot, n as usize)
        };
        RingView {
            head: self.u64_at(entry.offset + RING_OFF_HEAD),
            dropped: self.u64_at(entry.offset + RING_OFF_DROPPED),
            slots,
            mask: n - 1,
        }
    }

    /// A private copy of the first `n` bytes, read word by word with atomic
    /// loads, for parsing and validation away from the shared memory.
    pub(crate) fn copy_prefix(&self, n: usize) -> Vec<u8> {
        let n = n.min(self.len()) / 8 * 8;
        let mut out = Vec::with_capacity(n);
        for off in (0..n).step_by(8) {
            out.extend_from_slice(&self.u64_at(off).load(Ordering::Acquire).to_le_bytes());
        }
        out
    }

    /// Stores `bytes` (a multiple of 8 long) at offset 0 with relaxed atomic
    /// stores; used by a writer before it publishes the magic word.
    pub(crate) fn store_prefix(&self, bytes: &[u8]) {
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
    pub(crate) fn head(&self) -> &'a AtomicU64 {
        self.head
    }

    /// Writes abandoned because their slot was held.
    pub(crate) fn dropped(&self) -> &'a AtomicU64 {
        self.dropped
    }

    pub fn slot_count(&self) -> u64 {
        self.mask + 1
    }

    #[inline]
    pub fn slot(&self, position: u64) -> &Slot {
        let i = (position & self.mask) as usize;
        debug_assert!(i < self.slots.len());
        // SAFETY: `Shared::ring`, the only constructor, built `slots` with
        // exactly `mask + 1` entries (it checked `slot_count` is a power of
        // two, so at least 1, and that the slots lie inside the mapping), and
        // the fields are private, so `position & mask` is always in bounds.
        // The slots stay mapped while the borrow lives, truncation included.
        // This is the writer's and the reader's hot path: no bounds check.
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
pub(crate) fn reserve(file: &File, len: usize) -> std::io::Result<()> {
    // SAFETY: the descriptor is open and owned by `file` for the whole call;
    // posix_fallocate only reads its arguments.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const CHILD_ENV: &str = "VRAMSCOPE_SHM_TEST_CHILD";

    /// A fault in a mapping that is not ours must still kill (by the default
    /// action, after the standard library's handler declines it): the
    /// handler repairs only registered mappings. Runs in a child process.
    #[test]
    fn a_fault_outside_our_mappings_still_kills() {
        let name = "ring::shm::tests::a_fault_outside_our_mappings_still_kills";
        if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
            let dir = tempfile::tempdir().unwrap();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(dir.path().join("f"))
                .unwrap();
            f.set_len(4096).unwrap();
            // Ours: installs the handler, and is repaired.
            let ours = Shared::map(&f, 8192).unwrap();
            assert_eq!(ours.u64_at(4096).load(Ordering::Relaxed), 0);
            // Not registered: a mapping of someone else's (memmap2 directly).
            let theirs = memmap2::MmapOptions::new().len(8192).map_raw(&f).unwrap();
            // SAFETY: in bounds of the 8192-byte mapping, aligned; the page
            // is past the end of the file, so this raises SIGBUS.
            let v = unsafe { std::ptr::read_volatile(theirs.as_ptr().add(4096) as *const u64) };
            println!("SURVIVED {v}");
            std::process::exit(0);
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, name)
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGBUS),
            "{:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
