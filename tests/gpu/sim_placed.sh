#!/usr/bin/env bash
# A real transformers training job recorded from the start, its statistics
# samples placed in the event stream by the agent (STATS_C), for
# `vramscope sim --trace` to compare sample by sample (issue 16, item 4).
#   tests/gpu/sim_placed.sh     (writes to $OUT or target/gpu-logs/placed)
# A one-layer GPT-2 (AdamW, bf16 autocast), 30 steps, statistics every
# 20 ms (VRAMSCOPE_STATS_MS), the agent from this tree.
set -u
. "$(dirname "$0")/common.sh" placed
export PYTHONPATH=$PWD/assets/agent VRAMSCOPE_STATS_MS=20
python3 -m vramscope.doctor --build > "$D/build.log" 2>&1
export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-placed-XXXXXX)
$B record -o "$D/gpt2-placed.vsrec" > "$D/record.log" 2>&1 &
rec=$!
sleep 0.5
VRAMSCOPE_AUTO=1 python3 tests/gpu/diag_job.py gpt2 --leak none --steps 30 --layers 1 --step-sleep 0.02 \
    --out "$D/gpt2-placed.truth.json" > "$D/job.log" 2>&1
echo "job rc=$?" >> "$D/job.log"
sleep 1
kill -INT $rec
wait $rec
$B sim --trace "$D/gpt2-placed.vsrec" > "$D/sim.log" 2>&1
echo "sim rc=$?" >> "$D/sim.log"
rm -rf "$VRAMSCOPE_SHM_DIR"
tail -n 5 "$D/sim.log"
