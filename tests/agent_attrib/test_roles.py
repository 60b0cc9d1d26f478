"""vramscope/_roles.py with no torch and no GPU: the real Attribution and
Roles against the stand-in torch in fake_torch/ and a stand-in tracker that
keeps each role list it is handed. Run by tests/agent_attrib.rs; prints
"ok ..." lines, raises on a failure."""

import ctypes
import threading
import time

import test_attrib  # (its stand-in tracker; its checks run only as a script)
import torch
from torch import nn
from torch.optim.optimizer import Optimizer

from vramscope import _roles
from vramscope._attrib import Attribution

NAMES = {1: "parameter", 2: "buffer", 3: "gradient", 4: "optimizer_state"}


class Lib(test_attrib.Lib):
    """test_attrib.py's stand-in tracker, which also keeps each role list
    it is handed and counts snapshots as the tracker does."""

    def __init__(self):
        super().__init__()
        self.lists = []
        self.threads = []  # the thread that handed each list
        self.snaps = 0

    def vs_agent_snapshots(self):
        return self.snaps

    def vs_agent_roles(self, ptr, n):
        words = list((ctypes.c_uint64 * (5 * n)).from_address(ptr)) if n else []
        rows = []
        for i in range(n):
            dev, addr, nbytes, role, module = words[5 * i : 5 * i + 5]
            rows.append((dev, addr, nbytes, NAMES[role], self.strings.get(module, "") if module else None))
        self.lists.append(rows)
        self.threads.append(threading.current_thread())
        return len(self.lists)


class Cuda:
    """A CUDA tensor as the walk reads one."""

    _next = [0x7F0000000000]

    def __init__(self, nbytes, device=0, cuda=True, at=None):
        self.nbytes = nbytes
        self.is_cuda = cuda
        self.device = device
        self.grad = None
        if at is None:
            at = Cuda._next[0]
            Cuda._next[0] += 1 << 20
        self.addr = at

    def data_ptr(self):
        return self.addr

    def get_device(self):
        return self.device if self.is_cuda else -1


torch.Tensor = Cuda  # (optimizer state values are tensors: isinstance)


class Linear(nn.Module):
    def __init__(self, n):
        super().__init__()
        object.__setattr__(self, "_buffers", {})
        self._parameters["weight"] = Cuda(n)
        self._buffers["running"] = Cuda(64)
        self._buffers["cpu"] = Cuda(64, cuda=False)

    def forward(self, x):
        return x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Linear(4096)
        self.layers = nn.ModuleList([Linear(1024), Linear(2048)])
        self.head = Linear(8)
        self.head._parameters["weight"] = self.embed._parameters["weight"]  # tied

    def forward(self, x):
        x = self.embed(x)
        for m in self.layers:
            x = m(x)
        return self.head(x)


class Adam(Optimizer):
    def __init__(self, params):
        self.params = list(params)
        self.state = {}

    def work(self):
        for p in self.params:
            if p not in self.state:
                self.state[p] = {"step": 1, "exp_avg": Cuda(p.nbytes), "exp_avg_sq": Cuda(p.nbytes)}


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok " + what)


def by_role(rows):
    out = {}
    for dev, addr, nbytes, role, module in rows:
        out.setdefault(role, []).append((module, nbytes))
    return out


def installed_mid_forward():
    """Attribution installed while a forward runs (a late start, an
    attach): an inner module is called before the model's own call is ever
    seen, and taken for a root; once the model is named, it is not one,
    and a tied weight is named by the model's first module (as torch's
    named_modules order has it), not by the inner one."""
    a = Attribution(torch, lambda msg, key=None: None)
    check(a.install(), "(mid-forward) the hooks install")
    lib = Lib()
    a.connect(lib)
    model = Net()
    model.head(None)  # the rest of a forward that began before the install
    model(None)  # the next forward: the model is named
    a.step()
    got = by_role(lib.lists[-1])
    check(("embed", 4096) in got["parameter"] and ("head", 4096) not in got["parameter"],
          "installed mid-forward, a tied weight is named by the model's first module: %s" % got["parameter"])
    check(model.head not in a.roles.roots and model in a.roles.roots, "an inner module taken for a root is a root no more")
    a.remove()


