"""Issue 47, research: what a PyTorch job's device memory outside the
caching allocator is made of. Runs one job (gpt2, conv, compile) with
tests/gpu/outside_probe.cpp loaded before CUDA starts, and at set points
writes NVML's bytes for this process, torch's reserved bytes, the device's
free bytes and the probe's table (library, kind, live bytes, free-memory
drop, calls, free memory gained) into a JSON file. The gpt2 job also runs torch.profiler twice
in the middle: once with the probe subscribed, once with it stepped aside,
and says how many CUDA kernel events each profile holds.

    python3 tests/gpu/outside_probe.py JOB PROBE.so OUT.json
"""

import ctypes
import json
import os
import sys
import time

JOB, PROBE, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
probe = ctypes.CDLL(PROBE)
probe.probe_free.restype = ctypes.c_longlong
why = ctypes.create_string_buffer(512)
rc = probe.probe_start(why, 512)
report = {"job": JOB, "start": {"rc": rc, "said": why.value.decode()}, "points": []}
print("probe:", rc, why.value.decode(), flush=True)

import torch  # noqa: E402

nv = ctypes.CDLL("libnvidia-ml.so.1")
nv.nvmlInit_v2()


class Proc(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


def nvml_bytes(index=None):
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    h = ctypes.c_void_p()
    if nv.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)) != 0:
        return None
    n = ctypes.c_uint(256)
    arr = (Proc * 256)()
    if nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr) != 0:
        return None
    for i in range(n.value):
        if arr[i].pid == os.getpid():
            return arr[i].used
    return 0


def table():
    buf = ctypes.create_string_buffer(1 << 20)
    probe.probe_dump(buf, 1 << 20)
    rows = []
    for line in buf.value.decode(errors="replace").splitlines():
        lib, what, held, drop, calls, rise = line.split("\t")
        rows.append({"lib": lib, "what": what, "held": int(held), "drop": int(drop), "calls": int(calls), "rise": int(rise)})
    return rows


def point(name, **extra):
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    time.sleep(0.3)
    p = {
        "name": name,
        "nvml": nvml_bytes(),
        "reserved": torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0,
        "allocated": torch.cuda.memory_allocated() if torch.cuda.is_initialized() else 0,
        "free": probe.probe_free(),
        "table": table(),
    }
    p.update(extra)
    report["points"].append(p)
    named = sum(r["held"] for r in p["table"] if r["what"] in ("cuMemAlloc", "async", "vmm", "managed")
                and not r["lib"].startswith("libc10_cuda"))
    print("%-10s nvml %s reserved %d named-alloc %d" % (name, p["nvml"], p["reserved"], named), flush=True)
    with open(OUT, "w") as f:
        json.dump(report, f, indent=1)


def kernels_in(prof):
    n = 0
    for e in prof.events():
        dt = getattr(e, "device_type", None)
        if dt is not None and "CUDA" in str(dt):
            n += 1
    return n


def profile_steps(step, n, label):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    k = kernels_in(prof)
    print("profile %s: %d CUDA events" % (label, k), flush=True)
    return k


point("start")
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
torch.zeros(1, device="cuda")
point("init")

from outside_jobs import step_of  # noqa: E402

step = step_of(JOB, int(os.environ.get("LOCAL_RANK", "0")))

point("model")
step()
point("step1")
for _ in range(9):
    step()
point("step10")
if JOB == "gpt2" and os.environ.get("PROBE_PROFILE") == "aside":
    # Stepped aside before the profiler's first start, back after it, twice.
    for i in (1, 2):
        probe.probe_stop()
        k = profile_steps(step, 3, "probe stepped aside %d" % i)
        rc2 = probe.probe_start(why, 512)
        point("profiled-aside-%d" % i, kernels=k, restart=rc2, said=why.value.decode())
        for _ in range(3):
            step()
        point("after-profile-%d" % i)
elif JOB == "gpt2":
    k_on = profile_steps(step, 3, "probe subscribed")
    point("profiled-probe-on", kernels=k_on)
    probe.probe_stop()
    k_off = profile_steps(step, 3, "probe stepped aside")
    rc2 = probe.probe_start(why, 512)
    point("profiled-probe-off", kernels=k_off, restart=rc2, said=why.value.decode())
    for _ in range(3):
        step()
    point("after-profile")
torch.cuda.empty_cache()
point("emptied")
print("done", flush=True)
