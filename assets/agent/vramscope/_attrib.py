"""Who holds the memory: module, phase and step attribution (exact mode).

The allocator callback (tracker.cpp) tags each event with the calling
thread's *context id* and the step tag; this module keeps those context ids
current, with no change to the user's code, and defines what they mean
(crates/wire/src/ring/FORMAT.md, "Contexts, strings, frames and stacks"):

forward    ``Module.__call__`` is wrapped (PyTorch's global module hooks
           would take every module off its fast path): the thread's word
           holds the innermost module running, and goes back to its
           caller's when the call returns. Where the
           agent could build it (vramscope/fastcall.cpp: this Python's
           headers and a C++ compiler), the common case runs in C: a module
           call inside another then costs about 0.1 us more, not 2-3 us.
backward   after a tracked module's forward, a pre-hook on its output's
           ``grad_fn``; when backward reaches it (on an autograd engine
           thread) that thread's context becomes the module's backward. No
           full backward hooks: they wrap outputs and break in-place ops.
           With the native path built against torch the pre-hook is C++
           (no GIL in backward); Python under compiled autograd, while
           stacks are captured, or without it.
optimizer  global optimizer step pre/post hooks.
roles      the tensors PyTorch holds (parameters, buffers, gradients,
           optimizer state) by address, at step boundaries (_roles.py).
other      ``Module._apply`` (``.to()``, ``.cuda()``, ``.half()``): parameter
           and buffer copies are attributed to their module.

Each thread stores its context into a native thread-local word (its
address comes from ``vs_agent_context_slot``) with one plain store; the
callback only reads it. Nothing here runs in the allocator callback, takes
an allocator lock or is called with one held.

Module paths: the first time a module is entered outside any other (a
root: the model, a loss module), its ``named_modules()`` name the whole
tree (``transformer.h.3.attn``); the root itself is named by its class.

Compiled regions (``torch.compile``): the wrapper returns the plain call at
once while Dynamo traces (``torch.compiler.is_dynamo_compiling()`` is
constant there), so it adds nothing to the graph and breaks nothing; Dynamo
reads ``Module.__call__`` as the Python wrapper even where calls run in C; allocations inside a compiled region carry the
context of the module that called it (for ``torch.compile(model)``: the
model, forward or backward).

Stack capture (command 5): for the next N steps each context entered also
carries the Python stack of the call that entered it (``depth`` frames,
torch's own module machinery skipped), so allocations name their code
location. Then contexts go back to (module, phase).

Never hurting the job: every hook catches everything; a failure disables
attribution with one ``vramscope:`` line. Modules are never referenced
strongly (ids, with a weakref finalizer), so no model outlives its use.
"""

import ctypes
import os
import sys
import threading
import time
import weakref

FORWARD, BACKWARD, OPTIMIZER, OTHER = 1, 2, 3, 4

# FORMAT.md DROPPED `what`.
_DROP_CONTEXT_IDS, _DROP_STACKS = 2, 3

# The reader keeps 65,536 definitions of each kind: stay inside.
MAX_IDS = 60000
MAX_CAPTURE_SECONDS = 300.0
DEFAULT_DEPTH = 12
MAX_DEPTH = 64
# A module entered inside a root that did not name it makes the root be
# walked again, at most this often.
RENAME_INTERVAL = 1.0

# The automatic backward level holds at most this many modules per model:
# each costs a grad_fn pre-hook registration in forward and a GIL round
# trip in backward, every step (about 12 us on the H100 host).
BACKWARD_HOOKS = 32

_ROOT, _OWNS, _LEVEL, _QUIET = 1, 2, 4, 8

# The native word: a 24-bit context id (all the tracker reads) and, in the
# top bit, whether the thread is inside a root module's call (the native
# path takes only calls inside one: fastcall.cpp's kInside).
_CONTEXT, _INSIDE = 0xFFFFFF, 0x80000000

# Wrapper attributes: (attribute, wrapper class names or () for any).
_WRAPPERS = (("_orig_mod", ()), ("module", ("DistributedDataParallel", "DataParallel")))

_SKIP_FILES = ("torch/nn/modules/module.py", "vramscope/_attrib.py", "torch/_compile.py")


class _Thread:
    """One thread's state: its context stack and its native context word."""

    __slots__ = ("stack", "slot", "base", "outer", "root", "last_fn", "backward", "__weakref__")

    def __init__(self, slot):
        self.stack = []  # contexts of the calls the Python wrapper made (the root first; the native path's are in C)
        self.slot = slot  # memoryview of the native word, or None
        self.base = 0  # the context outside every module (optimizer, other)
        self.outer = None  # the context when the outermost module was entered
        self.root = None  # weakref of the outermost module running
        self.last_fn = None  # the grad_fn given a backward pre-hook last (its address, from C++)
        self.backward = False  # has run backward hooks


