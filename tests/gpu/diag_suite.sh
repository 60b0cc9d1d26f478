#!/usr/bin/env bash
# The diagnosis suite (issue 10): real third-party workloads run with no
# code change under `vramscope run`, healthy and with planted leaks, each
# recorded from the start and by a second reader attached mid-run (after the
# rings wrapped, in the middle of a step); the recordings are replayed and
# tests/gpu/diag_report.py prints the RESULTS.md table.
#   tests/gpu/diag_suite.sh [WORKLOAD...]     (logs and recordings to $OUT or target/gpu-logs/diag)
# Needs target/release/vramscope, a GPU, torch, transformers, timm, lightning.
set -u
. "$(dirname "$0")/common.sh" diag
LOG=$D
# Small rings, so that a reader attached mid-run finds them wrapped many times.
export VRAMSCOPE_SLOTS=16384
WORKLOADS=${*:-gpt2 resnet inference lightning compiled}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
$B doctor > "$LOG/doctor.log" 2>&1
# run_case WORKLOAD LEAK STEPS MIDSTEP
run_case() {
    local w=$1 leak=$2 steps=$3 mid=$4 name="$1-$2"
    local shm
    shm=$(mktemp -d /tmp/vs-diag-XXXXXX)
    export VRAMSCOPE_SHM_DIR=$shm
    rm -f "$LOG/$name".*
    $B record -o "$LOG/$name.start.vsrec" > "$LOG/$name.rec-start.log" 2>&1 &
    local rec_a=$!
    sleep 0.5
    local job
    if [ "$w" = ddp ]; then
        $B run -- torchrun --standalone --nproc_per_node=2 tests/gpu/diag_job.py ddp --leak "$leak" --steps "$steps" \
            --out "$LOG/$name.truth.json" --mid "$LOG/$name.mid" --mid-step "$mid" > "$LOG/$name.job.log" 2>&1 &
    else
        $B run -- python3 tests/gpu/diag_job.py "$w" --leak "$leak" --steps "$steps" \
            --out "$LOG/$name.truth.json" --mid "$LOG/$name.mid" --mid-step "$mid" > "$LOG/$name.job.log" 2>&1 &
    fi
    job=$!
    local rec_b=
    if await_mark "$LOG/$name.mid" $job 1800 0.1; then
        # In the middle of a step: a few milliseconds past its boundary.
        sleep 0.00$((RANDOM % 9 + 1))
        $B rings --json > "$LOG/$name.rings-at-attach.json" 2>&1
        $B record -o "$LOG/$name.mid.vsrec" > "$LOG/$name.rec-mid.log" 2>&1 &
        rec_b=$!
    fi
    wait $job
    echo "job rc=$?" >> "$LOG/$name.job.log"
    sleep 1
    kill -INT $rec_a $rec_b 2>/dev/null
    wait $rec_a $rec_b 2>/dev/null
    for r in start mid; do
        [ -e "$LOG/$name.$r.vsrec" ] && $B replay "$LOG/$name.$r.vsrec" --json > "$LOG/$name.$r.json" 2> "$LOG/$name.$r.replay.err"
    done
    rm -rf "$shm"
    echo "done $name ($(tail -1 "$LOG/$name.job.log"))"
}
for w in $WORKLOADS; do
    if [ "$w" = ddp ] && [ "$NGPU" -lt 2 ]; then
        echo "SKIPPED: ddp needs two GPUs ($NGPU here)"
        continue
    fi
    run_case "$w" none 500 150
    run_case "$w" fast 120 40
    run_case "$w" slow 300 80
done
python3 tests/gpu/diag_report.py "$LOG" | tee "$LOG/table.md"
