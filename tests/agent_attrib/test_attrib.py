"""vramscope/_attrib.py's logic with no torch and no GPU: the real module
against the stand-in torch in fake_torch/ and a stand-in tracker library
that keeps what it is told (the definitions) and gives each thread a real
native word for its context, as vs_agent_context_slot does. Run by
tests/agent_attrib.rs; prints "ok ..." lines, raises on a failure."""

import ctypes
import sys
import threading

import torch
from torch import nn

from vramscope import _attrib
from vramscope._attrib import BACKWARD, FORWARD, OPTIMIZER, OTHER, Attribution


class Fn:
    """A callable that takes ctypes' restype/argtypes, as a library's do."""

    def __init__(self, f):
        self.f = f

    def __call__(self, *args):
        return self.f(*args)


class Lib:
    """The tracker's attribution API, kept in Python."""

    def __init__(self):
        for name in dir(self):
            if name.startswith("vs_agent_"):
                setattr(self, name, Fn(getattr(self, name)))
        self.strings, self.frames, self.stacks, self.contexts = {}, {}, {}, {}
        self.words = []
        self.local = threading.local()
        self.dropped = {}
        self.attribution = 0
        self.capture = (ctypes.c_uint64 * 3)()

    def vs_agent_context_slot(self):
        # One word per thread, 0 when the thread starts (thread-local, as the
        # tracker's: a thread id may be reused, a thread-local is not).
        w = getattr(self.local, "w", None)
        if w is None:
            w = self.local.w = ctypes.c_uint32(0)
            self.words.append(w)  # kept alive for the addresses handed out
        return ctypes.addressof(w)

    def vs_agent_set_attribution(self, on):
        self.attribution = on
        return on

    def vs_agent_define_string(self, sid, b, n):
        self.strings[sid] = b[:n].decode()

    def vs_agent_define_frame(self, fid, file, func, line):
        self.frames[fid] = (file, func, line)

    def vs_agent_define_stack(self, sid, frame, parent):
        self.stacks[sid] = (frame, parent)

    def vs_agent_define_context(self, cid, module, phase, stack):
        self.contexts[cid] = (module, phase, stack)

    def vs_agent_count_dropped(self, what, n):
        self.dropped[what] = self.dropped.get(what, 0) + n

    def vs_agent_capture_request(self):
        return ctypes.addressof(self.capture)

    # ---- what the test reads ----
    def word(self):
        """The calling thread's context word."""
        return self.raw_word() & 0xFFFFFF  # (the context id: what the tracker reads)

    def raw_word(self):
        """The calling thread's native word, its top bit included."""
        if isinstance(self.vs_agent_context_slot, ctypes._CFuncPtr):  # a real one (--native-torch)
            return ctypes.c_uint32.from_address(self.vs_agent_context_slot()).value
        w = getattr(self.local, "w", None)
        return w.value if w is not None else 0

    def now(self):
        """(module path, phase) of the calling thread's current context."""
        return self.resolve(self.word())

    def resolve(self, cid):
        if cid == 0:
            return None
        module, phase, _ = self.contexts[cid]
        return (self.strings.get(module, ""), phase)

    def stack_of(self, cid):
        out, sid = [], self.contexts[cid][2]
        while sid:
            fid, sid = self.stacks[sid]
            f = self.frames[fid]
            out.append("%s:%d %s" % (self.strings[f[0]].rsplit("/", 1)[-1], f[2], self.strings[f[1]]))
        return out


LIB = Lib()
SEEN = []  # (what, (module, phase)) as the model's code saw them
INSIDE = []  # the native word's top bit as the leaves saw it
NODES = []  # the grad_fn of each leaf's output


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter("w")
        self.fail = False

    def forward(self, x):
        SEEN.append(("leaf", LIB.now()))
        INSIDE.append(LIB.raw_word() >> 31)
        if self.fail:
            raise ValueError("planted")
        NODES.append(torch.Node("leaf"))
        return torch.Tensor(NODES[-1])


