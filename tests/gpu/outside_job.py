"""A job for tests/gpu/outside_check.sh (issue 47), run under `vramscope
run`: GPT-2 (gpt2), ResNet-50 with cuDNN (conv), a torch.compile'd MLP
(compile) or GPT-2 under DDP (ddp, under torchrun). At three quiescent
points (after 3 and 10 steps, after empty_cache) it synchronises, holds
still, and has `vramscope snapshot --json --for 11` look at it; each
point's JSON (NVML's bytes, reserved, the named parts, unexplained) goes
into OUT. The gpt2 job runs torch.profiler for 3 steps after the second
point and says how many CUDA events the profile holds and what the agent
says of its accounting then (with TEARDOWN_CUPTI=1 it trains on until the
accounting is back, at most 15 s); `--bench` runs BENCH_PAIRS (default 15)
pairs of 10-step blocks, one with the accounting on and one stepped aside,
the order turned each pair, and reports each block's step time.
`--late`: the job is not under `vramscope run` (the agent on PYTHONPATH):
it runs 3 steps bare, then calls `vramscope.attach()`: what it held
outside the allocator by then is "context and earlier".

    python3 tests/gpu/outside_job.py JOB OUT.json [--bench | --late]
"""

import json
import os
import subprocess
import sys
import time

import torch

JOB, OUT = sys.argv[1], sys.argv[2]
BENCH = "--bench" in sys.argv
BENCH_PAIRS = int(os.environ.get("BENCH_PAIRS", "15"))
LATE = "--late" in sys.argv
B = os.environ["VRAMSCOPE_BIN"]
rank = int(os.environ.get("LOCAL_RANK", "0"))
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    OUT = OUT.replace(".json", ".%d.json" % rank)
torch.cuda.set_device(rank)
report = {"job": JOB + (" late" if LATE else ""), "points": []}

from outside_jobs import step_of  # noqa: E402

step = step_of(JOB, rank)
if LATE:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    import vramscope
    vramscope.attach()


def agent():
    try:
        import vramscope
        return vramscope.status()
    except Exception as e:
        return {"error": str(e)}


def point(name):
    torch.cuda.synchronize()
    out = subprocess.run([B, "snapshot", "--json", "--for", "11"], capture_output=True, text=True, timeout=60)
    try:
        snap = json.loads(out.stdout)
    except Exception:
        snap = None
    me = None
    for p in (snap or {}).get("processes", []):
        if p.get("identity", {}).get("host_pid") == os.getpid():
            me = p
    f = (me or {}).get("view", {}).get("figures", {})
    p = {
        "name": name,
        "reserved_torch": torch.cuda.memory_reserved(),
        "nvml": f.get("nvml_used"),
        "reserved": f.get("reserved"),
        "other": f.get("non_pytorch"),
        "named": f.get("outside_named"),
        "unexplained": f.get("unexplained"),
        "outside": (me or {}).get("view", {}).get("outside"),
        "agent": agent().get("outside"),
        "snapshot_err": out.stderr[-500:],
    }
    report["points"].append(p)
    print("%-9s nvml %s reserved %s other %s named %s unexplained %s agent %s" % (
        name, p["nvml"], p["reserved"], p["other"], p["named"], p["unexplained"], p["agent"]), flush=True)
    with open(OUT, "w") as fh:
        json.dump(report, fh, indent=1)


def timed(n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


# Wait for the agent (exact, and the accounting outside started).
t0 = time.time()
step()
while time.time() - t0 < 120:
    s = agent()
    if s.get("mode") == "exact" and s.get("outside") not in ("starting", "not started"):
        break
    time.sleep(0.5)
print("agent:", agent(), flush=True)
for _ in range(2):
    step()
point("step3")
for _ in range(7):
    step()
point("step10")
if BENCH:
    from vramscope import _outside
    # Blocks in pairs, the order turned each pair (on-off, off-on, ...) so
    # that a GPU whose clock drifts through the run weighs on both alike.
    on, off = [], []
    for i in range(BENCH_PAIRS):
        for accounting in ((True, False) if i % 2 == 0 else (False, True)):
            if not accounting:
                _outside._step_aside()
            (on if accounting else off).append(timed(10))
            if not accounting:
                _outside._come_back()
    report["bench"] = {"on": on, "off": off}
    print("bench on %s off %s" % (["%.4f" % v for v in on], ["%.4f" % v for v in off]), flush=True)
if JOB == "gpt2" and not BENCH:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    k = sum(1 for e in prof.events() if "CUDA" in str(getattr(e, "device_type", "")))
    # With TEARDOWN_CUPTI=1 the profiler gives CUPTI back at the first CUDA
    # call after the profile (Kineto finalizes CUPTI from a callback), so
    # the job trains on, as a real one would: the accounting comes back
    # within its retry (2 s).
    t1 = time.time()
    while os.environ.get("TEARDOWN_CUPTI") == "1" and time.time() - t1 < 15:
        if agent().get("outside") is True:
            break
        step()
        torch.cuda.synchronize()
    report["profile"] = {"cuda_events": k, "agent_after": agent().get("outside")}
    print("profile: %d CUDA events; accounting after: %s" % (k, agent().get("outside")), flush=True)
    for _ in range(3):
        step()
torch.cuda.empty_cache()
point("emptied")
with open(OUT, "w") as fh:
    json.dump(report, fh, indent=1)
print("done", flush=True)
