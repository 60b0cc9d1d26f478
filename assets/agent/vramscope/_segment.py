"""A pure-Python producer of the vramscope segment format 1.1.

Used by sampled mode (no compiler, or an allocator that refuses the trace
tracker). It lays the segment out exactly as `vramscope_ring.h` does and is
specified by `crates/wire/src/ring/FORMAT.md` of the vramscope repository.

Ordering without atomics
------------------------
Python has no atomic stores into an mmap. Every shared word is therefore
written with ``os.pwrite`` on the segment's file descriptor, one aligned
8-byte (or 4-byte) word per call where ordering matters, in the order the
protocol needs: for a slot, the odd sequence word, then the payload, then the
even sequence word. Each ``pwrite`` takes the inode's lock in the kernel and
releases it before returning; an unlock (release) followed by the next lock
(acquire) orders every store of one call before every store of the next for
any observer, on weakly ordered CPUs (aarch64) as well as x86. The kernel
copies an aligned 8-byte word with one 8-byte store, so a reader never sees a
torn sequence word. Commands are read with ``os.pread`` and re-checked the way
FORMAT.md says (cmd_seq before and after).

There is a single writer thread per segment, so positions are claimed by
bumping ``head`` (a plain pwrite) before the slot is written: the slot
protocol is honoured without compare-and-swap.

The mapping
-----------
The segment is also mapped shared, read-write, for as long as it is open,
although nothing is written through the mapping: readers show a segment's
figures under its producer only if that process maps the file (FORMAT.md,
"Liveness and hygiene"), which is how they tell the producer from any other
process of the user that a header could name.
"""

import mmap
import os
import struct
import time
from stat import S_ISREG

MAGIC = 0x3165706F63534D56
MAJOR = 1
# format 1.3: of the records 1.1 to 1.3 added, this producer writes only
# OUTSIDE_TOTAL (the CUDA context, in sampled mode).
MINOR = 3
HEADER_SIZE = 256
RING_ENTRY_SIZE = 32
RING_HEADER_SIZE = 128
SLOT_SIZE = 64
CONTROL_SIZE = 128

PRODUCER_TORCH_EXACT = 1
PRODUCER_TORCH_SAMPLED = 2
PRODUCER_TEST = 4

FLAG_EVENTS = 1
FLAG_STATS = 2

ROLE_AGENT = 0
ROLE_DEVICE = 1

K_STATS_A = 16
K_STATS_B = 17
K_SNAP_BEGIN = 32
K_SNAP_SEGMENT = 33
K_SNAP_BLOCK = 34
K_SNAP_END = 35
K_MARKER = 48
# Added in 1.1 (not written by sampled mode; listed for completeness).
K_STATS_C = 18
K_DROPPED = 49
K_STRING = 64
K_FRAME = 65
K_STACK = 66
K_CONTEXT = 67
K_OUTSIDE_TOTAL = 82  # 1.3
LIB_CUDA = 1
OUT_CONTEXT = 1
OUT_BEFORE = 9
MARK_UNKNOWN = 0
MARK_USER = 1
MARK_OPTIMIZER_STEP = 2
NO_DEVICE = 0xFFFF

CMD_EMPTY_CACHE = 1
CMD_RESET_PEAKS = 2
CMD_SNAPSHOT = 3
CMD_PING = 4
CMD_CAPTURE_STACKS = 5  # 1.1; sampled mode answers it STATUS_UNSUPPORTED
STATUS_OK = 0
STATUS_UNSUPPORTED = 1
STATUS_FAILED = 2
STATUS_REFUSED = 3

OFF_HEARTBEAT = 72
OFF_STATE = 80
CTL_CMD_SEQ = 16
CTL_CMD_KIND = 24
CTL_CMD_ARG = 32
CTL_ACK_SEQ = 64
CTL_STATUS = 72
CTL_RESULT0 = 80

MASK64 = (1 << 64) - 1


