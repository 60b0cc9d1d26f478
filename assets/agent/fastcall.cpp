// vramscope's native module call path (issue 15): the common case of
// vramscope/_attrib.py's Module.__call__ wrapper, in C, so that attribution
// costs a small-batch training loop (where the host CPU is the bottleneck)
// about what a module call costs already, not microseconds more.
//
// Built by vramscope/_build.py (build_fast) against this Python's headers
// only: no torch headers, no libtorch. Loaded as the extension module
// vramscope._vsfast. If it cannot be built (no Python.h), the Python wrapper
// does the same work, slower.
//
// How it is installed: Module.__dict__["__call__"] becomes a `Call` object.
//  - Calling a module (`m(x)`) goes through the type's __call__ slot, which
//    finds a method descriptor (Py_TPFLAGS_METHOD_DESCRIPTOR) and calls it
//    with the module first: Call's vectorcall, below.
//  - Reading the attribute (`Module.__call__`, `m.__call__`, and so what
//    Dynamo and torch.fx see) gives the Python wrapper (tp_descr_get), so
//    torch.compile inlines the same Python function as without this file.
//
// The fast path does what the Python wrapper does for a module called inside
// another one, with its context known: push the module's forward context on
// the thread's stack (a Python list, shared with the Python code), write it
// to the thread's native word (read by the allocator callback), call the
// original Module.__call__, register the backward pre-hook where the module
// is tracked (in Python), pop. Anything else (the outermost call, a module
// not named yet, stack capture, a thread seen for the first time) is handed
// to the Python wrapper, which handles every case.
//
// Never raises into user code on its own account: on anything unexpected it
// takes the Python wrapper's path; exceptions from the module itself pass
// through unchanged, after the stack is unwound.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cstdint>

#if PY_VERSION_HEX < 0x03090000  // Python 3.8 (torch 2.1 to 2.4)
#define Py_TPFLAGS_HAVE_VECTORCALL _Py_TPFLAGS_HAVE_VECTORCALL
#define PyObject_Vectorcall _PyObject_Vectorcall
static inline PyObject *PyObject_CallNoArgs(PyObject *f) { return PyObject_CallObject(f, nullptr); }
static inline PyObject *PyObject_CallOneArg(PyObject *f, PyObject *a) {
    return PyObject_CallFunctionObjArgs(f, a, nullptr);
}
#endif

