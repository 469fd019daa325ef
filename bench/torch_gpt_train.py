#!/usr/bin/python3
"""GPT-2 training steps in PyTorch, the peer of pstar's training benchmarks.

Used by bench/cpu_train_vs_pytorch.sh (CPU, fp32, eager) and
bench/gpu_in_memory.sh (GPU, bf16 autocast, eager and torch.compile); the
model class is also imported by bench/torch_fsdp_offload.py.

The model is pstar's GPT-2: learned position embeddings, pre-LayerNorm blocks,
causal attention, tanh GELU, tied input/output embeddings, biases on every
linear layer, cross-entropy on every position. AdamW with weight decay on
matrices and embeddings only, global-norm clipping at 1.0. Tokens come from a
random stream (the token values do not change the work).

Prints one line:
  torch: steps=N tokens_per_s=X final_loss=Y mode=eager|compile device=D dtype=T ...
where tokens_per_s covers the steps after the first --warmup steps (1 by
default, as pstar's summary). When the run cannot be made here (no CUDA
device, no torch.compile, out of memory) it prints
  torch: unavailable: REASON      (exit 3)
  torch: failed: REASON           (exit 4)
so callers can tell "not measured" from a result.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (n_layer, n_head, n_embd, vocab_size, max_seq_len), as pstar's presets.
SHAPES = {
    "124m": (12, 12, 768, 50257, 1024),
    "350m": (24, 16, 1024, 50257, 1024),
}

EXIT_UNAVAILABLE = 3
EXIT_FAILED = 4


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, C, NH, attention):
        super().__init__()
        self.NH = NH
        self.attention = attention
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def attend(self, q, k, v):
        T, hs = q.size(-2), q.size(-1)
        if self.attention == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # Explicit form: the T x T scores are materialized.
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return att @ v

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, hs).transpose(1, 2)
        k = k.view(B, T, self.NH, hs).transpose(1, 2)
        v = v.view(B, T, self.NH, hs).transpose(1, 2)
        y = self.attend(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """No buffers: positions are made on the input's device, so the module can
    be built on any device or sharded without extra state."""

    def __init__(self, L, NH, C, V, T, attention="explicit", checkpoint=False):
        super().__init__()
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH, attention) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            if self.checkpoint and torch.is_grad_enabled():
                # Keep only each block's input; recompute the block in backward.
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(b, x, use_reentrant=False)
            else:
                x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def count_params(model):
    return sum(p.numel() for p in model.parameters())


def make_adamw(model, device, fused):
    """AdamW as GPT-2 training sets it up; fused on CUDA where this PyTorch has it."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    kwargs = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kwargs), "fused"
        except (TypeError, RuntimeError, ValueError):
            pass
    return torch.optim.AdamW(groups, **kwargs), "default"


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=sorted(SHAPES), help="GPT-2 shape; explicit shape flags override it")
    for name in ("layers", "heads", "embd", "vocab"):
        ap.add_argument("--" + name, type=int)
    ap.add_argument("--seq", type=int, help="tokens per sequence (default: the shape's max_seq_len)")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=1, help="first steps left out of tokens_per_s")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                    help="bf16: autocast of the matrix work, fp32 weights and optimizer (auto: bf16 on cuda)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--attention", choices=("auto", "sdpa", "explicit"), default="auto",
                    help="auto: scaled_dot_product_attention where this PyTorch has it")
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    a = ap.parse_args(argv)
    shape = list(SHAPES[a.model]) if a.model else [None] * 5
    for i, name in enumerate(("layers", "heads", "embd", "vocab")):
        if getattr(a, name) is not None:
            shape[i] = getattr(a, name)
    if a.seq is not None and (shape[4] is None or a.model is None):
        shape[4] = a.seq
    if None in shape:
        ap.error("give --model or all of --layers --heads --embd --vocab --seq")
    a.shape = tuple(shape)
    a.seq = a.seq or shape[4]
    if a.seq > shape[4]:
        ap.error(f"--seq {a.seq} is longer than the shape's max_seq_len {shape[4]}")
    if a.warmup < 0 or a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    if a.dtype == "auto":
        a.dtype = "bf16" if a.device == "cuda" else "fp32"
    if a.attention == "auto":
        a.attention = "sdpa" if has_sdpa() else "explicit"
    elif a.attention == "sdpa" and not has_sdpa():
        ap.error(f"PyTorch {torch.__version__} has no scaled_dot_product_attention")
    return a


def unavailable(reason):
    print(f"torch: unavailable: {reason}", flush=True)
    sys.exit(EXIT_UNAVAILABLE)


def make_step(model, step_model, opt, data, dtype, device):
    """Training step s on batch s of data (steps x batch x seq+1 tokens): the
    loss of step_model (the model, or its torch.compile), bf16 autocast of the
    matrix work where dtype says so, backward, global-norm clipping at 1.0,
    the optimizer; returns the loss."""
    def step(s):
        opt.zero_grad(set_to_none=True)
        x, y = data[s, :, :-1], data[s, :, 1:]
        if dtype == "bf16":
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = step_model(x, y)
        else:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss
    return step


def timed_steps(step, steps, warmup, tokens_per_step, device):
    """Runs step(s) for s < steps, each waited for (its loss read, as pstar's
    step reads its loss); returns the tokens/s of the steps after the first
    `warmup` and the last loss. Exits with "torch: failed" on an error of the
    run (out of memory among them)."""
    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    steady_time, steady_tokens, loss_value = 0.0, 0, 0.0
    try:
        for s in range(steps):
            sync()
            t0 = time.perf_counter()
            loss_value = step(s).item()
            sync()
            dt = time.perf_counter() - t0
            if s >= warmup:
                steady_time += dt
                steady_tokens += tokens_per_step
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        first = str(e).strip().split("\n")[0]
        print(f"torch: failed: {'out of memory' if 'out of memory' in str(e) else 'error'}: {first[:300]}",
              flush=True)
        sys.exit(EXIT_FAILED)
    return steady_tokens / steady_time, loss_value


def main(argv=None):
    a = parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        unavailable(f"PyTorch {torch.__version__} sees no CUDA device")
    if a.compile and not hasattr(torch, "compile"):
        unavailable(f"torch.compile needs PyTorch 2.0 or newer (this is {torch.__version__})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    L, NH, C, V, Tmax = a.shape
    dev = torch.device(a.device)
    model = GPT(L, NH, C, V, Tmax, attention=a.attention, checkpoint=a.checkpoint).to(dev)
    n_params = count_params(model)
    opt, opt_kind = make_adamw(model, dev, fused=a.device == "cuda")
    step_model = torch.compile(model) if a.compile else model
    data = torch.randint(0, V, (a.steps, a.batch, a.seq + 1), device=dev)

    step = make_step(model, step_model, opt, data, a.dtype, a.device)
    tokens_per_s, loss_value = timed_steps(step, a.steps, a.warmup, a.batch * a.seq, a.device)
    extra = ""
    if a.device == "cuda":
        extra = f" peak_mem_gib={torch.cuda.max_memory_allocated() / 2**30:.1f} gpu={torch.cuda.get_device_name(0).replace(' ', '_')}"
    print(f"torch: steps={a.steps} tokens_per_s={tokens_per_s:.1f} final_loss={loss_value:.4f} "
          f"mode={'compile' if a.compile else 'eager'} device={a.device} dtype={a.dtype} attention={a.attention} "
          f"batch={a.batch} seq={a.seq} warmup={a.warmup} params={n_params} adamw={opt_kind} "
          f"version={torch.__version__}{extra}", flush=True)


if __name__ == "__main__":
    main()
