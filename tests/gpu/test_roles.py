"""Roles on real jobs in every stack (issue 26, item 1): at a quiescent point,
vramscope's bytes by module and role equal torch's own accounting.

    PYTHONPATH=assets/agent VRAMSCOPE_AUTO=1 python3 tests/gpu/test_roles.py STACK
    torchrun --nproc_per_node 2 tests/gpu/test_roles.py fsdp2|ddp

STACK: plain (transformers GPT-2, AdamW, a plain loop), resnet (timm
ResNet-50, SGD with momentum), compiled (torch.compile'd GPT-2), ckpt
(GPT-2 with activation checkpointing), trainer (HF Trainer), accelerate
(Accelerate's prepare/backward), lightning (Lightning, automatic
optimization), lightning-manual (manual optimization), inference (an eval
loop: no optimizer, no step boundary), fsdp2 (fully_shard per block and
root, two ranks), ddp (DistributedDataParallel, two ranks).

No vramscope call in the job. After training, the job waits 3 s (what a
job between phases does: the agent's background thread writes a role list
when none came for 2 s), then reads its own segment with the real reader
(`vramscope snapshot --json --blocks`) and compares with torch:

  torch's side: every parameter and buffer of the model (DTensors by their
  local shard), every parameter's `.grad`, every optimizer's `state`
  tensors, each matched to the allocated block holding it in
  `torch.cuda.memory_snapshot()`; a block takes the role with the most
  bytes in it, and the module path those tensors share; bytes by (module,
  role) are the sizes of those blocks;
  vramscope's side: `attribution.by_role`, the exact roles (parameter,
  buffer, gradient, optimizer_state).

Module paths are the agent's own names for the model's modules (the
attribution tests check those names); what is checked here is that each
byte of PyTorch's tensors is given its role and module through the whole
path (agent, ring, reader, model, JSON).
"""

import bisect
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import ROOT, check, done, read_own_view, torch_blocks, wait_mode  # noqa: E402

import torch  # noqa: E402

import vramscope  # noqa: E402

BIN = os.environ.get("VRAMSCOPE_BIN") or os.path.join(ROOT, "target", "release", "vramscope")
STEPS = int(os.environ.get("ROLES_STEPS", "6"))
# ROLES_LEAK=1: a module keeps a copy of its output every call (a leak
# planted in `transformer.h.1.mlp`, GPT-2's; `layer2.0.conv2`, ResNet's);
# the job then checks the leak is flagged and named after that module.
# ROLES_LEAK=body: the loop body (or a Trainer callback, or Lightning's
# training_step) keeps 256 KiB every step, outside every module: it must
# be flagged with its origin outside every module (null).
LEAK_MODE = os.environ.get("ROLES_LEAK", "")
LEAK = LEAK_MODE == "1"
BODY = LEAK_MODE == "body"
KEPT = []


def keep_body():
    """The loop-body leak (ROLES_LEAK=body): 256 KiB kept every step."""
    if BODY:
        KEPT.append(torch.empty(256 << 10, dtype=torch.uint8, device="cuda"))
LEAK_PATH = {"gpt2": "transformer.h.1.mlp", "resnet": "layer2.0.conv2"}


def plant(model, path):
    # A forward hook runs inside the module's call (and goes with replicas).
    def keep(module, args, out):
        KEPT.append(out.detach().clone())

    model.get_submodule(path).register_forward_hook(keep)
EXACT = ("parameter", "buffer", "gradient", "optimizer_state")


def gpt2_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=8, vocab_size=8192, n_positions=256)
    model = GPT2LMHeadModel(cfg)
    if LEAK:
        plant(model, LEAK_PATH["gpt2"])
    return model, cfg


def batch_of(cfg, b=8, t=128):
    x = torch.randint(0, cfg.vocab_size, (b, t), device="cuda")
    return x


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def shared(paths):
    paths = [p.split(".") for p in paths]
    keep = paths[0]
    for p in paths[1:]:
        n = 0
        while n < len(keep) and n < len(p) and keep[n] == p[n]:
            n += 1
        keep = keep[:n]
    return ".".join(keep)


def expected(model, optimizers):
    """{(module, role): bytes} from torch's own objects and blocks."""
    a = vramscope._st["attrib"]

    def path(m):
        info = a.infos.get(id(m))
        return a.paths[info[0]] if info is not None else None

    tensors = []  # (ptr, nbytes, role, module)
    seen = set()
    owner = {}

    def add(t, role, mod):
        t = local(t)
        if not t.is_cuda or t.nbytes == 0 or (t.data_ptr(), role) in seen:
            return
        seen.add((t.data_ptr(), role))
        tensors.append((t.data_ptr(), t.nbytes, role, mod))

    for _, m in model.named_modules():
        mod = path(m)
        for p in m._parameters.values():
            if p is None:
                continue
            owner.setdefault(id(p), mod)
            add(p, "parameter", mod)
            if p.grad is not None:
                add(p.grad, "gradient", mod)
        for b in m._buffers.values():
            if b is not None:
                add(b, "buffer", mod)
    for opt in optimizers:
        for p, st in opt.state.items():
            for v in st.values():
                if torch.is_tensor(v):
                    add(v, "optimizer_state", owner.get(id(p)))
    tb = torch_blocks()
    addrs = sorted(tb)
    per_block = {}
    missing = 0
    for ptr, n, role, mod in tensors:
        i = bisect.bisect_right(addrs, ptr) - 1
        if i < 0 or ptr + n > addrs[i] + tb[addrs[i]]:
            missing += 1
            continue
        per_block.setdefault(addrs[i], []).append((role, n, mod))
    out = {}
    for blk, es in per_block.items():
        by = {}
        for role, n, _ in es:
            by[role] = by.get(role, 0) + n
        role = max(EXACT, key=lambda r: (by.get(r, 0), -EXACT.index(r)))
        mods = sorted({m for r, _, m in es if r == role and m})
        key = (shared(mods) if mods else None, role)
        out[key] = out.get(key, 0) + tb[blk]
    return out, len(tensors), missing


def plain_loop(model, opt, cfg, steps=STEPS, run=None):
    run = model if run is None else run
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        x = batch_of(cfg)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(x, labels=x).loss
        keep_body()
        loss.backward()
        opt.step()
        del loss, x


def stack_plain(kind):
    model, cfg = gpt2_model()
    model = model.cuda()
    if kind == "ckpt":
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = torch.compile(model) if kind == "compiled" else model
    plain_loop(model, opt, cfg, run=run)
    return model, [opt]


def stack_resnet():
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=100).cuda()
    model = model.to(memory_format=torch.channels_last)
    if LEAK:
        plant(model, LEAK_PATH["resnet"])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        x = torch.randn(16, 3, 128, 128, device="cuda").to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        keep_body()
        loss.backward()
        opt.step()
        del loss, x
    return model, [opt]


def stack_trainer():
    from transformers import Trainer, TrainingArguments

    model, cfg = gpt2_model()
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, cfg.vocab_size, (64, 128))]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=STEPS, per_device_train_batch_size=8,
                             report_to=[], save_strategy="no", logging_strategy="no", bf16=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    from transformers import TrainerCallback

    class Body(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            keep_body()

    tr = Trainer(model=model, args=args, train_dataset=data, callbacks=[Body()])
    tr.train()
    opt = tr.optimizer
    opts = [getattr(opt, "optimizer", opt)] if opt is not None else []
    return tr.model, opts


def stack_accelerate():
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="bf16")
    model, cfg = gpt2_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    for _ in range(STEPS):
        opt.zero_grad()
        x = batch_of(cfg)
        loss = model(x, labels=x).loss
        keep_body()
        acc.backward(loss)
        opt.step()
        del loss, x
    return acc.unwrap_model(model), [getattr(opt, "optimizer", opt)]


def stack_lightning(manual):
    import lightning as L

    gpt, cfg = gpt2_model()

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = gpt
            self.automatic_optimization = not manual

        def training_step(self, batch, i):
            x = batch[0].cuda()
            loss = self.model(x, labels=x).loss
            keep_body()
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return None
            return loss

        def configure_optimizers(self):
            self.opt = torch.optim.AdamW(self.parameters(), lr=1e-4)
            return self.opt

    class Check(L.Callback):
        # Lightning moves the model back to the CPU when fit() ends: the
        # quiescent point is the end of training, before that.
        def on_train_end(self, trainer, module):
            compare("lightning-manual" if manual else "lightning", module, [module.opt])

    m = Module()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randint(0, cfg.vocab_size, (64, 128))),
                                       batch_size=8)
    tr = L.Trainer(max_steps=STEPS, accelerator="gpu", devices=1, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, precision="bf16-mixed",
                   callbacks=[Check()])
    tr.fit(m, data)
    return None, None


