#!/usr/bin/env bash
# Issue 47 (the agent never changes what PyTorch computes): PyTorch's
# module_db forward on CUDA, each output hashed, bare twice and once under
# `vramscope run` (exact, attribution, the accounting outside the
# allocator); every case the bare runs agree on hashes the same under the
# agent. Writes $D/{bare1,bare2,agent}.json and $D/summary.txt.
#   tests/gpu/module_db_check.sh
set -u
. "$(dirname "$0")/common.sh" module_db_check
export CUBLAS_WORKSPACE_CONFIG=:4096:8
S=$D/summary.txt
timeout 300 python3 tests/gpu/module_db_check.py "$D/bare1.json" > "$D/bare1.log" 2>&1
timeout 300 python3 tests/gpu/module_db_check.py "$D/bare2.json" > "$D/bare2.log" 2>&1
VRAMSCOPE_SHM_DIR=$(mktemp -d /tmp/vs-shm-XXXXXX) timeout 400 "$B" run -- \
    python3 tests/gpu/module_db_check.py "$D/agent.json" > "$D/agent.log" 2>&1
for f in "$D"/*.log; do echo "== $f"; tail -n 3 "$f"; done
python3 - "$D" > "$S" <<'EOF'
import json, sys
d = sys.argv[1]
a, b, g = (json.load(open("%s/%s.json" % (d, n))) for n in ("bare1", "bare2", "agent"))
a, b, agent, g = a["cases"], b["cases"], g["agent"], g["cases"]
same = [k for k in a if a[k] == b.get(k) and not a[k].startswith(("error", "inputs"))]
differ = [k for k in same if g.get(k) != a[k]]
print("agent: %s" % agent)
print("cases %d; hashed and equal in both bare runs %d; of those, equal under the agent %d; differing %d" % (
    len(a), len(same), len(same) - len(differ), len(differ)))
for k in differ[:20]:
    print("  differs: %s" % k)
print("PASS" if same and not differ and agent and agent.get("mode") == "exact" else "FAIL")
EOF
cat "$S"
