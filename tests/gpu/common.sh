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
