#!/bin/sh
# The measured pipeline bubble against the schedule's with every stage's
# compute made equal (the test hook CAI_PP_EQUAL_COMPUTE_US: each forward,
# input or weight pass padded by sleeping to 10 ms a cost unit, a fused
# backward 20 ms): colossal-pretrain --pp.trace at pp=2 for 1f1b and
# interleaved and at pp=4 (4 ranks on whatever cores there are) for 1f1b,
# as many microbatches as stages (the largest bubbles: a late wake-up is the
# smallest share of them).
# Each run's least disturbed step (the smallest of its 7 measured steps'
# bubbles) is within 25% of the schedule's prediction (at the measured
# compute times with the measured transfer time); a run that is not is run
# again, up to three times in all. The issue's goal is 10% (bench/pp_bubble.sh
# with EQUAL_US measures it; bench/RESULTS.md, "Pipeline: bubble at equal
# compute"); make check runs beside other jobs on shared cores, where a rank
# woken late from its sleep or from a receive's wait stretches a step, so
# the check takes the step the load disturbed least, and a run whose every
# step was disturbed is measured again rather than judged. A schedule that
# idles more than it predicts does so in every step. The padding
# itself is checked: the forwards average at least the target, the
# backwards twice it, and the count of computes that outlasted the target
# is reported, and a bad value refused. Nothing here waits on wall time: every run ends by itself.
. "$top_srcdir/tests/apps/pretrain_lib.sh"

$MPIEXEC -n 1 "$top_builddir/apps/colossal-check" --info 2>/dev/null | grep -Eq '^  test hooks +compiled in' || {
    echo "SKIP: this build has no test hooks (configure --enable-test-hooks); CAI_PP_EQUAL_COMPUTE_US is needed"
    exit 77
}
export CAI_PP_EQUAL_COMPUTE_US=10000 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
ARGS="--train.micro_batch 2 --train.steps 8 --log.interval 8 --eval.interval 0
  --checkpoint.every 0 --mesh.watchdog_timeout 60"

# check PP SCHEDULE FILE: the trace's statistics against the prediction
check() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
pp, sched, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
o = json.load(open(path))["otherData"]
target = 10000e-6
pred, meas = o["bubble_with_transfers"], o["bubble_measured_min"]
ratio = meas / pred
print(f"{sched} pp={pp}: measured {100 * meas:.2f}% at the least (median {100 * o['bubble_measured']:.2f}%, max "
      f"{100 * o['bubble_measured_max']:.2f}%), predicted {100 * pred:.2f}%, textbook {100 * o['bubble_textbook']:.2f}%, "
      f"ratio {ratio:.3f}; forward {1e3 * o['forward_s']:.2f} ms, backward {1e3 * o['backward_s']:.2f} ms; "
      f"{o['equal_overruns']:.0f} of {o['equal_actions']:.0f} computes outlasted the target")
assert o["equal_compute_us"] == 10000 and o["steps"] == 7, o
assert o["equal_actions"] == 7 * pp * pp * (2 if sched == "interleaved" else 1) * 2, o
# padded: at least the target, a fused backward twice it (a late wake-up adds, never removes)
assert o["forward_s"] >= target and o["backward_s"] >= 2 * target, o
sys.exit(0 if abs(ratio - 1) <= 0.25 else 3)  # 3: this run's steps were all disturbed, or the schedule is off
PY
}

# a value out of range is refused at the first step, naming the variable and its range
CAI_PP_EQUAL_COMPUTE_US=-5
# shellcheck disable=SC2086
run_np 2 $TINY $ARGS --train.steps 2 --train.grad_accum 2 --mesh.pp 2 --run.dir "$TMP/bad"
CAI_PP_EQUAL_COMPUTE_US=10000
expect_rc 2
expect_grep err "environment variable CAI_PP_EQUAL_COMPUTE_US='-5': expected an integer in \\[0, 10000000\\]"

for run in "2 1f1b 2" "2 interleaved 4" "4 1f1b 4"; do
    # shellcheck disable=SC2086 # the words of one run
    set -- $run
    pp=$1 sched=$2 layers=$3
    for attempt in 1 2 3; do
        rm -rf "${TMP:?}/$sched$pp"
        # shellcheck disable=SC2086
        run_np "$pp" $TINY $ARGS --model.n_layers "$layers" --train.grad_accum "$pp" --mesh.pp "$pp" \
            --pp.schedule "$sched" --run.dir "$TMP/$sched$pp" --pp.trace "$TMP/$sched$pp.json"
        expect_ok
        expect_grep out 'computes padded to 10000 us a unit \(CAI_PP_EQUAL_COMPUTE_US\): [0-9]+ of [0-9]+ outlasted it'
        rc=0
        check "$pp" "$sched" "$TMP/$sched$pp.json" || rc=$?
        [ "$rc" = 0 ] && break
        [ "$rc" = 3 ] || fail "$sched at pp=$pp: the trace's statistics are not what the schedule gives ($TMP/$sched$pp.json)"
        [ "$attempt" -lt 3 ] || fail "$sched at pp=$pp: no step's bubble within 25% of the predicted one in 3 runs ($TMP/$sched$pp.json)"
        echo "$sched at pp=$pp: every step disturbed (attempt $attempt of 3); measuring again"
    done
done
echo "PASS"
