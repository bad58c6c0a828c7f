#!/usr/bin/env python3
"""Independent PyTorch reference for colossal's LoRA (docs/sft.md "LoRA").

Reads what tests/parity/lora_parity wrote: a tiny GPT-2 and a tiny Llama (the
base weights by colossal's canonical names), the adapters by Hugging Face
module name, a batch with ignored targets, and colossal's logits, loss and
adapter gradients. Rebuilds each model in float64 the way transformers runs
it -- Llama's q_proj / k_proj / v_proj as three linears (cut from the fused
weight), GPT-2's c_attn one -- with a LoRA linear written here as PEFT
defines it (y = x W^T + b + alpha/r * (x A^T) B^T, bias none, no dropout),
the base weights frozen (requires_grad False) and A, B trained, and checks:

  logits (real vocabulary), loss, and every adapter's A and B gradient.

Metrics as torch_reference.py's: norm = ||a-b|| / ||b|| and elem = max|a-b| /
max|b|, both <= 1e-5 (colossal computes in float32).
Usage: lora_reference.py FILE.safetensors [--tol 1e-5]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import (causal_attention, f32, gelu_tanh, layer_norm,  # noqa: E402
                             read_safetensors, rms_norm, rope_tables, rotate_half)

DT = torch.float64


class LoraModel:
    def __init__(self, fam, t, meta):
        g = lambda k: meta[f"{fam}.{k}"]
        self.fam = fam
        self.V, self.L, self.C = int(g("vocab_size")), int(g("n_layers")), int(g("d_model"))
        self.H, self.Hkv, self.Fh = int(g("n_heads")), int(g("n_kv_heads")), int(g("ffn_hidden"))
        self.D = self.C // self.H
        self.eps, self.theta = f32(g("norm_eps")), f32(g("rope_theta"))
        self.tied = int(g("tie_embeddings")) == 1
        self.scale = f32(g("alpha")) / int(g("rank"))
        self.modules = g("modules").split(",")
        self.w = {k[len(fam) + 1:]: torch.tensor(v, dtype=DT) for k, v in t.items()
                  if k.startswith(fam + ".") and k.count(".") > 1 and not k.startswith(
                      (fam + ".A.", fam + ".B.", fam + ".gA.", fam + ".gB."))}
        self.A, self.B = {}, {}
        for k, v in t.items():
            for kind, d in (("A", self.A), ("B", self.B)):
                pre = f"{fam}.{kind}."
                if k.startswith(pre):
                    d[k[len(pre):]] = torch.tensor(v, dtype=DT, requires_grad=True)
        self.prefix = "transformer.h." if fam == "gpt2" else "model.layers."

    def lin(self, x, W, b, l, module):
        """A linear of HF module `module` in layer l, with its adapter if there is one."""
        y = x @ W.T
        if b is not None:
            y = y + b
        name = f"{self.prefix}{l}.{module}"
        if name in self.A:
            y = y + self.scale * ((x @ self.A[name].T) @ self.B[name].T)
        return y

    def forward(self, tokens):
        B, T = tokens.shape
        w, H, Hkv, D = self.w, self.H, self.Hkv, self.D
        x = w["wte.weight"][tokens]
        gpt2 = self.fam == "gpt2"
        if gpt2:
            x = x + w["wpe.weight"][:T]
        else:
            cos, sin = (z.to(DT) for z in rope_tables(T, D, self.theta))
        for l in range(self.L):
            p = lambda n: w[f"h.{l}.{n}"]
            if gpt2:
                h = layer_norm(x, p("ln_1.weight"), p("ln_1.bias"), self.eps)
                qkv = self.lin(h, p("attn.qkv.weight"), p("attn.qkv.bias"), l, "attn.c_attn")
                q, k, v = qkv.split([H * D, H * D, H * D], dim=-1)
            else:
                h = rms_norm(x, p("ln_1.weight"), self.eps)
                Wq, Wk, Wv = p("attn.qkv.weight").split([H * D, Hkv * D, Hkv * D], dim=0)
                q = self.lin(h, Wq, None, l, "self_attn.q_proj")
                k = self.lin(h, Wk, None, l, "self_attn.k_proj")
                v = self.lin(h, Wv, None, l, "self_attn.v_proj")
            q = q.view(B, T, H, D).transpose(1, 2)
            k = k.view(B, T, -1, D).transpose(1, 2)
            v = v.view(B, T, -1, D).transpose(1, 2)
            if not gpt2:
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                k = k.repeat_interleave(H // Hkv, dim=1)
                v = v.repeat_interleave(H // Hkv, dim=1)
            a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D)
            if gpt2:
                x = x + self.lin(a, p("attn.proj.weight"), p("attn.proj.bias"), l, "attn.c_proj")
                h = layer_norm(x, p("ln_2.weight"), p("ln_2.bias"), self.eps)
                m = gelu_tanh(self.lin(h, p("mlp.fc.weight"), p("mlp.fc.bias"), l, "mlp.c_fc"))
                x = x + self.lin(m, p("mlp.proj.weight"), p("mlp.proj.bias"), l, "mlp.c_proj")
            else:
                x = x + self.lin(a, p("attn.proj.weight"), None, l, "self_attn.o_proj")
                h = rms_norm(x, p("ln_2.weight"), self.eps)
                m = F.silu(self.lin(h, p("mlp.fc.weight"), None, l, "mlp.gate_proj")) * \
                    self.lin(h, p("mlp.up.weight"), None, l, "mlp.up_proj")
                x = x + self.lin(m, p("mlp.proj.weight"), None, l, "mlp.down_proj")
        if gpt2:
            x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], self.eps)
        else:
            x = rms_norm(x, w["ln_f.weight"], self.eps)
        return x @ (w["wte.weight"] if self.tied else w["lm_head.weight"]).T


def errors(a, b):
    a, b = a.to(DT), b.to(DT)
    bn, bm = b.norm().item(), b.abs().max().item()
    norm = (a - b).norm().item() / bn if bn > 0 else (a - b).norm().item()
    elem = (a - b).abs().max().item() / bm if bm > 0 else (a - b).abs().max().item()
    return norm, elem


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    t, meta = read_safetensors(args.file)
    bad = 0
    for fam in ("gpt2", "llama"):
        m = LoraModel(fam, t, meta)
        want = {f"h.{l}.{s}" for l in range(m.L) for s in m.modules}
        if len(m.A) != len(want) or len(m.A) == 0:
            raise SystemExit(f"{fam}: {len(m.A)} adapters in the file, expected {len(want)}")
        tok = torch.tensor(t[f"{fam}.tokens"], dtype=torch.long)
        tgt = torch.tensor(t[f"{fam}.targets"], dtype=torch.long)
        logits = m.forward(tok)
        loss = F.cross_entropy(logits[..., :m.V].reshape(-1, m.V), tgt.reshape(-1), ignore_index=-100)
        loss.backward()
        rows = [("logits", torch.tensor(t[f"{fam}.logits"])[..., :m.V], logits[..., :m.V].detach()),
                ("loss", torch.tensor(t[f"{fam}.loss"]), loss.detach().reshape(1))]
        for name in sorted(m.A):
            rows.append((f"dA {name}", torch.tensor(t[f"{fam}.gA.{name}"]), m.A[name].grad))
            rows.append((f"dB {name}", torch.tensor(t[f"{fam}.gB.{name}"]), m.B[name].grad))
        worst = 0.0
        for name, ours, ref in rows:
            norm, elem = errors(ours, ref)
            worst = max(worst, norm, elem)
            if not (norm <= args.tol and elem <= args.tol):
                print(f"FAIL {fam} {name}: norm {norm:.2e} elem {elem:.2e} (tolerance {args.tol:g})")
                bad += 1
        print(f"{fam}: {len(m.A)} adapters ({meta[fam + '.modules']}); logits, loss {loss.item():.6f} and "
              f"{2 * len(m.A)} adapter gradients within {worst:.2e} of float64 PyTorch (tolerance {args.tol:g})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
