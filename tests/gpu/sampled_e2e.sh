#!/usr/bin/env bash
# Sampled mode end to end on a GPU (item 1 of the reliability issue): a small
# real transformers training job (GPT-2 from a config: 2 layers, width 256;
# no network) runs under `vramscope run` in sampled mode, forced
# (VRAMSCOPE_MODE=sampled) and by an allocator that refuses the tracker
# (PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync). At a quiescent point the
# job writes torch's own memory_reserved()/memory_allocated() and waits;
# then `vramscope snapshot --json` must show the job with those figures,
# `vramscope empty-cache PID` must release what torch then reports, and the
# dashboard (a screenshot, no terminal needed) must show the job's pid and
# the word `sampled`.
#   tests/gpu/sampled_e2e.sh     (needs target/release/vramscope, or
#                                 $VRAMSCOPE_BIN; python3 with a CUDA torch
#                                 and transformers, or $PYTHON)
# Prints PASS/FAIL lines and "sampled_e2e: N passed, M failed"; logs to
# $OUT/sampled_e2e or target/gpu-logs/sampled_e2e; exits non-zero on any
# failure.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
B=${VRAMSCOPE_BIN:-$ROOT/target/release/vramscope}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
PY=${PYTHON:-python3}
LOG=${OUT:-$ROOT/target/gpu-logs}/sampled_e2e
mkdir -p "$LOG"
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-$(mktemp -d /tmp/vs-cache-XXXXXX)}
if [ ! -x "$B" ]; then
    echo "FAIL setup: no vramscope binary at $B (cargo build --release, or set VRAMSCOPE_BIN)"
    echo "sampled_e2e: 0 passed, 1 failed"
    exit 1
fi
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
no() { fail=$((fail + 1)); echo "FAIL $1${2:+: $2}"; }

# The job: a few training steps, then quiescent; it reports torch's figures
# to $CTL/state.json, waits for $CTL/go, reports them again to
# $CTL/after.json, waits for $CTL/done, exits.
JOB=$(mktemp /tmp/vs-sampled-job-XXXXXX.py)
cat > "$JOB" <<'PY'
import json, os, sys, time
import torch
from transformers import GPT2Config, GPT2LMHeadModel

ctl = sys.argv[1]
dev = torch.device("cuda:0")

def report(name):
    torch.cuda.synchronize(dev)
    try:
        import vramscope  # on PYTHONPATH under `vramscope run`
        st = vramscope.status()
    except Exception as e:
        st = {"mode": None, "reason": repr(e)}
    d = {"pid": os.getpid(), "reserved": torch.cuda.memory_reserved(dev),
         "allocated": torch.cuda.memory_allocated(dev),
         "backend": torch.cuda.get_allocator_backend(), "mode": st.get("mode"), "reason": st.get("reason")}
    print(name, d, flush=True)
    with open(os.path.join(ctl, name + ".tmp"), "w") as f:
        json.dump(d, f)
    os.rename(os.path.join(ctl, name + ".tmp"), os.path.join(ctl, name))

def wait(name):
    deadline = time.monotonic() + 600
    while not os.path.exists(os.path.join(ctl, name)):
        if time.monotonic() > deadline:
            sys.exit("no %s within 600 s" % name)
        time.sleep(0.05)

torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=128)
model = GPT2LMHeadModel(cfg).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(30):
    ids = torch.randint(0, cfg.vocab_size, (16, 128), device=dev)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("loss", float(loss), flush=True)
del ids, loss
torch.cuda.synchronize(dev)
# The agent settles (exact or sampled) within seconds of CUDA's start.
try:
    import vramscope
    for _ in range(600):
        if vramscope.status().get("mode") != "pending":
            break
        time.sleep(0.1)
except Exception:
    pass
time.sleep(1.5)  # quiescent: the agent's statistics (every 250 ms) catch up
report("state.json")
wait("go")
report("after.json")
wait("done")
PY

