#!/bin/sh
# The example configs parse and run: the quickstart as written (fewer steps
# and documents), the real-hardware ones shrunk to a tiny model on the
# embedded corpus with every other key as the file says.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
EX="$top_srcdir/examples"

run_np 2 --config "$EX/pretrain-tiny.yaml" --train.steps 6 --optim.warmup_steps 2 --data.corpus_docs 600 \
    --eval.interval 3 --eval.batches 1 --generate.tokens 4 --run.dir "$TMP/tiny"
expect_ok
expect_grep out 'model: gpt2, 4 layers, d_model 128, 4 heads'
expect_grep out '^done: 6 steps'
expect_grep out '^> Once upon a time,'

SHRINK="--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --model.ffn_hidden 0 --model.vocab_size 0
  --model.param_dtype f32 --model.act_dtype f32 --train.seq_len 32 --train.micro_batch 2 --train.grad_accum 2
  --train.steps 3 --optim.warmup_steps 1 --eval.interval 3 --eval.batches 1 --data.path= --data.tokenizer=
  --data.split 98,2,0 --data.corpus_docs 300 --data.corpus_vocab 0 --generate.tokens 0 --run.peak_tflops 1
  --run.device cpu"
for ex in gpt2-124m llama; do
    # shellcheck disable=SC2086
    run_np 1 --config "$EX/pretrain-$ex.yaml" $SHRINK --model.n_kv_heads 0 --run.dir "$TMP/$ex"
    expect_ok
    expect_grep out '^done: 3 steps'
    expect_grep out '^eval at step 3'
done
expect_grep out 'model: llama, 2 layers'
expect_grep out 'untied'
# The long-context example keeps its mesh (sp 4, ring) on 4 ranks; the shrunk
# seq_len 32 splits into 8 zigzag chunks.
# shellcheck disable=SC2086
run_np 4 --config "$EX/pretrain-long-context.yaml" $SHRINK --model.n_kv_heads 0 \
    --run.dir "$TMP/long"
expect_ok
expect_grep out 'dp=1 sp=4'
expect_grep out '^done: 3 steps'
echo "PASS"
