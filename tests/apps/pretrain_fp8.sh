#!/bin/sh
# FP8 linear layers through colossal-pretrain (docs/fp8.md), on the CPU
# backend's emulation, 2 data-parallel ranks:
# - a 4-block GPT-2 in FP8 (fp8.layers auto: blocks 1 and 2) stops at step 6
#   with a checkpoint holding the FP8 scaling state ("fp8_state") and,
#   resumed, repeats the uninterrupted FP8 run's losses bitwise; the
#   checkpoint still verifies;
# - its final loss stays within 3% of the same run without FP8;
# - a layer list outside the model is refused naming fp8.layers.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

CFG="$TINY --model.n_layers 4 --train.steps 12 --eval.interval 6 --eval.batches 2 --log.interval 100"
FP8="--fp8.enabled true --fp8.amax_history 8"

# shellcheck disable=SC2086
run_np 2 $CFG $FP8 --run.dir "$TMP/a"
expect_ok
expect_grep out "^fp8: blocks 'auto' of 4 in FP8 \(hybrid, delayed recipe, amax max over 8 steps, margin 0\)"
expect_grep out "^  fp8 casts, weight codes  "

# shellcheck disable=SC2086
run_np 2 $CFG $FP8 --run.dir "$TMP/b" --checkpoint.every 100 --train.stop_at 6
expect_rc 3
# shellcheck disable=SC2086
run_np 2 $CFG $FP8 --run.dir "$TMP/b" --checkpoint.every 100 --resume latest
expect_ok
expect_no_grep out "holds no FP8 scaling state"
same_losses "$TMP/a/metrics.jsonl" "$TMP/b/metrics.jsonl" "the resumed FP8 run"
echo "FP8 resume on dp=2: 12 train and $(wc -l <"$TMP/ref") validation losses bitwise equal"
if command -v h5ls >/dev/null 2>&1; then
    h5ls "$TMP/b/checkpoints/step-00000006.h5/fp8_state" >"$TMP/h5ls" 2>&1 || fail "no fp8_state dataset: $(cat "$TMP/h5ls")"
    # 4 blocks x 5 linears x 3 tensors x (2 + 8, padded to 12: CAI_FP8_META_STRIDE)
    grep -q "{720}" "$TMP/h5ls" || fail "fp8_state has the wrong length: $(cat "$TMP/h5ls")"
fi
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
$MPIEXEC -n 1 "$CKPT_BIN" verify "$TMP/b/checkpoints/step-00000006.h5" >"$TMP/out" 2>"$TMP/err" ||
    fail "colossal-ckpt verify rejects the FP8 checkpoint"

# FP8 against f32, 12 steps: the last train loss within 3%
# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/f32"
expect_ok
a=$(field train loss "$TMP/a/metrics.jsonl" | tail -n 1 | cut -d' ' -f2)
f=$(field train loss "$TMP/f32/metrics.jsonl" | tail -n 1 | cut -d' ' -f2)
awk -v a="$a" -v f="$f" 'BEGIN { r = (a - f) / f; if (r < 0) r = -r
    printf "FP8 loss at step 12: %s, f32 %s (%.2f%% apart)\n", a, f, 100 * r; exit !(r <= 0.03) }' ||
    fail "the FP8 run's loss is more than 3% from f32's"

# shellcheck disable=SC2086
run_np 1 $CFG $FP8 --run.dir "$TMP/bad" --fp8.layers 2-7
[ "$RC" -ne 0 ] || fail "fp8.layers 2-7 on 4 blocks was accepted"
expect_grep err "fp8.layers '2-7': 2-7 is outside the model's blocks 0-3"
echo "ok"
