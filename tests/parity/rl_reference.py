#!/usr/bin/env python3
"""Independent PyTorch reference for colossal's alignment objectives.

Recomputes, in float64 with autograd, what tests/parity/rl_parity wrote:
the Bradley-Terry reward-model loss, DPO (with cDPO label smoothing) and
SimPO as TRL's DPOTrainer / CPOTrainer write them, GRPO's clipped loss with
the k3 KL under TRL's aggregations ("grpo", "bnpo", "dr_grpo") and a global
token denominator, and a PPO step as TRL's PPOTrainer writes it (KL-shaped
token rewards with the score at the last response token, GAE, masked
whitening, the clipped policy loss and the clipped value loss). Every loss,
gradient and intermediate is compared within --tol (absolute plus relative).

The file holds several batches (names and metadata keys prefixed "b<k>."),
and the batches must reach the clipped branches and a group of equal rewards.

Usage: rl_reference.py FILE.safetensors [--tol 1e-5]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import read_safetensors  # noqa: E402

DT = torch.float64


def f64(a):
    return torch.tensor(a).to(DT)


def leaf(a):
    return f64(a).requires_grad_(True)


# ------------------------------------------------------------ pairwise losses

def rm_loss(rc, rr):
    return -F.logsigmoid(rc - rr).mean()


def dpo_loss(pi_c, pi_r, ref_c, ref_r, beta, ls):
    pi_logratios = pi_c - pi_r
    ref_logratios = ref_c - ref_r
    logits = pi_logratios - ref_logratios
    losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    return losses.mean()


def simpo_loss(pi_c, pi_r, len_c, len_r, beta, gamma, ls):
    # CPOTrainer averages the log-probs over the response (average_log_prob)
    pi_logratios = pi_c / len_c - pi_r / len_r
    logits = pi_logratios - gamma / beta
    losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    return losses.mean()


# ------------------------------------------------------------ policy losses

def grpo_advantages(rewards, G, eps):
    grouped = rewards.view(-1, G)
    mean = grouped.mean(dim=1).repeat_interleave(G)
    std = grouped.std(dim=1, correction=0).repeat_interleave(G)
    return (rewards - mean) / (std + eps), (grouped.std(dim=1, correction=0) != 0)


def grpo_loss(logp, old, ref, adv, mask, beta, eps_low, eps_high, agg, norm_len, denominator):
    per_token_kl = torch.exp(ref - logp) - (ref - logp) - 1
    coef_1 = torch.exp(logp - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss1 = coef_1 * adv.unsqueeze(1)
    per_token_loss2 = coef_2 * adv.unsqueeze(1)
    per_token_loss = -torch.min(per_token_loss1, per_token_loss2) + beta * per_token_kl
    if denominator > 0:
        return (per_token_loss * mask).sum() / denominator
    if agg == "seq":  # TRL "grpo"
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if agg == "token":  # TRL "bnpo" / DAPO
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if agg == "sum":  # TRL "dr_grpo"
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * norm_len)
    raise SystemExit(f"unknown aggregation {agg}")


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def masked_whiten(x, mask):
    mean = masked_mean(x, mask)
    centred = x - mean
    var = masked_mean(centred ** 2, mask) * mask.sum() / (mask.sum() - 1)  # unbiased
    return (x - mean) * torch.rsqrt(var + 1e-8)


def ppo_rewards(score, old, ref, mask, kl_coef):
    rewards = -kl_coef * (old - ref) * mask
    for r in range(mask.size(0)):
        idx = mask[r].nonzero().flatten()
        if idx.numel():
            rewards[r, idx[-1]] += score[r]
    return rewards


def ppo_gae(rewards, values, mask, gamma, lam):
    """TRL's loop over the response, run on each row's counted positions."""
    adv = torch.zeros_like(rewards)
    for r in range(mask.size(0)):
        idx = mask[r].nonzero().flatten()
        rw, v = rewards[r, idx], values[r, idx]
        n = idx.numel()
        lastgaelam = 0.0
        out = [0.0] * n
        for t in reversed(range(n)):
            nextvalues = v[t + 1] if t < n - 1 else 0.0
            delta = rw[t] + gamma * nextvalues - v[t]
            lastgaelam = delta + gamma * lam * lastgaelam
            out[t] = lastgaelam
        if n:
            adv[r, idx] = torch.stack([torch.as_tensor(o, dtype=DT) for o in out])
    returns = (adv + values) * mask
    return adv, returns


def ppo_policy_loss(logp, old, adv, mask, cliprange):
    ratio = torch.exp(logp - old)
    pg_losses = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_loss_max = torch.max(pg_losses, pg_losses2)
    clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses).to(DT), mask)
    return masked_mean(pg_loss_max, mask), clipfrac


def ppo_value_loss(vpred, values, returns, mask, cliprange_value):
    vpredclipped = torch.clamp(vpred, values - cliprange_value, values + cliprange_value)
    vf_losses1 = torch.square(vpred - returns)
    vf_losses2 = torch.square(vpredclipped - returns)
    vf_loss_max = torch.max(vf_losses1, vf_losses2)
    clipfrac = masked_mean(torch.gt(vf_losses2, vf_losses1).to(DT), mask)
    return 0.5 * masked_mean(vf_loss_max, mask), clipfrac


# ------------------------------------------------------------ comparison

def batch(t, meta, check, exercised):
    """One batch's objectives: t and meta without the batch prefix."""

    def m(key):
        return float(meta[key])

    # reward model
    rc, rr = leaf(t["rm.r_chosen"]), leaf(t["rm.r_rejected"])
    loss = rm_loss(rc, rr)
    loss.backward()
    check("rm loss", t["rm.loss"], loss)
    check("rm d_chosen", t["rm.d_chosen"], rc.grad)
    check("rm d_rejected", t["rm.d_rejected"], rr.grad)

    # DPO, cDPO, SimPO
    ref_c, ref_r = f64(t["pref.ref_c"]), f64(t["pref.ref_r"])
    len_c, len_r = f64(t["pref.len_c"]), f64(t["pref.len_r"])
    for v in ("dpo", "dpo_ls", "simpo"):
        pc, pr = leaf(t["pref.pi_c"]), leaf(t["pref.pi_r"])
        beta, ls, gamma = m(f"{v}.beta"), m(f"{v}.label_smoothing"), m(f"{v}.gamma")
        if v == "simpo":
            loss = simpo_loss(pc, pr, len_c, len_r, beta, gamma, ls)
        else:
            loss = dpo_loss(pc, pr, ref_c, ref_r, beta, ls)
        loss.backward()
        check(f"{v} loss", t[f"{v}.loss"], loss)
        check(f"{v} d_pi_c", t[f"{v}.d_pi_c"], pc.grad)
        check(f"{v} d_pi_r", t[f"{v}.d_pi_r"], pr.grad)

    # GRPO
    old, ref = f64(t["pol.logp_old"]), f64(t["pol.logp_ref"])
    mask = f64(t["pol.mask"])
    adv, keep = grpo_advantages(f64(t["grpo.rewards"]), int(meta["grpo.G"]), m("grpo.eps"))
    check("grpo advantages", t["grpo.adv"], adv)
    check("grpo keep", t["grpo.keep"], keep.to(DT))
    adv32 = adv.to(torch.float32).to(DT)  # the batch holds float advantages
    for v in ("grpo_token", "grpo_seq", "grpo_sum", "grpo_denom", "grpo_high"):
        logp = leaf(t["pol.logp"])
        loss = grpo_loss(logp, old, ref, adv32, mask, m("grpo.kl_coef"), m("grpo.clip_low"), m(f"{v}.clip_high"),
                         meta[f"{v}.agg"], m("grpo.norm_len"), m(f"{v}.denominator"))
        loss.backward()
        check(f"{v} loss", t[f"{v}.loss"], loss)
        check(f"{v} dlogp", t[f"{v}.dlogp"], logp.grad)
    with torch.no_grad():
        lp = f64(t["pol.logp"])
        k3 = torch.exp(ref - lp) - (ref - lp) - 1
        check("grpo kl", t["grpo_token.kl"], masked_mean(k3, mask))
        ratio = torch.exp(lp - old)
        a = adv32.unsqueeze(1)
        clipped = torch.gt(-a * torch.clamp(ratio, 0.8, 1.2), -a * ratio).to(DT)
        check("grpo clip fraction", t["grpo_token.clip_fraction"], masked_mean(clipped, mask))

    # PPO
    values_old = f64(t["ppo.values_old"])
    rewards = ppo_rewards(f64(t["ppo.score"]), old, ref, mask, m("ppo.kl_coef"))
    check("ppo token rewards", t["ppo.rewards"], rewards)
    gae, returns = ppo_gae(rewards.to(torch.float32).to(DT), values_old, mask, m("ppo.gamma"), m("ppo.lambda"))
    check("ppo advantages", t["ppo.adv"], gae)
    check("ppo returns", t["ppo.returns"], returns)
    check("ppo whitened advantages", t["ppo.adv_whitened"], masked_whiten(gae, mask) * mask)
    logp = leaf(t["pol.logp"])
    loss, clipfrac = ppo_policy_loss(logp, old, gae.to(torch.float32).to(DT), mask, m("ppo.clip"))
    loss.backward()
    check("ppo policy loss", t["ppo.loss"], loss)
    check("ppo dlogp", t["ppo.dlogp"], logp.grad)
    check("ppo clip fraction", t["ppo.clip_fraction"], clipfrac)
    vpred = leaf(t["ppo.values"])
    vloss, vclipfrac = ppo_value_loss(vpred, values_old, returns.to(torch.float32).to(DT), mask,
                                      m("ppo.value_clip"))
    vloss.backward()
    check("ppo value loss", t["ppo.value_loss"], vloss)
    check("ppo dvalues", t["ppo.dvalues"], vpred.grad)
    check("ppo value clip fraction", t["ppo.value_clip_fraction"], vclipfrac)
    exercised["grpo clip"].append(float(t["grpo_token.clip_fraction"][0]))
    exercised["ppo clip"].append(float(t["ppo.clip_fraction"][0]))
    exercised["value clip"].append(float(t["ppo.value_clip_fraction"][0]))
    exercised["dropped groups"].append(float((t["grpo.keep"] == 0).sum()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--tol", type=float, default=1e-5)
    args = ap.parse_args()
    t, meta = read_safetensors(args.file)
    rows = []
    exercised = {"grpo clip": [], "ppo clip": [], "value clip": [], "dropped groups": []}
    for b in range(int(meta["batches"])):
        pre = f"b{b}."

        def check(name, ours, ref, b=b):
            rows.append((f"b{b} {name}", f64(ours).reshape(-1), ref.detach().to(DT).reshape(-1)))

        tb = {k[len(pre):]: v for k, v in t.items() if k.startswith(pre)}
        mb = {k[len(pre):]: v for k, v in meta.items() if k.startswith(pre)}
        batch(tb, mb, check, exercised)

    bad = 0
    worst = 0.0
    for name, ours, ref in rows:
        if ours.shape != ref.shape:
            print(f"FAIL {name}: shape {tuple(ours.shape)} vs reference {tuple(ref.shape)}")
            bad += 1
            continue
        diff = (ours - ref).abs()
        excess = (diff - args.tol * (1 + ref.abs())).max().item()
        rel = (diff / ref.abs().clamp(min=1e-30)).max().item()
        worst = max(worst, (diff / (1 + ref.abs())).max().item())
        status = "ok  " if excess <= 0 else "FAIL"
        if excess > 0:
            bad += 1
        print(f"{status} {name:28s} max abs {diff.max().item():.2e}  max rel {rel:.2e}")
    # the batches must reach the clipped branches and an all-equal group, or
    # the comparison says nothing about them
    for what, fr in exercised.items():
        hit = any(0 < f < 1 for f in fr) if what != "dropped groups" else any(f > 0 for f in fr)
        print(f"{'ok  ' if hit else 'FAIL'} {what} exercised: {fr}")
        bad += 0 if hit else 1
    print(f"{len(rows)} quantities, {bad} outside abs+rel {args.tol:g} (worst {worst:.2e})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
