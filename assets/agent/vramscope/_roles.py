"""Role lists: which tensors PyTorch itself holds (crates/wire/src/ring/FORMAT.md, "Roles").

The reader can say of each live block whether it is a parameter, a buffer,
a gradient or optimizer state, and of which module, only if it knows the
addresses of those tensors. This module walks what PyTorch holds:

- each named model's modules (the roots Attribution.name_tree named):
  ``_parameters``, ``_buffers`` and each parameter's ``.grad``;
- each optimizer that stepped: ``optimizer.state`` (tensors per parameter,
  named by the parameter's module);
- DTensors (FSDP2's shards) by their local tensor (``_local_tensor``:
  the DTensor itself has no storage).

and hands the list to the tracker (``vs_agent_roles``), which writes it as
ROLES, ROLE..., ROLES_END and keeps it to send again with every snapshot.

When: at the first three step boundaries, at a step boundary a second or
more after the last list, at the next boundary after the model moved
(``Module._apply``: ``.to()``, ``.cuda()``, ``.half()``) or a new model was
named, or after the tracker wrote a snapshot (a reader attached: the list
the tracker sends with the snapshot is the last walk); never more often
than every 100 ms. A walk of GPT-2 small (148 parameters, their
gradients, Adam's state: about 600 tensors) takes well under a millisecond
of Python, so the cost is bounded by the once-a-second rule.

While boundaries come, the job's own thread walks, at a boundary: a
snapshot only marks the list stale. Only where no step boundary came for
two seconds, and for three of the job's longest recent steps (inference
loops, a job between phases; a model whose steps take seconds is not
between phases between two of them), does a background thread walk
instead: when two seconds pass with no list while a model exists, and
within a quarter of a second of a snapshot. Nor does it walk once backward
has run (an autograd thread met attribution's hooks) before the first
boundary: that is a training job's first step. A walk from another thread
while the job trains reads tensors that backward and the optimizer are
changing without the GIL, a data race inside PyTorch: it crashed real jobs
(a segfault in ``data_ptr``, 7 of 16 transformers jobs on one GPU, with a
watcher asking for snapshots every few seconds).

Bounded: at most MAX_TENSORS tensors a list (the rest counted in DROPPED
7). Never raises into the job: a failure turns role lists off with one
``vramscope:`` line. Models and optimizers are held weakly.
"""

import array
import ctypes
import os
import threading
import time
import weakref

PARAMETER, BUFFER, GRADIENT, OPTIMIZER_STATE = 1, 2, 3, 4
_DROP_ROLES = 7
MAX_TENSORS = 16384
FIRST_STEPS = 3
EVERY = 1.0  # seconds between lists at step boundaries
IDLE = 2.0  # seconds with no list before the background thread writes one
QUIET = 2.0  # seconds with no step boundary before the background thread may walk
QUIET_STEPS = 3  # ... and at least this many of the job's longest recent steps
POLL = 0.25  # how often the background thread looks
MIN_GAP = 0.1
TRANSIENT = 3  # walks in a row that may fail with RuntimeError


