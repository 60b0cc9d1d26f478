"""A first job on a fresh machine (issue 43): a real transformers or timm
model trained for a few steps, no vramscope call in it.

    python3 tests/gpu/first_job.py MODEL STEPS [--truth FILE] [--hold S]
        [--seconds S] [--exit N]

MODEL: gpt2, llama, vit (transformers, built from configs: no download).
--seconds: train at least that long (more steps), for late starts.
At the end (quiescent: synchronized, between steps) it writes FILE (JSON:
pid, steps, torch's allocated and reserved bytes, the agent's mode at the
first and the last step when the agent is loaded) and holds still --hold
seconds, so a recording can stop there; then it exits with status --exit.
"""

import argparse
import json
import os
import sys
import time

import torch


def build(name):
    import transformers as T

    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256)
        model = T.GPT2LMHeadModel(cfg)
        make = lambda: {"input_ids": torch.randint(0, 8192, (8, 256), device="cuda")}
    elif name == "llama":
        cfg = T.LlamaConfig(
            hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=8, vocab_size=8192, max_position_embeddings=256,
        )
        model = T.LlamaForCausalLM(cfg)
        make = lambda: {"input_ids": torch.randint(0, 8192, (8, 256), device="cuda")}
    elif name == "vit":
        cfg = T.ViTConfig(image_size=128, patch_size=16, num_hidden_layers=4, hidden_size=384,
                          num_attention_heads=6, intermediate_size=1536, num_labels=10)
        model = T.ViTForImageClassification(cfg)
        make = lambda: {"pixel_values": torch.randn(16, 3, 128, 128, device="cuda"),
                        "labels": torch.randint(0, 10, (16,), device="cuda")}
    else:
        raise SystemExit("unknown model %s" % name)
    return model.cuda(), make


def mode():
    m = sys.modules.get("vramscope")
    return m.status()["mode"] if m is not None else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("steps", type=int)
    ap.add_argument("--truth")
    ap.add_argument("--hold", type=float, default=0.0)
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--end-in-shutdown", type=float, default=None, metavar="S",
                    help="at exit, wait for the agent's build to end (its stamp in the cache), then S more seconds: "
                    "the build ends while the job shuts down")
    a = ap.parse_args()
    if a.end_in_shutdown is not None:
        import atexit
        import glob

        def wait_build():
            d = os.path.join(os.environ.get("XDG_CACHE_HOME", ""), "vramscope", "ready-*.json")
            t = time.time()
            while not glob.glob(d) and time.time() - t < 120:
                time.sleep(0.05)
            time.sleep(a.end_in_shutdown)

        atexit.register(wait_build)  # (runs before the agent's, registered earlier)
    model, make = build(a.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    first_mode = None
    t0 = time.time()
    step = 0
    while step < a.steps or time.time() - t0 < a.seconds:
        batch = make()
        out = model(**batch) if "labels" in batch else model(**batch, labels=batch["input_ids"])
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == 1:
            torch.cuda.synchronize()
            first_mode = mode()
    torch.cuda.synchronize()
    truth = {
        "pid": os.getpid(),
        "model": a.model,
        "steps": step,
        "allocated": torch.cuda.memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "mode_first_step": first_mode,
        "mode_last_step": mode(),
        "seconds": round(time.time() - t0, 2),
    }
    print(json.dumps(truth), flush=True)
    if a.truth:
        tmp = a.truth + ".tmp"
        with open(tmp, "w") as f:
            json.dump(truth, f)
        os.replace(tmp, a.truth)
    time.sleep(a.hold)
    sys.exit(a.exit)


if __name__ == "__main__":
    main()