def monotonic_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def head_word(kind, device, aux):
    return (kind & 0xFFFF) | ((device & 0xFFFF) << 16) | ((aux & 0xFFFFFFFF) << 32)


def outside_total_words(device, library, kind, nbytes, name=b""):
    """OUTSIDE_TOTAL (FORMAT.md 1.3): `nbytes` of memory outside the caching
    allocator on `device`, of `library` and `kind` (LIB_*, OUT_*), now; the
    library's name is its first 24 bytes."""
    n = (bytes(name)[:24] + b"\0" * 24)[:24]
    return [
        head_word(K_OUTSIDE_TOTAL, device, (library & 0xFF) | (kind & 0xFF) << 8),
        monotonic_ns(),
        0,
        nbytes & MASK64,
    ] + list(struct.unpack("<3Q", n))


def _align(v, a):
    return (v + a - 1) // a * a


def _start_time():
    """Field 22 of /proc/self/stat (start time in clock ticks)."""
    return _proc_start_time("self")


def _text(s, cap):
    b = (s or "").encode("utf-8", "replace")
    if len(b) > cap - 1:
        b = b[: cap - 1]
        while b and (b[-1] & 0xC0) == 0x80:  # drop a cut multi-byte character
            b = b[:-1]
        if b and b[-1] >= 0xC0:
            b = b[:-1]
    return b.ljust(cap, b"\0")


def segment_dir(explicit=None):
    return explicit or os.environ.get("VRAMSCOPE_SHM_DIR") or "/dev/shm"


class Ring:
    def __init__(self, seg, offset, slots):
        self.seg = seg
        self.offset = offset
        self.slots = slots
        self.head = 0

    def write(self, words):
        """Writes one record (seven words). Single writer: never fails."""
        fd = self.seg.fd
        p = self.head
        self.head = p + 1
        os.pwrite(fd, struct.pack("<Q", self.head), self.offset)  # claim p
        slot = self.offset + RING_HEADER_SIZE + (p % self.slots) * SLOT_SIZE
        os.pwrite(fd, struct.pack("<Q", (2 * p + 1) & MASK64), slot)
        os.pwrite(fd, struct.pack("<7Q", *[w & MASK64 for w in words]), slot + 8)
        os.pwrite(fd, struct.pack("<Q", (2 * p + 2) & MASK64), slot)


def _proc_start_time(pid):
    """Field 22 of /proc/<pid>/stat (`pid` a /proc entry: a number or
    "self"), or 0."""
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return int(stat[stat.rindex(")") + 1 :].split()[19])
    except Exception:
        return 0


def _proc_ns_pid(pid):
    """The pid process `pid` calls itself: the last entry of its NSpid
    line (its own pid on a kernel without one); None if unreadable."""
    try:
        with open("/proc/%s/status" % pid) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
        return int(pid)
    except Exception:
        return None


def _is_producer(p, ns_pid, start):
    return _proc_start_time(p) == start and _proc_ns_pid(p) == ns_pid


def _producer_gone(pid, start):
    """FORMAT.md's liveness, "Liveness and hygiene": True only when no process
    here is pid `pid` of its own namespace with that start time (found by
    the NSpid lines of /proc, so a producer in a container is found from the
    host too) and this process sees every process (root pid namespace). A
    producer that cannot be told (start time 0 or in the future, or not
    found from inside a pid namespace, where it may run unseen) is not gone."""
    try:
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")
        if start == 0 or start > now + 100:
            return False
        if os.stat("/proc/self/ns/pid").st_ino != 0xEFFFFFFC:
            return False
        if _is_producer(pid, pid, start):
            return False
        for e in os.listdir("/proc"):
            if e.isdigit() and _is_producer(e, pid, start):
                return False
        return True
    except Exception:
        return False


