#!/usr/bin/python3
"""PyTorch's causal attention on the CPU, for bench/cpu_attention_vs_pytorch.sh.

The same shapes and layout as pstar's kernel (q, k, v of B x T x NH x hs, as
one qkv projection's output is split), fp32, forward and then backward from a
fixed dout through autograd. scaled_dot_product_attention(is_causal=True)
where this PyTorch has it, else the explicit form (scores, mask, softmax,
product), as bench/torch_gpt_train.py builds it. Prints one line:
  torch: batch=B seq=T embd=C heads=NH threads=N iters=K forward_ms=F backward_ms=G attention=A version=V
(medians over --iters rounds after --warmup).
"""
import argparse
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F


def attend(q, k, v, sdpa):
    if sdpa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, hs = q.size(-2), q.size(-1)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return att @ v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--embd", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    if a.heads < 1 or a.embd % a.heads != 0 or a.iters < 1:
        ap.error("--embd must be a multiple of --heads, --iters at least 1")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    sdpa = hasattr(F, "scaled_dot_product_attention")
    B, T, C, NH = a.batch, a.seq, a.embd, a.heads
    qkv = torch.randn(B, T, 3 * C)
    dout = torch.randn(B, NH, T, C // NH)

    forward, backward = [], []
    for it in range(a.warmup + a.iters):
        leaf = qkv.clone().requires_grad_(True)
        q, k, v = (t.view(B, T, NH, C // NH).transpose(1, 2) for t in leaf.split(C, dim=2))
        t0 = time.perf_counter()
        y = attend(q, k, v, sdpa)
        t1 = time.perf_counter()
        y.backward(dout)
        t2 = time.perf_counter()
        if it >= a.warmup:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
    print(f"torch: batch={B} seq={T} embd={C} heads={NH} threads={a.threads} iters={a.iters} "
          f"forward_ms={1e3 * statistics.median(forward):.3f} backward_ms={1e3 * statistics.median(backward):.3f} "
          f"attention={'sdpa' if sdpa else 'explicit'} version={torch.__version__}")


if __name__ == "__main__":
    main()
