// vramscope's native module call path (issue 15): the common case of
// vramscope/_attrib.py's Module.__call__ wrapper, in C, so that attribution
// costs a small-batch training loop (where the host CPU is the bottleneck)
// about what a module call costs already, not microseconds more.
//
// Built by vramscope/_build.py (build_fast) against this Python's headers
// and, with VS_TORCH, torch's (linking libtorch_python): then the backward
// pre-hooks of tracked modules are C++ too (below). Loaded as the extension
// module vramscope._vsfast. If it cannot be built with torch, it is built
// without (forward only); without Python.h the Python wrapper does the same
// work, slower.
//
// How it is installed: Module.__call__ stays the Python wrapper, for
// everything that reads it (Dynamo inlines it, `super().__call__()` and
// torch.fx find it). What changes is the C slot that calling an instance
// uses: the first time a module class is called through the Python wrapper,
// `Call.patch` points that class's tp_call at module_tp_call below, provided
// the class's __call__ is the wrapper (a class with its own __call__ keeps
// it) and its tp_call is still CPython's generic one. CPython itself undoes
// this whenever __call__ is assigned anywhere above the class (remove(),
// torch.fx's tracer patching Module.__call__ for a while): it recomputes the
// slots of every subclass, and the wrapper patches them again when it is
// back.
//
// The fast path does what the Python wrapper does for a module called inside
// another one: the thread's native word (read by the allocator callback)
// takes the module's forward context for the call and gets its caller's
// back after, the backward pre-hook is registered where the module is
// tracked, and the original Module.__call__ runs in between. It touches
// little memory, which is what a call costs in a real step (where every
// cache line is cold): the module's entry in a small table (a copy of what
// `infos` says, dropped whenever `infos` changes) and the thread's word,
// found from the thread pointer (module_tp_call's short path is a few
// straight cache lines of code); the caller's context stays in a C
// local, and the thread's Python stack of contexts holds only the calls
// the Python wrapper made (the root first). The word's top bit (kInside)
// says the thread is inside a root module's call.
//
// A root's call (the model's, the loss's: the outermost call on a thread)
// runs here too once the Python wrapper has run one on that thread
// (Call.root_ready: a forward thread, its modules named, its contexts
// defined, no capture request pending): root_call does what the wrapper's
// _enter and _leave do, with no Python (in a real step the wrapper's root
// call cost tens of microseconds, most of attribution's cost on a small
// model). Anything else (a module not named yet, stack capture, a thread
// seen for the first time, a root after `infos` changed) is handed to the
// Python wrapper, which handles every case; one that runs inside a native
// root finds the word marked inside with an empty stack, and the root
// through Call.current_root().
//
// With VS_TORCH, a tracked module whose output is a tensor (or a tuple or
// list starting with one) gets its backward pre-hook here too: a C++
// FunctionPreHook on the output's grad_fn that stores the module's backward
// context into the autograd thread's native word, one plain store, with no
// GIL and no Python (a Python pre-hook costs its registration every forward
// and a GIL round trip every backward: tens of microseconds each in a real
// step). Other outputs (dicts: a root's ModelOutput), compiled autograd
// (whose graphs need hooks it can trace) and stack capture take the Python
// hook.
//
// Never raises into user code on its own account: on anything unexpected it
// takes the Python wrapper's path; exceptions from the module itself pass
// through unchanged, after the stack is unwound.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#ifdef VS_TORCH
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>
#endif

#if PY_VERSION_HEX < 0x03090000  // Python 3.8 (torch 2.1 to 2.4)
static inline PyObject *PyObject_VectorcallDict(PyObject *f, PyObject *const *args, size_t n, PyObject *kw) {
    return _PyObject_FastCallDict(f, args, n, kw);
}
static inline PyObject *PyObject_CallNoArgs(PyObject *f) { return PyObject_CallObject(f, nullptr); }
static inline PyObject *PyObject_CallOneArg(PyObject *f, PyObject *a) {
    return PyObject_CallFunctionObjArgs(f, a, nullptr);
}
#endif

namespace {

// _attrib.py's flags: a root (named as one: a model, a loss), and a leaf
// module without parameters (its caller's).
constexpr long kRoot = 1, kQuiet = 8;

// The native word's top bit (above the 24-bit context id, which is all the
// tracker reads): this thread is inside a root module's call, so a module
// called now is an inner one (_attrib.py's _INSIDE).
constexpr uint32_t kInside = 0x80000000u;

// What the fast path needs of a module, copied from its `infos` entry the
// first time it is called: one probe of a small open-addressing table, not
// a dict lookup through an int, a list, a dict and three ints (in a real
// step those are cache misses: what a module call cost). A copy, so that
// nothing here can dangle: `Call.changed()` (every change to `infos` and its
// entries, _attrib.py) drops every entry at once by moving `gen` on.
// Sixteen bytes, and 2,048 of them (32 KiB): in a real step each call's
// entry is a cold line, often on a page the TLB has lost too, so the table
// is kept as small as it can be.
constexpr uint32_t kContextMask = 0xFFFFFFu;  // a context id (what the tracker reads)
struct Entry {
    PyObject *key;       // the module (its address only: never dereferenced)
    uint32_t fwd_flags;  // its forward context, the flags above it
    uint32_t bwd_gen;    // its backward context (kEntryHasBwd), the entry's gen above it
    uint32_t fwd() const { return fwd_flags & kContextMask; }
    uint32_t flags() const { return fwd_flags >> 24; }
    uint32_t bwd() const { return bwd_gen & kContextMask; }
    uint32_t gen() const { return bwd_gen >> 24; }  // valid when the Call's gen
};
constexpr uint32_t kEntryQuiet = 1, kEntryTracked = 2, kEntryHasBwd = 4, kEntryRoot = 8;
constexpr uint32_t kGens = 256;       // gen is 8 bits; 0 is never current (calloc'd: free)
constexpr unsigned kEntryBits = 11;  // 2,048 entries; at most kProbes probes
constexpr size_t kEntries = size_t{1} << kEntryBits;
constexpr size_t kProbes = 8;  // (then an entry is replaced: see probe)

// Where a module's probes start (Fibonacci hashing of its address).
inline size_t home(PyObject *module) {
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(module) * 0x9E3779B97F4A7C15ull) >> (64 - kEntryBits));
}

