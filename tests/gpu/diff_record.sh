#!/usr/bin/env bash
# Recordings for the run diff (issue 27): transformers GPT-2 (4 layers,
# hidden 512, bf16 autocast, AdamW) at one sequence length, 30 steps:
# eager at batch 8, torch.compile at batch 8, eager at batch 16. Each
# recorded from its start by record_job (common.sh) into $OUT/diff.
#
#     tests/gpu/diff_record.sh; gzip -k $OUT/diff/*.vsrec
set -u
. "$(dirname "$0")/common.sh" diff
J=tests/gpu/advise_job.py
# The agent builds its tracker on first use: built here, before any job is
# recorded (a job would run unwatched while it builds).
timeout 300 "$B" run -- python3 -c "import torch; torch.zeros(1, device='cuda')" > "$D/warm.log" 2>&1
record_job gpt2-b8 python3 "$J" fixed --steps 30 --batch 8 --out "$D/gpt2-b8.truth.json" --hold 30
record_job gpt2-b8-compiled python3 "$J" fixed --steps 30 --batch 8 --compile --out "$D/gpt2-b8-compiled.truth.json" --hold 30
record_job gpt2-b16 python3 "$J" fixed --steps 30 --batch 16 --out "$D/gpt2-b16.truth.json" --hold 30
for n in gpt2-b8 gpt2-b8-compiled gpt2-b16; do
    echo "$n: $(cat "$D/$n.truth.json")"
done
