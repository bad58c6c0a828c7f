#!/usr/bin/env python3
"""Decode throughput of Hugging Face transformers' generate() with a static
KV cache (or its default dynamic one, --cache dynamic; on the CPU with
--device cpu, in f32 with --dtype f32) on random weights, timed as
bench/infer_bench.c times colossal:
B prompts of P random tokens, greedy, N new tokens (min_new_tokens = N so
none stops early), run with N and with 1 new token; the decode rate is
B * (N - 1) / (t_N - t_1). One JSON line per batch size. With --prefill, the
prompt's forward alone instead (logits of the last position only, as
generate() asks for on its first step), timed twice after a warm-up, the
faster kept: prefill_tokens_per_s = B * P / t.

  hf_generate_bench.py FAMILY LAYERS D HEADS KV_HEADS FFN VOCAB [--batches 1,16,64,256] [--prompt 128] [--new 256]
                       [--device cuda|cpu] [--dtype bf16|f32] [--cache static|dynamic] [--prefill]
"""
import argparse
import json
import time

import torch
import transformers


def model_for(a):
    if a.family == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=a.vocab, n_positions=a.prompt + a.new, n_embd=a.d, n_layer=a.layers,
                                      n_head=a.heads, n_inner=a.ffn, activation_function="gelu_new")
        m = transformers.GPT2LMHeadModel(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.d, intermediate_size=a.ffn,
                                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                       num_key_value_heads=a.kv, max_position_embeddings=a.prompt + a.new,
                                       tie_word_embeddings=False)
        m = transformers.LlamaForCausalLM(cfg)
    return m.to(torch.bfloat16 if a.dtype == "bf16" else torch.float32).to(a.device).eval()


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(m, ids, n, cache):
    sync(ids.device.type)
    t = time.perf_counter()
    with torch.inference_mode():
        m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                   cache_implementation=cache, pad_token_id=0)
    sync(ids.device.type)
    return time.perf_counter() - t


def prefill_time(m, ids):
    sync(ids.device.type)
    t = time.perf_counter()
    with torch.inference_mode():
        m(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1, use_cache=False)
    sync(ids.device.type)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    for k in ("family",):
        ap.add_argument(k)
    for k in ("layers", "d", "heads", "kv", "ffn", "vocab"):
        ap.add_argument(k, type=int)
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--cache", default="static", choices=["static", "dynamic"])
    ap.add_argument("--prefill", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    m = model_for(a)
    n_params = sum(p.numel() for p in m.parameters())
    for b in (int(x) for x in a.batches.split(",")):
        ids = torch.randint(0, a.vocab, (b, a.prompt), device=a.device)
        if a.prefill:
            prefill_time(m, ids)
            t = min(prefill_time(m, ids), prefill_time(m, ids))
            print(json.dumps({"impl": "transformers-forward", "family": a.family, "params": n_params, "batch": b,
                              "prompt": a.prompt, "device": a.device, "dtype": a.dtype,
                              "attn": m.config._attn_implementation,
                              "prefill_tokens_per_s": round(b * a.prompt / t, 1),
                              "transformers": transformers.__version__}), flush=True)
            continue
        # warm-up with the timed calls' own shapes: the static cache is sized
        # prompt + new tokens, and generate() compiles the forward for each
        # cache size, so a shorter warm-up leaves both compilations inside
        # the timed calls
        timed(m, ids, 1, a.cache)
        timed(m, ids, a.new, a.cache)
        t1 = timed(m, ids, 1, a.cache)
        tn = timed(m, ids, a.new, a.cache)
        print(json.dumps({"impl": "transformers-" + a.cache, "family": a.family, "params": n_params, "batch": b,
                          "prompt": a.prompt, "new": a.new, "device": a.device, "dtype": a.dtype,
                          "threads": torch.get_num_threads() if a.device == "cpu" else None,
                          "decode_tokens_per_s": round(b * (a.new - 1) / (tn - t1), 1),
                          "decode_step_ms": round(1e3 * (tn - t1) / (a.new - 1), 4),
                          "transformers": transformers.__version__}), flush=True)


if __name__ == "__main__":
    main()
