"""One rank of tests/gpu/outside_probe.py under torchrun: its JSON is
PREFIX.RANK.json.   torchrun ... outside_probe_rank.py JOB PROBE.so PREFIX"""
import os
import runpy
import sys

job, so, prefix = sys.argv[1:4]
sys.argv = ["outside_probe.py", job, so, "%s.%s.json" % (prefix, os.environ.get("LOCAL_RANK", "0"))]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "outside_probe.py"), run_name="__main__")
