#!/usr/bin/env bash
# Issue 47 on a GPU machine: what the accounting outside the allocator adds
# to CUDA's initialisation. With the tracker and outside.cpp cached, the
# agent subscribes to CUPTI synchronously as CUDA starts; this times
# torch.zeros(1, device="cuda") (the first CUDA call) under `vramscope run`
# with VRAMSCOPE_OUTSIDE=1 and =0, alternated, 7 pairs.
#   tests/gpu/outside_init.sh      writes $D/init.txt (one line per run)
set -u
. "$(dirname "$0")/common.sh" outside_init
timeout 300 "$B" agent build > "$D/build.log" 2>&1
for i in 1 2 3 4 5 6 7; do
    for o in 1 0; do
        VRAMSCOPE_OUTSIDE=$o timeout 60 "$B" run -- python3 -c "
import time, torch
t = time.perf_counter(); torch.zeros(1, device='cuda'); torch.cuda.synchronize()
print('outside=$o init_ms %.1f' % ((time.perf_counter() - t) * 1e3))" 2>&1 | grep init_ms
    done
done | tee "$D/init.txt"
python3 - "$D/init.txt" <<'PY'
import sys
on, off = [], []
for line in open(sys.argv[1]):
    (on if "outside=1" in line else off).append(float(line.split()[-1]))
on.sort(); off.sort()
print("median init: %.1f ms with the accounting, %.1f ms without (%d runs each)" % (on[len(on) // 2], off[len(off) // 2], len(on)))
PY
