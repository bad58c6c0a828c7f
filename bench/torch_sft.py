#!/usr/bin/env python3
"""PyTorch + peft SFT-step reference for bench/gpu_sft.sh (issue #22).

What a Hugging Face user runs to fine-tune the same model on the same rows:
transformers' LlamaForCausalLM (or GPT2LMHeadModel) loaded from colossal's
Hugging Face export (so both start from the same weights), SDPA attention,
the masked next-token cross-entropy over the assistant's tokens, fused AdamW
(betas 0.9/0.95, eps 1e-8, weight decay 0.1) and global-norm clipping at 1.0.

  full fine-tuning (--lora-rank 0): f32 parameters, bf16 autocast -- the
      precision colossal-sft's `precision: bf16` runs (bf16 compute, f32
      masters);
  LoRA (--lora-rank r): peft's LoraConfig on the named modules, the frozen
      base in bf16 (torch_dtype=bfloat16, as peft's own examples load it), the
      adapters in f32, bf16 autocast.

--mode compile wraps the model in torch.compile.

The rows are colossal-sft's: the chat JSONL that colossal-sft tokenized into
RUN_DIR/data/train.{bin,idx} and train_loss_mask.{bin,idx} (Megatron MMIDIDX,
docs/sft.md), one conversation per row of --seq-len positions, padded after
its end, target = the next token where that token is trained, ignored
elsewhere -- the rows colossal-sft builds. Rows are taken in file order,
cycled; tokens/s counts every position of a row (batch x seq_len), as
colossal-sft's metrics do.

The last line is machine-readable:
  RESULT {"impl": "torch-eager", "lora_rank": ..., "tokens_per_s": ..., ...}

  python3 bench/torch_sft.py --make-hf DIR --config bench/configs/llama-1b.yaml
writes a randomly initialised Llama of the YAML file's shape (model.*, the
positions from train.seq_len) to DIR as safetensors, the model both sides
fine-tune.
"""
import argparse
import json
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}


def read_mmidx(prefix):
    """Sequences of a Megatron MMIDIDX dataset as a list of numpy arrays."""
    idx = open(prefix + ".idx", "rb").read()
    if idx[:9] != b"MMIDIDX\x00\x00":
        sys.exit("%s.idx: not a Megatron MMIDIDX index" % prefix)
    dtype = DTYPES[idx[17]]
    (n,) = struct.unpack_from("<Q", idx, 18)
    lengths = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    data = np.fromfile(prefix + ".bin", dtype=np.uint8)
    es = np.dtype(dtype).itemsize
    return [data[p:p + l * es].view(dtype) for p, l in zip(pointers, lengths)]


def build_rows(prefix, seq_len, pad_id):
    toks = read_mmidx(prefix)
    masks = read_mmidx(prefix + "_loss_mask")
    rows, tgts = [], []
    for t, m in zip(toks, masks):
        t = t.astype(np.int64)[: seq_len + 1]
        m = m.astype(np.int64)[: seq_len + 1]
        x = np.full(seq_len, pad_id, np.int64)
        y = np.full(seq_len, -100, np.int64)
        n = min(len(t), seq_len)
        x[:n] = t[:n]
        nxt = t[1 : n + 1]
        keep = m[1 : n + 1] == 1
        y[: len(nxt)] = np.where(keep, nxt, -100)
        rows.append(x)
        tgts.append(y)
    return np.stack(rows), np.stack(tgts)


def make_hf(out, config, seq_len):
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_gpu_train import model_config
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model_config(argparse.Namespace(config=config, tiny=False))
    if c["family"] != "llama":
        sys.exit("%s: model.family %s; --make-hf writes Llama models" % (config, c["family"]))
    cfg = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["d_model"], intermediate_size=c["ffn_hidden"],
                      num_hidden_layers=c["n_layers"], num_attention_heads=c["n_heads"],
                      num_key_value_heads=c["n_kv_heads"], rope_theta=c["rope_theta"], rms_norm_eps=c["norm_eps"],
                      tie_word_embeddings=c["tie"], max_position_embeddings=seq_len or c["seq"],
                      initializer_range=0.02)
    torch.manual_seed(1234)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    print("wrote %s: %s" % (out, json.dumps({k: c[k] for k in ("n_layers", "d_model", "n_heads", "n_kv_heads",
                                                                  "ffn_hidden", "vocab_size", "tie")})))


def main():
    if "--make-hf" in sys.argv:
        ap = argparse.ArgumentParser()
        ap.add_argument("--make-hf", required=True)
        ap.add_argument("--config", required=True)
        ap.add_argument("--seq-len", type=int, default=0)
        a = ap.parse_args()
        return make_hf(a.make_hf, a.config, a.seq_len)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf", required=True, help="Hugging Face directory (colossal-ckpt export)")
    ap.add_argument("--data", required=True, help="colossal-sft's tokenized rows: RUN_DIR/data/train")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, default=25, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation included)")
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--lora-rank", type=int, default=0, help="0: full fine-tuning")
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM

    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    lora = args.lora_rank > 0
    model = AutoModelForCausalLM.from_pretrained(
        args.hf, torch_dtype=torch.bfloat16 if lora else torch.float32, attn_implementation="sdpa"
    ).to(dev)
    model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(
            r=args.lora_rank,
            lora_alpha=args.lora_alpha,
            lora_dropout=0.0,
            target_modules=args.lora_targets.split(","),
            bias="none",
        )
        model = get_peft_model(model, cfg)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.float()
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    n_train = sum(p.numel() for p in trainable)
    n_all = sum(p.numel() for p in model.parameters())
    decay = [p for p in trainable if p.dim() >= 2]
    no_decay = [p for p in trainable if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda",
    )
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    rows, tgts = build_rows(args.data, args.seq_len, pad)
    n_rows = rows.shape[0]
    if n_rows < args.batch:
        sys.exit("%s: %d rows, fewer than --batch %d" % (args.data, n_rows, args.batch))
    x_all = torch.from_numpy(rows).to(dev)
    y_all = torch.from_numpy(tgts).to(dev)
    trained = float((y_all != -100).sum()) / y_all.numel()

    def loss_fn(m, x, y):
        logits = m(input_ids=x).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), ignore_index=-100)

    fwd = torch.compile(loss_fn) if args.mode == "compile" else loss_fn

    def step(i):
        s = (i * args.batch) % (n_rows - args.batch + 1)
        x, y = x_all[s : s + args.batch], y_all[s : s + args.batch]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fwd(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for i in range(args.warmup):
        step(i)
    times = []
    for i in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step(i)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    tps = args.batch * args.seq_len / med
    mem = torch.cuda.max_memory_allocated() / 2**30 if dev.type == "cuda" else 0.0
    impl = "torch-%s%s" % ("peft-" if lora else "", args.mode)
    print("%s: %d parameters (%d trainable), batch %d x %d (%.1f%% trained), median step %.2f ms, %.0f tokens/s, "
          "peak memory %.2f GiB, last loss %.4f" % (impl, n_all, n_train, args.batch, args.seq_len, 100 * trained,
                                                   med * 1e3, tps, mem, loss))
    print("RESULT " + json.dumps({"impl": impl, "lora_rank": args.lora_rank, "tokens_per_s": round(tps, 1),
                                  "step_ms": round(med * 1e3, 3), "trainable": n_train, "params": n_all,
                                  "peak_gib": round(mem, 3), "loss": loss}))


if __name__ == "__main__":
    main()
