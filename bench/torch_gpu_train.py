#!/usr/bin/env python3
"""PyTorch GPU training-step reference for bench/gpu_train.sh and
bench/gpu_scaling.sh (issues #10 and #9).

An independent GPT-2 (pre-LayerNorm, learned positions, GELU tanh, biases,
tied head) and Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention,
untied head, no biases), written the way a PyTorch user writes them
(nanoGPT style): f32 parameters, bf16 autocast, F.scaled_dot_product_attention
(flash attention on a GPU), fused AdamW (betas 0.9/0.95, eps 1e-8, weight
decay 0.1 on matrices) and global-norm clipping at 1.0 -- the same step
colossal-pretrain takes. The model shape and batch come from the same YAML
file colossal-pretrain reads (bench/configs/*.yaml: model.*,
train.micro_batch, train.seq_len), so both sides train the same model.

    python3 bench/torch_gpu_train.py --config bench/configs/gpt2-124m.yaml --mode compile
    python3 -m torch.distributed.run --nproc_per_node 2 bench/torch_gpu_train.py --config ... (DDP)
    python3 bench/torch_gpu_train.py --tiny --device cpu --dtype f32      (checks the script)

Data: random token ids on the device (a few fixed batches, cycled), so no
input pipeline is timed. Every step ends with loss.item() (a device
synchronisation), as colossal's step does; tokens/s = batch x seq x ranks /
median step time over the timed steps (the warm-up steps, which include
torch.compile's compilation, are not timed).

MFU (stated in the output): FLOPs per token = 6 N + 12 L T d, where N counts
every parameter that takes part in a matmul -- all parameters except the
token and position embedding tables, plus the LM head matrix (V_padded x d)
even when it is tied -- and 12 L T d is the attention score and value
matmuls over the full T x T square (PaLM's convention; llm.c and nanoGPT use
6 N + 12 L H Q T, the same number as H Q = d). This is exactly
colossal-pretrain's formula (apps/pretrain_report.c), so the two MFUs are
comparable; "MFU 6N" drops the attention term. The peak is --peak-tflops per
GPU (989: H100/H200 dense bf16).

The last line is machine-readable:
  RESULT {"impl": "torch-eager", "tokens_per_s": ..., "mfu": ..., "mfu_6n": ..., ...}
"""
import argparse
import inspect
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------- config

def read_yaml(path):
    """The two-level subset of YAML the bench configs use (section: then
    indented key: value, comments, top-level key: value), so no PyYAML is
    needed. Values are returned as strings."""
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            key, _, val = line.strip().partition(":")
            val = val.strip().strip('"').strip("'")
            if indent == 0:
                if val:
                    out[key] = val
                    section = None
                else:
                    section = key
            elif section:
                out[section + "." + key] = val
    return out


