"""Where attribution's step time goes (issue 15): per variant, the wall time
of forward, backward and the optimizer step timed apart (a synchronize
after each), and the CPU time of the main thread and of the whole process
(the rest: the autograd engine's threads), plus how often the agent's
Python runs per step (the calls made through the Attribution's attributes:
the optimizer hooks and the native path hold their own references, so
those are not counted).

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/prof_attrib.py resnet|gpt2 [--rounds 8]

Variants alternate in blocks of 10 timed steps (2 untimed after each
switch), the order rotating: bare (tracker writes off), tracker, nobw
(attribution, backward tracked for no module), attrib (the default),
params, py (the default in Python only). Medians over all timed steps.
"""

import argparse
import collections
import statistics
import sys
import time

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_attrib  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "resnet"])
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    forward, optimizer = bench_attrib.phases(a.model)
    backward = lambda loss: loss.backward()  # noqa: E731
    status, attrib, lib = bench_attrib.wait_for_agent()
    print("status:", status)

    def step(times=None):
        ts = [time.perf_counter()]
        loss = forward()
        torch.cuda.synchronize()
        ts.append(time.perf_counter())
        backward(loss)
        torch.cuda.synchronize()
        ts.append(time.perf_counter())
        optimizer()
        torch.cuda.synchronize()
        ts.append(time.perf_counter())
        if times is not None:
            for k, (t1, t2) in zip(("forward", "backward", "optimizer"), zip(ts, ts[1:])):
                times[k].append(t2 - t1)

    for _ in range(5):
        step()

    def cfg(name):
        attrib.capture_steps = 0
        if not bench_attrib.set_attribution(attrib, lib, name):
            return
        attrib.set_backward({"nobw": "none", "params": "params"}.get(name, "auto"))
        attrib.set_native(name != "py")

    names = ["bare", "tracker", "nobw", "attrib", "params", "py"]
    res = {n: collections.defaultdict(list) for n in names}
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            cfg(n)
            step()
            step()
            for _ in range(10):
                c, m = time.process_time(), time.thread_time()
                step(res[n])
                res[n]["cpu"].append(time.process_time() - c)
                res[n]["main"].append(time.thread_time() - m)
    cfg("attrib")
    med = {n: {k: statistics.median(v) * 1e3 for k, v in res[n].items()} for n in names}
    print("%-8s %9s %9s %9s %9s %9s %9s" % ("variant", "forward", "backward", "optim", "total", "cpu", "main cpu"))
    for n in names:
        m = med[n]
        tot = m["forward"] + m["backward"] + m["optimizer"]
        print("%-8s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f ms" % (n, m["forward"], m["backward"], m["optimizer"], tot, m["cpu"], m["main"]))
    b = med["bare"]
    for n in names[1:]:
        print("%-8s over bare: forward %+.3f, backward %+.3f, optimizer %+.3f ms" % (
            n, med[n]["forward"] - b["forward"], med[n]["backward"] - b["backward"], med[n]["optimizer"] - b["optimizer"]))

    # How often the agent's Python runs per step (the default).
    counts = collections.Counter()
    names_py = ("_enter", "_leave", "_hook_backward", "_thread", "info", "optimizer_pre", "optimizer_post", "step")
    for k in names_py:
        f = getattr(attrib, k)

        def counting(*x, _k=k, _f=f, **kw):
            counts[_k] += 1
            return _f(*x, **kw)

        setattr(attrib, k, counting)
    fast0 = attrib.native.fast if attrib.native is not None else 0
    hooks0 = attrib.native.hooks if attrib.native is not None else 0
    for _ in range(10):
        step()
    for k in names_py:
        delattr(attrib, k)
    n = attrib.native
    print("per step, Python:", {k: v / 10 for k, v in sorted(counts.items())},
          "native: %.1f fast calls, %.1f C++ pre-hooks" % (((n.fast - fast0) / 10, (n.hooks - hooks0) / 10) if n else (0, 0)))


if __name__ == "__main__":
    main()
