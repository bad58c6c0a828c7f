#!/usr/bin/env python3
"""PyTorch reference for colossal's MoE sublayer (docs/moe.md).

Reads the safetensors file tests/parity/moe_driver writes and, for every
case, rebuilds the layer from its description (not from colossal's code):
router logits x W_r^T; softmax (Mixtral), top-k-then-softmax, or sigmoid
scores (DeepSeek-V3); the k largest, weights renormalised to sum 1 where
asked; capacity: an expert takes its first `capacity` assignments in token
order; SwiGLU experts w2(silu(w1 x) * w3 x); shared experts added for every
token; load-balancing loss E * sum_e (c_e / N) * mean_t P_te as Hugging
Face's Mixtral computes it (c_e: assignments before dropping; P: the
softmax, or the sigmoid scores normalised per token); z-loss mean_t
logsumexp(logits_t)^2 (ST-MoE). The objective <y, dy> + aux_coef aux +
z_coef z is differentiated by autograd in float64 and compared with
colossal's f32 output, losses and every gradient (tolerance 1e-5, the
relative errors of tests/parity/torch_reference.py). Usage:
moe_reference.py FILE.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import Table, errors, f32, read_safetensors  # noqa: E402

ROUTERS = {0: "softmax", 1: "topk_softmax", 2: "sigmoid"}
TOL = 1e-5


def swiglu(x, w1, w3, w2):
    return (F.silu(x @ w1.T) * (x @ w3.T)) @ w2.T


def capacity_keep(sel, E, cap):
    """keep[t, j]: assignment (t, j) is among its expert's first `cap` in token order."""
    N, k = sel.shape
    keep = np.ones((N, k), dtype=bool)
    if cap <= 0:
        return keep
    seen = np.zeros(E, dtype=np.int64)
    for t in range(N):
        for j in range(k):
            e = sel[t, j]
            keep[t, j] = seen[e] < cap
            seen[e] += 1
    return keep


def run_case(c, meta, T, dtype):
    m = {k[len(f"c{c}."):]: v for k, v in meta.items() if k.startswith(f"c{c}.")}
    router, k, E = ROUTERS[int(m["router"])], int(m["top_k"]), int(m["n_experts"])
    norm, n_shared, cap = int(m["norm_topk"]), int(m["n_shared"]), int(m["capacity"])
    aux_coef, z_coef = f32(m["aux_coef"]), f32(m["z_coef"])
    g = lambda name: torch.tensor(T[f"c{c}.{name}"], dtype=dtype)  # noqa: E731
    x = g("x").requires_grad_(True)
    dy = g("dy")
    names = ["h.0.moe.router.weight"] + [f"h.0.moe.experts.{e}.{p}.weight" for e in range(E)
                                         for p in ("fc", "up", "proj")]
    if n_shared:
        names += [f"h.0.moe.shared.{p}.weight" for p in ("fc", "up", "proj")]
    P = {n: g(n).requires_grad_(True) for n in names}
    N = x.shape[0]

    logits = x @ P["h.0.moe.router.weight"].T
    lse = torch.logsumexp(logits, dim=-1)
    sel = torch.topk(logits, k, dim=-1).indices
    if router == "sigmoid":
        scores = torch.sigmoid(logits)
        w = scores.gather(1, sel)
        if norm:
            w = w / w.sum(-1, keepdim=True)
        prob = scores / scores.sum(-1, keepdim=True)
    else:
        prob = torch.softmax(logits, dim=-1)
        if router == "topk_softmax":
            w = torch.softmax(logits.gather(1, sel), dim=-1)
        else:
            w = prob.gather(1, sel)
            if norm:
                w = w / w.sum(-1, keepdim=True)
    sel_np = sel.numpy()
    counts = torch.tensor(np.bincount(sel_np.reshape(-1), minlength=E), dtype=dtype)
    aux = E * torch.sum(counts / N * prob.mean(0))
    z = torch.mean(lse ** 2)
    keep = capacity_keep(sel_np, E, cap)

    y = torch.zeros_like(x)
    if n_shared:
        y = y + swiglu(x, *(P[f"h.0.moe.shared.{p}.weight"] for p in ("fc", "up", "proj")))
    for e in range(E):
        ts, js = np.nonzero((sel_np == e) & keep)
        if len(ts) == 0:
            continue
        ts_t, js_t = torch.tensor(ts), torch.tensor(js)
        out = swiglu(x[ts_t], *(P[f"h.0.moe.experts.{e}.{p}.weight"] for p in ("fc", "up", "proj")))
        y = y.index_add(0, ts_t, w[ts_t, js_t].unsqueeze(1) * out)
    obj = (y * dy).sum() + aux_coef * aux + z_coef * z
    obj.backward()
    res = {"y": y.detach(), "dx": x.grad, "aux": aux.detach().reshape(1), "z": z.detach().reshape(1)}
    for n in names:
        res[f"grad.{n}"] = P[n].grad
    extra = {"sel": sel_np, "load": np.bincount(sel_np.reshape(-1), minlength=E),
             "dropped": int((~keep).sum())}
    return res, extra


def main():
    T, meta = read_safetensors(sys.argv[1])
    torch.set_num_threads(1)
    failed = []
    worst = 0.0
    for c in range(int(meta["cases"])):
        r64, extra = run_case(c, meta, T, torch.float64)
        r32, _ = run_case(c, meta, T, torch.float32)
        table = Table(TOL)
        for name in r64:
            table.compare("moe", name, T[f"c{c}.{name}"], r64[name].numpy(), r32[name].numpy())
        ok = True
        if not np.array_equal(T[f"c{c}.sel"], extra["sel"]):
            print(f"case {c}: colossal's experts differ from torch.topk's")
            ok = False
        if not np.array_equal(T[f"c{c}.load"], extra["load"]):
            print(f"case {c}: load {T[f'c{c}.load']} but the reference has {extra['load']}")
            ok = False
        if int(T[f"c{c}.dropped"][0]) != extra["dropped"]:
            print(f"case {c}: dropped {int(T[f'c{c}.dropped'][0])} but the reference drops {extra['dropped']}")
            ok = False
        table.print(f"case {c}: router {ROUTERS[int(meta[f'c{c}.router'])]}, top-{meta[f'c{c}.top_k']}, "
                    f"renormalised {meta[f'c{c}.norm_topk']}, shared {meta[f'c{c}.n_shared']}, "
                    f"capacity {meta[f'c{c}.capacity']} (0: dropless), dropped {extra['dropped']}")
        worst = max(worst, table.worst.get("moe", 0.0))
        if table.failed or not ok:
            failed.append((c, table.failed))
    print(f"\nworst relative error over all cases: {worst:.2e} (tolerance {TOL:g})")
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
