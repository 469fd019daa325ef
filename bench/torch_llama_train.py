#!/usr/bin/python3
"""Llama-family training steps in PyTorch, the peer of pstar's Llama benchmarks.

Used by bench/cpu_train_vs_pytorch.sh (CPU, fp32, eager). The model is
pstar's Llama decoder (Hugging Face's LlamaForCausalLM math): RMSNorm without
biases, rotate-half RoPE on q and k, grouped-query attention (query head h
reads kv head h // (heads / kv_heads)), SwiGLU (down(silu(gate) * up)) and an
untied classifier, no linear biases. AdamW with weight decay on matrices and
embeddings only, global-norm clipping at 1.0. Tokens come from a random stream
(the token values do not change the work). Attention is
scaled_dot_product_attention where this PyTorch has it (its kv heads repeated
to the query heads), else written out.

Prints one line:
  torch: steps=N tokens_per_s=X final_loss=Y mode=eager device=D dtype=T ...
where tokens_per_s covers the steps after the first --warmup steps (1 by
default, as pstar's summary).
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


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
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            y = att.masked_fill(~causal, float("-inf")).softmax(dim=-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, NH * hs))
        gate, up = self.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
        return x + self.down_proj(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, NH, NKV, C, hs, F_, V, theta, eps=1e-5):
        super().__init__()
        self.hs, self.theta = hs, theta
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([Block(C, NH, NKV, hs, F_, eps) for _ in range(L)])
        self.norm = RmsNorm(C, eps)
        self.lm_head = nn.Linear(C, V, bias=False)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.hs, 2, dtype=torch.float64) / self.hs))
        angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq
        emb = torch.cat((angles, angles), dim=-1)
        cos = emb.cos().float().to(idx.device)[None, None]
        sin = emb.sin().float().to(idx.device)[None, None]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("layers", "heads", "kv-heads", "embd", "head-dim", "intermediate", "vocab", "seq", "batch", "steps"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--theta", type=float, default=500000.0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Llama(a.layers, a.heads, a.kv_heads, a.embd, a.head_dim, a.intermediate, a.vocab, a.theta)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    data = torch.randint(0, a.vocab, (a.steps, a.batch, a.seq + 1))
    steady_time, steady_tokens, loss_value = 0.0, 0, 0.0
    for s in range(a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(data[s, :, :-1], data[s, :, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        dt = time.perf_counter() - t0
        if s >= a.warmup:
            steady_time += dt
            steady_tokens += a.batch * a.seq
    print(f"torch: steps={a.steps} tokens_per_s={steady_tokens / steady_time:.1f} final_loss={loss_value:.4f} "
          f"mode=eager device=cpu dtype=fp32 batch={a.batch} seq={a.seq} warmup={a.warmup} params={n_params} "
          f"version={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
