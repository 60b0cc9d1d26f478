#!/usr/bin/env bash
# Issue 47, research on a GPU machine: builds tests/gpu/outside_probe.cpp
# against the CUPTI torch itself loads (its library found by running a
# profile and reading /proc/self/maps; the headers beside it or in the
# CUDA toolkit), then runs tests/gpu/outside_probe.py on each job.
#   tests/gpu/outside_probe.sh [JOB...]   (default: gpt2 conv compile)
# Writes $D/JOB.json and $D/JOB.log, and $D/build.log.
set -u
. "$(dirname "$0")/common.sh" outside_probe
JOBS=("$@")
[ ${#JOBS[@]} -gt 0 ] || JOBS=(gpt2 conv compile)
{
    lib=$(python3 - <<'EOF'
import torch
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]):
    torch.zeros(1, device="cuda")
for line in open("/proc/self/maps"):
    if "libcupti" in line:
        print(line.split()[-1]); break
EOF
)
    echo "libcupti: $lib"
    inc=""
    for d in "$(dirname "$lib")/../include" /usr/local/cuda/extras/CUPTI/include /usr/local/cuda/include \
        $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "include") for p in nvidia.__path__))' 2>/dev/null); do
        [ -f "$d/cupti.h" ] && { inc=$d; break; }
    done
    echo "cupti.h: $inc"
    cuda_inc=/usr/local/cuda/include
    built=""
    for defs in "-DPROBE_V2 -DPROBE_MULTI" "-DPROBE_V2" ""; do
        if g++ -O2 -shared -fPIC $defs -I"$inc" -I"$cuda_inc" tests/gpu/outside_probe.cpp \
            -o "$D/outside_probe.so" "$lib" -Wl,-rpath,"$(dirname "$lib")" -ldl 2> "$D/cc.err"; then
            built="$defs"; break
        fi
        echo "build with '$defs' failed:"; head -20 "$D/cc.err"
    done
    echo "built with: '$built'"
} > "$D/build.log" 2>&1
cat "$D/build.log"
[ -f "$D/outside_probe.so" ] || exit 1
# JOB: gpt2 conv compile; gpt2-aside (the probe steps aside before each
# torch.profiler session); ddp, fsdp2 (torchrun on every GPU: JOB.RANK.json).
for job in "${JOBS[@]}"; do
    echo "== $job"
    case $job in
    ddp|fsdp2)
        n=$(nvidia-smi -L | wc -l)
        PROBE_OUT=$D timeout 300 torchrun --standalone --nproc-per-node "$n" tests/gpu/outside_probe_rank.py \
            "$job" "$D/outside_probe.so" "$D/$job" > "$D/$job.log" 2>&1 ;;
    gpt2-aside)
        PROBE_PROFILE=aside timeout 300 python3 tests/gpu/outside_probe.py gpt2 "$D/outside_probe.so" "$D/$job.json" > "$D/$job.log" 2>&1 ;;
    *)
        timeout 300 python3 tests/gpu/outside_probe.py "$job" "$D/outside_probe.so" "$D/$job.json" > "$D/$job.log" 2>&1 ;;
    esac
    echo "exit $?"
    tail -15 "$D/$job.log"
done
