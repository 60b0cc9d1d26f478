from .module import Module


class ModuleList(Module):
    def __init__(self, mods):
        super().__init__()
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleDict(Module):
    pass


class Sequential(ModuleList):
    def forward(self, x):
        for m in self:
            x = m(x)
        return x
