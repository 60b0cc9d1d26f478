class Parameter:
    def __init__(self, name):
        self.name = name


class Module:
    """Registers children and parameters like torch's Module, calls forward
    through __call__ -> _wrapped_call_impl, and recurses in _apply."""

    def __init__(self):
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        object.__setattr__(self, name, value)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(prefix + "." + name if prefix else name)

    def _wrapped_call_impl(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    __call__ = _wrapped_call_impl

    def _apply(self, fn, recurse=True):
        for m in self._modules.values():
            m._apply(fn)
        for p in self._parameters.values():
            fn(p)
        return self