# vramscope's byte format (crates/text/src/format.rs, `bytes`): whole bytes below
# 1 KiB, else three significant digits in binary units.
FMT='
def vbytes(b):
    names = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    if b < 1024:
        return "%d B" % b
    v, u = float(b), 0
    while v >= 1023.5 and u < len(names) - 1:
        v /= 1024.0
        u += 1
    n = "%.2f" % v if v < 10 else "%.1f" % v if v < 100 else "%.0f" % v
    return "%s %s" % (n, names[u])
'

JOB_PID=
cleanup() {
    [ -n "$JOB_PID" ] && kill "$JOB_PID" 2>/dev/null
    rm -f "$JOB"
}
trap cleanup EXIT

# case NAME ENV...: one job under `vramscope run` with ENV.
one_case() {
    local name=$1
    shift
    local shm ctl
    shm=$(mktemp -d /tmp/vs-shm-XXXXXX)
    ctl=$(mktemp -d /tmp/vs-ctl-XXXXXX)
    echo "== $name ($*)"
    env "$@" VRAMSCOPE_SHM_DIR="$shm" "$B" run -- "$PY" "$JOB" "$ctl" > "$LOG/$name.job.log" 2>&1 &
    JOB_PID=$!
    local t0=$SECONDS
    while [ ! -e "$ctl/state.json" ] && kill -0 "$JOB_PID" 2>/dev/null && [ $((SECONDS - t0)) -lt 600 ]; do
        sleep 0.2
    done
    if [ ! -e "$ctl/state.json" ]; then
        no "$name: job reached its quiescent point" "see $LOG/$name.job.log"
        tail -n 20 "$LOG/$name.job.log" | sed 's/^/    /'
        kill "$JOB_PID" 2>/dev/null
        wait "$JOB_PID" 2>/dev/null
        JOB_PID=
        rm -rf "$shm" "$ctl"
        return
    fi
    local pid
    pid=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["pid"])' "$ctl/state.json")
    if "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(d["mode"] != "sampled")' "$ctl/state.json"; then
        ok "$name: the agent runs in sampled mode"
    else
        no "$name: the agent runs in sampled mode" "$(cat "$ctl/state.json")"
    fi
    [ "$pid" = "$JOB_PID" ] || no "$name: vramscope run execs the job" "job pid $pid, started $JOB_PID"

    # (a) snapshot --json: the job, with torch's figures.
    VRAMSCOPE_SHM_DIR="$shm" "$B" snapshot --json > "$LOG/$name.snapshot.json" 2> "$LOG/$name.snapshot.err"
    local why
    why=$("$PY" - "$LOG/$name.snapshot.json" "$ctl/state.json" 2>&1 <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2]))
p = [p for p in s["processes"] if p["identity"]["host_pid"] == t["pid"]]
if not p:
    sys.exit("not shown; problems: %s" % s.get("problems"))
p = p[0]
f = p["view"]["figures"]
d0 = [d["figures"] for d in p["view"]["devices"] if d["figures"]["device"] == 0]
got = (p["source"]["mode"], f["reserved"], f["allocated"])
want = ("sampled", t["reserved"], t["allocated"])
print("snapshot:", got, "torch:", want, "device 0:", d0 and (d0[0]["reserved"], d0[0]["allocated"]))
if got != want or not d0 or (d0[0]["reserved"], d0[0]["allocated"]) != want[1:]:
    sys.exit("snapshot %s, torch %s" % (got, want))
