#!/bin/sh
# A full disk is an error, not a hang (docs/run.md, exit status 4): the
# LD_PRELOAD shim tests/apps/enospc_shim.c fills a directory after a byte
# budget (statvfs there reports what is left; per process).
# - checkpoint dir full at the first save: exit 4 within the run, the file
#   named, no temporary left, no `latest`;
# - full at a later save: exit 4, `latest` and the previous checkpoint stay,
#   `colossal-ckpt verify` passes on it and a resume from it continues the
#   uninterrupted run's losses bitwise;
# - run dir full (metrics.jsonl): exit 4 naming metrics.jsonl.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
SHIM="$top_builddir/tests/apps/.libs/libenospc_shim.so"
[ -f "$SHIM" ] || { echo "SKIP: no $SHIM"; exit 77; }
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
# ASan must come first in the preload list; the shim goes after it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS

# full_np N DIR BYTES ARGS...: colossal-pretrain on N ranks with DIR full
# after BYTES bytes (per process).
full_np() {
    n=$1 dir=$2 bytes=$3
    shift 3
    echo "+ ($dir full after $bytes bytes) $MPIEXEC -n $n colossal-pretrain $*"
    RC=0
    $MPIEXEC -n "$n" --oversubscribe -x LD_PRELOAD="$SHIM" -x CAI_ENOSPC_PATH="$dir" -x CAI_ENOSPC_AFTER="$bytes" \
        -x CAI_ENOSPC_STATE="$TMP/shim-state" -x ASAN_OPTIONS "$PRETRAIN_BIN" "$@" >"$TMP/out" 2>"$TMP/err" || RC=$?
}

CFG="$TINY --train.steps 12 --eval.interval 4 --eval.batches 2 --log.interval 100"
# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/ref"
expect_ok

# The first save: nothing fits.
D="$TMP/a/checkpoints"
mkdir -p "$D"
# shellcheck disable=SC2086
full_np 2 "$D" 100000 $CFG --run.dir "$TMP/a" --checkpoint.every 4
expect_rc 4
expect_grep err "cannot write checkpoint '$D/.step-00000004.h5.tmp': No space left on device"
[ ! -e "$D/latest" ] || fail "a failed first save wrote latest"
[ -z "$(ls -A "$D")" ] || fail "the failed save left $(ls -A "$D")"
echo "first save into a full checkpoint dir: exit 4, nothing left behind"

# A later save: step 4 fits, step 8 does not.
D="$TMP/b/checkpoints"
mkdir -p "$D"
# shellcheck disable=SC2086
full_np 2 "$D" 2600000 $CFG --run.dir "$TMP/b" --checkpoint.every 4
expect_rc 4
expect_grep out "^checkpoint at step 4: $D/step-00000004.h5"
expect_grep err "cannot write checkpoint '$D/.step-00000008.h5.tmp': No space left on device"
[ "$(cat "$D/latest")" = "step-00000004.h5" ] || fail "latest changed: $(cat "$D/latest")"
[ ! -e "$D/.step-00000008.h5.tmp" ] || fail "the failed save left its temporary file"
RC=0
$MPIEXEC -n 2 --oversubscribe "$CKPT_BIN" verify "$D/step-00000004.h5" >"$TMP/out" 2>"$TMP/err" || RC=$?
expect_ok
# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/c" --resume "$D/step-00000004.h5"
expect_ok
for kind in "train loss" "eval val_loss"; do
    # shellcheck disable=SC2086
    field $kind "$TMP/ref/metrics.jsonl" | awk '$1 > 4' >"$TMP/want"
    # shellcheck disable=SC2086
    field $kind "$TMP/c/metrics.jsonl" >"$TMP/got"
    [ -s "$TMP/want" ] && cmp -s "$TMP/want" "$TMP/got" || fail "the resume from step 4: $kind differs"
done
echo "later save into a full checkpoint dir: exit 4, latest and step 4 kept, verified, resumed bitwise"

# The run dir: metrics.jsonl fills it.
mkdir -p "$TMP/m"
# shellcheck disable=SC2086
full_np 2 "$TMP/m/metrics.jsonl" 1500 $CFG --run.dir "$TMP/m"
expect_rc 4
expect_grep err "cannot write $TMP/m/metrics.jsonl: No space left on device"
echo "full run dir (metrics.jsonl): exit 4"