class Act(nn.Module):  # a leaf without parameters: its caller's
    def forward(self, x):
        SEEN.append(("act", LIB.now()))
        return x


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Leaf()
        self.act = Act()

    def forward(self, x):
        SEEN.append(("block", LIB.now()))
        x = self.attn(x)  # the call site stacks name
        x = self.act(x)
        return torch.Tensor(torch.Node("block"))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Leaf()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = Leaf()

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        SEEN.append(("net", LIB.now()))  # its own context again after its children's
        return self.head(x)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok   " + what)


def build_with_stand_in_torch(_build):
    """fastcall.cpp built with -DVS_TORCH against the stand-in torch headers
    (fake_torch_include/), and a library whose vs_agent_context_slot gives
    each thread a native word as the tracker's does: the C++ backward
    pre-hooks, run by the test's "backward" like the Python ones."""
    import os
    import shutil
    import subprocess
    import tempfile

    cxx, why = _build.find_compiler()
    pyinc, why2 = _build.python_include()
    if not cxx or not pyinc:
        raise _build.BuildError(why if not cxx else why2)
    here = os.path.dirname(os.path.abspath(__file__))
    out = tempfile.mkdtemp(prefix="vs-attrib-test-")
    slot = os.path.join(out, "slot.cpp")
    with open(slot, "w") as f:
        f.write('#include <cstdint>\nthread_local uint32_t t_word __attribute__((tls_model("initial-exec"))) = 0;\n'
                'extern "C" uint32_t* vs_agent_context_slot(void) { return &t_word; }\n')
    fast = os.path.join(out, "_vsfast.so")
    for cmd in ([cxx, "-O2", "-shared", "-fPIC", slot, "-o", os.path.join(out, "slot.so")],
                [cxx, "-O2", "-shared", "-fPIC", "-std=c++17", "-Wall", "-Werror", "-DVS_TORCH",
                 "-I", os.path.join(here, "fake_torch_include"), "-isystem", pyinc,
                 _build.fast_source(), "-o", fast]):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if r.returncode:
            raise AssertionError("%s failed:\n%s" % (" ".join(cmd), r.stdout.decode()))
    lib = ctypes.CDLL(os.path.join(out, "slot.so"))
    lib.vs_agent_context_slot.restype = ctypes.c_void_p
    loaded = _build.load_fast(fast)
    shutil.rmtree(out)  # loaded: the files are no longer needed
    return loaded, lib.vs_agent_context_slot


