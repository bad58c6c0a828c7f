#!/bin/sh
# Pipeline bubble on CPU: colossal-pretrain at pp=2 (PP) with --pp.trace, for
# each schedule, the measured bubble beside the schedule's prediction
# (docs/pipeline.md, "Measured timelines"). Stages are made equal: every
# virtual stage holds the same number of layers, and at d_model 512 the
# embedding and the head (byte vocabulary) are small beside them (at 256
# the last stage, with the head and the loss, computes 3-4% longer: the
# "stages" column shows it); one rank per core, one thread.
#
# Per run: the textbook bubble (the schedule at unit costs), the prediction
# with the run's measured transfer time (the schedule at the mean compute
# times of equal stages, every boundary transfer taking the median time
# from a producer's end to its waiting consumer's start), the measured
# bubble (median over the steps after the first, with the least and the
# most), measured / prediction (the goal for 1f1b and interleaved:
# 0.90-1.10), the replay (the schedule on each action's measured time: what
# the compute's own variation makes of it), the replay with each stage's
# actions at their median in the step (@stages: what unequal stages alone
# make of it), the mean forward and backward of the last stage over the first's, the compute's coefficient of variation
# (cv: median over the steps; how far the run was from equal compute), the
# share of the compute's time its rank waited for a processor (stolen: other
# processes), the replay at the actions' processor times (@cpu: the run as if
# nothing had taken a processor), and the load average at the start.
# With EQUAL_US=N (a build configured --enable-test-hooks) every compute
# action sleeps after its real compute until N microseconds a cost unit have
# passed (CAI_PP_EQUAL_COMPUTE_US: forward, input and weight pass 1 unit, a
# fused backward 2): every stage takes the same time whatever it holds, and a
# rank waiting leaves the processors to the others, so pp 4 runs on 2 cores;
# the "over" column counts the computes whose real time outlasted the target
# (they were not padded: the run was not equal; 0 is what it should read).
#
# Usage: bench/pp_bubble.sh [MICROBATCHES [LAYERS_PER_STAGE [STEPS [REPEAT]]]]   (defaults 8 4 8 1)
# Environment: BUILD (build directory holding apps/colossal-pretrain;
# default: the directory this is run from), MPIEXEC (default mpiexec; may carry options, e.g.
# "mpiexec --bind-to none"), SCHEDULES (default "1f1b interleaved gpipe zb-h1 zb-v"),
# D_MODEL (default 512; 64 per head), PP (default 2; ranks = PP), EQUAL_US (default 0: off), BENCH_ARGS (extra colossal-pretrain flags), QUIET (seconds,
# default 0: before each run, wait up to that long until no other task has been runnable for 2 s;
# the "start" column says whether it was: quiet, busy, or - when not asked).
set -e
m=${1:-8}
per=${2:-4}
steps=${3:-8}
repeat=${4:-1}
d=${D_MODEL:-512}
pp=${PP:-2}
equal=${EQUAL_US:-0}
build=${BUILD:-.}
bin=$build/apps/colossal-pretrain
mpiexec=${MPIEXEC:-mpiexec}
[ -x "$bin" ] || { echo "pp_bubble.sh: $bin not found: run from the build directory or set BUILD" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pp-bubble.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ "$equal" -gt 0 ]; then
    export CAI_PP_EQUAL_COMPUTE_US="$equal"
    "$build/apps/colossal-check" --info 2>/dev/null | grep -Eq '^  test hooks +compiled in' ||
        { echo "pp_bubble.sh: EQUAL_US needs a build configured --enable-test-hooks" >&2; exit 2; }
fi
tree=$(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo '?')
echo "# $(date -u +%Y-%m-%dT%H:%MZ) tree $tree, $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "$(getconf _NPROCESSORS_ONLN) cores online, pp=$pp, $m microbatches, $per layers of d_model $d per virtual stage, $steps steps,"\
     "computes padded to ${equal} us a unit (0: not padded)"
printf '%-12s %-5s %-5s %9s %22s %26s %10s %8s %9s %13s %6s %6s %8s %5s %9s\n' schedule start load textbook \
    "with transfers (us)" "measured (min-max)" "meas/pred" replay "@stages" "stages F B" cv stolen "@cpu" steps over
