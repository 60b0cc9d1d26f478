#!/usr/bin/env bash
# The collector's paths on a real PyTorch job (no code change to the job):
# `snapshot` sees it in exact mode, `empty-cache PID` releases memory through
# the control block, the dashboard draws it (a screenshot from a tmux pty),
# `record` stops cleanly on SIGTERM and the recording replays.
#   tests/gpu/collector_check.sh      (needs target/release/vramscope, tmux)
# Prints "N passed, M failed"; logs to $OUT or target/gpu-logs.
set -u
cd "$(dirname "$0")/../.."
B=$PWD/${VRAMSCOPE_BIN:-target/release/vramscope}
LOG=${OUT:-target/gpu-logs}/collector
mkdir -p "$LOG"
export VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-cc-XXXXXX)
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
pass=0
fail=0
check() { # NAME CONDITION-COMMAND...
    local name=$1
    shift
    if "$@" >> "$LOG/checks.log" 2>&1; then
        pass=$((pass + 1)); echo "PASS $name"
    else
        fail=$((fail + 1)); echo "FAIL $name"
    fi
}
$B doctor > "$LOG/doctor.log" 2>&1
$B record -o "$LOG/job.vsrec" > "$LOG/record.log" 2>&1 &
REC=$!
$B run -- python3 tests/gpu/varlen_train.py --seconds 16 > "$LOG/job.log" 2>&1 &
JOB=$!
sleep 6
$B snapshot --json > "$LOG/snapshot.json" 2> "$LOG/snapshot.err"
check snapshot_sees_the_job_exact python3 - "$LOG/snapshot.json" "$JOB" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); pid = int(sys.argv[2])
p = [p for p in s["processes"] if p["identity"]["host_pid"] == pid]
assert p, [q["identity"] for q in s["processes"]]
f = p[0]["view"]["figures"]
print("snapshot:", p[0]["source"]["mode"], "allocated", f["allocated"], "reserved", f["reserved"], "nvml", f["nvml_used"])
assert p[0]["source"]["mode"] == "exact" and f["allocated"] > 0 and f["reserved"] >= f["allocated"]
PY
$B empty-cache "$JOB" > "$LOG/empty_cache.txt" 2>&1
cat "$LOG/empty_cache.txt"
check empty_cache_answers grep -q "^process $JOB: released" "$LOG/empty_cache.txt"
tmux new-session -d -s vscc -x 200 -y 60 "$B --pid $JOB --screenshot $LOG/dashboard.svg --screenshot-after 2500; echo \$? > $LOG/dashboard.rc"
sleep 5
check dashboard_screenshot_of_the_job grep -q "varlen_train" "$LOG/dashboard.svg"
check dashboard_exit_0 grep -qx 0 "$LOG/dashboard.rc"
tmux kill-session -t vscc 2>/dev/null
wait $JOB
kill -TERM $REC
wait $REC
echo "record exit: $?" >> "$LOG/record.log"
cat "$LOG/record.log"
check record_stops_on_sigterm grep -q "^record exit: 0" "$LOG/record.log"
$B replay "$LOG/job.vsrec" > "$LOG/replay.txt" 2>&1
check replay_reads_it grep -q "varlen_train" "$LOG/replay.txt"
rm -rf "$VRAMSCOPE_SHM_DIR"
echo "collector: $pass passed, $fail failed"
[ $fail -eq 0 ]
