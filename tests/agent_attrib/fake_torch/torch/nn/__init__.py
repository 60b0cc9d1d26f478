from .modules.module import Module, Parameter  # noqa: F401
from .modules.container import ModuleDict, ModuleList, Sequential  # noqa: F401
from .modules import module as _m  # noqa: F401
