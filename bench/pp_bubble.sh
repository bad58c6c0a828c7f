#!/bin/sh
# Pipeline bubble on CPU: colossal-pretrain at pp=2 with --pp.trace, for
# each schedule, printing the measured bubble (over the steps after the
# first) beside the schedule's prediction and their ratio. Stages are made equal: every
# virtual stage holds the same number of layers and the embedding and head
# (byte vocabulary) are small beside them; one rank per core, one thread.
#
# Usage: bench/pp_bubble.sh [MICROBATCHES [LAYERS_PER_STAGE [STEPS]]]   (defaults 8 4 6)
# Environment: BUILD (build directory holding apps/colossal-pretrain;
# default: the directory this is run from), MPIEXEC (default mpiexec; may carry options, e.g.
# "mpiexec --bind-to none"),
# BENCH_ARGS (extra colossal-pretrain flags).
set -e
m=${1:-8}
per=${2:-4}
steps=${3:-6}
build=${BUILD:-.}
bin=$build/apps/colossal-pretrain
mpiexec=${MPIEXEC:-mpiexec}
[ -x "$bin" ] || { echo "pp_bubble.sh: $bin not found: run from the build directory or set BUILD" >&2; exit 2; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/pp-bubble.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "$(getconf _NPROCESSORS_ONLN) cores online, pp=2, $m microbatches, $per layers per virtual stage, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for sched in 1f1b interleaved gpipe zb-h1 zb-v; do
    v=1
    case $sched in interleaved | zb-v) v=2 ;; esac
    layers=$((2 * v * per))
    # shellcheck disable=SC2086
    $mpiexec -n 2 "$bin" --model.n_layers "$layers" --model.d_model 256 --model.n_heads 4 --train.seq_len 128 \
        --train.micro_batch 2 --train.grad_accum "$m" --train.steps "$steps" --data.corpus_docs 1500 \
        --data.corpus_vocab 0 --generate.tokens 0 --optim.warmup_steps 1 --eval.interval 0 --checkpoint.every 0 --log.interval "$steps" \
        --mesh.pp 2 --pp.schedule "$sched" --pp.trace "$tmp/$sched.json" --run.dir "$tmp/$sched" $BENCH_ARGS \
        >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    line=$(grep '^pipeline trace:' "$tmp/out")
    meas=$(echo "$line" | sed -n 's/.*bubble \([0-9.]*\)% measured.*/\1/p')
    pred=$(echo "$line" | sed -n 's/.*, \([0-9.]*\)% by the schedule.*/\1/p')
    cost=$(echo "$line" | sed -n 's/.*(\([0-9.]*\)% at the measured compute times).*/\1/p')
    awk -v s="$sched" -v v="$v" -v a="$meas" -v b="$pred" -v c="$cost" 'BEGIN {
        printf "%-12s v=%d  bubble measured %5.1f%%  predicted %5.1f%%  ratio %.2f (goal within 10%%: 0.90-1.10);  at the measured compute times %5.1f%%  ratio %.2f\n", s, v, a, b, a / b, c, a / c }'
done
