#!/usr/bin/env bash
# Recordings of real jobs with role lists (issue 26, item 1), for CI to
# replay (tests/roles_fixtures.rs): each stack of tests/gpu/test_roles.py
# runs under `vramscope run` while `vramscope record` writes its events; at
# its quiescent point the job writes torch's own bytes by (module, role)
# (NAME.truth.json) and holds still while the recording stops.
#   [ROLES_LEAK=1] [ROLES_STEPS=N] tests/gpu/roles_record.sh [STACK...]   (default: plain resnet)
# fsdp2 and ddp run two ranks (torchrun, two GPUs); the others one GPU.
# With ROLES_LEAK=1 the job plants a leak in a named module, with
# ROLES_LEAK=body one in its loop body (test_roles.py); the replay must
# flag it and name that module (body: null, outside every module).
# Writes $D/NAME.vsrec and $D/NAME.truth.json (NAME: the stack, then
# "-leak" or "-body"; two ranks: also NAME.truth.json.rank1);
# $D/roles_record.txt says whether the replay agrees.
set -u
. "$(dirname "$0")/common.sh" roles_record
export PYTHONPATH=$PWD/assets/agent
"$B" doctor > "$D/doctor.log" 2>&1
fail=0
for w in ${*:-plain resnet}; do
    job=(python3 tests/gpu/test_roles.py "$w")
    case $w in
    # Two ranks: each writes its own truth; rank 1's a moment after rank 0's.
    fsdp2 | ddp) job=(torchrun --nproc_per_node 2 tests/gpu/test_roles.py "$w") settle=5 ;;
    *) job=(env CUDA_VISIBLE_DEVICES=0 "${job[@]}") settle=1 ;;
    esac
    name=$w
    case ${ROLES_LEAK:-} in 1) name=$w-leak ;; body) name=$w-body ;; esac
    ROLES_TRUTH="$D/$name.truth.json" ROLES_HOLD=30 REC_SETTLE=$settle record_job "$name" "${job[@]}"
    python3 - "$D/$name.json" "$name" "$D/$name".truth.json* <<'PY' | tee -a "$D/roles_record.txt"
import json, sys
doc, name = json.load(open(sys.argv[1])), sys.argv[2]
fail = False
for tf in sys.argv[3:]:
    truth = json.load(open(tf))
    p = next(p for p in doc["processes"] if p["identity"]["host_pid"] == truth["pid"])
    got = {}
    for r in p["view"]["attribution"]["by_role"]:
        if r["role"] in ("parameter", "buffer", "gradient", "optimizer_state"):
            got[(r["module"], r["role"])] = got.get((r["module"], r["role"]), 0) + r["bytes"]
    want = {(m, r): b for m, r, b in truth["rows"]}
    ok = got == want
    line = "%d (module, role) rows, %d equal in the replay" % (len(want), sum(1 for k in want if got.get(k) == want[k]))
    if truth.get("leak_path"):
        leak = p["view"]["leak"]
        origins = [(o.get("module"), o.get("bytes_per_step")) for o in leak.get("origins", [])]
        path = truth["leak_path"]
        named = bool(origins) and (origins[0][0] is None if path == "null" else
                                   any(m and m.endswith(path) for m, _ in origins[:2]))
        ok = ok and bool(leak.get("flagged")) and named
        line += "; the leak in %s flagged %s at step %s, origins %s" % (
            truth["leak_path"], leak.get("flagged"), leak.get("flagged_at_step"), origins[:3])
    print("%s %s rank %s: %s" % ("PASS" if ok else "FAIL", name, truth.get("rank", 0), line))
    fail = fail or not ok
sys.exit(1 if fail else 0)
PY
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
