#!/usr/bin/env bash
# Records a real training job with the agent, then replays its allocation
# requests through the simulator under the configuration it ran with and
# under expandable segments. Needs target/release/vramscope.
#   tests/gpu/record_replay.sh        (logs to $OUT or target/gpu-logs)
set -u
cd "$(dirname "$0")/../.."
B=${VRAMSCOPE_BIN:-target/release/vramscope}
LOG=${OUT:-target/gpu-logs}
mkdir -p "$LOG"
export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-rr-XXXXXX)
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
CAP=$(python3 -c 'import torch;print(torch.cuda.get_device_properties(0).total_memory/2**30)')
# Build the tracker into the cache first (doctor --build does), so the
# recorded run attaches at once instead of compiling for several seconds.
$B doctor > "$LOG/doctor.log" 2>&1
$B run -- python3 tests/gpu/varlen_train.py --seconds 2 > "$LOG/warm.log" 2>&1
$B record -o "$LOG/job.vsrec" --duration 16 > "$LOG/record.log" 2>&1 &
REC=$!
sleep 1
$B run -- python3 tests/gpu/varlen_train.py --seconds 10 > "$LOG/job.log" 2>&1
wait $REC
cat "$LOG/job.log" "$LOG/record.log"
$B replay "$LOG/job.vsrec" > "$LOG/replay.txt" 2>&1; tail -3 "$LOG/replay.txt"
for conf in "" "expandable_segments:True" "max_split_size_mb:128"; do
    echo "== sim, conf='$conf'"
    if [ -n "$conf" ]; then
        $B sim --trace "$LOG/job.vsrec" --capacity-gib "$CAP" --conf "$conf" --json > "$LOG/sim-${conf%%:*}.jsonl" 2> "$LOG/sim-${conf%%:*}.err"
    else
        $B sim --trace "$LOG/job.vsrec" --capacity-gib "$CAP" --json > "$LOG/sim-default.jsonl" 2> "$LOG/sim-default.err"
    fi
    n=${conf%%:*}; n=${n:-default}
    cat "$LOG/sim-$n.err"
    tail -1 "$LOG/sim-$n.jsonl" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print({k: r[k] for k in ("allocated","reserved","segments","inactive_split","reserved_peak")})'
done
