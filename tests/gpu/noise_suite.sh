#!/usr/bin/env bash
# Issue 26, item 3: a healthy job's noise is never a leak, and a leak is
# still found inside that noise. Each run of tests/gpu/diag_job.py goes
# under `vramscope run`, recorded from its start (record_job); the
# replay's verdict is checked by tests/gpu/leak_verdict.py: a healthy
# run never flagged at any of its >= 300 steps, a leaking one flagged
# with its origin outside every module (null).
#   [STEPS=300 LAYERS=4] tests/gpu/noise_suite.sh [RUN...]
# RUN: eval accum save compile pinned empty_cache cublas (GPT-2 with that
# one source, diag_job.py noisy --noise RUN), all (every source at once),
# all-leak (every source and a 256 KiB/step leak, 160 steps),
# lightning (lightning-noisy), trainer (trainer-noisy). Default: all of
# them. Writes $D/noise_suite.txt; exits non-zero on a failure.
# LAYERS other than 4 name the files RUN-lLAYERS; LEAK_STEPS (160) the
# steps of all-leak. (LAYERS=1 LEAK_STEPS=100 with `all` and `all-leak`
# made tests/fixtures/recordings/noise.)
set -u
. "$(dirname "$0")/common.sh" noise_suite
"$B" doctor > "$D/doctor.log" 2>&1
STEPS=${STEPS:-300}; LAYERS=${LAYERS:-4}
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
fail=0
for run in ${*:-eval accum save compile pinned empty_cache cublas all all-leak lightning trainer}; do
    leak=none steps=$STEPS
    case $run in
    lightning | trainer) job=(python3 tests/gpu/diag_job.py "$run-noisy") ;;
    all-leak) job=(python3 tests/gpu/diag_job.py noisy --noise all) leak=slow steps=${LEAK_STEPS:-160} ;;
    *) job=(python3 tests/gpu/diag_job.py noisy --noise "$run") ;;
    esac
    t0=$SECONDS name=$run$([ "$LAYERS" = 4 ] || echo "-l$LAYERS")
    record_job "$name" "${job[@]}" --leak "$leak" --steps "$steps" --layers "$LAYERS" \
        --out "$D/$name.truth.json" --hold 30
    if [ -s "$D/$name.truth.json" ] && [ -s "$D/$name.json" ]; then
        line=$(python3 tests/gpu/leak_verdict.py "$D/$name.json" "$D/$name.truth.json" "$name" --origin null)
        rc=$?
    else
        line="FAIL $name: the job or its replay ended early ($(tail -n 1 "$D/$name.job.log"))" rc=1
    fi
    echo "$line ($((SECONDS - t0)) s, recording $(du -k "$D/$name.vsrec" | cut -f1) KiB)" | tee -a "$D/noise_suite.txt"
    [ $rc = 0 ] || fail=1
done
exit $fail
