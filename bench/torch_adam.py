#!/usr/bin/python3
"""torch.optim.Adam(foreach=True) on the CPU, for bench/cpu_adam_vs_pytorch.sh.

N fp32 parameters split into --tensors tensors of near-equal size, as a real
model's are split; gradients are set once and kept away from zero, like the
pstar side, so no subnormals slow either down. Times optimizer.step() after
warm-up and prints one line:
  torch: n=N tensors=T threads=C iters=K median_s=S params_per_s=X version=V
"""
import argparse
import os
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64 << 20)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    base, extra = divmod(args.n, args.tensors)
    sizes = [base + (1 if i < extra else 0) for i in range(args.tensors)]
    params = []
    for size in sizes:
        p = torch.nn.Parameter((torch.rand(size) - 0.5) * 0.02)
        u = torch.rand(size)
        p.grad = torch.where(u < 0.5, -1e-2, 1e-2) * (0.5 + u)
        params.append(p)
    opt = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                           foreach=True)

    times = []
    with torch.no_grad():
        for it in range(args.warmup + args.iters):
            t0 = time.perf_counter()
            opt.step()
            t1 = time.perf_counter()
            if it >= args.warmup:
                times.append(t1 - t0)
    s = statistics.median(times)
    print(f"torch: n={args.n} tensors={args.tensors} threads={torch.get_num_threads()} "
          f"iters={args.iters} median_s={s:.6f} params_per_s={args.n / s:.4e} "
          f"version={torch.__version__}")


if __name__ == "__main__":
    main()
