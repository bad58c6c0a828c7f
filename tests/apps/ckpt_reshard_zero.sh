#!/bin/sh
# Checkpoints of ZeRO-sharded state through colossal-pretrain (fp32, the
# same 8-sequence global batch everywhere):
# - dp=2 zero.stage=2 stopped at step 4 (train.stop_at) writes a checkpoint
#   of global-shaped tensors, each rank its own pieces, and exits 3;
# - resumed on the same layout it continues with bitwise the same train and
#   validation losses as the uninterrupted 8-step dp=2 zero=2 run;
# - the same checkpoint resumed on dp=1 (zero 0, grad_accum 2), dp=4
#   zero.stage=3 (micro_batch 2) and dp=4 zero.stage=3 + zero.offload: every
#   remaining step's loss within 1e-5 relative of the uninterrupted run (the
#   optimizer state reshards);
# - a checkpoint saved by that dp=4 zero=3 + offload run continues on dp=2
#   zero.stage=1 within 1e-5 as well (saved under yet another layout).
. "$top_srcdir/tests/apps/pretrain_lib.sh"

# Small buckets: several per rank, so shards cut parameters into pieces.
CFG="$TINY --train.steps 8 --eval.interval 4 --eval.batches 2 --log.interval 100 --zero.bucket_mb 0.05"
Z2="--zero.stage 2"

# shellcheck disable=SC2086
run_np 2 $CFG $Z2 --run.dir "$TMP/a"
expect_ok

# shellcheck disable=SC2086
run_np 2 $CFG $Z2 --run.dir "$TMP/b" --checkpoint.every 100 --train.stop_at 4
expect_rc 3
expect_grep out '^zero: stage 2 over dp 2'
expect_grep out "^checkpoint at step 4: $TMP/b/checkpoints/step-00000004.h5"
cp "$TMP/b/checkpoints/step-00000004.h5" "$TMP/step4.h5"
if command -v h5ls >/dev/null 2>&1; then
    # Global shapes (vocabulary padded to 384 rows), not shard shapes.
    h5ls -r "$TMP/step4.h5" >"$TMP/ls"
    for t in model/wte.weight optim/exp_avg/wte.weight optim/exp_avg_sq/wte.weight; do
        grep -Eq "^/$t +Dataset \{384, 64\}" "$TMP/ls" || fail "$t is not a [384, 64] dataset: $(grep "$t" "$TMP/ls")"
    done
fi

# shellcheck disable=SC2086
run_np 2 $CFG $Z2 --run.dir "$TMP/b" --checkpoint.every 100 --resume latest
expect_ok
expect_grep err "resumed from $TMP/b/checkpoints/step-00000004.h5: step 4"
same_losses "$TMP/a/metrics.jsonl" "$TMP/b/metrics.jsonl" "the resumed dp=2 zero=2 run"
echo "resume on dp=2 zero=2: 8 train and 2 validation losses bitwise equal"

# compare RUN FROM: RUN's train losses of the steps after FROM, within 1e-5
# relative of the uninterrupted run's.
compare() { close_losses "$TMP/a/metrics.jsonl" "$TMP/$1/metrics.jsonl" "$2" 1e-5 "run $1"; }
# shellcheck disable=SC2086
run_np 1 $CFG --train.grad_accum 2 --run.dir "$TMP/dp1" --resume "$TMP/step4.h5"
expect_ok
expect_grep err 'saved on 2 ranks \(tp=1 pp=1 dp=2\)'
compare dp1 4
# shellcheck disable=SC2086
run_np 4 $CFG --train.micro_batch 2 --zero.stage 3 --run.dir "$TMP/z3" --resume "$TMP/step4.h5"
expect_ok
expect_grep out '^zero: stage 3 over dp 4'
compare z3 4
# shellcheck disable=SC2086
run_np 4 $CFG --train.micro_batch 2 --zero.stage 3 --zero.offload true --run.dir "$TMP/z3o" --checkpoint.every 6 \
    --resume "$TMP/step4.h5"
expect_ok
expect_grep out '^zero: stage 3 \+ CPU offload over dp 4'
expect_grep out "^checkpoint at step 6: $TMP/z3o/checkpoints/step-00000006.h5"
compare z3o 4

# Saved on dp=4 zero=3 + offload at step 6, continued on dp=2 zero=1.
# shellcheck disable=SC2086
run_np 2 $CFG --zero.stage 1 --run.dir "$TMP/z1" --resume "$TMP/z3o/checkpoints/step-00000006.h5"
expect_ok
expect_grep err 'resumed from .*step-00000006.h5: step 6.*saved on 4 ranks \(tp=1 pp=1 dp=4\)'
compare z1 6
echo "PASS: bitwise resume on dp=2 zero=2; dp=1, dp=4 zero=3 (+ offload) and dp=2 zero=1 continue within 1e-5"
