"""A small real training loop with varying sequence lengths (the pattern
that fragments the caching allocator), for recording and what-if replay:

    vramscope run -- python3 tests/gpu/varlen_train.py --seconds 10
"""
import argparse
import random
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=10)
p.add_argument("--keep-loss", action="store_true", help="keep every loss tensor (a leak)")
a = p.parse_args()

torch.manual_seed(0)
rng = random.Random(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
kept = []
t0 = time.time()
step = 0
while time.time() - t0 < a.seconds:
    seq = rng.choice([128, 384, 512, 1024, 1536, 2048, 3072])
    x = torch.randn(16, seq, 1024, device=dev)
    loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if a.keep_loss:
        kept.append(loss)
    step += 1
    try:
        import vramscope

        vramscope.mark(step)
    except Exception:
        pass
torch.cuda.synchronize()
print(f"{step} steps in {time.time() - t0:.1f} s", flush=True)
