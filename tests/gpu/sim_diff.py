"""Records seeded random allocation traces from real PyTorch, for the
differential test of `vramscope sim` (issue 16; replayed by tests/sim_diff.rs).

One subprocess per allocator setting (PYTORCH_CUDA_ALLOC_CONF must be set
before CUDA initialises), all running at once on the one GPU (each process has
its own caching allocator and address space). Each writes OUTDIR/SETTING.jsonl.gz,
JSON lines:

  {"setting", "conf", "fraction", "capacity", "device", "torch"}   header
  {"trace": k, "seed": s, "reserved": r, "base": [retries, ooms]}  a trace starts
  [op, id, size, stream, addr, allocated, reserved, segments,
   inactive_split, retries, ooms]                                   one request
  {"end": k, "segments": [[addr, total_size, pool, stream], ...]}   memory_snapshot()

op: "a" alloc `size` bytes on `stream` (addr: tensor.data_ptr(), null when it
raised OutOfMemoryError), "f" free tensor `id`, "r" record_stream of tensor
`id` on `stream`, "e" empty_cache. The six figures are memory_stats()'
allocated_bytes / reserved_bytes / segment / inactive_split_bytes
.all.current, num_alloc_retries and num_ooms, read after the request.
Every trace starts after empty_cache() ("reserved" should be 0). The streams are idle
(nothing runs on them) and the host synchronizes after every free, so a free
held back by record_stream completes at the next malloc, deterministically.

    python3 tests/gpu/sim_diff.py OUTDIR [SECONDS]
"""
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time
import zlib

MiB = 1 << 20

# name: (PYTORCH_CUDA_ALLOC_CONF, set_per_process_memory_fraction or None)
SETTINGS = {
    "default": ("", None),
    "expandable": ("expandable_segments:True", None),
    "max_split": ("max_split_size_mb:40", None),
    "rp2": ("roundup_power2_divisions:4", None),
    "rp2_list": ("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", None),
    "gc": ("garbage_collection_threshold:0.6", 0.005),
    "fraction": ("", 0.004),
    "expandable_fraction": ("expandable_segments:True", 0.004),
    "max_split_fraction": ("max_split_size_mb:20", 0.004),
}

# Per setting: stop starting traces past this many compressed bytes.
MAX_BYTES = 1280 * 1024
STEPS = (1000, 2500)


def log_uniform(rng, lo, hi):
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))) or 1


class Plan:
    """A trace's random shape: how many tensors it keeps live, how large,
    how many streams, how often it records streams or empties the cache."""

    def __init__(self, rng):
        self.rng = rng
        self.target = rng.choice([8, 30, 80, 200, 400])
        self.max_size = rng.choice([4096, MiB, 16 * MiB, 64 * MiB, 64 * MiB])
        self.streams = rng.choice([1, 2, 3, 3])
        self.p_record = rng.choice([0.0, 0.02, 0.08])
        self.p_empty = rng.choice([0.0, 0.001, 0.005])
        self.p_burst = rng.choice([0.0, 0.01, 0.03])
        self.lifo = rng.random() < 0.3
        self.burst = []

    def next(self, live):
        """The next op as (op, id-or-None, size, stream); `live` lists the
        live tensor ids in allocation order."""
        rng = self.rng
        if self.burst:
            return ("a", None, self.burst.pop(), self.stream())
        if rng.random() < self.p_empty:
            return ("e", None, 0, 0)
        if live and self.streams > 1 and rng.random() < self.p_record:
            return ("r", rng.choice(live), 0, self.stream())
        p_free = 0.5 if len(live) >= self.target else 0.25
        if len(live) > 2 * self.target:
            p_free = 0.9
        if live and rng.random() < p_free:
            if self.lifo and rng.random() < 0.7:
                return ("f", live[-1], 0, 0)
            return ("f", rng.choice(live), 0, 0)
        size = log_uniform(rng, 1, self.max_size)
        if rng.random() < self.p_burst:
            self.burst = [size] * rng.randint(4, 40)
        return ("a", None, size, self.stream())

    def stream(self):
        return self.rng.randrange(self.streams)


def child(name, out_path, seconds):
    import torch

    conf, fraction = SETTINGS[name]
    torch.cuda.init()
    dev = torch.device("cuda", 0)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    streams = [torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()]
    props = torch.cuda.get_device_properties(0)
    stats_of = getattr(torch._C, "_cuda_memoryStats", None) or torch.cuda.memory_stats_as_nested_dict
    deadline = time.time() + seconds
    raw = open(out_path, "wb")
    out = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9)

    def put(obj):
        out.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())

    put({"setting": name, "conf": conf, "fraction": fraction, "capacity": props.total_memory,
         "device": props.name, "torch": torch.__version__})
    k = 0
    while time.time() < deadline and raw.tell() < MAX_BYTES:
        # SIM_DIFF_SALT: other traces than the committed corpus's.
        seed = zlib.crc32(f"{os.environ.get('SIM_DIFF_SALT', '')}{name}/{k}".encode())
        rng = random.Random(seed)
        plan = Plan(rng)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        s = stats_of(0)
        put({"trace": k, "seed": seed, "reserved": s["reserved_bytes"]["all"]["current"],
             "base": [s["num_alloc_retries"], s["num_ooms"]]})
        tensors = {}
        live = []
        nid = 0
        for _ in range(rng.randint(*STEPS)):
            op, i, size, stream = plan.next(live)
            addr = None
            if op == "a":
                nid += 1
                i = nid
                try:
                    with torch.cuda.stream(streams[stream]):
                        tensors[i] = torch.empty(size, dtype=torch.uint8, device=dev)
                    live.append(i)
                    addr = tensors[i].data_ptr()
                except torch.OutOfMemoryError:
                    pass
            elif op == "f":
                del tensors[i]
                live.remove(i)
                torch.cuda.synchronize()
            elif op == "r":
                tensors[i].record_stream(streams[stream])
            else:
                torch.cuda.empty_cache()
            s = stats_of(0)
            put([op, i or 0, size, stream, addr,
                 s["allocated_bytes"]["all"]["current"], s["reserved_bytes"]["all"]["current"],
                 s["segment"]["all"]["current"], s["inactive_split_bytes"]["all"]["current"],
                 s["num_alloc_retries"], s["num_ooms"]])
        segs = [[g["address"], g["total_size"], g.get("segment_type"), g.get("stream")]
                for g in torch.cuda.memory_snapshot() if g["device"] == 0]
        put({"end": k, "segments": sorted(segs)})
        del tensors, live
        k += 1
    out.close()
    raw.close()
    print(f"{name}: {k} traces, {os.path.getsize(out_path)} bytes", flush=True)


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    out = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 170
    os.makedirs(out, exist_ok=True)
    procs = []
    for name, (conf, _) in SETTINGS.items():
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        path = os.path.join(out, f"{name}.jsonl.gz")
        procs.append((name, subprocess.Popen([sys.executable, __file__, "--child", name, path, str(seconds)], env=env)))
    bad = 0
    for name, p in procs:
        rc = p.wait()
        print(f"{name}: exit {rc}", flush=True)
        bad += rc != 0
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
