"""vramscope's in-process agent for PyTorch.

    import vramscope
    vramscope.attach()        # any time; before or after CUDA is initialised
    ...
    vramscope.mark(step)      # optional: training step boundaries

or, with no change to the script, ``vramscope run python train.py`` (which
puts this package on PYTHONPATH with a sitecustomize that sets it up as soon
as torch is imported).

Modes
-----
exact    the C++ tracker (tracker.cpp), compiled on first use against this
         process's own torch headers and cached; every allocator event, plus
         statistics and snapshots from a native thread.
sampled  no compiler or headers, or an allocator that refuses trackers
         (``backend:cudaMallocAsync``, a pluggable allocator), or
         ``VRAMSCOPE_MODE=sampled``: a Python daemon thread samples
         ``torch.cuda.memory_stats()`` (4/s) and ``memory_snapshot()`` (at
         most every 2 s, when something changed, and on command).

When CUDA is initialised
------------------------
Attaching a tracker before CUDA is initialised silently does nothing, and
importing torch must not initialise CUDA (that would change the job). The
agent therefore registers a callback with ``torch.cuda._lazy_call``: torch
runs it right after its own lazy CUDA initialisation (or at once if CUDA is
already initialised). The callback only sets an event; a background thread
then compiles the tracker if it is not cached yet (once per torch version,
a few seconds) and starts it, or sampled mode. Segments made between
initialisation and attach are in the first snapshot.

Never hurting the job
---------------------
Nothing here raises into user code; every failure disables the failing part
with one ``vramscope:`` line on stderr. The allocator callback is C++ that
takes no lock and never touches Python; the native agent thread never holds
the GIL. Forked children (DataLoader workers) never write into the parent's
segment. Numerics are never touched.

Environment
-----------
VRAMSCOPE_MODE      auto (default), exact, sampled, off
VRAMSCOPE_SHM_DIR   segment directory (default /dev/shm)
VRAMSCOPE_CXX       compiler to use; a path that does not exist means "none"
VRAMSCOPE_SLOTS     slots per ring (power of two, default 65536)
VRAMSCOPE_STATS_MS  statistics period (default 100 exact, 250 sampled)
VRAMSCOPE_AUTO      1: the sitecustomize set up by `vramscope run` attaches
VRAMSCOPE_VARIANT   "empty": build the tracker whose callback does nothing
                    (for the overhead benchmark only)
VRAMSCOPE_ATTRIBUTION  0: no module/phase attribution (no module hooks, no
                    context tags); default on in exact mode (see _attrib.py)
VRAMSCOPE_ATTRIBUTION_NATIVE  0: module calls and backward pre-hooks stay in
                    Python (default: the native path, fastcall.cpp, where it
                    builds)
VRAMSCOPE_ATTRIBUTION_BACKWARD  auto (default), params, all, none: which
                    modules' backward is tracked (see _attrib.py)
VRAMSCOPE_ROLES     0: no role lists (which blocks are parameters, buffers,
                    gradients, optimizer state; see _roles.py)
VRAMSCOPE_RING_WRITE   shared: device rings use the any-writer path
                    (default: the exclusive one, under the allocator lock)
"""

import atexit
import os
import sys
import threading

from . import _build
from ._build import AGENT_VERSION

__version__ = AGENT_VERSION
__all__ = ["attach", "mark", "new_run", "status", "__version__"]

_lock = threading.RLock()
_warned = set()
# status()["attribution_native"] when VRAMSCOPE_ATTRIBUTION_NATIVE=0.
NATIVE_OFF = "off (VRAMSCOPE_ATTRIBUTION_NATIVE=0)"

_st = {
    "mode": None,  # None, "pending", "exact", "sampled", "off", "failed"
    "reason": "",
    "lib": None,
    "lib_path": None,
    "sampler": None,
    "path": None,
    "pid": None,
    "forked": False,
    "fork_hook": False,
    "atexit": False,
    "capturing": 0,
    "graph_patched": False,
    "mark_from": None,  # the tracker's vs_agent_mark_from (markers with a source)
    "step_hook": None,  # the optimizer step hook's handle (False: unavailable)
    "attrib": None,  # _attrib.Attribution while module attribution is on
    "limit": None,  # the memory limit last reported: (device, bytes, whole device)
    "closing": False,  # atexit has begun: no mode starts any more
}


