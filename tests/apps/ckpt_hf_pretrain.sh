#!/bin/sh
# HDF5 checkpoint <-> Hugging Face through colossal-ckpt, from a real
# training run: colossal-pretrain (Llama with GQA, bf16 working weights, a
# trained BPE) checkpoints at step 3 on 2 ranks; the checkpoint inspects and
# verifies; export gives an HF directory whose every tensor equals the
# checkpoint's fp32 masters under an independent reading of both layouts
# (hf_reference.py compare-h5, h5py), whose logits the HF-convention torch
# forward reproduces, and which imports back into an HDF5 checkpoint that
# exports to the same bytes.
. "$top_srcdir/tests/apps/ckpt_hf_lib.sh"
PRETRAIN_BIN="$top_builddir/apps/colossal-pretrain"

echo "+ colossal-pretrain (2 ranks, 3 steps)"
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" --model.family llama --model.n_layers 2 --model.d_model 64 \
    --model.n_heads 4 --model.n_kv_heads 2 --model.param_dtype bf16 --train.seq_len 32 --train.micro_batch 2 \
    --train.steps 3 --optim.warmup_steps 1 --checkpoint.every 3 --data.corpus_docs 300 --data.corpus_vocab 300 \
    --generate.tokens 0 --run.dir "$TMP/run" --run.peak_tflops 1 --log.timestamps false >"$TMP/out" 2>"$TMP/err" ||
    fail "colossal-pretrain"
H5="$TMP/run/checkpoints/step-00000003.h5"
[ -f "$H5" ] || fail "no step-3 checkpoint"

ckpt 2 inspect "$TMP/run/checkpoints"
expect_ok
expect_grep out "colossal HDF5 checkpoint"
expect_grep out "step 3, .* with optimizer state"
expect_grep out "master/h.1.attn.qkv.weight +f32 +\[128,64\]"
[ "$(grep -c 'colossal HDF5 checkpoint' "$TMP/out")" -eq 1 ] || fail "inspect printed more than once"
ckpt 2 verify "$H5"
expect_ok
expect_grep out "every checksum matches"

ckpt 2 export --input "$TMP/run/checkpoints" --output "$TMP/hf" --tokenizer "$TMP/run/tokenizer"
expect_ok
expect_grep out "^export: .* LlamaForCausalLM, 21 tensors"
ckpt 1 verify "$TMP/hf"
expect_ok
for f in vocab.json merges.txt tokenizer.json tokenizer_config.json; do
    [ -s "$TMP/hf/$f" ] || fail "export did not ship $f"
done

# HF -> HDF5 -> HF: the same bytes
ckpt 2 import --input "$TMP/hf" --output "$TMP/back.h5"
expect_ok
ckpt 1 verify "$TMP/back.h5"
expect_ok
ckpt 1 inspect "$TMP/back.h5"
expect_grep out "weights only"
expect_grep out "model/wte.weight +f32 +\[384,64\]"
ckpt 1 convert --input "$TMP/back.h5" --output "$TMP/hf2" --tokenizer "$TMP/hf"
expect_ok
cmp -s "$TMP/hf/model.safetensors" "$TMP/hf2/model.safetensors" || fail "HF -> HDF5 -> HF changed the weights"
cmp -s "$TMP/hf/config.json" "$TMP/hf2/config.json" || fail "HF -> HDF5 -> HF changed config.json"

# errors: a corrupt checkpoint, a directory that is no checkpoint
cp "$H5" "$TMP/bad.h5"
size=$(wc -c <"$TMP/bad.h5")
printf 'XXXXXXXXXXXXXXXX' | dd of="$TMP/bad.h5" bs=1 seek=$((size - 4096)) conv=notrunc 2>/dev/null
ckpt 1 verify "$TMP/bad.h5"
expect_fail
expect_grep err "fail verification"
ckpt 1 export --input "$TMP/hf" --output "$TMP/x"
expect_fail
expect_grep err "not an HDF5 checkpoint"

need_torch
"$PYTHON_TORCH" -c 'import h5py' 2>/dev/null || { echo "SKIP: the PyTorch python has no h5py"; exit 77; }
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$HF_REF" compare-h5 "$H5" "$TMP/hf" || fail "the export is not the checkpoint"
"$LOGITS_BIN" import "$TMP/hf" - "$TMP/hf.logits" || fail "colossal import"
OMP_NUM_THREADS=1 "$PYTHON_TORCH" "$HF_REF" check "$TMP/hf" "$TMP/hf.logits" || fail "HF-convention logits"
echo ok
