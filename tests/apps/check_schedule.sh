#!/bin/sh
# colossal-check --schedule on one process: the issue's command line works as
# written, the printed bubble fraction of gpipe, 1f1b and interleaved equals
# the textbook formula computed here, the zero-bubble styles beat 1f1b, the
# Chrome trace is JSON with one complete event per compute, and bad input
# fails with a non-zero exit and a message naming what would fit.
. "$top_srcdir/tests/apps/check_lib.sh"

# printed_bubble: the simulated fraction on the "bubble:" line.
printed_bubble() { awk '/^bubble:/ { print $2; exit }' "$TMP/out"; }

# same_number A B WHAT: |A - B| < 1e-9.
same_number() {
    awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d < 1e-9) }' ||
        fail "$3: printed $1, expected $2"
}

# expect_textbook P M V: the simulated bubble and the textbook one printed
# beside it both equal (p-1)/(v*m+p-1) (v = 1: gpipe and 1f1b).
expect_textbook() {
    want=$(awk -v p="$1" -v m="$2" -v v="$3" 'BEGIN { printf "%.15f", (p - 1) / (v * m + p - 1) }')
    got=$(printed_bubble)
    same_number "$got" "$want" "bubble for p=$1 m=$2 v=$3"
    textbook=$(awk '/^bubble:/ { for (i = 1; i < NF; i++) if ($(i + 1) == "textbook") print $i; exit }' "$TMP/out")
    same_number "$textbook" "$want" "textbook bubble for p=$1 m=$2 v=$3"
    echo "  bubble $got = (p-1)/(v*m+p-1) for p=$1 m=$2 v=$3"
}

# The issue's form: a bare --schedule selects the mode, the later
# --schedule names the style; the trace is written too.
run_np 1 --schedule --pp 4 --microbatches 8 --schedule interleaved --virtual 2 --trace "$TMP/trace.json"
expect_ok
expect_grep out '^schedule interleaved: pp 4, 2 chunks per rank, 8 microbatches'
expect_grep out '^  rank  3 \|' "no row for rank 3"
expect_grep out 'F7\.1' "the timeline lacks the forward of microbatch 7 on chunk 1"
expect_grep out '^peak in-flight microbatches .* per rank: 11 9 7 5; max 11 on rank 0'
expect_no_grep out 'versions and capabilities' "--schedule also ran --info"
expect_textbook 4 8 2
# One complete event per compute (p * v * m forwards and as many backwards),
# every one on a rank of the pipeline and with its microbatch and chunk.
python3 - "$TMP/trace.json" <<'PY' || fail "the Chrome trace is not what was simulated"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
x = [e for e in events if e["ph"] == "X"]
assert len(x) == 4 * 2 * 8 * 2, len(x)
assert all(e["pid"] == 0 and 0 <= e["tid"] < 4 for e in x)
assert all(0 <= e["args"]["mb"] < 8 and 0 <= e["args"]["chunk"] < 2 for e in x)
assert max(e["ts"] + e["dur"] for e in x) == 57e6  # (v*m + p-1) * (f + b + w) time units of 1 s
PY
echo "  the trace parses and holds every compute"

# (The unit test sweeps pp and microbatches; here the printed line is checked.)
for pm in "5 3" "2 8" "1 4"; do
    set -- $pm
    run_np 1 --schedule 1f1b --pp $1 --microbatches $2
    expect_ok
    expect_textbook $1 $2 1
done
run_np 1 --schedule gpipe --pp 3 --microbatches 5 --pipeline.f 2 --pipeline.b 3 --pipeline.w 1
expect_ok
expect_textbook 3 5 1
run_np 1 --schedule interleaved --pp 3 --microbatches 6 --virtual 3
expect_ok
expect_textbook 3 6 3

# A bare --schedule at the end is 1f1b, with 4 x pp microbatches.
run_np 1 --pp 2 --schedule
expect_ok
expect_grep out '^schedule 1f1b: pp 2, 1 chunk per rank, 8 microbatches'

# The zero-bubble styles: no textbook line, a smaller bubble than 1f1b's.
run_np 1 --schedule 1f1b --pp 4 --microbatches 8
f1=$(printed_bubble)
for style in zb-h1 zbv; do
    run_np 1 --schedule $style --pp 4 --microbatches 8
    expect_ok
    expect_grep out 'no textbook formula'
    expect_grep out 'W7'
    got=$(printed_bubble)
    awk -v a="$got" -v b="$f1" 'BEGIN { exit !(a < b) }' || fail "$style bubble $got is not below 1f1b's $f1"
    echo "  $style bubble $got < 1f1b's $f1"
done

# Bad input: a non-zero exit, the error once, naming what would fit.
run_np 1 --schedule interleaved --pp 4 --microbatches 10
expect_fail
expect_grep err 'multiple of pp=4' "the microbatch rule is not explained"
expect_grep err '8 or 12 would fit' "no microbatch counts that fit"
[ "$(count_grep err '\] error:')" -eq 1 ] || fail "expected the error once"
run_np 1 --schedule pipedream --pp 4
expect_fail
expect_grep err "unknown pipeline schedule 'pipedream'"
expect_grep err 'gpipe, 1f1b, interleaved, zb-h1 or zbh1, zb-v or zbv' "the known schedules are not listed"
run_np 1 --schedule 1f1b --pp 4 --virtual 2
expect_fail
expect_grep err '1f1b has one chunk per rank'
run_np 1 --schedule zb-v --pp 4 --virtual 3
expect_fail
expect_grep err 'zb-v has exactly 2 chunks per rank'
run_np 1 --schedule interleaved --pp 1 --microbatches 4
expect_fail
expect_grep err 'interleaved needs pp >= 2'
run_np 1 --schedule gpipe --pp 2 --pipeline.f 0
expect_fail
expect_grep err 'f and b must be > 0'
run_np 1 --schedule 1f1b --pp 2 --trace /nonexistent-dir/trace.json
expect_fail
expect_grep err '/nonexistent-dir/trace.json'
# On several ranks the report still comes once, from rank 0.
run_np 2 --schedule zb-h1 --pp 2 --microbatches 4
expect_ok
[ "$(count_grep out '^makespan:')" -eq 1 ] || fail "the report was printed more than once"
echo "ok"
