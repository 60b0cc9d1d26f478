"""What attribution costs (issue 15), measured side by side in one process.

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/bench_attrib.py \
        MODEL [--rounds 12] [--steps 20] [--out FILE.json]

MODEL: llama (transformers Llama, 12 layers of 1024, batch 8 x 512, bf16
autocast, AdamW), vit (transformers ViT-Base, batch 64 x 224 x 224, bf16
autocast, AdamW), calls (the cost per module call, on tiny CPU tensors: a Sequential
of 64 x (Linear 16x16, ReLU) = 129 module calls per forward, forward and
backward, so that Python's share is all there is), gpt2 (transformers GPT-2 small, 124 M parameters, batch 8 x 512,
bf16 autocast, AdamW) or resnet (timm ResNet-50, batch 64 x 224 x 224,
channels_last, bf16 autocast, SGD with momentum). Built from configs.

1. The allocator callback's own work per event (vs_agent_bench_callback:
   1 M synthetic ALLOC/FREE_COMPLETED events, about 512 blocks live, into
   the real device ring), 31 interleaved repetitions per mode (the order
   rotates): the
   any-writer ring path and the exclusive one, attribution off and on.
   Median ns per event.
2. Step time of the training loop, variants alternated within each round
   (the order rotates), `rounds` rounds of `steps` steps (a step: forward,
   backward, optimizer step, then torch.cuda.synchronize). Switching takes
   effect at once (hooks in or out); every variant gets one untimed step
   after the switch. Many short rounds (e.g. 150 of 1 step) pair each
   variant's steps with bare steps taken a fraction of a second apart, which
   keeps this VM's drift out of the ratios:
     bare        tracker writes off (vs_agent_enable(0)), no hooks
     hooks       global module forward pre/post hooks that do nothing, and
                 nothing else: what PyTorch's hook machinery costs on its own
     wrapper     a Module.__call__ wrapper that does nothing (what the agent
                 uses instead of global hooks), and nothing else
     tracker     the tracker on, attribution off (no hooks, no tags)
     attrib      the tracker on, attribution on (the call wrapper, backward
                 pre-hooks on the automatic level and on roots, tags, the tag
                 table, role lists): the default, module calls through the
                 native path (fastcall.cpp)
     attrib_noroles  the same without role lists (_roles.py): what they cost
                 is attrib over this
     attrib_py   the same with module calls through the Python wrapper only
                 (what runs where the native path cannot be built)
     attrib_params  the same with a backward pre-hook on every module that
                 owns parameters (VRAMSCOPE_ATTRIBUTION_BACKWARD=params)
     attrib_all  the same with a backward pre-hook on every module (=all)
     attrib_nobw the same with backward a phase of the root only (=none)
     attrib_notag   attribution's Python and native parts with the tracker's
                 tags off (vs_agent_set_attribution(0)): what the tags and
                 the block tag table cost is attrib over this
     capture     attribution with stack capture on (command 5's state)
     history     torch.cuda.memory._record_memory_history(stacks="python"),
                 tracker off and no hooks
   Per round: the median step time of each variant and its ratio to bare
   in the same round. Printed: the median ratio over rounds and a ~95 %
   interval (order statistics of the per-round ratios).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

import vramscope


BATCH = {"gpt2": (8, 512), "resnet": 64, "llama": (8, 512), "vit": 64}


def phases(name):
    """(forward -> loss, optimizer step) of one training step of MODEL
    gpt2 or resnet (tests/gpu/prof_attrib.py times them apart)."""
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(GPT2Config()).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 50257, BATCH["gpt2"], device="cuda")

        def forward():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(x, labels=x).loss

        return forward, opt.step
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16,
                          num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
        model = LlamaForCausalLM(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 32000, BATCH["llama"], device="cuda")

        def forward():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(x, labels=x).loss

        return forward, opt.step
    if name == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        model = ViTForImageClassification(ViTConfig(num_labels=1000)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(BATCH["vit"], 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (BATCH["vit"],), device="cuda")

        def forward():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return model(pixel_values=x, labels=y).loss

        return forward, opt.step
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=1000).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    n = BATCH["resnet"]
    x = torch.randn(n, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (n,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return loss_fn(model(x), y)

    return forward, opt.step


def wait_for_agent(timeout=120.0):
    """Waits (at most `timeout` s) until the agent has attached and its
    native call path is built or given up; returns (status, the agent's
    Attribution, its tracker library)."""
    t0 = time.time()
    while time.time() - t0 < timeout and (
            vramscope.status()["mode"] in (None, "pending") or vramscope.status()["attribution_native"] is False):
        time.sleep(0.05)
    return vramscope.status(), vramscope._st["attrib"], vramscope._st["lib"]


def set_attribution(attrib, lib, variant):
    """The part every variant shares: for `bare` and `tracker`, attribution
    removed and the tracker's writes off (bare) or on; for the others,
    attribution installed with the tracker's writes on. True for those."""
    if variant in ("bare", "tracker"):
        attrib.remove()
        lib.vs_agent_enable(1 if variant == "tracker" else 0)
        return False
    attrib.install()
    lib.vs_agent_enable(1)
    return True


