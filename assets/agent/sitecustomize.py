"""sitecustomize installed by `vramscope run` (first on PYTHONPATH).

With VRAMSCOPE_AUTO=1 it arranges for vramscope to attach as soon as the
script imports torch (torch is never imported early). Then it chains to the
sitecustomize this one shadows, if any, so the user's own start-up code
still runs; errors there propagate to site.py exactly as they would have.
"""


def _vramscope_setup():
    import os

    if os.environ.get("VRAMSCOPE_AUTO", "") not in ("", "0"):
        try:
            import vramscope

            vramscope._auto()
        except Exception as e:  # never break the interpreter's start-up
            import sys

            sys.stderr.write("vramscope: disabled: %s: %s\n" % (type(e).__name__, e))


def _vramscope_chain():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    if os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    mine = sys.modules.get("sitecustomize")
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if mine is not None:
            sys.modules["sitecustomize"] = mine
        raise


_vramscope_setup()
_vramscope_chain()
