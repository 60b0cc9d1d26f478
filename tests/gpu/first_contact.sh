#!/usr/bin/env bash
# Issue 43 on a GPU machine: a new user's first jobs, each part on a fresh
# build cache (XDG_CACHE_HOME), with the release binary.
#   tests/gpu/first_contact.sh [PART...]   (default: runs eight late exit attach cost startup)
# runs    six short jobs in a row under `vramscope run`, `record` started
#         before each: every one recorded from its first allocation (not
#         mid-run), 0 inconsistencies, every step counted, figures equal to
#         torch's at the end, no temporary file left in the cache;
# eight   eight `run`s at once: one build, the others wait, all exact at
#         their first step;
# late    the late start: jobs started without `run` (the agent imported by
#         the sitecustomize) with the detached build delayed
#         (VRAMSCOPE_TEST_BUILD_DELAY), on GPT-2, Llama and ViT recorded:
#         sampled first, exact after, 0 inconsistencies, figures equal;
# lateroles  the same on test_roles.py (plain GPT-2, ResNet-50, an
#         inference loop): bytes by module and role equal torch's;
# exit    20 jobs whose build ends at random points (before, during, after
#         the job, and in its shutdown): each exits with its own status, no
#         abort;
# attach  `vramscope attach PID` on a running job started with no agent:
#         exact from then on, figures equal to torch's at the end;
# cost    step time with the agent (roles, attribution) against bare,
#         alternated in one process (bench_attrib.py), GPT-2, Llama, ViT;
# startup what `run` adds to a start once the build is cached.
# Writes $D/summary.txt (one PASS/FAIL line per check) and logs beside it.
set -u
. "$(dirname "$0")/common.sh" first_contact
S=$D/summary.txt
: > "$S"
JOB=(python3 tests/gpu/first_job.py)
say() { echo "$*" | tee -a "$S"; }
fresh() { export XDG_CACHE_HOME=$(mktemp -d /tmp/vs-cache-XXXXXX); }
temporaries() { ls -A "$XDG_CACHE_HOME/vramscope" 2>/dev/null | grep -c -E '^\.(building|tmp)-'; }

# rec_job NAME COMMAND...: `record` from before COMMAND starts until COMMAND
# wrote $D/NAME.truth.json (COMMAND gets --truth and --hold 3); replayed
# into $D/NAME.json. Returns COMMAND's exit status in $rc.
rec_job() {
    local name=$1 shm rec job
    shift
    shm=$(mktemp -d /tmp/vs-rec-XXXXXX)
    VRAMSCOPE_SHM_DIR=$shm "$B" record -o "$D/$name.vsrec" > "$D/$name.rec.log" 2>&1 &
    rec=$!
    sleep 0.5
    rm -f "$D/$name.truth.json"
    VRAMSCOPE_SHM_DIR=$shm timeout 300 "$@" --truth "$D/$name.truth.json" --hold 3 > "$D/$name.job.log" 2>&1 &
    job=$!
    [ -n "${ON_START:-}" ] && $ON_START $job "$shm"
    await_mark "$D/$name.truth.json" $job 3000 0.1
    sleep 1
    kill -INT $rec; wait $rec
    wait $job; rc=$?
    "$B" replay "$D/$name.vsrec" --json > "$D/$name.json" 2> "$D/$name.replay.err"
    rm -rf "$shm"
}

# check_rec NAME WANT_FIRST_MODE: the replay against the job's own figures.
check_rec() {
    python3 - "$D/$1.json" "$D/$1.truth.json" "$1" "$2" <<'PY' | tee -a "$S"
import json, sys
try:
    doc, truth = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
except Exception as e:
    print("FAIL %s: no replay or truth (%s)" % (sys.argv[3], e)); sys.exit(0)
ps = [p for p in doc["processes"] if p["identity"]["host_pid"] == truth["pid"]]
if not ps:
    print("FAIL %s: pid %d not in the recording" % (sys.argv[3], truth["pid"])); sys.exit(0)
p = ps[-1]
v = p["view"]
f = v["figures"]
steps = v["leak"].get("steps_observed")
ok = (f["inconsistencies"] == 0 and f["allocated"] == truth["allocated"] and f["reserved"] == truth["reserved"]
      and (sys.argv[4] == "any" or truth["mode_first_step"] == sys.argv[4]))
if sys.argv[4] == "exact":
    ok = ok and not v["watch"]["mid_run"] and steps is not None and steps >= truth["steps"] - 1
print("%s %s: %s, %d processes for the pid, first step %s, last %s; inconsistencies %d, steps %s of %d, mid_run %s, "
      "allocated %d vs torch %d, reserved %d vs torch %d, lost %d"
      % ("PASS" if ok else "FAIL", sys.argv[3], truth["model"], len(ps), truth["mode_first_step"], truth["mode_last_step"],
         f["inconsistencies"], steps, truth["steps"], v["watch"]["mid_run"], f["allocated"], truth["allocated"],
         f["reserved"], truth["reserved"], f["lost_events"]))
PY
}

