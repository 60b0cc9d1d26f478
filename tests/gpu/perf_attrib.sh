#!/usr/bin/env bash
# Where attribution's CPU goes inside a real training step (issue 15): each
# variant's loop runs in its own process under `perf record -e cpu-clock`
# (a software event: works in VMs without hardware counters), with
# PYTHONPERFSUPPORT=1 so that Python functions are named; then the share
# of CPU samples in each library, and in the agent's own code, per variant.
#   PERF="<perf command>" tests/gpu/perf_attrib.sh [resnet|gpt2] [steps]
# The GPU machine has no perf: carry one (`scripts/carry_perf.sh DIR` copies
# this machine's perf with its libraries and loader, and prints the PERF
# value to use there). PERF_ARGS adds options (e.g. "-g" for call graphs).
# Variants: tracker (attribution removed), attrib (the default), notag
# (attribution with the tracker's tags off). Needs torch, the model's
# library (transformers or timm) and a C++ compiler, as attrib_suite.sh.
# Logs and reports go to $OUT (or target/gpu-logs); a summary to
# $OUT/perf-summary.txt.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG=${OUT:-$ROOT/target/gpu-logs}
mkdir -p "$LOG"
model=${1:-resnet}
steps=${2:-1000}
: "${PERF:?set PERF to a perf command (see scripts/carry_perf.sh)}"
export XDG_CACHE_HOME=${VRAMSCOPE_GPU_CACHE:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
export PYTHONPATH=$ROOT/assets/agent
SUMMARY=$LOG/perf-summary.txt
: > "$SUMMARY"
timeout 300 python3 -m vramscope.doctor --build > "$LOG/perf-build.log" 2>&1
echo "build: rc=$? $(tail -n 1 "$LOG/perf-build.log")" | tee -a "$SUMMARY"

for v in tracker attrib notag; do
    shm=$(mktemp -d /tmp/vs-shm-XXXXXX)
    data=$(mktemp /tmp/vs-perf-XXXXXX.data)
    # (word splitting of $PERF and $PERF_ARGS is intended: a command line)
    # shellcheck disable=SC2086
    VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 PYTHONPERFSUPPORT=1 timeout 300 \
        $PERF record -F 2000 -e cpu-clock ${PERF_ARGS:-} -o "$data" \
        python3 tests/gpu/perf_attrib_loop.py "$model" "$v" "$steps" > "$LOG/perf-$v.log" 2>&1
    echo "$v: rc=$? $(grep 'ms per step' "$LOG/perf-$v.log")" | tee -a "$SUMMARY"
    # shellcheck disable=SC2086
    timeout 200 $PERF report -i "$data" --sort dso --no-children --stdio 2>/dev/null | grep '%' > "$LOG/perf-$v-dso.txt"
    # shellcheck disable=SC2086
    timeout 300 $PERF report -i "$data" --sort dso,sym --no-children --stdio 2>/dev/null | grep '%' \
        | grep -E 'fastcall-|tracker-|vramscope|\[JIT\]' | head -n 80 > "$LOG/perf-$v-agent.txt"
    grep -E 'fastcall-|tracker-|\[JIT\]' "$LOG/perf-$v-dso.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
    rm -rf "$shm" "$data"
done
