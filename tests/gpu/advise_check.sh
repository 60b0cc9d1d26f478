#!/usr/bin/env bash
# The advisor against real reruns (issue 27): each job is recorded under
# its own setting, `vramscope advise` predicts every candidate from that
# recording, and the job is then rerun for real under each candidate
# (plain python, PAR at a time on the one GPU); advise_compare.py puts
# prediction and rerun side by side. On the GPU machine:
#
#     tests/gpu/advise_check.sh            # logs and summary.md in $OUT/advise
#
#     tests/gpu/advise_check.sh gpt2 oom   # some of them
#
# Jobs: transformers GPT-2 with varying lengths (gpt2); timm ConvNeXt with
# varying batches (convnext); the GPT-2 job under memory fractions around
# its peak allocated without one, 0.98 x (it runs out whatever the
# setting), 1.01 x and 1.02 x (where the settings part) (oom).
set -u
. "$(dirname "$0")/common.sh" advise
J=tests/gpu/advise_job.py
PAR=${PAR:-4}
S="$D/summary.md"
: > "$S"

# check NAME FRACTION JOBARGS...: record, advise, rerun every candidate, compare.
check() {
    local name=$1 frac=$2 fr=() cap i conf
    shift 2
    [ "$frac" != - ] && fr=(--fraction "$frac")
    record_job "$name" python3 "$J" "$@" "${fr[@]}" --out "$D/$name.truth.json" --hold 30
    cap=$(python3 -c "import json; print(json.load(open('$D/$name.truth.json'))['total_memory'] / 2**30)")
    timeout 300 "$B" advise "$D/$name.vsrec" --json --capacity-gib "$cap" "${fr[@]}" \
        > "$D/$name.advice.json" 2> "$D/$name.advice.err"
    timeout 300 "$B" advise "$D/$name.vsrec" --capacity-gib "$cap" "${fr[@]}" > "$D/$name.advice.txt" 2>&1
    i=0
    while IFS= read -r conf; do
        PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 python3 "$J" "$@" "${fr[@]}" \
            --out "$D/$name.c$i.json" > "$D/$name.c$i.log" 2>&1 &
        i=$((i + 1))
        [ $((i % PAR)) -eq 0 ] && wait
    done < <(python3 -c "import json; [print(o['conf']) for o in json.load(open('$D/$name.advice.json'))['outcomes']]")
    wait
    { echo "### $name (fraction $frac)"; python3 tests/gpu/advise_compare.py "$D" "$name"; echo; } >> "$S"
}

# The agent builds its tracker on first use: built here, before any job is
# recorded (a job would run unwatched while it builds).
warm_agent
JOBS=${*:-gpt2 convnext oom}
for job in $JOBS; do
    case $job in
    gpt2 | convnext) check "$job" - "$job" ;;
    oom)
        # Fractions from a run without one.
        timeout 300 python3 "$J" gpt2 --out "$D/probe.json" > "$D/probe.log" 2>&1
        for k in 0.98 1.01 1.02; do
            f=$(python3 -c "import json; t = json.load(open('$D/probe.json')); print(round(t['peak_allocated'] * $k / t['total_memory'], 6))")
            check "gpt2-oom-$k" "$f" gpt2
        done
        ;;
    esac
done
cat "$S"
