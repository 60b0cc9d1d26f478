"""Forked children (os.fork, fork-started DataLoader workers) never write into
the parent's segment and never remove it."""
import os
import time

import common
from common import check, dump, of

import torch
import vramscope

x = torch.ones(1024, device="cuda")
vramscope.attach()
st = common.wait_mode(vramscope)
check(st["mode"] == "exact", "exact mode")
path = st["path"]
vramscope.mark(1)
pid = os.fork()
if pid == 0:
    try:
        vramscope.mark(5)
        t = torch.ones(1000)  # CPU work in the child
        vramscope.mark(6)
    finally:
        os._exit(0)
os.waitpid(pid, 0)


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        vramscope.mark(1000 + i)  # runs in the worker processes
        return torch.full((16,), float(i))


dl = torch.utils.data.DataLoader(DS(), batch_size=8, num_workers=2, multiprocessing_context="fork")
tot = 0.0
for b in dl:
    tot += float(b.cuda().sum())
time.sleep(0.2)
check(os.path.exists(path), "parent segment still exists after children exited")
evs, summ = dump(path)
# Step markers only: the parent's memory limit (MARKER source 6) is one too.
vals = [f["value"] for f in of(evs, "Marker") if "MemoryLimit" not in str(f.get("source"))]
check(vals == [1], "only the parent's marker (%s)" % vals[:10])
check(summ["totals"]["lost"] == 0, "no loss")
files = sorted(os.listdir(os.environ["VRAMSCOPE_SHM_DIR"]))
check(files == [os.path.basename(path)], "no segment of any child (%s)" % files)
common.done()
