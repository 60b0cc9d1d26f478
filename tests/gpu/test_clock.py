"""Event timestamps: the tracker stamps allocator events with the time the
allocator took for them (TraceEntry::time_, the TSC on x86), converted to
CLOCK_MONOTONIC ns with a line the agent thread recalibrates every 100 ms.

Checks, on device 0: the converted clock is in use (on x86); every ALLOC of
a `torch.empty` lies within [t_before, t_after] of time.monotonic_ns() taken
around it (1 us of calibration error allowed, and reported); stamps never go
back within a device ring by more than 1 us (the largest step is printed);
the published line's error at recalibration stays under 1 us; the
clock_gettime fallback (vs_agent_set_clock(1)) still stamps inside the
window, and the converted clock comes back after it."""
import ctypes
import platform
import time

import common
from common import check, dump

import torch
import vramscope

STATES = {0: "clock_gettime only", 1: "verifying", 2: "converted", 3: "rejected", 4: "forced clock_gettime"}
TOL = 1000  # ns

torch.empty(1, device="cuda")
ok = vramscope.attach()
st = common.wait_mode(vramscope)
check(ok and st["mode"] == "exact", "exact mode (%s)" % st)
if st["mode"] != "exact":
    common.done()
path = st["path"]
lib = vramscope._st["lib"]
lib.vs_agent_clock_info.restype = ctypes.c_int
lib.vs_agent_clock_info.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]
lib.vs_agent_set_clock.restype = ctypes.c_int
lib.vs_agent_set_clock.argtypes = [ctypes.c_int]


def info():
    a = (ctypes.c_uint64 * 9)()
    lib.vs_agent_clock_info(a, 9)
    v = list(a)
    if v[3] >= 1 << 63:
        v[3] -= 1 << 64
    return v


def wait_state(want, timeout=3.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        # Events while verifying leave the samples the agent thread checks.
        x = torch.empty(1000, dtype=torch.uint8, device="cuda")
        del x
        if info()[0] == want:
            break
        time.sleep(0.01)
    return info()


x86 = platform.machine() in ("x86_64", "AMD64", "i686")
v = wait_state(2)
print("clock: %s, %d ticks/s, verification %d agreeing / %d not (worst %d ns)" % (STATES.get(v[0], v[0]), v[5], v[6], v[7], v[8]), flush=True)
if x86:
    check(v[0] == 2, "converted allocator time in use on x86 (state %s)" % STATES.get(v[0], v[0]))
else:
    check(v[0] in (0, 1, 2), "clock state %s" % STATES.get(v[0], v[0]))


def timed_allocs(first, batches, per_batch, pause):
    recs = []
    for b in range(batches):
        for i in range(per_batch):
            n = first + b * per_batch + i
            t0 = time.monotonic_ns()
            x = torch.empty(n, dtype=torch.uint8, device="cuda")
            t1 = time.monotonic_ns()
            recs.append((n, t0, t1))
            del x
        time.sleep(pause)
    return recs


def window_check(evs, recs, what):
    at = {}
    for (ring, kind, f, t) in evs:
        if ring == 1 and kind == "Alloc":
            at[f["size"]] = t
    found = [(n, t0, t1, at[n]) for (n, t0, t1) in recs if n in at]
    check(len(found) == len(recs), "%s: %d of %d allocations found" % (what, len(found), len(recs)))
    strict = sum(1 for (_, t0, t1, t) in found if t0 <= t <= t1)
    early = max([t0 - t for (_, t0, _, t) in found] + [0])
    late = max([t - t1 for (_, _, t1, t) in found] + [0])
    print("%s: %d of %d stamps strictly inside [t_before, t_after]; worst %d ns before, %d ns after" % (what, strict, len(found), early, late), flush=True)
    check(early <= TOL and late <= TOL, "%s: every stamp within 1 us of [t_before, t_after] (worst %d / %d ns)" % (what, early, late))
    return strict, len(found)


# ~1.2 s of allocations with pauses: a dozen recalibrations in between.
recs = timed_allocs(4096, 12, 800, 0.1)
time.sleep(0.2)
evs, summ = dump(path)
window_check(evs, recs, "converted clock")

# Stamps per device ring, in ring order.
worst_back, backs, count = 0, 0, 0
for d in range(torch.cuda.device_count()):
    prev = None
    for (ring, kind, f, t) in evs:
        if ring != 1 + d:
            continue
        count += 1
        if prev is not None and t < prev:
            backs += 1
            worst_back = max(worst_back, prev - t)
        prev = t
print("device rings: %d records, %d backward steps, largest %d ns" % (count, backs, worst_back), flush=True)
check(worst_back <= TOL, "stamps never go back within a device ring by more than 1 us (largest %d ns)" % worst_back)
check(summ["totals"]["lost"] == 0, "no loss (%s)" % summ["totals"])

v = info()
print("calibrations %d, largest error at recalibration %d ns, last %d ns, re-anchored %d" % (v[1], v[2], v[3], v[4]), flush=True)
if v[0] == 2:
    check(v[1] >= 10, "recalibrated every 100 ms (%d calibrations)" % v[1])
    check(v[2] <= TOL, "published line within 1 us of CLOCK_MONOTONIC at each recalibration (largest %d ns)" % v[2])
    check(v[4] == 0, "line never re-anchored (%d)" % v[4])

# The clock_gettime fallback, then back to the converted clock.
check(lib.vs_agent_set_clock(1) == 1, "clock_gettime fallback on request")
recs = timed_allocs(20000, 2, 500, 0.05)
time.sleep(0.2)
evs, _ = dump(path)
strict, total = window_check(evs, recs, "clock_gettime fallback")
check(strict == total, "clock_gettime fallback: all stamps strictly inside the window")
lib.vs_agent_set_clock(0)
if x86:
    v = info()
    check(v[0] == 2, "converted clock back after the fallback (state %s)" % STATES.get(v[0], v[0]))
    recs = timed_allocs(30000, 3, 500, 0.1)
    time.sleep(0.2)
    evs, _ = dump(path)
    window_check(evs, recs, "converted clock again")

common.done()
