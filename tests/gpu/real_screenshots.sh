#!/usr/bin/env bash
# Retakes the README's screenshots of real jobs on a GPU machine:
#   tests/gpu/real_screenshots.sh      (writes $D/real-*.svg and snapshot.json)
# Two tests/gpu/train_small.py jobs train under `vramscope run`, one healthy
# and one keeping every step's loss (a leak), and are already running when
# each dashboard starts: 160x48, drawn without a terminal (`--size`), the
# frame after --screenshot-after written as SVG. real-overview.svg is the
# overview, real-process.svg the healthy job's process view (its memory
# outside PyTorch's allocator named in the summary), real-leak.svg the
# leaking one's. `snapshot --json` is taken while they run, and each job's
# named parts and unexplained bytes are printed from it. Copy the SVGs into
# screenshots/ to update the README.
set -u
. "$(dirname "$0")/common.sh" real_screenshots
export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-shm-XXXXXX)
warm_agent
timeout 120 "$B" run -- python3 tests/gpu/train_small.py --seconds 90 > "$D/healthy.log" 2>&1 &
h=$!
timeout 120 "$B" run -- python3 tests/gpu/train_small.py --seconds 90 --keep-loss --max-reserved-gib 100 > "$D/leak.log" 2>&1 &
l=$!
pid_of() {
    local _i
    for _i in $(seq 1 120); do
        p=$(sed -n 's/^train_small: pid \([0-9]*\),.*/\1/p' "$1")
        [ -n "$p" ] && { echo "$p"; return 0; }
        sleep 0.5
    done
    return 1
}
hp=$(pid_of "$D/healthy.log") || { echo "the healthy job did not start"; cat "$D/healthy.log"; exit 1; }
lp=$(pid_of "$D/leak.log") || { echo "the leaking job did not start"; cat "$D/leak.log"; exit 1; }
echo "healthy pid $hp, leaking pid $lp"
sleep 3
timeout 60 "$B" --size 160x48 --screenshot "$D/real-overview.svg" --screenshot-after 4000 > "$D/overview.log" 2>&1 &
s1=$!
timeout 60 "$B" --pid "$hp" --size 160x48 --screenshot "$D/real-process.svg" --screenshot-after 6000 > "$D/process.log" 2>&1 &
s2=$!
timeout 60 "$B" --pid "$lp" --size 160x48 --screenshot "$D/real-leak.svg" --screenshot-after 8000 > "$D/leak-view.log" 2>&1 &
s3=$!
sleep 5
timeout 30 "$B" snapshot --json > "$D/snapshot.json" 2> "$D/snapshot.err"
for s in $s1 $s2 $s3; do wait $s; echo "screenshot: exit $?"; done
kill $h $l 2>/dev/null
wait $h $l
# Each job's memory outside the allocator as the snapshot saw it: both
# started together on one GPU, and each must still name its CUDA context.
python3 - "$D/snapshot.json" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1])).get("processes", []):
    v = p.get("view", {})
    f = v.get("figures", {})
    parts = ", ".join("%s %s %.0f MiB" % (q["library"], q["kind"], q["bytes"] / 2**20) for q in v.get("outside") or [])
    un = f.get("unexplained")
    print("pid %s: NVML %s MiB, reserved %s MiB, unexplained %s MiB [%s]" % (
        p.get("identity", {}).get("host_pid"), (f.get("nvml_used") or 0) >> 20, (f.get("reserved") or 0) >> 20,
        None if un is None else round(un / 2**20, 1), parts))
PY
ls -la "$D"