def _warn(msg, key=None):
    """One line on stderr, once per key."""
    key = key or msg
    if key in _warned:
        return
    _warned.add(key)
    try:
        sys.stderr.write("vramscope: %s\n" % msg)
        sys.stderr.flush()
    except Exception:
        pass


def _env_int(name, default):
    try:
        v = int(os.environ.get(name, ""))
        return v if v > 0 else default
    except ValueError:
        return default


# Readers map at most 4 GiB of one segment (FORMAT.md, "Reader limits").
_READER_CAP = 4 << 30


def _slots(rings):
    """VRAMSCOPE_SLOTS, kept so that `rings` rings of 64-byte slots stay
    inside what a reader maps (the largest power of two that fits)."""
    want = _env_int("VRAMSCOPE_SLOTS", 65536)
    fit = (_READER_CAP - (1 << 20)) // (64 * max(1, rings))
    slots = min(want, 1 << 24, fit)
    return 1 << max(1, slots.bit_length() - 1)


def _device_count(torch):
    try:
        return max(1, int(torch.cuda.device_count()))
    except Exception:
        return 1


def _label():
    try:
        argv = list(sys.argv or [])
        if not argv or not argv[0]:
            return "python"
        first = os.path.basename(argv[0]) or argv[0]
        return " ".join([first] + argv[1:])[:63]
    except Exception:
        return "python"


def status():
    """A dict: mode (pending/exact/sampled/off/failed or None), reason, path,
    library, optimizer_steps (whether optimizer steps are seen),
    attribution (whether allocations are tagged with modules and phases) and
    attribution_native (True: module calls take the native path,
    fastcall.cpp; else why not, or False while it is being built) and
    outside (True: memory outside the caching allocator is named,
    outside.cpp; else why not)."""
    from . import _outside

    a = _st["attrib"]
    return {
        "mode": _st["mode"],
        "reason": _st["reason"],
        "path": _st["path"],
        "library": _st["lib_path"],
        "optimizer_steps": bool(_st["step_hook"]),
        "attribution": bool(a is not None and a.installed and a.lib is not None),
        "attribution_native": (True if a.native is not None else a.native_note or False) if a is not None else False,
        "outside": _outside.status(),
    }


def attach(label=None, mode=None, shm_dir=None, wait=True):
    """Instruments this process. Returns True when attached (or waiting for
    CUDA to be initialised), False when disabled. Never raises.

    `wait`: when CUDA is already initialised, build and start before
    returning (the first build takes a few seconds, then it is cached)."""
    try:
        return _attach(label, mode, shm_dir, wait)
    except Exception as e:  # never into user code
        _st["mode"] = "failed"
        _warn("disabled: %s: %s" % (type(e).__name__, e), key="attach")
        return False


def _attach(label, mode, shm_dir, wait):
    with _lock:
        if _st["mode"] in ("pending", "exact", "sampled"):
            return True
        if _st["forked"]:
            return False
        mode = (mode or os.environ.get("VRAMSCOPE_MODE") or "auto").strip().lower()
        if mode in ("off", "0", "none", "disabled"):
            _st["mode"] = "off"
            return False
        if mode not in ("auto", "exact", "sampled"):
            _warn("unknown VRAMSCOPE_MODE %r, using auto" % mode)
            mode = "auto"
        import torch  # the caller uses torch; in auto mode it is already imported

        _st["mode"] = "pending"
        _st["pid"] = os.getpid()
        if not _st["fork_hook"]:
            os.register_at_fork(after_in_child=_after_fork_child)
            _st["fork_hook"] = True
        if not _st["atexit"]:
            atexit.register(_shutdown)
            _st["atexit"] = True
        _patch_graph_capture(torch)
        if mode != "sampled":
            # Before CUDA is initialised, so that model.cuda() (which
            # initialises it) is attributed too.
            _install_attribution(torch)
        starter = _Starter(torch, label or _label(), mode, shm_dir)
        ready = starter.cuda_ready
        if _cuda_initialized(torch):
            # A late start: _lazy_call would run on_cuda_init at once, and
            # what it measures is no longer the context alone.
            ready.set()
        else:
            try:
                torch.cuda._lazy_call(starter.on_cuda_init)
            except Exception:
                # Very old or unusual builds: poll is_initialized from the starter.
                starter.poll_init = True
        if ready.is_set() and wait:
            starter.run_inline()
        else:
            starter.start()
        return True