class Attribution:
    def __init__(self, torch, warn):
        self.torch = torch
        self.warn = warn
        self.lib = None
        self.local = threading.local()
        self.lock = threading.RLock()  # tables; never held by the callback
        self.infos = {}  # id(module) -> [path id, {phase: context}, backward hook]
        self.strings = {}
        self.frames = {}
        self.stacks = {}
        self.contexts = {}
        self.paths = [""]  # string id -> text, for module paths
        self.stack_of = {}  # context id -> its stack id, for contexts with one
        self.backward_hooks = {}  # context id -> its backward pre-hook
        self.optimizer_ctxs = {}  # optimizer class -> its context id
        self.pending = []  # definitions made before the library was loaded
        self.backward_threads = weakref.WeakSet()
        self.handles = []
        self.orig_apply = None
        self.orig_call = None
        self.installed = False
        self.failed = False
        self.native = None  # vramscope._vsfast.Call, once built and loaded
        self.native_off = None  # the same while set_native(False)
        self.native_note = None  # why there is none, when it was tried
        self.native_hooks = False  # backward pre-hooks in C++ (a torch build of it)
        self.fast = None  # the vramscope._vsfast module
        self.fast_slow = None  # its SLOW: what native.call returns for the Python path
        # Which modules' backward is tracked (see _hook_backward): "params"
        # (default), "all" or "none" (backward is then one phase, no module).
        self.backward = "auto"
        self.set_backward(os.environ.get("VRAMSCOPE_ATTRIBUTION_BACKWARD", "auto"))
        self.renamed = {}  # id(root) -> last walk time
        # Stack capture (command 5).
        self.capture_words = None
        self.capture_addr = 0  # its address, for the native path
        self.compiled_autograd_next = 0.0  # when step() asks again whether compiled autograd is on
        self.capture_seen = 0
        self._capture_steps = 0
        self.capture_depth = DEFAULT_DEPTH
        self.capture_until = 0.0
        self.none_backward = 0
        self.none_other = 0
        try:
            # Constant False in eager (cheapest), True while Dynamo traces.
            compiling = torch.compiler.is_dynamo_compiling
        except AttributeError:
            compiling = None
        try:
            compiling = compiling or torch.compiler.is_compiling
        except AttributeError:
            try:
                compiling = torch._dynamo.is_compiling
            except AttributeError:

                def compiling():
                    return False

        self.compiling = compiling
        self.grad_enabled = torch.is_grad_enabled
        self.Tensor = torch.Tensor
        # Role lists (_roles.py), unless VRAMSCOPE_ROLES=0.
        self.roles = None
        if os.environ.get("VRAMSCOPE_ROLES", "1") != "0":
            from ._roles import Roles

            self.roles = Roles(self)

    @property
    def capture_steps(self):
        return self._capture_steps

    @capture_steps.setter
    def capture_steps(self, n):
        """Steps left to capture stacks for; while any, every module call
        takes the Python wrapper (which captures)."""
        self._capture_steps = n
        if self.native is not None:
            self.native.slow = 1 if n else 0

    # ---- the native side ---------------------------------------------------

    def connect(self, lib):
        """The tracker is started: write what was defined so far, then tag."""
        with self.lock:
            for name in (
                "vs_agent_context_slot",
                "vs_agent_set_attribution",
                "vs_agent_define_string",
                "vs_agent_define_context",
                "vs_agent_capture_request",
            ):
                if not hasattr(lib, name):
                    return False
            lib.vs_agent_context_slot.restype = ctypes.c_void_p
            lib.vs_agent_set_attribution.restype = ctypes.c_int
            lib.vs_agent_set_attribution.argtypes = [ctypes.c_int]
            lib.vs_agent_define_string.argtypes = [ctypes.c_uint32, ctypes.c_char_p, ctypes.c_uint64]
            lib.vs_agent_define_frame.argtypes = [ctypes.c_uint32] * 4
            lib.vs_agent_define_stack.argtypes = [ctypes.c_uint32] * 3
            lib.vs_agent_define_context.argtypes = [ctypes.c_uint32] * 4
            lib.vs_agent_count_dropped.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
            lib.vs_agent_capture_request.restype = ctypes.c_void_p
            addr = lib.vs_agent_capture_request()
            self.capture_addr = addr
            self.capture_words = memoryview((ctypes.c_uint64 * 3).from_address(addr)).cast("B").cast("Q")
            self.capture_seen = self.capture_words[0]
            self.lib = lib
            if self.roles is not None and not self.roles.connect(lib):
                self.roles = None
            for d in self.pending:
                self._write(d)
            self.pending = []
            if lib.vs_agent_set_attribution(1) != 1:
                self.lib = None
                return False
            # The calling thread may be inside modules already (CUDA was
            # initialised by model.cuda()): give it its current context.
            t = self._thread()
            self._set(t, t.stack[-1] if t.stack else t.base)
            self._wire_native()
            return True

    def _write(self, d):
        lib = self.lib
        kind = d[0]
        if kind == "s":
            b = d[2]
            lib.vs_agent_define_string(d[1], b, len(b))
        elif kind == "f":
            lib.vs_agent_define_frame(d[1], d[2], d[3], d[4])
        elif kind == "k":
            lib.vs_agent_define_stack(d[1], d[2], d[3])
        else:
            lib.vs_agent_define_context(d[1], d[2], d[3], d[4])

    def _define(self, d):
        if self.lib is not None:
            self._write(d)
        else:
            self.pending.append(d)

    def _dropped(self, what):
        if self.lib is not None:
            try:
                self.lib.vs_agent_count_dropped(what, 1)
            except Exception:
                pass

    def _thread(self):
        try:
            return self.local.t
        except AttributeError:
            pass
        slot = None
        if self.lib is not None:
            addr = self.lib.vs_agent_context_slot()
            slot = memoryview((ctypes.c_uint32 * 1).from_address(addr)).cast("B").cast("I")
        t = self.local.t = _Thread(slot)
        me = threading.current_thread()
        t.base = self.none_other if me is threading.main_thread() else 0
        if isinstance(me, threading._DummyThread):
            # A thread Python did not start: an autograd engine thread (its
            # pre-hooks may be C++, which cannot say so): each root forward
            # resets it, and its forward calls are recomputes.
            self._runs_backward(t)
        if slot is not None and slot[0] == 0:  # (else a C++ pre-hook set it already)
            slot[0] = t.base
        return t

    def _runs_backward(self, t):
        """The thread of `t` runs backward: each root forward puts it
        outside every module (here, and the native path's list)."""
        t.backward = True
        self.backward_threads.add(t)
        if self.fast is not None:
            self.fast.backward_thread()

    def _set(self, t, ctx):
        """The thread's word: `ctx`, marked inside a module while its stack
        is not empty."""
        if t.stack:
            ctx |= _INSIDE
        s = t.slot
        if s is None:
            if self.lib is None:
                return
            del self.local.t  # made before the library: start afresh
            t2 = self._thread()
            t2.stack, t2.base, t2.root = t.stack, t.base, t.root
            s = t2.slot
        s[0] = ctx

    # ---- ids -------------------------------------------------------------------

    def string(self, text):
        sid = self.strings.get(text)
        if sid is None:
            if len(self.strings) >= MAX_IDS:
                return 0
            sid = self.strings[text] = len(self.strings) + 1
            self.paths.append(text)
            self._define(("s", sid, text.encode("utf-8", "replace")))
        return sid

    def context(self, path_id, phase, stack=0):
        key = (path_id, phase, stack)
        cid = self.contexts.get(key)
        if cid is None:
            if len(self.contexts) >= MAX_IDS:
                self._dropped(_DROP_CONTEXT_IDS)
                return 0
            cid = self.contexts[key] = len(self.contexts) + 1
            if stack:
                self.stack_of[cid] = stack
            self._define(("c", cid, path_id, phase, stack))
        return cid

    def stack_here(self, frame, depth):
        """The stack id of `frame` and its callers (at most `depth` frames,
        torch's module machinery and this file skipped), or 0."""
        frames = []
        f = frame
        while f is not None and len(frames) < depth:
            code = f.f_code
            name = code.co_filename
            if not name.endswith(_SKIP_FILES):
                frames.append((name, code.co_name, f.f_lineno))
            f = f.f_back
        sid = 0
        for name, func, line in reversed(frames):  # outermost first
            key = (name, func, line)
            fid = self.frames.get(key)
            if fid is None:
                if len(self.frames) >= MAX_IDS:
                    self._dropped(_DROP_STACKS)
                    return 0
                fid = self.frames[key] = len(self.frames) + 1
                self._define(("f", fid, self.string(name), self.string(func), line))
            skey = (fid, sid)
            nsid = self.stacks.get(skey)
            if nsid is None:
                if len(self.stacks) >= MAX_IDS:
                    self._dropped(_DROP_STACKS)
                    return 0
                nsid = self.stacks[skey] = len(self.stacks) + 1
                self._define(("k", nsid, fid, sid))
            sid = nsid
        return sid

    # ---- module names ------------------------------------------------------------

    def _forget(self, key):
        self.infos.pop(key, None)
        self._changed()

    def _changed(self):
        """`infos` or an entry changed: the native path's copies go."""
        n = self.native
        if n is not None:
            n.changed()

    def _info_for(self, module, path, root=False, level=False):
        """[path string id, {phase: context id}, whether its backward is
        tracked (see set_backward), flags: _ROOT, _OWNS (parameters of its
        own), _LEVEL (in the automatic backward level)]."""
        key = id(module)
        info = self.infos.get(key)
        pid = self.string(path)
        flags = (_ROOT if root else 0) | (_OWNS if getattr(module, "_parameters", None) else 0)
        flags |= _LEVEL if level else 0
        if not root and not flags & _OWNS and not getattr(module, "_modules", None):
            # A leaf with no parameters (an activation, dropout, pooling):
            # what it allocates is its caller's, which saves the context
            # switch on about a third of all module calls.
            flags |= _QUIET
        if info is None:
            info = self.infos[key] = [pid, {}, False, flags]
            try:
                weakref.finalize(module, self._forget, key)
            except TypeError:
                pass
        elif info[0] != pid:
            info[0], info[1], info[3] = pid, {}, flags
        else:
            info[3] |= flags
        info[2] = self._tracked(info[3])
        self._changed()
        return info

    def name_tree(self, root):
        """Names `root` (by its class) and every module under it. Wrappers
        (torch.compile's, DataParallel, DistributedDataParallel) are named
        by the model they wrap, and their own level is left out of paths."""
        with self.lock:
            inner, prefix = root, ""
            for attr, classes in _WRAPPERS:
                wrapped = getattr(inner, attr, None)
                if isinstance(wrapped, self.torch.nn.Module) and (not classes or type(inner).__name__ in classes):
                    inner, prefix = wrapped, prefix + attr + "."
            self._info_for(root, type(inner).__name__, root=True)
            named = []
            for name, m in root.named_modules():
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                if name and m is not inner:
                    named.append((name, m))
                elif m is inner and m is not root:
                    self._info_for(m, type(inner).__name__, root=True)
            named = [(_plain(n), m) for n, m in named]
            named = [(n, m) for n, m in named if n]
            level = _backward_level(named, self.torch.nn)
            for name, m in named:
                self._info_for(m, name, level=name in level)
            self.renamed[id(root)] = time.monotonic()
            if self.roles is not None:
                self.roles.unroot(m for _, m in named)
                self.roles.root(root)

    def info(self, module, t):
        info = self.infos.get(id(module))
        if info is not None:
            return info
        root = t.root() if t.root is not None else None
        if root is None and self.native is not None:
            root = self.native.current_root()  # a root the native path runs
        if root is None or root is module:
            self.name_tree(module)
        elif time.monotonic() - self.renamed.get(id(root), 0.0) >= RENAME_INTERVAL:
            self.name_tree(root)  # a module added to the root since
        info = self.infos.get(id(module))
        if info is None:  # not registered under the root: named by its class
            with self.lock:
                parent = ""
                if root is not None and id(root) in self.infos:
                    parent = self.paths[self.infos[id(root)][0]] + "."
                info = self._info_for(module, parent + type(module).__name__)
        return info

    def ctx(self, info, phase):
        c = info[1].get(phase)
        if c is None:
            with self.lock:
                c = info[1][phase] = self.context(info[0], phase)
                if phase == FORWARD and info[2] and BACKWARD not in info[1]:
                    # A tracked module's backward context too: the native
                    # path hooks only modules whose context is defined.
                    info[1][BACKWARD] = self.context(info[0], BACKWARD)
                self._changed()
        return c

    # ---- hooks -----------------------------------------------------------------------

    def _enter(self, module, phase, nested=False):
        """`module` is entered on this thread in `phase`: a root (the
        thread's first) unless there is a stack or `nested` (inside a root
        the native path runs)."""
        t = self._thread()
        ready = False
        if not t.stack and not nested:
            t.root = weakref.ref(module)
            # What the thread goes back to: on an autograd thread (a
            # checkpointing recompute) the backward context a pre-hook set.
            t.outer = t.slot[0] & _CONTEXT if t.slot is not None else None
            if phase == FORWARD and not t.backward:  # (a forward inside backward: checkpointing's recompute)
                self._new_forward()
                ready = self.native is not None
        info = self.info(module, t)
        if self.capture_steps:
            ctx = self._captured(info, phase, sys._getframe(2))
            ready = False
        else:
            ctx = info[1].get(phase) or self.ctx(info, phase)
        t.stack.append(ctx)
        self._set(t, ctx)
        if ready:
            # This thread's next root calls may run natively (fastcall.cpp's
            # root_call), until anything here changes.
            self.native.root_ready()
        return t, info

    def _leave(self, t):
        st = t.stack
        if st:
            st.pop()
        if not st:
            t.root = None
            t.last_fn = None
            if self.fast is not None:
                self.fast.clear_last()
        self._set(t, st[-1] if st else (t.outer if t.outer is not None else t.base))

    def _captured(self, info, phase, frame):
        with self.lock:
            if time.monotonic() > self.capture_until:
                self.capture_steps = 0
                return self.ctx(info, phase)
            return self.context(info[0], phase, self.stack_here(frame, self.capture_depth))

    def _new_forward(self):
        """A root module's forward begins: backward threads start the next
        backward outside every module, and a capture request is picked up."""
        for b in list(self.backward_threads):
            b.base = self.none_backward
            if b.slot is not None and not b.stack:
                b.slot[0] = self.none_backward
        self.poll_capture()
        n = self.native
        if n is not None:
            n.none_backward = self.none_backward
            n.capture_seen = self.capture_seen
            if self.native_hooks:
                # Compiled autograd traces the backward graph: its hooks must
                # be Python's (a C++ pre-hook would stop it).
                n.native_hooks = 0 if _compiled_autograd() else 1

    def set_backward(self, policy):
        """Which modules' backward is tracked: "auto" (default: the deepest
        level of each model with at most BACKWARD_HOOKS modules holding
        parameters, e.g. GPT-2's blocks; a level's backward includes its
        children's), "params" (every module with parameters of its own:
        exact per module, one more pre-hook per module and step), "all", or
        "none" (backward is a phase of the root only)."""
        self.backward = policy if policy in ("auto", "params", "all", "none") else "auto"
        for info in self.infos.values():
            info[2] = self._tracked(info[3])
        self._changed()

    def _tracked(self, flags):
        p = self.backward
        if p == "all":
            return True
        mask = {"auto": _ROOT | _LEVEL, "params": _ROOT | _OWNS}.get(p, _ROOT)
        return bool(flags & mask)

    def backward_modules(self):
        """The module paths whose backward is tracked (for tests)."""
        return sorted(self.paths[i[0]] for i in self.infos.values() if i[2])

    def _hook_backward(self, t, module, output, fwd_ctx):
        """When backward reaches the node that made this module's output,
        the thread running it takes the module's backward context (a
        pre-hook on that node). Only for modules that own parameters (where
        gradients are made) and roots (where backward starts), unless
        VRAMSCOPE_ATTRIBUTION_BACKWARD=all: a pre-hook costs its
        registration every forward and a GIL round trip in backward (in
        Python; with the native path built against torch, a C++ pre-hook
        costs neither)."""
        try:
            self._hook_backward_of(t, module, output, fwd_ctx)
        except Exception as e:
            self.fail(e)

    def _hook_backward_of(self, t, module, output, fwd_ctx):
        info = self.infos.get(id(module))
        if info is None or not info[2]:
            return
        out = output
        if not isinstance(out, self.Tensor):
            out = _first_tensor(out, self.Tensor)
            if out is None:
                return
        fn = out.grad_fn
        if fn is None or fn is t.last_fn:  # the inner module's output already
            return
        fast = self.fast
        if fast is not None and fast.hooked_last(out):  # hooked in C++ (fastcall.cpp)
            return
        t.last_fn = fn  # cleared when the outermost module returns
        if fast is not None and not t.stack:
            fast.py_hooked()  # (the outermost module is a native root call: it clears it)
        if self.capture_steps:
            with self.lock:
                ctx = self.context(info[0], BACKWARD, self.stack_of.get(fwd_ctx, 0))
        else:
            ctx = info[1].get(BACKWARD) or self.ctx(info, BACKWARD)
            n = self.native
            if n is not None and n.native_hooks and n.hook(t, info, out):
                return  # a C++ pre-hook (fastcall.cpp)
        fn.register_prehook(self._backward_hook(ctx))

    def _backward_hook(self, ctx):
        hook = self.backward_hooks.get(ctx)
        if hook is None:
            hook = self.backward_hooks[ctx] = self._make_backward_hook(ctx)
        return hook

    def _make_backward_hook(self, ctx):
        def hook(grad_outputs):
            try:
                t = self._thread()
                if not t.backward:
                    self._runs_backward(t)
                t.base = ctx
                if t.stack:
                    t.outer = ctx  # what the module running returns to
                else:
                    self._set(t, ctx)
            except Exception:
                pass
            return None

        return hook

    def optimizer_pre(self, optimizer, args, kwargs):
        """The step begins: the thread is in the optimizer's context. A
        closure passed to the step (LBFGS, Lightning's automatic
        optimization, any ``optimizer.step(closure)``) runs forward and
        backward: it is given back wrapped, to run in the context the step
        was called from, so only what the optimizer's own code allocates is
        the optimizer's."""
        try:
            if self.roles is not None:
                self.roles.optimizer(optimizer)
            t = self._thread()
            outside = t.base
            t.base = self.optimizer_ctx(optimizer)
            if not t.stack:  # (inside a module: the module's)
                self._set(t, t.base)
            return _with_closure_outside(self, optimizer, args, kwargs, outside)
        except Exception as e:
            self.fail(e)
        return None

    def closure_outside(self, closure, ctx):
        """``closure``, run in context ``ctx`` (the thread's base while it
        runs; the optimizer's again after). Its own exceptions are its
        caller's; the agent's never reach it."""

        def closure_outside_the_optimizer(*args, **kwargs):
            t = saved = None
            try:
                t = self._thread()
                saved, t.base = t.base, ctx
                if not t.stack:
                    self._set(t, ctx)
            except Exception as e:
                self.fail(e)
                t = None
            ok = False
            try:
                out = closure(*args, **kwargs)
                ok = True
                return out
            finally:
                # Back in the optimizer's context; or, when the closure
                # raised (the step is abandoned: no post-hook will come),
                # in the one outside the step.
                if t is not None:
                    try:
                        t.base = saved if ok else ctx
                        if not t.stack:
                            self._set(t, t.base)
                    except Exception as e:
                        self.fail(e)

        return closure_outside_the_optimizer

    def optimizer_post(self, optimizer, args, kwargs):
        try:
            t = self._thread()
            t.base = self.none_other
            if not t.stack:
                self._set(t, t.base)
        except Exception as e:
            self.fail(e)

    def optimizer_ctx(self, optimizer):
        cls = type(optimizer)
        c = self.optimizer_ctxs.get(cls)
        if not c:  # (0 when ids ran out: asked again)
            with self.lock:
                c = self.optimizer_ctxs[cls] = self.context(self.string("optimizer." + cls.__name__), OPTIMIZER)
        return c

    def step(self):
        """A step boundary (optimizer step or mark()): counts capture down,
        and (at most once a second) asks again whether compiled autograd is
        on: root calls that run natively do not ask."""
        if self.capture_steps:
            self.capture_steps -= 1
        self.poll_capture()
        if self.roles is not None and self.installed:
            self.roles.at_step()
        n = self.native
        now = time.monotonic()
        if n is not None and self.native_hooks and now >= self.compiled_autograd_next:
            # (The question costs tens of microseconds in a real step, where
            # torch's config module is cold.)
            self.compiled_autograd_next = now + 1.0
            on = 0 if _compiled_autograd() else 1
            if on != n.native_hooks:
                n.native_hooks = on
                n.changed()  # (root calls take the Python wrapper once, which asks)

    def poll_capture(self):
        w = self.capture_words
        if w is None or w[0] == self.capture_seen:
            return
        self.capture_seen = w[0]
        steps, depth = w[1], w[2]
        self.capture_depth = min(MAX_DEPTH, depth or DEFAULT_DEPTH)
        self.capture_steps = int(steps)
        self.capture_until = time.monotonic() + MAX_CAPTURE_SECONDS

    # ---- install / remove ----------------------------------------------------------

    def install(self):
        """Registers the global hooks. Returns False (and changes nothing)
        when this torch lacks them."""
        torch = self.torch
        with self.lock:
            if self.installed:
                return True
            try:
                from torch.nn.modules import module as m
                from torch.optim import optimizer as o

                self.none_other = self.context(0, OTHER)
                self.none_backward = self.context(0, BACKWARD)
                self.handles = [
                    o.register_optimizer_step_pre_hook(self.optimizer_pre),
                    o.register_optimizer_step_post_hook(self.optimizer_post),
                ]
                self.orig_call = m.Module.__dict__["__call__"]
                _set_globals(self, self.orig_call)
                m.Module.__call__ = _module_call
                if self.native is not None:
                    self.native.activate(m.Module)
                self.orig_apply = m.Module._apply
                m.Module._apply = _make_apply(self, self.orig_apply)
            except (AttributeError, ImportError):
                self.remove()  # a torch without these APIs: no attribution
                return False
            except Exception as e:
                self.remove()
                self.warn("module attribution disabled: %s: %s" % (type(e).__name__, e), "attrib")
                return False
            self.installed = True
            if self.lib is not None:
                self.lib.vs_agent_set_attribution(1)
            return True

    def remove(self):
        with self.lock:
            for h in self.handles:
                try:
                    h.remove()
                except Exception:
                    pass
            self.handles = []
            if self.native is not None:
                self.native.deactivate()
            if self.orig_call is not None:
                try:
                    self.torch.nn.Module.__call__ = self.orig_call
                except Exception:
                    pass
                self.orig_call = None
            if self.orig_apply is not None:
                try:
                    self.torch.nn.Module._apply = self.orig_apply
                except Exception:
                    pass
                self.orig_apply = None
            self.installed = False
            _set_globals(None, None)
            if self.lib is not None:
                try:
                    self.lib.vs_agent_set_attribution(0)
                except Exception:
                    pass

    def use_native(self, fast):
        """Runs module calls through `fast` (the vramscope._vsfast module,
        see fastcall.cpp) from now on. False when it does not fit."""
        with self.lock:
            if self.failed:
                return False
            try:
                from torch.nn.modules import module as m

                orig = self.orig_call if self.orig_call is not None else m.Module.__dict__["__call__"]
                self.native = fast.Call(
                    orig,
                    _module_call,
                    self.infos,
                    self.local,
                    FORWARD,
                    BACKWARD,
                    self._hook_backward,
                    self.grad_enabled,
                    _Thread,
                )
            except Exception as e:
                self.native = None
                self.native_note = "%s: %s" % (type(e).__name__, e)
                return False
            self.native.slow = 1 if self._capture_steps else 0
            self.fast, self.fast_slow = fast, fast.SLOW
            self._wire_native()
            if self.installed:
                self.native.activate(m.Module)
            return True

    def _wire_native(self):
        """Gives the native path the tracker's vs_agent_context_slot (once
        both are there): it reads the thread's word through it (with a
        stand-in library in Python, through the thread's _Thread), and with
        torch it makes the backward pre-hooks C++."""
        fast, n = self.fast, self.native
        if n is None or fast is None:
            return
        try:
            slot_fn = getattr(self.lib, "vs_agent_context_slot", None)
            if isinstance(slot_fn, ctypes._CFuncPtr):
                addr = ctypes.cast(slot_fn, ctypes.c_void_p).value
                self.native_hooks = bool(fast.set_slot_function(addr)) and bool(getattr(fast, "WITH_TORCH", 0))
        except Exception as e:
            self.native_note = "backward pre-hooks in Python: %s: %s" % (type(e).__name__, e)
        n.native_hooks = 1 if self.native_hooks and not _compiled_autograd() else 0
        if self.capture_addr:  # (none_backward and capture_seen: at each Python root)
            n.set_capture(self.capture_addr)

    def set_native(self, on):
        """Module calls through the native path (on) or the Python wrapper
        only (for comparisons: bench_attrib.py's attrib_py)."""
        with self.lock:
            if on and self.native is None and self.native_off is not None:
                self.native, self.native_off = self.native_off, None
            if self.native is None or not self.installed:
                return
            M = self.torch.nn.Module
            if on:
                self.native.changed()  # (infos may have changed while it was stashed)
                self.native.activate(M)
            else:
                self.native.deactivate()
                self.native, self.native_off = None, self.native
                M.__call__ = _module_call  # resets every patched class's slot

    def fail(self, e):
        if self.failed:
            return
        self.failed = True
        self.warn("module attribution disabled: %s: %s" % (type(e).__name__, e), "attrib")
        self.remove()


# Wrapper levels inside a model, left out of paths wherever they appear
# (FSDP's and activation checkpointing's wrappers, torch.compile's).
_TRANSPARENT = {"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"}


def _plain(path):
    return ".".join(p for p in path.split(".") if p not in _TRANSPARENT)


def _backward_level(named, nn):
    """The module paths of the automatic backward level of one model:
    `named` is its (path, module) list. Level D holds the modules at depth D
    that hold parameters (their own or their children's) and those above D
    with parameters of their own; ModuleList and ModuleDict are never
    called, so they are no level (their children take their depth). The
    deepest D with at most BACKWARD_HOOKS modules wins."""
    containers = (nn.ModuleList, nn.ModuleDict)
    skip = {p for p, m in named if isinstance(m, containers)}
    depth, owns, holds = {}, set(), set()
    for p, m in named:
        parts = p.split(".")
        depth[p] = sum(1 for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in skip)
        if getattr(m, "_parameters", None):
            owns.add(p)
            for i in range(1, len(parts) + 1):
                holds.add(".".join(parts[:i]))
    best = set()
    for d in range(1, max(depth.values(), default=0) + 1):
        level = {p for p in holds if p not in skip and (depth[p] == d or (depth[p] < d and p in owns))}
        if len(level) > BACKWARD_HOOKS:
            break
        best = level
    return best


def _compiled_autograd():
    """Whether compiled autograd is on (torch._dynamo's, 2.4 and later)."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    if ca is not None:
        for name in ("compiled_autograd_enabled", "in_compiled_autograd_region"):
            if getattr(ca, name, None) is True:
                return True
    cfg = sys.modules.get("torch._dynamo.config")
    return cfg is not None and getattr(cfg, "compiled_autograd", False) is True


def _first_tensor(out, tensor):
    """The first tensor of a module's output (a tuple, a list, a dict such
    as transformers' ModelOutput, whose first entry is the loss when there
    is one), or None."""
    if isinstance(out, (tuple, list)):
        items = out
    elif isinstance(out, dict):
        items = out.values()
    else:
        return None
    for v in items:
        if isinstance(v, tensor):
            return v
    return None


def _with_closure_outside(a, optimizer, args, kwargs, ctx):
    """The step's (args, kwargs) with its closure (``closure=`` or the first
    argument after the optimizer, as ``torch.optim`` steps take it) run in
    ``ctx`` (see ``Attribution.closure_outside``); None when there is none,
    which leaves them as they are. ``args`` starts with the optimizer
    (torch's step hooks are given the step's own arguments)."""
    closure = kwargs.get("closure") if isinstance(kwargs, dict) else None
    if callable(closure):
        kwargs = dict(kwargs)
        kwargs["closure"] = a.closure_outside(closure, ctx)
        return args, kwargs
    if isinstance(args, tuple) and len(args) >= 2 and args[0] is optimizer and callable(args[1]):
        return (args[0], a.closure_outside(args[1], ctx)) + args[2:], kwargs
    return None


# What the Python wrapper uses: module globals, not a closure (one function
# for the life of the process, whatever is installed).
_ATTRIB = None  # the installed Attribution
_ORIG = None  # the original Module.__call__ (kept after remove(): see below)


def _plain_compiling():
    return False


_compiling = _plain_compiling


def _set_globals(attrib, orig):
    global _ATTRIB, _ORIG, _compiling
    _ATTRIB = attrib
    if attrib is not None:
        _ORIG = orig  # stays: anyone still holding the wrapper calls through
        _compiling = attrib.compiling


def _module_call(self, *args, **kwargs):
    """Module.__call__ with the module's forward context around it: the
    cheapest way to see every module call (global module hooks would take
    every module off its fast path, see bench_attrib.py). Dynamo inlines
    it as the original call: _compiling() is constant there. With the
    native path (fastcall.cpp), this patches the class so that its next
    calls run in C, which hands every case but the common one back here."""
    if _compiling():
        return _ORIG(self, *args, **kwargs)
    attrib = _ATTRIB
    if attrib is None:
        return _ORIG(self, *args, **kwargs)
    native = attrib.native
    if native is not None and not native.patch(type(self)):
        # Not patchable: a class with its own __call__ (calling this through
        # super()) is here every time, so its calls go to C from here. (A
        # patched class's calls that reach this were already refused there.)
        out = native.call(self, args, kwargs)
        if out is not attrib.fast_slow:
            return out
    info = attrib.infos.get(id(self))
    if info is not None and info[3] & _QUIET:
        return _ORIG(self, *args, **kwargs)
    try:
        t = attrib.local.t
        st = t.stack
        slot = t.slot
        # With the native path, the caller's word: what the thread goes back
        # to (the caller may be a native call, which is not on the stack;
        # without it, the caller is the stack's top). With an empty stack
        # and the word marked inside, this call is inside a root the native
        # path runs (fastcall.cpp's root_call).
        prev = slot[0] if native is not None and slot is not None else None
        if prev is not None and not st and not prev & _INSIDE:
            prev = None  # the outermost call: _leave restores
        if info is None or prev is None and not st or attrib._capture_steps or slot is None:
            t, info = attrib._enter(self, FORWARD, nested=prev is not None)
            st = t.stack
        else:
            ctx = info[1].get(FORWARD) or attrib.ctx(info, FORWARD)
            st.append(ctx)
            # (The top bit is for the native path only: without it, no int
            # is made per call.)
            slot[0] = ctx if native is None else ctx | _INSIDE
    except AttributeError:  # the thread's first module call
        prev = None
        try:
            t, info = attrib._enter(self, FORWARD)
            st = t.stack
        except Exception as e:
            attrib.fail(e)
            return _ORIG(self, *args, **kwargs)
    except Exception as e:
        attrib.fail(e)
        return _ORIG(self, *args, **kwargs)
    depth = len(st)
    try:
        out = _ORIG(self, *args, **kwargs)
        if info[2] and attrib.grad_enabled():
            attrib._hook_backward(t, self, out, st[-1] if st else 0)
        return out
    finally:
        try:
            if len(st) == depth:
                st.pop()
            else:  # an inner call left early: drop what it left too
                del st[depth - 1 :]
            if prev is not None:
                t.slot[0] = prev  # (inside a native call, or a native root's)
            elif not st:
                attrib._leave(t)
            else:
                t.slot[0] = st[-1]
        except Exception:
            pass


_module_call.__name__ = "__call__"
_module_call.__qualname__ = "Module.__call__"


def _make_apply(attrib, orig):
    def _apply(self, *args, **kwargs):
        if attrib.compiling() or not attrib.installed:
            return orig(self, *args, **kwargs)
        t = None
        try:
            t, _ = attrib._enter(self, OTHER)
        except Exception as e:
            attrib.fail(e)
        try:
            return orig(self, *args, **kwargs)
        finally:
            if t is not None:
                try:
                    attrib._leave(t)
                except Exception:
                    pass
            if attrib.roles is not None:
                attrib.roles.moved()  # (parameters may have new places)

    _apply.__wrapped__ = orig
    _apply.__doc__ = orig.__doc__
    return _apply