struct Call {
    PyObject_HEAD
    // What every call reads (one cache line with the head).
    PyObject *orig;          // the original Module.__call__ (a function)
    Entry *entries;          // kEntries, PyMem_Calloc'd
    uint32_t gen;            // entries of another gen are free (1 to kGens - 1)
    int slow;                // 1: every call takes the Python wrapper (capture)
    unsigned long long fast; // calls that took the fast path (for tests)
    // What a root call reads too (see root_call).
    int native_hooks;        // 1: backward pre-hooks in C++ where they fit
    uint32_t epoch;          // moves on with every change (gen wraps): root_ready's mark
    uint32_t none_backward;  // the context of backward outside every module
    const volatile uint64_t *capture_word;  // the control block's capture request count, or NULL
    unsigned long long capture_seen;        // the count the Python side has acted on
    unsigned long long roots; // root calls that took the native path (for tests)
    ternaryfunc slot_call;   // CPython's generic tp_call, as Module had it
    PyObject *py;            // the Python wrapper: slow path and __get__
    PyObject *infos;         // dict: id(module) -> [path id, {phase: ctx}, tracked, flags]
    PyObject *local;         // threading.local whose `t` is the thread's _Thread
    PyObject *forward;       // the FORWARD phase key (an int)
    PyObject *hook_backward; // callable(t, module, output, ctx): never raises
    PyObject *grad_enabled;  // torch.is_grad_enabled
    PyTypeObject *thread_type;
    Py_ssize_t off_slot;     // offsets of _Thread's `slot` and `last_fn` slots
    Py_ssize_t off_last;     // (last_fn: the grad_fn hooked last)
    PyObject *backward;      // the BACKWARD phase key (an int)
    unsigned long long hooks; // C++ backward pre-hooks registered (for tests)
};

PyObject *g_str_t = nullptr;  // "t"

// The offset of a __slots__ member of `type` holding an object, or -1.
Py_ssize_t slot_offset(PyTypeObject *type, const char *name) {
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);  // borrowed
    if (d == nullptr || !PyObject_TypeCheck(d, &PyMemberDescr_Type)) {
        return -1;
    }
    PyMemberDef *m = reinterpret_cast<PyMemberDescrObject *>(d)->d_member;
    if (m->type != T_OBJECT_EX || m->offset <= 0) {
        return -1;
    }
    return m->offset;
}

PyObject *field(PyObject *obj, Py_ssize_t off) {
    // Sound: `obj` is exactly of the type the offset was read from (checked
    // by the caller), and a slot member holds a PyObject* or NULL.
    return *reinterpret_cast<PyObject **>(reinterpret_cast<char *>(obj) + off);
}

// The native word a memoryview of one uint32 (cast "I") points to, or NULL.
uint32_t *word_of(PyObject *slot) {
    if (slot == nullptr || !PyMemoryView_Check(slot)) {
        return nullptr;
    }
    Py_buffer *b = PyMemoryView_GET_BUFFER(slot);
    if (b->buf == nullptr || b->len < static_cast<Py_ssize_t>(sizeof(uint32_t)) || b->readonly) {
        return nullptr;
    }
    return static_cast<uint32_t *>(b->buf);
}

// A context id as the native word holds it; false when `v` is no such int.
bool context_value(PyObject *v, uint32_t *out) {
    if (!PyLong_CheckExact(v)) {
        return false;
    }
    unsigned long x = PyLong_AsUnsignedLong(v);
    if (x == static_cast<unsigned long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        return false;
    }
    if (x > UINT32_MAX) {
        return false;
    }
    *out = static_cast<uint32_t>(x);
    return true;
}

// The tracker's vs_agent_context_slot: the calling thread's context word
// (set_slot_function; NULL before the tracker is loaded, or without one).
using SlotFn = uint32_t *(*)();

// What module_tp_call reads on every call, in one cache line.
struct alignas(64) Globals {
    Call *active = nullptr;    // the Call installed (activate), or NULL
    SlotFn slot_fn = nullptr;  // vs_agent_context_slot (set_slot_function)
    // The word's address less the thread pointer, or 0: call slot_fn.
    // (Atomic: any thread may find it wrong and clear it.)
    std::atomic<intptr_t> word_offset{0};
};
Globals g;

// The thread pointer. The tracker's word is an initial-exec thread-local,
// which lives in the static TLS area at the same offset from every
// thread's pointer: so the fast path finds it with one register read and an
// add, instead of a call into the tracker's code (in a real step its page
// is often out of the TLB). Where this cannot be had, slot_fn is called.
#if defined(__x86_64__)
inline char *thread_pointer() {
    char *tp;
    asm("mov %%fs:0, %0" : "=r"(tp));  // the TCB's pointer to itself (x86-64 TLS ABI)
    return tp;
}
#define VS_THREAD_POINTER 1
#elif defined(__aarch64__)
inline char *thread_pointer() { return static_cast<char *>(__builtin_thread_pointer()); }
#define VS_THREAD_POINTER 1
#endif

// Checks, on the calling thread, that the offset finds what slot_fn gives
// (set_slot_function learns it on one thread; each thread that readies a
// root or runs backward checks it on its own); on a mismatch the fast path
// calls slot_fn from then on.
void check_word_offset() {
#ifdef VS_THREAD_POINTER
    const intptr_t off = g.word_offset.load(std::memory_order_relaxed);
    if (off != 0 && g.slot_fn != nullptr && reinterpret_cast<char *>(g.slot_fn()) != thread_pointer() + off) {
        g.word_offset.store(0, std::memory_order_relaxed);
    }
#endif
}

