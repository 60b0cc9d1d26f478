"""Real training jobs for the forecast by simulation and `vramscope fit`
(issue 48), driven by tests/gpu/forecast_fit.sh.

    python3 tests/gpu/fit_job.py job MODEL --batch B --steps S --out T.json
        [--leak-mb L --fraction F | --leak-mb L --target-oom N --calib C.json]
        [--after-oom K] [--hold S]
    python3 tests/gpu/fit_job.py find MODEL --peaks T1.json T2.json ... --target N
        --steps S --out T.json
    python3 tests/gpu/fit_job.py trial MODEL --batch B --steps S --fraction F

MODEL (transformers, built from configs, fixed seed, nothing downloaded;
bf16 autocast, AdamW; a fresh input each step):
  gpt2   GPT-2, 4 layers, hidden 512, vocab 8192, 256 tokens
  llama  Llama, 4 layers, hidden 512, MLP 1376, vocab 8192, 256 tokens
  vit    ViT, 4 layers, hidden 384, 224 px, patch 16, 100 classes
  bert   BERT masked LM, 4 layers, hidden 256, vocab 30522, 128 tokens

job: STEPS steps at batch B, each starting with vramscope.mark(step)
(step 1 first). With --leak-mb, each step first keeps that many MiB (a
leak). With --fraction (or --target-oom N and --calib C.json, the peak
reserved of an unconstrained run of the same job: the fraction is then
chosen so that the leak reaches the limit around step N) the job calls
set_per_process_memory_fraction and, like loops that skip a batch that
does not fit, catches each out-of-memory error and goes on; with
--after-oom K it stops K steps after the first one. Writes --out (JSON):
torch's peaks over the run (reset at the start), the OOM steps, the first
failing request (the allocator's OOM observer: the size it tried to
allocate, and the error's message), each step's allocated and reserved
bytes at its end, the device's total memory, the limit, the setting and
torch's version; then holds still --hold seconds (the recording stops).

find: the largest batch that fits under a memory fraction, found the way
Lightning's BatchSizeFinder does (mode binsearch, init_val 2): double the
batch until a try runs out, then binary search between the last that fit
and the first that did not. Each try is a fresh run of the job's STEPS
steps in a child process (forked before CUDA is touched; a fresh
interpreter if that fails), so no out-of-memory state leaks from one try
to the next. The fraction: the peaks of the unconstrained runs (--peaks,
`job` outputs at several batches) fitted as a + b * batch, and the limit
put at batch TARGET + 0.5. Writes --out: the runs' peaks, the fraction,
the limit, every try (batch, fits, torch's peaks, OOMs) and the largest
batch.

trial: one try, printed as JSON (find's fallback).
"""
import argparse
import json
import os
import sys
import time

# Before torch: torch.cuda.is_available() then asks NVML, not the CUDA
# driver, so a parent that forks its tries never initialises CUDA.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import torch  # noqa: E402

MODELS = ("gpt2", "llama", "vit", "bert")
_vs = []


def mark(step):
    if not _vs:
        try:
            import vramscope

            _vs.append(vramscope)
        except Exception:
            _vs.append(None)
    if _vs[0] is not None:
        try:
            _vs[0].mark(step)
        except Exception:
            pass


def build(name, batch):
    """The model on the GPU and a function that makes one step's inputs."""
    import transformers as T

    dev = "cuda"
    if name == "gpt2":
        cfg = T.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256)
        model = T.GPT2LMHeadModel(cfg)
        make = lambda: {"input_ids": torch.randint(0, 8192, (batch, 256), device=dev)}
    elif name == "llama":
        cfg = T.LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=4, num_attention_heads=8,
                            num_key_value_heads=8, vocab_size=8192, max_position_embeddings=256)
        model = T.LlamaForCausalLM(cfg)
        make = lambda: {"input_ids": torch.randint(0, 8192, (batch, 256), device=dev)}
    elif name == "vit":
        cfg = T.ViTConfig(image_size=224, patch_size=16, num_hidden_layers=4, hidden_size=384,
                          num_attention_heads=6, intermediate_size=1536, num_labels=100)
        model = T.ViTForImageClassification(cfg)
        make = lambda: {"pixel_values": torch.randn(batch, 3, 224, 224, device=dev),
                        "labels": torch.randint(0, 100, (batch,), device=dev)}
    elif name == "bert":
        cfg = T.BertConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=8, intermediate_size=1024,
                           vocab_size=30522, max_position_embeddings=512)
        model = T.BertForMaskedLM(cfg)
        make = lambda: {"input_ids": torch.randint(0, 30522, (batch, 128), device=dev)}
    else:
        raise SystemExit("unknown model %s" % name)
    return model.to(dev), make


