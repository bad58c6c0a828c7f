#!/usr/bin/env python3
"""colossal's LoRA exports, opened by transformers and peft themselves.

CI has neither transformers nor peft, so tests/parity/lora.sh checks the
adapters against an independent PyTorch LoRA and tests/unit/test_lora the
merged export against the adapter model. This script closes the loop on a
machine that has python3 with torch, transformers and peft (the GPU machine;
no network is used):

  peft_check.py MERGED BASE ADAPTER LOGITS [--tol 1e-4] [--device cpu|cuda]

  MERGED   colossal's merged Hugging Face export (W + scale B A)
  BASE     the base model's Hugging Face directory
  ADAPTER  colossal's PEFT adapter directory (adapter_config.json,
           adapter_model.safetensors)
  LOGITS   colossal's logits of the adapter model: a safetensors file with
           "tokens" I32 [B,T] and "logits" F32 [B,T,V], as written by
           tests/unit/test_lora_logits (tests/gpu/peft-prepare.sh makes all
           four for tiny GPT-2 and Llama models, and for a colossal-sft run)

It loads MERGED with AutoModelForCausalLM, and BASE with the adapter through
PeftModel.from_pretrained; checks that every lora_A / lora_B tensor of the
file was loaded into the PEFT model (and nothing else is missing), that the
adapter changes the base's logits, and that both models' logits on the
tokens agree with colossal's: it prints the max abs difference of each and
exits 1 when one exceeds --tol.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ST = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            u = np.frombuffer(raw[8 + n + b:8 + n + end], dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw[8 + n + b:8 + n + end], dtype=np.dtype(ST[e["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(e["shape"]).copy())
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("merged")
    ap.add_argument("base")
    ap.add_argument("adapter")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=1e-4, help="max abs logit difference allowed (default 1e-4)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ref = read_safetensors(args.logits)
    tokens = ref["tokens"].long().to(args.device)
    ours = ref["logits"].double()
    V = ours.shape[-1]
    fail = 0
    models = []
    for d in (args.merged, args.base):
        m, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, local_files_only=True,
                                                       output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}  # missing, unexpected, mismatched keys, errors
        if bad:
            print(f"FAIL {d}: loading info {bad}")
            fail = 1
        models.append(m.to(args.device))
    merged, base = models
    merged.eval()
    peft = PeftModel.from_pretrained(base, args.adapter, is_trainable=False).to(args.device).eval()

    # Every adapter tensor of the file is in the PEFT model, with its values.
    want = read_safetensors(os.path.join(args.adapter, "adapter_model.safetensors"))
    got = {}
    for name, p in peft.named_parameters():
        if ".lora_A." in name or ".lora_B." in name:
            got[name.replace(".default", "")] = p.detach().cpu().float()
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        print(f"FAIL adapter tensors: in the file but not the PEFT model {missing[:4]}, "
              f"in the model but not the file {extra[:4]}")
        fail = 1
    for k in sorted(set(want) & set(got)):
        d = (want[k].float() - got[k]).abs().max().item()
        if d != 0.0:
            print(f"FAIL {k}: loaded with max abs difference {d:.3e}")
            fail = 1
    print(f"adapter: {len(want)} tensors of {args.adapter} loaded by peft "
          f"({json.load(open(os.path.join(args.adapter, 'adapter_config.json')))['target_modules']})")

    with torch.no_grad():
        lm = merged(input_ids=tokens).logits[..., :V].double().cpu()
        lp = peft(input_ids=tokens).logits[..., :V].double().cpu()
        with peft.disable_adapter():
            lb = peft(input_ids=tokens).logits[..., :V].double().cpu()
    scale = ours.abs().max().item()
    rows = [("merged (transformers)", lm), ("base + adapter (peft)", lp)]
    for what, l in rows:
        d = (l - ours).abs().max().item()
        ok = d <= args.tol
        fail |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}: max abs logit difference to colossal {d:.3e} "
              f"(logits up to {scale:.3g}, tolerance {args.tol:g})")
    moved = (lb - ours).abs().max().item()
    if moved <= 10 * args.tol:
        print(f"FAIL the adapter hardly changes the base's logits ({moved:.3e}): the check would prove nothing")
        fail = 1
    else:
        print(f"     base without the adapter differs from colossal's adapter logits by {moved:.3e} (as it should)")
    print("PASS" if not fail else "FAIL")
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
