#!/bin/sh
# A full disk is an error, not a hang (docs/run.md, exit status 4): the
# LD_PRELOAD shim tests/apps/enospc_shim.c fills a directory after a byte
# budget (statvfs there reports what is left; per process).
# - checkpoint dir full at the first save: exit 4 within the run, the file
#   named, no temporary left, no `latest`;
# - full at a later save: exit 4, `latest` and the previous checkpoint stay,
#   `colossal-ckpt verify` passes on it and a resume from it continues the
#   uninterrupted run's losses bitwise;
# - the same under a quota (statvfs shows room, the reservation of the
#   file's extent fails): exit 4, the same cleanup;
# - run dir full (metrics.jsonl): exit 4 naming metrics.jsonl;
# - colossal-ckpt export into a full directory and import into a full
#   target, colossal-data preprocess into a full directory: exit 4 naming
#   the file, no temporary files left (import used to crash in H5Fclose);
# - where mount works (root outside a restricted container), a real 4 MB
#   tmpfs as the checkpoint directory.
. "$top_srcdir/tests/apps/pretrain_lib.sh"
SHIM="$top_builddir/tests/apps/libenospc_shim.so"
[ -f "$SHIM" ] || { echo "SKIP: no $SHIM"; exit 77; }
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
# ASan must come first in the preload list; the shim goes after it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS

