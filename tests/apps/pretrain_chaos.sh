#!/bin/sh
# Chaos run (issue 18): colossal-pretrain on 2 ranks, checkpointing every 3
# steps, is restarted with --resume auto until it reaches its last step,
# while a seeded schedule of faults hits it, each one fired by a state the
# run shows (a step appearing in metrics.jsonl, a new checkpoint file, a
# rank held mid-write by the checkpoint test hook), never by a delay:
# - kill -9 of a random rank (after a step, or in the middle of a
#   checkpoint write when the build has test hooks);
# - SIGSTOP of a random rank: the watchdog (--mesh.watchdog_timeout 4) ends
#   the job naming it;
# - SIGTERM or SIGUSR1 of a random rank: a checkpoint and exit status 3;
# - a full disk (tests/apps/enospc_shim.c through LD_PRELOAD) under the
#   checkpoint directory or at metrics.jsonl: exit status 4.
# At the end the last loss recorded for every step (train and validation)
# equals, as printed, the loss of one uninterrupted run; every line of
# metrics.jsonl is a whole record; every checkpoint left verifies
# (colossal-ckpt verify), `latest` names the last step and no temporary
# file is left.
# make check runs 5 faults, one of each kind (CAI_CHAOS_SEED picks their
# order, ranks and triggers); CAI_CHAOS_ROUNDS=N runs N (the long run of
# bench/RESULTS.md).
. "$top_srcdir/tests/apps/pretrain_lib.sh"
SHIM="$top_builddir/tests/apps/libenospc_shim.so"
CKPT_BIN="$top_builddir/apps/colossal-ckpt"
ROUNDS=${CAI_CHAOS_ROUNDS:-5}
SEED=${CAI_CHAOS_SEED:-18}
WD=4
# A fault lands some steps after the state that fired it (the polling
# interval over a step of milliseconds): room for that many per fault.
STEPS=$((40 * ROUNDS + 30))
RUN="$TMP/chaos"
D="$RUN/checkpoints"
M="$RUN/metrics.jsonl"
CFG="$TINY --train.steps $STEPS --eval.interval 5 --eval.batches 2 --log.interval 1000 --checkpoint.every 3
  --checkpoint.keep 4 --mesh.watchdog_timeout $WD"
# ASan must come first in the preload list; the shim goes after it.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export ASAN_OPTIONS
HOOKS=0
$MPIEXEC -n 1 "$top_builddir/apps/colossal-check" --info 2>/dev/null | grep -Eq '^  test hooks +compiled in' && HOOKS=1
KINDS="kill9 stop term usr1"
[ -f "$SHIM" ] && KINDS="$KINDS enospc"

# The schedule, one fault a line: kind, rank, trigger (step: a train record
# K steps past the last one recorded; ckpt: a new step file; midwrite: the
# test hook holds rank 1 after T transfers of a save: T is 1 or 2), K or T, and for
# enospc the full place (ckpt or metrics) and a budget fraction (per mille
# of a checkpoint file, or of 8 KB of metrics). Every kind once in each
# block of as many faults as there are kinds, in a random order.
awk -v seed="$SEED" -v rounds="$ROUNDS" -v kinds="$KINDS" -v hooks="$HOOKS" 'BEGIN {
    srand(seed)
    nk = split(kinds, k, " ")
    for (i = 0; i < rounds; i++) {
        if (i % nk == 0) for (j = nk; j > 1; j--) { r = 1 + int(rand() * j); t = k[j]; k[j] = k[r]; k[r] = t }
        kind = k[i % nk + 1]
        trig = rand() < 0.5 ? "step" : "ckpt"
        n = 1 + int(rand() * 4)
        if (kind == "kill9" && hooks && rand() < 0.5) { trig = "midwrite"; n = 1 + int(rand() * 2) }
        place = rand() < 0.75 ? "ckpt" : "metrics"
        print kind, int(rand() * 2), trig, n, place, int(rand() * 2000)
    }
}' >"$TMP/schedule"

# shellcheck disable=SC2086
run_np 2 $CFG --run.dir "$TMP/whole"
expect_ok
CKPT_BYTES=$(wc -c <"$TMP/whole/checkpoints/$(cat "$TMP/whole/checkpoints/latest")")

