#!/usr/bin/env bash
# Recordings of real jobs with role lists (issue 26, item 1), for CI to
# replay (tests/roles_fixtures.rs): each stack of tests/gpu/test_roles.py
# runs under `vramscope run` while `vramscope record` writes its events; at
# its quiescent point the job writes torch's own bytes by (module, role)
# (NAME.truth.json) and holds still while the recording stops.
#   tests/gpu/roles_record.sh [STACK...]   (default: plain resnet)
# Writes $D/NAME.vsrec and $D/NAME.truth.json; $D/roles_record.txt says
# whether the replay agrees.
set -u
. "$(dirname "$0")/common.sh" roles_record
export PYTHONPATH=$PWD/assets/agent
"$B" doctor > "$D/doctor.log" 2>&1
fail=0
for w in ${*:-plain resnet}; do
    ROLES_TRUTH="$D/$w.truth.json" ROLES_HOLD=30 record_job "$w" python3 tests/gpu/test_roles.py "$w"
    python3 - "$D/$w.json" "$D/$w.truth.json" "$w" <<'PY' | tee -a "$D/roles_record.txt"
import json, sys
doc, truth = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
p = next(p for p in doc["processes"] if p["identity"]["host_pid"] == truth["pid"])
got = {}
for r in p["view"]["attribution"]["by_role"]:
    if r["role"] in ("parameter", "buffer", "gradient", "optimizer_state"):
        got[(r["module"], r["role"])] = got.get((r["module"], r["role"]), 0) + r["bytes"]
want = {(m, r): b for m, r, b in truth["rows"]}
ok = got == want
print(f"{'PASS' if ok else 'FAIL'} {sys.argv[3]}: {len(want)} (module, role) rows, "
      f"{sum(1 for k in want if got.get(k) == want[k])} equal in the replay")
sys.exit(0 if ok else 1)
PY
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
done
exit $fail