// What the native path keeps per thread (never read by the allocator
// callback, so a dlopen'ed library's thread_local is fine here).
struct ThreadState {
    PyObject *root = nullptr;    // the root module in root_call now (borrowed: the call holds it)
    void *last_node = nullptr;   // the grad_fn given a C++ pre-hook last (cleared when the root returns)
    Call *ready = nullptr;       // root calls may take root_call on this thread (Call.root_ready) ...
    uint32_t ready_epoch = 0;    // ... while the Call's epoch is this one
    bool py_hooked = false;      // a Python pre-hook set the thread's last_fn inside root_call
    uint32_t *backward = nullptr; // the word, where registered as a backward thread
    ~ThreadState();
};
thread_local ThreadState t_state;

// The words of the threads that ran backward pre-hooks (autograd engine
// threads): a root's forward puts each back outside every module
// (Call.none_backward) unless that thread is inside a module itself (a
// checkpointing recompute). A thread leaves the list as it exits (its
// ThreadState's destructor runs before its thread-local storage goes); a
// forked child starts with an empty list (its other threads are gone).
// The lock is held for a few stores at a time: a spin lock, which the
// child's fork handler can simply clear.
constexpr size_t kBackwardThreads = 64;
std::atomic_flag g_bw_lock = ATOMIC_FLAG_INIT;
uint32_t *g_bw_words[kBackwardThreads];
size_t g_bw_count = 0;

class BackwardLock {
  public:
    BackwardLock() {
        while (g_bw_lock.test_and_set(std::memory_order_acquire)) {
        }
    }
    ~BackwardLock() { g_bw_lock.clear(std::memory_order_release); }
    BackwardLock(const BackwardLock &) = delete;
    BackwardLock &operator=(const BackwardLock &) = delete;
};

void after_fork_child() {
    g_bw_count = 0;
    g_bw_lock.clear();
}

// The calling thread runs backward: into the list (once), and root calls
// on it take the Python wrapper from now on (as _attrib.py's t.backward).
void backward_thread() {
    ThreadState &ts = t_state;
    ts.ready = nullptr;
    check_word_offset();
    if (ts.backward != nullptr || g.slot_fn == nullptr) {
        return;
    }
    uint32_t *w = g.slot_fn();
    BackwardLock lock;
    if (w != nullptr && g_bw_count < kBackwardThreads) {
        g_bw_words[g_bw_count++] = w;
        ts.backward = w;
    }
}

ThreadState::~ThreadState() {
    if (backward == nullptr) {
        return;
    }
    BackwardLock lock;
    for (size_t i = 0; i < g_bw_count; i++) {
        if (g_bw_words[i] == backward) {
            g_bw_words[i] = g_bw_words[--g_bw_count];
            break;
        }
    }
}

// A root's forward begins: every backward thread starts its next backward
// outside every module (_attrib.py's _new_forward).
void new_forward(uint32_t none_backward) {
    BackwardLock lock;
    for (size_t i = 0; i < g_bw_count; i++) {
        // Another thread's word: relaxed atomics (the tracker reads it with
        // plain loads on its own thread; a 32-bit store is never torn).
        uint32_t *w = g_bw_words[i];
        if (!(__atomic_load_n(w, __ATOMIC_RELAXED) & kInside)) {
            __atomic_store_n(w, none_backward, __ATOMIC_RELAXED);
        }
    }
}

#ifdef VS_TORCH
// Backward reached the node that made a tracked module's output: the thread
// running it (an autograd engine thread) now works for that module.
struct ContextPreHook final : torch::autograd::FunctionPreHook {
    explicit ContextPreHook(uint32_t c) : ctx(c) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list &grads) override {
        if (t_state.backward == nullptr) {
            backward_thread();  // (once per thread)
        }
        *g.slot_fn() = ctx;  // the word is this thread's: a plain store
        return grads;
    }
    uint32_t ctx;
};

// The grad_fn of `tensor` (a torch tensor), or NULL. Never raises.
void *node_of(PyObject *tensor) {
    try {
        return THPVariable_Unpack(tensor).grad_fn().get();
    } catch (...) {
        return nullptr;
    }
}

// The module's backward pre-hook in C++, for the backward context `bwd`. 1:
// done (hooked, or nothing to hook); 0: not for here (the Python hook
// decides). Never raises.
int native_backward_hook(Call *c, uint32_t bwd, PyObject *out) {
    if (!c->native_hooks || g.slot_fn == nullptr) {
        return 0;
    }
    PyObject *tensor = out;
    if ((PyTuple_CheckExact(out) || PyList_CheckExact(out)) && PySequence_Fast_GET_SIZE(out) > 0) {
        tensor = PySequence_Fast_GET_ITEM(out, 0);
    }
    if (!THPVariable_Check(tensor)) {
        return 0;  // a dict, or a tuple led by something else
    }
    try {
        const auto &fn = THPVariable_Unpack(tensor).grad_fn();
        if (!fn) {
            return 1;
        }
        // The inner module's output already (a module returning its last
        // child's output): the innermost module's hook stands.
        void *node = fn.get();
        if (node == t_state.last_node) {
            return 1;
        }
        fn->add_pre_hook(std::make_unique<ContextPreHook>(bwd));
        t_state.last_node = node;
        c->hooks++;
        return 1;
    } catch (...) {
        return 0;
    }
}

bool grad_mode_on() { return c10::GradMode::is_enabled(); }
#else
void *node_of(PyObject *) { return nullptr; }
int native_backward_hook(Call *, uint32_t, PyObject *) { return 0; }
bool grad_mode_on() { return true; }  // (the Python side asks torch)
#endif

__attribute__((noinline)) PyObject *slow(Call *c, PyObject *const *args, size_t nargs, PyObject *kwargs) {
    return PyObject_VectorcallDict(c->py, args, nargs, kwargs);
}

// Returned by Call.call when the Python wrapper must do the call itself.
PyObject *g_slow_sentinel = nullptr;

#define VS_SLOW()          \
    do {                   \
        *handled = false;  \
        return nullptr;    \
    } while (0)

