#!/usr/bin/python3
"""PyTorch's answer to pstar's offloaded training: FSDP2 with CPU offload on one GPU.

The peer of bench/gpu_offload_scale.sh. The model is bench/torch_gpt_train.py's
GPT (pstar's GPT shape). Each block and then the root are wrapped with
torch.distributed.fsdp.fully_shard, CPUOffloadPolicy (parameters, gradients
and AdamW states live in pinned host memory; the optimizer step runs on the
CPU) and MixedPrecisionPolicy (bf16 compute, fp32 gradient reduction). One
process, world size 1, over a local init_process_group (gloo for the CPU side,
NCCL for the GPU side). Activation checkpointing per block with --checkpoint,
as pstar's train.activation_checkpointing.

Before building anything it checks that this PyTorch has the API and that
the host can hold the run (16 bytes per parameter: fp32 parameter, gradient
and two Adam moments, plus --host-overhead), and otherwise prints
  fsdp: unavailable: REASON     (exit 3)
A run that fails (out of memory, an error in the API) prints
  fsdp: failed: REASON          (exit 4)
and a measured one
  fsdp: steps=N tokens_per_s=X final_loss=Y layers=L params=P ...
where tokens_per_s covers the steps after --warmup.
"""
import argparse
import os
import socket
import sys
import time

EXIT_UNAVAILABLE = 3
EXIT_FAILED = 4


def say(kind, text):
    print(f"fsdp: {kind}: {text}", flush=True)


def gpt_params(L, C, V, T):
    """Parameters of the GPT (pstar's GptConfig::NumParameters)."""
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C


