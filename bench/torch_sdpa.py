#!/usr/bin/python3
"""PyTorch's causal scaled_dot_product_attention on one GPU, for
bench/gpu_attention.sh: each backend asked for (flash, cudnn, efficient) at
one shape, forward and backward, timed with CUDA events (medians after a
warm-up). TFLOP/s count the causal half once, as bin/cuda_attention_bench
does: forward 4 B NH T^2 hs / 2, backward 10 B NH T^2 hs / 2 FLOP.

Prints one line per backend:
  attention: side=torch backend=flash B=.. NH=.. T=.. hs=.. dtype=bf16 fwd_ms=.. fwd_tflops=.. bwd_ms=.. bwd_tflops=..
or
  attention: side=torch backend=cudnn unavailable: REASON

--dry-run runs the math backend on the CPU at the given shape (the explicit
masked softmax where this PyTorch has no SDPA), to check the script where no
GPU is, printing "DRY RUN" first.
"""
import argparse
import contextlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def backends_by_name():
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:
        return None
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
             "math": "MATH"}
    return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}


def timed(fn, reps, cuda):
    times = []
    for r in range(reps + 1):  # the first is a warm-up
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            fn()
            ms = 1e3 * (time.perf_counter() - t0)
        if r > 0:
            times.append(ms)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--backends", default="flash,cudnn")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    for name in ("batch", "heads", "seq", "head_size", "reps"):
        if getattr(a, name) <= 0:
            print("torch_sdpa: --%s: a positive number, got %d" % (name.replace("_", "-"), getattr(a, name)),
                  file=sys.stderr)
            return 2
    available = backends_by_name()
    if available is None and not a.dry_run:
        print("attention: side=torch backend=all unavailable: this PyTorch (%s) has no torch.nn.attention"
              % torch.__version__)
        return 0
    cuda = not a.dry_run
    if cuda and not torch.cuda.is_available():
        print("attention: side=torch backend=all unavailable: no CUDA device")
        return 0
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    wanted = ["math"] if a.dry_run else [b.strip() for b in a.backends.split(",") if b.strip()]
    if a.dry_run:
        print("DRY RUN on the CPU: the math backend, no GPU figures")
    shape = (a.batch, a.heads, a.seq, a.head_size)
    g = torch.Generator(device=device).manual_seed(5)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=g).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype, generator=g)
    flop = a.batch * a.heads * a.seq * a.seq * a.head_size / 2.0
    causal = torch.ones(a.seq, a.seq, dtype=torch.bool, device=device).tril()

    def explicit():  # where this PyTorch has no SDPA (the dry run on an old one)
        att = (q @ k.transpose(-2, -1)) * (a.head_size ** -0.5)
        return att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v

    for name in wanted:
        if available is not None and name not in available:
            print("attention: side=torch backend=%s unavailable: not in this PyTorch (%s)" % (name, torch.__version__))
            continue
        try:
            if available is not None:
                from torch.nn.attention import sdpa_kernel
                context = sdpa_kernel([available[name]])
            else:
                name, context = "explicit", contextlib.nullcontext()
            with context:
                def forward():
                    if available is None:
                        return explicit()
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                fwd_ms = timed(forward, a.reps, cuda)
                out = forward()

                def backward():
                    q.grad = k.grad = v.grad = None
                    out.backward(dout, retain_graph=True)

                bwd_ms = timed(backward, a.reps, cuda)
        except RuntimeError as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print("attention: side=torch backend=%s unavailable: %s" % (name, reason[:200]))
            continue
        print("attention: side=torch backend=%s B=%d NH=%d T=%d hs=%d dtype=%s fwd_ms=%.4f fwd_tflops=%.1f "
              "bwd_ms=%.4f bwd_tflops=%.1f" % (name, a.batch, a.heads, a.seq, a.head_size, a.dtype, fwd_ms,
                                               4 * flop / (fwd_ms * 1e9), bwd_ms, 10 * flop / (bwd_ms * 1e9)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
