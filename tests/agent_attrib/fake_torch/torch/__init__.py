"""A stand-in for the few torch APIs vramscope/_attrib.py uses, so that its
logic runs on CI with no torch (tests/agent_attrib.rs). Not torch."""
from . import compiler, nn, optim  # noqa: F401

_grad = [True]


def is_grad_enabled():
    return _grad[0]


class Node:
    """A grad_fn: keeps its pre-hooks; the test runs them as backward would."""

    def __init__(self, name):
        self.name = name
        self.prehooks = []

    def register_prehook(self, hook):
        self.prehooks.append(hook)


class Tensor:
    def __init__(self, grad_fn=None):
        self.grad_fn = grad_fn
