#!/usr/bin/env bash
# Instructions the model executes per applied event, counted by callgrind:
# exact and repeatable where timings on a shared VM move by ±30 %. Runs
# `live_bench stages EVENTS 1` (the committed GPT-2 recording replayed, one
# process; each of the stage's four model configurations five times) with
# collection switched on only inside `Process::apply_at`, and divides by
# the events the model took in.
#
#   scripts/model_ir.sh [EVENTS] [BINARY]
#
# BINARY defaults to target/profiling/examples/live_bench, built here with
# `cargo build --profile profiling --example live_bench` when absent. To
# compare two trees, build each and pass its binary. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-100000}
BIN=${2:-target/profiling/examples/live_bench}
command -v valgrind >/dev/null || { echo "model_ir: valgrind is not installed" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --profile profiling --example live_bench
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$OUT/cg" \
    --toggle-collect='*Process::apply_at*' "$BIN" stages "$EVENTS" 1 \
    > "$OUT/stdout" 2> "$OUT/stderr" || { cat "$OUT/stderr" >&2; exit 1; }
IR=$(sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$OUT/stderr")
# Every configuration applies the same events, five rounds each.
APPLIED=$(sed -n 's/.*model after it: \([0-9]*\) events.*/\1/p' "$OUT/stdout")
[ -n "$IR" ] && [ -n "$APPLIED" ] || { echo "model_ir: no count (is $BIN a profiling build?)" >&2; exit 1; }
RUNS=$((4 * 5))
awk -v ir="$IR" -v n="$APPLIED" -v r="$RUNS" 'BEGIN {
    printf "model: %.1f instructions per applied event (%d instructions, %d events x %d runs)\n", ir / (n * r), ir, n, r }'
