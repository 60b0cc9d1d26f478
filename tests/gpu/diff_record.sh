#!/usr/bin/env bash
# Recordings for the run diff and the forecast (issue 27): transformers
# GPT-2 (4 layers, hidden 512, bf16 autocast, AdamW) at one sequence
# length, 30 steps: eager at batch 8, torch.compile at batch 8, eager at
# batch 16; and leak-oom, which keeps 32 MiB a step under a memory
# fraction until it runs out. Each recorded from its start by record_job
# (common.sh) into $OUT/diff.
#
#     tests/gpu/diff_record.sh; gzip -k $OUT/diff/*.vsrec
set -u
. "$(dirname "$0")/common.sh" diff
J=tests/gpu/advise_job.py
# The agent builds its tracker on first use: built here, before any job is
# recorded (a job would run unwatched while it builds).
warm_agent
# tests/gpu/diff_record.sh gpt2-b8 ...: some of them.
for n in ${*:-gpt2-b8 gpt2-b8-compiled gpt2-b16 leak-oom}; do
    case $n in
    gpt2-b8) args=(--batch 8) ;;
    gpt2-b8-compiled) args=(--batch 8 --compile) ;;
    gpt2-b16) args=(--batch 16) ;;
    # The forecast's job: 32 MiB kept each step under a 3 % memory
    # fraction, until it runs out (and on: it skips the steps that do not fit).
    leak-oom) args=(--batch 8 --leak-mb 32 --fraction 0.03 --steps 100) ;;
    leak-oom-12) args=(--batch 8 --leak-mb 12 --fraction 0.03 --steps 200) ;;
    *) echo "unknown recording $n"; continue ;;
    esac
    record_job "$n" python3 "$J" fixed --steps 30 "${args[@]}" --out "$D/$n.truth.json" --hold 30
    echo "$n: $(cat "$D/$n.truth.json")"
done