def stack_inference():
    model, cfg = gpt2_model()
    model = model.cuda().eval()
    t0 = time.monotonic()
    with torch.no_grad():
        while time.monotonic() - t0 < float(os.environ.get("ROLES_SECONDS", "4")):
            x = batch_of(cfg)
            model(x)
            keep_body()
            del x
    return model, []


def stack_distributed(kind):
    import torch.distributed as dist

    rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    model, cfg = gpt2_model()
    if kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        model = model.cuda()
        for blk in model.transformer.h:
            fully_shard(blk)
        fully_shard(model)
        run = model
    else:
        model = model.cuda()
        run = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    plain_loop(model, opt, cfg, run=run)
    return model, [opt]


def main():
    kind = sys.argv[1] if len(sys.argv) > 1 else "plain"
    if kind in ("plain", "compiled", "ckpt"):
        model, opts = stack_plain(kind)
    elif kind == "resnet":
        model, opts = stack_resnet()
    elif kind == "trainer":
        model, opts = stack_trainer()
    elif kind == "accelerate":
        model, opts = stack_accelerate()
    elif kind in ("lightning", "lightning-manual"):
        model, opts = stack_lightning(kind == "lightning-manual")
    elif kind == "inference":
        model, opts = stack_inference()
    else:
        model, opts = stack_distributed(kind)
    if model is not None:
        compare(kind, model, opts)
    if os.environ.get("RANK") is not None:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    done()


def leak_path(kind):
    """Where the planted leak is: a module path, or "null" (the loop body)."""
    return "null" if BODY else LEAK_PATH["resnet" if kind == "resnet" else "gpt2"]


def compare(kind, model, opts):
    st = wait_mode(vramscope)
    check(st["mode"] == "exact", "%s: exact mode" % kind)
    torch.cuda.synchronize()
    time.sleep(3.0)  # a quiescent job: the agent's background thread writes a list
    want, n, missing = expected(model, opts)
    view = read_own_view(BIN)
    rl = view["attribution"].get("role_lists", {})
    got = {}
    for r in view["attribution"].get("by_role", []):
        if r["role"] in EXACT:
            got[(r["module"] or None, r["role"])] = got.get((r["module"] or None, r["role"]), 0) + r["bytes"]
    same = [k for k in want if got.get(k) == want[k]]
    wrong = [(k, got.get(k), want[k]) for k in want if got.get(k) != want[k]]
    extra = [(k, v) for k, v in got.items() if k not in want]
    totals = {}
    for (m, role), b in want.items():
        totals[role] = totals.get(role, 0) + b
    others = {r["role"]: r["bytes"] for r in view["attribution"].get("roles", []) if r["role"] not in EXACT}
    print("%s: torch holds %d tensors (%d outside every block); by role %s; vramscope's other roles %s; lists %s" % (
        kind, n, missing, totals, others, rl))
    if LEAK or BODY:
        leak = view["leak"]
        origins = [(o.get("module"), o.get("bytes_per_step")) for o in leak.get("origins", [])]
        path = leak_path(kind)
        # (Under Lightning the root is the LightningModule: `model.` first.)
        named = bool(origins) and (origins[0][0] is None if BODY else
                                   any(m and m.endswith(path) for m, _ in origins[:2]))
        if not check(leak.get("flagged") and named, "%s: the leak planted in %s is flagged (at step %s) and named: %s" % (
                kind, path, leak.get("flagged_at_step"), origins[:3])):
            print("leak report: %s" % json.dumps({k: v for k, v in leak.items() if k not in ("earlier_runs",)})[:3000])
    truth = os.environ.get("ROLES_TRUTH")
    if truth:
        # For a recording of this job (tests/gpu/roles_record.sh): torch's
        # figures at this point, then the job holds still while the
        # recording stops (its teardown would free everything).
        # (Ranks after the first write NAME.truth.json.rankN.)
        rank = int(os.environ.get("RANK", "0"))
        truth = truth if rank == 0 else "%s.rank%d" % (truth, rank)
        with open(truth + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "stack": kind, "rank": rank,
                       "leak_path": leak_path(kind) if LEAK or BODY else None,
                       "rows": sorted([m, r, b] for (m, r), b in want.items())}, f)
        os.replace(truth + ".tmp", truth)
        time.sleep(float(os.environ.get("ROLES_HOLD", "20")))
    check(not wrong and not extra and want,
          "%s: bytes by module and role equal torch's: %d of %d (module, role) rows%s%s" % (
              kind, len(same), len(want), "" if not wrong else "; differ: %s" % wrong[:4],
              "" if not extra else "; vramscope only: %s" % extra[:4]))


if __name__ == "__main__":
    main()
