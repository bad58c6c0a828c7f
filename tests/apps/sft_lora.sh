#!/bin/sh
# colossal-sft with LoRA end to end on CPU: a tiny pretrained checkpoint
# fine-tuned through adapters on the embedded instruction set; the masked
# loss falls; 1 rank and 2 data-parallel ranks give the same losses within
# 1e-5; a run stopped at step 12 resumes bit-exactly (dropout on: the masks
# follow the step) and activation checkpointing changes no bit; the merged
# export and the PEFT adapter (lora.init) on the base give the run's
# held-out loss within 1e-5, for GPT-2 and for a Llama on packed rows; bad
# LoRA settings are refused naming what is wrong.
. "$top_srcdir/tests/apps/sft_lib.sh"
sft_setup
SFT="--model.path $TMP/pt/checkpoints --data.train $TMP/ex/train.jsonl --data.valid $TMP/ex/held_out.jsonl
  --train.steps 24 --eval.interval 12 --checkpoint.every 12 $SFT_TINY --train.micro_batch 2 --train.grad_accum 2
  --optim.lr 1e-2 --lora.rank 4 --lora.alpha 8 --lora.targets c_attn,c_proj,c_fc"

# shellcheck disable=SC2086
run_sft 1 $SFT --run.dir "$TMP/l1"
expect_ok
expect_grep out '^lora: rank 4, alpha 8 \(scale 2\), dropout 0, targets c_attn,c_proj,c_fc: 8 adapters, 8192 trainable'
expect_grep out '^  optimizer state \(AdamW m, v\) +0\.06 MiB'
M1="$TMP/l1/metrics.jsonl"
# MFU of a frozen base: 4 FLOPs per frozen matmul parameter (forward and
# input gradients), 6 per adapter parameter, and the attention's 12 L T d
# (2 layers x 64 positions x d_model 64).
grep '"kind":"start"' "$M1" | tr ',:' '\n\n' | awk -v a=8192 -v attn=98304 '
    /"matmul_params"/ {getline; n=$1} /"flops_per_token"/ {getline; f=$1}
    END {w = 4*n + 6*a + attn; r = (f-w)/w; if (r < 0) r = -r; printf "flops/token %g, expected %g\n", f, w; exit !(r < 1e-5)}' ||
    fail "a LoRA run's FLOPs per token are not 4 N + 6 N_adapters + 12 L T d"
field train loss "$M1" | awk 'NR==1{f=$2} NR>19{s+=$2;n++} END{printf "first %.4f, last-5 mean %.4f\n", f, s/n;
    exit !(s/n < 0.9*f)}' || fail "the masked loss did not fall by 10% through the adapters"
for f in adapter/adapter_config.json adapter/adapter_model.safetensors merged/config.json merged/model.safetensors \
    merged/vocab.json; do
    [ -s "$TMP/l1/lora/$f" ] || fail "no $f in run.dir/lora"
done
grep -q '"peft_type": "LORA"' "$TMP/l1/lora/adapter/adapter_config.json" || fail "adapter_config.json: no peft_type"

# Two data-parallel ranks: the same losses.
# shellcheck disable=SC2086
run_sft 2 $SFT --train.grad_accum 1 --run.dir "$TMP/l2"
expect_ok
close_losses "$M1" "$TMP/l2/metrics.jsonl" "1 vs 2 ranks"

# Dropout on, stopped after step 12, resumed: bitwise the uninterrupted run.
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.dropout 0.1 --run.dir "$TMP/d1"
expect_ok
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.dropout 0.1 --train.stop_at 12 --run.dir "$TMP/d2"
expect_rc 3
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.dropout 0.1 --resume latest --run.dir "$TMP/d2"
expect_ok
same_losses "$TMP/d1/metrics.jsonl" "$TMP/d2/metrics.jsonl" "LoRA with dropout resumed at step 12"
field train loss "$M1" >"$TMP/a"
field train loss "$TMP/d1/metrics.jsonl" >"$TMP/b"
! cmp -s "$TMP/a" "$TMP/b" || fail "lora.dropout 0.1 trained exactly as dropout 0"

