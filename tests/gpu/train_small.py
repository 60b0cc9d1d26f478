"""A small real PyTorch training job for watching with vramscope.

    vramscope run -- python3 tests/gpu/train_small.py --seconds 120
    vramscope run -- python3 tests/gpu/train_small.py --seconds 60 --keep-loss

A 2-layer MLP (in -> hidden -> in, GELU) trained with AdamW on random data,
for --seconds seconds of wall time. With the defaults (2048-8192-2048, batch
1024, fp32) the weights, gradients and AdamW state take about 540 MiB; on
an H100 (torch 2.11) 649 MiB stayed allocated between steps, 938 MiB were
reserved, at 219 steps/s.

--keep-loss appends every step's `loss` tensor (not `loss.item()`) to a list
that is never cleared: the textbook leak. Each kept loss keeps its autograd
graph alive, and with it more than the scalar: on an H100 with torch 2.11
and the defaults, allocated grew by 8 MiB per step (one batch x dim fp32
tensor: the size of the model's output), about 0.75 GiB/s at ~95 steps/s.
--max-reserved-gib (default 16) ends the job cleanly before it fills the GPU.

When the vramscope agent is importable (under `vramscope run` it is), step
boundaries are written with `vramscope.mark(step)` unless --no-mark is given;
without them the dashboard infers the steps from the allocated total.

Prints its pid at start, the step rate every --report seconds, and a summary
line at the end. Needs a CUDA GPU; exits 2 without one.
"""

import argparse
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="wall time to train (default 120)")
    ap.add_argument("--dim", type=int, default=2048, help="input/output width (default 2048)")
    ap.add_argument("--hidden", type=int, default=8192, help="hidden width (default 8192)")
    ap.add_argument("--batch", type=int, default=1024, help="batch size (default 1024)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--keep-loss", action="store_true", help="keep every step's loss tensor in a list (a leak)")
    ap.add_argument("--no-mark", action="store_true", help="do not write step markers through the agent")
    ap.add_argument("--report", type=float, default=5.0, help="seconds between step-rate lines (default 5)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument(
        "--max-reserved-gib", type=float, default=16.0, help="stop when the caching allocator reserves more (default 16)"
    )
    args = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("train_small: no CUDA device", file=sys.stderr)
        return 2

    mark = None
    if not args.no_mark:
        try:
            import vramscope  # present under `vramscope run`

            mark = vramscope.mark
        except ImportError:
            pass

    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(args.dim, args.hidden),
        torch.nn.GELU(),
        torch.nn.Linear(args.hidden, args.dim),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # A fixed pool of random batches: the data loader is not what is watched.
    xs = [torch.randn(args.batch, args.dim, device=dev) for _ in range(4)]
    ys = [torch.randn(args.batch, args.dim, device=dev) for _ in range(4)]
    kept = []

    print(
        "train_small: pid %d, %s, MLP %d-%d-%d, batch %d, %s%s"
        % (
            os.getpid(),
            torch.cuda.get_device_name(dev),
            args.dim,
            args.hidden,
            args.dim,
            args.batch,
            "keeping loss tensors (leak)" if args.keep_loss else "no leak",
            ", step markers" if mark else "",
        ),
        flush=True,
    )

    t0 = time.monotonic()
    last_t, last_step = t0, 0
    step = 0
    loss_val = float("nan")
    while True:
        now = time.monotonic()
        if now - t0 >= args.seconds:
            break
        x, y = xs[step % 4], ys[step % 4]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if args.keep_loss:
            kept.append(loss)  # the leak: should have been loss.item()
        step += 1
        if mark is not None:
            mark(step)
        if step % 50 == 0 and torch.cuda.memory_reserved(dev) > args.max_reserved_gib * 2**30:
            print("train_small: reserved over %.1f GiB at step %d: stopping" % (args.max_reserved_gib, step), flush=True)
            break
        if now - last_t >= args.report:
            torch.cuda.synchronize(dev)
            loss_val = loss.item()
            now = time.monotonic()
            print(
                "train_small: step %d, %.1f steps/s, loss %.4f, allocated %.1f MiB, reserved %.1f MiB"
                % (
                    step,
                    (step - last_step) / (now - last_t),
                    loss_val,
                    torch.cuda.memory_allocated(dev) / 2**20,
                    torch.cuda.memory_reserved(dev) / 2**20,
                ),
                flush=True,
            )
            last_t, last_step = now, step
    torch.cuda.synchronize(dev)
    wall = time.monotonic() - t0
    print(
        "train_small: done, %d steps in %.1f s (%.1f steps/s), kept %d loss tensors, peak allocated %.1f MiB"
        % (step, wall, step / wall, len(kept), torch.cuda.max_memory_allocated(dev) / 2**20),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
