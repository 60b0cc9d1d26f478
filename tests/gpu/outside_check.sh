#!/usr/bin/env bash
# Issue 47 on a GPU machine: memory outside the caching allocator, named by
# the agent (outside.cpp) and read by vramscope, against NVML.
#   tests/gpu/outside_check.sh [JOB...]   (default: gpt2 conv compile ddp bench; also fsdp2 llama vit late
#                                         shared bench-llama bench-vit)
# Each JOB runs tests/gpu/outside_job.py under `vramscope run` on a fresh
# build cache and writes $D/JOB.json (three quiescent points: NVML, reserved,
# the named parts, unexplained; gpt2: a torch.profiler session's CUDA
# events and the accounting after it); ddp and fsdp2 run under torchrun on every
# GPU; bench alternates the accounting on and stepped aside on GPT-2
# (bench-JOB on JOB: bench-llama, bench-vit); late
# attaches the agent to GPT-2 after 3 bare steps (not under `run`); shared
# runs GPT-2 and ResNet-50 on one GPU at the same time (shared-gpt2,
# shared-conv).
# `TEARDOWN_CUPTI=1 tests/gpu/outside_check.sh gpt2`: torch.profiler gives
# CUPTI back after its profile, and the accounting must come back (its
# profile line says `accounting after: True`).
# $D/summary.txt: one line per point, PASS when unexplained <= max(2 % of
# NVML's bytes, 64 MiB).
set -u
. "$(dirname "$0")/common.sh" outside_check
S=$D/summary.txt
: > "$S"
JOBS=("$@")
[ ${#JOBS[@]} -gt 0 ] || JOBS=(gpt2 conv compile ddp bench)
export VRAMSCOPE_BIN=$B
for job in "${JOBS[@]}"; do
    echo "== $job"
    export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-shm-XXXXXX)
    case $job in
    ddp|fsdp2)
        n=$(nvidia-smi -L | wc -l)
        timeout 400 "$B" run -- torchrun --standalone --nproc-per-node "$n" tests/gpu/outside_job.py "$job" "$D/$job.json" > "$D/$job.log" 2>&1 ;;
    shared)
        # Two jobs on one GPU at once (GPT-2 and ResNet-50): each names its
        # own memory, whatever the other allocates meanwhile.
        timeout 400 "$B" run -- python3 tests/gpu/outside_job.py gpt2 "$D/shared-gpt2.json" > "$D/shared-gpt2.log" 2>&1 &
        other=$!
        timeout 400 "$B" run -- python3 tests/gpu/outside_job.py conv "$D/shared-conv.json" > "$D/shared-conv.log" 2>&1
        wait $other ;;
    late)
        PYTHONPATH=$("$B" agent path) timeout 400 python3 tests/gpu/outside_job.py gpt2 "$D/late.json" --late > "$D/late.log" 2>&1 ;;
    bench|bench-*)
        j=${job#bench}; j=${j#-}
        timeout 400 "$B" run -- python3 tests/gpu/outside_job.py "${j:-gpt2}" "$D/$job.json" --bench > "$D/$job.log" 2>&1 ;;
    *)
        timeout 400 "$B" run -- python3 tests/gpu/outside_job.py "$job" "$D/$job.json" > "$D/$job.log" 2>&1 ;;
    esac
    echo "exit $?"
    tail -8 "$D/$job.log"
done
python3 - "$D" "$S" <<'EOF'
import json, os, sys
d, s = sys.argv[1], sys.argv[2]
out = open(s, "a")
for f in sorted(os.listdir(d)):
    if not f.endswith(".json"):
        continue
    r = json.load(open(os.path.join(d, f)))
    name = f[:-5]  # the job, or shared-JOB
    for p in r["points"]:
        nv, un = p.get("nvml"), p.get("unexplained")
        ok = nv is not None and un is not None and abs(un) <= max(0.02 * nv, 64 << 20)
        parts = ", ".join("%s %s %.0f MiB" % (q["library"], q["kind"], q["bytes"] / 2**20) for q in (p.get("outside") or []))
        out.write("%s %s %s: NVML %s MiB, reserved %s MiB, named %s MiB, unexplained %s MiB [%s]\n" % (
            "PASS" if ok else "FAIL", name, p["name"],
            nv and nv >> 20, (p.get("reserved") or 0) >> 20, (p.get("named") or 0) >> 20,
            un if un is None else round(un / 2**20, 1), parts))
    if "profile" in r:
        k = r["profile"]["cuda_events"]
        out.write("%s %s profile: %d CUDA events; accounting after: %s\n" % (
            "PASS" if k > 0 else "FAIL", name, k, r["profile"]["agent_after"]))
    if "bench" in r:
        # Pairs of blocks side by side: the median of their ratios is the
        # figure (a clock drifting through the run cancels in each pair).
        on, off = r["bench"]["on"], r["bench"]["off"]
        med = lambda v: sorted(v)[len(v) // 2]
        ratio = med([a / b for a, b in zip(on, off)])
        out.write("%s bench %s: step %.2f ms with the accounting, %.2f ms stepped aside (medians of %d blocks); paired ratio x%.4f\n" % (
            "PASS" if ratio <= 1.01 else "FAIL", r["job"], med(on) * 1e3, med(off) * 1e3, len(on), ratio))
EOF
cat "$S"