// The entry of `module` in the table; else the free entry where it would go
// (of another gen); else, when its probes are all taken, the first of them,
// to be replaced (entries are copies: one more call through `keep`, never
// a dangling one; so a job with more modules than entries still runs its
// calls here, not through the Python wrapper).
Entry *probe(Call *c, PyObject *module) {
    const size_t h = home(module);
    for (size_t i = 0; i < kProbes; i++) {
        Entry *e = &c->entries[(h + i) & (kEntries - 1)];
        if (e->gen() != c->gen || e->key == module) {
            return e;  // (entries are only ever dropped all at once)
        }
    }
    return &c->entries[h];
}

// Copies the module's `infos` entry into `into` (free, or replaced). false
// (no error set): not a module the fast path can take (not named yet, its
// forward context not defined yet: the Python wrapper does that).
__attribute__((noinline)) bool keep(Call *c, PyObject *module, Entry *into) {
    PyObject *key = PyLong_FromVoidPtr(module);
    if (key == nullptr) {
        PyErr_Clear();
        return false;
    }
    PyObject *info = PyDict_GetItemWithError(c->infos, key);  // borrowed
    Py_DECREF(key);
    if (info == nullptr || !PyList_CheckExact(info) || PyList_GET_SIZE(info) < 4) {
        PyErr_Clear();
        return false;
    }
    long flags = PyLong_AsLong(PyList_GET_ITEM(info, 3));
    PyObject *phases = PyList_GET_ITEM(info, 1);
    if ((flags == -1 && PyErr_Occurred()) || !PyDict_CheckExact(phases)) {
        PyErr_Clear();
        return false;
    }
    uint32_t fwd_ctx = 0, bwd_ctx = 0, kept_flags = 0;
    if (flags & kQuiet) {  // a leaf without parameters: its caller's context
        kept_flags = kEntryQuiet;
    } else {
        PyObject *fwd = PyDict_GetItemWithError(phases, c->forward);
        if (fwd == nullptr || !context_value(fwd, &fwd_ctx) || fwd_ctx > kContextMask) {
            PyErr_Clear();
            return false;
        }
        PyObject *bwd = PyDict_GetItemWithError(phases, c->backward);
        if (bwd != nullptr && context_value(bwd, &bwd_ctx) && bwd_ctx <= kContextMask) {
            kept_flags |= kEntryHasBwd;
        } else {
            bwd_ctx = 0;
        }
        PyErr_Clear();
        if (PyList_GET_ITEM(info, 2) == Py_True) {
            kept_flags |= kEntryTracked;
        }
        if (flags & kRoot) {
            kept_flags |= kEntryRoot;
        }
    }
    *into = Entry{module, fwd_ctx | (kept_flags << 24), bwd_ctx | (c->gen << 24)};
    return true;
}

// The calling thread's native word: the tracker's own (one call, no
// Python), else through the thread's _Thread (tests' stand-in library).
// NULL: none yet.
uint32_t *thread_word(Call *c) {
#ifdef VS_THREAD_POINTER
    const intptr_t off = g.word_offset.load(std::memory_order_relaxed);
    if (off != 0) {
        return reinterpret_cast<uint32_t *>(thread_pointer() + off);
    }
#endif
    if (g.slot_fn != nullptr) {
        return g.slot_fn();
    }
    PyObject *t = PyObject_GetAttr(c->local, g_str_t);
    if (t == nullptr) {
        PyErr_Clear();
        return nullptr;
    }
    // The memoryview stays alive with `t`, which the thread-local keeps.
    uint32_t *word = Py_TYPE(t) == c->thread_type ? word_of(field(t, c->off_slot)) : nullptr;
    Py_DECREF(t);
    return word;
}

// The Python pre-hook (hook_backward's other case). Never raises.
__attribute__((noinline)) void py_hook_backward(Call *c, PyObject *module, const Entry &e, PyObject *out) {
    PyObject *t = PyObject_GetAttr(c->local, g_str_t);
    if (t == nullptr) {
        PyErr_Clear();
        return;
    }
    PyObject *on = PyObject_CallNoArgs(c->grad_enabled);
    PyObject *ctx = PyLong_FromUnsignedLong(e.fwd());
    if (on == Py_True && ctx != nullptr) {
        PyObject *r = PyObject_CallFunctionObjArgs(c->hook_backward, t, module, out, ctx, nullptr);
        Py_XDECREF(r);
    }
    Py_XDECREF(ctx);
    Py_XDECREF(on);
    Py_DECREF(t);
    PyErr_Clear();  // (hook_backward catches its own; grad_enabled cannot fail)
}

// A tracked module's output: its backward pre-hook, in C++ where it fits,
// else in Python (while grad mode is on). Never raises.
inline void hook_backward(Call *c, PyObject *module, const Entry &e, PyObject *out) {
    if (!grad_mode_on()) {
        return;
    }
    if ((e.flags() & kEntryHasBwd) && native_backward_hook(c, e.bwd(), out)) {
        return;
    }
    py_hook_backward(c, module, e, out);
}

// The thread's _Thread forgets the grad_fn a Python pre-hook was given
// last (what _attrib.py's _leave does when a root returns). Never raises.
__attribute__((noinline)) void forget_py_last(Call *c) {
    PyObject *t = PyObject_GetAttr(c->local, g_str_t);
    if (t == nullptr) {
        PyErr_Clear();
        return;
    }
    if (Py_TYPE(t) == c->thread_type) {
        // Sound: `t` is exactly of the type the offset was read from, and
        // the slot holds a PyObject* or NULL.
        PyObject **slot = reinterpret_cast<PyObject **>(reinterpret_cast<char *>(t) + c->off_last);
        PyObject *old = *slot;
        Py_INCREF(Py_None);
        *slot = Py_None;
        Py_XDECREF(old);
    }
    Py_DECREF(t);
}