def _stale_segment(path):
    """The (device, inode) of the file at `path` if it is a stale segment of
    this user (a regular file of ours, mode 0600, holding a segment whose
    state is closed or whose producer is gone), else None. Only that very
    file may be removed. No device, FIFO or link is ever opened."""
    try:
        st = os.lstat(path)
        if not S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            fst = os.fstat(fd)
            h = os.pread(fd, HEADER_SIZE, 0)
        finally:
            os.close(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or len(h) < HEADER_SIZE:
            return None
        magic, major = struct.unpack_from("<QH", h, 0)
        size, pid, uid, start = struct.unpack_from("<QIIQ", h, 16)
        state, = struct.unpack_from("<I", h, OFF_STATE)
        if magic != MAGIC or major != MAJOR or uid != os.geteuid() or size != fst.st_size:
            return None
        if state == 2 or _producer_gone(pid, start):
            return (fst.st_dev, fst.st_ino)
    except OSError:
        pass
    return None


def _remove_if_same(path, ident):
    """Removes `path` only if it still names the file `ident`: renamed to a
    private name in its directory first (fresh and random: Python has no
    rename that refuses to replace), checked there, then unlinked, or
    renamed back. A newer producer given the name meanwhile keeps its file."""
    tmp = os.path.join(os.path.dirname(path), ".vramscope-unlink-%d-p%s" % (os.getpid(), os.urandom(8).hex()))
    try:
        os.rename(path, tmp)
    except OSError:
        return False
    try:
        st = os.lstat(tmp)
        if (st.st_dev, st.st_ino) == ident:
            os.unlink(tmp)
            return True
        os.rename(tmp, path)
    except OSError:
        pass
    return False


def _held(path):
    """What holds `path`, for the notice."""
    try:
        uid = os.lstat(path).st_uid
    except OSError as e:
        return str(e)
    if uid != os.geteuid():
        return "a file of uid %d that this process cannot remove" % uid
    return "a file of ours that is not a stale segment (a live producer's, or one that cannot be told)"


def _open_new(path, flags):
    """A descriptor of a new file at `path`. A stale segment of ours there
    is replaced (that very file only); None when the name is held by
    anything else: another user's file, a live segment, one whose producer
    cannot be told (FORMAT.md, "Naming and creation")."""
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        pass
    ident = _stale_segment(path)
    if ident is not None and _remove_if_same(path, ident):
        try:
            return os.open(path, flags, 0o600)
        except FileExistsError:
            pass
    return None


class Segment:
    """One segment, created and published; written with pwrite only."""

    def __init__(self, producer, flags, framework, label, rings, dir=None, tag=None):
        """`rings`: list of (slots, role, device)."""
        if not 1 <= len(rings) <= 64:
            raise ValueError("1 to 64 rings")
        d = segment_dir(dir)
        uid, pid = os.geteuid(), os.getpid()
        base = "vramscope-%d-%d" % (uid, pid)
        self.path = os.path.join(d, base + ("-" + tag if tag else ""))
        self.pid = pid
        control = _align(HEADER_SIZE + len(rings) * RING_ENTRY_SIZE, 64)
        at = _align(control + CONTROL_SIZE, 4096)
        offsets = []
        for slots, _, _ in rings:
            if slots < 2 or slots > (1 << 24) or slots & (slots - 1):
                raise ValueError("ring slots must be a power of two in 2..2^24")
            offsets.append(at)
            at = _align(at + RING_HEADER_SIZE + slots * SLOT_SIZE, 4096)
        size = at
        flags_open = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        # What a producer said about its name (None: the usual one).
        self.notice = None
        fd = _open_new(self.path, flags_open)
        if fd is None:
            # The name is held by a file we may not remove (another user's,
            # planted in the sticky directory, or another producer's live
            # segment): a tagged name of our own.
            taken = self.path
            for _ in range(16):
                alt = (tag[:20] + "_" if tag else "") + "r" + os.urandom(5).hex()
                path = os.path.join(d, base + "-" + alt)
                try:
                    fd = os.open(path, flags_open, 0o600)
                except FileExistsError:
                    continue
                self.path = path
                break
            else:
                raise FileExistsError("no free segment name for %s in %s" % (base, d))
            self.notice = "%s is taken by %s; using %s" % (taken, _held(taken), os.path.basename(self.path))
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            # tmpfs allocates lazily: reserve now so a full /dev/shm is an
            # error here, not a SIGBUS for a reader later.
            os.posix_fallocate(fd, 0, size)
            # Mapped for life: what makes this process the segment's producer
            # in a reader's eyes (see "The mapping" above).
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(self.path)
            except OSError:
                pass
            raise
        self.fd = fd
        self.size = size
        self.control = control
        hdr = bytearray(HEADER_SIZE + len(rings) * RING_ENTRY_SIZE)
        struct.pack_into("<HHIQ", hdr, 8, MAJOR, MINOR, HEADER_SIZE, size)
        struct.pack_into("<IIQII", hdr, 24, pid, uid, _start_time(), producer, flags)
        struct.pack_into("<QIIII", hdr, 48, time.time_ns(), len(rings), HEADER_SIZE, control, CONTROL_SIZE)
        struct.pack_into("<QI", hdr, 72, monotonic_ns(), 1)
        hdr[88:120] = _text(framework, 32)
        hdr[120:184] = _text(label, 64)
        self.rings = []
        for i, ((slots, role, device), off) in enumerate(zip(rings, offsets)):
            struct.pack_into("<QIIII", hdr, HEADER_SIZE + i * RING_ENTRY_SIZE, off, slots, SLOT_SIZE, role, device)
            self.rings.append(Ring(self, off, slots))
        # Everything but the magic, then the magic last (publication).
        os.pwrite(fd, bytes(hdr[8:]), 8)
        os.pwrite(fd, struct.pack("<Q", MAGIC), 0)
        self.closed = False
        self._last_cmd = 0

    def heartbeat(self):
        os.pwrite(self.fd, struct.pack("<Q", monotonic_ns()), OFF_HEARTBEAT)

    def poll_command(self):
        """Returns (seq, kind, arg) of a posted, unanswered command, or None."""
        c = self.control
        s1, = struct.unpack("<Q", os.pread(self.fd, 8, c + CTL_CMD_SEQ))
        if s1 == 0 or s1 & 1:
            return None
        ack, = struct.unpack("<Q", os.pread(self.fd, 8, c + CTL_ACK_SEQ))
        if s1 == ack:
            return None
        kind, arg = struct.unpack("<QQ", os.pread(self.fd, 16, c + CTL_CMD_KIND))
        s2, = struct.unpack("<Q", os.pread(self.fd, 8, c + CTL_CMD_SEQ))
        if s2 != s1:
            return None
        return s1, kind, arg

    def answer(self, seq, status, r0=0, r1=0):
        c = self.control
        os.pwrite(self.fd, struct.pack("<Q", seq - 1), c + CTL_ACK_SEQ)
        os.pwrite(
            self.fd,
            struct.pack("<4Q", status, r0 & MASK64, r1 & MASK64, monotonic_ns()),
            c + CTL_STATUS,
        )
        os.pwrite(self.fd, struct.pack("<Q", seq), c + CTL_ACK_SEQ)

    def close(self):
        """State closed, then unlink. Only the creating process does it."""
        if self.closed:
            return
        self.closed = True
        if os.getpid() != self.pid:
            self.forget()
            return
        try:
            os.pwrite(self.fd, struct.pack("<I", 2), OFF_STATE)
        except OSError:
            pass
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.forget()

    def forget(self):
        """Drops the mapping and the descriptor without unlinking (forked
        children)."""
        self.closed = True
        m, self.map = self.map, None
        if m is not None:
            try:
                m.close()
            except Exception:
                pass
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass
