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
    python3 - "$D/$w.json" "$D/$w.truth.json" "$w" <<'PY' | tee -a "$D/noisy_leak.txt"
import json, sys
doc, truth = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
p = next(p for p in doc["processes"] if p["identity"]["host_pid"] == truth["pid"])
leak = p["view"]["leak"]
origins = [(o.get("module"), o.get("bytes_per_step")) for o in leak.get("origins", [])]
want = truth["leak_bytes_per_step"] > 0
ok = bool(leak.get("flagged")) == want and (not want or (origins and origins[0][0] is None))
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]}: {truth['steps']} steps, flagged {leak.get('flagged')} at "
      f"{leak.get('flagged_at_step')} ({leak.get('test') or leak.get('fired') or ''}), survivors "
      f"{leak.get('survivors')}, origins {origins[:3]}")
sys.exit(0 if ok else 1)
PY
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