// A root module called outside every module on a thread the Python wrapper
// has readied (Call.root_ready: a forward thread, its module named, no
// capture pending): what the wrapper's _enter and _leave do, here. The
// backward threads start outside every module, the word takes the root's
// forward context for the call (marked inside a root), the root's output
// gets its backward pre-hook, and the caller's word comes back after.
__attribute__((noinline)) PyObject *root_call(Call *c, const Entry &e, uint32_t *word, uint32_t saved,
                                              PyObject *const *args, size_t nargs, PyObject *kwargs,
                                              bool *handled) {
    ThreadState &ts = t_state;
    if (ts.ready != c || ts.ready_epoch != c->epoch || ts.root != nullptr || g.slot_fn == nullptr ||
        (c->capture_word != nullptr && *c->capture_word != c->capture_seen)) {
        VS_SLOW();  // the Python wrapper (which readies the thread again)
    }
    PyObject *module = args[0];
    new_forward(c->none_backward);
    ts.root = module;
    *word = e.fwd() | kInside;
    c->roots++;

    PyObject *out = PyObject_VectorcallDict(c->orig, args, nargs, kwargs);

    if (out != nullptr && (e.flags() & kEntryTracked)) {
        hook_backward(c, module, e, out);
    }
    ts.root = nullptr;
    ts.last_node = nullptr;
    if (ts.py_hooked) {
        ts.py_hooked = false;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);  // (an exception from the module passes through)
        forget_py_last(c);
        PyErr_Restore(type, value, tb);
    }
    *word = saved;
    return out;
}

// A module call: args[0] is the module, then its arguments; kwargs a dict
// or NULL. *handled false (and NULL returned, no error set): the Python
// wrapper's case (see the top).
//
// The common case touches the module's table entry and the thread's word:
// the word's context goes to the module's for the call and back after
// (kept in a local here, on the C stack: the Python stack of contexts holds
// only the calls the Python wrapper made, the root first).
PyObject *fast_call(Call *c, PyObject *const *args, size_t nargs, PyObject *kwargs, bool *handled) {
    *handled = true;
    if (c->slow) {
        VS_SLOW();
    }
    PyObject *module = args[0];
    Entry *found = probe(c, module);
    if ((found->gen() != c->gen || found->key != module) && !keep(c, module, found)) {
        VS_SLOW();  // not a module for here (yet)
    }
    const Entry e = *found;  // (the call may change the table)
    if (e.flags() & kEntryQuiet) {
        return PyObject_VectorcallDict(c->orig, args, nargs, kwargs);
    }
    uint32_t *word = thread_word(c);
    const uint32_t saved = word != nullptr ? *word : 0;
    if (!(saved & kInside)) {  // the outermost call on this thread, or no word yet
        if (word == nullptr || !(e.flags() & kEntryRoot)) {
            VS_SLOW();
        }
        return root_call(c, e, word, saved, args, nargs, kwargs, handled);
    }
    *word = e.fwd() | kInside;
    c->fast++;

    PyObject *out = PyObject_VectorcallDict(c->orig, args, nargs, kwargs);

    if (out != nullptr && (e.flags() & kEntryTracked)) {
        hook_backward(c, module, e, out);
    }
    *word = saved;  // the caller's context (an exception passes through)
    return out;
}

// The module followed by the items of an args tuple, as one vectorcall
// argument array (borrowed references: the caller holds the module, the
// tuple the rest). ok() false: out of memory, error set.
class ArgStack {
  public:
    ArgStack(PyObject *module, PyObject *args) : n_(PyTuple_GET_SIZE(args) + 1) {
        if (n_ > kSmall) {
            items_ = static_cast<PyObject **>(PyMem_Malloc(n_ * sizeof(PyObject *)));
            if (items_ == nullptr) {
                PyErr_NoMemory();
                return;
            }
        }
        items_[0] = module;
        for (Py_ssize_t i = 1; i < n_; i++) {
            items_[i] = PyTuple_GET_ITEM(args, i - 1);
        }
    }
    ~ArgStack() {
        if (items_ != small_) {
            PyMem_Free(items_);
        }
    }
    ArgStack(const ArgStack &) = delete;
    ArgStack &operator=(const ArgStack &) = delete;
    bool ok() const { return items_ != nullptr; }
    PyObject *const *items() const { return items_; }
    size_t size() const { return static_cast<size_t>(n_); }

  private:
    static constexpr Py_ssize_t kSmall = 8;
    Py_ssize_t n_;
    PyObject *small_[kSmall];
    PyObject **items_ = small_;
};

// Every case of a module call (module_tp_call's when its short path does
// not apply): the class's own __call__ once deactivated, else fast_call and,
// where it declines, the Python wrapper.
__attribute__((noinline, cold)) PyObject *module_call_general(PyObject *self, PyObject *args, PyObject *kwargs) {
    ArgStack stack(self, args);
    if (!stack.ok()) {
        return nullptr;
    }
    if (g.active == nullptr) {  // deactivated, class not yet reset: the class's own __call__
        PyObject *f = PyObject_GetAttrString(reinterpret_cast<PyObject *>(Py_TYPE(self)), "__call__");
        PyObject *out = f == nullptr ? nullptr : PyObject_VectorcallDict(f, stack.items(), stack.size(), kwargs);
        Py_XDECREF(f);
        return out;
    }
    bool handled;
    PyObject *out = fast_call(g.active, stack.items(), stack.size(), kwargs, &handled);
    return handled ? out : slow(g.active, stack.items(), stack.size(), kwargs);
}

#define VS_UNLIKELY(x) __builtin_expect(!!(x), 0)

// A tracked module's output gets its backward pre-hook (out of line: about
// one call in eight is tracked).
__attribute__((noinline)) void track_output(Call *c, PyObject *module, const Entry &e, PyObject *out) {
    hook_backward(c, module, e, out);
}