def host_budget_default():
    """What pstar takes when runtime.host_memory is 0: cgroup v2 limit or RAM, times 0.8."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            v = f.read().strip()
        if v != "max":
            ram = min(ram, int(v))
    except OSError:
        pass
    return int(ram * 0.8)


def load_fsdp_api(torch):
    """fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, init_device_mesh, or a reason."""
    import torch.distributed as dist
    if not dist.is_available():
        return None, f"PyTorch {torch.__version__} is built without torch.distributed"
    # Public since 2.6; under _composable in 2.4 and 2.5. Any failure to
    # import (some old builds break on import) means the API is not usable.
    api, errors = None, []
    for where in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            mod = __import__(where, fromlist=["fully_shard", "CPUOffloadPolicy", "MixedPrecisionPolicy"])
            api = (mod.fully_shard, mod.CPUOffloadPolicy, mod.MixedPrecisionPolicy)
            break
        except Exception as e:  # ImportError, AttributeError, or an import-time crash
            errors.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
    if api is None:
        return None, (f"FSDP2 (fully_shard with CPUOffloadPolicy) needs PyTorch 2.4 or newer; "
                      f"this is {torch.__version__} ({'; '.join(errors)})")
    fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy = api
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except ImportError:
        return None, f"PyTorch {torch.__version__} has no torch.distributed.device_mesh"
    return (fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, init_device_mesh), None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def checkpointed_block_class():
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint

    class CheckpointedBlock(nn.Module):
        """A block that keeps only its input and recomputes itself in backward."""

        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    return CheckpointedBlock


def init_weights(model):
    """Matrices and embeddings uniform with std 0.02 (cheaper than normal
    draws at billions of parameters; the values do not change the work),
    LayerNorm scales 1, biases 0. Writes each parameter's local shard."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            if p.dim() >= 2:
                bound = 0.02 * 3 ** 0.5
                local.uniform_(-bound, bound)
            elif name.endswith("weight"):
                local.fill_(1.0)
            else:
                local.zero_()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--embd", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--checkpoint", action="store_true", help="activation checkpointing per block")
    ap.add_argument("--host-budget", type=int, default=0,
                    help="host bytes the run may use (default: 0.8 x RAM or the cgroup limit, as pstar)")
    ap.add_argument("--host-overhead", type=int, default=4 << 30,
                    help="host bytes beyond the 16 per parameter: CUDA context, libraries, staging")
    ap.add_argument("--check-only", action="store_true",
                    help="check the API and the host budget, print what would run, build nothing")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")

    L, NH, C, V, T = a.layers, a.heads, a.embd, a.vocab, a.seq
    n = gpt_params(L, C, V, T)
    budget = a.host_budget or host_budget_default()
    need = 16 * n + a.host_overhead
    shape = f"layers={L} heads={NH} embd={C} vocab={V} seq={T} params={n}"

    try:
        import torch
    except ImportError:
        say("unavailable", "no PyTorch in this python3")
        sys.exit(EXIT_UNAVAILABLE)
    api, reason = load_fsdp_api(torch)
    if api is None:
        say("unavailable", reason)
        sys.exit(EXIT_UNAVAILABLE)
    if need > budget:
        say("unavailable", f"{shape}: needs about {need / 2**30:.1f} GiB of host memory "
                           f"(16 B/param + overhead), budget {budget / 2**30:.1f} GiB")
        sys.exit(EXIT_UNAVAILABLE)
    if not torch.cuda.is_available():
        say("unavailable", f"PyTorch {torch.__version__} sees no CUDA device")
        sys.exit(EXIT_UNAVAILABLE)
    import torch.distributed as dist
    if not dist.is_nccl_available():
        say("unavailable", f"PyTorch {torch.__version__} is built without NCCL")
        sys.exit(EXIT_UNAVAILABLE)
    if a.check_only:
        say("check", f"ok: would train {shape} batch={a.batch} with FSDP2 + CPUOffloadPolicy, "
                     f"host need ~{need / 2**30:.1f} GiB of {budget / 2**30:.1f} GiB")
        return
    fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, init_device_mesh = api

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpt_train import GPT
    CheckpointedBlock = checkpointed_block_class()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.cuda.set_device(0)
    dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        torch.backends.cuda.matmul.allow_tf32 = True
        t_init = time.perf_counter()
        # Built without storage, sharded, then given (pinned) host storage
        # and initialized there: no full-size copy on either side.
        with torch.device("meta"):
            model = GPT(L, NH, C, V, T, attention="sdpa", checkpoint=False)
            if a.checkpoint:
                # Recomputation inside each sharded unit, so that FSDP's
                # gathers stay outside the checkpointed region.
                model.blocks = torch.nn.ModuleList([CheckpointedBlock(b) for b in model.blocks])
        mesh = init_device_mesh("cuda", (1,))
        policy = dict(mesh=mesh, offload_policy=CPUOffloadPolicy(pin_memory=True),
                      mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
        for block in model.blocks:
            fully_shard(block, **policy)
        fully_shard(model, **policy)
        model.to_empty(device="cpu")
        init_weights(model)
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        if not on_cpu:
            say("failed", "parameters are not on the CPU after fully_shard with CPUOffloadPolicy")
            sys.exit(EXIT_FAILED)

        def make_opt(kind):
            decay = [p for p in model.parameters() if p.dim() >= 2]
            rest = [p for p in model.parameters() if p.dim() < 2]
            groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
            flag = {"fused": True} if kind == "fused" else {"foreach": True}
            return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **flag)

        opt_kind = "fused"
        try:
            opt = make_opt(opt_kind)
        except (RuntimeError, TypeError, ValueError):
            opt_kind = "foreach"
            opt = make_opt(opt_kind)
        init_s = time.perf_counter() - t_init
        data = torch.randint(0, V, (a.steps, a.batch, T + 1), device="cuda")

        steady_time, steady_tokens, loss_value = 0.0, 0, float("nan")
        for s in range(a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(data[s, :, :-1], data[s, :, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            try:
                opt.step()
            except (RuntimeError, NotImplementedError) as e:
                if opt_kind != "fused" or s > 0:
                    raise
                # A PyTorch whose fused CPU AdamW does not take these
                # parameters: the foreach form, from the same (unstepped) state.
                print(f"fsdp: note: fused AdamW refused ({str(e).splitlines()[0][:120]}); using foreach",
                      flush=True)
                opt_kind = "foreach"
                opt = make_opt(opt_kind)
                opt.step()
            loss_value = loss.item()
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            print(f"fsdp: step {s + 1}/{a.steps} {dt:.3f}s loss {loss_value:.4f}", flush=True)
            if s >= a.warmup:
                steady_time += dt
                steady_tokens += a.batch * T
        print(f"fsdp: steps={a.steps} tokens_per_s={steady_tokens / steady_time:.1f} final_loss={loss_value:.4f} "
              f"{shape} batch={a.batch} checkpoint={int(a.checkpoint)} adamw={opt_kind} init_s={init_s:.1f} "
              f"peak_gpu_gib={torch.cuda.max_memory_allocated() / 2**30:.1f} "
              f"host_peak_gib={host_rss_bytes() / 2**30:.1f} version={torch.__version__}", flush=True)
    except (RuntimeError, MemoryError) as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        oom = "out of memory" in str(e).lower() or isinstance(e, MemoryError)
        say("failed", f"{'out of memory: ' if oom else ''}{text[:300]}")
        sys.exit(EXIT_FAILED)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
