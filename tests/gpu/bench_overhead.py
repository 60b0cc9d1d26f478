"""Overhead of the agent, on a GPU.

  python3 tests/gpu/bench_overhead.py [--reps 3] [--iters 200000] [--steps 300]

Variants, each in its own process (a tracker cannot be detached):
  none        no agent
  empty       the tracker attached, callback returns at once (VS_EMPTY_TRACKER)
  tracker     the vramscope tracker (exact mode, ring writes, agent thread)
  hist_nocx   torch.cuda.memory._record_memory_history(context=None)
  hist_dflt   torch.cuda.memory._record_memory_history() (its defaults)

The "tracker" process also alternates the tracker's writes off and on
(vs_agent_enable) a dozen times in the same process: the cleanest figure
for the tracker's own cost, free of process-to-process noise.

Measures (a) the cost per Python `torch.empty(256, device="cuda"); del`
(3 allocator events: ALLOC, FREE_REQUESTED, FREE_COMPLETED) and (b) the
step time of a small MLP training loop (forward, backward, AdamW). Runs the
variants alternately `reps` times and prints medians as a table; the added
cost per allocator event is (variant - none) / 3, and the tracker's own cost
over an empty tracker is (tracker - empty) / 3.
"""

import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ["none", "empty", "tracker", "hist_nocx", "hist_dflt"]


def child(variant, iters, steps):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import common  # noqa: F401  (agent on sys.path, private shm dir)
    import torch

    try:  # two fixed cores: fewer migrations, less noise
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[-2:]))
    except Exception:
        pass
    torch.cuda.init()
    torch.empty(1, device="cuda")
    if variant in ("empty", "tracker"):
        if variant == "empty":
            os.environ["VRAMSCOPE_VARIANT"] = "empty"
        import vramscope

        vramscope.attach()
        st = vramscope.status()
        assert st["mode"] == "exact", st
    elif variant == "hist_nocx":
        torch.cuda.memory._record_memory_history(context=None)
    elif variant == "hist_dflt":
        torch.cuda.memory._record_memory_history()

    # (a) allocator round trips.
    def loop(n):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            x = torch.empty(256, device="cuda")
            del x
        return (time.perf_counter_ns() - t0) / n

    loop(20000)
    per_iter = min(loop(iters) for _ in range(3))

    # (b) a small training loop.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randn(256, 1024, device="cuda")
    target = torch.randn(256, 1024, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()

    for _ in range(30):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(steps // 5):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - t0) / (steps // 5))
    out = {"variant": variant, "iter_ns": per_iter, "step_us": statistics.median(times) / 1e3}
    if variant == "tracker":
        # The same process, the tracker attached, its writes alternately off
        # (callback: one atomic load, return) and on: no process-to-process
        # noise in the difference.
        import vramscope

        lib = vramscope._st["lib"]
        d_iter, r_step = [], []
        for _ in range(12):
            lib.vs_agent_enable(0)
            off = loop(iters // 4)
            lib.vs_agent_enable(1)
            on = loop(iters // 4)
            d_iter.append(on - off)
            lib.vs_agent_enable(0)
            t0 = time.perf_counter_ns()
            for _ in range(steps // 5):
                step()
            torch.cuda.synchronize()
            s_off = time.perf_counter_ns() - t0
            lib.vs_agent_enable(1)
            t0 = time.perf_counter_ns()
            for _ in range(steps // 5):
                step()
            torch.cuda.synchronize()
            s_on = time.perf_counter_ns() - t0
            r_step.append(s_on / s_off - 1)
        out["inproc_ns_per_event"] = statistics.median(d_iter) / 3
        out["inproc_step_overhead"] = statistics.median(r_step)
        evs_per_step = lib.vs_agent_ring_head(1)
        out["ring1_head"] = evs_per_step
    print(json.dumps(out), flush=True)


def main():
    args = sys.argv[1:]

    def opt(name, default):
        return int(args[args.index(name) + 1]) if name in args else default

    reps, iters, steps = opt("--reps", 3), opt("--iters", 200000), opt("--steps", 300)
    if "--child" in args:
        child(args[args.index("--child") + 1], iters, steps)
        return
    res = {v: {"iter_ns": [], "step_us": []} for v in VARIANTS}
    inproc = []
    for r in range(reps):
        for v in VARIANTS:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", v, "--iters", str(iters), "--steps", str(steps)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                timeout=300,
            )
            line = [l for l in out.stdout.decode().splitlines() if l.startswith("{")]
            if out.returncode != 0 or not line:
                print("variant %s failed: %s" % (v, out.stderr.decode()[-2000:]), flush=True)
                continue
            o = json.loads(line[-1])
            res[v]["iter_ns"].append(o["iter_ns"])
            res[v]["step_us"].append(o["step_us"])
            if "inproc_ns_per_event" in o:
                inproc.append((o["inproc_ns_per_event"], o["inproc_step_overhead"]))
            print("rep %d %-10s %8.0f ns/iter %9.1f us/step" % (r, v, o["iter_ns"], o["step_us"]), flush=True)
    med = {v: {k: (statistics.median(x) if x else float("nan")) for k, x in d.items()} for v, d in res.items()}
    base_i, base_s = med["none"]["iter_ns"], med["none"]["step_us"]
    print()
    print("| variant | ns per empty+del (3 events) | added ns per event | step time (us) | step overhead |")
    print("|---|---:|---:|---:|---:|")
    for v in VARIANTS:
        i, s = med[v]["iter_ns"], med[v]["step_us"]
        print("| %s | %.0f | %.1f | %.1f | %+.2f %% |" % (v, i, (i - base_i) / 3, s, (s / base_s - 1) * 100))
    t_over_e = (med["tracker"]["iter_ns"] - med["empty"]["iter_ns"]) / 3
    print()
    print("tracker over empty tracker: %.1f ns per allocator event (target <= 40)" % t_over_e)
    print("tracker step overhead: %+.2f %% (target <= 1 %%)" % ((med["tracker"]["step_us"] / base_s - 1) * 100))
    ip_ns = statistics.median([a for a, _ in inproc]) if inproc else float("nan")
    ip_step = statistics.median([b for _, b in inproc]) if inproc else float("nan")
    print("in-process, writes on vs off (same process, 12 alternations x %d runs): %.1f ns per allocator event, step %+.2f %%" % (len(inproc), ip_ns, ip_step * 100))
    print(json.dumps({"medians": med, "tracker_over_empty_ns_per_event": t_over_e, "inproc_ns_per_event": ip_ns, "inproc_step_overhead": ip_step, "torch": _torch_version()}))


def _torch_version():
    try:
        import torch

        return torch.__version__ + " " + torch.cuda.get_device_name(0)
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
