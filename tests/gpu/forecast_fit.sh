#!/usr/bin/env bash
# Recordings of real jobs for the forecast by simulation, `vramscope fit`
# and placement without addresses (issue 48). Jobs: tests/gpu/fit_job.py
# (GPT-2, ViT, Llama, BERT from configs, AdamW, bf16 autocast), and for
# the placement traces advise_job.py and diag_job.py. Each job is recorded
# from its start (as record_job in common.sh, with a time limit) into
# $OUT/ff/STAGE or target/gpu-logs/ff/STAGE; each recording is gzipped.
#
#     tests/gpu/forecast_fit.sh [STAGE...]    (default: calib forecast fit find)
#
# Stages:
#   calib     each forecast job once unconstrained, no leak, 4 steps (not
#             recorded): its peak reserved, from which the fraction is set
#   forecast  each model keeps a fixed leak a step under a memory fraction
#             put so that the leak reaches the limit around step N; it
#             catches each OOM and stops 5 steps after the first
#   fit       GPT-2, ViT and Llama at batch 4, 8, 16 and 32, 6 steps each,
#             the default setting
#   find      per model, a fraction aimed at batch ~20 (the fit runs' peaks
#             fitted as a + b * batch) and the largest batch that really
#             fits under it, found as Lightning's BatchSizeFinder does
#             (not recorded; each try a fresh process)
#   running   watchers started after the jobs (jobs already running,
#             0.25 s a step): two leaking under a fraction (the forecast,
#             RUNNING_FORECAST) and three at batch 8 under the fraction
#             trying found the largest batch at (the live fit, RUNNING_FIT).
#             From 8 s in: `snapshot --watch 2 --json` without --advise
#             (the advisor taken up by the projection) until they end;
#             `snapshot --advise --for 20 --json` (the live fit of every
#             job); the dashboard (no --advise) in tmux, `F` on the first
#             fit job. RUNNING_SLOTS=N: the jobs' rings hold N events
#             (VRAMSCOPE_SLOTS), so that they have wrapped when the watchers
#             come (watching mid-run, from an anchor snapshot)
#   placed    placement traces as tests/gpu/sim_placed.sh makes them
#             (statistics every 20 ms): timm ConvNeXt at a batch drawn
#             each step, timm ResNet-50 (channels_last, SGD), BERT at a
#             random batch and length each step, torch.compile'd GPT-2;
#             each replayed by `vramscope sim --trace`
set -u
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$PWD/target/vs-cache}
mkdir -p "$XDG_CACHE_HOME"
. "$(dirname "$0")/common.sh" ff
J=tests/gpu/fit_job.py
T0=$(date +%s)
log() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$D/driver.log"; }

# record_bounded DIR NAME LIMIT COMMAND...: record_job (common.sh), its
# files in DIR, the job stopped after LIMIT seconds; the recording gzipped.
record_bounded() {
    local dir=$1 name=$2 lim=$3 shm rec job
    shift 3
    mkdir -p "$dir"
    shm=$(mktemp -d /tmp/vs-rec-XXXXXX)
    VRAMSCOPE_SHM_DIR=$shm "$B" record -o "$dir/$name.vsrec" > "$dir/$name.rec.log" 2>&1 &
    rec=$!
    sleep 0.5
    rm -f "$dir/$name.truth.json"
    VRAMSCOPE_SHM_DIR=$shm timeout "$lim" "$B" run -- "$@" > "$dir/$name.job.log" 2>&1 &
    job=$!
    await_mark "$dir/$name.truth.json" $job $((lim * 10)) 0.1 || log "$name: no truth (the job ended or ran out of time)"
    sleep "${REC_SETTLE:-1}"
    kill -INT $rec; wait $rec
    kill $job 2>/dev/null; wait $job
    timeout 60 "$B" replay "$dir/$name.vsrec" --json > "$dir/$name.json" 2> "$dir/$name.replay.err"
    gzip -9f "$dir/$name.vsrec"
    rm -rf "$shm"
    log "$name: $(ls -l "$dir/$name.vsrec.gz" | awk '{print $5}') B gz; $(tail -n 1 "$dir/$name.job.log" | cut -c1-300)"
}

