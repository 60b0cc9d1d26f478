"""Records allocation traces from real PyTorch, with the allocator's figures
after every request, as fixtures that pin `vramscope sim` to PyTorch.

Each workload runs in a fresh subprocess (PYTORCH_CUDA_ALLOC_CONF must be set
before CUDA initialises). Output: one JSON-lines file per workload in the
directory given as argv[1]: a header object, then one request per line in the
format of `vramscope sim --trace` with an extra "expect" object:
allocated / reserved / segments (memory_stats()' allocated_bytes.all.current,
reserved_bytes.all.current, segment.all.current), segment_sizes (sorted, from
memory_snapshot()), and "oom": true when the request raised OutOfMemoryError.

    python3 tests/gpu/record_sim_fixtures.py OUTDIR
"""
import json
import os
import random
import subprocess
import sys

MiB = 1 << 20

WORKLOADS = {
    # name: (PYTORCH_CUDA_ALLOC_CONF, memory fraction or None)
    "small_large_pools": ("", None),
    "streams": ("", None),
    "expandable": ("expandable_segments:True", None),
    "max_split": ("max_split_size_mb:64", None),
    "oom_retry": ("", 0.02),
}


def plan(name, rng):
    """The requests of a workload: (op, id, size, stream) tuples."""
    ops = []
    live = []
    nid = 0

    def alloc(size, stream=0):
        nonlocal nid
        nid += 1
        ops.append(("alloc", nid, size, stream))
        live.append(nid)
        return nid

    def free(i):
        ops.append(("free", i, 0, 0))
        live.remove(i)

    def empty_cache():
        ops.append(("empty_cache", 0, 0, 0))

    def churn(rounds, p_free, new):
        """`rounds` times: free a random live tensor with probability
        `p_free` (when any is live), else call `new`, which allocates."""
        for _ in range(rounds):
            if live and rng.random() < p_free:
                free(rng.choice(live))
            else:
                new()

    if name == "small_large_pools":
        churn(120, 0.45, lambda: alloc(rng.choice([rng.randint(1, 4096), rng.randint(4096, MiB), rng.randint(MiB, 12 * MiB), rng.randint(12 * MiB, 64 * MiB)])))
        empty_cache()
        churn(40, 0.5, lambda: alloc(rng.randint(1, 30 * MiB)))
    elif name == "streams":
        churn(120, 0.45, lambda: alloc(rng.choice([rng.randint(1, MiB), rng.randint(MiB, 24 * MiB)]), rng.choice([0, 1, 2])))
        empty_cache()
    elif name == "expandable":
        churn(150, 0.45, lambda: alloc(rng.choice([rng.randint(1, MiB), rng.randint(MiB, 40 * MiB)])))
        empty_cache()
        for _ in range(30):
            alloc(rng.randint(MiB, 8 * MiB))
    elif name == "max_split":
        churn(150, 0.45, lambda: alloc(rng.choice([rng.randint(MiB, 30 * MiB), rng.randint(60 * MiB, 200 * MiB)])))
        empty_cache()
    elif name == "oom_retry":
        # A small memory fraction: cached blocks must be freed and retried,
        # and some requests fail.
        churn(80, 0.35, lambda: alloc(rng.choice([rng.randint(MiB, 20 * MiB), rng.randint(100 * MiB, 600 * MiB)])))
    return ops


def child(name, fraction, out_path):
    import torch

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    streams = {0: torch.cuda.current_stream(), 1: torch.cuda.Stream(), 2: torch.cuda.Stream()}
    rng = random.Random(sum(map(ord, name)))
    ops = plan(name, rng)
    props = torch.cuda.get_device_properties(0)
    base = torch.cuda.memory_stats(0)
    header = {
        "fixture": name,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "fraction": fraction,
        "capacity": props.total_memory,
        "device": props.name,
        "torch": torch.__version__,
        "baseline_reserved": base.get("reserved_bytes.all.current", 0),
    }
    tensors = {}
    lines = [json.dumps(header)]
    for op, i, size, stream in ops:
        rec = {"op": op}
        oom = False
        if op == "alloc":
            rec.update(id=i, size=size, stream=stream)
            try:
                with torch.cuda.stream(streams[stream]):
                    tensors[i] = torch.empty(size, dtype=torch.uint8, device=dev)
            except torch.OutOfMemoryError:
                oom = True
        elif op == "free":
            rec.update(id=i)
            tensors.pop(i, None)
        elif op == "empty_cache":
            torch.cuda.empty_cache()
        torch.cuda.synchronize()
        s = torch.cuda.memory_stats(0)
        sizes = sorted(seg["total_size"] for seg in torch.cuda.memory_snapshot() if seg["device"] == 0)
        rec["expect"] = {
            "allocated": s.get("allocated_bytes.all.current", 0),
            "reserved": s.get("reserved_bytes.all.current", 0),
            "segments": s.get("segment.all.current", 0),
            "segment_sizes": sizes,
            "alloc_retries": s.get("num_alloc_retries", 0),
            "ooms": s.get("num_ooms", 0),
            "oom": oom,
        }
        lines.append(json.dumps(rec))
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        name = sys.argv[2]
        child(name, WORKLOADS[name][1], sys.argv[3])
        return
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for name, (conf, _) in WORKLOADS.items():
        env = dict(os.environ)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        path = os.path.join(out, f"{name}.jsonl")
        r = subprocess.run([sys.executable, __file__, "--child", name, path], env=env)
        print(f"{name}: exit {r.returncode} -> {path}", flush=True)


if __name__ == "__main__":
    main()
