"""Device memory outside PyTorch's caching allocator (FORMAT.md 1.3): the
CUDA context and what libraries (NCCL, cuBLAS, cuDNN, ...) take from the
driver, named by outside.cpp through CUPTI beside the tracker.

``start`` starts outside.cpp (against the CUPTI torch loads; built ahead
by ``vramscope run`` and ``agent build``, else on a thread of its own, a
second or two) with the tracker's record writer: as CUDA starts, where it
is built, so that nothing but the context precedes it. It measures what
each device held outside the allocator as it began (NVML's bytes for this
process - the allocator's reserved - what outside.cpp names) and hands it
over: the context, or "context and earlier" where it began later, and makes torch.profiler and outside.cpp take turns: CUPTI
takes one client before 13.2, and the profiler gets no CUDA events while
another holds it. Before a profile starts outside.cpp steps aside; after it
ends it subscribes again, or, where the profiler kept CUPTI (it does), says
once that the figures stay as they were.

Never raises into the job. ``VRAMSCOPE_OUTSIDE=0`` turns it off.
"""

import ctypes
import os
import sys
import threading

from . import _build
from ._segment import OUT_BEFORE, OUT_CONTEXT

_st = {"lib": None, "write": None, "note": "not started", "aside": False, "profiling": False, "retrying": False,
       "warned": set()}
_lock = threading.Lock()
# How often the accounting tries to come back after a profile while CUPTI
# is still held (Kineto gives it back only with TEARDOWN_CUPTI=1, and then
# a moment after the profile ends).
RETRY_S = 2.0
# How long the context's measurement waits for NVML to list this process
# (CUDA creates the context at the first call that needs it, after torch's
# initialisation, where the accounting begins).
CONTEXT_WAIT_S = 60.0
# Tries after a profile before saying that CUPTI is still held where
# TEARDOWN_CUPTI=1 should have given it back.
HELD_TRIES = 5


def status():
    """True while outside.cpp runs; else why not (a string)."""
    return True if _st["lib"] is not None and not _st["aside"] else _st["note"]


def _warn(msg, key):
    if key in _st["warned"]:
        return
    _st["warned"].add(key)
    try:
        sys.stderr.write("vramscope: %s\n" % msg)
    except Exception:
        pass


def start(tracker, torch, at_init=False):
    """Starts the accounting beside `tracker` (the tracker's ctypes library).
    `at_init`: called as CUDA started (torch's lazy initialisation, before
    the job's first kernel or library call): where outside.cpp is built
    already, it subscribes at once, so that what it measures then is the
    context alone; else (not built yet, or a late start) on a daemon
    thread, and what it measures is "context and earlier" (FORMAT kind 9:
    libraries may have taken some of it before it watched). Never
    raises."""
    if os.environ.get("VRAMSCOPE_OUTSIDE", "1") == "0":
        _st["note"] = "off (VRAMSCOPE_OUTSIDE=0)"
        return
    write = getattr(tracker, "vs_agent_write_record", None)
    if write is None:
        _st["note"] = "the tracker has no record writer (an older build)"
        return
    _st["note"] = "starting"
    _st["write"] = ctypes.cast(write, ctypes.c_void_p)
    lib = None
    if at_init:
        try:
            path = _build.build_outside(cached_only=True)
            lib = _load(path) if path else None
            if lib is not None and not _subscribed(lib):
                return
        except Exception:
            lib = None  # the thread tries again and says why
    t = threading.Thread(target=_start, args=(lib, torch), name="vramscope-outside", daemon=True)
    t.start()


def _load(path):
    """outside.cpp's library at `path`, its functions typed; None when it
    is of another API version."""
    lib = ctypes.CDLL(path)  # never dlclose'd
    lib.vs_outside_api_version.restype = ctypes.c_int
    if lib.vs_outside_api_version() != 4:
        _st["note"] = "outside.cpp has an unknown API version"
        return None
    lib.vs_outside_start.restype = ctypes.c_int
    lib.vs_outside_start.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.vs_outside_stop.restype = ctypes.c_int
    lib.vs_outside_context.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_int]
    lib.vs_outside_named.restype = ctypes.c_uint64
    lib.vs_outside_named.argtypes = [ctypes.c_int]
    lib.vs_outside_alone.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.vs_outside_nvml_device.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return lib


def _subscribed(lib):
    """Subscribes `lib`: True when it runs; else says why (once)."""
    with _lock:
        rc, why = _subscribe(lib)
        if rc != 0:
            _st["note"] = "CUPTI: %s" % why
            _warn("memory outside the caching allocator is not named: CUPTI %s" % why, "start")
            return False
        _st["lib"] = lib
        _st["note"] = "running"
        return True


