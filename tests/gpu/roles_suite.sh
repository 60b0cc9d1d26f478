#!/usr/bin/env bash
# Roles on real jobs in every stack, and what role lists cost (issue 26).
# Needs a GPU (two for fsdp2 and ddp), torch, transformers, timm, accelerate
# and lightning; the release binary (target/release/vramscope).
#   tests/gpu/roles_suite.sh [stacks...] [bench-gpt2 bench-resnet]
# stacks: plain resnet compiled ckpt trainer accelerate lightning
# lightning-manual inference (one GPU), fsdp2 ddp (torchrun, two ranks)
# (tests/gpu/test_roles.py). bench-*: tests/gpu/bench_attrib.py with the
# variants bare, attrib (role lists on) and attrib_noroles, small batches
# (GPT-2 2x128, ResNet-50 8), BENCH_ROUNDS rounds of BENCH_STEPS steps.
# Logs to $OUT (or target/gpu-logs); a summary to $OUT/roles-summary.txt.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
LOG=${OUT:-$ROOT/target/gpu-logs}
mkdir -p "$LOG"
export VRAMSCOPE_BIN=${VRAMSCOPE_BIN:-$ROOT/target/release/vramscope}
export XDG_CACHE_HOME=${VRAMSCOPE_GPU_CACHE:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
export PYTHONPATH=$ROOT/assets/agent
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SUMMARY=$LOG/roles-summary.txt
: > "$SUMMARY"
what=("$@")
[ ${#what[@]} -eq 0 ] && what=(plain resnet compiled ckpt trainer accelerate lightning lightning-manual inference fsdp2 ddp bench-gpt2 bench-resnet)
timeout 300 python3 -m vramscope.doctor --build > "$LOG/build.log" 2>&1
echo "build: rc=$? $(tail -n 1 "$LOG/build.log")" | tee -a "$SUMMARY"
for w in "${what[@]}"; do
    shm=$(mktemp -d /tmp/vs-shm-XXXXXX)
    t0=$SECONDS
    case $w in
    bench-*)
        m=${w#bench-}
        batch=2x128
        [ "$m" = resnet ] && batch=8
        VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 timeout 400 python3 tests/gpu/bench_attrib.py "$m" \
            --rounds "${BENCH_ROUNDS:-40}" --steps "${BENCH_STEPS:-10}" --variants attrib,attrib_noroles \
            --batch "$batch" --out "$LOG/roles-$w.json" > "$LOG/roles-$w.log" 2>&1
        echo "$w (batch $batch): rc=$? ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
        grep -E '^(variant|bare|attrib|attrib_noroles|roles:) ' "$LOG/roles-$w.log" | tee -a "$SUMMARY"
        ;;
    fsdp2 | ddp)
        VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 timeout 300 torchrun --nproc_per_node 2 tests/gpu/test_roles.py "$w" \
            > "$LOG/roles-$w.log" 2>&1
        echo "$w: rc=$? ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
        grep -E '(  ok|  FAIL|torch holds|vramscope:|Error)' "$LOG/roles-$w.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        ;;
    *)
        # (One GPU: on two, HF Trainer would wrap the model in DataParallel.)
        CUDA_VISIBLE_DEVICES=0 VRAMSCOPE_SHM_DIR=$shm VRAMSCOPE_AUTO=1 timeout 300 python3 tests/gpu/test_roles.py "$w" \
            > "$LOG/roles-$w.log" 2>&1
        echo "$w: rc=$? ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
        grep -E '^(  ok|  FAIL|.*torch holds|vramscope:|.*Error)' "$LOG/roles-$w.log" | sed 's/^/    /' | tee -a "$SUMMARY"
        ;;
    esac
    rm -rf "$shm"
done