namespace {

// The pending exception, taken out while the stack is unwound.
struct SavedError {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = nullptr;
    void take() { exc = PyErr_GetRaisedException(); }
    void restore() { PyErr_SetRaisedException(exc); }
#else
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    void take() { PyErr_Fetch(&type, &value, &tb); }
    void restore() { PyErr_Restore(type, value, tb); }
#endif
};

// _attrib.py's flag for a leaf module without parameters (its caller's).
constexpr long kQuiet = 8;

struct Call {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *orig;          // the original Module.__call__ (a function)
    PyObject *py;            // the Python wrapper: slow path and __get__
    PyObject *infos;         // dict: id(module) -> [path id, {phase: ctx}, tracked, flags]
    PyObject *local;         // threading.local whose `t` is the thread's _Thread
    PyObject *forward;       // the FORWARD phase key (an int)
    PyObject *hook_backward; // callable(t, module, output, ctx): never raises
    PyObject *leave;         // callable(t): the thread left its outermost module
    PyObject *grad_enabled;  // torch.is_grad_enabled
    PyTypeObject *thread_type;
    Py_ssize_t off_stack;    // offsets of _Thread's `stack` and `slot` slots
    Py_ssize_t off_slot;
    int slow;                // 1: every call takes the Python wrapper (capture)
    unsigned long long fast; // calls that took the fast path (for tests)
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

PyObject *slow(Call *c, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return PyObject_Vectorcall(c->py, args, nargsf, kwnames);
}

PyObject *call_vectorcall(PyObject *self_obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (c->slow || PyVectorcall_NARGS(nargsf) < 1) {
        return slow(c, args, nargsf, kwnames);
    }
    PyObject *module = args[0];

    // The module's entry: [path id, {phase: context}, tracked, flags].
    PyObject *key = PyLong_FromVoidPtr(module);
    if (key == nullptr) {
        PyErr_Clear();
        return slow(c, args, nargsf, kwnames);
    }
    PyObject *info = PyDict_GetItemWithError(c->infos, key);  // borrowed
    Py_DECREF(key);
    if (info == nullptr || !PyList_CheckExact(info) || PyList_GET_SIZE(info) < 4) {
        PyErr_Clear();
        return slow(c, args, nargsf, kwnames);
    }
    long flags = PyLong_AsLong(PyList_GET_ITEM(info, 3));
    if (flags == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return slow(c, args, nargsf, kwnames);
    }
    if (flags & kQuiet) {  // a leaf without parameters: its caller's context
        return PyObject_Vectorcall(c->orig, args, nargsf, kwnames);
    }

    // The thread's state, its stack of contexts and its native word.
    PyObject *t = PyObject_GetAttr(c->local, g_str_t);
    if (t == nullptr) {  // the thread's first module call
        PyErr_Clear();
        return slow(c, args, nargsf, kwnames);
    }
    PyObject *stack = Py_TYPE(t) == c->thread_type ? field(t, c->off_stack) : nullptr;
    PyObject *slot = Py_TYPE(t) == c->thread_type ? field(t, c->off_slot) : nullptr;
    uint32_t *word = word_of(slot);
    PyObject *phases = PyList_GET_ITEM(info, 1);
    PyObject *ctx = PyDict_CheckExact(phases) ? PyDict_GetItemWithError(phases, c->forward) : nullptr;
    uint32_t value = 0;
    if (stack == nullptr || !PyList_CheckExact(stack) || PyList_GET_SIZE(stack) == 0 || word == nullptr ||
        ctx == nullptr || !context_value(ctx, &value)) {
        // The outermost call, no native word yet, or a context to define.
        PyErr_Clear();
        Py_DECREF(t);
        return slow(c, args, nargsf, kwnames);
    }
    // Held across the call: the module's code may rename (replace info's
    // items), forget (drop info from infos) or replace the thread's state.
    Py_INCREF(info);
    Py_INCREF(stack);
    Py_INCREF(slot);
    Py_INCREF(ctx);
    if (PyList_Append(stack, ctx) < 0) {
        PyErr_Clear();
        Py_DECREF(ctx);
        Py_DECREF(slot);
        Py_DECREF(stack);
        Py_DECREF(info);
        Py_DECREF(t);
        return slow(c, args, nargsf, kwnames);
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    *word = value;
    c->fast++;

    PyObject *out = PyObject_Vectorcall(c->orig, args, nargsf, kwnames);

    if (out != nullptr && PyList_GET_SIZE(info) >= 4 && PyList_GET_ITEM(info, 2) == Py_True) {
        // A tracked module: its backward pre-hook, while grad mode is on.
        PyObject *on = PyObject_CallNoArgs(c->grad_enabled);
        if (on == Py_True) {
            PyObject *r = PyObject_CallFunctionObjArgs(c->hook_backward, t, module, out, ctx, nullptr);
            Py_XDECREF(r);
        }
        Py_XDECREF(on);
        PyErr_Clear();  // (hook_backward catches its own; grad_enabled cannot fail)
    }

    // Unwind (an inner call that left early leaves its entries too), keeping
    // the module's exception, if any, for the caller.
    SavedError error;
    if (out == nullptr) {
        error.take();
    }
    Py_ssize_t now = PyList_GET_SIZE(stack);
    if (now >= depth && PyList_SetSlice(stack, depth - 1, now, nullptr) < 0) {
        PyErr_Clear();
    }
    uint32_t top = 0;
    if (PyList_GET_SIZE(stack) > 0 && context_value(PyList_GET_ITEM(stack, PyList_GET_SIZE(stack) - 1), &top)) {
        *word = top;
    } else {
        PyObject *r = PyObject_CallOneArg(c->leave, t);
        Py_XDECREF(r);
        PyErr_Clear();
    }
    if (out == nullptr) {
        error.restore();
    }
    Py_DECREF(ctx);
    Py_DECREF(slot);
    Py_DECREF(stack);
    Py_DECREF(info);
    Py_DECREF(t);
    return out;
}

// Module.__call__ and m.__call__ read as the Python wrapper (see the top).
PyObject *call_get(PyObject *self_obj, PyObject *obj, PyObject *) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    if (obj == nullptr || obj == Py_None) {
        Py_INCREF(c->py);
        return c->py;
    }
    return PyMethod_New(c->py, obj);
}

void call_dealloc(PyObject *self_obj) {
    Call *c = reinterpret_cast<Call *>(self_obj);
    Py_XDECREF(c->orig);
    Py_XDECREF(c->py);
    Py_XDECREF(c->infos);
    Py_XDECREF(c->local);
    Py_XDECREF(c->forward);
    Py_XDECREF(c->hook_backward);
    Py_XDECREF(c->leave);
    Py_XDECREF(c->grad_enabled);
    Py_XDECREF(reinterpret_cast<PyObject *>(c->thread_type));
    Py_TYPE(self_obj)->tp_free(self_obj);
}

PyObject *call_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static const char *names[] = {"orig", "py", "infos", "local", "forward", "hook_backward",
                                  "leave", "grad_enabled", "thread_type", nullptr};
    PyObject *orig, *py, *infos, *local, *forward, *hook, *leave, *grad;
    PyTypeObject *thread_type;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!OO!OOOO!:Call", const_cast<char **>(names), &orig, &py,
                                     &PyDict_Type, &infos, &local, &PyLong_Type, &forward, &hook, &leave, &grad,
                                     &PyType_Type, &thread_type)) {
        return nullptr;
    }
    Py_ssize_t off_stack = slot_offset(thread_type, "stack");
    Py_ssize_t off_slot = slot_offset(thread_type, "slot");
    if (off_stack < 0 || off_slot < 0) {
        PyErr_SetString(PyExc_TypeError, "thread_type needs __slots__ 'stack' and 'slot'");
        return nullptr;
    }
    Call *c = reinterpret_cast<Call *>(type->tp_alloc(type, 0));
    if (c == nullptr) {
        return nullptr;
    }
    c->vectorcall = call_vectorcall;
    PyObject **fields[] = {&c->orig, &c->py, &c->infos, &c->local, &c->forward, &c->hook_backward, &c->leave,
                           &c->grad_enabled};
    PyObject *values[] = {orig, py, infos, local, forward, hook, leave, grad};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        Py_INCREF(values[i]);
        *fields[i] = values[i];
    }
    Py_INCREF(thread_type);
    c->thread_type = thread_type;
    c->off_stack = off_stack;
    c->off_slot = off_slot;
    c->slow = 0;
    c->fast = 0;
    return reinterpret_cast<PyObject *>(c);
}