def loss_of(model, batch):
    if "labels" in batch:
        return model(**batch).loss
    return model(**batch, labels=batch["input_ids"]).loss


def total_memory():
    return torch.cuda.get_device_properties(0).total_memory


def limit_of(fraction, total=None):
    # As the allocator computes it: static_cast<size_t>(fraction * total).
    return int(fraction * float(total if total is not None else total_memory()))


def run(model_name, batch, steps, fraction=None, leak_mb=0, after_oom=None, stop_at_oom=False, marks=True,
        step_sleep=0.0):
    """The job: returns what torch says of it."""
    torch.manual_seed(0)
    torch.cuda.init()
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    torch.cuda.reset_peak_memory_stats()
    first_oom = {}

    def observer(device, alloc, device_allocated, device_free):
        if not first_oom:
            first_oom.update(alloc_size=int(alloc), limit_or_total=int(device_allocated), device_free=int(device_free))

    try:
        torch._C._cuda_attach_out_of_memory_observer(observer)
    except Exception as e:  # older or newer torch: the message alone
        first_oom["observer_error"] = repr(e)
    model, make = build(model_name, batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ooms, kept, per_step, messages = [], [], [], []
    t0 = time.time()
    step = 0
    while step < steps:
        step += 1
        if marks:
            mark(step)
        ok = True
        try:
            if leak_mb:
                kept.append(torch.empty(leak_mb << 20, dtype=torch.uint8, device="cuda"))
            x = make()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_of(model, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, x
        except torch.OutOfMemoryError as e:
            ok = False
            ooms.append(step)
            if len(messages) < 3:
                messages.append(str(e)[:400])
            opt.zero_grad(set_to_none=True)
            loss = x = None
        per_step.append([step, torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), ok])
        if step_sleep:
            # A slower job, for a watcher started after it (stage running).
            time.sleep(step_sleep)
        if not ok and stop_at_oom:
            break
        if ooms and after_oom is not None and step >= ooms[0] + after_oom:
            break
    torch.cuda.synchronize()
    st = torch.cuda.memory_stats()
    return {
        "model": model_name,
        "batch": batch,
        "steps": steps,
        "steps_run": step,
        "seconds": round(time.time() - t0, 3),
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "total_memory": total_memory(),
        "fraction": fraction,
        "limit": limit_of(fraction) if fraction is not None else None,
        "leak_mb": leak_mb,
        "leak_bytes_per_step": leak_mb << 20,
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
        "ooms": len(ooms),
        "oom_steps": ooms,
        "first_oom_step": ooms[0] if ooms else None,
        "first_oom": (first_oom or None) if ooms else None,
        "oom_messages": messages,
        "num_ooms": st.get("num_ooms", 0),
        "alloc_retries": st.get("num_alloc_retries", 0),
        "per_step": per_step,
        "pid": os.getpid(),
    }


def write(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def trial(model_name, batch, steps, fraction):
    """One BatchSizeFinder try: fits when all steps run with no OOM."""
    r = run(model_name, batch, steps, fraction=fraction, stop_at_oom=True, marks=False)
    return {
        "batch": batch,
        "fits": r["ooms"] == 0,
        "peak_reserved": r["peak_reserved"],
        "peak_allocated": r["peak_allocated"],
        "num_ooms": r["num_ooms"],
        "oom_step": r["first_oom_step"],
        "failing_alloc": (r["first_oom"] or {}).get("alloc_size"),
        "seconds": r["seconds"],
    }


def _child(conn, args):
    try:
        res = trial(*args)
    except Exception as e:  # not an OOM (those are caught): CUDA after a fork, say
        res = {"error": repr(e)[:400]}
    conn.send(res)
    conn.close()


def one_try(model_name, batch, steps, fraction):
    import multiprocessing as mp

    res = None
    try:
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_child, args=(child, (model_name, batch, steps, fraction)))
        p.start()
        child.close()
        if parent.poll(60):
            res = parent.recv()
        p.join(30)
        if p.is_alive():
            p.kill()
    except Exception as e:
        res = {"error": repr(e)[:400]}
    if res is not None and "error" not in res:
        res["how"] = "fork"
        return res
    err = (res or {}).get("error", "no answer")
    import subprocess

    out = subprocess.run([sys.executable, os.path.abspath(__file__), "trial", model_name, "--batch", str(batch),
                          "--steps", str(steps), "--fraction", repr(fraction)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    res = json.loads(out.stdout.decode().strip().splitlines()[-1])
    res["how"] = "subprocess"
    res["fork_error"] = err
    return res


def bsf(model_name, steps, fraction, init=2, max_trials=25):
    """Lightning's BatchSizeFinder, mode binsearch: the tries in order and
    the largest batch that fit."""
    tries = []
    low, high, size = 1, None, init
    for _ in range(max_trials):
        r = one_try(model_name, size, steps, fraction)
        tries.append(r)
        print("  %s batch %d: %s" % (model_name, size, "fits" if r["fits"] else "OOM"), flush=True)
        if r["fits"]:
            low = size
            if high is not None:
                if high - low <= 1:
                    break
                size = (high + low) // 2
            else:
                size *= 2
        else:
            high = size
            size = (high + low) // 2
            if high - low <= 1:
                break
    fits = [t["batch"] for t in tries if t["fits"]]
    return tries, (max(fits) if fits else 0)


def linfit(points):
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def find(a):
    runs = []
    for p in a.peaks:
        with open(p) as f:
            t = json.load(f)
        runs.append({"batch": t["batch"], "recording": os.path.basename(p).replace(".truth.json", ""),
                     "peak_reserved": t["peak_reserved"], "peak_allocated": t["peak_allocated"],
                     "ooms": t["ooms"], "num_ooms": t["num_ooms"], "steps": t["steps"]})
    runs.sort(key=lambda r: r["batch"])
    a0, b0 = linfit([(r["batch"], r["peak_reserved"]) for r in runs])
    # The runs' own reading: the parent must not touch CUDA (it forks).
    total = t["total_memory"]
    import transformers as T

    for cls in ("GPT2LMHeadModel", "LlamaForCausalLM", "ViTForImageClassification", "BertForMaskedLM"):
        getattr(T, cls)  # imported once here, not in every try
    assert not torch.cuda.is_initialized()
    target = a.target
    searches = []
    limit = a0 + b0 * (target + 0.5)
    for attempt in range(3):
        fraction = round(limit / total, 6)
        print("%s: fraction %s (limit %d, aimed at batch %s)" % (a.model, fraction, limit_of(fraction, total), target),
              flush=True)
        tries, largest = bsf(a.model, a.steps, fraction)
        searches.append({"fraction": fraction, "limit": limit_of(fraction, total), "aimed_at": target, "tries": tries,
                         "largest_batch": largest})
        lo_ok, hi_ok = runs[0]["batch"] * 2, runs[-1]["batch"]
        if lo_ok < largest < hi_ok:
            break
        # Outside the range: aim again, where the runs' line says.
        limit += b0 * (target - largest)
    last = searches[-1]
    out = {
        "model": a.model,
        "steps": a.steps,
        "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__,
        "total_memory": total,
        "runs": runs,
        "line": {"a": a0, "b": b0},
        "fraction": last["fraction"],
        "limit": last["limit"],
        "largest_batch": last["largest_batch"],
        "tries": last["tries"],
        "finder": "Lightning BatchSizeFinder, mode binsearch, init_val 2; each try a fresh process",
        "searches": searches,
    }
    write(a.out, out)
    print(json.dumps({k: out[k] for k in ("model", "fraction", "limit", "largest_batch")}), flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["job", "find", "trial"])
    p.add_argument("model", choices=MODELS)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--out")
    p.add_argument("--fraction", type=float, default=None)
    p.add_argument("--leak-mb", type=int, default=0)
    p.add_argument("--target-oom", type=int, default=None)
    p.add_argument("--calib", default=None)
    p.add_argument("--after-oom", type=int, default=None)
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--peaks", nargs="*", default=[])
    p.add_argument("--target", type=float, default=21)
    a = p.parse_args()
    if a.mode == "trial":
        print(json.dumps(trial(a.model, a.batch, a.steps, a.fraction)), flush=True)
        return
    if a.mode == "find":
        find(a)
        return
    fraction = a.fraction
    if a.target_oom is not None:
        with open(a.calib) as f:
            base = json.load(f)["peak_reserved"]
        limit = base + (a.leak_mb << 20) * (a.target_oom - 0.5)
        fraction = round(limit / total_memory(), 6)
    r = run(a.model, a.batch, a.steps, fraction=fraction, leak_mb=a.leak_mb, after_oom=a.after_oom,
            step_sleep=a.step_sleep)
    if a.target_oom is not None:
        r["aimed_at_oom_step"] = a.target_oom
        r["calibration_peak_reserved"] = base
    write(a.out, r)
    print(json.dumps({k: r[k] for k in ("model", "batch", "peak_reserved", "peak_allocated", "fraction", "limit",
                                        "first_oom_step", "ooms", "seconds")}), flush=True)
    time.sleep(a.hold)


if __name__ == "__main__":
    main()
