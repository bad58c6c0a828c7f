#!/usr/bin/env python3
"""Whole-model parity of colossal on a GPU against PyTorch on the same GPU
(docs/parity.md "On GPUs"; issue #8).

Reads the file tests/parity/parity_driver writes (run with --device cuda:N and
--precision fp32 or bf16), rebuilds the model in PyTorch on --device from the
file's parameters with torch's own fused functional ops (F.linear,
F.layer_norm, F.gelu, scaled_dot_product_attention, F.cross_entropy: the
code a PyTorch user runs, written independently of colossal's C code), and
repeats everything the driver did: one forward/backward (logits, loss, every
gradient) and three AdamW steps of two microbatches each with clipping
(torch.optim.AdamW, clip_grad_norm_), then compares.

fp32 files: PyTorch in float32 with TF32 off (colossal's CUDA matmuls are
exact f32 unless CAI_CUDA_TF32=1) and attention on SDPA's math backend. Gate: colossal against torch float32,
norm = ||a-b||/||b|| and elem = max|a-b|/max|b| both <= 1e-4 for the logits,
the loss, every gradient and the per-step loss / gradient norm / lr; the
parameters after the steps norm-wise <= 1e-4 over the elements whose
gradient float32 resolves (torch_reference.unresolved_elements: a float64
run on the same device gives the noise; the others are bounded by 2 * sum of
the learning rates, as in the CPU parity test). The float64 run also prints
colossal's and torch float32's own errors against float64 for scale.

bf16 files: colossal ran with bf16 working weights and activations and f32
masters (colossal-pretrain's precision: bf16). PyTorch runs the same f32
parameters under torch.autocast(bfloat16) -- what a PyTorch user's bf16
training does, with whatever SDPA kernel torch picks -- and, as the
yardstick, in float32 (math backend). Both bf16 runs carry
rounding errors of their own, placed differently (autocast rounds matmul
inputs and outputs but keeps norms, softmax, the loss and the residual
stream in f32; colossal also stores activations, norm weights and biases in
bf16), so neither is the reference for the other. The gate is the error
against the float32 run: for each tensor colossal's error must be at most
max(floor, 4 x PyTorch autocast's error on the same tensor) -- "as accurate
as PyTorch's bf16 up to a small factor". Floors: logits and gradients 3e-2
(norm) / 5e-2 (elem); loss and per-step losses 1e-2 relative; gradient norm
3e-2; parameters after the steps 1e-2 norm-wise. Why these: one bf16
rounding is up to 2^-9 = 2e-3 relative; a 2-layer model chains ~10 rounded
activations forward and as many backward, giving ~1e-2 norm-wise and a few
times that for the largest element; AdamW moves each element by at most
~lr per step whatever its gradient's accuracy, so after 3 steps parameters
differ by at most ~5e-3 absolute (about 1e-2 of the 0.08 matrix scale where
gradient signs flip). The direct colossal-vs-autocast error is printed too.

Usage: model_parity.py FILE [--device cuda|cpu] [--tol 1e-4] [--factor 4]
Needs torch and numpy. Exit 0 pass, 1 fail.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import torch_reference as tr  # noqa: E402  (safetensors reader, parameter names, unresolved_elements)


def rms_norm(x, w, eps):
    # HF LlamaRMSNorm: statistics in f32, then the weight.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def rope_tables(T, D, theta, device):
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64, device=device) / D))
    ang = torch.outer(torch.arange(T, dtype=torch.float64, device=device), inv_freq)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos(), emb.sin()


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (the development machine's CPU torch): the same by hand.
    T, D = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v


def exact_attention(on):
    """on: scaled_dot_product_attention takes its math backend (matmuls, TF32
    off: exact f32/f64) for the float32/float64 references; off: torch picks
    (flash / memory-efficient / cuDNN kernels), as a bf16 user run would."""
    b = torch.backends.cuda
    for name in ("enable_flash_sdp", "enable_mem_efficient_sdp", "enable_cudnn_sdp"):
        if hasattr(b, name):
            getattr(b, name)(not on)


class Model(tr.Reference):
    """The parity model on `device` in `dtype`, parameters keyed by canonical
    name (tr.Reference checks the names, shapes and the tie); `autocast`:
    forward under torch.autocast(bfloat16)."""

    def __init__(self, meta, tensors, dtype, device, autocast=False):
        super().__init__(meta, tensors, dtype)
        self.device, self.autocast = device, autocast
        self.p = {n: t.detach().to(device).requires_grad_(True) for n, t in self.p.items()}

    def forward(self, tokens, targets):
        if self.autocast:
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                return self._forward(tokens, targets)
        return self._forward(tokens, targets)

    def _forward(self, tokens, targets):
        B, T = tokens.shape
        p, H, Hkv, D, C = self.p, self.H, self.Hkv, self.D, self.C
        gpt2 = self.family == "gpt2"
        x = F.embedding(tokens, p["wte.weight"])
        if gpt2:
            x = x + p["wpe.weight"][:T]
        else:
            cos, sin = rope_tables(T, D, self.theta, self.device)
        for l in range(self.L):
            pre = f"h.{l}."
            if gpt2:
                h = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], self.eps)
                qkv = F.linear(h, p[pre + "attn.qkv.weight"], p[pre + "attn.qkv.bias"])
            else:
                h = rms_norm(x, p[pre + "ln_1.weight"], self.eps)
                qkv = F.linear(h, p[pre + "attn.qkv.weight"])
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
            q = q.reshape(B, T, H, D).transpose(1, 2)
            k = k.reshape(B, T, Hkv, D).transpose(1, 2)
            v = v.reshape(B, T, Hkv, D).transpose(1, 2)
            if not gpt2:
                c, s = cos.to(q.dtype), sin.to(q.dtype)
                q = q * c + tr.rotate_half(q) * s
                k = k * c + tr.rotate_half(k) * s
                k = k.repeat_interleave(H // Hkv, dim=1)  # query head h reads kv head h // (H / Hkv)
                v = v.repeat_interleave(H // Hkv, dim=1)
            a = attention(q, k.to(q.dtype), v.to(q.dtype)).transpose(1, 2).reshape(B, T, H * D)
            x = x + F.linear(a, p[pre + "attn.proj.weight"], p[pre + "attn.proj.bias"] if gpt2 else None)
            if gpt2:
                h = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], self.eps)
                m = F.gelu(F.linear(h, p[pre + "mlp.fc.weight"], p[pre + "mlp.fc.bias"]), approximate="tanh")
                m = F.linear(m, p[pre + "mlp.proj.weight"], p[pre + "mlp.proj.bias"])
            else:
                h = rms_norm(x, p[pre + "ln_2.weight"], self.eps)
                m = F.silu(F.linear(h, p[self.gate_name(l)])) * F.linear(h, p[pre + "mlp.up.weight"])
                m = F.linear(m, p[pre + "mlp.proj.weight"])
            x = x + m
        if gpt2:
            x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], self.eps)
        else:
            x = rms_norm(x, p["ln_f.weight"], self.eps)
        logits = F.linear(x, self.head_weight())
        # (autocast runs cross_entropy in f32)
        loss = F.cross_entropy(logits[..., :self.V].reshape(-1, self.V), targets.reshape(-1), ignore_index=-100)
        return logits, loss


def run(meta, tensors, dtype, device, autocast=False):
    """Everything the driver did, in PyTorch on `device` (the CPU reference's
    loop, tr.run_reference, over this file's model). Returns ({key: float64
    array}, model, info, (per-step float64 gradients, float32 ones at the same
    parameters) -- the latter for float64 runs only)."""
    ref, out, grads, info = tr.run_reference(meta, tensors, dtype, ref=Model(meta, tensors, dtype, device, autocast),
                                             device=device)
    return out, ref, info, grads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tol", type=float, default=1e-4, help="fp32 gate")
    ap.add_argument("--factor", type=float, default=4.0, help="bf16: allowed multiple of PyTorch autocast's error")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("model_parity: SKIP: no CUDA device visible to torch")
        return 77
    # Exact f32 products on both sides (colossal: unless CAI_CUDA_TF32=1).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    torch.manual_seed(0)
    tensors, meta = tr.read_safetensors(args.file)
    prec = meta.get("precision", "fp32")
    fam = meta["family"]
    print(f"model_parity: {fam} {prec} ({meta.get('size', 'tiny')}: B={tensors['tokens'].shape[0]}, "
          f"T={tensors['tokens'].shape[1]}, d={meta['d_model']}, heads {meta['n_heads']}/{meta['n_kv_heads']}), "
          f"colossal on {meta.get('device', '?')}, torch {torch.__version__} on {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
          + (", sdpa" if hasattr(F, "scaled_dot_product_attention") else ", attention by hand"))
    if not np.isfinite(tensors["logits"]).all():
        print(f"{fam}: FAILED: colossal's logits are not all finite")
        return 1

    exact_attention(True)
    r32, ref, info, _ = run(meta, tensors, torch.float32, dev)
    names = ref.names
    keys = ["logits", "loss"] + ["grad." + n for n in names] + ["train.loss", "train.grad_norm", "train.lr"] + \
           ["step3." + n for n in names]
    ours = {k: np.asarray(tensors[k], dtype=np.float64) for k in keys}
    ours["logits"] = ours["logits"][..., :ref.V]
    failed, worst = [], {}

    def section(k):
        return "forward" if k in ("logits", "loss") else "grads" if k.startswith("grad.") else \
            "steps" if k.startswith("train.") else "params"

    if prec == "fp32":
        r64, _, _, (g64, g32) = run(meta, tensors, torch.float64, dev)
        null = tr.unresolved_elements(names, g64, g32)
        print(f"\n{'tensor':<34} {'colossal vs torch f32':^21}  {'colossal vs f64':^21}  {'torch f32 vs f64':^21}")
        print(f"{'':<34} {'norm':>10} {'elem':>10}  {'norm':>10} {'elem':>10}  {'norm':>10} {'elem':>10}")
        for k in keys:
            a, b, c = ours[k], r32[k], r64[k]
            gate_elem = not k.startswith("step3.")
            note = ""
            if k.startswith("step3."):
                m = null[k[6:]]
                if m.any():
                    dev_ = float(np.abs(a[m] - b[m]).max())
                    ok_null = dev_ <= 2.0 * info["lr_sum"]
                    note = f" [{int(m.sum())} unresolved: |diff| {dev_:.1e} {'ok' if ok_null else 'FAIL'}]"
                    if not ok_null:
                        failed.append(k + " (unresolved elements)")
                    a, b, c = a[~m], b[~m], c[~m]
            rn, re = tr.errors(a, b)
            cn, ce = tr.errors(a, c)
            tn, te = tr.errors(b, c)
            ok = rn <= args.tol and (re <= args.tol or not gate_elem)
            if not ok:
                failed.append(k)
            sec = section(k)
            worst[sec] = max(worst.get(sec, 0.0), max(rn, re) if gate_elem else rn)
            print(f"{k:<34} {rn:10.2e} {re:10.2e}{'' if gate_elem else '*'} {cn:10.2e} {ce:10.2e}  "
                  f"{tn:10.2e} {te:10.2e}  {'ok' if ok else 'FAIL'}{note}")
        gate = f"tolerance {args.tol:g} against torch f32 (TF32 off); * = norm only"
    else:
        exact_attention(False)
        rbf, _, _, _ = run(meta, tensors, torch.float32, dev, autocast=True)
        floors = {"forward": (3e-2, 5e-2), "grads": (3e-2, 5e-2), "params": (1e-2, None)}
        print(f"\nerrors against torch f32; bound = max(floor, {args.factor:g} x torch autocast's)")
        print(f"{'tensor':<34} {'colossal bf16':^21}  {'torch autocast bf16':^21}  {'bound':^21}  "
              f"{'colossal vs autocast':^21}")
        print(f"{'':<34} " + "  ".join([f"{'norm':>10} {'elem':>10}"] * 4))
        for k in keys:
            a, b, c = ours[k], r32[k], rbf[k]
            sec = section(k)
            if k in ("loss", "train.loss"):
                fl = (1e-2, 1e-2)
            elif k == "train.grad_norm":
                fl = (3e-2, 3e-2)
            elif k == "train.lr":
                fl = (1e-6, 1e-6)
            else:
                fl = floors[sec]
            an, ae = tr.errors(a, b)
            tn, te = tr.errors(c, b)
            dn, de = tr.errors(a, c)
            bn = max(fl[0], args.factor * tn)
            be = max(fl[1], args.factor * te) if fl[1] is not None else None
            ok = an <= bn and (be is None or ae <= be)
            if not ok:
                failed.append(k)
            worst[sec] = max(worst.get(sec, 0.0), an if be is None else max(an, ae))
            bs = f"{bn:10.2e} {be:10.2e}" if be is not None else f"{bn:10.2e} {'-':>10}"
            print(f"{k:<34} {an:10.2e} {ae:10.2e}  {tn:10.2e} {te:10.2e}  {bs}  {dn:10.2e} {de:10.2e}  "
                  f"{'ok' if ok else 'FAIL'}")
        gate = f"bf16 gate: error vs torch f32 <= max(floor, {args.factor:g} x autocast's)"

    if ref.tied:
        # The tie copy's gradient stays exactly zero; after the steps it equals wte.
        if np.any(tensors["grad.lm_head.weight"] != 0):
            failed.append("grad.lm_head.weight (tie copy) not zero")
        if not np.array_equal(tensors["step3.lm_head.weight"], tensors["step3.wte.weight"]):
            failed.append("step3.lm_head.weight (tie copy) differs from wte")
    moved = max(float(np.abs(r32["step3." + n] - tensors[n]).max()) for n in names)
    if moved < 1e-3:
        failed.append(f"parameters barely moved ({moved:.1e}): the step comparison would be vacuous")
    print(f"\n{fam} {prec}: max error forward {worst.get('forward', 0):.2e}, gradients {worst.get('grads', 0):.2e}, "
          f"step stats {worst.get('steps', 0):.2e}, parameters after {info['steps']} steps "
          f"{worst.get('params', 0):.2e} ({gate})")
    if failed:
        print(f"{fam} {prec}: FAILED: " + ", ".join(failed))
        return 1
    print(f"{fam} {prec}: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