def _start(lib, torch):
    """The rest of the start on its own thread: `lib` already subscribed
    as CUDA started, or None (built or loaded and subscribed now)."""
    try:
        at_init = lib is not None
        if lib is None:
            lib = _load(_build.build_outside())
            if lib is None or not _subscribed(lib):
                return
        _patch_profiler(torch)
        alone = _Alone(torch)
        alone.hand_over(lib)
        alone.tell(lib)
        alone.watch(lib)
        _measure_contexts(lib, torch, at_init)
    except _build.BuildError as e:
        _st["note"] = str(e)
    except Exception as e:
        _st["note"] = "%s: %s" % (type(e).__name__, e)
    finally:
        _build.discard_fresh()


def _subscribe(lib):
    why = ctypes.create_string_buffer(256)
    rc = lib.vs_outside_start(_st["write"], why, len(why))
    return rc, why.value.decode("utf-8", "replace") or ("error %d" % rc)


# ---- the CUDA context, by NVML ------------------------------------------


class _Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


def _nvml():
    """NVML's library, initialised (None without NVML)."""
    try:
        nv = ctypes.CDLL("libnvidia-ml.so.1")
        return nv if nv.nvmlInit_v2() == 0 else None
    except OSError:
        return None


def _nvml_processes(nv, handle):
    """{pid: bytes} of NVML's processes on the GPU `handle` (None: unknown)."""
    n = ctypes.c_uint(256)
    arr = (_Proc * 256)()
    if nv.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(n), arr) != 0:
        return None
    return {arr[i].pid: int(arr[i].used) for i in range(min(n.value, 256))}


def _nvml_used(nv, handle):
    """NVML's bytes for this process on the GPU `handle` (None: unknown)."""
    procs = _nvml_processes(nv, handle)
    return None if procs is None else procs.get(os.getpid())


def _nvml_handle(nv, torch, d):
    """The NVML handle of torch's device `d`: by its UUID, else by index
    when no CUDA_VISIBLE_DEVICES renumbers them."""
    h = ctypes.c_void_p()
    try:
        uuid = str(torch.cuda.get_device_properties(d).uuid)
        u = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
        if nv.nvmlDeviceGetHandleByUUID(u.encode(), ctypes.byref(h)) == 0:
            return h
    except Exception:
        pass
    if not os.environ.get("CUDA_VISIBLE_DEVICES") and nv.nvmlDeviceGetHandleByIndex_v2(d, ctypes.byref(h)) == 0:
        return h
    return None


def contexts_by_nvml(torch, named=lambda d: 0):
    """{device: bytes} for each device this process uses: NVML's bytes -
    reserved - `named(device)`, the least of three readings (an allocation
    between two readings only makes one too large). Empty without NVML."""
    nv = _nvml()
    if nv is None:
        return {}
    import time

    out = {}
    for d in range(torch.cuda.device_count()):
        h = _nvml_handle(nv, torch, d)
        if h is None:
            continue
        best = None
        for _ in range(3):
            used = _nvml_used(nv, h)
            if used is None:
                break
            ctx = used - int(torch.cuda.memory_reserved(d)) - int(named(d))
            best = ctx if best is None else min(best, ctx)
            time.sleep(0.05)
        if best is not None and best > 0:
            out[d] = best
    return out


class _Alone:
    """Tells outside.cpp, every second, on which devices this process is
    NVML's only process: there it reads the device's free memory; where
    another process shares the device (whose allocations move that figure
    too), NVML's bytes for this process, through the handle handed over
    here. Nothing is measured without NVML, nor where NVML does not list
    this process by its pid (a container with its own pid namespace)."""

    def __init__(self, torch):
        self.handles = {}
        self.nv = _nvml()
        if self.nv is not None:
            for d in range(min(torch.cuda.device_count(), 8)):
                h = _nvml_handle(self.nv, torch, d)
                if h is not None:
                    self.handles[d] = h

    def hand_over(self, lib):
        for d, h in self.handles.items():
            lib.vs_outside_nvml_device(d, h)

    def tell(self, lib):
        me = {os.getpid()}
        for d, h in self.handles.items():
            procs = _nvml_processes(self.nv, h)
            lib.vs_outside_alone(d, 1 if procs is not None and set(procs) == me else 0)

    def watch(self, lib):
        if not self.handles:
            return
        import time

        def loop():
            while True:
                time.sleep(1.0)
                try:
                    self.tell(lib)
                except Exception:
                    return

        threading.Thread(target=loop, name="vramscope-alone", daemon=True).start()


