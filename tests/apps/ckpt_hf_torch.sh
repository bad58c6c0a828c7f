#!/bin/sh
# Hugging Face interchange against an independent forward in PyTorch that
# reads the directory the way transformers does (tests/parity/hf_reference.py:
# Conv1D x @ W + b for GPT-2, nn.Linear and rotate_half RoPE for Llama, sizes
# from config.json). Logits must agree within 1e-5 relative:
#   export: colossal's logits vs the reference on colossal's HF export
#           (f32; bf16 + sharded re-imported by colossal);
#   import: a directory written by the reference the way save_pretrained lays
#           it out (f32, bf16 sharded tied, f16 sharded) imported by colossal.
. "$top_srcdir/tests/apps/ckpt_hf_lib.sh"
need_torch
ref() { OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$HF_REF" "$@" || fail "hf_reference.py $*"; }

pairs=
for fam in gpt2 llama; do
    "$LOGITS_BIN" export $fam "$TMP/$fam" "$TMP/$fam.logits" || fail "export $fam"
    pairs="$pairs $TMP/$fam $TMP/$fam.logits"
done
# bf16, sharded: the file's bf16 weights are what both sides compute with
"$LOGITS_BIN" export llama "$TMP/l16" "$TMP/unused.logits" bf16 20000 || fail "export llama bf16"
[ -f "$TMP/l16/model.safetensors.index.json" ] || fail "no index for a sharded export"
"$LOGITS_BIN" import "$TMP/l16" "$TMP/unused.logits" "$TMP/l16.logits" || fail "import llama bf16"
pairs="$pairs $TMP/l16 $TMP/l16.logits"

i=0
for args in "gpt2" "gpt2 --tied --dtype bf16 --shard 30000" "llama" "llama --tied --dtype f16 --shard 20000"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    ref make $args --seed $i "$TMP/m$i" "$TMP/m$i.tokens"
    "$LOGITS_BIN" import "$TMP/m$i" "$TMP/m$i.tokens" "$TMP/m$i.logits" || fail "colossal import of $args"
    pairs="$pairs $TMP/m$i $TMP/m$i.logits"
done
# shellcheck disable=SC2086
ref check $pairs
echo ok
