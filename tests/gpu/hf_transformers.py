#!/usr/bin/env python3
"""colossal's Hugging Face exports, opened by transformers itself.

CI has no transformers (Debian does not package it), so tests/apps/ckpt_hf_*.sh
check exports against tests/parity/hf_reference.py, an independent forward
written to Hugging Face's conventions. This script closes the loop on a
machine that has transformers (the GPU machine): each DIR must load with
AutoModelForCausalLM.from_pretrained with no missing, unexpected or
mismatched tensors, and its logits on the tokens of LOGITS (a safetensors file
written by tests/unit/test_hf_logits: "tokens" I32 [B,T], "logits" F32
[B,T,V] computed by colossal) must agree within --tol (norm-wise relative
error and max-normalised elementwise error, as in hf_reference.py). A DIR
that ships tokenizer files must also load with AutoTokenizer, and when
--text is given its ids must equal colossal's (from `colossal-data
tokenize`, passed as --ids).

It also checks colossal-infer's greedy generation against transformers'
generate() on the same weights: `requests` turns the prompts of a JSONL
request file into prompt_token_ids lines with the directory's tokenizer, and
`generate` runs transformers' greedy decoding on each request's ids for as
many tokens as colossal-infer's result line holds (no stop at the
end-of-text token, as with ignore_eos) and requires the same tokens.

usage: hf_transformers.py [--tol 1e-4] [--device cpu|cuda]
                          model DIR LOGITS [DIR LOGITS ...]
       hf_transformers.py tokenizer DIR TEXT_FILE IDS_FILE
       hf_transformers.py requests DIR REQUESTS.jsonl OUT.jsonl
       hf_transformers.py [--device cuda] [--dtype f32|bf16] generate DIR REQUESTS.jsonl RESULTS.jsonl
"""
import argparse
import json
import struct
import sys

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "I32": np.int32, "I64": np.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:end], dtype=kinds[e["dtype"]]).reshape(e["shape"]).copy())
    return out


def errors(ours, ref):
    diff = np.abs(ours - ref)
    norm = np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30)
    elem = diff.max() / max(np.abs(ref).max(), 1e-30)
    return norm, elem


def check_model(d, logits_path, tol, device):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(d)
    model, info = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"} | (
        {"error_msgs": info["error_msgs"]} if info.get("error_msgs") else {})
    if bad:
        raise SystemExit(f"FAIL {d}: transformers reports {bad}")
    model.to(device).eval()
    ref = read_safetensors(logits_path)
    tok = ref["tokens"].long().to(device)
    ours = ref["logits"].double().numpy()
    with torch.no_grad():
        out = model(tok).logits.double().cpu().numpy()
    v = cfg.vocab_size
    if ours.shape[-1] < v or out.shape[-1] != v:
        raise SystemExit(f"FAIL {d}: logits {ours.shape} vs transformers {out.shape} (vocab_size {v})")
    ours = ours[..., :v]
    rn, re = errors(ours, out)
    print(f"{d}: {type(model).__name__} loaded by transformers, {sum(p.numel() for p in model.parameters())} "
          f"parameters, logits {tuple(out.shape)}: relative error norm {rn:.2e}, elem {re:.2e} (tol {tol:g})")
    if not (rn <= tol and re <= tol):
        raise SystemExit(f"FAIL {d}: colossal's logits differ from transformers'")
    # generate() exercises the cache path too: it must run and stay in vocabulary
    with torch.no_grad():
        gen = model.generate(tok[:1, :4], max_new_tokens=8, do_sample=False)
    if gen.shape[1] != 12 or int(gen.max()) >= v:
        raise SystemExit(f"FAIL {d}: generate gave {gen.tolist()}")


def check_tokenizer(d, text_file, ids_file):
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(d)
    text = open(text_file, encoding="utf-8").read()
    ids = tk(text)["input_ids"]
    ours = [int(x) for x in open(ids_file).read().split()]
    print(f"{d}: {type(tk).__name__}, {len(ids)} ids from transformers, {len(ours)} from colossal")
    if ids != ours:
        first = next((i for i, (a, b) in enumerate(zip(ids, ours)) if a != b), min(len(ids), len(ours)))
        raise SystemExit(f"FAIL {d}: token ids differ first at {first}: transformers {ids[first:first + 5]}, "
                         f"colossal {ours[first:first + 5]}")
    if tk.decode(ids) != text:
        raise SystemExit(f"FAIL {d}: decode(encode(text)) != text")


def write_requests(d, src, dst):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(d)
    with open(dst, "w") as f:
        for line in open(src):
            r = json.loads(line)
            ids = tok(r.pop("prompt"), add_special_tokens=False)["input_ids"]
            r["prompt_token_ids"] = ids
            f.write(json.dumps(r) + "\n")


def check_generate(d, requests, results, device, dtype):
    from transformers import AutoModelForCausalLM
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=dt).to(device).eval()
    res = {}
    for line in open(results):
        o = json.loads(line)
        res[o["id"]] = o["token_ids"]
    n_req = n_tok = same_tok = 0
    bad = []
    for line in open(requests):
        r = json.loads(line)
        ours = res[r["id"]]
        ids = torch.tensor([r["prompt_token_ids"]], device=device)
        with torch.inference_mode():
            out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(ours), do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        theirs = out[0, ids.shape[1]:].tolist()
        n_req += 1
        n_tok += len(ours)
        k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), len(ours))
        same_tok += k
        if k < len(ours):
            bad.append(f"{r['id']}: first difference at token {k}: colossal {ours[k]}, transformers {theirs[k]}")
    print(f"generate {d} ({dtype} on {device}): {n_req} requests, {same_tok}/{n_tok} tokens before the first "
          f"difference")
    for b in bad:
        print("  " + b)
    if bad:
        raise SystemExit(f"{len(bad)} of {n_req} greedy continuations differ from transformers'")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("what", choices=["model", "tokenizer", "requests", "generate"])
    ap.add_argument("args", nargs="+")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.what == "model":
        if len(a.args) % 2:
            raise SystemExit("model takes DIR LOGITS pairs")
        for d, lg in zip(a.args[0::2], a.args[1::2]):
            check_model(d, lg, a.tol, a.device)
    elif a.what == "requests":
        write_requests(*a.args)
    elif a.what == "generate":
        check_generate(*a.args, a.device, a.dtype)
    else:
        if len(a.args) != 3:
            raise SystemExit("tokenizer takes DIR TEXT_FILE IDS_FILE")
        check_tokenizer(*a.args)
    print("ok")


if __name__ == "__main__":
    sys.exit(main())
