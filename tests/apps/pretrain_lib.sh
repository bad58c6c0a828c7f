# Shared helpers for the colossal-pretrain end-to-end tests (sourced, not run).
# The test harness exports top_builddir, top_srcdir and MPIEXEC.
: "${top_builddir:?top_builddir must be set (run through make check)}"
: "${MPIEXEC:=mpiexec}"
. "$top_srcdir/tests/apps/launch_lib.sh"
PRETRAIN_BIN="$top_builddir/apps/colossal-pretrain"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colossal-pretrain-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# A 2-layer d=64 GPT-2 on a small embedded corpus: a step takes milliseconds.
TINY="--model.n_layers 2 --model.d_model 64 --model.n_heads 4 --train.seq_len 64 --train.micro_batch 4
  --optim.lr 2e-3 --optim.warmup_steps 2 --data.corpus_docs 1500 --data.corpus_vocab 0 --generate.tokens 0
  --run.peak_tflops 1 --log.timestamps false"

fail() {
    echo "FAIL: $*" >&2
    for f in "$TMP"/out "$TMP"/err; do
        [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; tail -n 40 "$f" >&2; }
    done
    exit 1
}

# run_np N ARGS...: colossal-pretrain on N ranks; stdout in $TMP/out, stderr
# in $TMP/err, exit status in $RC.
run_np() {
    n=$1
    shift
    cai_launch "$n" "$PRETRAIN_BIN" "$@"
}

expect_ok() { [ "$RC" -eq 0 ] || fail "expected exit 0, got $RC"; }
expect_rc() { [ "$RC" -eq "$1" ] || fail "expected exit $1, got $RC"; }
expect_grep() { grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 lacks /$2/}"; }
expect_no_grep() { ! grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 unexpectedly has /$2/}"; }

# field KIND KEY FILE: "step value" per record of that kind in metrics.jsonl.
field() {
    grep "\"kind\":\"$1\"" "$3" | sed -n "s/.*\"step\":\([0-9]*\).*\"$2\":\([-+0-9.eE]*\).*/\1 \2/p"
}

# same_losses REF GOT WHAT: the train and validation losses of two
# metrics.jsonl files are identical as text (every printed digit: a resume
# on the same layout is bitwise).
same_losses() {
    for kind in "train loss" "eval val_loss"; do
        # shellcheck disable=SC2086
        field $kind "$1" >"$TMP/ref"
        # shellcheck disable=SC2086
        field $kind "$2" >"$TMP/got"
        [ -s "$TMP/ref" ] || fail "no $kind records in $1"
        cmp -s "$TMP/ref" "$TMP/got" || {
            diff "$TMP/ref" "$TMP/got" >&2
            fail "$3: $kind differs from the uninterrupted run's"
        }
    done
}

# compare KIND KEY RUN N: RUN's N KIND records' KEY, each within 1e-5
# relative of the 1-rank run a's (both in $TMP).
compare() {
    field "$1" "$2" "$TMP/a/metrics.jsonl" >"$TMP/ref"
    field "$1" "$2" "$TMP/$3/metrics.jsonl" >"$TMP/got"
    [ "$(wc -l <"$TMP/ref")" -eq "$4" ] || fail "run a: expected $4 $1 records"
    [ "$(wc -l <"$TMP/got")" -eq "$4" ] || fail "run $3: expected $4 $1 records"
    paste "$TMP/ref" "$TMP/got" | awk -v run="$3" -v key="$2" '{
        d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
        if ($1 != $3 || !(r <= 1e-5)) { printf "run %s step %s: %s %s vs %s (relative %g)\n", run, $1, key, $4, $2, r; bad = 1 }
        if (r > worst) worst = r
    } END { printf "run %s: %s within %g relative of the 1-rank run\n", run, key, worst; exit bad }' ||
        fail "run $3 does not reproduce the 1-rank $2"
}

# close_losses REF GOT FROM TOL WHAT: GOT's train losses of the steps after
# FROM, each within TOL relative of REF's at the same step (and the same
# steps as REF has after FROM).
close_losses() {
    field train loss "$1" | awk -v from="$3" '$1 > from' >"$TMP/ref"
    field train loss "$2" | awk -v from="$3" '$1 > from' >"$TMP/got"
    [ -s "$TMP/ref" ] && [ "$(wc -l <"$TMP/got")" -eq "$(wc -l <"$TMP/ref")" ] ||
        fail "$5: expected the $(wc -l <"$TMP/ref") steps after step $3, got $(wc -l <"$TMP/got")"
    paste "$TMP/ref" "$TMP/got" | awk -v what="$5" -v from="$3" -v tol="$4" '{
        d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2)
        if ($1 != $3 || !(r <= tol)) { printf "%s step %s: loss %s vs %s (relative %g)\n", what, $3, $4, $2, r; bad = 1 }
        if (r > worst) worst = r
    } END { printf "%s: the %d steps after step %d within %g relative\n", what, NR, from, worst; exit bad }' ||
        fail "$5 does not continue the uninterrupted run"
}

# signal_after_steps LAUNCHER METRICS STEPS SIGNAL: wait (at most 60 s) until
# METRICS holds STEPS train records, send SIGNAL to one rank (the launcher's
# last child: the ranks are its children), wait for the launcher and leave
# its exit status in RC.
signal_after_steps() {
    i=0
    while [ "$(grep -s '"kind":"train"' "$2" | wc -l)" -lt "$3" ]; do
        i=$((i + 1))
        [ $i -le 600 ] || { kill -KILL "$1" 2>/dev/null; fail "no training steps within 60 s"; }
        kill -0 "$1" 2>/dev/null || fail "the run ended before it was signalled"
        sleep 0.1
    done
    rank_pid=$(ps -o pid= --ppid "$1" | tail -n 1 | tr -d ' ')
    [ -n "$rank_pid" ] || { kill -KILL "$1"; fail "cannot find the ranks' processes"; }
    echo "+ kill -$4 $rank_pid (one rank)"
    kill "-$4" "$rank_pid"
    RC=0
    wait "$1" || RC=$?
}
