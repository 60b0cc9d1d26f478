#!/usr/bin/env python3
"""Real PyTorch memory snapshots, and PyTorch reading vramscope's exports.

    python3 tests/gpu/snapshot_fixtures.py fixtures OUT_DIR
        Writes one snapshot per scenario (each in a fresh process, so the
        allocator starts empty) with torch.cuda.memory._dump_snapshot, and
        OUT_DIR/expected.json: the figures torch reports for each at the
        moment it was dumped (memory_stats: segments, reserved, allocated;
        memory_snapshot: blocks), in the shape tests/snapfile.rs reads.
    python3 tests/gpu/snapshot_fixtures.py job SECONDS STATS.json
        A small training job (run it under `vramscope run` while `vramscope
        record` records), ending with torch's own figures in STATS.json.
    python3 tests/gpu/snapshot_fixtures.py viz FILE.pickle...
        Loads each file as PyTorch's tools do and runs
        torch.cuda.memory._memory_viz on it (segsum, trace, segment_plot,
        trace_plot): prints what each made of it.

Models are built from configs in code (nothing is downloaded).
"""
import json
import os
import pickle
import subprocess
import sys

SCENARIOS = ["context_none", "python", "all", "state_only", "expandable", "streams", "graph_pool", "oom"]


def model(torch):
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2).cuda()


def train(torch, m, steps, batch=32):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    for _ in range(steps):
        x = torch.randn(batch, 64, 128, device="cuda")
        loss = m(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return opt


def figures(torch):
    s = torch.cuda.memory_stats(0)
    snap = torch.cuda.memory_snapshot()
    return {
        "segments": s["segment.all.current"],
        "reserved": s["reserved_bytes.all.current"],
        "allocated": s["allocated_bytes.all.current"],
        "blocks": sum(len(seg["blocks"]) for seg in snap),
        "snapshot_segments": len(snap),
    }


def one(name, path):
    """Runs scenario `name` in this process; dumps to `path`; returns torch's figures."""
    import torch
    mem = torch.cuda.memory
    torch.cuda.init()
    if name == "context_none":
        mem._record_memory_history(context=None, max_entries=3000)
        train(torch, model(torch), 3)
    elif name == "python":
        mem._record_memory_history(stacks="python", max_entries=2000)
        train(torch, model(torch), 2)
    elif name == "all":
        mem._record_memory_history(stacks="all", max_entries=600)
        train(torch, model(torch), 1)
    elif name == "state_only":
        mem._record_memory_history(enabled="state")
        train(torch, model(torch), 2)
    elif name == "expandable":
        mem._record_memory_history(context=None, max_entries=3000)
        m = model(torch)
        train(torch, m, 2, batch=64)
        torch.cuda.empty_cache()
        keep = [torch.empty(30 << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
        del keep[1]
        train(torch, m, 1)
        globals()["_keep"] = keep
    elif name == "streams":
        mem._record_memory_history(context=None, max_entries=3000)
        m = model(torch)
        train(torch, m, 1)
        side = torch.cuda.Stream()
        x = torch.randn(1 << 20, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # keeps the side stream busy
            y = x * 2
            z = torch.empty(3 << 20, device="cuda")  # a block of the side stream
        x.record_stream(side)
        del x  # pending free until the side stream is done
        globals()["_keep"] = (y, z)
    elif name == "graph_pool":
        mem._record_memory_history(context=None, max_entries=3000)
        m = model(torch).eval()
        static = torch.randn(8, 64, 128, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(2):
                m(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g), torch.no_grad():
            out = m(static)
        g.replay()
        torch.cuda.synchronize()
        globals()["_keep"] = (g, out)
    elif name == "oom":
        torch.cuda.set_per_process_memory_fraction(0.01, 0)
        mem._record_memory_history(context=None, max_entries=2000)
        held = []
        try:
            while True:
                held.append(torch.empty(96 << 20, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
        globals()["_keep"] = held
    else:
        raise SystemExit(f"unknown scenario {name}")
    fig = figures(torch)
    mem._dump_snapshot(path)
    after = figures(torch)
    assert after == fig, (fig, after)
    return fig


def fixtures(out):
    import torch
    os.makedirs(out, exist_ok=True)
    expected = {}
    for name in SCENARIOS:
        path = os.path.join(out, f"torch-2.11-{name}.pickle")
        env = dict(os.environ)
        if name == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        r = subprocess.run([sys.executable, __file__, "one", name, path], env=env,
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            print(f"{name}: FAILED\n{r.stderr[-2000:]}")
            continue
        fig = json.loads(r.stdout.strip().splitlines()[-1])
        expected[os.path.basename(path)] = {"0": fig}
        print(f"{name}: {os.path.getsize(path)} bytes, {fig}")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    print("torch", torch.__version__, "python", sys.version.split()[0], "pickle protocol", pickle.DEFAULT_PROTOCOL)


def job(seconds, stats_path):
    import time
    import torch
    m = model(torch)
    t0 = time.time()
    opt = None
    while time.time() - t0 < seconds:
        opt = train(torch, m, 1)
        time.sleep(0.05)
    fig = figures(torch)
    with open(stats_path, "w") as f:
        json.dump(fig, f)
    print("job figures", fig, flush=True)
    time.sleep(2.0)  # the recorder sees the final state
    return opt


def viz(paths):
    from torch.cuda import _memory_viz as mv
    for p in paths:
        with open(p, "rb") as f:
            data = pickle.load(f)
        segs = data["segments"]
        print(f"== {p}: {len(segs)} segments, {sum(len(s['blocks']) for s in segs)} blocks, "
              f"{sum(len(t) for t in data['device_traces'])} trace entries")
        text = mv.segsum(data)
        print("segsum:", " | ".join(l for l in text.splitlines() if l.startswith(("segments:", "total_"))))
        text = mv.trace(data)
        print("trace:", len(text.splitlines()), "lines; last:", text.splitlines()[-1][:100])
        for fn in ("segment_plot", "trace_plot"):
            html = getattr(mv, fn)(data)
            print(f"{fn}: {len(html)} bytes of HTML, holds the pickle: {'snapshot.pickle' in html}")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "fixtures":
        fixtures(sys.argv[2])
    elif cmd == "one":
        print(json.dumps(one(sys.argv[2], sys.argv[3])))
    elif cmd == "job":
        job(float(sys.argv[2]), sys.argv[3])
    elif cmd == "viz":
        viz(sys.argv[2:])
    else:
        raise SystemExit(__doc__)
