"""The advisor's predictions from one recording against real reruns
(`tests/gpu/advise_check.sh`): for every candidate, the peak reserved the
advisor predicted (a range where a tie between equal free blocks decides)
against the rerun's torch.cuda.max_memory_reserved(), and whether the job
runs out of memory against whether the rerun did.

    python3 tests/gpu/advise_compare.py DIR NAME
        # DIR/NAME.advice.json, DIR/NAME.truth.json, reruns DIR/NAME.c*.json
        # (each names its PYTORCH_CUDA_ALLOC_CONF in "conf")

Prints one markdown row per candidate and, last, `PASS n/m` or `FAIL n/m`.
A peak agrees inside the predicted range widened by 2 %. "Runs out" agrees
when the rerun's yes or no is one the prediction allows (a range of OOM
counts from 0 allows both). The OOM counts are shown but not compared: a
job that catches an OOM and goes on makes other requests than the
recording from there, so counts after the first difference are estimates.
"""
import glob
import json
import os
import sys

d, name = sys.argv[1], sys.argv[2]
advice = json.load(open(os.path.join(d, name + ".advice.json")))
truth = json.load(open(os.path.join(d, name + ".truth.json")))
reruns = {}
for p in glob.glob(os.path.join(d, name + ".c*.json")):
    r = json.load(open(p))
    reruns[r["conf"]] = r
MIB = float(1 << 20)
rows, ok, n = [], 0, 0
for o in advice["outcomes"]:
    conf = o["conf"] or "(defaults)"
    if o["own"]:
        conf += " (own)"
    if o.get("unusable"):
        conf += " (marked unusable)"
    n += 1
    real = reruns.get(o["conf"])
    if real is None:
        rows.append("| %s | `%s` | — | rerun missing | | | | |" % (name, conf))
        continue
    t = o["totals"]
    lo, hi = t["reserved_peak"]["lo"], t["reserved_peak"]["hi"]
    olo, ohi = t["ooms"]["lo"], t["ooms"]["hi"]
    rp, ro = real["peak_reserved"], real["num_ooms"]
    peak_ok = lo * 0.98 <= rp <= hi * 1.02
    err = 0.0 if lo <= rp <= hi else min(abs(rp - lo), abs(rp - hi)) / rp * 100
    runs_out_ok = (olo > 0) <= (ro > 0) <= (ohi > 0)
    good = peak_ok and runs_out_ok
    ok += good
    pred = "%.0f" % (lo / MIB) if lo == hi else "%.0f–%.0f" % (lo / MIB, hi / MIB)
    pred_oom = ("yes" if olo > 0 else "no" if ohi == 0 else "depends") + (
        " (%d)" % olo if olo == ohi else " (%d–%d)" % (olo, ohi)
    )
    rows.append(
        "| %s | `%s` | %s | %.0f | %.2f %% | %s | %s (%d) | %s |"
        % (name, conf, pred, rp / MIB, err, pred_oom, "yes" if ro else "no", ro,
           "yes" if good else "**no**")
    )
print("| job | setting | predicted peak reserved (MiB) | real (MiB) | outside the range by | predicted: runs out (OOMs) | real: runs out (OOMs) | agrees |")
print("|---|---|---:|---:|---:|---|---|---|")
print("\n".join(rows))
print("\nrecorded run: peak reserved %.0f MiB, %d OOMs; recommendation: %s"
      % (truth["peak_reserved"] / MIB, truth["num_ooms"], advice.get("recommended_env")))
print("%s %d/%d" % ("PASS" if ok == n else "FAIL", ok, n))
