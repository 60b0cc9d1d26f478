"""expandable_segments:True: SEGMENT_MAP / SEGMENT_UNMAP events arrive."""
import os
os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
import time

import common
from common import check, dump

import torch
import vramscope

torch.cuda.init()
vramscope.attach()
st = common.wait_mode(vramscope)
check(st["mode"] == "exact", "exact mode (%s)" % st)
MiB = 1 << 20
x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
y = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
del x, y
torch.cuda.synchronize()
torch.cuda.empty_cache()
time.sleep(0.3)
evs, summ = dump(st["path"])
kinds = [k for (r, k, f, _) in evs if r == 1]
check("SegmentMap" in kinds, "SegmentMap events (%d)" % kinds.count("SegmentMap"))
check("SegmentUnmap" in kinds, "SegmentUnmap events (%d)" % kinds.count("SegmentUnmap"))
snap = common.snapshot_segments(evs, 0)
check(snap is not None, "snapshot complete")
common.quiescent_stats_match(torch, st["path"], [0])
common.done()
