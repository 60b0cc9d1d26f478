"""Real training jobs for the advisor check (`tests/gpu/advise_check.sh`)
and the run diff's recordings: the same requests under any
PYTORCH_CUDA_ALLOC_CONF, so a rerun under a candidate setting is the job
the advisor predicted.

    python3 tests/gpu/advise_job.py gpt2 --out T.json [--fraction F] [--hold S]

Workloads (sizes and shapes from a fixed seed; no download):
  gpt2      transformers GPT-2 (4 layers, hidden 512), AdamW, bf16 autocast,
            batch 8, sequence length drawn from 64..1024 each step
            (the pattern that fragments the cache)
  convnext  timm ConvNeXt (atto), AdamW, batch drawn from 8..64 at 160 px
  fixed     GPT-2 as above at one length (--batch, --seq, --compile): the
            run diff's recordings

With --leak-mb it keeps that many MiB each step (the forecast's job: under
a fraction it runs out). With --fraction the job calls
set_per_process_memory_fraction and, like
training loops that skip a batch that does not fit, catches each
out-of-memory error, frees what the step held and goes on.

Writes --out (JSON): peak reserved and allocated (torch's max_memory_*),
OOMs caught and at which steps, allocation retries, the device's total
memory as torch sees it, the setting; then holds still --hold seconds.
"""
import argparse
import json
import os
import random
import time

import torch


def mark(step):
    try:
        import vramscope

        vramscope.mark(step)
    except Exception:
        pass


def gpt2_model(layers=4, hidden=512, vocab=8192, positions=1024):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=layers, n_embd=hidden, n_head=8, vocab_size=vocab, n_positions=positions
    )
    return GPT2LMHeadModel(cfg)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["gpt2", "convnext", "fixed"])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--fraction", type=float, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--leak-mb", type=int, default=0, help="keep this many MiB each step (a leak)")
    a = p.parse_args()

    torch.manual_seed(0)
    rng = random.Random(0)
    dev = torch.device("cuda")
    if a.fraction is not None:
        torch.cuda.set_per_process_memory_fraction(a.fraction)
    vocab = 8192
    if a.workload == "convnext":
        import timm

        model = timm.create_model("convnext_atto", pretrained=False, num_classes=100).to(dev)
    else:
        model = gpt2_model(vocab=vocab).to(dev)
    fwd = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def batch():
        if a.workload == "convnext":
            n = rng.choice([8, 16, 24, 32, 48, 64])
            x = torch.randn(n, 3, 160, 160, device=dev)
            y = torch.randint(0, 100, (n,), device=dev)
            return lambda: torch.nn.functional.cross_entropy(fwd(x), y)
        seq = a.seq if a.workload == "fixed" else rng.choice([64, 128, 256, 384, 512, 768, 1024])
        ids = torch.randint(0, vocab, (a.batch, seq), device=dev)
        return lambda: fwd(input_ids=ids, labels=ids).loss

    ooms = []
    kept = []
    for step in range(1, a.steps + 1):
        mark(step)
        try:
            if a.leak_mb:
                kept.append(torch.empty(a.leak_mb << 20, dtype=torch.uint8, device=dev))
            loss_of = batch()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_of()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, loss_of
        except torch.OutOfMemoryError:
            ooms.append(step)
            opt.zero_grad(set_to_none=True)
            loss = loss_of = None
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    out = {
        "workload": a.workload,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "fraction": a.fraction,
        "steps": a.steps,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "ooms": len(ooms),
        "oom_steps": ooms,
        "num_ooms": st.get("num_ooms", 0),
        "alloc_retries": st.get("num_alloc_retries", 0),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
        "leak_mb": a.leak_mb,
        "first_oom_step": ooms[0] if ooms else None,
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, a.out)
    time.sleep(a.hold)


if __name__ == "__main__":
    main()
