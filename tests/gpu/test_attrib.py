"""Module, phase and step attribution on real third-party models (issue 15),
with no vramscope code in the training loop: run it as `vramscope run` does,

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/test_attrib.py WORKLOAD

WORKLOAD: gpt2 (transformers GPT-2, AdamW), resnet (timm ResNet-50,
channels_last, SGD with momentum), compiled (torch.compile'd GPT-2, AdamW),
gpt2-ckpt (GPT-2 with activation checkpointing: forwards run again inside
backward), ddp (GPT-2 under DistributedDataParallel; launch with
`torchrun --nproc_per_node 2 tests/gpu/test_attrib.py ddp`: each rank
checks its own process).

The job trains STEPS steps; one module keeps a copy of its output every
step (a planted leak; not in `compiled`). After the second optimizer step
the test posts command 5 (capture stacks for one step) through the real
control block. At the end (a quiescent point: gradients, optimizer state
and the leak alive, activations freed) it reads its own segment with the
real reader (`vramscope snapshot --json --blocks`, which attaches mid-run:
definitions and block tags come from the snapshot it asks for) and
compares, block by block, with torch's own accounting:

  - every parameter and buffer block: its module (from named_parameters /
    named_buffers), phase other (made by .cuda());
  - every gradient block: its module (the root for `compiled`: one
    compiled backward), phase backward;
  - every optimizer state block: phase optimizer;
  - per module, the bytes vramscope attributes to (module, other) equal the
    bytes of that module's own parameter and buffer blocks;
  - the leak: one block per step, in the leaking module, forward, born at
    steps None, 1, 2, ...; the block born while stacks were captured names
    its code location (the call site in the model's source).

VRAMSCOPE_BIN: the vramscope binary (default target/release/vramscope).
"""

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, check, cmd, done, read_own_view, torch_blocks, wait_mode  # noqa: E402

import torch  # noqa: E402  (the agent attaches here, before CUDA is initialised)

import vramscope  # noqa: E402

BIN = os.environ.get("VRAMSCOPE_BIN") or os.path.join(ROOT, "target", "release", "vramscope")
STEPS = 5
CAPTURE_AFTER = 2  # optimizer steps before command 5


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=8, vocab_size=8192, n_positions=256)
    model = GPT2LMHeadModel(cfg)

    def batch():
        x = torch.randint(0, cfg.vocab_size, (8, 128), device="cuda")
        return (x,), {"labels": x}

    def loss_of(out):
        return out.loss

    return model, batch, loss_of, "transformer.h.1.mlp", "modeling_gpt2.py"


def resnet():
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=100)

    def batch():
        x = torch.randn(16, 3, 128, 128, device="cuda").to(memory_format=torch.channels_last)
        return (x,), {}

    def loss_of(out):
        return out.float().pow(2).mean()

    return model, batch, loss_of, "layer2.0.conv2", "resnet.py"


def plant_leak(model, path, kept):
    m = model.get_submodule(path)
    orig = m.forward

    def forward(*a, **k):
        out = orig(*a, **k)
        kept.append(out.detach().clone())  # allocated inside the module's call
        return out

    m.forward = forward


def blocks_of(view):
    out = {}
    for dev in view["devices"]:
        for seg in dev["segments"]:
            for b in seg["blocks"]:
                if b["state"] == "Allocated":
                    out[b["addr"]] = b
    return out


def block_at(addrs_sorted, sizes, ptr):
    import bisect

    i = bisect.bisect_right(addrs_sorted, ptr) - 1
    if i >= 0 and ptr < addrs_sorted[i] + sizes[addrs_sorted[i]]:
        return addrs_sorted[i]
    return None


