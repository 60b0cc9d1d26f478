"""Diagnoses the `vramscope run` path: prints the agent's status while the
script imports torch, initialises CUDA and allocates."""
import os
import sys
import time

print("meta_path:", [type(f).__name__ for f in sys.meta_path], flush=True)
import torch

import vramscope

print("after import torch:", vramscope.status(), flush=True)
x = torch.zeros(1 << 20, device="cuda")
for _ in range(60):
    time.sleep(0.25)
    if vramscope.status().get("mode") != "pending":
        break
print("after CUDA:", vramscope.status(), flush=True)
print("segments:", os.listdir(os.environ.get("VRAMSCOPE_SHM_DIR", "/dev/shm")), flush=True)
