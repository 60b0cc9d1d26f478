"""The training loop tests/gpu/perf_attrib.sh profiles: MODEL (gpt2 or
resnet, as tests/gpu/bench_attrib.py builds them) for STEPS steps after 10
untimed ones, with VARIANT: tracker (attribution removed), attrib (the
default) or notag (attribution with the tracker's tags off).

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/perf_attrib_loop.py MODEL VARIANT STEPS
"""

import sys
import time

import torch

import vramscope

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import bench_attrib  # noqa: E402


def main():
    model, variant, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    step = bench_attrib.training_step(model)
    _, attrib, lib = bench_attrib.wait_for_agent()
    if variant == "tracker":
        attrib.remove()
    elif variant == "notag":
        lib.vs_agent_set_attribution(0)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    n = attrib.native
    print("%s: %.3f ms per step, %s native fast calls, status %s" % (
        variant, (time.perf_counter() - t) / steps * 1e3, n.fast if n is not None else None, vramscope.status()))


if __name__ == "__main__":
    main()
