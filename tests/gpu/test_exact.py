"""Exact mode on every GPU: pre-existing segments in the first snapshot,
allocator events, OOM, statistics equal to torch's at quiescent points,
empty_cache / reset peaks / ping / snapshot through the control block."""
import os
import sys
import time

import common
from common import check, dump, cmd, of

import torch
import vramscope

n = torch.cuda.device_count()
devs = list(range(n))
MiB = 1 << 20
# Memory allocated before attach: must appear in the first snapshot.
pre = [torch.empty(100 * MiB, dtype=torch.uint8, device="cuda:%d" % d) for d in devs]
t0 = time.time()
ok = vramscope.attach()
st = common.wait_mode(vramscope)
print("attach took %.2f s: %s" % (time.time() - t0, st), flush=True)
check(ok and st["mode"] == "exact", "exact mode on %s (%s)" % (torch.__version__, st))
if st["mode"] != "exact":
    common.done()
path = st["path"]

evs, summ = dump(path)
check(summ["producer"] == "TorchExact", "producer TorchExact")
check(summ["framework"] == ("torch " + torch.__version__)[:31], "framework %r" % summ["framework"])
check(summ["label"].startswith("test_exact.py"), "label %r" % summ["label"])
check(len(summ["rings"]) == 1 + n, "one agent ring + %d device rings" % n)
for d in devs:
    segs = common.snapshot_segments(evs, d)
    check(segs is not None, "device %d: first snapshot complete" % d)
    p = pre[d].data_ptr()
    hit = [b for s in (segs or []) for b in s["blocks"] if b["addr"] == p and b["state"] == "Allocated"]
    check(len(hit) == 1 and hit[0]["size"] >= 100 * MiB, "device %d: pre-existing block at %#x in the snapshot" % (d, p))

# Events: alloc / free / segment alloc / segment free / OOM on each device.
for d in devs:
    with torch.cuda.device(d):
        y = torch.empty(50 * MiB + 3, dtype=torch.uint8, device="cuda")
        yp = y.data_ptr()
        del y
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            pass
time.sleep(0.3)
evs, summ = dump(path)
for d in devs:
    ring = 1 + d
    mine = [(k, f) for (r, k, f, _) in evs if r == ring]
    kinds = [k for k, _ in mine]
    a = [f for k, f in mine if k == "Alloc" and f["size"] == 50 * MiB + 3]
    check(len(a) == 1 and a[0]["place"]["device"] == d, "device %d: Alloc of the request size" % d)
    yp_ok = a and a[0]["addr"] != 0
    check(yp_ok, "device %d: Alloc carries the address" % d)
    for k in ("FreeRequested", "FreeCompleted", "SegmentAlloc", "SegmentFree", "Oom"):
        check(k in kinds, "device %d: %s event" % (d, k))
    oom = [f for k, f in mine if k == "Oom"]
    check(oom and oom[0]["request"] >= (1 << 50), "device %d: OOM carries the request" % d)
check(summ["totals"]["lost"] == 0, "no loss (%s)" % summ["totals"])

# Statistics at a quiescent point.
common.quiescent_stats_match(torch, path, devs)

# Marker.
vramscope.mark(42)
time.sleep(0.05)
evs, _ = dump(path)
check(any(f["value"] == 42 for f in of(evs, "Marker")), "marker 42")

# empty_cache through the control block: cache some memory on every GPU.
for d in devs:
    z = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda:%d" % d)
    del z
for d in devs:
    torch.cuda.synchronize(d)
before = sum(torch.cuda.memory_reserved(d) for d in devs)
t = time.time()
o = cmd(path, "empty_cache")
after = sum(torch.cuda.memory_reserved(d) for d in devs)
print("empty_cache: %s in %.1f ms; torch before %d after %d" % (o, (time.time() - t) * 1e3, before, after), flush=True)
out = o.get("outcome", {})
check(out.get("status") == "Ok", "empty_cache answered Ok")
check(out.get("result0") == before, "empty_cache: reserved before %s == torch %d" % (out.get("result0"), before))
check(out.get("result1") == after, "empty_cache: reserved after %s == torch %d" % (out.get("result1"), after))
check(after < before and before - after >= 300 * MiB * n, "empty_cache released the cached 300 MiB per GPU")

# Reset peaks.
o = cmd(path, "reset_peaks")
check(o.get("outcome", {}).get("status") == "Ok", "reset_peaks Ok")
check(all(torch.cuda.max_memory_allocated(d) == torch.cuda.memory_allocated(d) for d in devs), "peaks reset")

# Ping and snapshot.
o = cmd(path, "ping", 1234)
check(o.get("outcome", {}).get("result0") == 1234, "ping echo (%.2f ms)" % o.get("ms", -1))
o = cmd(path, "snapshot")
sid = o.get("outcome", {}).get("result0")
time.sleep(0.1)
evs, summ = dump(path)
segs = common.snapshot_segments(evs, 0, sid)
tsegs = [s for s in torch.cuda.memory_snapshot() if s["device"] == 0]
check(segs is not None and len(segs) == len(tsegs), "snapshot %s: %s segments, torch %d" % (sid, None if segs is None else len(segs), len(tsegs)))
check(sorted(s["addr"] for s in segs or []) == sorted(s["address"] for s in tsegs), "snapshot segment addresses equal torch's")
check(summ["totals"]["lost"] == 0, "still no loss (%s)" % summ["totals"])

# Closed and unlinked at exit is checked by run.sh (no file left behind).
common.done()