class Roles:
    def __init__(self, attrib):
        self.attrib = attrib
        self.torch = attrib.torch
        self.lib = None
        self.roots = weakref.WeakSet()
        self.optimizers = weakref.WeakSet()
        self.steps = 0
        self.last_step = None  # when the last step boundary came
        self.step_gap = 0.0  # the longest recent time between two boundaries
        self.dirty = True
        self.last = 0.0
        self.lists = 0
        self.failed = False
        self.transient = 0  # RuntimeErrors in a row
        self.walk_s = 0.0  # the last walk's time, for status and benchmarks
        self.lock = threading.Lock()
        self.thread = None
        self.pid = os.getpid()

    def connect(self, lib):
        """The tracker is started: lists can be written (False when this
        tracker has no role lists)."""
        if not hasattr(lib, "vs_agent_roles"):
            return False
        lib.vs_agent_roles.restype = ctypes.c_uint32
        lib.vs_agent_roles.argtypes = [ctypes.c_void_p, ctypes.c_uint64]
        self.snapshots = getattr(lib, "vs_agent_snapshots", None)
        if self.snapshots is not None:
            self.snapshots.restype = ctypes.c_uint32
            self.snapshots.argtypes = []
        self.lib = lib
        return True

    # ---- what the job does ------------------------------------------------

    def root(self, module):
        """A model was named: walk it at the next boundary."""
        if module not in self.roots:
            self.roots.add(module)
            self.dirty = True
            self._start_thread()

    def unroot(self, modules):
        """`modules` lie inside a model that was named: none is a model of
        its own. (Attribution installed while a forward ran, after a late
        start or an attach, sees that forward's inner modules first and
        takes them for roots; walked first, a tied weight would be named by
        the inner module, GPT-2's embedding by `lm_head`.)"""
        for m in modules:
            if m in self.roots:
                self.roots.discard(m)
                self.dirty = True

    def optimizer(self, optimizer):
        if optimizer not in self.optimizers:
            self.optimizers.add(optimizer)
            self.dirty = True

    def moved(self):
        self.dirty = True

    def at_step(self):
        """A step boundary."""
        self.steps += 1
        now = time.monotonic()
        if self.last_step is not None:
            # The longest recent step (an old long one fades by a tenth a step).
            self.step_gap = max(self.step_gap * 0.9, now - self.last_step)
        self.last_step = now
        if self.steps <= FIRST_STEPS or self.dirty or now - self.last >= EVERY:
            self.refresh(now)

    # ---- the list -----------------------------------------------------------

    def refresh(self, now=None):
        if self.lib is None or self.failed:
            return
        now = time.monotonic() if now is None else now
        if now - self.last < MIN_GAP or not self.lock.acquire(blocking=False):
            self.dirty = True  # (written at a later boundary)
            return
        try:
            self.last = now
            self.dirty = False
            t0 = time.perf_counter()
            words, dropped = self.collect()
            self.walk_s = time.perf_counter() - t0
            n = len(words) // 5
            if dropped:
                self.lib.vs_agent_count_dropped(_DROP_ROLES, dropped)
            ptr = words.buffer_info()[0] if n else None
            if self.lib.vs_agent_roles(ptr, n):
                self.lists += 1
            self.transient = 0
        except RuntimeError as e:
            # The job changed a module or an optimizer while the background
            # thread walked it ("dictionary changed size during
            # iteration"): walk again later; only a walk that keeps failing
            # turns role lists off.
            self.transient += 1
            self.dirty = True
            if self.transient >= TRANSIENT:
                self.fail(e)
        except Exception as e:
            self.fail(e)
        finally:
            self.lock.release()

    def collect(self):
        """The tensors held now: array('Q') of (device, address, bytes,
        role, module path id) per tensor, and how many were left out."""
        words = array.array("Q")
        seen = set()
        infos = self.attrib.infos
        owner = {}  # id(parameter) -> module path id, for optimizer state
        dropped = 0

        def add(t, role, pid):
            nonlocal dropped
            # A DTensor (FSDP2's shards, tensor parallelism) holds no
            # storage of its own: its local tensor does.
            inner = getattr(t, "_local_tensor", None)
            if inner is not None:
                t = inner
            if not t.is_cuda:
                return
            ptr, nbytes = t.data_ptr(), t.nbytes
            if nbytes == 0 or ptr == 0 or (ptr, role) in seen:
                return  # (a tied weight: named by its first module)
            if len(words) >= 5 * MAX_TENSORS:
                dropped += 1
                return
            seen.add((ptr, role))
            words.extend((t.get_device(), ptr, nbytes, role, pid))

        for root in list(self.roots):
            for _, m in root.named_modules():
                info = infos.get(id(m))
                pid = info[0] if info is not None else 0
                for p in list(m._parameters.values()):
                    if p is None:
                        continue
                    owner.setdefault(id(p), pid)
                    add(p, PARAMETER, pid)
                    g = p.grad
                    if g is not None:
                        add(g, GRADIENT, pid)
                for b in list(getattr(m, "_buffers", {}).values()):
                    if b is not None:
                        add(b, BUFFER, pid)
        tensor = self.torch.Tensor
        for opt in list(self.optimizers):
            for p, state in list(opt.state.items()):
                pid = owner.get(id(p), 0)
                for v in list(state.values()):
                    if isinstance(v, tensor):
                        add(v, OPTIMIZER_STATE, pid)
        return words, dropped

    # ---- inference loops --------------------------------------------------

    def _start_thread(self):
        if self.thread is not None:
            return
        try:
            t = threading.Thread(target=self._idle, name="vramscope-roles", daemon=True)
            t.start()
            self.thread = t
        except Exception:
            self.thread = False

    def _idle(self):
        pid = self.pid
        seen = None
        while not self.failed and os.getpid() == pid:
            time.sleep(POLL)
            a = self.attrib
            on = a.roles is self and a.installed  # (attribution removed: no lists)
            if not on or self.lib is None or not len(self.roots):
                continue
            # A snapshot was written (a reader attached): the list sent
            # with it is the last walk; walk again.
            snaps = self.snapshots() if self.snapshots is not None else None
            snapped = snaps != seen and seen is not None
            seen = snaps
            if snapped:
                self.dirty = True
            now = time.monotonic()
            quiet = max(QUIET, QUIET_STEPS * self.step_gap)
            if self.last_step is not None and now - self.last_step < quiet:
                continue  # boundaries come: the next one walks (dirty)
            if self.last_step is None and len(a.backward_threads):
                continue  # backward ran, no boundary yet: a first step; its end walks
            if snapped or now - self.last >= IDLE:
                self.refresh()

    def fail(self, e):
        if self.failed:
            return
        self.failed = True
        try:
            self.attrib.warn("role lists disabled: %s: %s" % (type(e).__name__, e), "roles")
        except Exception:
            pass
