"""The jobs of tests/gpu/outside_probe.py and tests/gpu/outside_job.py
(issue 47): GPT-2 (gpt2), ResNet-50 with cuDNN (conv), a torch.compile'd
MLP (compile), GPT-2 under DDP (ddp, under torchrun): their model on the
current device, and one training step."""

import torch


def step_of(JOB, rank=0):
    """The training step of job `JOB` (its model built now)."""
    if JOB in ("gpt2", "ddp"):
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).cuda()
        if JOB == "ddp":
            import torch.distributed as dist
            dist.init_process_group("nccl")
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, 50257, (8, 512), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif JOB == "conv":
        import torchvision
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet50().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(32, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (32,), device="cuda")

        def step():
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    elif JOB == "compile":
        model = torch.nn.Sequential(
            torch.nn.Linear(2048, 8192), torch.nn.GELU(), torch.nn.Linear(8192, 2048),
            torch.nn.LayerNorm(2048)).cuda()
        cmodel = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(64, 256, 2048, device="cuda")

        def step():
            loss = cmodel(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        raise SystemExit("unknown job " + JOB)
    return step
