"""Which part of attribution costs a training step what (issue 15): the
parts taken away one at a time, measured side by side in one process.

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/ablate_attrib.py \
        MODEL [--rounds 300] [--out FILE.json]

Variants (each against bare in the same round, the order rotating, one
untimed step after every switch, then one timed step):
  bare      tracker writes off, attribution removed
  tracker   tracker on, attribution removed
  roots     attribution on with the tracker's tags off, but every module
            class below the roots calls torch's own Module.__call__ (its
            class gets it as its own __call__): what the roots' Python
            wrapper and the optimizer hooks cost
  quiet     tags off, every module below the roots quiet (the native path
            probes its entry and calls through: no word, no pre-hook)
  nobw      tags off, backward tracked for the roots only (=none)
  notag     tags off, everything else as the default
  attrib    the default
Besides the step's wall time: how long the host took to launch it (the
time to just before the synchronize), split into forward (zero_grad, the
model, the loss), backward and the optimizer step, and the main thread's
CPU time in that span, each also per round against the tracker's. A loop whose launch time is near its step time is host-bound:
there every microsecond of the host's shows.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_attrib  # noqa: E402
from vramscope import _attrib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "resnet"])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--out")
    ap.add_argument("--variants", help="comma-separated subset (bare and tracker are always measured)")
    a = ap.parse_args()
    forward, optimizer = bench_attrib.phases(a.model)

    def step_fn(t=None):
        loss = forward()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer()
        if t is not None:
            t.extend((t1, t2, time.perf_counter()))
    status, attrib, lib = bench_attrib.wait_for_agent()
    print("status:", status)
    for _ in range(3):
        step_fn()
    torch.cuda.synchronize()
    modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    roots = set()
    for m in modules:
        info = attrib.infos.get(id(m))
        if info is not None and info[3] & _attrib._ROOT:
            roots.add(type(m))
    inner = {type(m) for m in modules} - roots
    inner = {c for c in inner if "__call__" not in c.__dict__}
    print("roots:", sorted(c.__name__ for c in roots), "inner classes:", len(inner))
    saved = {}

    def set_variant(v):
        if not bench_attrib.set_attribution(attrib, lib, v):
            return
        lib.vs_agent_set_attribution(1 if v == "attrib" else 0)
        attrib.set_backward("none" if v == "nobw" else "auto")
        if v == "roots":
            for c in inner:
                c.__call__ = _attrib._ORIG
        if v == "quiet":
            for k, info in attrib.infos.items():
                if not info[3] & _attrib._ROOT:
                    saved[k] = info[3]
                    info[3] |= _attrib._QUIET
            attrib._changed()

    def unset(v):
        if v == "roots":
            for c in inner:
                del c.__call__
        if v == "quiet":
            for k, flags in saved.items():
                if k in attrib.infos:
                    attrib.infos[k][3] = flags
            saved.clear()
            attrib._changed()

    variants = ["bare", "tracker", "roots", "quiet", "nobw", "notag", "attrib"]
    if a.variants:
        want = set(a.variants.split(",")) | {"bare", "tracker"}
        variants = [v for v in variants if v in want]
    res = {v: {k: [] for k in ("step", "launch", "cpu", "forward", "backward", "optimizer")} for v in variants}
    for r in range(a.rounds):
        for v in variants[r % len(variants):] + variants[: r % len(variants)]:
            set_variant(v)
            step_fn()
            torch.cuda.synchronize()
            c = time.thread_time()
            ts = [time.perf_counter()]
            step_fn(ts)
            c1 = time.thread_time()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            unset(v)
            res[v]["step"].append(t2 - ts[0])
            res[v]["launch"].append(ts[3] - ts[0])
            res[v]["cpu"].append(c1 - c)
            res[v]["forward"].append(ts[1] - ts[0])
            res[v]["backward"].append(ts[2] - ts[1])
            res[v]["optimizer"].append(ts[3] - ts[2])
    set_variant("attrib")
    out = {"model": a.model, "rounds": a.rounds, "device": torch.cuda.get_device_name(0), "variants": {}}
    print("%-8s %9s %9s %9s %8s %18s %10s" % ("variant", "step ms", "launch", "cpu", "ratio", "95% interval", "launch+"))
    base = res["bare"]
    for v in variants:
        ratios = [x / b for x, b in zip(res[v]["step"], base["step"])]
        med, lo, hi = bench_attrib.interval(ratios)
        dl = statistics.median([x - b for x, b in zip(res[v]["launch"], base["launch"])]) * 1e6
        m = {k: statistics.median(x) * 1e3 for k, x in res[v].items()}
        out["variants"][v] = dict(m, ratio=med, lo=lo, hi=hi, launch_over_bare_us=dl)
        print("%-8s %9.3f %9.3f %9.3f %8.4f %8.4f..%.4f %+9.1f us" % (v, m["step"], m["launch"], m["cpu"], med, lo, hi, dl))
    # Each variant against the one before it, per round.
    pairs = list(zip(variants[1:], variants))
    for hi_v, lo_v in pairs:
        ratios = [x / b for x, b in zip(res[hi_v]["step"], res[lo_v]["step"])]
        med, lo, hi = bench_attrib.interval(ratios)
        print("%-8s over %-8s %8.4f (%.4f..%.4f)" % (hi_v, lo_v, med, lo, hi))
        out["variants"][hi_v]["over_" + lo_v] = [med, lo, hi]
    # Where the host's time went: each phase's launch time over the
    # tracker's, per round (us, median and ~95 % interval).
    print("launch time over tracker, us per step (median, ~95 % interval):")
    for v in variants:
        row = []
        for k in ("forward", "backward", "optimizer", "cpu"):
            med, lo, hi = bench_attrib.interval([(x - b) * 1e6 for x, b in zip(res[v][k], res["tracker"][k])])
            row.append("%s %+.1f (%+.1f..%+.1f)" % (k, med, lo, hi))
            out["variants"][v][k + "_over_tracker_us"] = [med, lo, hi]
        print("  %-8s %s" % (v, ", ".join(row)))
    out["raw"] = res
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