def _cuda_initialized(torch):
    """Whether CUDA is initialised already (False where torch cannot say)."""
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


# MARKER sources (crates/wire/src/ring/FORMAT.md, MARKER `source`).
_SOURCE_USER = 1
_SOURCE_OPTIMIZER = 2
_SOURCE_RUN = 5
_SOURCE_LIMIT = 6


def mark(value):
    """Writes a step boundary (MARKER) into the agent ring: call it once per
    training or inference step with the step number. Optional: without it,
    optimizer steps are found by PyTorch's optimizer step hooks, and other
    loops by the dashboard from the allocation pattern; with it, mark()
    wins. Cheap; does nothing when not attached. Never raises."""
    _mark(value, _SOURCE_USER, 0)


def new_run():
    """Says that the job starts over (a new run): step counts and leak
    verdicts start again. Never raises."""
    _mark(0, _SOURCE_RUN, 0)


def _mark(value, source, arg):
    try:
        v = int(value) & ((1 << 64) - 1)
        if _st["forked"]:
            return
        a = _st["attrib"]
        if a is not None and (source == _SOURCE_USER or (source == _SOURCE_OPTIMIZER and arg == 1)):
            a.step()
        if _st["mode"] == "exact" and _st["lib"] is not None:
            if _st["mark_from"] is not None:
                _st["mark_from"](v, source, arg)
            elif source == _SOURCE_USER:
                _st["lib"].vs_agent_mark(v)
        elif _st["mode"] == "sampled" and _st["sampler"] is not None:
            _st["sampler"].mark(v, source, arg)
        if source in (_SOURCE_USER, _SOURCE_OPTIMIZER):
            _report_limit()
    except Exception as e:
        _warn("step markers disabled: %s" % e, key="mark")


def _report_limit():
    """Writes the most the allocator may reserve (MARKER source 6, FORMAT.md)
    when it is new or changed: the current device's memory times the
    process's memory fraction (torch.cuda.set_per_process_memory_fraction),
    for the dashboard's out-of-memory forecast. Checked at each step
    boundary (two cheap calls into torch). Never raises."""
    try:
        if _st["mode"] != "exact" or _st["mark_from"] is None or _st["forked"]:
            return
        t = sys.modules.get("torch")
        if t is None or not t.cuda.is_initialized():
            return
        d = t.cuda.current_device()
        total = int(t.cuda.get_device_properties(d).total_memory)
        get = getattr(getattr(t.cuda, "memory", None), "get_per_process_memory_fraction", None)
        f = float(get(d)) if get is not None else 1.0
        whole = not (0.0 < f < 1.0)
        limit = total if whole else int(f * total)
        key = (d, limit, whole)
        if _st["limit"] == key:
            return
        _st["limit"] = key
        _st["mark_from"](limit, _SOURCE_LIMIT, d | (int(whole) << 32))
    except Exception:
        pass


class _OptimizerSteps:
    """A global optimizer step post-hook (torch.optim.optimizer.
    register_optimizer_step_post_hook): each optimizer.step() of any
    optimizer writes a step boundary, numbered per optimizer in the order
    they were first seen. Costs one dict lookup and one record per step."""

    def __init__(self):
        self.numbers = {}
        self.counts = {}

    def __call__(self, optimizer, args, kwargs):
        try:
            key = id(optimizer)
            n = self.numbers.get(key)
            if n is None:
                if len(self.numbers) >= 64:  # bounded: ids of dead optimizers
                    self.numbers.clear()
                    self.counts.clear()
                n = self.numbers[key] = len(self.numbers) + 1
            c = self.counts.get(key, 0) + 1
            self.counts[key] = c
            _mark(c, _SOURCE_OPTIMIZER, n)
        except Exception:
            pass


def _hook_optimizer_steps(torch):
    """Installs the optimizer step hook once (VRAMSCOPE_STEP_HOOKS=0 turns it
    off). Never raises: a torch without the hook API just has no such steps."""
    if _st["step_hook"] is not None or os.environ.get("VRAMSCOPE_STEP_HOOKS", "1") == "0":
        return
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _st["step_hook"] = register_optimizer_step_post_hook(_OptimizerSteps())
    except Exception:
        # A torch without the hook API: steps come from mark() or from the
        # allocation pattern; status() says so.
        _st["step_hook"] = False


