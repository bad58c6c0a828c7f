#!/bin/sh
# CPU training throughput: colossal (bench/cpu_train) against PyTorch CPU
# (bench/torch_cpu_train.py) on the same GPT-2, batch and thread count, in one
# invocation; prints both tokens/s, peak RSS and the ratio colossal/torch.
#
# Usage: bench/cpu_train.sh [THREADS [STEPS [WARMUP]]]   (defaults 2 5 1)
# Environment: BUILD (build directory holding bench/cpu_train; default: the
# directory this is run from), PYTHON_TORCH (python3 with torch; default
# /usr/bin/python3), BENCH_ARGS (extra model/batch flags for both sides,
# e.g. "--layers 2 --seq 64").
set -e
threads=${1:-2}
steps=${2:-5}
warmup=${3:-1}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-.}
py=${PYTHON_TORCH:-/usr/bin/python3}
bin=$build/bench/cpu_train
[ -x "$bin" ] || { echo "cpu_train.sh: $bin not found: run from the build directory or set BUILD" >&2; exit 2; }
# Both sides get exactly `threads` threads: OpenMP and OpenBLAS for colossal,
# torch.set_num_threads (intra-op) for PyTorch; inter-op threads stay idle.
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
common="--steps $steps --warmup $warmup $BENCH_ARGS"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "$(getconf _NPROCESSORS_ONLN) cores online, threads=$threads, steps=$steps (after $warmup warm-up), load average $(cut -d' ' -f1-3 /proc/loadavg)"
out_c=$("$bin" --threads "$threads" $common)
echo "$out_c"
out_t=$("$py" "$here/torch_cpu_train.py" --threads "$threads" $common)
echo "$out_t"
field() { echo "$1" | sed -n "s|.*$2=\([0-9.]*\).*|\1|p" | tail -n 1; }
tc=$(field "$out_c" tokens/s); tt=$(field "$out_t" tokens/s)
cc=$(field "$out_c" cpu_ms_per_step); ct=$(field "$out_t" cpu_ms_per_step)
mc=$(field "$out_c" peak_rss_mb); mt=$(field "$out_t" peak_rss_mb)
# The CPU-time ratio (torch CPU seconds per step / colossal's) is printed
# too: on a shared machine it moves less with other load than wall time.
awk -v tc="$tc" -v tt="$tt" -v cc="$cc" -v ct="$ct" -v mc="$mc" -v mt="$mt" 'BEGIN {
    printf "ratio tokens/s colossal/torch = %.2fx (goal >= 1.5x); CPU time per step torch/colossal = %.2fx;", tc / tt, ct / cc
    printf " peak RSS colossal %.0f MB, torch %.0f MB (%.2fx)\n", mc, mt, mc / mt }'
