# Shared helpers for the colossal-check end-to-end tests (sourced, not run).
# The test harness exports top_builddir, top_srcdir and MPIEXEC.
: "${top_builddir:?top_builddir must be set (run through make check)}"
: "${MPIEXEC:=mpiexec}"
. "$top_srcdir/tests/apps/launch_lib.sh"
CHECK_BIN="$top_builddir/apps/colossal-check"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colossal-check-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

fail() {
    echo "FAIL: $*" >&2
    for f in "$TMP"/out "$TMP"/err; do
        [ -s "$f" ] && { echo "--- $(basename "$f"):" >&2; cat "$f" >&2; }
    done
    exit 1
}

# run_np N ARGS...: run colossal-check on N ranks; stdout in $TMP/out,
# stderr in $TMP/err, exit status in $RC.
run_np() {
    n=$1
    shift
    cai_launch "$n" "$CHECK_BIN" "$@"
}

expect_ok() { [ "$RC" -eq 0 ] || fail "expected exit 0, got $RC"; }
expect_fail() { [ "$RC" -ne 0 ] || fail "expected a non-zero exit"; }
# expect_grep FILE PATTERN [what]: extended regex must match a line.
expect_grep() { grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 lacks /$2/}"; }
expect_no_grep() { ! grep -Eq -- "$2" "$TMP/$1" || fail "${3:-$1 unexpectedly has /$2/}"; }
# count_grep FILE PATTERN: number of matching lines.
count_grep() { grep -Ec -- "$2" "$TMP/$1" || true; }
