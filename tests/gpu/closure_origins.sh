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
    python3 tests/gpu/leak_verdict.py "$D/$w.json" "$D/$w.truth.json" "$w" --origin null | tee -a "$D/closure_origins.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
