#!/bin/sh
# SIGTERM to one rank mid-run: every rank stops after the same step (the
# flag is all-reduced at the step boundary), the run exits 0 with a message,
# metrics.jsonl ends with a "stopped" record at the last completed step, and
# no samples are generated.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

echo "+ $MPIEXEC -n 2 colossal-pretrain (100000 steps, in the background)"
# shellcheck disable=SC2086
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" $TINY --train.steps 100000 --eval.interval 0 --log.interval 1000 \
    --generate.tokens 8 --run.dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" &
launcher=$!
M="$TMP/run/metrics.jsonl"
# Wait (at most 60 s) until a few steps are done.
i=0
while [ "$(grep -c '"kind":"train"' "$M" 2>/dev/null || echo 0)" -lt 5 ]; do
    i=$((i + 1))
    [ $i -le 600 ] || { kill -KILL $launcher 2>/dev/null; fail "no training steps within 60 s"; }
    kill -0 $launcher 2>/dev/null || fail "the run ended before it was signalled"
    sleep 0.1
done
# The ranks are the launcher's children; signal only the last of them.
rank_pid=$(ps -o pid= --ppid $launcher | tail -n 1 | tr -d ' ')
[ -n "$rank_pid" ] || { kill -KILL $launcher; fail "cannot find the ranks' processes"; }
echo "+ kill -TERM $rank_pid (one rank)"
kill -TERM "$rank_pid"
RC=0
wait $launcher || RC=$?
expect_ok
expect_grep out '^stopped by SIGTERM after step [0-9]+ of 100000 \(all ranks at the same step boundary\)'
expect_no_grep out '^samples'
stopped=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\) .*/\1/p' "$TMP/out")
last=$(field train loss "$M" | tail -n 1 | cut -d' ' -f1)
[ "$stopped" = "$last" ] || fail "stopped after step $stopped but the last metrics record is step $last"
[ "$stopped" -lt 100000 ] || fail "the run was not stopped early"
grep -q "\"kind\":\"end\",\"status\":\"stopped\",\"signal\":15,\"step\":$stopped," "$M" || fail "no stopped end record"
echo "PASS: stopped after step $stopped"
