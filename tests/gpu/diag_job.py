"""A real third-party workload with no vramscope code in it, for the
diagnosis suite (tests/gpu/diag_suite.sh). Run under `vramscope run`.

    diag_job.py WORKLOAD --leak {none,fast,slow} --steps N --out FILE.json
                [--mid FILE] [--mid-step K]

WORKLOAD: gpt2 (transformers causal LM, AdamW, bf16 autocast), resnet
(timm ResNet-50, channels_last, bf16), lightning (Trainer.fit with
DataLoader workers), lbfgs (GPT-2 under torch.optim.LBFGS, whose
closure runs forward, backward and the leak), compiled (torch.compile'd GPT-2), inference (GPT-2
generation-free forward loop, no optimizer, no_grad), ddp (GPT-2 under
DDP, launched by torchrun), bert-varlen (transformers BERT, a random
sequence length and batch every step), noisy (GPT-2 with the noise sources
of a healthy job named by --noise), lightning-noisy and trainer-noisy (the
same sources as Lightning and HF Trainer make them: validation every 25
steps, checkpoints, gradient accumulation, pinned batches). Models are
built from configs (nothing is downloaded).

--noise (noisy only), a comma-separated list, or `all`:
  eval         an evaluation pass every 10 steps (batch 32, no_grad, its
               predictions gathered into a list and dropped after)
  accum        gradient accumulation, 4 micro-batches per optimizer step
  save         every 50 steps torch.save of the model's and optimizer's
               state, and a GPU copy of the weights kept as the best so
               far (the old copy freed)
  compile      torch.compile'd model, a new sequence length at step 100
               (a second compilation mid-run)
  pinned       a DataLoader with pinned memory and 2 workers, copied with
               non_blocking=True
  empty_cache  torch.cuda.empty_cache() every 20 steps
  cublas       from step 100, an evaluation forward on a side stream every
               5 steps (cuBLAS makes a workspace for that stream once:
               memory that grows, then is stable)

--leak keeps a tensor alive every step: fast 1 MiB + 4 KiB (the way a
`losses.append(logits)` leak grows), slow 256 KiB. The true step count, the
leak per step and the step times go to --out. At --mid-step the script
touches --mid (the harness attaches a second reader then).
"""
import argparse
import json
import os
import time

import torch
import torch.utils.data

LEAK = {"none": 0, "fast": (1 << 20) + 4096, "slow": 256 << 10}


class Tokens(torch.utils.data.Dataset):
    """`n` rows of 128 random tokens, row i seeded by i (a DataLoader's
    workers give the same batches)."""

    def __init__(self, n, vocab=8192):
        self.n, self.vocab = n, vocab

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.randint(0, self.vocab, (128,), generator=torch.Generator().manual_seed(i))


def lightning_trainer(steps, **extra):
    """A Lightning Trainer on one GPU, bf16-mixed, quiet."""
    import lightning as L

    return L.Trainer(max_steps=steps, accelerator="gpu", devices=1, precision="bf16-mixed", logger=False,
                     enable_progress_bar=False, enable_model_summary=False, **extra)


LAYERS = 4


def gpt2(n_layer=None, n_embd=256, vocab=8192, pos=256):
    n_layer = n_layer or LAYERS
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=8, vocab_size=vocab, n_positions=pos)
    return GPT2LMHeadModel(cfg)