# model batch leak-MiB aimed-at-OOM-step, for the forecast (FORECAST in the
# environment replaces them: held-out jobs).
FORECAST=${FORECAST:-"gpt2:8:48:60 vit:32:80:45 llama:8:64:75 bert:16:24:100"}
# model aimed-at-largest-batch, for fit and find (FIT replaces them).
FIT=${FIT:-"gpt2:21 vit:23 llama:19"}

stage_calib() {
    mkdir -p "$D/calib"
    local m b pids=()
    for f in $FORECAST; do
        IFS=: read -r m b _ _ <<< "$f"
        timeout 180 python3 $J job $m --batch $b --steps 4 --out "$D/calib/$m.json" > "$D/calib/$m.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    for f in $FORECAST; do
        IFS=: read -r m _ _ _ <<< "$f"
        log "calib $m: $(tail -n 1 "$D/calib/$m.log" | cut -c1-300)"
    done
}

stage_forecast() {
    local m b l n
    for f in $FORECAST; do
        IFS=: read -r m b l n <<< "$f"
        [ -s "$D/calib/$m.json" ] || { log "forecast $m: no calibration"; continue; }
        record_bounded "$D/forecast" "$m-leak$l" 150 python3 $J job $m --batch $b --steps 200 --leak-mb $l \
            --target-oom $n --calib "$D/calib/$m.json" --after-oom 5 --out "$D/forecast/$m-leak$l.truth.json" --hold 30
    done
}

stage_fit() {
    local m
    for f in $FIT; do
        m=${f%%:*}
        for b in 4 8 16 32; do
            record_bounded "$D/fit" "$m-b$b" 90 python3 $J job $m --batch $b --steps 6 \
                --out "$D/fit/$m-b$b.truth.json" --hold 30
        done
    done
}

stage_find() {
    local m t pids=()
    for f in $FIT; do
        IFS=: read -r m t <<< "$f"
        timeout 300 python3 $J find $m --steps 6 --target $t --out "$D/fit/$m.truth.json" \
            --peaks "$D"/fit/$m-b{4,8,16,32}.truth.json > "$D/fit/$m.find.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    for f in $FIT; do
        m=${f%%:*}
        log "find $m: $(tail -n 1 "$D/fit/$m.find.log" | cut -c1-300)"
    done
}

RUNNING_FORECAST=${RUNNING_FORECAST:-"gpt2:8:48:60 llama:8:64:75"}
# model:fraction, the fixtures' (tests/fixtures/recordings/fit/MODEL.truth.json)
RUNNING_FIT=${RUNNING_FIT:-"gpt2:0.013029 vit:0.004363 llama:0.011528"}

