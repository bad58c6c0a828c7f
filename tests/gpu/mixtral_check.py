#!/usr/bin/env python3
"""A colossal-moe export, opened by transformers' MixtralForCausalLM.

tests/gpu/mixtral-prepare.sh writes DIR (a Hugging Face directory exported by
`colossal-ckpt export` from a colossal-moe checkpoint) and LOGITS (colossal's
logits of that directory: "tokens" I32 [B,T], "logits" F32 [B,T,V], the format
of tests/gpu/hf_transformers.py). Here, on a machine with transformers, DIR
must load as MixtralForCausalLM in f32 with no missing, unexpected or
mismatched tensors, and its logits on the same tokens must agree within
--tol (norm-wise relative error and max-normalised elementwise error).
transformers' Mixtral routes dropless: softmax over all experts, top-k, the
k weights renormalised (colossal's moe.router=softmax, moe.norm_topk=1).

usage: mixtral_check.py [--tol 1e-4] [--device cuda|cpu] DIR LOGITS
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_transformers import errors, read_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("dir")
    ap.add_argument("logits")
    a = ap.parse_args()
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig.from_pretrained(a.dir)
    if cfg.model_type != "mixtral":
        raise SystemExit(f"FAIL {a.dir}: model_type {cfg.model_type}")
    model, info = MixtralForCausalLM.from_pretrained(a.dir, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit(f"FAIL {a.dir}: transformers reports {bad}")
    model.to(a.device).eval()
    ref = read_safetensors(a.logits)
    tok = ref["tokens"].long().to(a.device)
    ours = ref["logits"].double().numpy()
    with torch.no_grad():
        out = model(tok).logits.double().cpu().numpy()
    if ours.shape != out.shape:
        raise SystemExit(f"FAIL {a.dir}: logits {ours.shape} vs transformers {out.shape}")
    rn, re = errors(ours, out)
    print(f"{a.dir}: MixtralForCausalLM ({cfg.num_local_experts} experts, top-{cfg.num_experts_per_tok}, "
          f"{sum(p.numel() for p in model.parameters())} parameters) on {a.device}, logits {tuple(out.shape)}: "
          f"relative error norm {rn:.2e}, elem {re:.2e} (tol {a.tol:g})")
    if not (rn <= a.tol and re <= a.tol):
        raise SystemExit(f"FAIL {a.dir}: colossal's logits differ from transformers'")
    print("PASS")


if __name__ == "__main__":
    main()
