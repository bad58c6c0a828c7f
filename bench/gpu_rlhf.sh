#!/bin/sh
# One GRPO iteration timed on a GPU (issue #24): a GPT-2 124M policy (random
# weights from transformers' GPT2Config(), GPT-2's own tokenizer), the
# embedded arithmetic prompts, rollouts from colossal's inference engine
# over the policy's weights, then the update (reference log-probs, one
# optimizer step). colossal-rlhf's kind rl records time the two phases
# apart: rollout_tokens_per_s (generated tokens / rollout seconds) and
# update_tokens_per_s (row tokens through forward+backward / update
# seconds, the reference and old-policy passes included), and the GPU
# memory in use (cudaMemGetInfo) as each phase ends: RLHF_ARGS="--placement.frozen
# host --rollout.kv_memory 8GiB" against device shows the frozen weights and
# the KV pool taking turns, and placement_s what the turns cost a step.
#
#   bench/gpu_rlhf.sh OUTDIR BIN_DIR GPT2_VOCAB_DIR PROMPTS.jsonl [STEPS]
#
# BIN_DIR holds colossal-rlhf and libcolossal-core.so.0 (a CUDA build);
# GPT2_VOCAB_DIR GPT-2's encoder.json and vocab.bpe
# (tests/data/bpe/fetch-gpt2-vocab.sh); PROMPTS a colossal-data rl-example
# prompts file; RLHF_ARGS, more colossal-rlhf keys. Needs python3 with torch
# and transformers.
set -eu
out=$1 bin=$2 vocab=$3 prompts=$4 steps=${5:-4}
mkdir -p "$out"
model=$out/gpt2-124m
python3 - "$model" <<'PYEOF'
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
GPT2LMHeadModel(GPT2Config()).save_pretrained(sys.argv[1], safe_serialization=True)
PYEOF
cp "$vocab/encoder.json" "$model/vocab.json"
cp "$vocab/vocab.bpe" "$model/merges.txt"
mpirun --allow-run-as-root --bind-to none -n 1 "$bin/colossal-rlhf" --rlhf.algo grpo --model.path "$model" \
    --data.train "$prompts" --train.seq_len 256 --rollout.max_new_tokens 128 --rollout.prompts 64 \
    --rollout.samples 8 --train.micro_batch 32 --train.steps "$steps" --precision bf16 --policy.kl_coef 0.04 \
    --optim.lr 1e-6 --optim.min_lr 1e-6 --optim.warmup_steps 1 --log.timestamps false --log.interval 1 --run.dir "$out/run" \
    ${RLHF_ARGS:-} \
    >"$out/colossal.log" 2>&1 || { tail -30 "$out/colossal.log"; exit 1; }
grep -E '^(colossal-rlhf|model|rollouts|batch|placement|  (frozen|rollout KV|total))' "$out/colossal.log"
python3 - "$out/run/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"rl"' in l]
print("| step | rollout s | generated tokens/s | response len | score s | update s | update tokens/s "
      "| GPU MiB in use after rollout / scoring / update | placement s |")
print("|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for r in rows:
    mem = " / ".join("%.0f" % m for m in r.get("device_used_mib", []))
    print("| %d | %.3f | %.0f | %.1f | %.3f | %.3f | %.0f | %s | %.4f |" % (
        r["step"], r["rollout_s"], r["rollout_tokens_per_s"], r["response_len"], r["score_s"], r["update_s"],
        r["update_tokens_per_s"], mem, r.get("placement_s", 0)))
PYEOF