# At the trained adapters (lr 0, one step): the merged export, and the base
# with the PEFT adapter, give the run's final held-out loss.
last=$(field eval val_loss "$M1" | tail -n 1 | awk '{print $2}')
ZERO="--train.steps 1 --optim.lr 0 --optim.min_lr 0 --optim.warmup_steps 0 --checkpoint.every 0 --lora.export false"
# shellcheck disable=SC2086
run_sft 1 $SFT $ZERO --model.path "$TMP/l1/lora/merged" --lora.rank 0 --run.dir "$TMP/m"
expect_ok
# shellcheck disable=SC2086
run_sft 1 $SFT $ZERO --lora.rank 0 --lora.init "$TMP/l1/lora/adapter" --run.dir "$TMP/p"
expect_ok
expect_grep out '^lora: rank 4, alpha 8 '
for d in m p; do
    field eval val_loss "$TMP/$d/metrics.jsonl" | tail -n 1 | awk -v want="$last" -v d="$d" '{r=($2-want)/want;
        if (r<0) r=-r; printf "%s: held-out loss %s, the LoRA run %s (relative %.1e)\n", d, $2, want, r; exit !(r<=1e-5)}' ||
        fail "$d: the held-out loss differs from the LoRA run's"
done

# Activation checkpointing recomputes each layer (adapters included, with
# their dropout masks) in backward: bitwise the same run.
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.dropout 0.1 --model.activation_checkpointing true --run.dir "$TMP/ck"
expect_ok
same_losses "$TMP/d1/metrics.jsonl" "$TMP/ck/metrics.jsonl" "LoRA with activation checkpointing"

# Llama (RoPE, GQA, SwiGLU) with adapters on every projection, packed rows:
# the loss falls, and the merged export gives the run's held-out loss.
# shellcheck disable=SC2086
run_np 1 $TINY --model.family llama --model.n_kv_heads 2 --data.corpus_vocab 320 --train.steps 40 --eval.interval 0 \
    --checkpoint.every 40 --run.dir "$TMP/ptl"
expect_ok
LL="--model.path $TMP/ptl/checkpoints --lora.targets all-linear --train.grad_accum 1 --data.packing true"
# shellcheck disable=SC2086
run_sft 1 $SFT $LL --run.dir "$TMP/ll"
expect_ok
expect_grep out '^lora: rank 4, alpha 8 \(scale 2\), dropout 0, targets all-linear: 14 adapters'
field train loss "$TMP/ll/metrics.jsonl" | awk 'NR==1{f=$2} NR>19{s+=$2;n++} END{printf "llama first %.4f, last-5 mean %.4f\n",
    f, s/n; exit !(s/n < 0.9*f)}' || fail "the Llama LoRA run's loss did not fall by 10%"
grep -q '"self_attn.q_proj"' "$TMP/ll/lora/adapter/adapter_config.json" || fail "all-linear not spelled out for peft"
last=$(field eval val_loss "$TMP/ll/metrics.jsonl" | tail -n 1 | awk '{print $2}')
# shellcheck disable=SC2086
run_sft 1 $SFT $LL $ZERO --model.path "$TMP/ll/lora/merged" --lora.rank 0 --run.dir "$TMP/llm"
expect_ok
field eval val_loss "$TMP/llm/metrics.jsonl" | tail -n 1 | awk -v want="$last" '{r=($2-want)/want; if (r<0) r=-r;
    printf "llama merged: held-out loss %s, the LoRA run %s (relative %.1e)\n", $2, want, r; exit !(r<=1e-5)}' ||
    fail "the Llama merged export's held-out loss differs from the LoRA run's"

# Refusals: a target that matches nothing, ZeRO offload, a broken adapter.
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.targets c_attn,q_proj --run.dir "$TMP/e1"
expect_rc 2
expect_grep err "lora.targets: 'q_proj' matches no module of this gpt2 model .*transformer.h.\{l\}.attn.c_attn"
# shellcheck disable=SC2086
run_sft 1 $SFT --zero.offload true --run.dir "$TMP/e2"
expect_rc 2
expect_grep err 'LoRA \(lora.rank=4\) with zero.stage=0 and zero.offload=true'
mkdir -p "$TMP/bad" && echo '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": "c_.*"}' \
    >"$TMP/bad/adapter_config.json"
# shellcheck disable=SC2086
run_sft 1 $SFT --lora.rank 0 --lora.init "$TMP/bad" --run.dir "$TMP/e3"
expect_rc 2
expect_grep err "bad/adapter_config.json: field 'target_modules': a string is a regular expression"
echo "PASS"
