#!/bin/sh
# Watchdog abort mode: a rank that stays away past the timeout must bring the
# whole job down (nonzero exit) with stderr naming it, the axis and the
# operation, and the abort must stop the late rank (which says so if it
# ever wakes up: after 120 s, an upper bound for a hang).
np=3
prog="${top_builddir:-.}/tests/mpi/test_watchdog_abort"
launcher=${MPIEXEC:-mpiexec}
err=$(mktemp)
trap 'rm -f "$err"' EXIT
start=$(date +%s)
$launcher -n $np --oversubscribe "$prog" 2>"$err" >/dev/null
rc=$?
elapsed=$(( $(date +%s) - start ))
cat "$err"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 0 ] || fail "exit status 0: the job was not aborted"
grep -q "watchdog: allreduce #2 on axis dp (group of $np) did not complete within 2.0 s" "$err" \
  || fail "stderr does not describe the stuck allreduce"
grep -q "ranks behind: $((np - 1)) (at #1, not in a communication call)" "$err" \
  || fail "stderr does not name rank $((np - 1)) as the stuck one"
grep -q "instead of aborting" "$err" && fail "a rank returned instead of aborting"
grep -q "woke up" "$err" && fail "took ${elapsed} s: the abort did not stop the late rank"
echo "PASS: exit status $rc after ${elapsed} s"
