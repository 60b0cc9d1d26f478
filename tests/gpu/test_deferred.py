"""attach() before CUDA is initialised waits, then attaches on torch's lazy
init; events follow. Also the `vramscope run` path (run.sh runs this file a
second time with VRAMSCOPE_AUTO=1 and the agent's sitecustomize)."""
import os
import time

import common
from common import check, dump, of

import torch
import vramscope

auto = os.environ.get("VRAMSCOPE_AUTO") == "1"
if not auto:
    check(vramscope.attach(), "attach() before CUDA init returns True")
    time.sleep(0.2)
    check(vramscope.status()["mode"] == "pending", "pending until CUDA is initialised")
    check(not os.listdir(os.environ["VRAMSCOPE_SHM_DIR"]), "no segment before CUDA init")
else:
    check(vramscope.status()["mode"] == "pending", "sitecustomize attached on import torch (%s)" % vramscope.status())
x = torch.ones(1 << 20, device="cuda")  # first CUDA use
st = common.wait_mode(vramscope)
check(st["mode"] == "exact", "exact after lazy init (%s)" % st)
y = torch.empty(5 << 20, device="cuda")
del y
time.sleep(0.2)
evs, _ = dump(st["path"])
check(any(f["size"] == 20 << 20 for f in of(evs, "Alloc")), "Alloc after attach arrives")
segs = common.snapshot_segments(evs, 0)
in_snap = bool(segs) and any(b["addr"] == x.data_ptr() for s in segs for b in s["blocks"])
in_events = any(f["addr"] == x.data_ptr() for f in of(evs, "Alloc"))
check(segs is not None, "first snapshot complete")
check(in_snap or in_events, "the tensor made at init is in the snapshot (%s) or the events (%s)" % (in_snap, in_events))
common.done()
