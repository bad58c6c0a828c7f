#!/bin/sh
# colossal-moe checkpoints hold every expert as a global tensor (one
# dataset per expert, written by its owner): a checkpoint saved at ep = 4
# resumes bit-exactly at ep = 4 (the losses of the steps after it equal
# the uninterrupted run's as printed) and within 1e-5 at ep = 2 and ep = 1
# (4 ranks each: the same global batch); the same with ZeRO stage 1 at
# ep = 2.
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

# ZeRO stage 1 at ep = 2 (dense moments sharded over dp, experts' over
# edp = 2): it reads the ep = 4 checkpoint within 1e-5; its own checkpoint
# holds the moments as global tensors (expert 7's too), resumes bit-exactly
# on its layout and within 1e-5 at ep = 1, ZeRO stage 0.
# shellcheck disable=SC2086
run_np 4 $MOE --mesh.ep 2 --zero.stage 1 --checkpoint.resume "$CK" --run.dir "$TMP/z1from4"
expect_ok
close_losses "$TMP/a/metrics.jsonl" "$TMP/z1from4/metrics.jsonl" 4 1e-5 "resumed at ep=2 zero 1"
# shellcheck disable=SC2086
run_np 4 $MOE --mesh.ep 2 --zero.stage 1 --checkpoint.every 4 --run.dir "$TMP/z"
expect_ok
CK="$TMP/z/checkpoints/step-00000004.h5"
[ -f "$CK" ] || fail "no ZeRO checkpoint at step 4"
h5ls -r "$CK" | grep -q 'optim/exp_avg_sq/h\.1\.moe\.experts\.7\.fc\.weight' ||
    fail "expert 7's second moment is not a dataset of the ZeRO checkpoint"
# shellcheck disable=SC2086
run_np 4 $MOE --mesh.ep 2 --zero.stage 1 --checkpoint.resume "$CK" --checkpoint.every 4 --run.dir "$TMP/z1"
expect_ok
close_losses "$TMP/z/metrics.jsonl" "$TMP/z1/metrics.jsonl" 4 0 "ZeRO 1 at ep=2 resumed on its layout"
# and the step-8 weights and moments are the uninterrupted run's, bit for bit
for g in /model /optim; do
    h5diff "$TMP/z/checkpoints/step-00000008.h5" "$TMP/z1/checkpoints/step-00000008.h5" $g >"$TMP/diff" ||
        { tail -n 20 "$TMP/diff" >&2; fail "ZeRO 1 at ep=2: the resumed run's step-8 $g differs"; }
done
# shellcheck disable=SC2086
run_np 4 $MOE --mesh.ep 1 --checkpoint.resume "$CK" --run.dir "$TMP/z0"
expect_ok
close_losses "$TMP/z/metrics.jsonl" "$TMP/z0/metrics.jsonl" 4 1e-5 "ZeRO 1 at ep=2 resumed at ep=1 zero 0"
echo PASS
