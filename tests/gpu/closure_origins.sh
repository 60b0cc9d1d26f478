#!/usr/bin/env bash
# Issue 26, item 2: a step that runs a closure (Lightning's automatic
# optimization, torch.optim.LBFGS) attributes what the closure allocates
# to where it was called from, not to the optimizer. Each workload of
# tests/gpu/diag_job.py runs with its 256 KiB/step leak (planted in
# Lightning's training_step, in LBFGS's closure) under `vramscope run`,
# recorded from the start; the replay's leak origins must name no
# optimizer. Writes $D/closure_origins.txt; exits non-zero on a failure.
#   [STEPS=60 LAYERS=4] tests/gpu/closure_origins.sh [WORKLOAD...]   (default: lightning lbfgs)
# (STEPS=30 LAYERS=1 made the recordings in tests/fixtures/recordings/closure.)
set -u
. "$(dirname "$0")/common.sh" closure_origins
# Builds the agent's tracker into the cache first: a job shorter than the
# build would end before its agent attached.
"$B" doctor > "$D/doctor.log" 2>&1
STEPS=${STEPS:-60}; LAYERS=${LAYERS:-4}
fail=0
for w in ${*:-lightning lbfgs}; do
    # The job holds its leak for 30 s after its last step: the recording
    # stops meanwhile, so its end shows the leak alive.
    record_job "$w" python3 tests/gpu/diag_job.py "$w" --leak slow --steps "$STEPS" --layers "$LAYERS" \
        --out "$D/$w.truth.json" --hold 30
    python3 - "$D/$w.json" "$w" <<'PY' | tee -a "$D/closure_origins.txt"
import json, sys
doc = json.load(open(sys.argv[1]))
procs = [p for p in doc["processes"] if p.get("view", {}).get("leak")]
leak = max((p["view"]["leak"] for p in procs), key=lambda l: l.get("steps_observed", 0))
origins = [(o.get("module"), o.get("bytes_per_step")) for o in leak.get("origins", [])]
# The leak is planted outside every module (Lightning's training_step, the
# LBFGS closure): its origin is null, and no origin is an optimizer.
bad = [o for o in origins if str(o[0]).startswith("optimizer.")]
ok = leak.get("flagged") and bool(origins) and origins[0][0] is None and not bad
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[2]}: steps {leak.get('steps_observed')}, flagged at "
      f"{leak.get('flagged_at_step')}, origins {origins}")
sys.exit(0 if ok else 1)
PY
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
