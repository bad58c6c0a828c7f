#!/bin/sh
# Writes, on the development machine, what tests/gpu/infer-run.sh runs on
# the GPU machine (a build configured --with-cuda; the Debian libraries it
# links that the GPU machine lacks are unpacked under .device/root, see
# tests/gpu/ckpt-run.sh):
#
#   tests/gpu/infer-prepare.sh CUDA_BUILDDIR [OUTDIR]   (default .device/infer)
#
# OUTDIR/bin      colossal-infer, infer_bench, test_cuda_ops (stripped of debug info)
# OUTDIR/lib      libcolossal-core.so.0
# OUTDIR/hf       Hugging Face export of examples/pretrain-tiny.yaml's GPT-2 (400 steps)
# OUTDIR/hf-llama Hugging Face export of a 2-layer Llama with GQA (d 128, 4 heads / 2 kv, 200 steps)
# OUTDIR/req.jsonl 8 text prompts, 40 new tokens each, end of text ignored
set -eu
b=$(cd "$1" && pwd)
out=${2:-.device/infer}
mkdir -p "$out"
out=$(cd "$out" && pwd)
top=$(cd "$(dirname "$0")/../.." && pwd)
mpi="mpiexec --allow-run-as-root --oversubscribe"
rm -rf "${out:?}"/bin "${out:?}"/lib "${out:?}"/hf "${out:?}"/hf-llama "$out/train"
mkdir -p "$out/bin" "$out/lib"
for p in apps/colossal-infer bench/infer_bench tests/gpu/test_cuda_ops; do
    f=$b/$(dirname $p)/.libs/$(basename $p)
    [ -f "$f" ] || f=$b/$p
    strip --strip-debug -o "$out/bin/$(basename $p)" "$f"
done
strip --strip-debug -o "$out/lib/libcolossal-core.so.0" "$b/src/.libs/libcolossal-core.so.0"

cd "$top"
$mpi -n 2 "$b/apps/colossal-pretrain" --config examples/pretrain-tiny.yaml --run.dir "$out/train/gpt2" \
    --generate.tokens 0 --log.timestamps false >"$out/train-gpt2.log" 2>&1
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/train/gpt2/checkpoints" --output "$out/hf" \
    --tokenizer "$out/train/gpt2/tokenizer" >>"$out/train-gpt2.log" 2>&1
$mpi -n 2 "$b/apps/colossal-pretrain" --config examples/pretrain-tiny.yaml --model.family llama \
    --model.n_layers 2 --model.n_kv_heads 2 --train.steps 200 --checkpoint.every 200 \
    --run.dir "$out/train/llama" --generate.tokens 0 --log.timestamps false >"$out/train-llama.log" 2>&1
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/train/llama/checkpoints" --output "$out/hf-llama" \
    --tokenizer "$out/train/llama/tokenizer" >>"$out/train-llama.log" 2>&1
rm -rf "$out/train"

: >"$out/req.jsonl"
i=0
for p in "Once upon a time," "Q: What is 7 times 8? A:" "The little fox" "Q: What is 12 plus 30? A:" \
    "One day, a girl named" "The end" "Tom and his dog" "Q: What is 9 minus 4? A:"; do
    printf '{"id": "r%d", "prompt": "%s", "max_new_tokens": 40, "ignore_eos": true}\n' $i "$p" >>"$out/req.jsonl"
    i=$((i + 1))
done
du -sh "$out"
