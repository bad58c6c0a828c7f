#!/usr/bin/env python3
"""PyTorch CPU reference for bench/cpu_train.sh: the same small GPT-2 as
bench/cpu_train.c (pre-LayerNorm blocks, learned positions, GELU tanh, tied
embeddings, vocabulary padded to a multiple of 128; the cross-entropy runs
over the padded columns, see GPT.forward), float32, the same batch
shape, AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on >= 2-D
parameters) with global-norm clipping at 1.0, on the same number of threads.

Written the way a PyTorch user would (nn.Linear, nn.LayerNorm, eager mode);
scaled_dot_product_attention is used where the installed torch has it
(>= 2.0), otherwise explicit masked softmax attention. Warm-up steps are not
timed. Prints

  torch tokens/s=... step_ms=... cpu_ms_per_step=... peak_rss_mb=... loss0=... loss=...
"""
import argparse
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, layers, d, heads, seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        # GPT-2's init, as colossal's registry does it: N(0, 0.02), residual
        # projections scaled by 1/sqrt(2 L), zero biases, unit norm weights.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        # Over the padded vocabulary, as nanoGPT does: slicing to the real
        # 50257 columns first would add a 400 MB copy each way and slow torch
        # down; the padding rows only change the loss's normaliser slightly.
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    vpad = (a.vocab + 127) // 128 * 128
    model = GPT(vpad, a.layers, a.d_model, a.heads, a.seq)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8)
    data = torch.randint(0, a.vocab, (a.batch * a.seq + 1,))
    idx, tgt = data[:-1].view(a.batch, a.seq), data[1:].view(a.batch, a.seq)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    loss0 = None
    for _ in range(a.warmup):
        l = step()
        loss0 = l if loss0 is None else loss0
    c0, t0 = cpu_seconds(), time.perf_counter()
    for _ in range(a.steps):
        l = step()
        loss0 = l if loss0 is None else loss0
    dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
    n = a.batch * a.seq
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    nparams = sum(p.numel() for p in model.parameters())
    print(f"torch: {torch.__version__}, {torch.get_num_threads()} threads, {nparams} params (tied), "
          f"GPT-2 L={a.layers} d={a.d_model} T={a.seq} B={a.batch} vocab {a.vocab} (padded {vpad})")
    print(f"torch tokens/s={n * a.steps / dt:.1f} step_ms={1e3 * dt / a.steps:.1f} "
          f"cpu_ms_per_step={1e3 * dc / a.steps:.1f} peak_rss_mb={rss:.1f} "
          f"loss0={loss0:.4f} loss={l:.4f} steps={a.steps} warmup={a.warmup}")


if __name__ == "__main__":
    main()
