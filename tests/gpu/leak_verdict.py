"""The leak verdict of a recorded job, checked against what the job
planted (the shell suites' one checker: noise_suite.sh, noisy_leak.sh,
closure_origins.sh).

    leak_verdict.py REPLAY.json TRUTH.json NAME [--origin null|MODULE]

REPLAY.json is `vramscope replay --json` of the recording; TRUTH.json the
job's own (diag_job.py --out): its pid, steps and leak per step. A job
with a leak must be flagged, and with --origin its first origin must be
outside every module (null) or end with MODULE; no origin may be an
optimizer. A healthy job must never have been flagged: not now, not at
any step of this run (flagged_at_step) and in no earlier run, with all
its steps seen. Prints one
PASS or FAIL line; exits non-zero on FAIL.
"""
import json
import sys


def main():
    doc, truth, name = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
    want_origin = sys.argv[sys.argv.index("--origin") + 1] if "--origin" in sys.argv else None
    p = next(p for p in doc["processes"] if p["identity"]["host_pid"] == truth["pid"])
    leak = p["view"]["leak"]
    origins = [(o.get("module"), o.get("bytes_per_step")) for o in leak.get("origins", [])]
    earlier = [r for r in leak.get("earlier_runs", []) if r.get("flagged_at_step") is not None]
    sv = leak.get("survivors") or {}
    why = []
    if truth["leak_bytes_per_step"] > 0:
        if not leak.get("flagged"):
            why.append("not flagged")
        if want_origin is not None:
            first = origins[0][0] if origins else "(none)"
            if not (first is None if want_origin == "null" else str(first).endswith(want_origin)):
                why.append("first origin %r, not %s" % (first, want_origin))
        if any(str(m).startswith("optimizer.") for m, _ in origins):
            why.append("an optimizer named")
    else:
        if leak.get("flagged") or leak.get("flagged_at_step") is not None:
            why.append("flagged at step %s" % leak.get("flagged_at_step"))
        if earlier:
            why.append("earlier runs flagged: %s" % earlier)
        # (A step is counted at its end: the boundary that starts the first
        # step ends none.)
        if leak.get("steps_observed", 0) < truth["steps"] - 1:
            why.append("%s steps seen of %s" % (leak.get("steps_observed"), truth["steps"]))
    print("%s %s: %d steps (%s seen, source %s), flagged %s at %s, survivor test %s, floor slope %.0f B/step, "
          "origins %s%s" % (
              "FAIL" if why else "PASS", name, truth["steps"], leak.get("steps_observed"), leak.get("source"),
              leak.get("flagged"), leak.get("flagged_at_step"),
              {k: sv.get(k) for k in ("flagged", "steps_with_survivors", "window_steps", "bytes")
               if k in sv}, leak.get("floor_slope_bytes_per_step", 0.0), origins[:3],
              "" if not why else " -- " + "; ".join(why)))
    sys.exit(1 if why else 0)


if __name__ == "__main__":
    main()
