#!/bin/sh
# Writes, on the development machine, a colossal-sft export whose vocabulary
# grew by chatml's special tokens (320 -> 322 tokens, the added embedding
# rows the mean of the source's) for tests/gpu/hf_transformers.py to open
# with transformers on a machine that has it:
#
#   tests/gpu/sft-tokens-prepare.sh BUILDDIR OUTDIR
#
# OUTDIR/sft-hf       the export (config.json vocab_size 322, tokenizer with
#                     <|im_start|> 320 and <|im_end|> 321 as added tokens)
# OUTDIR/sft.logits   colossal's logits for pseudo-random ids below 322
# OUTDIR/text.txt     one conversation rendered with chatml, and
# OUTDIR/text.ids     colossal's ids for it (colossal-data sft-preprocess)
# Then, there: tests/gpu/hf_transformers.py model sft-hf sft.logits and
#              tests/gpu/hf_transformers.py tokenizer sft-hf text.txt text.ids
set -eu
b=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
mpi="mpiexec --allow-run-as-root --oversubscribe"
rm -rf "${out:?}"/*
$mpi -n 1 "$b/apps/colossal-pretrain" --model.n_layers 2 --model.d_model 64 --model.n_heads 4 --train.seq_len 64 \
    --train.micro_batch 4 --train.steps 20 --optim.warmup_steps 2 --checkpoint.every 20 --eval.interval 0 \
    --data.corpus_docs 600 --data.corpus_vocab 320 --generate.tokens 0 --run.dir "$out/pt" --run.peak_tflops 1 \
    --log.timestamps false >"$out/log" 2>&1
"$b/apps/colossal-data" sft-example --out "$out/ex" --docs 200 >>"$out/log" 2>&1
$mpi -n 1 "$b/apps/colossal-sft" --model.path "$out/pt/checkpoints" --data.train "$out/ex/train.jsonl" \
    --data.chat_template chatml --train.seq_len 64 --train.micro_batch 4 --train.steps 4 --optim.warmup_steps 1 \
    --checkpoint.every 4 \
    --run.dir "$out/sft" --run.peak_tflops 1 --log.timestamps false >>"$out/log" 2>&1
$mpi -n 1 "$b/apps/colossal-ckpt" export --input "$out/sft/checkpoints" --output "$out/sft-hf" \
    --tokenizer "$out/sft/tokenizer" >>"$out/log" 2>&1
"$b/tests/unit/test_hf_logits" import "$out/sft-hf" - "$out/sft.logits" >>"$out/log" 2>&1
printf '%s\n' '{"messages":[{"role":"user","content":"What is 2 + 3?"},{"role":"assistant","content":"The answer is 5."}]}' \
    >"$out/one.jsonl"
printf '<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\nThe answer is 5.<|im_end|>\n' >"$out/text.txt"
"$b/apps/colossal-data" sft-preprocess --input "$out/one.jsonl" --output-prefix "$out/text" \
    --tokenizer "$out/sft/tokenizer" --chat-template chatml --seq-len 0 >>"$out/log" 2>&1
/usr/bin/python3 - "$out/text" <<'PY'
import struct, sys
p = sys.argv[1]
code = open(p + ".idx", "rb").read()[17]
fmt = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}[code]
raw = open(p + ".bin", "rb").read()
ids = struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw)
open(p + ".ids", "w").write(" ".join(str(i) for i in ids) + "\n")
PY
rm -rf "$out/pt/checkpoints" "$out/sft/checkpoints" "$out/text.bin" "$out/text.idx" "$out/text_loss_mask".*
ls "$out"
