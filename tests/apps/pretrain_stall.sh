#!/bin/sh
# A rank that stops making progress (SIGSTOP) while the others wait for it
# aborts the job through the watchdog, naming that rank: on 2 and on 4
# ranks, whatever collective the others are in when it stops (the gradient
# reductions, the agreed stop, the progress line's reduction), and in the
# middle of a checkpoint write, where the others wait inside MPI-IO (the
# guard's heartbeats, in shared memory and, across nodes, in files; needs
# the test hooks that hold a rank mid-write and that split the nodes).
. "$top_srcdir/tests/apps/pretrain_lib.sh"

WD=5
# Stops PID (world rank RANK) and waits for the launcher, which must fail
# within the watchdog's time (only an upper bound for a hang: the report
# itself says how long it waited). WHAT: "", or how the stop came.
stop_and_wait() { # PID RANK WHAT
    echo "+ kill -STOP $1 (rank $2$3)"
    t0=$(date +%s)
    kill -STOP "$1"
    RC=0
    wait $launcher || RC=$?
    waited=$(($(date +%s) - t0))
    kill -KILL "$1" 2>/dev/null
    [ "$RC" -ne 0 ] || fail "the job ended with status 0 after rank $2 stopped$3"
    [ "$waited" -le $((WD + 120)) ] || fail "the job took $waited s to end after rank $2 stopped$3"
    echo "  ended after $waited s (watchdog $WD s)"
}

stall() { # NP
    M="$TMP/stall$1/metrics.jsonl"
    echo "+ $MPIEXEC -n $1 colossal-pretrain --mesh.watchdog_timeout $WD (in the background)"
    # shellcheck disable=SC2086
    $MPIEXEC -n "$1" --oversubscribe "$PRETRAIN_BIN" $TINY --train.steps 100000 --eval.interval 0 --log.interval 3 \
        --mesh.watchdog_timeout $WD --run.dir "$TMP/stall$1" >"$TMP/out" 2>"$TMP/err" &
    launcher=$!
    while [ "$(grep -s '"kind":"train"' "$M" | wc -l)" -lt 3 ]; do
        kill -0 $launcher 2>/dev/null || fail "the run ended before it was stopped"
        sleep 0.1
    done
    # The rank with the highest world rank, found by the rank MPI gave it.
    victim="" want=$(($1 - 1))
    for pid in $(ps -o pid= --ppid $launcher); do
        r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ "$r" = "$want" ] && victim=$pid
    done
    [ -n "$victim" ] || { kill -KILL $launcher; fail "cannot find rank $want's process"; }
    stop_and_wait "$victim" "$want" ""
    expect_grep err "watchdog: .* did not complete within [0-9.]+ s" "no watchdog report after rank $want stopped"
    expect_grep err "(ranks behind|ranks not answering \\(stuck\\)|ranks not progressing): (.*, )?$want[ ,(]" \
        "the watchdog report does not name rank $want"
}

stall 2
stall 4

$MPIEXEC -n 1 "$top_builddir/apps/colossal-check" --info 2>/dev/null | grep -Eq '^  test hooks +compiled in' || {
    echo "PASS (the checkpoint-write stall needs --enable-test-hooks: not run)"
    exit 0
}
# The checkpoint-write stall. NODES=1: every rank is a node of its own
# (CAI_GUARD_TEST_NODES), so no node-mate sees the stop in shared memory and
# the report must come from the next node's read of the stopped rank's
# heartbeat file in the run directory (cai_mesh_guard_dir).
ckpt_stall() { # NP NODES (the last rank stops)
    np=$1 last=$(($1 - 1))
    shift
    d="$TMP/ck$np-$1"
    echo "+ CAI_CKPT_TEST_STALL=1 CAI_GUARD_TEST_NODES=$1 $MPIEXEC -n $np colossal-pretrain --checkpoint.every 2 (in the background)"
    # shellcheck disable=SC2086
    CAI_CKPT_TEST_STALL=1 CAI_GUARD_TEST_NODES=$1 $MPIEXEC -n $np --oversubscribe -x CAI_CKPT_TEST_STALL \
        -x CAI_GUARD_TEST_NODES "$PRETRAIN_BIN" $TINY --train.steps 20 --eval.interval 0 --checkpoint.every 2 \
        --mesh.watchdog_timeout $WD --run.dir "$d" >"$TMP/out" 2>"$TMP/err" &
    launcher=$!
    while ! grep -q "checkpoint test hook: rank $last" "$TMP/err" 2>/dev/null; do
        kill -0 $launcher 2>/dev/null || fail "the run ended before the hook"
        sleep 0.1
    done
    pid=$(sed -n "s/.*checkpoint test hook: rank $last (pid \([0-9]*\)).*/\1/p" "$TMP/err")
    stop_and_wait "$pid" "$last" ", mid-write"
    expect_grep err "watchdog: the checkpoint write of step 2 did not complete within [0-9.]+ s on rank [0-9]+; ranks not progressing: $last "
    if [ "$1" = 1 ]; then
        expect_grep err "the heartbeat file $d/.cai-guard/node-$last of its node has not changed for over" \
            "the stop was not seen through the heartbeat file"
    else
        [ ! -e "$d/.cai-guard" ] || fail "a one-node run wrote heartbeat files"
    fi
}

ckpt_stall 2 0
ckpt_stall 4 1
echo "PASS"