// The tp_call of a patched module class (see the top). Its short path is
// fast_call's common case, written so that it is a few straight cache lines
// of code (in a real step each call finds them cold): a module found at its
// entry's first probe, not a root, called inside a root (or quiet), with
// the thread's word at the thread pointer's offset and a few arguments.
// Anything else goes to module_call_general.
PyObject *module_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    constexpr Py_ssize_t kShortArgs = 6;
#ifdef VS_THREAD_POINTER
    Call *const c = g.active;
    const intptr_t off = g.word_offset.load(std::memory_order_relaxed);
    const Py_ssize_t n = PyTuple_GET_SIZE(args);
    if (VS_UNLIKELY(c == nullptr || c->slow || off == 0 || n > kShortArgs)) {
        return module_call_general(self, args, kwargs);
    }
    const Entry *e = &c->entries[home(self)];
    const uint32_t flags = e->flags();
    uint32_t *const word = reinterpret_cast<uint32_t *>(thread_pointer() + off);
    const uint32_t saved = *word;
    if (VS_UNLIKELY(e->key != self || e->gen() != c->gen || (flags & kEntryRoot) ||
                    (!(saved & kInside) && !(flags & kEntryQuiet)))) {
        return module_call_general(self, args, kwargs);
    }
    const Entry entry = *e;  // (the call may change the table)
    PyObject *stack[kShortArgs + 1];
    stack[0] = self;
    for (Py_ssize_t i = 0; i < n; i++) {
        stack[i + 1] = PyTuple_GET_ITEM(args, i);
    }
    if (flags & kEntryQuiet) {
        return PyObject_VectorcallDict(c->orig, stack, static_cast<size_t>(n + 1), kwargs);
    }
    *word = entry.fwd() | kInside;
    c->fast++;
    PyObject *out = PyObject_VectorcallDict(c->orig, stack, static_cast<size_t>(n + 1), kwargs);
    if (VS_UNLIKELY(flags & kEntryTracked) && out != nullptr) {
        track_output(c, self, entry, out);
    }
    *word = saved;  // the caller's context (an exception passes through)
    return out;
#else
    return module_call_general(self, args, kwargs);
#endif
}

// Call.activate(Module): module calls take the fast path from now on
// (Module.__call__ must be the Python wrapper).
PyObject *call_activate(PyObject *self_obj, PyObject *arg) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (!PyType_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "activate(Module)");
        return nullptr;
    }
    PyTypeObject *tp = reinterpret_cast<PyTypeObject *>(arg);
    PyObject *f = PyObject_GetAttrString(arg, "__call__");
    if (f == nullptr) {
        return nullptr;
    }
    const bool ours = f == c->py;
    Py_DECREF(f);
    if (!ours || tp->tp_call == module_tp_call || tp->tp_call == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "Module.__call__ is not the wrapper");
        return nullptr;
    }
    c->slot_call = tp->tp_call;  // CPython's generic slot (slot_tp_call)
    Py_INCREF(self_obj);
    Py_XSETREF(g.active, c);
    Py_RETURN_NONE;
}

// Call.deactivate(): back to the classes' own __call__ (the caller assigns
// Module.__call__ next, which resets every patched class).
PyObject *call_deactivate(PyObject *self_obj, PyObject *) {
    if (g.active == reinterpret_cast<Call *>(self_obj)) {
        Py_CLEAR(g.active);
    }
    Py_RETURN_NONE;
}

// Call.patch(cls) -> whether calls of `cls` take the fast path: patched now
// or before. Only a class whose __call__ is the wrapper and whose tp_call is
// CPython's generic slot is patched.
PyObject *call_patch(PyObject *self_obj, PyObject *arg) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (!PyType_Check(arg)) {
        Py_RETURN_FALSE;
    }
    PyTypeObject *tp = reinterpret_cast<PyTypeObject *>(arg);
    if (tp->tp_call == module_tp_call) {
        Py_RETURN_TRUE;
    }
    if (g.active != c || c->slot_call == nullptr || tp->tp_call != c->slot_call ||
        !PyType_HasFeature(tp, Py_TPFLAGS_HEAPTYPE)) {
        Py_RETURN_FALSE;
    }
    PyObject *f = PyObject_GetAttrString(arg, "__call__");
    if (f == nullptr) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    const bool ours = f == c->py;
    Py_DECREF(f);
    if (!ours) {
        Py_RETURN_FALSE;
    }
    // Sound: a heap type's tp_call is a plain field that CPython reads on
    // every call of an instance and rewrites (update_slot) whenever __call__
    // changes in the class or above it; module_tp_call does what the
    // generic slot would do (call __call__ with the instance first) plus the
    // context, and is never freed (this module is never unloaded).
    tp->tp_call = module_tp_call;
    Py_RETURN_TRUE;
}

// Call.call(module, args, kwargs) -> the module's result, or SLOW: the fast
// path for a call that reached the Python wrapper (a class with its own
// __call__ calling super().__call__, as transformers' layers do).
PyObject *call_call(PyObject *self_obj, PyObject *const *argv, Py_ssize_t argc) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (argc != 3 || !PyTuple_CheckExact(argv[1]) || (argv[2] != Py_None && !PyDict_CheckExact(argv[2]))) {
        Py_INCREF(g_slow_sentinel);
        return g_slow_sentinel;
    }
    ArgStack stack(argv[0], argv[1]);
    if (!stack.ok()) {
        return nullptr;
    }
    bool handled;
    PyObject *out = fast_call(c, stack.items(), stack.size(), argv[2] == Py_None ? nullptr : argv[2], &handled);
    if (!handled) {
        Py_INCREF(g_slow_sentinel);
        return g_slow_sentinel;
    }
    return out;
}

// Call.hook(t, info, output) -> whether the module's backward pre-hook was
// made in C++ (or was not needed): for calls the Python wrapper handles.
PyObject *call_hook(PyObject *self_obj, PyObject *const *argv, Py_ssize_t argc) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (argc != 3 || Py_TYPE(argv[0]) != c->thread_type || !PyList_CheckExact(argv[1]) ||
        PyList_GET_SIZE(argv[1]) < 4) {
        Py_RETURN_FALSE;
    }
    PyObject *phases = PyList_GET_ITEM(argv[1], 1);
    PyObject *ctx = PyDict_CheckExact(phases) ? PyDict_GetItemWithError(phases, c->backward) : nullptr;
    uint32_t bwd = 0;
    if (ctx == nullptr || !context_value(ctx, &bwd)) {
        PyErr_Clear();
        Py_RETURN_FALSE;  // its backward context is not defined yet
    }
    return PyBool_FromLong(native_backward_hook(c, bwd, argv[2]));
}