part_runs() {
    fresh
    local t0 t1 i
    for i in 1 2 3 4 5 6; do
        t0=$(date +%s.%N)
        rec_job "runs$i" "$B" run -- "${JOB[@]}" gpt2 20
        t1=$(date +%s.%N)
        say "runs$i: exit $rc, $(python3 -c "print(round($t1-$t0,1))") s wall, run's line: $(grep -m1 'vramscope:' "$D/runs$i.job.log")"
        check_rec "runs$i" exact
    done
    n=$(temporaries)
    [ "$n" = 0 ] && say "PASS runs: no temporary file in the cache" || say "FAIL runs: $n temporary files: $(ls -A "$XDG_CACHE_HOME/vramscope")"
}

part_eight() {
    fresh
    local i pids=() bad=0
    for i in 1 2 3 4 5 6 7 8; do
        timeout 300 "$B" run -- "${JOB[@]}" gpt2 10 --truth "$D/eight$i.truth.json" --exit $i > "$D/eight$i.log" 2>&1 &
        pids+=($!)
    done
    for i in 1 2 3 4 5 6 7 8; do
        wait "${pids[$((i - 1))]}"; r=$?
        [ "$r" = "$i" ] || { bad=1; say "FAIL eight$i: exit $r"; }
    done
    built=$(grep -l 'building the tracker and' "$D"/eight*.log | wc -l)
    waited=$(grep -l 'waiting for process' "$D"/eight*.log | wc -l)
    exact=$(grep -l '"mode_first_step": "exact"' "$D"/eight*.truth.json | wc -l)
    libs=$(ls "$XDG_CACHE_HOME/vramscope" | grep -c '^tracker-.*\.so$')
    ok=PASS; { [ $bad = 0 ] && [ "$built" = 1 ] && [ "$exact" = 8 ] && [ "$libs" = 1 ]; } || ok=FAIL
    say "$ok eight: $built built, $waited said they wait, $exact of 8 exact at their first step, $libs tracker library, temporaries $(temporaries)"
}

part_late() {
    fresh
    local agent m pids=()
    agent=$("$B" agent path)
    for m in gpt2 llama vit; do
        ( PYTHONPATH=$agent VRAMSCOPE_AUTO=1 VRAMSCOPE_TEST_BUILD_DELAY=4 rec_job "late-$m" "${JOB[@]}" "$m" 10 --seconds 45
          echo "exit $rc" > "$D/late-$m.rc" ) &
        pids+=($!)
        sleep 2
    done
    wait "${pids[@]}"
    for m in gpt2 llama vit; do
        say "late-$m: $(cat "$D/late-$m.rc"); $(grep 'vramscope:' "$D/late-$m.job.log" | tr '\n' ' ')"
        check_rec "late-$m" sampled
    done
}

part_lateroles() {  # roles after a late start equal torch's (tests/gpu/test_roles.py)
    fresh
    local agent w steps pids=()
    agent=$("$B" agent path)
    for w in plain resnet inference; do
        case $w in plain) steps=3000 ;; resnet) steps=2500 ;; *) steps=6 ;; esac
        PYTHONPATH=$agent VRAMSCOPE_AUTO=1 VRAMSCOPE_TEST_BUILD_DELAY=2 ROLES_STEPS=$steps ROLES_SECONDS=50 VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-lr-XXXXXX) \
            timeout 300 python3 tests/gpu/test_roles.py "$w" > "$D/lateroles-$w.log" 2>&1 &
        pids+=($!)
        sleep 1
    done
    wait "${pids[@]}"
    for w in plain resnet inference; do
        ok=PASS; grep -q '  FAIL' "$D/lateroles-$w.log" && ok=FAIL
        grep -q 'exact mode from now on' "$D/lateroles-$w.log" || ok=FAIL
        say "$ok lateroles $w: $(grep -E '(  ok|  FAIL).*(roles? |bytes by)|torch holds' "$D/lateroles-$w.log" | tr '\n' ' ' | cut -c1-600)"
    done
}