def _install_attribution(torch):
    """Module, phase and step attribution (vramscope/_attrib.py), unless
    VRAMSCOPE_ATTRIBUTION=0. Never raises."""
    if _st["attrib"] is not None or os.environ.get("VRAMSCOPE_ATTRIBUTION", "1") == "0":
        return
    try:
        from ._attrib import Attribution

        a = Attribution(torch, _warn)
        if a.install():
            _st["attrib"] = a
    except (AttributeError, ImportError):
        pass  # a torch without what it needs: no attribution; status() says so
    except Exception as e:
        _warn("module attribution disabled: %s: %s" % (type(e).__name__, e), key="attrib")


def _torch_abi(t):
    """torch's C++ ABI (1: the C++11 one, also when torch does not say)."""
    try:
        return int(bool(t._C._GLIBCXX_USE_CXX11_ABI))
    except Exception:
        return 1


def _native_attribution(cached_only):
    """Module calls through the native path (fastcall.cpp), built for this
    Python and cached like the tracker. Without Python's headers the Python
    wrapper goes on (slower); status() and the doctor say why. Never raises."""
    a = _st["attrib"]
    if a is None or a.native is not None:
        return
    if os.environ.get("VRAMSCOPE_ATTRIBUTION_NATIVE", "1") == "0":
        a.native_note = NATIVE_OFF
        return
    try:
        t = sys.modules.get("torch")
        abi = _torch_abi(t)
        tf, tv = (getattr(t, "__file__", None), str(getattr(t, "__version__", ""))) if t is not None else (None, None)
        path = _build.build_fast(tf, tv, abi, warn=None, cached_only=cached_only)
        if path is None:
            return
        try:
            fast = _build.load_fast(path)
        finally:
            _build.discard_fresh()
        a.use_native(fast)
    except _build.BuildError as e:
        a.native_note = str(e)
    except Exception as e:
        a.native_note = "%s: %s" % (type(e).__name__, e)


def _drop_attribution():
    a = _st["attrib"]
    _st["attrib"] = None
    if a is not None:
        try:
            a.remove()
        except Exception:
            pass


