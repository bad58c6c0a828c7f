#!/bin/sh
# Checkpoint and resume through colossal-pretrain:
# - a run stopped at step 6 (train.stop_at) writes a checkpoint and exits 3;
#   resumed with --resume latest it continues with bitwise the same train
#   and validation losses as the uninterrupted 12-step run, and its
#   metrics.jsonl continues the first one's;
# - the step-6 checkpoint saved on dp=2 continues on dp=1 (grad_accum 2) and
#   dp=4 (micro_batch 2) with the same global batch: losses within 1e-5;
# - f16 with a dynamic loss scale resumes bitwise, scaler state included;
# - SIGUSR1 to one rank: every rank stops at the same step, a checkpoint of
#   that step is written and `latest` points to it, exit status 3.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

# Under the sanitizers (make check-sanitize: CAI_SANITIZE=1) the runs train 8
# steps (stopped at 4) instead of 12 (at 6) and the dp=4 continuation is left
# out (dp=1 still loads the dp=2 checkpoint on another layout).
SAN=${CAI_SANITIZE:-0}
S=12
[ "$SAN" != 1 ] || S=8
H=$((S / 2))
HF=$(printf 'step-%08d.h5' "$H")
CFG="$TINY --train.steps $S --eval.interval 4 --eval.batches 2 --log.interval 100"

# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/a"
expect_ok

# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/b" --checkpoint.every 100 --train.stop_at $H
expect_rc 3
expect_grep out "^stopped by train.stop_at after step $H of $S .*checkpoint written"
expect_grep out "^checkpoint at step $H: $TMP/b/checkpoints/$HF"
[ "$(cat "$TMP/b/checkpoints/latest")" = "$HF" ] || fail "latest does not name step $H"
cp "$TMP/b/checkpoints/$HF" "$TMP/step6.h5"

# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/b" --checkpoint.every 100 --resume latest
expect_ok
expect_grep err "resumed from $TMP/b/checkpoints/$HF: step $H"
expect_grep out "^done: $H steps"

# The records of both runs, in one file, against the uninterrupted run.
same_losses "$TMP/a/metrics.jsonl" "$TMP/b/metrics.jsonl" "the resumed run"
echo "resume on dp=2: $(wc -l <"$TMP/ref") validation and $S train losses bitwise equal"

# compare RUN: RUN's train losses after the checkpoint's step within 1e-5 of run a's.
compare() { close_losses "$TMP/a/metrics.jsonl" "$TMP/$1/metrics.jsonl" $H 1e-5 "run $1"; }
# shellcheck disable=SC2086
run_np 1 $CFG --run.dir "$TMP/dp1" --train.grad_accum 2 --resume "$TMP/step6.h5"
expect_ok
expect_grep err 'saved on 2 ranks \(tp=1 pp=1 dp=2\)'
compare dp1
# the plain suite continues on dp=4 too; under the sanitizers dp=1 alone
if [ "$SAN" != 1 ]; then
    # shellcheck disable=SC2086
    run_np 4 $CFG --run.dir "$TMP/dp4" --train.micro_batch 2 --resume "$TMP/step6.h5"
    expect_ok
    compare dp4
fi

# f16 with dynamic loss scaling (the scale doubles every 2 good steps): the
# masters, the f16 working weights (an f16 file type) and the loss scaler's
# state continue exactly.
F16="$TINY --train.steps 8 --eval.interval 0 --log.interval 100 --precision f16 --loss_scale.growth_interval 2"
# shellcheck disable=SC2086
run_np 2 $F16 --run.dir "$TMP/f16a" --checkpoint.every 100
expect_ok
# shellcheck disable=SC2086
run_np 2 $F16 --run.dir "$TMP/f16b" --checkpoint.every 100 --train.stop_at 4
expect_rc 3
# shellcheck disable=SC2086
run_np 2 $F16 --run.dir "$TMP/f16b" --checkpoint.every 100 --resume latest
expect_ok
field train loss "$TMP/f16a/metrics.jsonl" >"$TMP/ref"
field train loss "$TMP/f16b/metrics.jsonl" >"$TMP/got"
cmp -s "$TMP/ref" "$TMP/got" || { diff "$TMP/ref" "$TMP/got" >&2; fail "the resumed f16 run's losses differ"; }
if command -v h5dump >/dev/null 2>&1; then
    for run in f16a f16b; do
        h5dump -A -g / "$TMP/$run/checkpoints/step-00000008.h5" |
            awk '/ATTRIBUTE "loss_scaler\./ { name = $2 } name && /\(0\):/ { print name, $2; name = "" }' >"$TMP/$run.ls"
    done
    [ "$(wc -l <"$TMP/f16a.ls")" -eq 4 ] || fail "no loss scaler attributes in the f16 checkpoint"
    cmp -s "$TMP/f16a.ls" "$TMP/f16b.ls" || { paste "$TMP/f16a.ls" "$TMP/f16b.ls" >&2; fail "loss scaler state differs"; }
    echo "f16: losses bitwise equal; loss scaler at step 8: $(tr '\n' ' ' <"$TMP/f16a.ls")"
fi

# SIGUSR1 to one rank.
echo "+ $MPIEXEC -n 2 colossal-pretrain (100000 steps, checkpoint.every 1000, in the background)"
# shellcheck disable=SC2086
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" $TINY --train.steps 100000 --eval.interval 0 --log.interval 1000 \
    --checkpoint.every 1000 --run.dir "$TMP/sig" >"$TMP/out" 2>"$TMP/err" &
M="$TMP/sig/metrics.jsonl"
signal_after_steps $! "$M" 3 USR1
expect_rc 3
expect_grep out '^stopped by SIGUSR1 after step [0-9]+ of 100000 .*checkpoint written'
stopped=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\) .*/\1/p' "$TMP/out")
want=$(printf 'step-%08d.h5' "$stopped")
[ "$(cat "$TMP/sig/checkpoints/latest")" = "$want" ] || fail "latest is not $want"
grep -q "\"kind\":\"checkpoint\",\"step\":$stopped," "$M" || fail "no checkpoint record for step $stopped"
layouts="dp=1 and dp=4 continue"
[ "$SAN" != 1 ] || layouts="dp=1 continues"
echo "PASS: resumed bitwise; $layouts dp=2; SIGUSR1 checkpointed step $stopped"
