"""Reads what the watchers saw of jobs already running
(tests/gpu/forecast_fit.sh, stage running) and prints, per job: the
forecast at each look of `snapshot --watch 2 --json` (no --advise: the
advisor taken up by the projection) against the job's real first OOM step,
and the live fit of `snapshot --advise --for 20 --json` against the largest
batch trying found.

    python3 tests/gpu/running_report.py RUNNING_DIR
"""
import glob
import json
import os
import re
import sys

# The largest batch under each model's fraction, found by trying
# (tests/fixtures/recordings/fit/MODEL.truth.json).
LARGEST = {"gpt2": 20, "vit": 23, "llama": 20, "bert": 27}


def main(d):
    looks = []
    with open(os.path.join(d, "watch.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    looks.append(json.loads(line))
                except ValueError:
                    pass
    fit_look = os.path.join(d, "fit.json")
    if os.path.exists(fit_look):
        with open(fit_look) as f:
            text = f.read().strip()
        if text.startswith("{"):
            try:
                looks.append(json.loads(text))
            except ValueError:
                pass
    truths = {}
    for p in glob.glob(os.path.join(d, "*.truth.json")):
        with open(p) as f:
            t = json.load(f)
        truths[t["pid"]] = (os.path.basename(p)[: -len(".truth.json")], t)
    seen = {}
    for look in looks:
        for p in look.get("processes", []):
            pid = p["identity"]["host_pid"]
            cmd = p["identity"].get("cmdline", "")
            m = re.search(r"fit_job.py job (\w+)", cmd)
            if not m:
                continue
            adv = p.get("advice") or {}
            ahead = adv.get("ahead") or {}
            fc = p["view"].get("forecast") or {}
            seen.setdefault(pid, {"model": m.group(1), "cmd": cmd, "rows": []})["rows"].append(
                {
                    "at_step": ahead.get("at_step"),
                    "method": fc.get("method"),
                    "oom_step": fc.get("oom_step"),
                    "sim_oom_step": ahead.get("oom_step"),
                    "cannot": ahead.get("cannot"),
                    "coverage": (adv.get("coverage") or {}).get("held"),
                    "mid_run": p["view"]["watch"].get("mid_run"),
                    "stopped": (adv.get("coverage") or {}).get("stopped"),
                    "fit": adv.get("fit"),
                    "peak_reserved": p["view"]["figures"]["peak_reserved"],
                }
            )
    print("looks: %d" % len(looks))
    for pid, s in sorted(seen.items()):
        name, t = truths.get(pid, ("?", {}))
        real = t.get("first_oom_step")
        print("== pid %d %s (%s): real first OOM step %s, peak reserved %s; watched mid-run %s, tensors held when the advisor began %s" % (
            pid, name, s["model"], real, t.get("peak_reserved"),
            sorted({str(r["mid_run"]) for r in s["rows"]}), sorted({str(r["coverage"]) for r in s["rows"]})))
        if "--leak-mb" in s["cmd"]:
            shown = set()
            for r in s["rows"]:
                key = (r["at_step"], r["method"], r["oom_step"])
                if key in shown:
                    continue
                shown.add(key)
                share = (r["at_step"] / real) if (real and r["at_step"]) else None
                print("  made at step %s (%s of the way): %s forecast step %s (simulated %s) off by %s%s" % (
                    r["at_step"], "%.0f%%" % (100 * share) if share else "?", r["method"], r["oom_step"],
                    r["sim_oom_step"], (r["oom_step"] - real) if (real and r["oom_step"]) else "?",
                    "; cannot: %s" % r["cannot"] if r["cannot"] else ""))
        else:
            fits = [r["fit"] for r in s["rows"] if r["fit"]]
            if not fits:
                print("  no fit (stopped: %s)" % s["rows"][-1]["stopped"])
                continue
            f = fits[-1]
            print("  fit at step %s: largest %s eighths (trying: %s), searched %s, %s requests; %s" % (
                f["at_step"], f.get("largest"), LARGEST.get(s["model"]), f["searched"], f["requests"],
                [(p["eighths"], p["peak_reserved"], bool(p.get("oom"))) for p in f["predictions"]]))
            print("  the job's own peak reserved: %s; fits made at steps %s" % (
                s["rows"][-1]["peak_reserved"], sorted({x["at_step"] for x in fits})))


if __name__ == "__main__":
    main(sys.argv[1])