stage_running() {
    local R="$D/running" m b l n fr pids=() first=
    mkdir -p "$R"
    local shm
    shm=$(mktemp -d /tmp/vs-running-XXXXXX)
    for f in $RUNNING_FORECAST; do
        IFS=: read -r m b l n <<< "$f"
        [ -s "$D/calib/$m.json" ] || { log "running $m: no calibration"; continue; }
        VRAMSCOPE_SLOTS=${RUNNING_SLOTS:-65536} VRAMSCOPE_SHM_DIR=$shm timeout 240 "$B" run -- python3 $J job $m --batch $b --steps 200 --leak-mb $l \
            --target-oom $n --calib "$D/calib/$m.json" --after-oom 3 --step-sleep 0.25 \
            --out "$R/$m-leak$l.truth.json" > "$R/$m-leak$l.job.log" 2>&1 &
        pids+=($!)
    done
    for f in $RUNNING_FIT; do
        IFS=: read -r m fr <<< "$f"
        VRAMSCOPE_SLOTS=${RUNNING_SLOTS:-65536} VRAMSCOPE_SHM_DIR=$shm timeout 240 "$B" run -- python3 $J job $m --batch 8 --steps 120 --fraction "$fr" \
            --step-sleep 0.25 --out "$R/$m-fit.truth.json" > "$R/$m-fit.job.log" 2>&1 &
        pids+=($!)
        [ -n "$first" ] || first=$m
    done
    sleep 8
    VRAMSCOPE_SHM_DIR=$shm timeout -s INT 90 "$B" snapshot --for 4 --watch 2 --json \
        > "$R/watch.jsonl" 2> "$R/watch.err" &
    local watch=$!
    VRAMSCOPE_SHM_DIR=$shm timeout 60 "$B" snapshot --advise --for 20 --json \
        > "$R/fit.json" 2> "$R/fit.err" &
    local fitlook=$!
    # The dashboard, started after the jobs, `F` on the first fit job.
    local pid
    pid=$(pgrep -f "^python3 tests/gpu/fit_job.py job $first --batch 8 --steps 120" | head -n 1)
    if [ -n "$pid" ] && command -v tmux > /dev/null; then
        tmux new-session -d -s vsfit -x 120 -y 40 "VRAMSCOPE_SHM_DIR=$shm $B --pid $pid"
        sleep 20
        tmux send-keys -t vsfit F
        sleep 6
        tmux capture-pane -t vsfit -p > "$R/dashboard-F.txt"
        tmux send-keys -t vsfit Escape A
        sleep 2
        tmux capture-pane -t vsfit -p > "$R/dashboard-A.txt"
        tmux send-keys -t vsfit q
        sleep 1
        tmux kill-session -t vsfit 2> /dev/null
    fi
    wait "${pids[@]}" $fitlook
    kill -INT $watch 2> /dev/null
    wait $watch
    rm -rf "$shm"
    log "running: $(wc -l < "$R/watch.jsonl") looks; $(grep -c 'Will it fit' "$R/dashboard-F.txt" 2> /dev/null) F overlay"
}

stage_placed() {
    local P="$D/placed"
    mkdir -p "$P"
    export VRAMSCOPE_STATS_MS=20
    record_bounded "$P" convnext-varbatch-placed 120 python3 tests/gpu/advise_job.py convnext --steps 30 \
        --out "$P/convnext-varbatch-placed.truth.json" --hold 30
    record_bounded "$P" bert-varlen-placed 120 python3 tests/gpu/diag_job.py bert-varlen --steps 30 \
        --step-sleep 0.02 --out "$P/bert-varlen-placed.truth.json" --hold 30
    record_bounded "$P" resnet50-placed 120 python3 tests/gpu/diag_job.py resnet --steps 20 \
        --step-sleep 0.02 --out "$P/resnet50-placed.truth.json" --hold 30
    record_bounded "$P" gpt2-compiled-placed 240 python3 tests/gpu/diag_job.py compiled --layers 2 --steps 30 \
        --step-sleep 0.02 --out "$P/gpt2-compiled-placed.truth.json" --hold 30
    unset VRAMSCOPE_STATS_MS
    for n in convnext-varbatch bert-varlen resnet50 gpt2-compiled; do
        [ -s "$P/$n-placed.vsrec.gz" ] || continue
        gunzip -kf "$P/$n-placed.vsrec.gz"
        timeout 120 "$B" sim --trace "$P/$n-placed.vsrec" > "$P/$n-placed.sim.log" 2>&1
        echo "sim rc=$?" >> "$P/$n-placed.sim.log"
        rm -f "$P/$n-placed.vsrec"
        log "sim $n: $(grep -h 'exactly placed' "$P/$n-placed.sim.log" | head -n 1 | cut -c1-300)"
    done
}

log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
log "torch $(python3 -c 'import torch; print(torch.__version__)')"
stages=${*:-calib forecast fit find}
# The agent builds its tracker on first use: built here, before any job is
# recorded (a job would run unwatched while it builds); the calibration
# (not recorded) runs meanwhile.
if [[ " $stages " == *" calib "* ]]; then
    warm_agent &
    w=$!
    stage_calib
    wait $w
    stages=${stages/calib/}
else
    warm_agent
fi
log "agent: $(tail -n 1 "$D/warm.log" | cut -c1-300)"
for s in $stages; do
    log "stage $s"
    "stage_$s"
done
log "done"
