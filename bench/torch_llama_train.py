#!/usr/bin/python3
"""Llama-family training steps in PyTorch, the peer of pstar's Llama benchmarks.

Used by bench/cpu_train_vs_pytorch.sh (CPU, fp32, eager) and
bench/gpu_in_memory.sh (GPU, bf16 autocast, eager and torch.compile: the
llama-step benchmark). The model is pstar's Llama decoder (Hugging Face's
LlamaForCausalLM math): RMSNorm without biases, rotate-half RoPE on q and k
(with Llama 3's frequency scaling where --rope-factor is given),
grouped-query attention (query head h reads kv head h // (heads / kv_heads)),
SwiGLU (down(silu(gate) * up)) and an untied classifier (or, with --tie, the
token table), no linear biases. AdamW (fused on CUDA where this PyTorch has
it) with weight decay on matrices and embeddings only, global-norm clipping
at 1.0, a constant learning rate, as the benchmarks set pstar. Tokens come
from a random stream (the token values do not change the work). Attention is
scaled_dot_product_attention where this PyTorch has it, with its grouped
heads (enable_gqa) where it takes them, else the kv heads repeated to the
query heads; written out where it has none.

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
import inspect
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt_train import make_adamw, make_step, timed_steps, unavailable  # noqa: E402  (the GPT-2 peer's, shared)


def sdpa_takes_groups():
    """Whether scaled_dot_product_attention has enable_gqa (PyTorch 2.5 and later)."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        try:
            x = torch.zeros(1, 2, 1, 8)
            F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
            return True
        except (TypeError, RuntimeError):
            return False


SDPA_GQA = sdpa_takes_groups()


class RmsNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(nn.Module):
    def __init__(self, C, NH, NKV, hs, F_, eps):
        super().__init__()
        self.NH, self.NKV, self.hs = NH, NKV, hs
        self.input_layernorm = RmsNorm(C, eps)
        self.qkv = nn.Linear(C, (NH + 2 * NKV) * hs, bias=False)  # q_proj | k_proj | v_proj
        self.o_proj = nn.Linear(NH * hs, C, bias=False)
        self.post_attention_layernorm = RmsNorm(C, eps)
        self.gate_up = nn.Linear(C, 2 * F_, bias=False)  # gate_proj | up_proj
        self.down_proj = nn.Linear(F_, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        NH, NKV, hs = self.NH, self.NKV, self.hs
        q, k, v = self.qkv(self.input_layernorm(x)).split([NH * hs, NKV * hs, NKV * hs], dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NKV, hs).transpose(1, 2)
        v = v.view(B, T, NKV, hs).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(v.dtype)
        k = (k * cos + rotate_half(k) * sin).to(v.dtype)
        if SDPA_GQA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=NKV != NH)
        elif hasattr(F, "scaled_dot_product_attention"):
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, NH * hs))
        gate, up = self.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


def inverse_frequencies(hs, theta, factor):
    """RoPE's inverse frequencies; with a factor, Llama 3's scaling (low 1, high 4, original 8192)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    if not factor:
        return inv_freq
    low, high, original = 1.0, 4.0, 8192.0
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    middle = (wavelen <= original / low) & (wavelen >= original / high)
    return torch.where(middle, (1 - smooth) * inv_freq / factor + smooth * inv_freq, scaled)


class Llama(nn.Module):
    def __init__(self, L, NH, NKV, C, hs, F_, V, theta, eps=1e-5, tie=False, rope_factor=0.0):
        super().__init__()
        self.hs, self.theta, self.rope_factor = hs, theta, rope_factor
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([Block(C, NH, NKV, hs, F_, eps) for _ in range(L)])
        self.norm = RmsNorm(C, eps)
        self.lm_head = None if tie else nn.Linear(C, V, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        inv_freq = inverse_frequencies(self.hs, self.theta, self.rope_factor)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        cos = emb.cos().float().to(idx.device)[None, None]
        sin = emb.sin().float().to(idx.device)[None, None]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        logits = x @ self.embed_tokens.weight.T if self.lm_head is None else self.lm_head(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("layers", "heads", "kv-heads", "embd", "head-dim", "intermediate", "vocab", "seq", "batch", "steps"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--theta", type=float, default=500000.0)
    ap.add_argument("--rope-factor", type=float, default=0.0, help="Llama 3's rope_scaling factor (0: none)")
    ap.add_argument("--tie", action="store_true", help="the classifier is the token table")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                    help="bf16: autocast of the matrix work, fp32 weights and optimizer (auto: bf16 on cuda)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    a = ap.parse_args(argv)
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    if a.heads % a.kv_heads != 0:
        ap.error("--kv-heads must divide --heads")
    if a.dtype == "auto":
        a.dtype = "bf16" if a.device == "cuda" else "fp32"
    if a.device == "cuda" and not torch.cuda.is_available():
        unavailable(f"PyTorch {torch.__version__} sees no CUDA device")
    if a.compile and not hasattr(torch, "compile"):
        unavailable(f"torch.compile needs PyTorch 2.0 or newer (this is {torch.__version__})")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    if a.device == "cuda":  # as the GPT-2 peer sets it
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    dev = torch.device(a.device)
    model = Llama(a.layers, a.heads, a.kv_heads, a.embd, a.head_dim, a.intermediate, a.vocab, a.theta,
                  tie=a.tie, rope_factor=a.rope_factor).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt, opt_kind = make_adamw(model, dev, fused=a.device == "cuda")
    step_model = torch.compile(model) if a.compile else model
    data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1), device=dev)

    step = make_step(model, step_model, opt, data, a.dtype, a.device)
    tokens_per_s, loss_value = timed_steps(step, a.steps, a.warmup, a.batch * a.seq, a.device)
    extra = ""
    if a.device == "cuda":
        extra = (f" peak_mem_gib={torch.cuda.max_memory_allocated() / 2**30:.1f}"
                 f" gpu={torch.cuda.get_device_name(0).replace(' ', '_')}")
    print(f"torch: steps={a.steps} tokens_per_s={tokens_per_s:.1f} final_loss={loss_value:.4f} "
          f"mode={'compile' if a.compile else 'eager'} device={a.device} dtype={a.dtype} "
          f"attention={'sdpa-gqa' if SDPA_GQA else 'sdpa' if hasattr(F, 'scaled_dot_product_attention') else 'explicit'} "
          f"batch={a.batch} seq={a.seq} warmup={a.warmup} params={n_params} adamw={opt_kind} "
          f"version={torch.__version__}{extra}", flush=True)


if __name__ == "__main__":
    main()