class Steps:
    """Counts steps, plants the leak, tells the harness when to attach."""

    def __init__(self, a):
        self.a = a
        self.kept = []
        self.times = []
        self.rank = int(os.environ.get("RANK", "0"))

    def step(self):
        if self.a.step_sleep:
            time.sleep(self.a.step_sleep)  # a data loader's wait, off the GPU
        n = LEAK[self.a.leak]
        if n:
            self.kept.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
        self.times.append(time.monotonic())
        if self.a.mid and len(self.times) == self.a.mid_step and self.rank == 0:
            open(self.a.mid, "w").close()

    def done(self):
        torch.cuda.synchronize()
        out = self.a.out if self.rank == 0 else self.a.out + ".rank%d" % self.rank
        with open(out, "w") as f:
            json.dump(
                {
                    "workload": self.a.workload,
                    "leak": self.a.leak,
                    "leak_bytes_per_step": LEAK[self.a.leak],
                    "steps": len(self.times),
                    "seconds": self.times[-1] - self.times[0] if self.times else 0,
                    "pid": os.getpid(),
                    "peak_reserved": torch.cuda.max_memory_reserved(),
                    "peak_allocated": torch.cuda.max_memory_allocated(),
                    "reserved": torch.cuda.memory_reserved(),
                    "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                },
                f,
            )
        # The leak still held while a reader looks (--hold): a job's own
        # teardown frees it.
        time.sleep(self.a.hold)


def train(steps, s, opt, forward):
    """`steps` training steps: the loss `forward()` returns (under bf16
    autocast), backward, the optimizer's step, then `s.step()`."""
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        s.step()


def train_lm(model, steps, s, batch=8, seq=128, vocab=8192, compiled=False):
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if compiled else model
    x = torch.randint(0, vocab, (batch, seq), device="cuda")
    train(steps, s, opt, lambda: fwd(input_ids=x, labels=x).loss)


def bert_varlen(steps, s):
    """transformers BERT (masked LM, 4 layers) with a random sequence length
    and batch every step: floors that swing by hundreds of MB with the
    previous step's logits (issue 26, item 3)."""
    import random

    from transformers import BertConfig, BertForMaskedLM

    rng = random.Random(0)
    cfg = BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, intermediate_size=1024,
                     vocab_size=30522, max_position_embeddings=512)
    model = BertForMaskedLM(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward():
        b, t = rng.choice([4, 8, 16, 32]), rng.choice([32, 64, 128, 256, 384, 512])
        x = torch.randint(0, cfg.vocab_size, (b, t), device="cuda")
        return model(input_ids=x, labels=x).loss

    train(steps, s, opt, forward)


NOISE = ("eval", "accum", "save", "compile", "pinned", "empty_cache", "cublas")


def noisy(steps, s, noise, vocab=8192):
    """GPT-2 under the noise sources of a healthy job (issue 26, item 3):
    none of them may be flagged as a leak."""
    import tempfile

    model = gpt2().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if "compile" in noise else model
    accum = 4 if "accum" in noise else 1
    side = torch.cuda.Stream() if "cublas" in noise else None
    tmp = tempfile.mkdtemp()
    best = None

    def batches():
        g = torch.Generator().manual_seed(1)
        if "pinned" in noise:
            loader = torch.utils.data.DataLoader(Tokens(1 << 30, vocab), batch_size=8, num_workers=2,
                                                 pin_memory=True)
            for b in loader:
                yield b.cuda(non_blocking=True)
        while True:
            yield torch.randint(0, vocab, (8, 128), generator=g).cuda()

    data = batches()
    for step in range(steps):
        for _ in range(accum):
            x = next(data)
            if "compile" in noise and step >= 100:
                x = x[:, :64]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(input_ids=x, labels=x).loss / accum
            loss.backward()
            del loss, x
        opt.step()
        opt.zero_grad(set_to_none=True)
        s.step()
        if "eval" in noise and step % 10 == 9:
            model.eval()
            preds = []
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                for _ in range(2):
                    x = torch.randint(0, vocab, (32, 128), device="cuda")
                    preds.append(fwd(input_ids=x).logits.argmax(-1))
            acc = sum(float((p == 0).float().mean()) for p in preds)
            del preds, acc
            model.train()
        if "save" in noise and step % 50 == 49:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(tmp, "last.pt"))
            best = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if side is not None and step >= 100 and step % 5 == 0:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                x = torch.randint(0, vocab, (8, 128), device="cuda")
                fwd(input_ids=x).logits.float().sum().item()
                del x
            torch.cuda.current_stream().wait_stream(side)
        if "empty_cache" in noise and step % 20 == 19:
            torch.cuda.empty_cache()
    del best


def lightning_noisy(steps, s, vocab=8192):
    """Lightning's own noise: validation every 25 steps, a checkpoint
    every 50, 2 accumulated batches per step, pinned batches from 2
    workers."""
    import tempfile

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.m = gpt2()

        def training_step(self, batch, i):
            return self.m(input_ids=batch, labels=batch).loss

        def validation_step(self, batch, i):
            self.log("val_loss", self.m(input_ids=batch, labels=batch).loss)

        def on_train_batch_end(self, *args):
            if self.trainer.global_step > len(s.times):  # an optimizer step
                s.step()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    trainer = lightning_trainer(
        steps,
        accumulate_grad_batches=2,
        val_check_interval=50,
        limit_val_batches=4,
        num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(dirpath=tempfile.mkdtemp(), every_n_train_steps=50, save_top_k=-1)],
    )
    kw = dict(batch_size=8, num_workers=2, pin_memory=True, persistent_workers=True)
    trainer.fit(LM(), DataLoader(Tokens(steps * 2 * 8, vocab), shuffle=True, **kw), DataLoader(Tokens(64, vocab), **kw))


