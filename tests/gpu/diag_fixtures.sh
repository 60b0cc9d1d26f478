#!/usr/bin/env bash
# Small recordings of the diagnosis suite's jobs, committed as CI fixtures
# (tests/fixtures/recordings/diag/, checked by tests/diag_fixtures.rs): a
# one-layer GPT-2 with a fast leak watched from the start and attached
# mid-run (after the rings wrapped), and a healthy inference loop.
#   tests/gpu/diag_fixtures.sh     (writes to $OUT or target/gpu-logs/fixtures)
set -u
. "$(dirname "$0")/common.sh" fixtures
# Rings that wrap every few steps, with steps slow enough (--step-sleep)
# for the recorder to keep up.
export VRAMSCOPE_SLOTS=4096
# Build the tracker first: a job of a few seconds would end before a first
# build finished.
$B doctor > "$D/doctor.log" 2>&1
# fixture NAME MID_STEP JOB_ARGS...
fixture() {
    local name=$1 mid=$2
    shift 2
    export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-fx-XXXXXX)
    $B record -o "$D/$name.start.vsrec" > /dev/null 2>&1 &
    local a=$! b=
    sleep 0.5
    $B run -- python3 tests/gpu/diag_job.py "$@" --layers 1 --step-sleep 0.02 --out "$D/$name.truth.json" \
        --mid "$D/$name.mid" --mid-step "$mid" > "$D/$name.job.log" 2>&1 &
    local job=$!
    if await_mark "$D/$name.mid" $job 600 0.05; then
        sleep 0.003
        $B record -o "$D/$name.mid.vsrec" > /dev/null 2>&1 &
        b=$!
    fi
    wait $job
    sleep 1
    kill -INT $a $b 2>/dev/null
    wait $a $b 2>/dev/null
    rm -f "$D/$name.mid"
    for r in start mid; do
        [ -e "$D/$name.$r.vsrec" ] && $B replay "$D/$name.$r.vsrec" --json > "$D/$name.$r.json"
    done
    rm -rf "$VRAMSCOPE_SHM_DIR"
}
fixture gpt2-fast 16 gpt2 --leak fast --steps 30
fixture inference-none 40 inference --leak none --steps 60
ls -la "$D"
python3 - "$D" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    if f.endswith(".truth.json"):
        continue
    for p in json.load(open(f))["processes"]:
        v = p["view"]
        print(f.split("/")[-1], v["leak"]["source"], v["leak"]["steps_observed"], v["leak"]["flagged"],
              v["leak"].get("flagged_at_step"), v["figures"]["inconsistencies"], v["figures"]["lost_events"], v["watch"])
PY