records() { grep -s -c '"kind":"train"' "$M" || true; }
last_step() { grep -s '"kind":"train"' "$M" | sed -n 's/.*"step":\([0-9]*\).*/\1/p' | sort -n | tail -n 1; }
newest_ckpt() { cat "$D/latest" 2>/dev/null || echo none; }
# rank_pid LAUNCHER RANK: the process MPI gave that rank.
rank_pid() {
    for pid in $(ps -o pid= --ppid "$1"); do
        r=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ "$r" = "$2" ] && echo "$pid" && return
    done
}
# finish LAUNCHER BOUND: wait for the job to end (RC: its status). BOUND
# seconds only tell a hang from a slow machine: a job that outlives them
# fails the test.
finish() {
    t0=$(date +%s)
    while kill -0 "$1" 2>/dev/null; do
        if [ $(($(date +%s) - t0)) -gt "$2" ]; then
            for pid in $(ps -o pid= --ppid "$1"); do kill -KILL "$pid" 2>/dev/null; done
            kill -KILL "$1" 2>/dev/null
            fail "attempt $attempt ($fault): the job still runs $2 s after the fault"
        fi
        sleep 0.1
    done
    RC=0
    wait "$1" || RC=$?
}

attempt=0
round=0
done_run=0
: >"$TMP/log"
while [ $done_run -eq 0 ]; do
    attempt=$((attempt + 1))
    [ $attempt -le $((3 * ROUNDS + 10)) ] || fail "no end after $attempt attempts"
    fault=none
    [ $round -lt "$ROUNDS" ] && fault=$(sed -n "$((round + 1))p" "$TMP/schedule")
    # shellcheck disable=SC2086
    set -- $fault
    kind=$1 rank=${2:-0} trig=${3:-} k=${4:-1} place=${5:-ckpt} frac=${6:-0}
    base_steps=$(last_step)
    base_ckpt=$(newest_ckpt)
    pre="" env_args=""
    case $kind in
    enospc)
        if [ "$place" = ckpt ]; then
            at="$D" bytes=$((CKPT_BYTES * frac / 1000))
        else
            at="$M" bytes=$((8192 * frac / 1000))
        fi
        mkdir -p "$D"
        env_args="-x LD_PRELOAD=$SHIM -x CAI_ENOSPC_PATH=$at -x CAI_ENOSPC_AFTER=$bytes"
        env_args="$env_args -x CAI_ENOSPC_STATE=$TMP/shim-state.$attempt -x ASAN_OPTIONS"
        ;;
    kill9)
        if [ "$trig" = midwrite ]; then
            pre="CAI_CKPT_TEST_STALL=$k:1"
            env_args="-x CAI_CKPT_TEST_STALL"
        fi
        ;;
    esac
    echo "+ attempt $attempt: fault '$fault' (last step recorded ${base_steps:-none}, latest $base_ckpt)"
    # shellcheck disable=SC2086
    env $pre $MPIEXEC -n 2 --oversubscribe $env_args "$PRETRAIN_BIN" $CFG --run.dir "$RUN" --resume auto \
        >"$TMP/out" 2>"$TMP/err" &
    launcher=$!
    fired=0
    if [ "$kind" != none ] && [ "$kind" != enospc ]; then
        want=$((${base_steps:-0} + k))
        while kill -0 $launcher 2>/dev/null; do
            case $trig in
            step) [ "$(last_step)" -ge "$want" ] 2>/dev/null && break ;;
            ckpt) [ "$(newest_ckpt)" != "$base_ckpt" ] && [ "$(newest_ckpt)" != none ] && break ;;
            midwrite) grep -q 'checkpoint test hook: rank 1' "$TMP/err" 2>/dev/null && break ;;
            esac
            sleep 0.05
        done
        victim=$(rank_pid $launcher "$rank")
        if [ -n "$victim" ] && kill -0 $launcher 2>/dev/null; then
            case $kind in
            kill9) kill -KILL "$victim" ;;
            stop) kill -STOP "$victim" ;;
            term) kill -TERM "$victim" ;;
            usr1) kill -USR1 "$victim" ;;
            esac
            fired=1
        fi
    fi
    finish $launcher $((WD + 600))
    # The stopped rank, unless its launcher took it along.
    if [ "$kind" = stop ] && [ -n "$victim" ] && grep -qs '^State:.*stopped' "/proc/$victim/status"; then
        kill -KILL "$victim"
    fi
    ! grep -Eq 'Sanitizer|runtime error:' "$TMP/err" || fail "attempt $attempt: sanitizer report"
    # A full disk shows as a failed write, or as a save refused up front
    # (statvfs under the shim reports the budget left).
    [ "$kind" = enospc ] && { [ "$RC" -eq 4 ] || grep -q 'enospc shim: .* fails with' "$TMP/err"; } && fired=1
    echo "  exit $RC, last step recorded $(last_step), latest $(newest_ckpt)$([ $fired -eq 1 ] || echo ', fault not fired')"
    if [ $fired -eq 1 ]; then
        case $kind in
        kill9) [ "$RC" -ne 0 ] || fail "attempt $attempt: the job survived kill -9 of rank $rank" ;;
        stop)
            [ "$RC" -ne 0 ] || fail "attempt $attempt: the job ended with status 0 after rank $rank stopped"
            expect_grep err "watchdog: .* within [0-9.]+ s" "attempt $attempt: no watchdog report after rank $rank stopped"
            ;;
        term | usr1)
            [ "$RC" -eq 3 ] || [ "$RC" -eq 0 ] || fail "attempt $attempt: SIGTERM/SIGUSR1 ended the job with $RC, not 3"
            ;;
        enospc)
            [ "$RC" -eq 4 ] || [ "$RC" -eq 0 ] || fail "attempt $attempt: a full disk ended the job with $RC, not 4"
            [ "$RC" -eq 0 ] || expect_grep err "No space left on device" "attempt $attempt: exit 4 without ENOSPC"
            ;;
        esac
        [ "$kind" = enospc ] && trig=$place
        echo "$kind $trig rank=$rank exit=$RC" >>"$TMP/log"
        round=$((round + 1))
    elif [ "$kind" = enospc ]; then
        round=$((round + 1)) # the budget sufficed: the disk never filled
        echo "enospc-unfilled $place exit=$RC" >>"$TMP/log"
    else
        [ "$RC" -eq 0 ] || fail "attempt $attempt: the job failed (exit $RC) without a fault"
    fi
    if [ "$RC" -eq 0 ]; then
        grep -q "\"kind\":\"end\",\"status\":\"done\"" "$M" && [ "$(last_step)" = "$STEPS" ] && done_run=1
        [ $done_run -eq 1 ] || fail "attempt $attempt: exit 0 before step $STEPS"
        [ $round -ge "$ROUNDS" ] || fail "the run reached step $STEPS with $((ROUNDS - round)) faults not fired"
    fi
