#!/bin/sh
# Checkpoint write/read bandwidth (bench/ckpt_bench) against a raw
# sequential write+fsync / read of the same bytes on the same file system,
# in one invocation; the header records date, machine and load.
#
# Usage: bench/ckpt_bench.sh [RANKS [REPS [DIR]]]   (defaults 2 6 $TMPDIR or /tmp)
# Environment: BUILD (build directory holding bench/ckpt_bench; default: the
# directory this is run from), MPIEXEC (default mpiexec), BENCH_ARGS (extra
# flags, e.g. "--d-model 512 --layers 4" for a quick run),
# CAI_CKPT_MPIIO=two-phase to hand the transfers to MPI-IO's collective
# buffering instead of independent MPI-IO under collective HDF5 calls.
set -e
ranks=${1:-2}
reps=${2:-6}
dir=${3:-${TMPDIR:-/tmp}}
build=${BUILD:-.}
bin=$build/bench/ckpt_bench
[ -x "$bin" ] || { echo "ckpt_bench.sh: $bin not found: run from the build directory or set BUILD (make bench/ckpt_bench)" >&2; exit 2; }
mpiexec=${MPIEXEC:-mpiexec}
work=$(mktemp -d "$dir/ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
fs=$(df -T "$work" | awk 'NR == 2 { print $1 " (" $2 ")" }')
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"\
     "$(getconf _NPROCESSORS_ONLN) cores, $(awk '/MemTotal/ { printf "%.0f GB", $2 / 1048576 }' /proc/meminfo);"\
     "file system $fs; MPI-IO ${CAI_CKPT_MPIIO:-independent}; load average before $(cut -d' ' -f1-3 /proc/loadavg)"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export_mpiio=
[ -n "${CAI_CKPT_MPIIO:-}" ] && export_mpiio="-x CAI_CKPT_MPIIO"
# shellcheck disable=SC2086
$mpiexec -n "$ranks" --oversubscribe $export_mpiio "$bin" --reps "$reps" --dir "$work" $BENCH_ARGS
echo "# load average after $(cut -d' ' -f1-3 /proc/loadavg)"
