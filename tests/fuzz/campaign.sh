#!/bin/sh
# The long run recorded in tests/fuzz/README.md: every target at once, one
# core each, RUNS executions (or SECONDS, whichever comes first), except
# ckpt_h5 (HDF5 + MPI-IO per input, ~100x slower) which is spread over
# H5_JOBS libFuzzer jobs of RUNS/H5_JOBS executions each.
#   tests/fuzz/campaign.sh BINDIR OUTDIR [RUNS] [SECONDS] [H5_JOBS]
# OUTDIR receives NAME.log (ckpt_h5/fuzz-N.log), crash artifacts and
# summary.txt (executions per target, crashes).
set -u
bin=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
runs=${3:-1000000}
secs=${4:-540}
h5jobs=${5:-7}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cai-fuzz-campaign.XXXXXX")
export ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$src/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_MCA_mca_base_component_disable_dlclose=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
common="-timeout=30 -rss_limit_mb=4096 -print_final_stats=1"
for p in "$bin"/fuzz_*; do
    name=$(basename "$p" | sed 's/^fuzz_//')
    mkdir -p "$work/$name"
    if [ "$name" = ckpt_h5 ]; then
        mkdir -p "$out/ckpt_h5"
        (cd "$out/ckpt_h5" && "$p" $common -jobs="$h5jobs" -workers="$h5jobs" -runs=$(((runs + h5jobs - 1) / h5jobs)) \
            -max_total_time="$secs" -artifact_prefix="$out/ckpt_h5-" "$work/$name" "$src/corpus/$name" \
            >"$out/ckpt_h5.log" 2>&1) &
    else
        "$p" $common -runs="$runs" -max_total_time="$secs" -artifact_prefix="$out/$name-" "$work/$name" \
            "$src/corpus/$name" >"$out/$name.log" 2>&1 &
    fi
done
wait
{
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  host: $(nproc) cores, $(uname -m)"
    for p in "$bin"/fuzz_*; do
        name=$(basename "$p" | sed 's/^fuzz_//')
        logs="$out/$name.log"
        [ "$name" = ckpt_h5 ] && logs="$out/ckpt_h5/fuzz-*.log"
        # shellcheck disable=SC2086
        n=$(cat $logs | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s += $1} END {print s + 0}')
        t=$(cat $logs | sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' | sort -n | tail -n 1)
        c=$(ls "$out" | grep -c "^$name-\(crash\|leak\|timeout\|oom\)-" || true)
        echo "$name executions=$n seconds=${t:-?} artifacts=$c"
    done
} | tee "$out/summary.txt"
rm -rf "$work"
