#!/bin/sh
# The long run recorded in tests/fuzz/README.md: every target at once, each
# in one or more lanes (tests/fuzz/lane.sh: a libFuzzer process, started
# again after a crash inside libhdf5), one core per lane. A target's lanes
# share its corpus and split RUNS executions evenly; every lane stops at its
# share or after SECONDS.
#   tests/fuzz/campaign.sh BINDIR OUTDIR [RUNS] [SECONDS] [H5_JOBS] [LANES]
# H5_JOBS: lanes of ckpt_h5 (default 7). LANES: lanes of the other targets,
# "NAME=N,NAME=N" (default 1 each). OUTDIR/NAME/laneK/ receives each lane's
# logs, crash artifacts and triage.txt; summary.txt the executions per
# target (summed over its lanes) and its crashes, those inside libhdf5
# apart (HDF5's bugs) from all others (colossal's, to look at).
set -u
bin=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
runs=${3:-1000000}
secs=${4:-540}
h5jobs=${5:-7}
lanes=${6:-}
src=$(cd "$(dirname "$0")" && pwd)
srcdir=$(cd "$src/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/cai-fuzz-campaign.XXXXXX")
# A smaller quarantine than ASan's 256 MiB: libhdf5's suppressed leaks
# already grow a long-lived lane towards the RSS limit. hwloc (under MPI_Init)
# need not load GPU and OpenCL plugins that allocate hundreds of MiB.
# intercept_tls_get_addr=0: as make check (Makefile.am says why).
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:quarantine_size_mb=64:intercept_tls_get_addr=0"
export HWLOC_COMPONENTS="-opencl,-cuda,-nvml,-rsmi,-levelzero,-gl"
export LSAN_OPTIONS="suppressions=$src/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export OMPI_MCA_mca_base_component_disable_dlclose=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export LANE_KEEP_GOING=1

lanes_of() {
    if [ "$1" = ckpt_h5 ]; then
        echo "$h5jobs"
        return
    fi
    n=$(echo ",$lanes," | sed -n "s/.*,$1=\([0-9][0-9]*\),.*/\1/p")
    echo "${n:-1}"
}

start=$(date -u +%Y-%m-%dT%H:%MZ)
for p in "$bin"/fuzz_*; do
    name=$(basename "$p" | sed 's/^fuzz_//')
    n=$(lanes_of "$name")
    share=$(((runs + n - 1) / n))
    mkdir -p "$work/$name"
    k=1
    while [ "$k" -le "$n" ]; do
        sh "$src/lane.sh" "$p" "$srcdir" "$work/$name" "$src/corpus/$name" "$out/$name/lane$k" "$share" "$secs" \
            -timeout=30 -rss_limit_mb=6144 >/dev/null 2>&1 &
        k=$((k + 1))
    done
done
wait
{
    echo "start: $start  end: $(date -u +%Y-%m-%dT%H:%MZ)  host: $(getconf _NPROCESSORS_ONLN) cores, $(uname -m)"
    echo "goal: $runs executions per target within $secs s"
    total_lanes=0
    for p in "$bin"/fuzz_*; do
        name=$(basename "$p" | sed 's/^fuzz_//')
        # shellcheck disable=SC2046
        set -- $(cat "$out/$name"/lane*/lane.txt | tr ' =' '\n\n' | awk '
            NR % 2 == 1 { k = $0; next }
            k == "executions" { e += $0 } k == "seconds" && $0 > s { s = $0 }
            k == "starts" { st += $0 } k == "libhdf5" { h += $0 } k == "colossal" { c += $0 }
            END { print e + 0, s + 0, st + 0, h + 0, c + 0 }')
        n=$(lanes_of "$name")
        total_lanes=$((total_lanes + n))
        verdict=$([ "$1" -ge "$runs" ] && echo reached || echo SHORT)
        echo "$name executions=$1 ($verdict) seconds=$2 lanes=$n starts=$3 crashes: libhdf5=$4 colossal=$5"
    done
    echo "lanes: $total_lanes"
    echo "crashes (artifact, verdict of tests/fuzz/triage.sh):"
    cat "$out"/*/lane*/triage.txt
} | tee "$out/summary.txt"
rm -rf "$work"