// Call.root_ready(): the Python wrapper has just entered a root's forward
// on this thread (a forward thread: not one that runs backward), its
// module named and its contexts defined: later root calls on this thread
// may take root_call, until anything in `infos` changes.
PyObject *call_root_ready(PyObject *self_obj, PyObject *) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    ThreadState &ts = t_state;
    check_word_offset();
    if (ts.backward == nullptr) {
        ts.ready = c;
        ts.ready_epoch = c->epoch;
    }
    Py_RETURN_NONE;
}

// Call.current_root() -> the root module root_call is running on this
// thread, or None (the Python wrapper names new modules under it).
PyObject *call_current_root(PyObject *, PyObject *) {
    PyObject *r = t_state.root != nullptr ? t_state.root : Py_None;
    Py_INCREF(r);
    return r;
}

// Call.set_capture(address): where the control block's capture request
// count is (a uint64 the collector writes; 0: none). A root call whose
// count differs from capture_seen takes the Python wrapper, which picks
// the request up.
PyObject *call_set_capture(PyObject *self_obj, PyObject *arg) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    void *p = PyLong_AsVoidPtr(arg);
    if (p == nullptr && PyErr_Occurred()) {
        return nullptr;
    }
    c->capture_word = static_cast<const volatile uint64_t *>(p);
    Py_RETURN_NONE;
}

// Call.changed(): `infos` or one of its entries changed (a module named,
// renamed or gone, a context defined, the tracked set): the table's copies
// are dropped, and made again at each module's next call.
PyObject *call_changed(PyObject *self_obj, PyObject *) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    c->epoch++;
    if (++c->gen == kGens) {  // (every 255 changes: start afresh)
        memset(c->entries, 0, kEntries * sizeof(Entry));
        c->gen = 1;
    }
    Py_RETURN_NONE;
}

PyMethodDef call_methods[] = {
    {"hook", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call_hook)), METH_FASTCALL,
     "hook(t, info, output) -> whether the backward pre-hook was made in C++"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(call_call)), METH_FASTCALL,
     "call(module, args, kwargs) -> its result, or SLOW (the Python wrapper's case)"},
    {"activate", call_activate, METH_O, "activate(Module): module calls take the fast path"},
    {"deactivate", call_deactivate, METH_NOARGS, "deactivate(): no fast path (then assign Module.__call__)"},
    {"patch", call_patch, METH_O, "patch(cls) -> whether calls of cls take the fast path"},
    {"changed", call_changed, METH_NOARGS, "changed(): infos changed (the fast path's copies are dropped)"},
    {"root_ready", call_root_ready, METH_NOARGS, "root_ready(): root calls on this thread may take the native path"},
    {"current_root", call_current_root, METH_NOARGS, "current_root() -> the root module the native path runs, or None"},
    {"set_capture", call_set_capture, METH_O, "set_capture(address of the capture request count, or 0)"},
    {nullptr, nullptr, 0, nullptr},
};

void call_dealloc(PyObject *self_obj) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    Py_XDECREF(c->orig);
    Py_XDECREF(c->py);
    Py_XDECREF(c->infos);
    Py_XDECREF(c->local);
    Py_XDECREF(c->forward);
    Py_XDECREF(c->backward);
    Py_XDECREF(c->hook_backward);
    Py_XDECREF(c->grad_enabled);
    PyMem_Free(c->entries);
    Py_XDECREF(reinterpret_cast<PyObject *>(c->thread_type));
    Py_TYPE(self_obj)->tp_free(self_obj);
}

PyObject *call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static const char *names[] = {"orig",          "py",           "infos",       "local", "forward", "backward",
                                  "hook_backward", "grad_enabled", "thread_type", nullptr};
    PyObject *orig, *py, *infos, *local, *forward, *backward, *hook, *grad;
    PyTypeObject *thread_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!OO!O!OOO!:Call", const_cast<char **>(names), &orig, &py,
                                     &PyDict_Type, &infos, &local, &PyLong_Type, &forward, &PyLong_Type, &backward,
                                     &hook, &grad, &PyType_Type, &thread_type)) {
        return nullptr;
    }
    Py_ssize_t off_slot = slot_offset(thread_type, "slot");
    Py_ssize_t off_last = slot_offset(thread_type, "last_fn");
    if (off_slot < 0 || off_last < 0) {
        PyErr_SetString(PyExc_TypeError, "thread_type needs __slots__ 'slot' and 'last_fn'");
        return nullptr;
    }
    Entry *entries = static_cast<Entry *>(PyMem_Calloc(kEntries, sizeof(Entry)));
    if (entries == nullptr) {
        return PyErr_NoMemory();
    }
    Call *c = reinterpret_cast<Call *>(type->tp_alloc(type, 0));
    if (c == nullptr) {
        PyMem_Free(entries);
        return nullptr;
    }
    c->slot_call = nullptr;
    PyObject **fields[] = {&c->orig,     &c->py,            &c->infos,        &c->local,
                           &c->forward, &c->backward, &c->hook_backward, &c->grad_enabled};
    PyObject *values[] = {orig, py, infos, local, forward, backward, hook, grad};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    Py_INCREF(thread_type);
    c->thread_type = thread_type;
    c->off_slot = off_slot;
    c->off_last = off_last;
    c->entries = entries;
    c->gen = 1;  // (calloc'd entries are of gen 0: free)
    c->epoch = 0;
    c->slow = 0;
    c->native_hooks = 0;
    c->none_backward = 0;
    c->capture_word = nullptr;
    c->capture_seen = 0;
    c->roots = 0;
    c->fast = 0;
    c->hooks = 0;
    return reinterpret_cast<PyObject *>(c);
}

