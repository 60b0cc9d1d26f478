"""The diagnosis suite's table (tests/gpu/diag_suite.sh): per workload, leak
and way of watching, what vramscope concluded against the truth the job
wrote. Prints a Markdown table and a line of targets met; exits 1 when a
target is missed.

    diag_report.py LOGDIR
"""
import glob
import json
import os
import sys

TARGET_STEPS = {"fast": 10, "slow": 100}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def entries(snap, pids):
    """The process entries of the job (every rank), from a replay's JSON."""
    out = []
    for e in (snap or {}).get("processes", []):
        ident = e.get("identity", {})
        if ident.get("host_pid") in pids or e.get("view", {}).get("key", {}).get("pid") in pids:
            out.append(e)
    return out


def row(name, how, truth, e):
    v = e["view"]
    leak = v["leak"]
    fig = v["figures"]
    true_steps = truth["steps"]
    seen = leak["steps_observed"]
    src = leak["source"]
    conf = leak.get("step_confidence", 0.0)
    at = leak.get("flagged_at_step")
    kind = truth["leak"]
    dev = ""
    if how == "start" and true_steps:
        dev = "%+.1f%%" % (100.0 * (seen - true_steps) / true_steps)
    ok = True
    notes = []
    if how == "start" and true_steps and abs(seen - true_steps) > 0.02 * true_steps:
        ok = False
        notes.append("steps off by more than 2%")
    if kind == "none" and at is not None:
        ok = False
        notes.append("false positive")
    if kind in TARGET_STEPS and (at is None or at > TARGET_STEPS[kind]):
        ok = False
        notes.append("not flagged within %d steps" % TARGET_STEPS[kind])
    if how == "mid" and fig["inconsistencies"]:
        ok = False
        notes.append("inconsistencies after a mid-run attach")
    return ok, "| %s | %s | %s | %d | %d %s | %s %.2f | %s | %s | %d | %d | %s |" % (
        truth["workload"],
        kind,
        "from the start" if how == "start" else "attached mid-run",
        true_steps,
        seen,
        dev,
        src,
        conf,
        "yes" if leak["flagged"] else "no",
        "-" if at is None else str(at),
        fig["inconsistencies"],
        fig["lost_events"],
        "ok" if ok else "MISSED: " + ", ".join(notes),
    )


def main():
    d = sys.argv[1]
    print("| workload | leak | watched | true steps | steps seen | step source, confidence | flagged | steps to flag | inconsistencies | lost | target |")
    print("|---|---|---|---:|---:|---|---|---:|---:|---:|---|")
    met = missed = 0
    for t in sorted(glob.glob(os.path.join(d, "*.truth.json"))):
        truth = load(t)
        name = os.path.basename(t)[: -len(".truth.json")]
        ranks = [truth] + [load(r) for r in sorted(glob.glob(t + ".rank*"))]
        pids = {r["pid"] for r in ranks if r}
        for how in ("start", "mid"):
            es = entries(load(os.path.join(d, "%s.%s.json" % (name, how))), pids)
            if not es:
                missed += 1
                print("| %s | %s | %s | %d | - | - | - | - | - | - | MISSED: process not in the recording |" % (
                    truth["workload"], truth["leak"], how, truth["steps"]))
                continue
            for e in es:
                ok, line = row(name, how, truth, e)
                print(line)
                met += ok
                missed += not ok
    print()
    print("%d passed, %d failed" % (met, missed))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