part_exit() {
    local wave i d l s pids names bad=0 abort=0 during=0 shut=0 after=0 never=0
    for wave in 1 2; do
        pids=() names=()
        for i in $(seq 1 10); do
            fresh
            d=$((RANDOM % 16)) l=$((15 + RANDOM % 31)) s=$((RANDOM % 50))
            name=exit$wave-$i
            echo "$d $l $s $XDG_CACHE_HOME" > "$D/$name.param"
            # Every other job waits at exit for its build, then 0-0.5 s:
            # the build ends in its shutdown.
            shut_arg=()
            [ $((i % 2)) = 0 ] && shut_arg=(--end-in-shutdown "0.$((RANDOM % 6))")
            ( agent=$("$B" agent path)
              PYTHONPATH=$agent VRAMSCOPE_AUTO=1 VRAMSCOPE_TEST_BUILD_DELAY=$d timeout 200 "${JOB[@]}" gpt2 3 --seconds "$l" \
                  --truth "$D/$name.truth.json" --exit "$s" "${shut_arg[@]}" > "$D/$name.log" 2>&1
              echo $? > "$D/$name.rc"; date +%s.%N > "$D/$name.end" ) &
            pids+=($!) names+=("$name")
        done
        wait "${pids[@]}"
    done
    sleep 40  # the detached builds of jobs that ended first
    for f in "$D"/exit*.param; do
        name=$(basename "$f" .param)
        read -r d l s cache < "$f"
        r=$(cat "$D/$name.rc")
        [ "$r" = "$s" ] || { bad=$((bad + 1)); say "FAIL $name: exit $r, wanted $s"; }
        grep -q -E 'pure virtual|terminate called|Aborted|core dumped' "$D/$name.log" && abort=$((abort + 1))
        # (The builder's end: its stamp, written after both libraries.)
        lib=$(ls "$cache"/vramscope/ready-*.json 2>/dev/null | head -1)
        if [ -z "$lib" ]; then
            never=$((never + 1))
        else
            python3 - "$lib" "$D/$name.truth.json" "$D/$name.end" <<'PY' > "$D/$name.when"
import os, sys
built = os.stat(sys.argv[1]).st_mtime
last = os.stat(sys.argv[2]).st_mtime if os.path.exists(sys.argv[2]) else None
end = float(open(sys.argv[3]).read())
print("during-run" if last and built < last else "during-shutdown" if built < end else "after-exit")
PY
            case $(cat "$D/$name.when") in during-run) during=$((during + 1)) ;; during-shutdown) shut=$((shut + 1)) ;; *) after=$((after + 1)) ;; esac
        fi
    done
    switched=$(grep -l 'exact mode from now on' "$D"/exit*.log | wc -l)
    ok=PASS; { [ $bad = 0 ] && [ $abort = 0 ]; } || ok=FAIL
    say "$ok exit: 20 jobs ($switched turned exact while they ran), $bad with another status, $abort aborted; build ended during the run $during, in shutdown $shut, after exit $after, never $never"
}

attach_now() {  # ON_START hook: attach 12 s after the job started ($1 is its `timeout`)
    ( sleep 12; pid=$(cat /proc/$1/task/$1/children | awk '{print $1}')
      echo "job pid $pid" > "$D/attach.out"
      VRAMSCOPE_SHM_DIR=$2 "$B" attach "$pid" >> "$D/attach.out" 2>&1; echo "attach exit $?" >> "$D/attach.out"
      VRAMSCOPE_SHM_DIR=$2 "$B" attach "$pid" >> "$D/attach.out" 2>&1; echo "again exit $?" >> "$D/attach.out" ) &
}

part_attach() {
    fresh
    "$B" agent build > "$D/attach-build.log" 2>&1
    ON_START=attach_now rec_job attach "${JOB[@]}" gpt2 10 --seconds 30
    say "attach: job exit $rc; $(tr '\n' ' ' < "$D/attach.out")"
    check_rec attach any
}

part_cost() {  # the job's cost: step time, agent on (the default) vs bare, alternated in one process
    fresh
    local agent m
    agent=$("$B" agent path)
    "$B" agent build > "$D/cost-build.log" 2>&1
    for m in gpt2 llama vit; do
        PYTHONPATH=$agent VRAMSCOPE_AUTO=1 timeout 300 python3 tests/gpu/bench_attrib.py "$m" --variants attrib \
            --rounds 40 --steps 3 --out "$D/cost-$m.json" > "$D/cost-$m.log" 2>&1
        python3 - "$D/cost-$m.json" "$m" <<'PY' | tee -a "$S"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("FAIL cost %s: no result (%s)" % (sys.argv[2], e)); sys.exit(0)
v = r["variants"]["attrib"]
print("%s cost %s: step %.2f ms bare, %.2f ms with the agent: ratio %.4f (95%% %.4f..%.4f), %d rounds of %d steps, native %s"
      % ("PASS" if v["ratio"] <= 1.01 else "FAIL", sys.argv[2], r["variants"]["bare"]["step_ms"], v["step_ms"], v["ratio"],
         v["lo"], v["hi"], r["rounds"], r["steps"], r["native"]))
PY
    done
}

part_startup() {
    fresh
    "$B" agent build > "$D/startup-build.log" 2>&1
    python3 - "$B" <<'PY' | tee -a "$S"
import statistics, subprocess, sys, time
def t(cmd):
    s = time.perf_counter(); subprocess.run(cmd, check=True); return time.perf_counter() - s
bare, run = [], []
for _ in range(7):
    bare.append(t(["python3", "-c", "import torch"]))
    run.append(t([sys.argv[1], "run", "--", "python3", "-c", "import torch"]))
mb, mr = statistics.median(bare), statistics.median(run)
print("%s startup: `python3 -c 'import torch'` median %.3f s bare, %.3f s under run: +%.3f s (7 alternated pairs)"
      % ("PASS" if mr - mb <= 0.5 else "FAIL", mb, mr, mr - mb))
PY
}

for part in ${*:-runs eight late lateroles exit attach cost startup}; do
    say "== $part"
    "part_$part"
done
grep -c '^PASS' "$S" | xargs echo "passed:" | tee -a "$S"
grep -c '^FAIL' "$S" | xargs echo "failed:" | tee -a "$S"