PyMemberDef call_members[] = {
    {"slow", T_INT, offsetof(Call, slow), 0, "1: every call takes the Python wrapper"},
    {"native_hooks", T_INT, offsetof(Call, native_hooks), 0,
     "1: backward pre-hooks in C++ where they fit (needs a torch build and set_slot_function)"},
    {"fast", T_ULONGLONG, offsetof(Call, fast), READONLY, "calls that took the fast path"},
    {"roots", T_ULONGLONG, offsetof(Call, roots), READONLY, "root calls that took the native path"},
    {"none_backward", T_UINT, offsetof(Call, none_backward), 0, "the context of backward outside every module"},
    {"capture_seen", T_ULONGLONG, offsetof(Call, capture_seen), 0, "the capture request count acted on"},
    {"hooks", T_ULONGLONG, offsetof(Call, hooks), READONLY, "C++ backward pre-hooks registered"},
    {"orig", T_OBJECT, offsetof(Call, orig), READONLY, "the original Module.__call__"},
    {"py", T_OBJECT, offsetof(Call, py), READONLY, "the Python wrapper"},
    {nullptr, 0, 0, 0, nullptr},
};

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// set_slot_function(address of vs_agent_context_slot) -> whether backward
// pre-hooks can be C++ (a torch build). Either way the fast path reads the
// thread's word through it from now on.
PyObject *set_slot_function(PyObject *, PyObject *arg) {
    void *p = PyLong_AsVoidPtr(arg);
    if (p == nullptr && PyErr_Occurred()) {
        return nullptr;
    }
    g.slot_fn = reinterpret_cast<SlotFn>(p);
    g.word_offset.store(0, std::memory_order_relaxed);
#ifdef VS_THREAD_POINTER
    if (g.slot_fn != nullptr) {
        g.word_offset.store(reinterpret_cast<char *>(g.slot_fn()) - thread_pointer(), std::memory_order_relaxed);
    }
#endif
#ifdef VS_TORCH
    return PyBool_FromLong(p != nullptr);
#else
    Py_RETURN_FALSE;
#endif
}

// hooked_last(tensor) -> whether its grad_fn is the one this thread gave a
// C++ pre-hook last (an inner module's output, returned by its caller).
PyObject *hooked_last(PyObject *, PyObject *arg) {
#ifdef VS_TORCH
    if (THPVariable_Check(arg)) {
        void *node = node_of(arg);
        return PyBool_FromLong(node != nullptr && node == t_state.last_node);
    }
#else
    (void)arg;
#endif
    Py_RETURN_FALSE;
}

// clear_last(): a root the Python wrapper ran has returned (its _leave).
PyObject *clear_last(PyObject *, PyObject *) {
    t_state.last_node = nullptr;
    Py_RETURN_NONE;
}

// py_hooked(): a Python pre-hook set this thread's last_fn inside a root
// the native path runs (which clears it when the root returns).
PyObject *py_hooked(PyObject *, PyObject *) {
    t_state.py_hooked = true;
    Py_RETURN_NONE;
}

// backward_thread(): this thread runs backward pre-hooks (Python's): a
// root's forward puts its word outside every module, and root calls on it
// take the Python wrapper.
PyObject *py_backward_thread(PyObject *, PyObject *) {
    backward_thread();
    Py_RETURN_NONE;
}

PyMethodDef module_methods[] = {
    {"hooked_last", hooked_last, METH_O, "hooked_last(tensor) -> whether its grad_fn got this thread's last C++ pre-hook"},
    {"clear_last", clear_last, METH_NOARGS, "clear_last(): a root run by the Python wrapper returned"},
    {"py_hooked", py_hooked, METH_NOARGS, "py_hooked(): a Python pre-hook set last_fn inside a native root call"},
    {"backward_thread", py_backward_thread, METH_NOARGS, "backward_thread(): this thread runs backward"},
    {"set_slot_function", set_slot_function, METH_O,
     "set_slot_function(address of vs_agent_context_slot) -> whether backward pre-hooks can be C++"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT};

}  // namespace

PyMODINIT_FUNC PyInit__vsfast(void) {
    CallType.tp_name = "vramscope._vsfast.Call";
    CallType.tp_basicsize = sizeof(Call);
    CallType.tp_flags = Py_TPFLAGS_DEFAULT;
    CallType.tp_doc = "The state of vramscope's native module call path (see fastcall.cpp)";
    CallType.tp_new = call_new;
    CallType.tp_dealloc = call_dealloc;
    CallType.tp_members = call_members;
    CallType.tp_methods = call_methods;
    if (PyType_Ready(&CallType) < 0) {
        return nullptr;
    }
    pthread_atfork(nullptr, nullptr, after_fork_child);
    g_str_t = PyUnicode_InternFromString("t");
    if (g_str_t == nullptr) {
        return nullptr;
    }
    module_def.m_name = "vramscope._vsfast";
    module_def.m_doc = "vramscope's native module call path (see fastcall.cpp)";
    module_def.m_size = -1;
    module_def.m_methods = module_methods;
    PyObject *m = PyModule_Create(&module_def);
    if (m == nullptr) {
        return nullptr;
    }
#ifdef VS_TORCH
    const long with_torch = 1;
#else
    const long with_torch = 0;
#endif
    g_slow_sentinel = PyObject_CallNoArgs(reinterpret_cast<PyObject *>(&PyBaseObject_Type));
    if (g_slow_sentinel == nullptr || PyModule_AddObject(m, "SLOW", g_slow_sentinel) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    Py_INCREF(g_slow_sentinel);  // (kept: the module's reference is its own)
    if (PyModule_AddIntConstant(m, "WITH_TORCH", with_torch) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    Py_INCREF(&CallType);
    if (PyModule_AddObject(m, "Call", reinterpret_cast<PyObject *>(&CallType)) < 0) {
        Py_DECREF(&CallType);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
