#!/bin/sh
# colossal-moe checkpoints hold every expert as a global tensor (one
# dataset per expert, written by its owner): a checkpoint saved at ep = 4
# resumes bit-exactly at ep = 4 (the losses of the steps after it equal
# the uninterrupted run's as printed) and within 1e-5 at ep = 2 and ep = 1
# (4 ranks each: the same global batch).
. "$top_srcdir/tests/apps/pretrain_lib.sh"
PRETRAIN_BIN="$top_builddir/apps/colossal-moe"
MOE="--model.n_layers 2 --model.d_model 32 --model.n_heads 4 --model.n_kv_heads 2 --moe.experts 8 --moe.ffn 32
  --train.seq_len 32 --train.micro_batch 2 --train.steps 8 --optim.schedule constant --optim.warmup_steps 2
  --data.corpus_docs 1500 --data.corpus_vocab 0 --eval.interval 0 --run.peak_tflops 1 --log.timestamps false"

# shellcheck disable=SC2086
run_np 4 $MOE --mesh.ep 4 --checkpoint.every 4 --run.dir "$TMP/a"
expect_ok
CK="$TMP/a/checkpoints/step-00000004.h5"
[ -f "$CK" ] || fail "no checkpoint at step 4"
h5ls "$CK/model/h.1.moe.experts.7.fc.weight" >/dev/null 2>&1 || h5ls -r "$CK" | grep -q 'h\.1\.moe\.experts\.7\.fc\.weight' ||
    fail "expert 7 (ep rank 3's) is not a dataset of the checkpoint"
for ep in 4 2 1; do
    # shellcheck disable=SC2086
    run_np 4 $MOE --mesh.ep $ep --checkpoint.resume "$CK" --run.dir "$TMP/ep$ep"
    expect_ok
done
close_losses "$TMP/a/metrics.jsonl" "$TMP/ep4/metrics.jsonl" 4 0 "resumed at ep=4"
close_losses "$TMP/a/metrics.jsonl" "$TMP/ep2/metrics.jsonl" 4 1e-5 "resumed at ep=2"
close_losses "$TMP/a/metrics.jsonl" "$TMP/ep1/metrics.jsonl" 4 1e-5 "resumed at ep=1"
echo PASS
