_pre, _post = {}, {}


class _Handle:
    def __init__(self, d, k):
        self.d, self.k = d, k

    def remove(self):
        self.d.pop(self.k, None)


def register_optimizer_step_pre_hook(hook):
    _pre[id(hook)] = hook
    return _Handle(_pre, id(hook))


def register_optimizer_step_post_hook(hook):
    _post[id(hook)] = hook
    return _Handle(_post, id(hook))


def _hooked(step):
    """As torch.optim's ``profile_hook_step``: the hooks see the step's own
    arguments (the optimizer first), and a pre-hook may give back new ones
    as ``(args, kwargs)``."""

    def wrapper(*args, **kwargs):
        self = args[0]
        for h in list(_pre.values()):
            r = h(self, args, kwargs)
            if r is not None:
                if not (isinstance(r, tuple) and len(r) == 2):
                    raise RuntimeError("a pre-hook must return None or (args, kwargs)")
                args, kwargs = r
        out = step(*args, **kwargs)
        for h in list(_post.values()):
            h(self, args, kwargs)
        return out

    return wrapper


class Optimizer:
    @_hooked
    def step(self, closure=None, work=None):
        """Runs ``closure`` (forward and backward, as LBFGS and Lightning
        pass it), then ``work`` (what the optimizer's own code allocates)."""
        loss = closure() if closure is not None else None
        if work is not None:
            work()
        return loss