def main():
    native_torch = "--native-torch" in sys.argv
    native = native_torch or "--native" in sys.argv
    warnings = []
    a = Attribution(torch, lambda msg, key=None: warnings.append(msg))
    check(a.install(), "the hooks install on a torch that has them")
    if native:
        # The native call path (fastcall.cpp), built for this Python.
        from vramscope import _build

        try:
            if native_torch:
                fast, LIB.vs_agent_context_slot = build_with_stand_in_torch(_build)
            else:
                fast = _build.load_fast(_build.build_fast())
        except _build.BuildError as e:
            print("SKIPPED: the native call path cannot be built here: %s" % e)
            return 0
        if native_torch:
            a.connect(LIB)  # (as the agent does: the tracker first, then the native path)
        check(a.use_native(fast), "native: the module call path is built, loaded and installed")
        if native_torch:
            check(a.native.native_hooks == 1, "native with torch: backward pre-hooks in C++")
        check(nn.Module.__dict__["__call__"] is _attrib._module_call and _attrib._module_call.__closure__ is None,
              "native: Module.__call__ is the Python wrapper (what Dynamo inlines and super() finds), no closure")
    model = Net()

    # Parameters are copied by _apply: before the tracker exists the
    # definitions wait, and .cuda() of the first parameter starts it.
    applied = []

    def fn(p):
        if a.lib is None:
            a.connect(LIB)  # what CUDA's lazy initialisation does
        applied.append((p, LIB.now()))

    model._apply(fn)
    got = {LIB.now() for _ in [0]}
    check(LIB.attribution == 1, "connecting turns tagging on")
    want = ["embed", "blocks.0.attn", "blocks.1.attn", "head"]
    check([m for _, (m, _) in applied] == want and all(ph == OTHER for _, (_, ph) in applied),
          "each parameter is copied in its module's context, phase other: %s" % [c for _, c in applied])
    check(got == {("", OTHER)}, "outside every module the main thread is (no module, other): %s" % got)

    SEEN.clear()
    INSIDE.clear()
    out = model(torch.Tensor())
    check(SEEN[0] == ("leaf", ("embed", FORWARD)) and SEEN[1] == ("block", ("blocks.0", FORWARD))
          and SEEN[2] == ("leaf", ("blocks.0.attn", FORWARD)),
          "forward: each module's own context (%s)" % SEEN[:3])
    check(SEEN[3] == ("act", ("blocks.0", FORWARD)), "a leaf without parameters is its caller's: %s" % (SEEN[3],))
    check(SEEN[-2] == ("net", ("Net", FORWARD)), "after its children's calls a module is in its own context again: %s"
          % (SEEN[-2],))
    check(LIB.now() == ("", OTHER), "after the forward the thread is back outside every module")
    if native:  # (the top bit is the native path's: the Python wrapper alone leaves it out)
        check(INSIDE and set(INSIDE) == {1} and LIB.raw_word() >> 31 == 0,
              "native: the word's top bit says inside a module (%d calls), and is clear after" % len(INSIDE))

    if native_torch:
        # The root's later calls run natively (fastcall.cpp's root_call, once
        # the Python wrapper has readied the thread and nothing changed):
        # the same contexts, the word back after, no Python stack.
        model(torch.Tensor())
        roots = a.native.roots
        SEEN.clear()
        model(torch.Tensor())
        check(a.native.roots == roots + 1 and SEEN[:4] == [
            ("leaf", ("embed", FORWARD)), ("block", ("blocks.0", FORWARD)), ("leaf", ("blocks.0.attn", FORWARD)),
            ("act", ("blocks.0", FORWARD))] and SEEN[-2] == ("net", ("Net", FORWARD))
              and LIB.now() == ("", OTHER) and LIB.raw_word() >> 31 == 0,
              "native: a root's call runs natively, with the same contexts (%d): %s" % (a.native.roots - roots, SEEN[:4]))
        out = model(torch.Tensor())

    # Backward: the pre-hooks registered on the outputs' grad_fn, run on
    # another thread, as the autograd engine does.
    tracked = set(a.backward_modules())
    check(tracked == {"Net", "embed", "blocks.0.attn", "blocks.1.attn", "head"},
          "the automatic backward level of a small model is every module with parameters, and the root: %s"
          % sorted(tracked))
    nodes = []

    def walk(t):
        if t.grad_fn is not None and t.grad_fn.prehooks:
            nodes.append(t.grad_fn)

    walk(out)
    seen_bw = []

    def backward():
        for hook in out.grad_fn.prehooks:
            hook(())
            seen_bw.append(LIB.now())
        # Activation checkpointing recomputes a forward inside backward, on
        # this thread: then backward goes on in the same module.
        list(model.blocks)[0](torch.Tensor())
        seen_bw.append(LIB.now())

    th = threading.Thread(target=backward)
    th.start()
    th.join()
    check(seen_bw[0] == ("head", BACKWARD), "backward: the thread running it takes the module's context: %s" % seen_bw)
    check(seen_bw[1] == ("head", BACKWARD), "after a recompute inside backward, backward goes on in its module: %s"
          % seen_bw)
    check(len(out.grad_fn.prehooks) == 1,
          "the root returns the head's output: one pre-hook (the innermost module's), not two")
    if native_torch:
        # A thread that ran backward (and lives on, as the engine's do) is
        # put outside every module by the next root forward, run natively.
        out = model(torch.Tensor())
        hooked, go, words = threading.Event(), threading.Event(), []

        def engine_thread():
            for hook in out.grad_fn.prehooks:
                hook(())
            words.append(LIB.now())
            hooked.set()
            go.wait(10)
            words.append(LIB.now())

        th = threading.Thread(target=engine_thread)
        th.start()
        hooked.wait(10)
        roots = a.native.roots
        model(torch.Tensor())
        go.set()
        th.join()
        check(words == [("head", BACKWARD), ("", BACKWARD)] and a.native.roots == roots + 1,
              "native: a root forward run natively puts a backward thread outside every module: %s" % words)
        model(torch.Tensor())  # (that thread has ended: it is no longer in the list)
    if native_torch:
        check(type(out.grad_fn.prehooks[0]).__name__ == "builtin_function_or_method" and a.native.hooks >= 3,
              "native with torch: that pre-hook is C++ (%d registered)" % a.native.hooks)

    # The optimizer step.
    opt = torch.optim.Optimizer()
    inside = []
    opt.step(work=lambda: inside.append(LIB.now()))
    check(inside == [("optimizer.Optimizer", OPTIMIZER)] and LIB.now() == ("", OTHER),
          "optimizer step: (optimizer.<class>, optimizer), then back: %s" % inside)

    # A step given a closure (LBFGS, Lightning's automatic optimization):
    # the closure runs where the step was called from, its modules in
    # their own contexts; only the optimizer's own work is the optimizer's.
    def closure():
        seen.append(("closure", LIB.now()))
        model(torch.Tensor())
        seen.append(("closure after the model", LIB.now()))
        return 1.5

    def work():
        seen.append(("work", LIB.now()))

    for how in ("positional", "keyword"):
        seen = []
        SEEN.clear()
        if how == "positional":
            loss = opt.step(closure, work)
        else:
            loss = opt.step(closure=closure, work=work)
        check(loss == 1.5 and seen == [("closure", ("", OTHER)), ("closure after the model", ("", OTHER)),
                                      ("work", ("optimizer.Optimizer", OPTIMIZER))]
              and ("net", ("Net", FORWARD)) in SEEN and LIB.now() == ("", OTHER),
              "a closure (%s) runs outside the optimizer, its modules in theirs: %s, %s" % (how, seen, SEEN[-1:]))

    # A closure that raises: the exception is the caller's, the context the
    # one outside the step again.
    def failing():
        raise KeyError("the user's own")

    try:
        opt.step(failing)
        raised = None
    except KeyError as e:
        raised = e
    check(raised is not None and LIB.now() == ("", OTHER),
          "a closure's exception reaches the caller, and the context is restored: %r" % (raised,))

    # The tracked set follows set_backward after calls were made (the native
    # path drops its copies of what infos says): at "none" only the root's
    # pre-hook (on the head's output, which the root returns), at "auto"
    # each leaf's.
    def leaf_hooks():
        NODES.clear()
        model(torch.Tensor())
        return [len(n.prehooks) for n in NODES]

    a.set_backward("none")
    none = leaf_hooks()
    a.set_backward("auto")
    auto = leaf_hooks()
    check(none == [0, 0, 0, 1] and auto == [1, 1, 1, 1],
          "backward pre-hooks follow the tracked set when it changes: none %s, auto %s" % (none, auto))

    # A module that raises: the context stack is unwound.
    list(model.blocks)[1].attn.fail = True
    try:
        model(torch.Tensor())
    except ValueError:
        pass
    list(model.blocks)[1].attn.fail = False
    check(LIB.now() == ("", OTHER) and not a.local.t.stack, "an exception in a module leaves no context behind")

    # While Dynamo traces, the wrapper is the plain call. (Dynamo inlines
    # Module.__call__ as the class gives it; with the native path that is
    # the Python wrapper, and the native object itself never runs while
    # Dynamo traces, so call the wrapper as Dynamo would.)
    torch.compiler._compiling[0] = True
    SEEN.clear()
    if native:
        nn.Module.__call__(model.head, torch.Tensor())
    else:
        model(torch.Tensor())
    torch.compiler._compiling[0] = False
    check(SEEN and all(s == ("", OTHER) for _, s in SEEN), "while compiling, no context is pushed: %s" % SEEN[:2])

    # Calls from many threads at once: each its own stack, nothing crosses.
    errors = []

    def worker(i):
        try:
            m = list(model.blocks)[i % 2]
            for _ in range(200):
                m(torch.Tensor())
                if LIB.now() is not None or a.local.t.stack:  # a new thread's base: no context
                    errors.append((LIB.now(), list(a.local.t.stack)))
        except Exception as e:
            errors.append(e)

    ths = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    check(not errors and not a.local.t.stack, "four threads calling modules at once: every stack unwinds: %s" % errors[:3])
    if native:
        check(a.native.fast >= 4 * 200, "native: the calls inside a module took the fast path (%d)" % a.native.fast)

    # Command 5: the next root forward picks it up; contexts carry the stack
    # of the call that entered the module.
    LIB.capture[1], LIB.capture[2], LIB.capture[0] = 1, 4, LIB.capture[0] + 1
    SEEN.clear()
    model(torch.Tensor())
    cid = LIB.word()
    attn = [ctx for ctx, (mod, ph, st) in LIB.contexts.items() if st and LIB.strings[mod] == "blocks.0.attn"]
    check(attn, "while capturing, a context with a stack is defined for blocks.0.attn")
    stack = LIB.stack_of(attn[0])
    line = Block.forward.__code__.co_firstlineno + 2
    check(stack[0] == "test_attrib.py:%d forward" % line and len(stack) <= 4,
          "its innermost frame is the call site, depth bounded to 4: %s" % stack)
    a.step()  # the step boundary ends a 1-step capture
    before = len(LIB.contexts)
    model(torch.Tensor())
    check(len(LIB.contexts) == before and a.capture_steps == 0, "after the steps asked for, no new stacks")
    del cid

    # Wrappers (torch.compile's) are left out of paths.
    class Compiled(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self._orig_mod = inner

        def forward(self, x):
            return self._orig_mod(x)

    inner = Net()
    SEEN.clear()
    Compiled(inner)(torch.Tensor())
    check(SEEN[1] == ("block", ("blocks.0", FORWARD)), "a torch.compile wrapper is no level of the paths: %s" % (SEEN[1],))

    class Sharded(nn.Module):  # FSDP's wrapper of a submodule
        def __init__(self, inner):
            super().__init__()
            self._fsdp_wrapped_module = inner

        def forward(self, x):
            return self._fsdp_wrapped_module(x)

    net = Net()
    net.head = Sharded(Leaf())
    SEEN.clear()
    net(torch.Tensor())
    check(SEEN[-1] == ("leaf", ("head", FORWARD)), "an FSDP wrapper inside a model is no level of the paths: %s"
          % (SEEN[-1],))

    # A class with its own __call__ that calls super().__call__ (as
    # transformers' GradientCheckpointingLayer does): Module.__call__ is
    # still the wrapper there, and the module is attributed.
    class OwnCall(Leaf):
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs)

    net2 = Net()
    net2.head = OwnCall()
    net2(torch.Tensor())
    before = a.native.fast if native else 0
    SEEN.clear()
    net2(torch.Tensor())
    check(SEEN[-1] == ("leaf", ("head", FORWARD)) and (not native or a.native.fast - before >= 6),
          "a module whose class calls super().__call__ is attributed%s: %s" % (
              ", through the native path" if native else "", SEEN[-1]))

    # Arguments pass through unchanged, however many (the native path
    # copies them into an array: on the stack up to 8, else allocated).
    class Many(nn.Module):
        def __init__(self):
            super().__init__()
            self.leaf = Leaf()
            self.leaf.forward = lambda *xs, **kw: (xs, kw, LIB.now())

        def forward(self):
            return [self.leaf(*range(n), k=n) for n in (0, 7, 8, 12, 100)]

    many = Many()
    many()
    got = many()
    check([(len(xs), kw) for xs, kw, _ in got] == [(n, {"k": n}) for n in (0, 7, 8, 12, 100)]
          and all(xs == tuple(range(len(xs))) and now == ("leaf", FORWARD) for xs, _, now in got),
          "calls with 0 to 100 arguments and a keyword get them all, in the module's context")

    # More modules than the native path's table holds (4,096 entries): where
    # a module's probes are all taken it replaces one, so every call still
    # takes the native path, each in its own context, and the modules called
    # after (the model above) are not shut out.
    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Leaf() for _ in range(6000)])

        def forward(self, x):
            for m in self.layers:
                m(x)

    wide = Wide()
    wide(torch.Tensor())
    SEEN.clear()
    before = a.native.fast if native else 0
    wide(torch.Tensor())
    check(SEEN == [("leaf", ("layers.%d" % i, FORWARD)) for i in range(6000)]
          and (not native or a.native.fast - before == 6000),
          "6,000 modules, each in its own context%s" % (
              ", all through the native path" if native else ""))

    if native_torch:
        # A module added to a root that runs natively: the Python wrapper
        # (the module is not in the table yet) names it under that root.
        class Late(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = Leaf()

            def forward(self, x):
                x = self.head(x)
                late = getattr(self, "late", None)
                return late(x) if late is not None else x

        net3 = Late()
        for _ in range(3):
            net3(torch.Tensor())
        net3.late = Leaf()
        interval, _attrib.RENAME_INTERVAL = _attrib.RENAME_INTERVAL, 0.0
        roots = a.native.roots
        SEEN.clear()
        net3(torch.Tensor())
        _attrib.RENAME_INTERVAL = interval
        check(a.native.roots == roots + 1 and SEEN == [("leaf", ("head", FORWARD)), ("leaf", ("late", FORWARD))]
              and LIB.now() == ("", OTHER) and LIB.raw_word() >> 31 == 0 and not a.local.t.stack,
              "native: a module added to a root running natively is named under that root: %s" % SEEN)

    # Bounds: ids that run out are counted, never wrapped.
    _attrib.MAX_IDS = len(a.contexts)
    check(a.context(a.string("x.y"), FORWARD) == 0 and LIB.dropped.get(2) == 1,
          "a context past the bound is 0, counted in DROPPED 2")
    if native:
        # torch.fx's tracer patches Module.__call__ for a while (CPython then
        # resets the slot of every class) and puts back what it read.
        saved = nn.Module.__call__
        seen = []

        def patched(self, *args, **kwargs):
            seen.append(type(self).__name__)
            return saved(self, *args, **kwargs)

        nn.Module.__call__ = patched
        model(torch.Tensor())
        check("Leaf" in seen and "Block" in seen, "native: a patcher of Module.__call__ sees every module call: %s" % seen[:4])
        nn.Module.__call__ = saved
        model(torch.Tensor())  # the wrapper patches the classes again
        before = a.native.fast
        SEEN.clear()
        model(torch.Tensor())
        check(a.native.fast > before and SEEN[2] == ("leaf", ("blocks.0.attn", FORWARD)),
              "native: after the patcher, the native path again (%d fast calls)" % (a.native.fast - before))
        a.capture_steps = 2
        check(a.native.slow == 1, "native: while capturing, calls take the Python wrapper (which captures)")
        a.capture_steps = 0
        check(a.native.slow == 0, "native: after capture, the native path again")
    check(not warnings, "no warning: %s" % warnings)
    a.remove()
    check(nn.Module.__call__ is nn.modules.module.Module._wrapped_call_impl, "remove() restores Module.__call__")
    print("test_attrib.py: all passed (%s)" % ("native with torch" if native_torch else "native" if native else "python"))


if __name__ == "__main__":
    sys.exit(main())
