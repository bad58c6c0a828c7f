#!/bin/sh
# scripts/plot_metrics.py on bad metrics files: each ends with one line
# naming the file, the line and what is wrong (no traceback); only a
# half-written last line (a run still writing) is skipped.
set -u
TMP=$(mktemp -d "${TMPDIR:-/tmp}/colossal-plot-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PLOT="python3 $top_srcdir/scripts/plot_metrics.py"
fail() { echo "FAIL: $*"; exit 1; }
bad() { # FILE EXPECTED-MESSAGE
    RC=0
    $PLOT "$TMP/$1" --fallback -o "$TMP/x.png" >"$TMP/out" 2>"$TMP/err" || RC=$?
    [ "$RC" -ne 0 ] || fail "$1 was accepted"
    grep -q Traceback "$TMP/err" && fail "$1 ended in a traceback: $(cat "$TMP/err")"
    grep -Eq -- "$2" "$TMP/err" || fail "$1: expected /$2/, got: $(cat "$TMP/err")"
    echo "ok: $1: $(cat "$TMP/err")"
}
printf '{"kind":"train","step":1,"loss":2.5}\n{"kind":"train","step":2}\n' >"$TMP/missing.jsonl"
bad missing.jsonl "missing.jsonl:2: 'loss' is null, not a number"
printf '{"kind":"train","step":1,"loss":NaN}\n{"kind":"train","step":2,"loss":1}\n' >"$TMP/nan.jsonl"
bad nan.jsonl "nan.jsonl:1: 'loss' is nan, not a finite number"
printf '{"kind":"train","step":1,"loss":"low"}\n' >"$TMP/string.jsonl"
bad string.jsonl "string.jsonl:1: 'loss' is \"low\", not a number"
printf '\377\376garbage\n{"kind":"train","step":2,"loss":1}\n' >"$TMP/bytes.jsonl"
bad bytes.jsonl "bytes.jsonl:1: not a JSON record"
printf '[1, 2]\n{"kind":"train","step":2,"loss":1}\n' >"$TMP/array.jsonl"
bad array.jsonl "array.jsonl:1: a JSON list, not a record object"
bad absent.jsonl "absent.jsonl: cannot read it"
printf '{"kind":"train","step":1,"loss":2.5}\n{"kind":"train","step":2,"loss":2.4}\n{"kind":"tr' >"$TMP/partial.jsonl"
$PLOT "$TMP/partial.jsonl" --fallback -o "$TMP/p.png" >"$TMP/out" 2>"$TMP/err" || fail "a half-written last line failed"
grep -q "partial.jsonl:3: skipping the last line" "$TMP/err" || fail "the half-written last line was not reported"
[ -s "$TMP/p.png" ] || fail "no PNG"
echo "PASS"
