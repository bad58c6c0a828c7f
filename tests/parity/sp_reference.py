#!/usr/bin/env python3
"""PyTorch reference for colossal's sequence-parallel attention
(docs/sequence-parallel.md).

Reads the safetensors file tests/parity/sp_driver writes (ring attention and
Ulysses run on every rank's shard, the shards put back in global order) and
recomputes each case from its inputs alone: grouped-query attention
softmax(q k^T / sqrt(D) + mask) v over the whole sequence, with query head h
reading key/value head h // (Hq / Hkv), the causal mask by global position,
lse the log-sum-exp of each score row, and the gradients of <out, dout> by
autograd, all in float64. Compares colossal's f32 out, lse, dq, dk, dv
(tolerance 1e-5 relative, as tests/parity/torch_reference.py measures it)
and prints PyTorch's own float32 errors beside them. Usage:
sp_reference.py FILE.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import Table, read_safetensors  # noqa: E402

TOL = 1e-5


def attention(q, k, v, causal):
    """q [B,T,Hq,D], k and v [B,T,Hkv,D] -> out [B,T,Hq,D], lse [B,Hq,T]."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / (d ** 0.5)
    if causal:
        t = q.shape[1]
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    return out, lse


def reference(t, c, causal, dtype):
    ins = [torch.tensor(t[f"c{c}.{n}"], dtype=dtype, requires_grad=n != "dout") for n in ("q", "k", "v", "dout")]
    q, k, v, dout = ins
    out, lse = attention(q, k, v, causal)
    (out * dout).sum().backward()
    return {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sp_reference.py FILE")
    torch.set_num_threads(1)
    t, meta = read_safetensors(sys.argv[1])
    table = Table(TOL)
    c = 0
    while f"c{c}.mode" in meta:
        mode, causal = meta[f"c{c}.mode"], meta[f"c{c}.causal"] == "1"
        r64 = reference(t, c, causal, torch.float64)
        r32 = reference(t, c, causal, torch.float32)
        for name in ("out", "lse", "dq", "dk", "dv"):
            table.compare(f"{mode}", f"{mode} {'causal' if causal else 'full'} {name}", t[f"c{c}.{name}"],
                          r64[name].numpy(), r32[name].numpy())
        c += 1
    table.print(f"sequence-parallel attention at sp {meta['sp']} against float64 PyTorch")
    for section, worst in sorted(table.worst.items()):
        print(f"{section}: worst relative error {worst:.2e} (tolerance {TOL:g})")
    if c == 0 or table.failed:
        sys.exit(f"FAIL: {', '.join(table.failed) if table.failed else 'no cases in the file'}")
    print("PASS")


if __name__ == "__main__":
    main()
