#!/usr/bin/env bash
# The live advisor on real jobs (issue 27), against real reruns. On the GPU
# machine:
#
#     tests/gpu/advise_live.sh            # logs and summary.md in $OUT/advise_live
#
# 1. From the start, through `vramscope serve --advise` started before the
#    job: timm ConvNeXt (batch changing each step) and transformers GPT-2
#    under a memory fraction of 1.02 x its peak allocated (it runs out and
#    goes on). While the job holds still at its end, serve's
#    vramscope_process_advice_* series are read: the recommended setting,
#    its saving, its OOMs and the job's own. The job is then rerun for real
#    under the recommended setting: the saving and OOMs it really has.
# 2. From mid-run, through `vramscope advise PID --steps 40`: a Lightning
#    Trainer.fit job (another stack), the advisor started at its step 30;
#    rerun for real under the recommended setting.
set -u
. "$(dirname "$0")/common.sh" advise_live
S="$D/summary.md"
: > "$S"
J=tests/gpu/advise_job.py

# metrics URL: serve's advice series as JSON on stdout.
metrics() {
    python3 - "$1" <<'PY'
import json, re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
out = []
for line in text.splitlines():
    m = re.match(r'(vramscope_process_advice_\w+)\{(.*)\} (\S+)$', line)
    if m:
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        out.append({"name": m.group(1), "labels": labels, "value": float(m.group(3))})
print(json.dumps(out))
PY
}

# from_start NAME JOBARGS...: serve --advise, the job under `run`, the
# series read while it holds, then a plain rerun under the recommendation.
from_start() {
    local name=$1 shm srv job addr
    shift
    shm=$(mktemp -d /tmp/vs-live-XXXXXX)
    VRAMSCOPE_SHM_DIR=$shm "$B" serve --advise --listen 127.0.0.1:0 > "$D/$name.serve.log" 2>&1 &
    srv=$!
    for _ in $(seq 100); do
        addr=$(sed -n 's#^serving metrics on \(http://.*\)$#\1#p' "$D/$name.serve.log")
        [ -n "$addr" ] && break
        sleep 0.1
    done
    rm -f "$D/$name.truth.json"
    VRAMSCOPE_SHM_DIR=$shm timeout 600 "$B" run -- python3 "$J" "$@" --out "$D/$name.truth.json" --hold 20 \
        > "$D/$name.job.log" 2>&1 &
    job=$!
    await_mark "$D/$name.truth.json" $job 3000 0.1
    sleep 3
    metrics "$addr" > "$D/$name.metrics.json" 2> "$D/$name.metrics.err"
    kill $job 2>/dev/null
    wait $job
    kill -INT $srv
    wait $srv
    rm -rf "$shm"
    conf=$(python3 -c "import json; m = json.load(open('$D/$name.metrics.json')); print(next(x['labels']['conf'] for x in m if x['name'] == 'vramscope_process_advice_saving_bytes'))")
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 python3 "$J" "$@" --out "$D/$name.rerun.json" > "$D/$name.rerun.log" 2>&1
}

