#!/bin/sh
# ZeRO through colossal-pretrain's config: the tiny model trained with
# zero.stage=3 + zero.offload on 4 ranks (and stage 2 on 2 ranks with
# gradient accumulation, stage 1 with zero.overlap=false) reproduces the 1-rank run's train and validation
# loss at every step within 1e-5 relative; gradients reduced in bf16 or as
# FP8 and f16 with dynamic loss scaling track it; the memory plan is printed before training, and a
# train.mem_limit below it is refused naming what would fit; greedy samples
# work under ZeRO-3. (Checkpoints of sharded state: ckpt_reshard_zero.sh.)
. "$top_srcdir/tests/apps/pretrain_lib.sh"

STEPS="--train.steps 10 --eval.interval 5 --eval.batches 2 --log.interval 5"
# The same 16-sequence global batch everywhere.
# shellcheck disable=SC2086
run_np 1 $TINY $STEPS --train.grad_accum 4 --run.dir "$TMP/a"
expect_ok
expect_grep out 'memory plan per rank: ZeRO stage 0 over dp 1'
# shellcheck disable=SC2086
run_np 4 $TINY $STEPS --zero.stage 3 --zero.offload true --generate.tokens 8 --run.dir "$TMP/b"
expect_ok
expect_grep out 'memory plan per rank: ZeRO stage 3 \+ CPU offload over dp 4'
expect_grep out 'master weights \(f32\) +[0-9.]+ MiB  host'
expect_grep out 'zero: stage 3 \+ CPU offload over dp 4'
# Sampling gathers weights over dp, so all ranks decode; one prints.
[ "$(grep -c 'samples (greedy' "$TMP/out")" -eq 1 ] || fail "expected one samples section from the ZeRO-3 run"
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.stage 2 --zero.bucket_mb 0.05 --train.micro_batch 2 --train.grad_accum 4 \
    --run.dir "$TMP/c"
expect_ok
expect_grep out 'zero: stage 2 over dp 2, [2-9] gradient buckets'
# Gradients reduced in bf16: close to the f32 run at stage 1 (one rounding
# of the accumulated gradient) and at stages 2 and 3 (one rounding per
# microbatch, summed in f32 on the owner).
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.stage 1 --zero.reduce_dtype bf16 --train.grad_accum 2 --run.dir "$TMP/f"
expect_ok
expect_grep out 'gradient buckets? of <= 25 MiB reduced in bf16'
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.stage 2 --zero.reduce_dtype bf16 --zero.bucket_mb 0.05 --train.micro_batch 2 \
    --train.grad_accum 4 --run.dir "$TMP/g"
expect_ok
expect_grep out 'zero: stage 2 over dp 2, [2-9] gradient buckets of <= 0.05 MiB reduced in bf16'
# shellcheck disable=SC2086
run_np 4 $TINY $STEPS --zero.stage 3 --zero.reduce_dtype bf16 --run.dir "$TMP/h"
expect_ok
# and as FP8 (E5M2 codes, a scale per chunk) at stage 2 over 4 microbatches
# and at stage 0 (an all-reduce: reduce-scatter and all-gather, both FP8),
# close to f32 too
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.stage 2 --zero.reduce_dtype fp8 --zero.bucket_mb 0.05 --train.micro_batch 2 \
    --train.grad_accum 4 --run.dir "$TMP/i"
expect_ok
expect_grep out 'zero: stage 2 over dp 2, [2-9] gradient buckets of <= 0.05 MiB reduced as FP8 \(E5M2\)'
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.reduce_dtype fp8 --zero.bucket_mb 0.05 --train.grad_accum 2 --run.dir "$TMP/j"
expect_ok
expect_grep out 'zero: stage 0 over dp 2, [2-9] gradient buckets of <= 0.05 MiB reduced as FP8 \(E5M2\)'
# Every bucket reduced after the backward instead of during it: the same numbers.
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --zero.stage 1 --zero.bucket_mb 0.05 --zero.overlap false --train.grad_accum 2 \
    --run.dir "$TMP/e"
expect_ok

# compare KIND KEY RUN N TOL: every record of RUN within TOL relative of run a.
compare() {
    field "$1" "$2" "$TMP/a/metrics.jsonl" >"$TMP/ref"
    field "$1" "$2" "$TMP/$3/metrics.jsonl" >"$TMP/got"
    [ "$(wc -l <"$TMP/ref")" -eq "$4" ] || fail "run a: expected $4 $1 records"
    [ "$(wc -l <"$TMP/got")" -eq "$4" ] || fail "run $3: expected $4 $1 records"
    paste "$TMP/ref" "$TMP/got" | awk -v run="$3" -v key="$2" -v tol="$5" '{
        d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
        if ($1 != $3 || !(r <= tol)) { printf "run %s step %s: %s %s vs %s (relative %g)\n", run, $1, key, $4, $2, r; bad = 1 }
        if (r > worst) worst = r
    } END { printf "run %s: %s within %g relative of the 1-rank run\n", run, key, worst; exit bad }' ||
        fail "run $3 does not reproduce the 1-rank $2"
}
for run in f g h; do compare train loss $run 10 1e-3; done
for run in i j; do compare train loss $run 10 1e-2; done
for run in b c e; do
    compare train loss $run 10 1e-5
    compare train grad_norm $run 10 1e-5
    compare eval val_loss $run 2 1e-5
done
field train loss "$TMP/a/metrics.jsonl" | awk 'NR==1{f=$2} END{exit !($2 < 0.9*f)}' || fail "the loss did not fall"

# f16 working weights with dynamic loss scaling (the CPU computes in f32
# over them): no overflow here, and the curve stays close to f32.
# shellcheck disable=SC2086
run_np 4 $TINY $STEPS --zero.stage 1 --precision f16 --run.dir "$TMP/d"
expect_ok
expect_grep out 'weights f16, compute f32, dynamic loss scaling'
expect_no_grep out 'skipped'
compare train loss d 10 1e-2

# Over the limit: refused before allocating, with the options that fit.
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --train.micro_batch 64 --train.mem_limit 20MiB --run.dir "$TMP/e"
expect_rc 2
expect_grep err 'memory plan: .* exceeds the memory limit of 20.0 MiB'
expect_grep err 'it would fit with: .*(model.activation_checkpointing=true|train.micro_batch=)'
# shellcheck disable=SC2086
run_np 2 $TINY $STEPS --train.mem_limit 12parsecs --run.dir "$TMP/f"
expect_rc 2
expect_grep err "train.mem_limit='12parsecs' is not a size"

echo "PASS"