# quiet or busy: whether, within QUIET seconds, no other task was runnable for 2 s (10 samples)
quiet() {
    [ "${QUIET:-0}" -gt 0 ] || { echo -; return; }
    tries=0 calm=0
    while [ "$calm" -lt 10 ] && [ "$tries" -lt $((QUIET * 5)) ]; do
        # the reader itself is running
        if [ "$(sed -n 's/^procs_running //p' /proc/stat)" -le 1 ]; then calm=$((calm + 1)); else calm=0; fi
        sleep 0.2
        tries=$((tries + 1))
    done
    if [ "$calm" -ge 10 ]; then echo quiet; else echo busy; fi
}
# the value of "key" in the trace's otherData
other() { sed -n "s/.*\"otherData\".*\"$1\": \([-0-9.e+]*\).*/\1/p" "$2"; }
for sched in ${SCHEDULES:-1f1b interleaved gpipe zb-h1 zb-v}; do
    v=1
    case $sched in interleaved | zb-v) v=2 ;; esac
    layers=$((pp * v * per))
    i=0
    while [ "$i" -lt "$repeat" ]; do
        i=$((i + 1))
        start=$(quiet)
        load=$(cut -d' ' -f1 /proc/loadavg)
        # shellcheck disable=SC2086
        $mpiexec -n "$pp" "$bin" --model.n_layers "$layers" --model.d_model "$d" --model.n_heads $((d / 64)) --train.seq_len 128 \
            --train.micro_batch 2 --train.grad_accum "$m" --train.steps "$steps" --data.corpus_docs 1500 \
            --data.corpus_vocab 0 --generate.tokens 0 --optim.warmup_steps 1 --eval.interval 0 --checkpoint.every 0 \
            --log.interval "$steps" --mesh.pp "$pp" --pp.schedule "$sched" --pp.trace "$tmp/$sched.json" \
            --run.dir "$tmp/$sched" $BENCH_ARGS >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        t="$tmp/$sched.json"
        awk -v s="$sched" -v start="$start" -v load="$load" -v tb="$(other bubble_textbook "$t")" -v ac="$(other bubble_at_costs "$t")" \
            -v wt="$(other bubble_with_transfers "$t")" -v us="$(other transfer_s "$t")" \
            -v me="$(other bubble_measured "$t")" -v lo="$(other bubble_measured_min "$t")" \
            -v hi="$(other bubble_measured_max "$t")" -v rp="$(other bubble_replay "$t")" \
            -v f0="$(other forward_s_rank0 "$t")" -v f1="$(other forward_s_rank$((pp - 1)) "$t")" \
            -v b0="$(other backward_s_rank0 "$t")" -v b1="$(other backward_s_rank$((pp - 1)) "$t")" -v n="$(other steps "$t")" -v cv="$(other compute_cv "$t")" \
            -v sto="$(other waited_cpu "$t")" -v rc="$(other bubble_replay_cpu "$t")" \
            -v sg="$(other bubble_at_stage_times "$t")" -v eo="$(other equal_overruns "$t")" \
            -v ea="$(other equal_actions "$t")" 'BEGIN {
            # zero-bubble styles: the unit-cost schedule times W as F; their prediction is at the measured costs
            zb = s ~ /^zb/
            pred = zb ? ac : wt
            printf "%-12s %-5s %-5s %8.2f%% %9.2f%% %s(%4.0f) %7.2f%% (%5.2f-%5.2f) %6.3f%s %7.2f%% %8.2f%% %6.3f %6.3f %5.1f%% %5.1f%% %7.2f%% %5d %9s\n",
                s, start, load, 100 * tb, 100 * pred, zb ? "*" : " ", 1e6 * us, 100 * me, 100 * lo, 100 * hi, me / pred,
                (me / pred >= 0.9 && me / pred <= 1.1) ? " " : "!", 100 * rp, 100 * sg, f1 / f0, b1 / b0, 100 * cv, 100 * sto,
                100 * rc, n, eo "/" ea }'
    done
done
echo "# *: zero-bubble schedules are predicted at the measured mean forward / input / weight times (no transfer time)"
echo "# !: measured / predicted outside 0.90-1.10"
