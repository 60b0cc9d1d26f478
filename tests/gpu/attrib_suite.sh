#!/usr/bin/env bash
# Attribution on real models, and what it costs (issue 15). Needs a GPU,
# torch, transformers and timm; the release binary (target/release/vramscope)
# and examples/ring_dump.
#   tests/gpu/attrib_suite.sh [tests...] [bench...]
# tests: gpt2 resnet compiled gpt2-ckpt, and gpt2-params resnet-params (backward
# tracked for every module with parameters), gpt2-py resnet-py (module calls
# through the Python wrapper, not the native path) (tests/gpu/test_attrib.py)
# bench: bench-calls bench-gpt2 bench-resnet (tests/gpu/bench_attrib.py MODEL)
# Default: every test, then both benchmarks. BENCH_ROUNDS / BENCH_STEPS /
# BENCH_VARIANTS / BENCH_BATCH / BENCH_SETTLE override the benchmark's rounds, steps,
# variants, batch and untimed steps after a switch. Logs and JSON go to $OUT (or
# target/gpu-logs); a summary to $OUT/attrib-summary.txt.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG=${OUT:-$ROOT/target/gpu-logs}
mkdir -p "$LOG"
export VRAMSCOPE_BIN=${VRAMSCOPE_BIN:-$ROOT/target/release/vramscope}
export VRAMSCOPE_RING_DUMP=${VRAMSCOPE_RING_DUMP:-$ROOT/target/release/examples/ring_dump}
export XDG_CACHE_HOME=${VRAMSCOPE_GPU_CACHE:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
export PYTHONPATH=$ROOT/assets/agent
SUMMARY=$LOG/attrib-summary.txt
: > "$SUMMARY"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(gpt2 resnet compiled bench-gpt2 bench-resnet)

# Build the tracker once (cached): the jobs then start it inside CUDA's
# initialisation, before model.cuda() copies the first parameter.
timeout 300 python3 -m vramscope.doctor --build > "$LOG/build.log" 2>&1
echo "build: rc=$? $(tail -n 1 "$LOG/build.log")" | tee -a "$SUMMARY"

for w in "${what[@]}"; do
    shm=$(mktemp -d /tmp/vs-shm-XXXXXX)
    t0=$SECONDS
    case $w in
    bench-*)
        m=${w#bench-}
        VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 timeout 400 python3 tests/gpu/bench_attrib.py "$m" \
            --rounds "${BENCH_ROUNDS:-12}" --steps "${BENCH_STEPS:-20}" ${BENCH_VARIANTS:+--variants "$BENCH_VARIANTS"} ${BENCH_BATCH:+--batch "$BENCH_BATCH"} ${BENCH_SETTLE:+--settle "$BENCH_SETTLE"} \
            --out "$LOG/$w.json" > "$LOG/$w.log" 2>&1
        rc=$?
        echo "$w: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
        grep -E '^(callback|per module|native|variant|bare|hooks|wrapper|tracker|attrib|attrib_py|attrib_all|attrib_nobw|attrib_notag|attrib_params|capture|history) ' "$LOG/$w.log" | tee -a "$SUMMARY"
        ;;
    *)
        policy=auto native=1
        [ "${w%-params}" != "$w" ] && policy=params
        [ "${w%-py}" != "$w" ] && native=0
        VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 VRAMSCOPE_ATTRIBUTION_BACKWARD=$policy VRAMSCOPE_ATTRIBUTION_NATIVE=$native \
            timeout 400 python3 tests/gpu/test_attrib.py "$w" > "$LOG/$w.log" 2>&1
        rc=$?
        echo "$w: rc=$rc ($((SECONDS - t0)) s) $(tail -n 1 "$LOG/$w.log")" | tee -a "$SUMMARY"
        grep -E '^(  FAIL|graph break|  graph break|attributed|backward policy|vramscope:)' "$LOG/$w.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        ;;
    esac
    rm -rf "$shm"
done
