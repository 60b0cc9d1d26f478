"""Helpers for the GPU tests: the real Rust reader (examples/ring_dump) reads
the segment the agent writes; checks are collected and summarised."""

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = os.environ.get("VRAMSCOPE_AGENT_DIR") or os.path.join(ROOT, "assets", "agent")
RING_DUMP = os.environ.get("VRAMSCOPE_RING_DUMP") or os.path.join(ROOT, "target", "release", "examples", "ring_dump")
if AGENT not in sys.path:
    sys.path.insert(0, AGENT)
if not os.environ.get("VRAMSCOPE_SHM_DIR"):
    os.environ["VRAMSCOPE_SHM_DIR"] = tempfile.mkdtemp(prefix="vs-shm-")

_failures = []
_passes = [0]
NAME = os.path.basename(sys.argv[0])


def check(cond, what):
    if cond:
        _passes[0] += 1
        print("  ok   %s" % what, flush=True)
    else:
        _failures.append(what)
        print("  FAIL %s" % what, flush=True)
    return cond


def done():
    print("%s: %d passed, %d failed" % (NAME, _passes[0], len(_failures)), flush=True)
    sys.exit(1 if _failures else 0)


def wait_mode(vs, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = vs.status()["mode"]
        if m not in (None, "pending"):
            return vs.status()
        time.sleep(0.02)
    return vs.status()


def dump(path):
    """[(ring, kind, fields)], summary"""
    r = subprocess.run([RING_DUMP, "dump", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    if r.returncode != 0:
        raise RuntimeError("ring_dump failed: %s" % r.stderr.decode())
    evs, summary = [], None
    for line in r.stdout.decode().splitlines():
        o = json.loads(line)
        if "summary" in o:
            summary = o["summary"]
            continue
        k = o["ev"]["kind"]
        if isinstance(k, str):
            evs.append((o["ring"], k, {}, o["ev"]["time_ns"]))
        else:
            (name, fields), = k.items()
            evs.append((o["ring"], name, fields, o["ev"]["time_ns"]))
    return evs, summary


def cmd(path, kind, arg=None):
    a = [RING_DUMP, "cmd", path, kind] + ([str(arg)] if arg is not None else [])
    r = subprocess.run(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def of(evs, name):
    return [f for (_, n, f, _) in evs if n == name]


def last_stats(evs, device):
    s = [f["stats"] for f in of(evs, "Stats") if f["device"] == device]
    return s[-1] if s else None


def torch_stats(torch, d):
    m = torch.cuda.memory_stats(d)
    g = lambda k: int(m.get(k, 0))  # noqa: E731
    return {
        "allocated": g("allocated_bytes.all.current"),
        "reserved": g("reserved_bytes.all.current"),
        "active": g("active_bytes.all.current"),
        "inactive_split": g("inactive_split_bytes.all.current"),
        "requested": g("requested_bytes.all.current"),
        "allocated_peak": g("allocated_bytes.all.peak"),
        "reserved_peak": g("reserved_bytes.all.peak"),
        "active_peak": g("active_bytes.all.peak"),
        "alloc_retries": g("num_alloc_retries"),
        "ooms": g("num_ooms"),
        "segments": g("segment.all.current"),
    }


def quiescent_stats_match(torch, vs_path, devices, period=0.35):
    torch.cuda.synchronize()
    want = {d: torch_stats(torch, d) for d in devices}
    time.sleep(period)
    evs, _ = dump(vs_path)
    for d in devices:
        got = last_stats(evs, d)
        check(got == want[d], "statistics of device %d equal torch.cuda.memory_stats (%s vs %s)" % (d, got, want[d]))
    return evs


def snapshot_segments(evs, device, sid=None):
    """Segments (with blocks) of the last complete snapshot of `device`."""
    out, cur, seen_id = None, None, None
    for (_, n, f, _) in evs:
        if n == "SnapshotBegin" and f["device"] == device and (sid is None or f["id"] == sid):
            cur, seen_id = [], f["id"]
        elif n == "SnapshotSegment" and cur is not None and f["id"] == seen_id and f["place"]["device"] == device:
            cur.append(dict(f, blocks=[]))
        elif n == "SnapshotBlock" and cur is not None and f["id"] == seen_id and f["device"] == device:
            if cur:
                cur[-1]["blocks"].append(f)
        elif n == "SnapshotEnd" and cur is not None and f["device"] == device and f["id"] == seen_id:
            out, cur = cur, None
    return out


def torch_blocks():
    """addr -> size of torch's own allocated blocks (memory_snapshot)."""
    import torch

    out = {}
    for seg in torch.cuda.memory_snapshot():
        a = seg["address"]
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                out[a] = b["size"]
            a += b["size"]
    return out


def read_own_view(binary):
    """This process's view as `vramscope snapshot --json --blocks` (the real
    reader, attaching now) gives it."""
    r = subprocess.run([binary, "snapshot", "--json", "--blocks", "--no-nvml"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120)
    if r.returncode != 0:
        raise RuntimeError("vramscope snapshot failed: %s" % r.stderr.decode()[-2000:])
    doc = json.loads(r.stdout.decode())
    for p in doc.get("processes", []):
        if p.get("identity", {}).get("host_pid") == os.getpid() or p.get("view", {}).get("key", {}).get("pid") == os.getpid():
            return p["view"]
    raise RuntimeError("this process is not in `vramscope snapshot`")
