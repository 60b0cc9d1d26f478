#!/usr/bin/env bash
# Issue 26, item 3: leak evidence that survives noise. tests/gpu/diag_job.py
# bert-varlen (transformers BERT, a random sequence length and batch every
# step) runs under `vramscope run`, recorded from the start: with a
# 256 KiB/step leak planted in the loop body it must be flagged, its origin
# outside every module (null); with none, over 300 steps, never flagged.
# Writes $D/noisy_leak.txt; exits non-zero on a failure.
#   tests/gpu/noisy_leak.sh
set -u
. "$(dirname "$0")/common.sh" noisy_leak
"$B" doctor > "$D/doctor.log" 2>&1
fail=0
for run in "slow 160" "none 300"; do
    set -- $run
    leak=$1 steps=$2 w=bert-$1
    record_job "$w" python3 tests/gpu/diag_job.py bert-varlen --leak "$leak" --steps "$steps" \
        --out "$D/$w.truth.json" --hold 30
    python3 tests/gpu/leak_verdict.py "$D/$w.json" "$D/$w.truth.json" "$w" --origin null | tee -a "$D/noisy_leak.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
