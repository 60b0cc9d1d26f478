"""A small transformers training job for the live-path measurement
(tests/gpu/live8.sh): Llama or GPT-2 built from a config (nothing is
downloaded), AdamW, bf16 autocast, batch 4, for --seconds of wall time. No
vramscope code in it: run it under `vramscope run`.

    live_train.py --model llama --seconds 120

Prints one line at the end: steps, steps/s, and torch's own allocated and
reserved bytes at that quiescent point.
"""
import argparse
import time

import torch


def build(name):
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=8192,
            max_position_embeddings=512,
        )
        return LlamaForCausalLM(cfg)
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=512))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["llama", "gpt2"], default="llama")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=256)
    a = p.parse_args()
    torch.manual_seed(0)
    model = build(a.model).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 8192, (a.batch, a.seq), device="cuda")
    t0 = time.monotonic()
    steps = 0
    while time.monotonic() - t0 < a.seconds:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    dt = time.monotonic() - t0
    print(
        f"live_train {a.model}: {steps} steps, {steps / dt:.1f} steps/s, "
        f"allocated {torch.cuda.memory_allocated()} reserved {torch.cuda.memory_reserved()}",
        flush=True,
    )


if __name__ == "__main__":
    main()
