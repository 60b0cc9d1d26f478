"""Sampled mode with the compiler hidden (or with cudaMallocAsync): one
announcement line, statistics equal torch's, snapshot, empty_cache."""
import os
import sys
import time

import common
from common import check, dump, cmd

import torch
import vramscope

MiB = 1 << 20
async_backend = "cudaMallocAsync" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
x = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda")
vramscope.attach()
st = common.wait_mode(vramscope)
print(st, flush=True)
check(st["mode"] == "sampled", "sampled mode (%s)" % st["reason"])
path = st["path"]
time.sleep(0.6)
evs, summ = dump(path)
check(summ["producer"] == "TorchSampled", "producer TorchSampled")
if not async_backend:
    segs = common.snapshot_segments(evs, 0)
    check(segs and any(b["addr"] == x.data_ptr() for s in segs for b in s["blocks"]), "snapshot holds the tensor's block")
common.quiescent_stats_match(torch, path, list(range(torch.cuda.device_count())), period=0.6)
y = torch.empty(200 * MiB, dtype=torch.uint8, device="cuda")
del y
torch.cuda.synchronize()
before = torch.cuda.memory_reserved()
o = cmd(path, "empty_cache")
after = torch.cuda.memory_reserved()
print(o, before, after, flush=True)
out = o.get("outcome", {})
check(out.get("status") == "Ok" and out.get("result0") == before and out.get("result1") == after, "empty_cache before/after match torch")
if not async_backend:
    check(after < before, "empty_cache released memory")
o = cmd(path, "ping", 5)
check(o.get("outcome", {}).get("result0") == 5, "ping (%.1f ms)" % o.get("ms", -1))
common.done()