def model_config(args):
    """Model shape and batch: --tiny, else the YAML file, else GPT-2 124M;
    explicit flags override."""
    c = {"family": "gpt2", "n_layers": 12, "d_model": 768, "n_heads": 12, "n_kv_heads": 0, "ffn_hidden": 0,
         "vocab_size": 50257, "tie": None, "rope_theta": 10000.0, "norm_eps": 1e-5, "batch": 32, "seq": 1024}
    if args.config:
        y = read_yaml(args.config)
        m = {"model.family": ("family", str), "model.n_layers": ("n_layers", int), "model.d_model": ("d_model", int),
             "model.n_heads": ("n_heads", int), "model.n_kv_heads": ("n_kv_heads", int),
             "model.ffn_hidden": ("ffn_hidden", int), "model.vocab_size": ("vocab_size", int),
             "model.rope_theta": ("rope_theta", float), "model.norm_eps": ("norm_eps", float),
             "train.micro_batch": ("batch", int), "train.seq_len": ("seq", int)}
        for k, (name, typ) in m.items():
            if k in y:
                c[name] = typ(y[k])
        if y.get("model.tie_embeddings", "auto") != "auto":
            c["tie"] = y["model.tie_embeddings"] == "true"
        if c["rope_theta"] == 0:
            c["rope_theta"] = 10000.0
        if c["norm_eps"] == 0:
            c["norm_eps"] = 1e-5
    if args.tiny:
        c.update(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2 if c["family"] == "llama" else 0, ffn_hidden=0,
                 batch=4, seq=64)
    for name in ("family", "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "batch", "seq"):
        v = getattr(args, name, None)
        if v is not None:
            c[name] = v
    llama = c["family"] == "llama"
    if not c["n_kv_heads"]:
        c["n_kv_heads"] = c["n_heads"]
    if not c["ffn_hidden"]:  # colossal's defaults (src/model/model.c)
        c["ffn_hidden"] = (8 * c["d_model"] // 3 + 255) // 256 * 256 if llama else 4 * c["d_model"]
    if c["tie"] is None:
        c["tie"] = not llama
    c["vocab_padded"] = (c["vocab_size"] + 127) // 128 * 128  # colossal's vocab_multiple 128
    return c


# ----------------------------------------------------------------- models

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
SDPA_GQA = False  # set by main() from _sdpa_has_gqa()


def _sdpa_has_gqa():
    if not HAS_SDPA:
        return False
    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try a call
        try:
            q = torch.zeros(1, 2, 2, 4)
            F.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
            return True
        except (TypeError, RuntimeError):
            return False


def attention(q, k, v, gqa_expand):
    """Causal attention over [B, H, T, hd]; k and v may have fewer heads.
    GQA expands K/V to every query head first (Hugging Face Llama's
    repeat_kv): SDPA then takes its flash kernel for sure, whereas
    enable_gqa (--gqa native) is served by fewer backends."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1 and (gqa_expand or not SDPA_GQA):
        B, Hkv, T, hd = k.shape
        k = k[:, :, None].expand(B, Hkv, rep, T, hd).reshape(B, Hkv * rep, T, hd)
        v = v[:, :, None].expand(B, Hkv, rep, T, hd).reshape(B, Hkv * rep, T, hd)
    if HAS_SDPA:
        if rep > 1 and not gqa_expand and SDPA_GQA:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (only for checking the script on an old CPU torch)
    T = q.shape[2]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.float().masked_fill(mask, float("-inf")), dim=-1).to(v.dtype) @ v


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, c, gqa_expand):
        super().__init__()
        d, llama = c["d_model"], c["family"] == "llama"
        self.llama, self.H, self.Hkv, self.hd = llama, c["n_heads"], c["n_kv_heads"], d // c["n_heads"]
        self.gqa_expand = gqa_expand
        bias = not llama
        norm = (lambda: RMSNorm(d, c["norm_eps"])) if llama else (lambda: nn.LayerNorm(d, eps=c["norm_eps"]))
        self.ln_1, self.ln_2 = norm(), norm()
        self.qkv = nn.Linear(d, (self.H + 2 * self.Hkv) * self.hd, bias=bias)
        self.proj = nn.Linear(self.H * self.hd, d, bias=bias)
        f = c["ffn_hidden"]
        self.fc = nn.Linear(d, f, bias=bias)           # GPT-2's fc, Llama's gate
        self.up = nn.Linear(d, f, bias=False) if llama else None
        self.mlp_proj = nn.Linear(f, d, bias=bias)

    def attn(self, x, rope):
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split([self.H * self.hd, self.Hkv * self.hd, self.Hkv * self.hd], dim=-1)
        q = q.view(B, T, self.H, self.hd).transpose(1, 2)
        k = k.view(B, T, self.Hkv, self.hd).transpose(1, 2)
        v = v.view(B, T, self.Hkv, self.hd).transpose(1, 2)
        if rope is not None:
            # The tables in q's dtype: an f32 table would promote q and k to
            # f32 under autocast and keep SDPA off its flash kernel.
            cos, sin = rope[0][:T].to(q.dtype), rope[1][:T].to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        y = attention(q, k, v, self.gqa_expand)
        return self.proj(y.transpose(1, 2).reshape(B, T, self.H * self.hd))

    def forward(self, x, rope):
        x = x + self.attn(self.ln_1(x), rope)
        h = self.ln_2(x)
        if self.llama:
            h = F.silu(self.fc(h)) * self.up(h)
        else:
            h = F.gelu(self.fc(h), approximate="tanh")
        return x + self.mlp_proj(h)


class LM(nn.Module):
    def __init__(self, c, gqa_expand=False):
        super().__init__()
        d, V, L = c["d_model"], c["vocab_padded"], c["n_layers"]
        self.llama = c["family"] == "llama"
        self.wte = nn.Embedding(V, d)
        self.wpe = None if self.llama else nn.Embedding(c["seq"], d)
        self.h = nn.ModuleList(Block(c, gqa_expand) for _ in range(L))
        self.ln_f = RMSNorm(d, c["norm_eps"]) if self.llama else nn.LayerNorm(d, eps=c["norm_eps"])
        self.lm_head = nn.Linear(d, V, bias=False)
        if c["tie"]:
            self.lm_head.weight = self.wte.weight
        if self.llama:
            hd = d // c["n_heads"]
            inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            ang = torch.outer(torch.arange(c["seq"], dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("rope_cos", ang.cos().float(), persistent=False)
            self.register_buffer("rope_sin", ang.sin().float(), persistent=False)
        # GPT-2's init, as colossal's registry does it: N(0, 0.02), residual
        # projections scaled by 1/sqrt(2 L), zero biases, unit norm weights.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(T, device=idx.device))
        rope = (self.rope_cos, self.rope_sin) if self.llama else None
        for b in self.h:
            x = b(x, rope)
        logits = self.lm_head(self.ln_f(x))
        # Over the padded vocabulary, as nanoGPT and llm.c do (targets are
        # always real ids); autocast computes the cross-entropy in f32.
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def matmul_params(model, c):
    """N of 6 N: every parameter except the token/position tables, plus the
    LM head even when tied (colossal-pretrain's count)."""
    n = 0
    for name, p in model.named_parameters():
        if name not in ("wte.weight", "wpe.weight"):
            n += p.numel()
    if c["tie"]:
        n += c["vocab_padded"] * c["d_model"]
    return n


# ----------------------------------------------------------------- main

def main():
    global SDPA_GQA
    SDPA_GQA = _sdpa_has_gqa()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="bench/configs/*.yaml (model.*, train.micro_batch, train.seq_len)")
    ap.add_argument("--tiny", action="store_true", help="2 layers, d_model 64, batch 4 x 64 (checking the script)")
    ap.add_argument("--family", choices=["gpt2", "llama"])
    ap.add_argument("--n-layers", dest="n_layers", type=int)
    ap.add_argument("--d-model", dest="d_model", type=int)
    ap.add_argument("--n-heads", dest="n_heads", type=int)
    ap.add_argument("--n-kv-heads", dest="n_kv_heads", type=int)
    ap.add_argument("--ffn-hidden", dest="ffn_hidden", type=int)
    ap.add_argument("--vocab-size", dest="vocab_size", type=int)
    ap.add_argument("--batch", type=int, help="sequences per GPU (default: train.micro_batch)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default: train.seq_len)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--compile-mode", default=None, help="torch.compile mode (default: its default)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16", help="autocast dtype (f32: no autocast)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="per GPU, for MFU")
    ap.add_argument("--gqa", choices=["expand", "native"], default="expand",
                    help="GQA: expand K/V heads before SDPA (default, as Hugging Face Llama does) or SDPA's "
                         "enable_gqa (torch >= 2.5)")
    ap.add_argument("--sdpa-backend", choices=["auto", "flash", "cudnn", "efficient"], default="auto",
                    help="force one SDPA backend (auto: PyTorch's choice, flash for these shapes)")
    ap.add_argument("--tag", default="", help="copied into the RESULT line")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    # torch.distributed.run sets these; a plain launch is one rank.
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = a.device.startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            sys.exit("torch_gpu_train.py: no CUDA device visible (use --device cpu to check the script)")
        dev = torch.device("cuda", local if world > 1 else torch.cuda.current_device())
        torch.cuda.set_device(dev)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        dev = torch.device("cpu")
    if world > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
    c = model_config(a)
    torch.manual_seed(a.seed + rank)
    if hasattr(torch.device, "__enter__"):  # torch >= 2.0: initialise on the device (1B: seconds on a CPU)
        with dev:
            model = LM(c, a.gqa == "expand")
    else:
        model = LM(c, a.gqa == "expand").to(dev)
    N = matmul_params(model, c)
    nparams = sum(p.numel() for p in model.parameters())
    L, T, d, B = c["n_layers"], c["seq"], c["d_model"], c["batch"]
    flops_tok = 6 * N + 12 * L * T * d
    flops_tok_6n = 6 * N

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    okw = {}
    adam_params = inspect.signature(torch.optim.AdamW).parameters
    if cuda and "fused" in adam_params:
        okw["fused"] = True
    elif "foreach" in adam_params:
        okw["foreach"] = True
    opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, **okw)

    run = model
    if a.mode == "compile":
        if not hasattr(torch, "compile"):
            sys.exit("torch_gpu_train.py: --mode compile needs torch >= 2.0 (this is %s)" % torch.__version__)
        run = torch.compile(model, **({"mode": a.compile_mode} if a.compile_mode else {}))
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP
        run = DDP(run, device_ids=[dev.index] if cuda else None)

    g = torch.Generator(device="cpu").manual_seed(a.seed * 1000 + rank)
    batches = []
    for _ in range(4):
        t = torch.randint(0, c["vocab_size"], (B, T + 1), generator=g)
        batches.append((t[:, :-1].contiguous().to(dev), t[:, 1:].contiguous().to(dev)))
    use_amp = a.dtype == "bf16"
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=use_amp)

    sdpa_ctx = None
    if a.sdpa_backend != "auto":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        sdpa_ctx = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION}[a.sdpa_backend]

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with amp:
            if sdpa_ctx is not None:
                from torch.nn.attention import sdpa_kernel
                with sdpa_kernel(sdpa_ctx):
                    loss = run(x, y)
            else:
                loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # synchronises, as colossal's step does

    impl = "torch-" + a.mode + ("-ddp%d" % world if world > 1 else "")
    if rank == 0:
        print("%s: torch %s, %s, %d rank%s; %s %d layers, d_model %d, %d heads (%d kv), ffn %d, vocab %d "
              "(padded %d), %s: %.2fM parameters, N = %.2fM matmul parameters; batch %d x %d per rank, %s%s"
              % (impl, torch.__version__, torch.cuda.get_device_name(dev) if cuda else "cpu", world,
                 "" if world == 1 else "s", c["family"], L, d, c["n_heads"], c["n_kv_heads"], c["ffn_hidden"],
                 c["vocab_size"], c["vocab_padded"], "tied" if c["tie"] else "untied", nparams / 1e6, N / 1e6, B, T,
                 "bf16 autocast" if use_amp else "f32", ", fused AdamW" if okw.get("fused") else ""), flush=True)
        print("flops: %.4g per token = 6 x %.4gM + 12 x %d layers x %d tokens x %d d_model (6N alone: %.4g); "
              "peak %g TFLOP/s per GPU" % (flops_tok, N / 1e6, L, T, d, flops_tok_6n, a.peak_tflops), flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t_start = time.perf_counter()
    losses, times = [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        losses.append(step(i))
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
        elif rank == 0:
            print("warm-up step %d: %.3f s, loss %.4f" % (i + 1, dt, losses[-1]), flush=True)
    total = time.perf_counter() - t_start
    if world > 1:  # the slowest rank's median step decides
        import torch.distributed as dist
        t = torch.tensor([statistics.median(times)], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        med = t.item()
    else:
        med = statistics.median(times)
    tok_step = B * T * world
    tps = tok_step / med
    peak = a.peak_tflops * 1e12 * world
    res = {"impl": impl, "tag": a.tag, "model": c["family"], "n_layers": L, "d_model": d, "batch": B, "seq": T,
           "ranks": world, "params": nparams, "matmul_params": N, "flops_per_token": flops_tok,
           "flops_per_token_6n": flops_tok_6n, "peak_flops": peak, "steps": a.steps, "warmup": a.warmup,
           "step_s_median": med, "step_s_mean": sum(times) / len(times), "step_s_min": min(times),
           "tokens_per_step": tok_step, "tokens_per_s": tps,
           "tokens_per_s_mean": tok_step * len(times) / sum(times),
           "mfu": tps * flops_tok / peak, "mfu_6n": tps * flops_tok_6n / peak,
           "loss_first": losses[0], "loss_last": losses[-1], "wall_s": total, "torch": torch.__version__}
    if cuda:
        res["peak_alloc_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        res["peak_reserved_mib"] = torch.cuda.max_memory_reserved(dev) / 2**20
    res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    if rank == 0:
        print("%s: %d timed steps after %d warm-up: median %.1f ms/step (mean %.1f, min %.1f) -> %.0f tokens/s, "
              "MFU %.1f%% (6N: %.1f%%); loss %.4f -> %.4f; peak memory %s"
              % (impl, a.steps, a.warmup, 1e3 * med, 1e3 * res["step_s_mean"], 1e3 * res["step_s_min"], tps,
                 100 * res["mfu"], 100 * res["mfu_6n"], losses[0], losses[-1],
                 "%.0f MiB allocated, %.0f MiB reserved" % (res["peak_alloc_mib"], res["peak_reserved_mib"])
                 if cuda else "%.0f MiB RSS" % res["peak_rss_mib"]), flush=True)
        print("RESULT " + json.dumps(res), flush=True)
    if world > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
