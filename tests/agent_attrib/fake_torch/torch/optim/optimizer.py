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


class Optimizer:
    def step(self, work):
        for h in list(_pre.values()):
            h(self, (), {})
        work()
        for h in list(_post.values()):
            h(self, (), {})
