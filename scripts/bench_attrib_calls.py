#!/usr/bin/env python3
"""What attribution adds to one module call, on any machine (no torch, no
GPU): the agent's Python and native call paths around a stand-in torch's
Module (tests/agent_attrib/fake_torch), in nanoseconds per call.

    scripts/bench_attrib_calls.py [--rounds 7] [--before REV] [--json FILE]

The model: a root holding a Sequential of 25 blocks, each calling a leaf
with a parameter, a leaf without (an activation: the agent's "quiet" case)
and another leaf with a parameter: 102 module calls per forward, backward
tracking off (so that only the call path is measured). Per round and per
mode, the best of 5 repetitions of 2,000 forwards, in a child process of
its own; the modes alternate and their order rotates each round. Printed:
the median over rounds of ns per call, and of the difference to `bare` in
the same round.

  bare          the agent's hooks removed (what the stand-in costs alone)
  python        module calls through the Python wrapper only
  native        the native path (fastcall.cpp, built for this Python), the
                thread's word found through its _Thread (no tracker library)
  native_slot   the same reading the word through a tracker-like library's
                vs_agent_context_slot (how the agent runs with the tracker)

--before REV measures the agent of git revision REV the same way, in the
same rounds (its tree is exported to a temporary directory), so that a
change to the call path is shown beside what it replaces. Needs python3's
headers and a C++ compiler (as the agent's native path does).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["bare", "python", "native", "native_slot"]

CHILD = r'''
import os, sys, timeit
tree, mode = sys.argv[1], sys.argv[2]
sys.path[:0] = [tree + "/tests/agent_attrib", tree + "/tests/agent_attrib/fake_torch", tree + "/assets/agent"]
import torch
from torch import nn
import test_attrib as T
from vramscope import _build
from vramscope._attrib import Attribution


class Leaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter("w")

    def forward(self, x):
        return x


class Act(nn.Module):
    def forward(self, x):
        return x


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = Leaf(), Act(), Leaf()

    def forward(self, x):
        return self.c(self.b(self.a(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential([Block() for _ in range(25)])

    def forward(self, x):
        return self.blocks(x)


CALLS = 1 + 1 + 25 * 4
net, x = Net(), torch.Tensor()
a = Attribution(torch, lambda *args, **kw: None)
a.install()
a.set_backward("none")
if mode == "native_slot":
    fast, T.LIB.vs_agent_context_slot = T.build_with_stand_in_torch(_build)
a.connect(T.LIB)
if mode == "native":
    fast = _build.load_fast(_build.build_fast())
if mode.startswith("native"):
    assert a.use_native(fast), a.native_note
for _ in range(3):
    net(x)
if mode == "bare":
    a.remove()
net(x)
best = min(timeit.repeat(lambda: net(x), number=2000, repeat=5))
if mode.startswith("native"):
    assert a.native.fast > 0, "the native path was not taken"
print(best / 2000 / CALLS * 1e9)
'''


def export(rev, into):
    """The tree of `rev` (its agent and the stand-in torch) under `into`."""
    git = subprocess.run(["git", "-C", ROOT, "archive", rev, "assets/agent", "tests/agent_attrib"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if git.returncode:
        raise SystemExit("--before %s: %s" % (rev, " ".join(git.stderr.decode(errors="replace").split())))
    subprocess.run(["tar", "-x", "-C", into], input=git.stdout, check=True)


def measure(tree, mode, cache):
    env = dict(os.environ, XDG_CACHE_HOME=cache, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", CHILD, tree, mode], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit("%s (%s) failed:\n%s" % (mode, tree, r.stderr.strip().splitlines()[-1:]))
    return float(r.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before", metavar="REV", help="also measure the agent of git revision REV")
    ap.add_argument("--json", metavar="FILE", help="write the results here too")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="vs-bench-calls-") as tmp:
        trees = {"now": ROOT}
        if a.before:
            trees["before"] = os.path.join(tmp, "before")
            os.mkdir(trees["before"])
            export(a.before, trees["before"])
        runs = [(t, m) for t in trees for m in MODES]
        per = {r: [] for r in runs}
        for i in range(a.rounds):
            for t, m in runs[i % len(runs):] + runs[: i % len(runs)]:
                per[(t, m)].append(measure(trees[t], m, os.path.join(tmp, "cache-" + t)))
    out = {"rounds": a.rounds, "before": a.before, "ns_per_call": {}, "over_bare": {}}
    print("%-7s %-12s %12s %14s" % ("agent", "mode", "ns per call", "over bare"))
    for t in trees:
        for m in MODES:
            med = statistics.median(per[(t, m)])
            over = statistics.median(x - b for x, b in zip(per[(t, m)], per[(t, "bare")]))
            out["ns_per_call"]["%s/%s" % (t, m)] = round(med, 1)
            out["over_bare"]["%s/%s" % (t, m)] = round(over, 1)
            print("%-7s %-12s %12.1f %+14.1f" % (t, m, med, over))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