done

# The losses: the last record of every step, against the uninterrupted run.
awk 'match($0, /"kind":"(train|eval)","step":[0-9]+/) { k = substr($0, RSTART, RLENGTH); if (!(k in last)) order[n++] = k; last[k] = $0 }
    END { for (i = 0; i < n; i++) print last[order[i]] }' "$M" |
    sort -t: -k3,3n >"$TMP/last.jsonl"
same_losses "$TMP/whole/metrics.jsonl" "$TMP/last.jsonl" "the chaos run (the last record of every step)"
# One whole record a line (a record cut short by a full disk or a kill
# must not run into the next run's first).
bad=$(awk '!/^\{"kind":.*\}$/ || gsub(/\{"kind":/, "&") != 1' "$M" | head -n 2)
[ -z "$bad" ] || fail "metrics.jsonl has lines that are not one whole record: $bad"

# The checkpoints left.
[ "$(cat "$D/latest")" = "$(printf 'step-%08d.h5' "$STEPS")" ] || fail "latest names $(cat "$D/latest")"
left=$(find "$D" -name '*.tmp*' | head -n 3)
[ -z "$left" ] || fail "temporary files left: $left"
n=0
for f in "$D"/step-*.h5; do
    RC=0
    $MPIEXEC -n 1 "$CKPT_BIN" verify "$f" >"$TMP/out" 2>"$TMP/err" || RC=$?
    [ "$RC" -eq 0 ] || fail "colossal-ckpt verify $f: exit $RC"
    n=$((n + 1))
done

counts=$(awk '{ c[$1]++ } END { for (k in c) { printf "%s%s=%d", sep, k, c[k]; sep = " " } }' "$TMP/log")
echo "PASS: $STEPS steps through $attempt attempts, faults: $counts; losses equal the uninterrupted run's;" \
    "$n checkpoints verified"
