#!/bin/sh
# Writes, on the development machine, the Hugging Face exports that
# tests/gpu/hf_transformers.py opens with transformers on a machine that has
# it (docs/huggingface.md, "Checked with transformers"):
#
#   tests/gpu/hf-prepare.sh BUILDDIR OUTDIR
#
# OUTDIR/gpt2, OUTDIR/llama       tiny f32 exports + colossal's logits (*.logits)
# OUTDIR/l16                      Llama, bf16, sharded with an index
# OUTDIR/run                      a colossal-pretrain checkpoint (Llama GQA, bf16
#                                 working weights, trained BPE) exported with its
#                                 tokenizer, plus a text and colossal's ids for it
# Then, there: tests/gpu/hf_transformers.py model gpt2 gpt2.logits ... and
#              tests/gpu/hf_transformers.py tokenizer run/hf text.txt text.ids
set -eu
b=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
mpi="mpiexec --allow-run-as-root --oversubscribe"
rm -rf "${out:?}"/*
for fam in gpt2 llama; do
    "$b/tests/unit/test_hf_logits" export $fam "$out/$fam" "$out/$fam.logits"
done
"$b/tests/unit/test_hf_logits" export llama "$out/l16" "$out/unused.logits" bf16 20000
"$b/tests/unit/test_hf_logits" import "$out/l16" "$out/unused.logits" "$out/l16.logits"
rm -f "$out/unused.logits"

$mpi -n 2 "$b/apps/colossal-pretrain" --model.family llama --model.n_layers 2 --model.d_model 64 \
    --model.n_heads 4 --model.n_kv_heads 2 --model.param_dtype bf16 --train.seq_len 32 --train.micro_batch 2 \
    --train.steps 3 --optim.warmup_steps 1 --checkpoint.every 3 --data.corpus_docs 300 --data.corpus_vocab 300 \
    --generate.tokens 0 --run.dir "$out/train" --run.peak_tflops 1 --log.timestamps false >"$out/train.log" 2>&1
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/train/checkpoints" --output "$out/run" \
    --tokenizer "$out/train/tokenizer" >>"$out/train.log" 2>&1
# colossal's ids for a text: one document through colossal-data preprocess,
# read back from the Megatron .bin (dtype from the .idx header), EOD dropped
printf 'Once upon a time, a little fox found 12 + 30 = 42 stones.\nThe end!' >"$out/text.txt"
$mpi -n 1 "$b/apps/colossal-data" preprocess --input "$out/text.txt" --format text \
    --output "$out/text" --tokenizer "$out/train/tokenizer" --progress 0 >>"$out/train.log" 2>&1
/usr/bin/python3 - "$out/text" <<'PY'
import sys, numpy as np
p = sys.argv[1]
idx = open(p + ".idx", "rb").read()
code = idx[17]
dt = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}[code]
ids = np.fromfile(p + ".bin", dtype=dt)[:-1]  # the appended end-of-document
open(p + ".ids", "w").write(" ".join(str(int(i)) for i in ids) + "\n")
PY
rm -rf "$out/train/checkpoints" "$out/text.bin" "$out/text.idx"
ls "$out"