class _Starter(threading.Thread):
    """Starts a mode once CUDA is initialised. The job never compiles
    anything: the tracker is built before it (``vramscope run``, ``vramscope
    agent build``) or, when it was not, by a detached builder
    (``vramscope._ensure``) that outlives the job; the job runs in sampled
    mode meanwhile and turns exact when the build is there."""

    def __init__(self, torch, label, mode, shm_dir):
        super().__init__(name="vramscope-start", daemon=True)
        self.torch = torch
        self.label = label
        self.mode = mode
        self.shm_dir = shm_dir or os.environ.get("VRAMSCOPE_SHM_DIR") or None
        self.cuda_ready = threading.Event()
        self.poll_init = False
        self.builder = None  # the detached builder's Popen, while it runs

    def run(self):
        try:
            self._run()
        except Exception as e:
            if _st["mode"] == "pending":
                _st["mode"] = "failed"
            _warn("disabled: %s: %s" % (type(e).__name__, e), key="attach")
        self._settle()

    def _settle(self):
        if _st["mode"] != "exact":
            _drop_attribution()  # nothing to tag for
        else:
            _native_attribution(cached_only=True)

    def run_inline(self):
        """attach() after CUDA is initialised: exact at once when the
        tracker is cached, else the rest (sampled, the detached build) on
        the starter thread: never blocks the caller for a build."""
        try:
            if self._try_now():
                self._settle()
                return
        except Exception as e:
            if _st["mode"] == "pending":
                _st["mode"] = "failed"
            _warn("disabled: %s: %s" % (type(e).__name__, e), key="attach")
            return
        self.start()

    def on_cuda_init(self):
        """torch.cuda's lazy initialisation calls this right after CUDA is
        initialised, on the thread that initialised it (often inside
        model.cuda()). With the tracker already built (cached), start it
        here, before the first tensor is copied, so that everything the job
        allocates is seen and attributed; else the starter thread goes on.
        Never raises (an exception here would fail torch's initialisation)."""
        try:
            self.cuda_ready.set()
            if self.mode == "sampled" or _st["forked"] or _st["mode"] != "pending":
                return
            lib_path = self._cached()
            if not lib_path:
                return
            with _lock:
                if _st["mode"] == "pending" and not _st["forked"] and not _st["closing"]:
                    self._start_exact(lib_path, at_init=True)
        except Exception:
            pass  # the starter thread tries again and says why

    def _cached(self):
        t = self.torch
        variant = os.environ.get("VRAMSCOPE_VARIANT", "")
        return _build.build(t.__file__, t.__version__, _torch_abi(t), variant, cached_only=True)

    def _why_not_exact(self):
        """Why exact mode is out of reach for good (None: it is not)."""
        if self.mode == "sampled":
            return "VRAMSCOPE_MODE=sampled"
        # An allocator other than the native one (cudaMallocAsync, a
        # pluggable one) refuses trackers.
        try:
            backend = self.torch.cuda.get_allocator_backend()
        except Exception:
            backend = "native"
        if backend != "native":
            return "the allocator (%s) refuses trackers" % backend
        return None

    def _wait_cuda(self):
        while not self.cuda_ready.wait(0.5):
            if _st["forked"] or _st["mode"] != "pending":
                return False
            if self.poll_init:
                try:
                    if self.torch.cuda.is_initialized():
                        self.cuda_ready.set()
                except Exception:
                    return False
        return True

    def _try_now(self):
        """Starts exact mode when the tracker is cached, or sampled mode for
        good when exact is out of reach. True when a mode was settled; False
        when the tracker is still to be built."""
        why = self._why_not_exact()
        lib_path = None
        if why is None:
            try:
                lib_path = self._cached()
            except _build.BuildError as e:
                why = str(e)  # no compiler, no headers: for good
            except Exception as e:
                why = "finding the tracker failed: %s: %s" % (type(e).__name__, e)
        if lib_path is None and why is None:
            t = self.torch
            name = _build.tracker_name(t.__file__, t.__version__, _torch_abi(t), os.environ.get("VRAMSCOPE_VARIANT", ""))
            failed = _build.failed_before(name) if name else None
            if failed is None:
                return False
            why = "%s (an earlier build failed; `vramscope agent build` tries again)" % failed
        # torch sets _initialized after its queued calls: let it finish.
        for _ in range(200):
            try:
                if self.torch.cuda.is_initialized():
                    break
            except Exception:
                break
            threading.Event().wait(0.01)
        with _lock:
            if _st["forked"] or _st["mode"] != "pending" or _st["closing"]:
                return True
            if lib_path:
                rc, why = self._start_exact(lib_path)
                if rc == 0:
                    return True
                if rc not in (-2,):  # only a refusing allocator falls back
                    _st["mode"] = "failed"
                    _st["reason"] = why
                    _warn("disabled: %s" % why)
                    return True
            if self.mode == "exact":
                _st["mode"] = "failed"
                _st["reason"] = why
                _warn("disabled (VRAMSCOPE_MODE=exact): %s" % why)
                return True
            self._start_sampled(why)
        return True

    def _run(self):
        # Wait for CUDA first: a process that never uses CUDA (a spawned
        # DataLoader worker, a CPU-only tool) never builds anything.
        if not self._wait_cuda():
            return
        if self._try_now():
            return
        self._build_detached()

    def _build_detached(self):
        """The tracker is not built: a detached builder builds it (it
        outlives the job, so the next job finds it), sampled mode runs
        meanwhile, and exact mode starts when the build is there."""
        from . import _ensure

        self.builder = _ensure.spawn_detached()
        if self.builder is None:
            with _lock:
                if _st["mode"] == "pending" and not _st["closing"] and not _st["forked"]:
                    self._start_sampled("the tracker is not built and its builder could not start")
            return
        with _lock:
            if _st["mode"] != "pending" or _st["closing"] or _st["forked"]:
                return
            self._start_sampled(
                "the tracker is being built in the background (first run only; process %d); exact once it is built"
                % self.builder.pid,
                building=True,
            )
        while self.builder.poll() is None:
            if _st["closing"] or _st["forked"] or _st["mode"] != "sampled":
                return  # the builder goes on without us
            threading.Event().wait(0.25)
        self.builder = None
        try:
            lib_path = self._cached()
        except Exception:
            lib_path = None
        if not lib_path:
            t = self.torch
            name = _build.tracker_name(t.__file__, t.__version__, _torch_abi(t), os.environ.get("VRAMSCOPE_VARIANT", ""))
            why = (_build.failed_before(name) if name else None) or "the background build did not finish"
            _st["reason"] = why
            _warn("staying in sampled mode: %s" % why, key="late-build")
            return
        self._late_exact(lib_path)

    def _late_exact(self, lib_path):
        """Sampled mode hands over to the tracker: the sampler's segment is
        closed, then the tracker makes its own (same name) and anchors on
        the allocator's state as it attaches (its first snapshot)."""
        with _lock:
            if _st["closing"] or _st["forked"] or _st["mode"] != "sampled":
                return
            s = _st["sampler"]
            if s is not None:
                s.stop(1.0)
            _st["sampler"] = None
            _st["mode"] = "pending"
            if _st["attrib"] is None:
                _install_attribution(self.torch)
            try:
                rc, why = self._start_exact(lib_path)
            except Exception as e:
                rc, why = -5, "starting the tracker failed: %s: %s" % (type(e).__name__, e)
            if rc == 0:
                _warn("exact mode from now on (the tracker was built while the job ran)", key="late-exact")
                return
            _st["mode"] = "pending"
            self._start_sampled(why)

    def _start_exact(self, lib_path, at_init=False):
        """Starts the tracker from `lib_path`: (0, "") or (rc, why).
        `at_init`: called as CUDA started, before the job used the device."""
        import ctypes

        try:
            lib = ctypes.CDLL(lib_path)  # never dlclose'd
        finally:
            # A library built in a fresh private directory (the cache was not
            # private) is not kept: loaded, it no longer needs its file.
            _build.discard_fresh()
        lib.vs_agent_api_version.restype = ctypes.c_int
        if lib.vs_agent_api_version() != 1:
            return -5, "tracker library %s has an unknown API version" % lib_path
        lib.vs_agent_start.restype = ctypes.c_int
        lib.vs_agent_start.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_uint32,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        lib.vs_agent_stop.argtypes = [ctypes.c_int]
        lib.vs_agent_mark.argtypes = [ctypes.c_uint64]
        mark_from = getattr(lib, "vs_agent_mark_from", None)
        if mark_from is not None:
            mark_from.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
        lib.vs_agent_capture.argtypes = [ctypes.c_int]
        lib.vs_agent_enable.argtypes = [ctypes.c_int]
        lib.vs_agent_set_stats_period_ms.argtypes = [ctypes.c_uint32]
        lib.vs_agent_path.restype = ctypes.c_char_p
        lib.vs_agent_ring_head.restype = ctypes.c_int64
        lib.vs_agent_ring_head.argtypes = [ctypes.c_uint32]
        ms = _env_int("VRAMSCOPE_STATS_MS", 100)
        lib.vs_agent_set_stats_period_ms(ms)
        err = ctypes.create_string_buffer(512)
        fw = ("torch " + str(self.torch.__version__)).encode()
        # ctypes releases the GIL for the call: the tracker's first snapshot
        # takes the allocator's locks, never the GIL.
        rc = lib.vs_agent_start(
            fw,
            self.label.encode("utf-8", "replace"),
            self.shm_dir.encode() if self.shm_dir else None,
            _slots(1 + _device_count(self.torch)),
            err,
            len(err),
        )
        why = err.value.decode("utf-8", "replace")
        if why.startswith("vramscope: "):
            why = why[len("vramscope: ") :]
        if rc == 0:
            _st["lib"] = lib
            _st["lib_path"] = lib_path
            _st["mode"] = "exact"
            _st["path"] = lib.vs_agent_path().decode()
            _st["mark_from"] = mark_from
            _report_limit()
            if _st["capturing"] > 0:
                lib.vs_agent_capture(_st["capturing"])
            _hook_optimizer_steps(self.torch)
            a = _st["attrib"]
            if a is not None and not a.connect(lib):
                _drop_attribution()
            _native_attribution(cached_only=True)
            from . import _outside

            _outside.start(lib, self.torch, at_init)
        return rc, why

    def _start_sampled(self, why, building=False):
        from ._sampled import Sampler

        s = Sampler(self.torch, self.label, self.shm_dir)
        try:
            s.create()
        except Exception as e:
            _st["mode"] = "failed"
            _st["reason"] = str(e)
            _warn("disabled: cannot create the segment: %s" % e)
            return
        if s.seg.notice:
            _warn(s.seg.notice)
        _drop_attribution()  # sampled mode sees no events to tag
        _st["sampler"] = s
        _st["mode"] = "sampled"
        _st["path"] = s.seg.path
        _st["reason"] = why
        if building:
            _warn("sampled mode for now (statistics and snapshots, no per-event timeline): %s" % why, key="sampled")
        else:
            _warn("sampled mode (statistics and snapshots, no per-event timeline): %s" % why, key="sampled")
        s.start()
        _hook_optimizer_steps(self.torch)


