"""Sampled mode: a Python daemon thread writes allocator statistics and state
snapshots into the segment and answers commands. Used when the C++ tracker
cannot be built or attached. It holds the GIL only while it calls torch (a
statistics call costs ~0.2 ms; 4 per second per device).
"""

import os
import threading

from . import _segment as S

_STATE = {"active_allocated": 0, "active_pending_free": 1, "inactive": 2}


def _stat(st, key):
    try:
        return int(st.get(key, 0) or 0)
    except Exception:
        return 0


def _env_float(name, default):
    try:
        v = float(os.environ.get(name, ""))
        return v if v > 0 else default
    except ValueError:
        return default


class Sampler(threading.Thread):
    def __init__(self, torch, label, shm_dir=None):
        super().__init__(name="vramscope-sampler", daemon=True)
        self.torch = torch
        self.label = label
        self.shm_dir = shm_dir
        self.seg = None
        self.devices = 0
        self.sample = 0
        self.snapshot_id = 0
        self.wlock = threading.Lock()  # the agent ring has several Python writers (mark)
        self.contexts = None  # {device: bytes}, measured once (write_contexts)
        self.context_tries = 0
        self.stop_ev = threading.Event()
        self.done = threading.Event()
        self.stats_period = _env_float("VRAMSCOPE_STATS_MS", 250.0) / 1000.0
        self.snapshot_period = _env_float("VRAMSCOPE_SNAPSHOT_S", 2.0)
        self.last_fingerprint = None
        self.failed = set()
        # cudaMallocAsync tracks no blocks: memory_snapshot() raises there.
        try:
            self.snapshots = torch.cuda.get_allocator_backend() != "cudaMallocAsync"
        except Exception:
            self.snapshots = True

    def create(self):
        try:
            n = int(self.torch.cuda.device_count())
        except Exception:
            n = 1
        self.devices = max(1, min(n, 63))
        from . import _slots

        slots = _slots(1 + self.devices)
        rings = [(slots, S.ROLE_AGENT, 0xFFFFFFFF)]
        # Device rings stay empty in sampled mode (no events); they keep the
        # layout of the exact tracker (one ring per visible device).
        rings += [(64, S.ROLE_DEVICE, d) for d in range(self.devices)]
        self.seg = S.Segment(
            S.PRODUCER_TORCH_SAMPLED,
            S.FLAG_STATS,
            "torch " + str(getattr(self.torch, "__version__", "?")),
            self.label,
            rings,
            dir=self.shm_dir,
        )

    # ---- writing -----------------------------------------------------------

    def _write(self, words):
        with self.wlock:
            if self.seg is not None and not self.seg.closed:
                self.seg.rings[0].write(words)

    def write_contexts(self):
        """What each device this process uses held outside the allocator,
        measured once (NVML's bytes − reserved, early: sampled mode starts
        with CUDA; NVML may not list the process yet, so it is measured
        again at the next turns until it does, three at most) and sent again
        every 10 s as a total (FORMAT 1.3): the CUDA context where torch had
        allocated nothing on the device by the end of the reading, else
        "context and earlier" (kind 9: libraries may hold some of it)."""
        if not self.contexts and self.context_tries < 3:
            self.context_tries += 1
            try:
                from . import _outside

                got = _outside.contexts_by_nvml(self.torch)
                self.contexts = {
                    d: (S.OUT_CONTEXT if _outside.untouched(self.torch, d) else S.OUT_BEFORE, nbytes)
                    for d, nbytes in got.items()
                }
            except Exception:
                pass
        for d, (kind, nbytes) in (self.contexts or {}).items():
            self._write(S.outside_total_words(d, S.LIB_CUDA, kind, nbytes))

    def mark(self, value, source=1, arg=0):
        self._write([S.head_word(S.K_MARKER, S.NO_DEVICE, 0), S.monotonic_ns(), value, source & 0xFF, arg, 0, 0])

    def write_stats(self):
        cuda = self.torch.cuda
        fp = []
        for d in range(self.devices):
            st = cuda.memory_stats(d)
            if not st:
                continue
            self.sample = (self.sample + 1) & 0xFFFFFFFF
            now = S.monotonic_ns()
            g = lambda k: _stat(st, k)  # noqa: E731

            def rec(kind, *keys):
                # A record of `kind`: its head and time, then the figures.
                return [S.head_word(kind, d, self.sample), now] + [g(k) for k in keys]

            a = rec(
                S.K_STATS_A,
                "allocated_bytes.all.current",
                "reserved_bytes.all.current",
                "active_bytes.all.current",
                "inactive_split_bytes.all.current",
                "requested_bytes.all.current",
            )
            b = rec(
                S.K_STATS_B,
                "allocated_bytes.all.peak",
                "reserved_bytes.all.peak",
                "active_bytes.all.peak",
                "num_alloc_retries",
            ) + [(g("num_ooms") & 0xFFFFFFFF) | (g("segment.all.current") << 32)]
            with self.wlock:  # both halves adjacent in the ring
                if self.seg is not None and not self.seg.closed:
                    self.seg.rings[0].write(a)
                    self.seg.rings[0].write(b)
            fp.append((d, a[2], a[3], a[4], g("allocation.all.allocated"), g("segment.all.allocated")))
        return tuple(fp)

    def write_snapshot(self, only=None):
        segs = self.torch.cuda.memory_snapshot()
        self.snapshot_id = (self.snapshot_id + 1) & 0xFFFFFFFF
        sid = self.snapshot_id
        for d in range(self.devices):
            if only is not None and d != only:
                continue
            mine = [s for s in segs if int(s.get("device", 0)) == d]
            now = S.monotonic_ns()
            recs = [[S.head_word(S.K_SNAP_BEGIN, d, sid), now, len(mine), sum(len(s.get("blocks", [])) for s in mine), 0, 0, 0]]
            for s in mine:
                pool = s.get("segment_pool_id") or (0, 0)
                try:
                    p0, p1 = int(pool[0]), int(pool[1])
                except Exception:
                    p0, p1 = 0, 0
                flags = (1 if s.get("segment_type") == "small" else 0) | (2 if s.get("is_expandable") else 0)
                addr = int(s.get("address", 0))
                recs.append(
                    [
                        S.head_word(S.K_SNAP_SEGMENT, d, sid),
                        now,
                        addr,
                        int(s.get("total_size", 0)),
                        int(s.get("stream", 0) or 0),
                        p0,
                        ((p1 & ((1 << 56) - 1)) << 8) | flags,
                    ]
                )
                for b in s.get("blocks", []):
                    size = int(b.get("size", 0))
                    baddr = int(b.get("address", addr))
                    recs.append(
                        [
                            S.head_word(S.K_SNAP_BLOCK, d, sid),
                            now,
                            baddr,
                            size,
                            int(b.get("requested_size", size)),
                            _STATE.get(b.get("state"), 2),
                            0,
                        ]
                    )
                    addr = baddr + size
            recs.append([S.head_word(S.K_SNAP_END, d, sid), S.monotonic_ns(), 0, 0, 0, 0, 0])
            with self.wlock:
                if self.seg is None or self.seg.closed:
                    return sid
                for r in recs:
                    self.seg.rings[0].write(r)
        return sid

    # ---- commands ---------------------------------------------------------

    def _reserved(self):
        total = 0
        for d in range(self.devices):
            total += _stat(self.torch.cuda.memory_stats(d), "reserved_bytes.all.current")
        return total

    def _used(self):
        used = []
        for d in range(self.devices):
            st = self.torch.cuda.memory_stats(d)
            if _stat(st, "reserved_bytes.all.current") > 0 or _stat(st, "segment.all.allocated") > 0 or _stat(st, "allocation.all.allocated") > 0:
                used.append(d)
        return used

    def handle(self, seq, kind, arg):
        from . import _capturing

        cuda = self.torch.cuda
        dev = arg if arg < self.devices else None
        try:
            if kind == S.CMD_PING:
                self.seg.answer(seq, S.STATUS_OK, arg, 0)
            elif kind == S.CMD_SNAPSHOT and not self.snapshots:
                self.seg.answer(seq, S.STATUS_UNSUPPORTED, 0, 0)
            elif kind == S.CMD_SNAPSHOT:
                self.seg.answer(seq, S.STATUS_OK, self.write_snapshot(dev), 0)
            elif kind == S.CMD_RESET_PEAKS:
                for d in range(self.devices):
                    if dev is None or d == dev:
                        cuda.reset_peak_memory_stats(d)
                self.write_stats()
                self.seg.answer(seq, S.STATUS_OK, 0, 0)
            elif kind == S.CMD_EMPTY_CACHE:
                if _capturing():
                    self.seg.answer(seq, S.STATUS_REFUSED, 0, 0)
                    return
                before = self._reserved()
                # Current device = one the job uses: never create a context
                # on an unused GPU from this thread.
                for d in self._used():
                    with cuda.device(d):
                        cuda.empty_cache()
                after = self._reserved()
                self.write_stats()
                self.seg.answer(seq, S.STATUS_OK, before, after)
            else:
                self.seg.answer(seq, S.STATUS_UNSUPPORTED, 0, 0)
        except Exception as e:
            status = S.STATUS_REFUSED if "captur" in str(e) else S.STATUS_FAILED
            self.seg.answer(seq, status, 0, 0)

    # ---- the loop -----------------------------------------------------------

    def _guard(self, what, fn, *a):
        try:
            return fn(*a)
        except Exception as e:
            if what not in self.failed:
                self.failed.add(what)
                from . import _warn

                _warn("sampled %s failing: %s: %s" % (what, type(e).__name__, e), key="sampled-" + what)
            return None

    def run(self):
        try:
            import time

            next_stats = 0.0
            next_snap = 0.0
            if self.snapshots:
                self._guard("snapshot", self.write_snapshot)
            self.last_fingerprint = self._guard("statistics", self.write_stats)
            self._guard("contexts", self.write_contexts)
            next_contexts = time.monotonic() + 2.0
            next_snap = time.monotonic() + self.snapshot_period
            while not self.stop_ev.is_set() and self.seg is not None and not self.seg.closed:
                self.seg.heartbeat()
                cmd = self.seg.poll_command()
                if cmd is not None:
                    self.handle(*cmd)
                now = time.monotonic()
                if now >= next_contexts:
                    self._guard("contexts", self.write_contexts)
                    # Sooner while not measured yet.
                    next_contexts = now + (10.0 if self.contexts else 2.0)
                if now >= next_stats:
                    fp = self._guard("statistics", self.write_stats)
                    next_stats = now + self.stats_period
                    if self.snapshots and now >= next_snap and fp is not None and fp != self.last_fingerprint:
                        self._guard("snapshot", self.write_snapshot)
                        self.last_fingerprint = fp
                        next_snap = now + self.snapshot_period
                self.stop_ev.wait(0.02)
        except Exception as e:
            from . import _warn

            _warn("sampled mode stopped: %s: %s" % (type(e).__name__, e), key="sampled-loop")
        finally:
            self.done.set()

    def stop(self, timeout):
        self.stop_ev.set()
        if self.is_alive():
            self.done.wait(timeout)
        with self.wlock:
            if self.seg is not None:
                self.seg.close()

    def forget(self):
        """In a forked child: never write into the parent's segment."""
        self.stop_ev.set()
        if self.seg is not None:
            self.seg.forget()
