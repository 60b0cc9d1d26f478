#!/usr/bin/env bash
# The agent's GPU tests. Needs an NVIDIA GPU and python3 with a CUDA torch.
#   tests/gpu/run.sh [--bench]
# Logs go to $OUT (if set) or target/gpu-logs. The real Rust reader
# (examples/ring_dump) checks what the agent writes: $VRAMSCOPE_RING_DUMP, or
# target/release/examples/ring_dump (built with cargo if missing).
# Prints "N passed, M failed"; exits non-zero on any failure.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG=${OUT:-$ROOT/target/gpu-logs}
mkdir -p "$LOG"
PY=${PYTHON:-python3}
PY=$(command -v "$PY")
export VRAMSCOPE_RING_DUMP=${VRAMSCOPE_RING_DUMP:-$ROOT/target/release/examples/ring_dump}
if [ ! -x "$VRAMSCOPE_RING_DUMP" ]; then
    cargo build --release --example ring_dump || { echo "cannot build ring_dump"; exit 1; }
fi
export VRAMSCOPE_AGENT_DIR=$ROOT/assets/agent
# A fresh build cache unless told otherwise: the first build is part of the test.
export XDG_CACHE_HOME=${VRAMSCOPE_GPU_CACHE:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
{
    nvidia-smi -L 2>&1
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1
    command -v c++ g++ 2>&1
    PYTHONPATH=$VRAMSCOPE_AGENT_DIR "$PY" -m vramscope.doctor --build 2>&1
} > "$LOG/env.log"
cat "$LOG/env.log"

pass=0
fail=0
# run_one NAME EXPECTED_WARNING_LINES COMMAND...
run_one() {
    local name=$1 warn=$2
    shift 2
    local shm
    shm=$(mktemp -d /tmp/vs-shm-XXXXXX)
    local t0=$SECONDS
    env VRAMSCOPE_SHM_DIR="$shm" "$@" > "$LOG/$name.log" 2>&1
    local rc=$?
    local left lines
    left=$(ls -A "$shm" | wc -l)
    lines=$(grep -c '^vramscope:' "$LOG/$name.log")
    if [ $rc -eq 0 ] && [ "$left" -eq 0 ] && [ "$lines" -eq "$warn" ]; then
        pass=$((pass + 1))
        echo "PASS $name ($((SECONDS - t0)) s)"
    else
        fail=$((fail + 1))
        echo "FAIL $name: rc=$rc, segments left behind=$left, 'vramscope:' lines=$lines (want $warn)"
        tail -n 30 "$LOG/$name.log" | sed 's/^/    /'
    fi
    grep -E '^(  FAIL|attach took|empty_cache:|vramscope:)' "$LOG/$name.log" | sed 's/^/    /'
    rm -rf "$shm"
}

NOCXX=$(mktemp -d /tmp/vs-bin-XXXXXX)
ln -s "$PY" "$NOCXX/python3"

run_one exact 0 "$PY" tests/gpu/test_exact.py
run_one expandable 0 "$PY" tests/gpu/test_expandable.py
run_one deferred 0 "$PY" tests/gpu/test_deferred.py
run_one auto_sitecustomize 0 env VRAMSCOPE_AUTO=1 PYTHONPATH="$VRAMSCOPE_AGENT_DIR" "$PY" tests/gpu/test_deferred.py
run_one fork 0 "$PY" tests/gpu/test_fork.py
run_one clock 0 "$PY" tests/gpu/test_clock.py
run_one sampled_cxx_hidden 1 env VRAMSCOPE_CXX=/nonexistent "$PY" tests/gpu/test_sampled.py
run_one sampled_path_without_cxx 1 env PATH="$NOCXX" CXX= "$PY" tests/gpu/test_sampled.py
run_one sampled_forced 1 env VRAMSCOPE_MODE=sampled "$PY" tests/gpu/test_sampled.py
run_one sampled_cudaMallocAsync 1 env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "$PY" tests/gpu/test_sampled.py
rm -rf "$NOCXX"
# Sampled mode through the collector: `snapshot`, `empty-cache PID` and the
# dashboard see a transformers job under `vramscope run` (needs transformers).
run_one sampled_e2e 0 env VRAMSCOPE_BIN="$ROOT/target/release/vramscope" bash tests/gpu/sampled_e2e.sh
# Attribution on real models, as `vramscope run` attaches (the tracker is
# cached by now, so it starts inside CUDA's initialisation).
ATTRIB="env VRAMSCOPE_AUTO=1 PYTHONPATH=$VRAMSCOPE_AGENT_DIR VRAMSCOPE_BIN=$ROOT/target/release/vramscope"
run_one attrib_gpt2 0 $ATTRIB "$PY" tests/gpu/test_attrib.py gpt2
run_one attrib_resnet 0 $ATTRIB "$PY" tests/gpu/test_attrib.py resnet

echo "gpu: $pass passed, $fail failed"
if [ "${1:-}" = "--bench" ]; then
    "$PY" tests/gpu/bench_overhead.py ${BENCH_ARGS:-} 2>&1 | tee "$LOG/bench.log"
fi
[ $fail -eq 0 ]