# mid_run NAME STEPS: a Lightning job; `advise PID` from its step 30 for
# STEPS steps; then a plain rerun under the recommendation.
mid_run() {
    local name=$1 steps=$2 shm job pid conf
    shm=$(mktemp -d /tmp/vs-live-XXXXXX)
    rm -f "$D/$name.mid" "$D/$name.truth.json"
    VRAMSCOPE_SHM_DIR=$shm timeout 600 "$B" run -- python3 tests/gpu/diag_job.py lightning --steps 400 \
        --mid "$D/$name.mid" --mid-step 30 --out "$D/$name.truth.json" > "$D/$name.job.log" 2>&1 &
    job=$!
    await_mark "$D/$name.mid" $job 3000 0.1
    pid=$(python3 -c "
import os, sys
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            c = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except OSError:
            continue
        if b'tests/gpu/diag_job.py' in c and b'python3' in c[0] and b'run' not in c[:2]:
            print(p); break
")
    VRAMSCOPE_SHM_DIR=$shm timeout 300 "$B" advise "$pid" --steps "$steps" --json > "$D/$name.advice.json" 2> "$D/$name.advice.err"
    VRAMSCOPE_SHM_DIR=$shm timeout 300 "$B" advise "$pid" --steps 10 > "$D/$name.advice.txt" 2>&1
    wait $job
    rm -rf "$shm"
    conf=$(python3 -c "import json; a = json.load(open('$D/$name.advice.json')); e = a.get('recommended_env') or ''; print(e.split('=', 1)[1] if e else '')")
    PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 600 python3 tests/gpu/diag_job.py lightning --steps 400 \
        --out "$D/$name.rerun.json" > "$D/$name.rerun.log" 2>&1
}

warm_agent
JOBS=${*:-convnext oom lightning}
for job in $JOBS; do
    case $job in
    convnext) from_start convnext convnext ;;
    oom)
        timeout 300 python3 "$J" gpt2 --out "$D/probe.json" > "$D/probe.log" 2>&1
        f=$(python3 -c "import json; t = json.load(open('$D/probe.json')); print(round(t['peak_allocated'] * 1.02 / t['total_memory'], 6))")
        from_start gpt2-oom gpt2 --fraction "$f"
        ;;
    lightning) mid_run lightning 40 ;;
    esac
done
python3 - "$D" $JOBS >> "$S" <<'PY'
import json, os, sys
d = sys.argv[1]
mib = lambda b: "%.1f MiB" % (b / 2**20)
print("| job | advised | recommended | predicted saving | real saving (rerun) | OOMs own / recommended: predicted | real |")
print("|---|---|---|---:|---:|---|---|")
for job in sys.argv[2:]:
    name = {"oom": "gpt2-oom"}.get(job, job)
    try:
        truth = json.load(open(os.path.join(d, name + ".truth.json")))
        rerun = json.load(open(os.path.join(d, name + ".rerun.json")))
    except (OSError, ValueError) as e:
        print("| %s | failed: %s |" % (name, e))
        continue
    if job == "lightning":
        a = json.load(open(os.path.join(d, name + ".advice.json")))
        conf = (a.get("recommended_env") or "=").split("=", 1)[1]
        adv = a["advice"] or {"outcomes": []}
        own = next((o for o in adv["outcomes"] if o["own"]), None)
        best = adv["outcomes"][adv["best"]] if adv.get("best") is not None else own
        saving = own["totals"]["reserved_peak"]["hi"] - best["totals"]["reserved_peak"]["hi"] if own else 0
        how = "advise PID, from step 30, %d steps" % a["coverage"]["steps"]
        p_ooms = "%d / %d" % (own["totals"]["ooms"]["hi"], best["totals"]["ooms"]["hi"]) if own else "?"
    else:
        m = json.load(open(os.path.join(d, name + ".metrics.json")))
        get = lambda n, **l: next((x for x in m if x["name"] == n and all(x["labels"].get(k) == v for k, v in l.items())), None)
        s = get("vramscope_process_advice_saving_bytes")
        conf, saving = s["labels"]["conf"], s["value"]
        req = get("vramscope_process_advice_requests_total")
        fol = get("vramscope_process_advice_following")
        how = "serve --advise, from the start (%d requests, following %d)" % (req["value"], fol["value"])
        o, b = get("vramscope_process_advice_ooms", candidate="own"), get("vramscope_process_advice_ooms", candidate="best")
        p_ooms = "%d / %s" % (o["value"], "%d" % b["value"] if b else "-")
    real = truth["peak_reserved"] - rerun["peak_reserved"]
    r_ooms = "%s / %s" % (truth.get("num_ooms", "-"), rerun.get("num_ooms", "-"))
    print("| %s | %s | `%s` | %s | %s (%s → %s) | %s | %s |" % (
        name, how, conf or "(own)", mib(saving), mib(real), mib(truth["peak_reserved"]), mib(rerun["peak_reserved"]), p_ooms, r_ooms))
PY
cat "$S"
