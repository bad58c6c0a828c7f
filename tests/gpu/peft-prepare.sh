#!/bin/sh
# Writes, on the development machine, what tests/gpu/peft_check.py opens with
# transformers and peft on a machine that has them (docs/sft.md "LoRA"):
#
#   tests/gpu/peft-prepare.sh BUILDDIR OUTDIR
#
# OUTDIR/{gpt2,llama}-{base,adapter,merged}, OUTDIR/{gpt2,llama}.logits
#     tiny random bases, adapters on every adaptable linear (non-zero B),
#     colossal's adapter logits (tests/unit/test_lora_logits make)
# OUTDIR/sft-{base,adapter,merged}, OUTDIR/sft.logits
#     a colossal-sft LoRA run on the embedded instruction set from a tiny
#     pretrained GPT-2 (its Hugging Face export is the base), and the logits
#     of the base with the run's PEFT adapter (test_lora_logits logits)
# Then, there, for each NAME in gpt2 llama sft:
#     python3 tests/gpu/peft_check.py OUTDIR/NAME-merged OUTDIR/NAME-base OUTDIR/NAME-adapter OUTDIR/NAME.logits
set -eu
b=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
mpi="mpiexec --allow-run-as-root --oversubscribe"
rm -rf "${out:?}"/*
for fam in gpt2 llama; do
    "$b/tests/unit/test_lora_logits" make $fam "$out/$fam-base" "$out/$fam-adapter" "$out/$fam-merged" \
        "$out/$fam.logits"
done
{
$mpi -n 1 "$b/apps/colossal-pretrain" --model.n_layers 2 --model.d_model 64 --model.n_heads 4 --train.seq_len 64 \
    --train.micro_batch 4 --optim.lr 2e-3 --train.steps 60 --data.corpus_docs 1500 --data.corpus_vocab 320 \
    --generate.tokens 0 --eval.interval 0 --checkpoint.every 60 --run.dir "$out/pt" --run.peak_tflops 1 \
    --log.timestamps false
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/pt/checkpoints" --output "$out/sft-base" \
    --tokenizer "$out/pt/tokenizer"
"$b/apps/colossal-data" sft-example --out "$out/ex" --docs 300 --seed 7 --held-out 10
$mpi -n 2 "$b/apps/colossal-sft" --model.path "$out/sft-base" --data.train "$out/ex/train.jsonl" \
    --train.seq_len 64 --train.micro_batch 4 --train.steps 20 --optim.lr 1e-2 --lora.rank 8 --lora.alpha 16 \
    --lora.targets c_attn,c_proj,c_fc --lora.dropout 0.05 --run.dir "$out/sft" --run.peak_tflops 1 \
    --log.timestamps false
} >"$out/train.log" 2>&1
mv "$out/sft/lora/adapter" "$out/sft-adapter"
mv "$out/sft/lora/merged" "$out/sft-merged"
"$b/tests/unit/test_lora_logits" logits "$out/sft-base" "$out/sft-adapter" "$out/sft.logits"
rm -rf "$out/pt" "$out/ex" "$out/sft"
ls "$out"