def main():
    workload = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
    if workload.endswith("-params"):  # the same, every module with parameters tracked in backward
        workload = workload[: -len("-params")]
    if workload.endswith("-py"):  # the same, module calls through the Python wrapper only
        workload = workload[: -len("-py")]
    baseline = workload == "compiled-baseline"  # the same job, attribution off
    compiled = workload in ("compiled", "compiled-baseline")
    # Activation checkpointing: each block's forward runs again inside
    # backward, on the autograd thread (no leak planted: it would run twice).
    ckpt = workload == "gpt2-ckpt"
    model, batch, loss_of, leak_path, source_file = (resnet if workload == "resnet" else gpt2)()
    if ckpt:
        model.gradient_checkpointing_enable()
    kept = []
    planted = not compiled and not ckpt
    if planted:
        plant_leak(model, leak_path, kept)
    ddp = workload == "ddp"
    if ddp:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    model = model.cuda()  # initialises CUDA: the agent starts here
    st = wait_mode(vramscope)
    check(st["mode"] == "exact", "exact mode (%s)" % st)
    check(st.get("attribution") is not baseline, "attribution is %s: %s" % ("off" if baseline else "on", st))
    if workload == "resnet":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    root = type(model).__name__
    run = torch.compile(model) if compiled else model
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("nccl")
        run = torch.nn.parallel.DistributedDataParallel(model)
    if compiled:
        import torch._dynamo.utils as du

        du.counters.clear()
    capture = None
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        args, kwargs = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = run(*args, **kwargs)
        loss_of(out).backward()
        opt.step()
        del out, args, kwargs
        if step + 1 == CAPTURE_AFTER and not baseline:
            torch.cuda.synchronize()
            capture = cmd(st["path"], "capture_stacks", 1)
    if compiled:
        reasons = sorted(str(r)[:200] for r in du.counters["graph_break"])
        graphs = (du.counters["stats"].get("unique_graphs"), reasons)
        print("graph breaks: %d, unique graphs: %s" % (sum(du.counters["graph_break"].values()), graphs[0]))
        for reason, n in du.counters["graph_break"].items():
            print("  graph break x%d: %s" % (n, str(reason)[:300]))
        if baseline:
            print("BASELINE %s" % json.dumps(graphs))
            done()
        r = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "compiled-baseline"],
            env=dict(os.environ, VRAMSCOPE_ATTRIBUTION="0"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
        line = [l for l in r.stdout.decode().splitlines() if l.startswith("BASELINE ")]
        base = tuple(json.loads(line[0].split(" ", 1)[1])) if line else None
        # The same graphs, broken for the same reasons (a break inside a
        # module may be counted once more: the compiled frame is then the
        # agent's Module.__call__ wrapper, which Dynamo inlines).
        check(base == graphs, "attribution changes no compiled graph: %s graphs, graph breaks for %s; without it %s" % (
            graphs[0], graphs[1], base))
    if not baseline:
        native = vramscope.status()["attribution_native"]
        a = vramscope._st["attrib"]
        if os.environ.get("VRAMSCOPE_ATTRIBUTION_NATIVE", "1") == "0":
            check(native == vramscope.NATIVE_OFF and a.native is None,
                  "module calls through the Python wrapper only, and status() says why: %s" % native)
        else:
            # (A compiled model's modules run inside its graphs: none is called.)
            check(native is True and (compiled or (a.native.fast > 0 and a.native.hooks > 0 and a.native.roots > 0)),
                  "module calls through the native path: %s, %d fast calls, %d root calls, %d C++ backward pre-hooks" % (
                      native, a.native.fast if a.native else 0, a.native.roots if a.native else 0,
                      a.native.hooks if a.native else 0))
    check(
        capture is not None and capture.get("outcome", {}).get("status") == "Ok",
        "command 5 (capture stacks for 1 step) answered ok: %s" % capture,
    )
    torch.cuda.synchronize()
    time.sleep(0.3)
    tb = torch_blocks()
    view = read_own_view(BIN)
    ours = blocks_of(view)
    ctx = {c["id"]: c for c in view["attribution"]["contexts"]}
    addrs = sorted(tb)

    def origin(ptr):
        a = block_at(addrs, tb, ptr)
        b = ours.get(a)
        if a is None or b is None:
            return a, None, None, None
        c = ctx.get(b.get("origin", {}).get("context", 0), {})
        return a, c.get("module"), c.get("phase"), b.get("origin", {}).get("step")

    check(set(ours) == set(tb), "vramscope's allocated blocks are torch's (%d vs %d)" % (len(ours), len(tb)))

    # Owners of each storage (tied weights have two).
    owners = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        owners.setdefault(p.data_ptr(), set()).add(name.rpartition(".")[0])
    bufs = {}
    for name, b in model.named_buffers(remove_duplicate=False):
        if b.is_cuda and b.numel():
            bufs.setdefault(b.data_ptr(), set()).add(name.rpartition(".")[0])

    def judge(what, ptrs, want_phase, module_ok):
        good, bad = 0, []
        for ptr, mods in ptrs.items():
            a, m, ph, _ = origin(ptr)
            if ph == want_phase and module_ok(m, mods):
                good += 1
            elif len(bad) < 5:
                bad.append((hex(ptr), sorted(mods)[:2], m, ph))
        check(not bad, "%s: %d of %d blocks attributed to their module, phase %s%s" % (
            what, good, len(ptrs), want_phase, "" if not bad else "; wrong: %s" % bad))

    judge("parameters", owners, "other", lambda m, mods: m in mods or (m == root and "" in mods))
    judge("buffers", bufs, "other", lambda m, mods: m in mods or (m == root and "" in mods))
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grads[p.grad.data_ptr()] = owners.get(p.data_ptr(), {name.rpartition(".")[0]})
    # Backward is tracked per module of the agent's backward level (the
    # default, VRAMSCOPE_ATTRIBUTION_BACKWARD=auto) or of every module with
    # parameters (=params): a gradient belongs to its module's nearest
    # tracked ancestor.
    attrib = vramscope._st["attrib"]
    tracked = set(attrib.backward_modules())
    print("backward policy %s: %d modules tracked, e.g. %s" % (attrib.backward, len(tracked), sorted(tracked)[:4]))

    def nearest(path):
        parts = path.split(".") if path else []
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in tracked:
                return ".".join(parts[:i])
        return root

    if compiled:
        judge("gradients (one compiled backward: the root)", grads, "backward", lambda m, mods: m == root)
    else:
        judge("gradients (by tracked module)", grads, "backward", lambda m, mods: m in {nearest(x) for x in mods})
    state = {}
    for s in opt.state.values():
        for v in s.values():
            if torch.is_tensor(v) and v.is_cuda and v.numel() > 1:
                state[v.data_ptr()] = {"optimizer." + type(opt).__name__}
    judge("optimizer state", state, "optimizer", lambda m, mods: m in mods)

    # Bytes per module, phase other: vramscope's sum equals torch's.
    want = {}
    for ptr, mods in list(owners.items()) + list(bufs.items()):
        a, m, _, _ = origin(ptr)
        if m not in mods:  # tied weights: any owner; else the first
            m = sorted(mods)[0] or root
        want.setdefault(m, {})[a] = tb[a]
    got = {}
    for a, b in ours.items():
        c = ctx.get(b.get("origin", {}).get("context", 0), {})
        if c.get("phase") == "other" and c.get("module"):
            got[c["module"]] = got.get(c["module"], 0) + b["size"]
    same = [m for m in want if got.get(m, 0) == sum(want[m].values())]
    diff = [(m, got.get(m, 0), sum(want[m].values())) for m in want if m not in same]
    check(not diff, "bytes per module (parameters and buffers): %d of %d modules equal torch's%s" % (
        len(same), len(want), "" if not diff else "; differ: %s" % diff[:5]))
    total = sum(got.values())
    print("attributed to modules, phase other: %d bytes in %d modules" % (total, len(got)))

    if planted:
        leak = []
        for t in kept:
            a, m, ph, stp = origin(t.data_ptr())
            c = ctx.get(ours.get(a, {}).get("origin", {}).get("context", 0), {})
            leak.append((m, ph, stp, c.get("stack", [])))
        check(all(m == leak_path and ph == "forward" for m, ph, _, _ in leak),
              "the planted leak (%d blocks) is attributed to %s, forward: %s" % (
                  len(leak), leak_path, [(m, ph) for m, ph, _, _ in leak]))
        steps = [s for _, _, s, _ in leak]
        check(steps == [None] + list(range(1, STEPS)), "the leak's blocks were born at steps %s" % steps)
        with_stack = [i for i, (_, _, _, s) in enumerate(leak) if s]
        check(with_stack == [CAPTURE_AFTER], "only the block of the captured step has a stack: %s" % with_stack)
        if with_stack:
            s = leak[with_stack[0]][3]
            print("captured stack of the leak (innermost first):\n    " + "\n    ".join(s[:6]))
            check(source_file in s[0], "its innermost frame is the call site in %s: %s" % (source_file, s[0]))
    dropped = view["attribution"].get("producer_dropped", {})
    check(not any(dropped.values()), "the agent dropped nothing: %s" % dropped)
    done()


if __name__ == "__main__":
    main()