def _patch_graph_capture(torch):
    """Counts CUDA graph captures so empty_cache is refused during one (a
    cudaFree from the agent thread would invalidate a global-mode capture)."""
    if _st["graph_patched"]:
        return
    try:
        cls = torch.cuda.graphs.CUDAGraph
        begin, end = cls.capture_begin, cls.capture_end
    except Exception:
        return

    def capture_begin(self, *a, **k):
        _capture(1)
        try:
            return begin(self, *a, **k)
        except BaseException:
            _capture(-1)
            raise

    def capture_end(self, *a, **k):
        try:
            return end(self, *a, **k)
        finally:
            _capture(-1)

    try:
        cls.capture_begin = capture_begin
        cls.capture_end = capture_end
        _st["graph_patched"] = True
    except Exception:
        pass


def _capture(delta):
    try:
        with _lock:
            _st["capturing"] = max(0, _st["capturing"] + delta)
        if _st["mode"] == "exact" and _st["lib"] is not None:
            _st["lib"].vs_agent_capture(delta)
    except Exception:
        pass


def _capturing():
    return _st["capturing"] > 0


def _after_fork_child():
    # The tracker's own pthread_atfork handler silences the callback and
    # unmaps the segment in the child; here the Python side lets go too.
    _st["forked"] = True
    _drop_attribution()
    s = _st.get("sampler")
    if s is not None:
        try:
            s.forget()
        except Exception:
            pass
    if _st["mode"] == "pending":
        _st["mode"] = "off"