def training_step(name):
    forward, optimizer = phases(name)

    def step():
        forward().backward()
        optimizer()

    return step


def gpt2():
    return training_step("gpt2")


def resnet():
    return training_step("resnet")


def calls():
    layers = []
    for _ in range(64):
        layers += [torch.nn.Linear(16, 16), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(2, 16)

    def step():
        model(x).sum().backward()

    return step


def interval(xs):
    """The median and a ~95 % interval of the median (order statistics)."""
    xs = sorted(xs)
    n = len(xs)
    k = max(0, int(math.floor(n / 2 - 0.98 * math.sqrt(n))))
    return statistics.median(xs), xs[k], xs[n - 1 - k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["gpt2", "resnet", "llama", "vit", "calls"])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out")
    ap.add_argument("--variants", help="comma-separated subset (bare is always measured)")
    ap.add_argument("--settle", type=int, default=1, help="untimed steps after each switch (default 1)")
    ap.add_argument("--batch", help="gpt2: BxT (default 8x512); resnet: B (default 64)")
    a = ap.parse_args()

    if a.batch:
        BATCH[a.model] = tuple(int(v) for v in a.batch.split("x")) if "x" in a.batch else int(a.batch)
    if a.model == "calls":
        torch.zeros(1, device="cuda")  # CUDA up: the agent attaches
    step = {"gpt2": gpt2, "resnet": resnet, "calls": calls,
            "llama": lambda: training_step("llama"), "vit": lambda: training_step("vit")}[a.model]()
    t0 = time.time()
    while vramscope.status()["mode"] in (None, "pending") and time.time() - t0 < 120:
        time.sleep(0.05)
    st = vramscope.status()
    if st["mode"] != "exact" or not st["attribution"]:
        sys.exit("needs exact mode with attribution: %s" % st)
    from vramscope import _st

    lib, attrib = _st["lib"], _st["attrib"]
    while vramscope.status()["attribution_native"] is False and time.time() - t0 < 120:
        time.sleep(0.05)  # the starter thread builds the native call path
    print("native call path:", vramscope.status()["attribution_native"])
    import ctypes

    lib.vs_agent_bench_callback.restype = ctypes.c_double
    lib.vs_agent_bench_callback.argtypes = [ctypes.c_uint64, ctypes.c_int]
    for _ in range(3):
        step()
    torch.cuda.synchronize()

    # 1. The callback's work per event.
    # Bit 0: the exclusive write path; bit 1: attribution on.
    modes = {0: "shared, attribution off", 1: "exclusive, attribution off", 2: "shared, attribution on", 3: "exclusive, attribution on"}
    per = {m: [] for m in modes}
    lib.vs_agent_enable(0)  # no real events meanwhile (none happen: the GPU is idle)
    keys = list(modes)
    for r in range(31):
        for m in keys[r % 4:] + keys[: r % 4]:  # the order rotates
            per[m].append(lib.vs_agent_bench_callback(1000000, m))
    lib.vs_agent_enable(1)
    callback = {modes[m]: round(statistics.median(v), 2) for m, v in per.items()}
    callback_all = {modes[m]: [round(x, 2) for x in v] for m, v in per.items()}
    print("callback ns per event (median of 31):", json.dumps(callback))

    # 2. Step time.
    from torch.nn.modules import module as mm

    def noop_pre(m, args):
        return None

    def noop_post(m, args, out):
        return None

    noop = []

    orig_call = torch.nn.Module.__call__ if not attrib.installed else attrib.orig_call

    def noop_wrapper(self, *args, **kwargs):
        return orig_call(self, *args, **kwargs)

    roles = attrib.roles

    def set_variant(v):
        attrib.capture_steps = 0
        # Role lists (_roles.py) ride on attribution; attrib_noroles is
        # attribution without them.
        attrib.roles = None if v == "attrib_noroles" else roles
        attrib.set_backward({"attrib_all": "all", "attrib_nobw": "none", "attrib_params": "params"}.get(v, "auto"))
        if v in ("attrib", "attrib_noroles", "attrib_py", "attrib_params", "attrib_all", "attrib_nobw", "attrib_notag",
                 "capture"):
            attrib.install()
            lib.vs_agent_enable(1)
            lib.vs_agent_set_attribution(0 if v == "attrib_notag" else 1)
            if v == "attrib_py":
                attrib.set_native(False)
            if v == "capture":
                attrib.capture_steps = 1 << 30
                attrib.capture_until = time.monotonic() + 3600
        else:
            attrib.remove()
            lib.vs_agent_enable(1 if v == "tracker" else 0)
        if v == "hooks":
            noop.append(mm.register_module_forward_pre_hook(noop_pre))
            noop.append(mm.register_module_forward_hook(noop_post))
        if v == "wrapper":
            torch.nn.Module.__call__ = noop_wrapper
        if v == "history":
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")

    def unset(v):
        while noop:
            noop.pop().remove()
        if v == "attrib_py":
            attrib.set_native(True)
        if v == "wrapper":
            torch.nn.Module.__call__ = orig_call
        if v == "history":
            torch.cuda.memory._record_memory_history(enabled=None)

    variants = ["bare", "hooks", "wrapper", "tracker", "attrib_nobw", "attrib_notag", "attrib", "attrib_noroles", "attrib_py", "attrib_params", "attrib_all", "capture", "history"]
    if a.variants:
        want = set(a.variants.split(",")) | {"bare"}
        variants = [v for v in variants if v in want]
    times = {v: [] for v in variants}
    for r in range(a.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for v in order:
            set_variant(v)
            # One untimed step after the switch: capture and history fill
            # their tables, and a switch that assigns Module.__call__ makes
            # CPython reset every module class's call slot (the native path
            # patches each class again on its first call, once in a real job).
            for _ in range(a.settle):
                step()
            torch.cuda.synchronize()
            ts = []
            for _ in range(a.steps):
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            unset(v)
            times[v].append(statistics.median(ts))
    set_variant("attrib")
    res = {"model": a.model, "batch": BATCH.get(a.model), "rounds": a.rounds, "steps": a.steps, "settle": a.settle,
           "callback_ns": callback,
           "callback_ns_all": callback_all,
           "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "variants": {},
           "native": vramscope.status()["attribution_native"],
           "native_fast_calls": attrib.native.fast if attrib.native is not None else 0}
    if a.model == "calls":
        # 129 module calls per step, 64 of them own parameters.
        base = statistics.median(times["bare"])
        res["per_call_us"] = {v: round((statistics.median(times[v]) - base) / 129 * 1e6, 3) for v in variants}
        print("per module call, us over bare:", json.dumps(res["per_call_us"]))
    if roles is not None:
        # What one walk costs: the role lists' share of a job's time is this
        # once a second (and in this benchmark once per round of a variant).
        walks = []
        for _ in range(21):
            roles.last = 0.0
            roles.refresh()
            walks.append(roles.walk_s)
        res["roles_walk_ms"] = round(statistics.median(walks) * 1e3, 3)
        res["roles_tensors"] = len(roles.collect()[0]) // 5
        print("roles: a walk of %d tensors takes %.3f ms (median of 21); lists written %d" % (
            res["roles_tensors"], res["roles_walk_ms"], roles.lists))
    print("%-8s %10s %8s %18s" % ("variant", "step ms", "ratio", "95% interval"))
    for v in variants:
        ratios = [t / b for t, b in zip(times[v], times["bare"])]
        med, lo, hi = interval(ratios)
        ms = statistics.median(times[v]) * 1e3
        res["variants"][v] = {"step_ms": round(ms, 3), "ratio": round(med, 4), "lo": round(lo, 4), "hi": round(hi, 4),
                              "per_round_ms": [round(t * 1e3, 3) for t in times[v]]}
        print("%-8s %10.2f %8.4f %8.4f..%.4f" % (v, ms, med, lo, hi))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