def _measure_contexts(lib, torch, at_init, wait_s=None):
    """What each device held outside the allocator as the accounting began
    (its named parts taken off), handed to outside.cpp: the context where
    it began as CUDA started (outside.cpp has followed every call since),
    else "context and earlier". CUDA creates the context after torch's
    initialisation, at the first call that needs it, and NVML lists the
    process only then: until it does (or lists less than is reserved and
    named), read again every 0.25 s, CONTEXT_WAIT_S at most."""
    import time

    deadline = time.monotonic() + (CONTEXT_WAIT_S if wait_s is None else wait_s)
    while True:
        got = contexts_by_nvml(torch, lambda d: lib.vs_outside_named(d))
        if got or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    for d, nbytes in got.items():
        lib.vs_outside_context(d, nbytes, OUT_CONTEXT if at_init else OUT_BEFORE)


def untouched(torch, d):
    """True when torch's allocator has made no allocation on device `d` yet:
    no tensor, so no kernel and no library call has run there, and what the
    process holds outside the allocator is the CUDA context alone (sampled
    mode's test of its measurement; False when unknown)."""
    try:
        return int(torch.cuda.memory_stats(d).get("allocation.all.allocated", 0)) == 0
    except Exception:
        return False


# ---- taking turns with torch.profiler ------------------------------------


def _patch_profiler(torch):
    """torch.autograd.profiler calls _prepare_profiler before a profile
    (torch.profiler.profile too) and _disable_profiler at its end: outside.cpp
    steps aside before, and comes back after."""
    try:
        ap = torch.autograd.profiler
    except Exception:
        return
    prep = getattr(ap, "_prepare_profiler", None)
    disable = getattr(ap, "_disable_profiler", None)
    if prep is None or disable is None or getattr(prep, "_vramscope", False):
        return

    def prepare(*a, **k):
        _step_aside()
        return prep(*a, **k)

    def stop(*a, **k):
        try:
            return disable(*a, **k)
        finally:
            _come_back()

    prepare._vramscope = True
    stop._vramscope = True
    ap._prepare_profiler = prepare
    ap._disable_profiler = stop


def _step_aside():
    try:
        with _lock:
            lib = _st["lib"]
            _st["profiling"] = True
            if lib is None or _st["aside"]:
                return
            lib.vs_outside_stop()
            _st["aside"] = True
            _st["note"] = "stepped aside for torch.profiler"
    except Exception:
        pass


def _come_back():
    """After a profile: subscribes again; where CUPTI is still held (before
    CUPTI 13.2 it takes one client, and Kineto keeps it unless
    TEARDOWN_CUPTI=1), tries again every RETRY_S seconds on a daemon
    thread, until it is back or the next profile starts. It says so once:
    at once without TEARDOWN_CUPTI=1 (naming it); with it (Kineto gives
    CUPTI back at the job's next CUDA call) only when CUPTI is still held
    after HELD_TRIES tries."""
    try:
        with _lock:
            _st["profiling"] = False
            if not _try_back():
                if not _teardown():
                    _warn_held(
                        "(%s; before CUPTI 13.2 it takes one client). With TEARDOWN_CUPTI=1 torch.profiler "
                        "gives it back after a profile, and the accounting comes back then" % _st["why"]
                    )
                if not _st["retrying"]:
                    _st["retrying"] = True
                    threading.Thread(target=_retry, name="vramscope-outside-back", daemon=True).start()
    except Exception:
        pass


def _try_back():
    """Subscribes again after a profile (under _lock): True when running
    (or nothing to do)."""
    lib = _st["lib"]
    if lib is None or not _st["aside"]:
        return True
    rc, why = _subscribe(lib)
    if rc == 0:
        _st["aside"] = False
        _st["note"] = "running"
        return True
    _st["why"] = why
    _st["note"] = (
        "stepped aside after torch.profiler: CUPTI is still held (%s); it comes back when CUPTI is "
        "given back (TEARDOWN_CUPTI=1); the figures stay as they were" % why
    )
    return False


def _warn_held(why):
    """Says once that CUPTI is still held after a profile, and `why`."""
    _warn(
        "memory outside the caching allocator is not followed after torch.profiler: CUPTI is still held " + why,
        "profiler",
    )


def _teardown():
    """Whether torch.profiler gives CUPTI back after a profile."""
    return os.environ.get("TEARDOWN_CUPTI") == "1"


def _retry():
    import time

    tries = 0
    try:
        while True:
            time.sleep(RETRY_S)
            with _lock:
                if _st["profiling"]:
                    continue
                if _try_back():
                    _st["retrying"] = False
                    return
                tries += 1
                if tries == HELD_TRIES and _teardown():
                    _warn_held(
                        "(%s) %d tries after the profile, although TEARDOWN_CUPTI=1; it comes back when CUPTI "
                        "is given back" % (_st["why"], tries)
                    )
    except Exception:
        _st["retrying"] = False
