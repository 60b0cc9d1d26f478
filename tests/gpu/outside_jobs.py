"""The jobs of tests/gpu/outside_probe.py and tests/gpu/outside_job.py
(issue 47): GPT-2 (gpt2), ResNet-50 with cuDNN (conv), a torch.compile'd
MLP (compile), GPT-2 under DDP (ddp) or FSDP2 (fsdp2, each block and the
whole model sharded, bf16 parameters) under torchrun, a Llama built from
its config (llama: 8 layers of 2048, SDPA) and a ViT-B/16 from timm (vit):
their model on the current device, and one training step."""

import torch


def step_of(JOB, rank=0):
    """The training step of job `JOB` (its model built now)."""
    if JOB in ("gpt2", "ddp", "fsdp2", "llama"):
        if JOB == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM
            cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8,
                              num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                              attn_implementation="sdpa")
            model = LlamaForCausalLM(cfg).cuda()
            vocab = 32000
        else:
            from transformers import GPT2Config, GPT2LMHeadModel
            model = GPT2LMHeadModel(GPT2Config()).cuda()
            vocab = 50257
        autocast = True
        if JOB in ("ddp", "fsdp2"):
            import torch.distributed as dist
            dist.init_process_group("nccl")
        if JOB == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        elif JOB == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for block in model.transformer.h:
                fully_shard(block, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            autocast = False
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randint(0, vocab, (8, 512), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
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
    elif JOB == "vit":
        import timm
        model = timm.create_model("vit_base_patch16_224", pretrained=False).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
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