def main():
    installed_mid_forward()
    warnings = []
    a = Attribution(torch, lambda msg, key=None: warnings.append(msg))
    check(a.install(), "the hooks install")
    lib = Lib()
    check(a.connect(lib) and a.roles is not None and a.roles.lib is lib, "a tracker with role lists connects them")
    model = Net()
    model(None)  # names the tree: a root for role lists
    a.step()
    check(len(lib.lists) == 1, "the first step boundary writes a list")
    got = by_role(lib.lists[-1])
    check(sorted(got["parameter"]) == [("embed", 4096), ("layers.0", 1024), ("layers.1", 2048)],
          "parameters by their module, a tied weight once, by its first module: %s" % got["parameter"])
    check(len(got["buffer"]) == 4 and all(n == 64 for _, n in got["buffer"]),
          "CUDA buffers of each module, CPU ones left out: %s" % got["buffer"])
    # Backward made gradients; an optimizer stepped and made its state.
    l0, l1 = list(model.layers)
    for m in (model.embed, l0, l1):
        m._parameters["weight"].grad = Cuda(m._parameters["weight"].nbytes)
    opt = Adam([m._parameters["weight"] for m in (model.embed, l0, l1)])
    opt.step(work=opt.work)
    a.step()
    check(len(lib.lists) == 1, "never two lists within 100 ms")
    time.sleep(0.15)
    a.step()
    got = by_role(lib.lists[-1])
    check(len(lib.lists) == 2 and sorted(got["gradient"]) == [("embed", 4096), ("layers.0", 1024), ("layers.1", 2048)],
          "gradients by their parameter's module")
    check(sorted(got["optimizer_state"]) == sorted([("embed", 4096)] * 2 + [("layers.0", 1024)] * 2
                                                   + [("layers.1", 2048)] * 2),
          "optimizer state by its parameter's module (non-tensor state left out)")
    time.sleep(0.15)
    a.step()
    n = len(lib.lists)
    time.sleep(0.15)
    a.step()
    check(len(lib.lists) == n, "after the first steps, no list within a second of the last")
    time.sleep(0.15)
    model._apply(lambda p: p)  # .to(): the parameters may have moved
    a.step()
    check(len(lib.lists) == n + 1, "the model moved: a list at the next boundary")
    a.roles.last -= _roles.EVERY
    a.step()
    check(len(lib.lists) == n + 2, "a boundary a second after the last list writes one")
    # The bound.
    old = _roles.MAX_TENSORS
    _roles.MAX_TENSORS = 5
    a.roles.last -= _roles.EVERY
    a.step()
    _roles.MAX_TENSORS = old
    total = 3 + 3 + 6 + 4
    check(len(lib.lists[-1]) == 5 and lib.dropped.get(7) == total - 5,
          "a list is bounded and what is left out is counted (DROPPED 7): %s" % lib.dropped)
    # Inference: no step boundaries; the background thread writes a list.
    _roles.IDLE = 0.3
    _roles.QUIET = 0.3
    n = len(lib.lists)
    deadline = time.monotonic() + 5
    while len(lib.lists) == n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(lib.lists) > n, "with no step boundary for a while, the background thread writes a list")
    _roles.IDLE = 3600.0
    time.sleep(0.6)
    # A reader attached (the tracker wrote a snapshot): a fresh list soon.
    n = len(lib.lists)
    lib.snaps += 1
    deadline = time.monotonic() + 5
    while len(lib.lists) == n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(lib.lists) == n + 1, "a snapshot written (a reader attached) is followed by a fresh list")
    check(lib.threads[-1] is not threading.main_thread(), "with no step boundary, the background thread walks")
    # While step boundaries come, a snapshot makes no walk from the
    # background thread (one while the job trains races with backward
    # inside PyTorch): the next boundary walks, on the job's own thread.
    _roles.QUIET = 2.0
    time.sleep(0.15)
    a.step()
    n = len(lib.lists)
    lib.snaps += 1
    time.sleep(0.6)
    check(len(lib.lists) == n, "while boundaries come, a snapshot makes no walk from the background thread")
    a.step()
    check(len(lib.lists) == n + 1 and lib.threads[-1] is threading.main_thread(),
          "the next boundary walks, on the job's thread")
    # Steps that take longer than QUIET: the pause between two of them is
    # no quiet time (backward may be running); three of them is.
    _roles.QUIET = 0.1
    _roles.IDLE = 0.3
    time.sleep(0.15)
    a.step()
    time.sleep(0.35)
    a.step()  # a step of 0.35 s: quiet only after 1.05 s without a boundary
    n = len(lib.lists)
    lib.snaps += 1
    time.sleep(0.6)
    check(len(lib.lists) == n, "within three of the job's steps, a snapshot makes no background walk")
    deadline = time.monotonic() + 5
    while len(lib.lists) == n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(lib.lists) == n + 1 and lib.threads[-1] is not threading.main_thread(),
          "after three of its steps with no boundary, the background thread walks")
    # Backward ran and no boundary came yet (a training job's first step):
    # no background walk either.
    class Engine:
        pass

    engine = Engine()
    a.roles.last_step = None
    a.roles.step_gap = 0.0
    a.backward_threads.add(engine)
    n = len(lib.lists)
    time.sleep(0.8)
    check(len(lib.lists) == n, "after backward ran and before the first boundary, no background walk")
    a.backward_threads.discard(engine)
    deadline = time.monotonic() + 5
    while len(lib.lists) == n and time.monotonic() < deadline:
        time.sleep(0.05)
    check(len(lib.lists) == n + 1, "with no backward and no boundary (inference), the background thread walks")
    _roles.QUIET = 2.0
    _roles.IDLE = 3600.0
    a.step()
    # A module changed while it was walked (RuntimeError): walked again
    # later, not turned off.
    class Changing(dict):
        def values(self):
            raise RuntimeError("dictionary changed size during iteration")

    saved = l1._parameters
    object.__setattr__(l1, "_parameters", Changing(saved))
    a.roles.last -= _roles.EVERY
    n = len(lib.lists)
    a.step()
    object.__setattr__(l1, "_parameters", saved)
    a.roles.last -= _roles.EVERY
    a.step()
    check(not a.roles.failed and len(lib.lists) == n + 1 and not warnings,
          "a walk that meets a module being changed is tried again, not turned off")
    # A failure turns role lists off with one line and never reaches the job.
    l1._parameters["weight"] = object()
    a.roles.last -= _roles.EVERY
    n = len(lib.lists)
    a.step()
    a.roles.last -= _roles.EVERY
    a.step()
    check(a.roles.failed and len(lib.lists) == n and sum("role lists disabled" in w for w in warnings) == 1,
          "a walk that fails turns role lists off with one line: %s" % warnings)
    print("test_roles.py: all passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