PyMemberDef call_members[] = {
    {"slow", T_INT, offsetof(Call, slow), 0, "1: every call takes the Python wrapper"},
    {"fast", T_ULONGLONG, offsetof(Call, fast), READONLY, "calls that took the fast path"},
    {"__wrapped__", T_OBJECT, offsetof(Call, orig), READONLY, "the original Module.__call__"},
    {"py", T_OBJECT, offsetof(Call, py), READONLY, "the Python wrapper"},
    {nullptr, 0, 0, 0, nullptr},
};

PyTypeObject CallType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT};

}  // namespace

PyMODINIT_FUNC PyInit__vsfast(void) {
    CallType.tp_name = "vramscope._vsfast.Call";
    CallType.tp_basicsize = sizeof(Call);
    CallType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
    CallType.tp_doc = "Module.__call__ with the module's forward context around it (vramscope)";
    CallType.tp_new = call_new;
    CallType.tp_dealloc = call_dealloc;
    CallType.tp_call = PyVectorcall_Call;
    CallType.tp_vectorcall_offset = offsetof(Call, vectorcall);
    CallType.tp_descr_get = call_get;
    CallType.tp_members = call_members;
    if (PyType_Ready(&CallType) < 0) {
        return nullptr;
    }
    g_str_t = PyUnicode_InternFromString("t");
    if (g_str_t == nullptr) {
        return nullptr;
    }
    module_def.m_name = "vramscope._vsfast";
    module_def.m_doc = "vramscope's native module call path (see fastcall.cpp)";
    module_def.m_size = -1;
    PyObject *m = PyModule_Create(&module_def);
    if (m == nullptr) {
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