def _shutdown():
    """atexit, before the interpreter is finalised: no mode starts from now
    on (a build that ends during shutdown is not used), the module hooks
    and the native call path are removed, the tracker's thread is stopped
    and the segment closed (state closed, unlinked). The tracker also stops
    its thread from its own exit handler, before torch's static
    destructors, should this not run. Never raises; bounded."""
    try:
        _st["closing"] = True
        if _st["forked"] or _st["pid"] != os.getpid():
            return
        got = _lock.acquire(timeout=2.0)  # a start under way finishes first
        try:
            _drop_attribution()
            if _st["mode"] == "exact" and _st["lib"] is not None:
                _st["lib"].vs_agent_stop(500)
            elif _st["mode"] == "sampled" and _st["sampler"] is not None:
                _st["sampler"].stop(1.0)
            if _st["mode"] == "pending":
                _st["mode"] = "off"
        finally:
            if got:
                _lock.release()
    except Exception:
        pass


# ---- automatic setup (vramscope run) ------------------------------------------

_watcher = None


def _auto():
    """Called by the sitecustomize of `vramscope run`: attach as soon as torch
    has been imported by the script, without importing it earlier (that
    would change the job: CUDA_VISIBLE_DEVICES, allocator settings, ...)."""
    global _watcher
    try:
        if "torch" in sys.modules and hasattr(sys.modules["torch"], "cuda"):
            attach(wait=False)
            return
        import importlib.abc
        import importlib.util

        class _TorchWatcher(importlib.abc.MetaPathFinder):
            busy = False

            def find_spec(self, name, path=None, target=None):
                if name != "torch" or self.busy:
                    return None
                self.busy = True
                try:
                    spec = importlib.util.find_spec(name)
                except Exception:
                    spec = None
                finally:
                    self.busy = False
                if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None
                orig = spec.loader.exec_module

                def exec_module(module):
                    orig(module)
                    try:
                        sys.meta_path.remove(self)
                    except ValueError:
                        pass
                    attach(wait=False)

                try:
                    spec.loader.exec_module = exec_module
                except Exception:
                    return None
                return spec

        _watcher = _TorchWatcher()
        sys.meta_path.insert(0, _watcher)
    except Exception as e:
        _warn("disabled: %s: %s" % (type(e).__name__, e), key="attach")
