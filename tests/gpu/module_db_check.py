"""PyTorch's own module_db, forward on CUDA, each output hashed bit for
bit: run bare twice and once under `vramscope run` (the agent exact, with
attribution and the accounting outside the caching allocator) by
tests/gpu/module_db_check.sh, which compares them. The agent never changes
what PyTorch computes: every case the two bare runs agree on must hash the
same under the agent.

    python3 tests/gpu/module_db_check.py OUT.json
"""

import hashlib
import json
import os
import sys

import torch

# torch's test helpers import expecttest, which a machine without PyTorch's
# test requirements lacks (the GPU machine reaches no registry): a stand-in
# with its one class is enough for module_db.
try:
    import expecttest  # noqa: F401
except ImportError:
    import types
    import unittest

    _m = types.ModuleType("expecttest")
    _m.TestCase = unittest.TestCase
    sys.modules["expecttest"] = _m
from torch.testing._internal.common_modules import module_db  # noqa: E402

OUT = sys.argv[1]
# (cuDNN's benchmark is off by default; torch's test helpers fix the flags.)
torch.use_deterministic_algorithms(True, warn_only=True)


def digest(x, h):
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.is_complex():
            t = torch.view_as_real(t)
        t = t.contiguous().cpu()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(x, (list, tuple)):
        for y in x:
            digest(y, h)
    elif isinstance(x, dict):
        for k in sorted(x):
            digest(x[k], h)
    else:
        h.update(repr(x).encode())


# Under the agent: wait until it is exact and the accounting outside the
# allocator runs (it starts once CUDA does).
torch.zeros(1, device="cuda")
if "vramscope" in sys.modules or os.environ.get("VRAMSCOPE_SHM_DIR"):
    import time
    try:
        import vramscope
        t0 = time.time()
        while time.time() - t0 < 90:
            st = vramscope.status()
            if st.get("mode") == "exact" and st.get("outside") not in ("starting", "not started"):
                break
            time.sleep(0.25)
    except ImportError:
        pass

out = {}
for info in module_db:
    name = info.name
    try:
        inputs = info.module_inputs_func(info, device="cuda", dtype=torch.float32, requires_grad=False, training=False)
    except Exception as e:
        out[name] = "inputs: %s" % type(e).__name__
        continue
    for i, mi in enumerate(inputs):
        key = "%s/%d" % (name, i)
        try:
            torch.manual_seed(1234)
            m = info.module_cls(*mi.constructor_input.args, **mi.constructor_input.kwargs)
            m = m.to("cuda").eval()
            args = mi.forward_input.args if mi.forward_input is not None else ()
            kwargs = mi.forward_input.kwargs if mi.forward_input is not None else {}
            with torch.no_grad():
                y = m(*args, **kwargs)
            torch.cuda.synchronize()
            h = hashlib.sha256()
            digest(y, h)
            out[key] = h.hexdigest()
        except Exception as e:
            out[key] = "error: %s" % type(e).__name__
try:
    import vramscope
    agent = vramscope.status()
except Exception:
    agent = None
json.dump({"agent": agent, "cases": out}, open(OUT, "w"))
print("cases %d, agent %s" % (len(out), agent and {k: agent.get(k) for k in ("mode", "attribution", "outside")}))
