// A stand-in for torch's python_variable.h: only what
// assets/agent/fastcall.cpp uses, for tests/agent_attrib (no torch on CI).
// A "variable" is an instance of the stand-in Python torch's Tensor; its
// grad_fn() is one Node per stand-in grad_fn object, so a node's address is
// stable as it is in torch.
#pragma once

#include <Python.h>

#include <cstring>
#include <map>
#include <memory>

#include "torch/csrc/autograd/function.h"

struct FakeVariable {
    PyObject* obj;

    const std::shared_ptr<torch::autograd::Node>& grad_fn() const {
        static std::map<PyObject*, std::shared_ptr<torch::autograd::Node>> nodes;
        static const std::shared_ptr<torch::autograd::Node> none;
        PyObject* g = PyObject_GetAttrString(obj, "grad_fn");
        if (g == nullptr) {
            PyErr_Clear();
            return none;
        }
        Py_DECREF(g);  // the tensor keeps its grad_fn alive
        if (g == Py_None) {
            return none;
        }
        auto& n = nodes[g];
        if (!n) {
            n = std::make_shared<torch::autograd::Node>();
            n->py = g;
        }
        return n;
    }
};

inline bool THPVariable_Check(PyObject* obj) { return std::strcmp(Py_TYPE(obj)->tp_name, "Tensor") == 0; }

inline FakeVariable THPVariable_Unpack(PyObject* obj) { return FakeVariable{obj}; }
