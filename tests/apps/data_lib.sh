# Shared helpers for the colossal-data end-to-end tests (sourced, not run).
# The test harness exports top_builddir, top_srcdir, MPIEXEC and PYTHON_TORCH.
: "${top_builddir:?top_builddir must be set (run through make check)}"
: "${MPIEXEC:=mpiexec}"
. "$top_srcdir/tests/apps/launch_lib.sh"
DATA_BIN="$top_builddir/apps/colossal-data"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colossal-data-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

fail() {
    echo "FAIL: $*" >&2
    for f in "$TMP"/out "$TMP"/err; do
        [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; cat "$f" >&2; }
    done
    exit 1
}

# run_np N ARGS...: colossal-data on N ranks; stdout in $TMP/out, stderr in
# $TMP/err, exit status in $RC.
run_np() {
    n=$1
    shift
    cai_launch "$n" "$DATA_BIN" "$@"
}

expect_ok() { [ "$RC" -eq 0 ] || fail "expected exit 0, got $RC"; }
expect_fail() { [ "$RC" -ne 0 ] || fail "expected a non-zero exit"; }
expect_grep() { grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 lacks /$2/}"; }
# same_dataset A B: the .bin and .idx files are byte-identical.
same_dataset() {
    cmp -s "$1.bin" "$2.bin" || fail "$1.bin and $2.bin differ"
    cmp -s "$1.idx" "$2.idx" || fail "$1.idx and $2.idx differ"
}
# A python3 with numpy, or empty.
find_python() {
    PY=
    if [ -n "$PYTHON_TORCH" ] && [ "$PYTHON_TORCH" != none ] && "$PYTHON_TORCH" -c 'import numpy' 2>/dev/null; then
        PY=$PYTHON_TORCH
    fi
}