PY
)
    local rc=$?
    echo "$why" | sed 's/^/    /'
    if [ $rc -eq 0 ]; then ok "$name: snapshot --json shows the job with torch's reserved and allocated"; else no "$name: snapshot --json shows the job with torch's reserved and allocated" "$(echo "$why" | tail -n 1)"; fi

    # The dashboard, drawn without a terminal.
    VRAMSCOPE_SHM_DIR="$shm" "$B" --pid "$pid" --size 120x40 --screenshot "$LOG/$name.dashboard.svg" --screenshot-after 2500 > "$LOG/$name.dashboard.log" 2>&1
    if grep -q "pid $pid" "$LOG/$name.dashboard.svg" 2>/dev/null && grep -q "sampled" "$LOG/$name.dashboard.svg"; then
        ok "$name: the dashboard shows pid $pid in sampled mode"
    else
        no "$name: the dashboard shows pid $pid in sampled mode" "see $LOG/$name.dashboard.svg"
    fi

    # (b) empty-cache PID, against what torch reports after it.
    VRAMSCOPE_SHM_DIR="$shm" "$B" empty-cache "$pid" > "$LOG/$name.empty_cache.txt" 2>&1
    rc=$?
    sed 's/^/    /' "$LOG/$name.empty_cache.txt"
    touch "$ctl/go"
    t0=$SECONDS
    while [ ! -e "$ctl/after.json" ] && kill -0 "$JOB_PID" 2>/dev/null && [ $((SECONDS - t0)) -lt 60 ]; do
        sleep 0.1
    done
    VRAMSCOPE_SHM_DIR="$shm" "$B" snapshot --json > "$LOG/$name.snapshot_after.json" 2>> "$LOG/$name.snapshot.err"
    why=$("$PY" - "$LOG/$name.empty_cache.txt" "$ctl/state.json" "$ctl/after.json" "$LOG/$name.snapshot_after.json" "$rc" 2>&1 <<PY
import json, re, sys
$FMT
line = open(sys.argv[1]).read().strip()
t, a = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
s = json.load(open(sys.argv[4]))
before, after = t["reserved"], a["reserved"]
print("torch: reserved %d -> %d, released %d; allocated %d -> %d" % (before, after, before - after, t["allocated"], a["allocated"]))
want = "process %d: released %s (reserved %s -> %s)" % (t["pid"], vbytes(before - after), vbytes(before), vbytes(after))
if sys.argv[5] != "0" or line != want:
    sys.exit("printed %r, want %r (from torch's figures)" % (line, want))
p = [p for p in s["processes"] if p["identity"]["host_pid"] == t["pid"]]
if not p or (p[0]["view"]["figures"]["reserved"], p[0]["view"]["figures"]["allocated"]) != (after, a["allocated"]):
    sys.exit("snapshot after empty-cache: %s, torch: %s" % (p and p[0]["view"]["figures"], (after, a["allocated"])))
if a["backend"] == "native" and not after < before:
    sys.exit("nothing released by the native allocator after training (%d -> %d)" % (before, after))
PY
)
    rc=$?
    echo "$why" | sed 's/^/    /'
    if [ $rc -eq 0 ]; then ok "$name: empty-cache releases what torch reports"; else no "$name: empty-cache releases what torch reports" "$(echo "$why" | tail -n 1)"; fi

    touch "$ctl/done"
    wait "$JOB_PID"
    rc=$?
    JOB_PID=
    local left
    left=$(ls -A "$shm" | wc -l)
    if [ $rc -eq 0 ] && [ "$left" -eq 0 ]; then
        ok "$name: the job exits 0 and its segment is removed"
    else
        no "$name: the job exits 0 and its segment is removed" "exit $rc, $left file(s) left in $shm"
        tail -n 20 "$LOG/$name.job.log" | sed 's/^/    /'
    fi
    grep '^vramscope:' "$LOG/$name.job.log" | sed 's/^/    job: /'
    rm -rf "$shm" "$ctl"
}

"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "devices", torch.cuda.device_count())' 2>&1 | tee "$LOG/env.log"
one_case sampled_forced VRAMSCOPE_MODE=sampled
one_case sampled_cudaMallocAsync PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync

echo "sampled_e2e: $pass passed, $fail failed"
[ $fail -eq 0 ]
