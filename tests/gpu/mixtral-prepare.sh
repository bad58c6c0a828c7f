#!/bin/sh
# Writes, on the development machine, what tests/gpu/mixtral_check.py opens
# with transformers' MixtralForCausalLM (docs/moe.md "Hugging Face Mixtral"):
#
#   tests/gpu/mixtral-prepare.sh BUILDDIR OUTDIR
#
# OUTDIR/mixtral      a colossal-moe run (2 layers, 8 experts top-2, trained
#                     20 steps on the embedded corpus at ep = 2) exported by
#                     `colossal-ckpt export` from its checkpoint
# OUTDIR/mixtral.logits  colossal's logits of that directory, imported back
#                     (test_hf_logits import): tokens I32 [B,T], logits F32
# Then, there:
#     python3 tests/gpu/mixtral_check.py OUTDIR/mixtral OUTDIR/mixtral.logits
set -eu
b=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
mpi="mpiexec --allow-run-as-root --oversubscribe"
rm -rf "${out:?}"/*
{
$mpi -n 2 "$b/apps/colossal-moe" --model.n_layers 2 --model.d_model 64 --model.n_heads 4 --model.n_kv_heads 2 \
    --moe.experts 8 --moe.ffn 48 --mesh.ep 2 --train.seq_len 32 --train.micro_batch 2 --train.steps 20 \
    --optim.lr 3e-3 --data.corpus_docs 1500 --data.corpus_vocab 320 --eval.interval 0 --checkpoint.every 20 \
    --run.dir "$out/run" --run.peak_tflops 1 --log.timestamps false
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/run/checkpoints" --output "$out/mixtral"
"$b/tests/unit/test_hf_logits" import "$out/mixtral" - "$out/mixtral.logits"
} >"$out/prepare.log" 2>&1 || { tail -30 "$out/prepare.log"; exit 1; }
rm -rf "$out/run"
ls "$out"
