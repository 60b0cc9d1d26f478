# What the GPU shell scripts share, sourced first (after `set -u`):
#   . "$(dirname "$0")/common.sh" NAME
# Moves to the repository root and sets B (the vramscope binary:
# $VRAMSCOPE_BIN, else the release build), D (the folder for logs and
# recordings, $OUT/NAME or target/gpu-logs/NAME, created) and exports
# XDG_CACHE_HOME (where the agent builds its tracker: a fresh folder unless
# given).
cd "$(dirname "$0")/../.."
B=${VRAMSCOPE_BIN:-$PWD/target/release/vramscope}
D=${OUT:-target/gpu-logs}/$1
mkdir -p "$D"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d /tmp/vs-cache-XXXXXX)}

# await_mark FILE PID TRIES PAUSE: waits (at most TRIES times PAUSE
# seconds) for FILE to appear while the process PID runs; fails when the
# process ends first or the time is up.
await_mark() {
    local _i
    for _i in $(seq 1 "$3"); do
        [ -e "$1" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep "$4"
    done
    return 1
}

# record_job NAME COMMAND...: records a job from its start. `vramscope
# record` writes $D/NAME.vsrec while COMMAND (run under `vramscope run`,
# its output in $D/NAME.job.log) works; COMMAND writes $D/NAME.truth.json
# at the point to keep and then holds still; the recording stops there
# (the job's teardown would free what it holds), the job is stopped, and
# the recording is replayed into $D/NAME.json. Each job has its own
# segment directory. REC_SETTLE: seconds between the truth and the end of
# the recording (default 1; more where several ranks write their own).
record_job() {
    local name=$1 shm rec job
    shift
    shm=$(mktemp -d /tmp/vs-rec-XXXXXX)
    VRAMSCOPE_SHM_DIR=$shm "$B" record -o "$D/$name.vsrec" > "$D/$name.rec.log" 2>&1 &
    rec=$!
    sleep 0.5
    rm -f "$D/$name.truth.json"
    VRAMSCOPE_SHM_DIR=$shm timeout 600 "$B" run -- "$@" > "$D/$name.job.log" 2>&1 &
    job=$!
    await_mark "$D/$name.truth.json" $job 3000 0.1
    sleep "${REC_SETTLE:-1}"
    kill -INT $rec; wait $rec
    kill $job 2>/dev/null; wait $job
    "$B" replay "$D/$name.vsrec" --json > "$D/$name.json" 2> "$D/$name.replay.err"
    rm -rf "$shm"
}

# warm_agent: has the agent build its tracker and native attribution (the
# first use builds them in a background thread, and a job recorded
# meanwhile runs unwatched): a short job under `vramscope run` that waits
# until the agent is exact and attribution native, or 240 s.
warm_agent() {
    timeout 300 "$B" run -- python3 -c "
import time, torch
torch.zeros(1, device='cuda')
import vramscope
for _ in range(480):
    s = vramscope.status()
    if s.get('mode') not in (None, 'pending') and s.get('attribution_native') is not False:
        break
    time.sleep(0.5)
print(vramscope.status())
" > "$D/warm.log" 2>&1
}
