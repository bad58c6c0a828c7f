#!/bin/sh
# Crash safety and bad checkpoints through colossal-pretrain:
# - a rank killed with SIGKILL in the middle of writing the step-4
#   checkpoint (held there by the CAI_CKPT_TEST_STALL hook after its first
#   transfer, the weights) leaves
#   `latest` on step 2 and no step-4 file; resuming loads step 2 and the
#   next save sweeps away the half-written temporary file;
# - a truncated file, a flipped byte in a tensor, and a checkpoint of another
#   model each stop the run with exit status 1 and their own message naming
#   the file (and the tensor), and the good checkpoint is untouched.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

# The stall is a test hook: only builds configured --enable-test-hooks have it.
$MPIEXEC -n 1 "$top_builddir/apps/colossal-check" --info 2>/dev/null | grep -Eq '^  test hooks +compiled in' || {
    echo "SKIP: this build has no test hooks (configure --enable-test-hooks); CAI_CKPT_TEST_STALL is needed"
    exit 77
}

CFG="$TINY --train.steps 20 --eval.interval 0 --log.interval 100 --checkpoint.every 2 --run.dir $TMP/run"
D="$TMP/run/checkpoints"

# shellcheck disable=SC2086
run_np 2 $CFG --train.stop_at 2
expect_rc 3
[ "$(cat "$D/latest")" = "step-00000002.h5" ] || fail "latest does not name step 2"
sum2=$(cksum <"$D/step-00000002.h5")

echo "+ CAI_CKPT_TEST_STALL=1 $MPIEXEC -n 2 colossal-pretrain --resume latest (in the background)"
# shellcheck disable=SC2086
CAI_CKPT_TEST_STALL=1 $MPIEXEC -n 2 --oversubscribe -x CAI_CKPT_TEST_STALL "$PRETRAIN_BIN" $CFG --resume latest \
    >"$TMP/out" 2>"$TMP/err" &
launcher=$!
i=0
while ! grep -q 'checkpoint test hook: rank 1' "$TMP/err" 2>/dev/null; do
    i=$((i + 1))
    [ $i -le 900 ] || { kill -KILL $launcher 2>/dev/null; fail "the save never reached the test hook"; }
    kill -0 $launcher 2>/dev/null || fail "the run ended before the hook"
    sleep 0.1
done
hook='s/.*checkpoint test hook: rank 1 (pid \([0-9]*\)) stalls after 1 transfer of \(.*\)$'
pid=$(sed -n "$hook/\\1/p" "$TMP/err")
tmpfile=$(sed -n "$hook/\\2/p" "$TMP/err")
[ "$tmpfile" = "$D/.step-00000004.h5.tmp" ] || fail "the save writes $tmpfile, not $D/.step-00000004.h5.tmp"
[ -f "$tmpfile" ] || fail "$tmpfile does not exist during the save"
echo "+ kill -KILL $pid (rank 1, mid-write)"
kill -KILL "$pid"
RC=0
wait $launcher || RC=$?
[ "$RC" -ne 0 ] || fail "the run survived losing a rank"
[ "$(cat "$D/latest")" = "step-00000002.h5" ] || fail "latest changed: $(cat "$D/latest")"
[ ! -e "$D/step-00000004.h5" ] || fail "a step-4 checkpoint appeared although its save was killed"
[ "$(cksum <"$D/step-00000002.h5")" = "$sum2" ] || fail "the step-2 checkpoint changed"

# shellcheck disable=SC2086
run_np 2 $CFG --resume latest --train.stop_at 4
expect_rc 3
expect_grep err "resumed from $D/step-00000002.h5: step 2"
[ "$(cat "$D/latest")" = "step-00000004.h5" ] || fail "latest does not name step 4 after the resumed save"
[ ! -e "$tmpfile" ] || fail "the interrupted save's $tmpfile was not removed"
echo "crash: latest stayed on step 2, which resumed"

# Bad checkpoints: each its own error, exit 1, the file named.
good="$D/step-00000004.h5"
size=$(wc -c <"$good")
head -c $((size / 2)) "$good" >"$TMP/truncated.h5"
# shellcheck disable=SC2086
run_np 2 $CFG --checkpoint.every 0 --resume "$TMP/truncated.h5"
expect_rc 1
expect_grep err "checkpoint '$TMP/truncated.h5' is not a readable HDF5 file.*truncated"

if command -v h5dump >/dev/null 2>&1; then
    cp "$good" "$TMP/flipped.h5"
    t=optim/exp_avg_sq/h.1.mlp.fc.weight
    # The tensor's elements sit in storage/optim/exp_avg_sq from its storage_offset.
    addr=$(h5dump -p -H -d /storage/optim/exp_avg_sq "$TMP/flipped.h5" | sed -n 's/^ *OFFSET *\([0-9]*\).*/\1/p')
    so=$(h5dump -a "/$t/storage_offset" "$TMP/flipped.h5" | sed -n 's/^ *(0): *\([0-9]*\).*/\1/p')
    [ -n "$addr" ] && [ -n "$so" ] || fail "h5dump shows no storage offset for $t"
    addr=$((addr + 4 * so))
    off=$((addr + 4 * 100 + 1))
    orig=$(od -An -tu1 -j "$off" -N1 "$TMP/flipped.h5" | tr -d ' ')
    # shellcheck disable=SC2059
    printf "$(printf '\\%03o' $((orig ^ 16)))" | dd of="$TMP/flipped.h5" bs=1 seek="$off" conv=notrunc 2>/dev/null
    # shellcheck disable=SC2086
    run_np 2 $CFG --checkpoint.every 0 --resume "$TMP/flipped.h5"
    expect_rc 1
    expect_grep err "checkpoint '$TMP/flipped.h5': tensor $t is corrupt"
else
    echo "h5dump not found: skipping the flipped-byte case"
fi

# shellcheck disable=SC2086
run_np 2 $CFG --checkpoint.every 0 --resume "$good" --model.n_layers 3
expect_rc 1
expect_grep err "checkpoint '$good' holds a different model: model.n_layers is 2 in the file, 3 in this run"

# shellcheck disable=SC2086
run_np 2 $CFG --checkpoint.every 0 --resume "$TMP/nothing-here"
expect_rc 4 # a file-system error (docs/run.md)
expect_grep err "no checkpoint at '$TMP/nothing-here'"

[ "$(cat "$D/latest")" = "step-00000004.h5" ] || fail "latest changed while loading bad checkpoints"
echo "PASS: crash mid-write kept the previous checkpoint; truncated, corrupt and foreign checkpoints refused"
