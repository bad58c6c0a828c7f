#!/bin/sh
# SIGTERM to one rank mid-run: every rank stops after the same step (the
# flag is all-reduced at the step boundary), the run exits 0 with a message,
# metrics.jsonl ends with a "stopped" record at the last completed step, and
# no samples are generated. SIGUSR1 during start-up does not kill the rank:
# the run stops after step 1.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

echo "+ $MPIEXEC -n 2 colossal-pretrain (100000 steps, in the background)"
# shellcheck disable=SC2086
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" $TINY --train.steps 100000 --eval.interval 0 --log.interval 1000 \
    --generate.tokens 8 --run.dir "$TMP/run" >"$TMP/out" 2>"$TMP/err" &
# after a few steps
M="$TMP/run/metrics.jsonl"
signal_after_steps $! "$M" 5 TERM
expect_ok
expect_grep out '^stopped by SIGTERM after step [0-9]+ of 100000 \(all ranks at the same step boundary\)'
expect_no_grep out '^samples'
stopped=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\) .*/\1/p' "$TMP/out")
last=$(field train loss "$M" | tail -n 1 | cut -d' ' -f1)
[ "$stopped" = "$last" ] || fail "stopped after step $stopped but the last metrics record is step $last"
[ "$stopped" -ge 5 ] && [ "$stopped" -lt 100000 ] || fail "stopped after step $stopped, not after the 5th step"
grep -q "\"kind\":\"end\",\"status\":\"stopped\",\"signal\":15,\"step\":$stopped," "$M" || fail "no stopped end record"

# SIGUSR1 during start-up (before the first step; here as soon as the
# rank's handler shows in /proc, which is the first thing main does): the
# rank survives setup and every rank stops after step 1.
echo "+ $MPIEXEC -n 2 colossal-pretrain (signalled during start-up)"
# shellcheck disable=SC2086
$MPIEXEC -n 2 --oversubscribe "$PRETRAIN_BIN" $TINY --train.steps 100000 --eval.interval 0 --log.interval 1000 \
    --run.dir "$TMP/early" >"$TMP/out" 2>"$TMP/err" &
launcher=$!
i=0
while :; do
    rank_pid=$(ps -o pid= --ppid $launcher | tail -n 1 | tr -d ' ')
    mask=$( [ -n "$rank_pid" ] && awk '/^SigCgt/ { print $2 }' "/proc/$rank_pid/status" 2>/dev/null)
    # SIGUSR1 is signal 10: bit 9 of the caught mask (its last 4 hex digits).
    [ -n "$mask" ] && [ $((0x${mask#????????????} & 0x200)) -ne 0 ] && break
    i=$((i + 1))
    [ $i -le 1200 ] || { kill -KILL $launcher 2>/dev/null; fail "no rank caught SIGUSR1 within 60 s"; }
    kill -0 $launcher 2>/dev/null || fail "the run ended before it was signalled"
    sleep 0.05
done
started=$(grep -s '"kind":"start"' "$TMP/early/metrics.jsonl" | wc -l)
echo "+ kill -USR1 $rank_pid (one rank, start record written: $started)"
kill -USR1 "$rank_pid"
RC=0
wait $launcher || RC=$?
expect_ok
expect_grep out '^stopped by SIGUSR1 after step 1 of 100000'
[ "$started" -eq 0 ] || fail "the SIGUSR1 handler was installed only after setup (the start record was already written)"
echo "PASS: stopped after step $stopped; signalled during start-up, stopped after step 1"