# full_np N DIR BYTES ARGS...: colossal-pretrain on N ranks with DIR full
# after BYTES bytes (per process).
# CAI_ENOSPC_STATVFS=real in the environment: statvfs shows the real disk.
full_np() {
    n=$1 dir=$2 bytes=$3
    shift 3
    full_run "$n" "$dir" "$bytes" "$PRETRAIN_BIN" "$@"
}
full_run() {
    n=$1 dir=$2 bytes=$3 bin=$4
    shift 4
    echo "+ ($dir full after $bytes bytes) $MPIEXEC -n $n $(basename "$bin") $*"
    RC=0
    $MPIEXEC -n "$n" --oversubscribe -x LD_PRELOAD="$SHIM" -x CAI_ENOSPC_PATH="$dir" -x CAI_ENOSPC_AFTER="$bytes" \
        -x CAI_ENOSPC_STATE="$TMP/shim-state" -x CAI_ENOSPC_STATVFS="${CAI_ENOSPC_STATVFS:-}" -x ASAN_OPTIONS \
        "$bin" "$@" >"$TMP/out" 2>"$TMP/err" || RC=$?
    [ "$RC" -lt 128 ] || fail "$(basename "$bin") $*: killed by signal $((RC - 128))"
    ! grep -Eq 'Sanitizer|runtime error:' "$TMP/err" || fail "sanitizer report from: $(basename "$bin") $*"
}
# no_temporaries DIR: the failed write removed what it had started.
no_temporaries() {
    left=$(find "$1" -name '*.tmp*' | head -n 3)
    [ -z "$left" ] || fail "temporary files left in $1: $left"
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

# Under a quota: statvfs shows room; reserving the data's extent fails.
D="$TMP/q/checkpoints"
mkdir -p "$D"
# shellcheck disable=SC2086
CAI_ENOSPC_STATVFS=real full_np 2 "$D" 2600000 $CFG --run.dir "$TMP/q" --checkpoint.every 4
expect_rc 4
expect_grep err "cannot write checkpoint '$D/.step-00000008.h5.tmp': reserving .* MB for .*: No space left on device"
[ "$(cat "$D/latest")" = "step-00000004.h5" ] || fail "latest changed: $(cat "$D/latest")"
no_temporaries "$D"
echo "a save over quota: exit 4, latest kept"

# The run dir: config.yaml (rank 0, before anything else) does not fit.
mkdir -p "$TMP/cy"
# shellcheck disable=SC2086
full_np 2 "$TMP/cy" 100 $CFG --run.dir "$TMP/cy"
expect_rc 4
expect_grep err "cannot write '$TMP/cy/config.yaml.tmp': .*No space left on device"
no_temporaries "$TMP/cy"
echo "full run dir (config.yaml): exit 4"

# The run dir: metrics.jsonl fills it.
mkdir -p "$TMP/m"
# shellcheck disable=SC2086
full_np 2 "$TMP/m/metrics.jsonl" 1500 $CFG --run.dir "$TMP/m"
expect_rc 4
expect_grep err "cannot write $TMP/m/metrics.jsonl: No space left on device"
echo "full run dir (metrics.jsonl): exit 4"

# colossal-ckpt: export into a full directory, import into a full target.
GOOD="$TMP/b/checkpoints/step-00000004.h5"
RC=0
$MPIEXEC -n 1 "$CKPT_BIN" export --input "$GOOD" --output "$TMP/hf" >"$TMP/out" 2>"$TMP/err" || RC=$?
expect_ok
mkdir -p "$TMP/hf-full" "$TMP/imp"
full_run 2 "$TMP/hf-full" 100000 "$CKPT_BIN" export --input "$GOOD" --output "$TMP/hf-full"
expect_rc 4
expect_grep err "'$TMP/hf-full/model.safetensors.tmp.[0-9]+' .*No space left on device"
no_temporaries "$TMP/hf-full"
full_run 2 "$TMP/imp" 100000 "$CKPT_BIN" import --input "$TMP/hf" --output "$TMP/imp/m.h5"
expect_rc 4
expect_grep err "cannot write checkpoint '$TMP/imp/.m.h5.tmp': No space left on device"
CAI_ENOSPC_STATVFS=real full_run 2 "$TMP/imp" 300000 "$CKPT_BIN" import --input "$TMP/hf" --output "$TMP/imp/m.h5"
expect_rc 4
expect_grep err "cannot write checkpoint '$TMP/imp/.m.h5.tmp': reserving"
[ -z "$(ls -A "$TMP/imp")" ] || fail "the failed imports left $(ls -A "$TMP/imp")"
echo "export into a full dir, import into a full target: exit 4, nothing left"

# colossal-data preprocess into a full directory.
DATA_BIN="$top_builddir/apps/colossal-data"
RC=0
$MPIEXEC -n 1 "$DATA_BIN" corpus --out "$TMP/c.jsonl" --docs 300 --seed 3 >"$TMP/out" 2>"$TMP/err" || RC=$?
expect_ok
mkdir -p "$TMP/pp"
full_run 2 "$TMP/pp" 20000 "$DATA_BIN" preprocess --input "$TMP/c.jsonl" --output-prefix "$TMP/pp/x" --log.level warn
expect_rc 4
expect_grep err "$TMP/pp/x.*No space left on device"
no_temporaries "$TMP/pp"
echo "preprocess into a full dir: exit 4, nothing left"

# A real small file system, where this machine lets us mount one.
MNT="$TMP/mnt"
mkdir -p "$MNT"
if mount -t tmpfs -o size=4m tmpfs "$MNT" 2>/dev/null; then
    trap 'umount "$MNT" 2>/dev/null; rm -rf "$TMP"' EXIT
    # shellcheck disable=SC2086
    run_np 2 $CFG --run.dir "$TMP/t" --checkpoint.every 2 --checkpoint.keep 100 --checkpoint.dir "$MNT/ck"
    expect_rc 4
    expect_grep err "cannot write checkpoint '$MNT/ck/.step-[0-9]+.h5.tmp': No space left on device"
    last=$(cat "$MNT/ck/latest")
    no_temporaries "$MNT/ck"
    RC=0
    $MPIEXEC -n 2 --oversubscribe "$CKPT_BIN" verify "$MNT/ck/$last" >"$TMP/out" 2>"$TMP/err" || RC=$?
    expect_ok
    umount "$MNT"
    echo "4 MB tmpfs: exit 4 at a later save, $last verifies"
else
    echo "(no tmpfs: mount is not allowed here; the shim's cases stand)"
fi
