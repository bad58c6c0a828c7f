#!/usr/bin/env python3
"""Hugging Face directory check for colossal's export/import (docs/huggingface.md).

transformers is not needed (nor installed on the CI machine): this is an
independent forward of GPT2LMHeadModel and LlamaForCausalLM written against
Hugging Face's conventions, reading only what transformers would read --
config.json and model.safetensors or model.safetensors.index.json + shards --
by Hugging Face tensor names:

  GPT-2   Conv1D layers compute x @ W + b with W stored [in, out]; c_attn's
          columns are q | k | v; lm_head is tied to transformer.wte unless
          tie_word_embeddings is false; tanh GELU ("gelu_new").
  Llama   nn.Linear layers compute x @ W.T with W stored [out, in]; q/k get
          rotate_half RoPE (inv_freq = theta^(-2i/D), cos/sin duplicated over
          both halves); num_key_value_heads kv heads each serve
          num_attention_heads / num_key_value_heads query heads (repeat_kv);
          RMSNorm; SwiGLU down(silu(gate(x)) * up(x)).

Commands:
  check DIR LOGITS.safetensors [DIR LOGITS ...]
                                 forward DIR's weights in float64 on LOGITS'
                                 "tokens", compare with its "logits" (colossal's)
  compare-h5 CKPT.h5 DIR          DIR's tensors equal the colossal checkpoint's
                                 weights mapped the HF way (needs h5py)
  make gpt2|llama DIR TOKENS.safetensors [--dtype f32|bf16|f16] [--shard BYTES]
                                 [--tied]  write a random model the way
                                 transformers' save_pretrained lays it out, and
                                 tokens to run it on

Errors per tensor as in torch_reference.py (norm-wise and max-normalised
elementwise relative error), both must be <= --tol (1e-5).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import causal_attention, errors, gelu_tanh, layer_norm, rms_norm, rotate_half  # noqa: E402

DT = torch.float64
ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
             "I32": torch.int32, "I64": torch.int64}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}


# ----------------------------------------------------------------- safetensors

def read_safetensors(path):
    """{name: torch tensor in the file's dtype}."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        raise SystemExit(f"{path}: __metadata__.format is {meta.get('format')!r}; transformers requires 'pt'")
    base, out = 8 + n, {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        buf = bytearray(raw[base + b:base + end])
        t = torch.frombuffer(buf, dtype=ST_DTYPES[e["dtype"]]) if buf else torch.empty(0, dtype=ST_DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
    return out


def write_safetensors(path, tensors):
    """tensors: {name: torch tensor}; layout as the reference writer (aligned)."""
    header, blobs, pos = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors, key=lambda k: (-tensors[k].element_size(), k)):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_dir(d):
    """(config dict, {name: float64 tensor}, list of files) as transformers would find them."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        files = ["model.safetensors"]
    else:
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
    w = {}
    for fn in files:
        for k, v in read_safetensors(os.path.join(d, fn)).items():
            if k in w:
                raise SystemExit(f"{d}: tensor {k} is in two files")
            w[k] = v.to(DT)
    if len(files) > 1 and set(w) != set(idx["weight_map"]):
        raise SystemExit(f"{d}: the index's weight_map and the shards disagree")
    return cfg, w, files


def f32(x):
    """colossal computes with the float32 value of a config float"""
    return float(np.float32(float(x)))


# ----------------------------------------------------------------- HF forwards

def gpt2_forward(cfg, w, tok):
    if cfg.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise SystemExit("only gelu_new GPT-2 is modelled")
    p = "transformer." if "transformer.wte.weight" in w else ""
    C, H = cfg["n_embd"], cfg["n_head"]
    D, eps = C // H, f32(cfg.get("layer_norm_epsilon", 1e-5))
    B, T = tok.shape
    x = w[p + "wte.weight"][tok] + w[p + "wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        L = f"{p}h.{i}."
        h = layer_norm(x, w[L + "ln_1.weight"], w[L + "ln_1.bias"], eps)
        qkv = h @ w[L + "attn.c_attn.weight"] + w[L + "attn.c_attn.bias"]  # Conv1D: x @ W + b
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + a @ w[L + "attn.c_proj.weight"] + w[L + "attn.c_proj.bias"]
        h = layer_norm(x, w[L + "ln_2.weight"], w[L + "ln_2.bias"], eps)
        h = gelu_tanh(h @ w[L + "mlp.c_fc.weight"] + w[L + "mlp.c_fc.bias"])
        x = x + h @ w[L + "mlp.c_proj.weight"] + w[L + "mlp.c_proj.bias"]
    x = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    head = w[p + "wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.T


def llama_forward(cfg, w, tok):
    if cfg.get("hidden_act", "silu") != "silu" or cfg.get("rope_scaling") is not None:
        raise SystemExit("only plain-RoPE SwiGLU Llama is modelled")
    C, H = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads", H)
    D, eps = C // H, f32(cfg.get("rms_norm_eps", 1e-6))
    theta = f32(cfg.get("rope_theta", 10000.0))
    B, T = tok.shape
    inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=DT) / D))
    ang = torch.outer(torch.arange(T, dtype=DT), inv_freq)
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    lin = lambda x, name: x @ w[name].T  # nn.Linear, no bias
    x = w["model.embed_tokens.weight"][tok]
    for i in range(cfg["num_hidden_layers"]):
        L = f"model.layers.{i}."
        h = rms_norm(x, w[L + "input_layernorm.weight"], eps)
        q = lin(h, L + "self_attn.q_proj.weight").view(B, T, H, D).transpose(1, 2)
        k = lin(h, L + "self_attn.k_proj.weight").view(B, T, Hkv, D).transpose(1, 2)
        v = lin(h, L + "self_attn.v_proj.weight").view(B, T, Hkv, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # repeat_kv: [B, Hkv, T, D] -> [B, Hkv, rep, T, D] -> [B, H, T, D]
        rep = H // Hkv
        k = k[:, :, None].expand(B, Hkv, rep, T, D).reshape(B, H, T, D)
        v = v[:, :, None].expand(B, Hkv, rep, T, D).reshape(B, H, T, D)
        a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + lin(a, L + "self_attn.o_proj.weight")
        h = rms_norm(x, w[L + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(h, L + "mlp.gate_proj.weight")) * lin(h, L + "mlp.up_proj.weight"),
                    L + "mlp.down_proj.weight")
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.T


def forward(cfg, w, tok):
    arch = (cfg.get("architectures") or [""])[0]
    if arch in ("GPT2LMHeadModel", "GPT2Model") or cfg.get("model_type") == "gpt2":
        return gpt2_forward(cfg, w, tok)
    if arch == "LlamaForCausalLM" or cfg.get("model_type") == "llama":
        return llama_forward(cfg, w, tok)
    raise SystemExit(f"unknown architecture {arch!r}")


# ----------------------------------------------------------------- commands

def check(args):
    if len(args.pairs) % 2:
        raise SystemExit("check takes DIR LOGITS pairs")
    for d, lg in zip(args.pairs[0::2], args.pairs[1::2]):
        check_one(d, lg, args.tol)


def check_one(d, logits, tol):
    cfg, w, files = load_dir(d)
    out = read_safetensors(logits)
    tok = out["tokens"].long()
    ours = out["logits"].double().numpy()
    with torch.no_grad():
        ref64 = forward(cfg, w, tok).numpy()
    if ours.shape != ref64.shape:
        raise SystemExit(f"logits shape {ours.shape}, reference {ref64.shape} (vocab_size {cfg['vocab_size']})")
    rn, re = errors(ours, ref64)
    dtypes = sorted({str(t.dtype) for t in read_safetensors(os.path.join(d, files[0])).values()})
    print(f"{d}: {(cfg.get('architectures') or ['?'])[0]}, {len(w)} tensors in {len(files)} file(s) "
          f"({', '.join(dtypes)}), logits {tuple(ours.shape)}: relative error norm {rn:.2e}, elem {re:.2e} "
          f"(tol {tol:g})")
    if not (rn <= tol and re <= tol):
        raise SystemExit("FAIL: colossal's logits differ from the HF-convention forward")
    # A wrong layout must not pass by accident. GPT-2: a Conv1D weight used
    # untransposed. Llama: q and k rows reordered the same way within each
    # head -- attention scores would not change without RoPE, so only the
    # pairing (interleaved instead of rotate_half) is being told apart.
    bad = dict(w)
    if "GPT2" in (cfg.get("architectures") or [""])[0]:
        p = "transformer." if "transformer.wte.weight" in w else ""
        n = f"{p}h.0.attn.c_proj.weight"
        bad[n] = bad[n].T.contiguous()
    else:
        D = cfg["hidden_size"] // cfg["num_attention_heads"]
        for k in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"):
            t = bad[k].view(-1, D, bad[k].shape[1])
            bad[k] = torch.cat((t[:, 0::2], t[:, 1::2]), 1).reshape(bad[k].shape)
        n = "model.layers.0.self_attn.q_proj/k_proj (interleaved RoPE pairs)"
    with torch.no_grad():
        wrong = forward(cfg, bad, tok).numpy()
    bn, _ = errors(ours, wrong)
    print(f"  control: with {n} in the wrong layout the error would be {bn:.2e}")
    if bn <= 100 * tol:
        raise SystemExit("FAIL: the check cannot tell layouts apart")


def make(args):
    g = torch.Generator().manual_seed(args.seed)
    rnd = lambda *s, scale=0.1: torch.randn(*s, generator=g, dtype=DT) * scale
    norm = lambda n: 1.0 + rnd(n, scale=0.2)
    w, V = {}, args.vocab
    if args.family == "gpt2":
        C, H, L, T = 48, 4, 2, 24
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": T,
               "n_embd": C, "n_layer": L, "n_head": H, "n_inner": None, "activation_function": "gelu_new",
               "layer_norm_epsilon": 1e-05, "tie_word_embeddings": args.tied}
        w["transformer.wte.weight"], w["transformer.wpe.weight"] = rnd(V, C), rnd(T, C)
        for i in range(L):
            p = f"transformer.h.{i}."
            for ln in ("ln_1", "ln_2"):
                w[p + ln + ".weight"], w[p + ln + ".bias"] = norm(C), rnd(C)
            for name, fin, fout in (("attn.c_attn", C, 3 * C), ("attn.c_proj", C, C), ("mlp.c_fc", C, 4 * C),
                                    ("mlp.c_proj", 4 * C, C)):
                w[p + name + ".weight"], w[p + name + ".bias"] = rnd(fin, fout), rnd(fout)  # Conv1D [in, out]
            # the causal-mask buffer older transformers saved
            w[p + "attn.bias"] = torch.tril(torch.ones(T, T, dtype=DT)).view(1, 1, T, T)
        w["transformer.ln_f.weight"], w["transformer.ln_f.bias"] = norm(C), rnd(C)
        if not args.tied:
            w["lm_head.weight"] = rnd(V, C)
    else:
        C, H, Hkv, Fh, L, T = 64, 8, 2, 96, 2, 24
        D = C // H
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": C,
               "intermediate_size": Fh, "num_hidden_layers": L, "num_attention_heads": H,
               "num_key_value_heads": Hkv, "hidden_act": "silu", "max_position_embeddings": T,
               "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "rope_scaling": None, "attention_bias": False,
               "tie_word_embeddings": args.tied}
        w["model.embed_tokens.weight"] = rnd(V, C)
        for i in range(L):
            p = f"model.layers.{i}."
            for name, fout, fin in (("self_attn.q_proj", H * D, C), ("self_attn.k_proj", Hkv * D, C),
                                    ("self_attn.v_proj", Hkv * D, C), ("self_attn.o_proj", C, H * D),
                                    ("mlp.gate_proj", Fh, C), ("mlp.up_proj", Fh, C), ("mlp.down_proj", C, Fh)):
                w[p + name + ".weight"] = rnd(fout, fin)  # nn.Linear [out, in]
            w[p + "input_layernorm.weight"], w[p + "post_attention_layernorm.weight"] = norm(C), norm(C)
        w["model.norm.weight"] = norm(C)
        if not args.tied:
            w["lm_head.weight"] = rnd(V, C)
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[args.dtype]
    w = {k: v.to(dt) for k, v in w.items()}
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(w)
    if args.shard:
        # save_pretrained's rule: start a new shard when the next tensor would overflow
        shards, cur, size = [], [], 0
        for n in names:
            b = w[n].numel() * w[n].element_size()
            if cur and size + b > args.shard:
                shards.append(cur)
                cur, size = [], 0
            cur.append(n)
            size += b
        shards.append(cur)
        wm = {}
        for i, s in enumerate(shards):
            fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(args.dir, fn), {n: w[n] for n in s})
            wm.update({n: fn for n in s})
        total = sum(w[n].numel() * w[n].element_size() for n in names)
        with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
    else:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), w)
    tok = torch.randint(0, V, (2, 10), generator=g, dtype=torch.int32)
    write_safetensors(args.tokens, {"tokens": tok})
    print(f"{args.dir}: {cfg['architectures'][0]} with {len(w)} tensors ({args.dtype}"
          f"{', sharded' if args.shard else ''}{', tied' if args.tied else ''})")


def compare_h5(args):
    """Every HF tensor of DIR against the colossal checkpoint it was exported
    from, through this file's own reading of the two layouts: exact, after
    rounding the checkpoint's f32 masters to the directory's torch_dtype."""
    import h5py
    cfg, w, _ = load_dir(args.dir)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg["torch_dtype"]]
    V = cfg["vocab_size"]
    with h5py.File(args.h5, "r") as f:
        group = f["master"] if "master" in f else f["model"]  # masters when the run kept low-precision weights
        gname = group.name.lstrip("/")
        c = {k: torch.from_numpy(group[k][...].astype(np.float32)).to(dt).to(DT) for k in group}
    want = {}
    if "GPT2" in cfg["architectures"][0]:
        want["transformer.wte.weight"], want["transformer.wpe.weight"] = c["wte.weight"][:V], c["wpe.weight"]
        for i in range(cfg["n_layer"]):
            h, p = f"h.{i}.", f"transformer.h.{i}."
            for a, b in (("ln_1", "ln_1"), ("ln_2", "ln_2")):
                want[p + b + ".weight"], want[p + b + ".bias"] = c[h + a + ".weight"], c[h + a + ".bias"]
            for a, b in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
                         ("mlp.proj", "mlp.c_proj")):
                want[p + b + ".weight"], want[p + b + ".bias"] = c[h + a + ".weight"].T, c[h + a + ".bias"]
        want["transformer.ln_f.weight"], want["transformer.ln_f.bias"] = c["ln_f.weight"], c["ln_f.bias"]
        tied = cfg.get("tie_word_embeddings", True)
    else:
        H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        D = cfg["hidden_size"] // H
        want["model.embed_tokens.weight"] = c["wte.weight"][:V]
        for i in range(cfg["num_hidden_layers"]):
            h, p = f"h.{i}.", f"model.layers.{i}."
            q, k, v = c[h + "attn.qkv.weight"].split([H * D, Hkv * D, Hkv * D])
            want[p + "self_attn.q_proj.weight"], want[p + "self_attn.k_proj.weight"] = q, k
            want[p + "self_attn.v_proj.weight"] = v
            for a, b in (("attn.proj", "self_attn.o_proj"), ("mlp.fc", "mlp.gate_proj"), ("mlp.up", "mlp.up_proj"),
                         ("mlp.proj", "mlp.down_proj"), ("ln_1", "input_layernorm"),
                         ("ln_2", "post_attention_layernorm")):
                want[p + b + ".weight"] = c[h + a + ".weight"]
        want["model.norm.weight"] = c["ln_f.weight"]
        tied = cfg.get("tie_word_embeddings", False)
    if not tied:
        want["lm_head.weight"] = c["lm_head.weight"][:V]
    if set(want) != set(w):
        raise SystemExit(f"FAIL: tensor names differ: only in the directory {sorted(set(w) - set(want))}, "
                         f"only expected {sorted(set(want) - set(w))}")
    for n in want:
        if want[n].shape != w[n].shape or not torch.equal(want[n], w[n]):
            raise SystemExit(f"FAIL: {n}: the directory's {tuple(w[n].shape)} tensor is not the checkpoint's "
                             f"{tuple(want[n].shape)}")
    print(f"{args.dir}: all {len(w)} tensors equal the checkpoint's {gname} weights "
          f"({cfg['torch_dtype']}, vocabulary rows {V} of {c['wte.weight'].shape[0]})")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("pairs", nargs="+", metavar="DIR LOGITS")
    c.add_argument("--tol", type=float, default=1e-5)
    m = sub.add_parser("make")
    m.add_argument("family", choices=["gpt2", "llama"])
    m.add_argument("dir")
    m.add_argument("tokens")
    m.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    m.add_argument("--shard", type=int, default=0)
    m.add_argument("--tied", action="store_true")
    m.add_argument("--vocab", type=int, default=53)
    m.add_argument("--seed", type=int, default=3)
    h = sub.add_parser("compare-h5")
    h.add_argument("h5")
    h.add_argument("dir")
    args = ap.parse_args()
    torch.set_num_threads(1)
    {"check": check, "make": make, "compare-h5": compare_h5}[args.cmd](args)


if __name__ == "__main__":
    main()
