#!/bin/sh
# Data parallelism reproduces the single-rank run: the same global batch of
# 8 sequences as 1 rank x 2 microbatches, 2 ranks x 1 microbatch and 2 ranks
# x 2 microbatches of 2 gives the same loss at every step (train and
# validation) within 1e-5 relative.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

STEPS="--train.steps 10 --eval.interval 5 --eval.batches 2 --log.interval 5"
# shellcheck disable=SC2086
run_np 1 $TINY $STEPS --train.grad_accum 2 --run.dir "$TMP/a"
expect_ok
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --train.grad_accum 1 --run.dir "$TMP/b"
expect_ok
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --train.micro_batch 2 --train.grad_accum 2 --run.dir "$TMP/c"
expect_ok

for run in b c; do
    compare train loss $run 10
    compare eval val_loss $run 2
done
# The loss must have moved, or equality says nothing.
field train loss "$TMP/a/metrics.jsonl" | awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' || fail "the loss did not fall"
echo "PASS"
