// A stand-in for torch's autograd Node and FunctionPreHook: only what
// assets/agent/fastcall.cpp uses, for tests/agent_attrib (no torch on CI).
// A Node stands for a grad_fn of the stand-in Python torch
// (tests/agent_attrib/fake_torch): add_pre_hook appends to that grad_fn's
// `prehooks` list a Python callable that runs the C++ hook, so the test's
// "backward" (calling each of them) runs C++ hooks and Python hooks alike.
#pragma once

#include <Python.h>

#include <memory>
#include <vector>

namespace torch {
namespace autograd {

struct Variable {};
using variable_list = std::vector<Variable>;

struct FunctionPreHook {
    virtual ~FunctionPreHook() = default;
    virtual variable_list operator()(const variable_list& grads) = 0;
};

namespace fake {
inline void free_hook(PyObject* capsule) {
    delete static_cast<FunctionPreHook*>(PyCapsule_GetPointer(capsule, "vs_fake_hook"));
}

inline PyObject* run_hook(PyObject* capsule, PyObject*) {
    auto* hook = static_cast<FunctionPreHook*>(PyCapsule_GetPointer(capsule, "vs_fake_hook"));
    (*hook)(variable_list{});
    Py_RETURN_NONE;
}

inline PyMethodDef* run_hook_def() {
    static PyMethodDef def = {"cpp_prehook", run_hook, METH_O, "a C++ FunctionPreHook (stand-in torch)"};
    return &def;
}
}  // namespace fake

struct Node {
    PyObject* py = nullptr;  // the stand-in grad_fn (kept alive by its tensor in the test)

    void add_pre_hook(std::unique_ptr<FunctionPreHook>&& hook) {
        PyObject* capsule = PyCapsule_New(hook.release(), "vs_fake_hook", fake::free_hook);
        PyObject* fn = capsule ? PyCFunction_New(fake::run_hook_def(), capsule) : nullptr;
        PyObject* list = PyObject_GetAttrString(py, "prehooks");
        if (fn == nullptr || list == nullptr || PyList_Append(list, fn) < 0) {
            PyErr_Clear();
        }
        Py_XDECREF(list);
        Py_XDECREF(fn);
        Py_XDECREF(capsule);
    }
};

}  // namespace autograd
}  // namespace torch