def trainer_noisy(steps, s, vocab=8192):
    """HF Trainer's own noise: evaluation every 25 steps, a checkpoint
    every 100, 2 accumulated batches per step, pinned batches."""
    import inspect
    import tempfile

    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Count(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            s.step()

    g = torch.Generator().manual_seed(0)
    train = [{"input_ids": t, "labels": t} for t in torch.randint(0, vocab, (steps * 2 * 8, 128), generator=g)]
    evals = [{"input_ids": t, "labels": t} for t in torch.randint(0, vocab, (64, 128), generator=g)]
    strategy = "eval_strategy" if "eval_strategy" in inspect.signature(TrainingArguments).parameters \
        else "evaluation_strategy"
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps, per_device_train_batch_size=8,
                             per_device_eval_batch_size=16, gradient_accumulation_steps=2, eval_steps=25,
                             save_strategy="steps", save_steps=100, report_to=[], logging_strategy="no",
                             bf16=True, dataloader_num_workers=2, dataloader_pin_memory=True, disable_tqdm=True,
                             **{strategy: "steps"})
    Trainer(model=gpt2(), args=args, train_dataset=train, eval_dataset=evals, callbacks=[Count()]).train()


def resnet(steps, s):
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=100).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(16, 3, 128, 128, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 100, (16,), device="cuda")
    train(steps, s, opt, lambda: torch.nn.functional.cross_entropy(model(x), y))


def inference(steps, s):
    model = gpt2().cuda().eval()
    x = torch.randint(0, 8192, (8, 128), device="cuda")
    with torch.no_grad():
        for _ in range(steps):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=x).logits.float().softmax(-1).argmax(-1)
            s.step()


def lightning(steps, s):
    import lightning as L
    from torch.utils.data import DataLoader

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.m = gpt2()

        def training_step(self, batch, i):
            loss = self.m(input_ids=batch, labels=batch).loss
            s.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    trainer = lightning_trainer(steps, enable_checkpointing=False)
    trainer.fit(LM(), DataLoader(Tokens(steps * 8), batch_size=8, num_workers=2, persistent_workers=True))


def lbfgs(steps, s):
    """GPT-2 under torch.optim.LBFGS: forward, backward and the step's
    bookkeeping (and the planted leak) run in the closure the optimizer
    calls, as in every closure-taking loop."""
    model = gpt2().cuda()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=1, history_size=4)
    x = torch.randint(0, 8192, (8, 128), device="cuda")

    def closure():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        s.step()
        return loss

    for _ in range(steps):
        opt.step(closure)


def ddp(steps, s):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    model = DDP(gpt2().cuda(), device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 8192, (8, 128), device="cuda")
    train(steps, s, opt, lambda: model(input_ids=x, labels=x).loss)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=["gpt2", "resnet", "lightning", "lbfgs", "compiled", "inference", "ddp",
                                        "bert-varlen", "noisy", "lightning-noisy", "trainer-noisy"])
    p.add_argument("--noise", default="", help="noisy: comma-separated sources (%s) or all" % ",".join(NOISE))
    p.add_argument("--leak", choices=sorted(LEAK), default="none")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--out", required=True)
    p.add_argument("--mid", default=None)
    p.add_argument("--mid-step", type=int, default=0)
    p.add_argument("--layers", type=int, default=4, help="GPT-2 layers (small recordings for fixtures)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait each step")
    p.add_argument("--hold", type=float, default=0.0, help="seconds to wait, the leak alive, after --out is written")
    a = p.parse_args()
    global LAYERS
    LAYERS = a.layers
    torch.manual_seed(0)
    s = Steps(a)
    w = a.workload
    if w == "gpt2":
        train_lm(gpt2(), a.steps, s)
    elif w == "compiled":
        train_lm(gpt2(), a.steps, s, compiled=True)
    elif w == "resnet":
        resnet(a.steps, s)
    elif w == "inference":
        inference(a.steps, s)
    elif w == "lightning":
        lightning(a.steps, s)
    elif w == "lbfgs":
        lbfgs(a.steps, s)
    elif w == "ddp":
        ddp(a.steps, s)
    elif w == "bert-varlen":
        bert_varlen(a.steps, s)
    elif w == "noisy":
        noise = NOISE if a.noise == "all" else tuple(n for n in a.noise.split(",") if n)
        unknown = [n for n in noise if n not in NOISE]
        if unknown:
            p.error("unknown --noise %s (known: %s)" % (",".join(unknown), ",".join(NOISE)))
        noisy(a.steps, s, noise)
    elif w == "lightning-noisy":
        lightning_noisy(a.steps, s)
    elif w == "trainer-noisy":
        trainer_noisy(a.steps, s)
    s.done()


if __name__ == "__main__":
    main()
