#!/bin/sh
# One lane of fuzzing (tests/fuzz/README.md): PROG runs from CORPUS (where
# new units go) and SEEDS until RUNS executions in all or until SECONDS have
# passed. A crash that tests/fuzz/triage.sh places inside libhdf5 (HDF5's
# bug, not colossal's) is kept and the target starts again; any other
# crash ends the lane, unless LANE_KEEP_GOING=1 (a long campaign, where
# every crash is listed for review at the end).
#   lane.sh PROG SRCDIR CORPUS SEEDS OUTDIR RUNS SECONDS [LIBFUZZER FLAGS...]
# OUTDIR receives run-N.log per start, the crash artifacts, triage.txt (one
# line per crash: artifact, verdict) and lane.txt:
#   executions=N seconds=S starts=K libhdf5=H colossal=C
# Exit status 1 when a crash outside libhdf5 was found, else 0.
set -u
prog=$1
srcdir=$2
corpus=$3
seeds=$4
out=$5
runs=$6
secs=$7
shift 7
mkdir -p "$out"
: >"$out/triage.txt"
# The targets' scratch directories (tests/fuzz/fuzz_util.h) live in one of
# the lane's own, removed at its end: a crashed target cannot remove its own.
base=${TMPDIR:-/dev/shm}
[ -w "$base" ] || base=/tmp
scratch=$(mktemp -d "$base/cai-fuzz-lane.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"
t0=$(date +%s)
done_runs=0
starts=0
hdf5=0
ours=0
stuck=0
while :; do
    left=$((runs - done_runs))
    tleft=$((t0 + secs - $(date +%s)))
    [ "$left" -gt 0 ] && [ "$tleft" -gt 0 ] || break
    starts=$((starts + 1))
    log="$out/run-$starts.log"
    "$prog" "$@" -runs="$left" -max_total_time="$tleft" -print_final_stats=1 -artifact_prefix="$out/" \
        "$corpus" "$seeds" >"$log" 2>&1
    rc=$?
    n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    done_runs=$((done_runs + ${n:-0}))
    [ "$rc" -eq 0 ] && break
    art=$(sed -n "s|.*Test unit written to \(.*\)$|\1|p" "$log" | tail -n 1)
    verdict=$(sh "$srcdir/tests/fuzz/triage.sh" "$srcdir" "$log")
    echo "${art:-(no artifact; $log)} $verdict" >>"$out/triage.txt"
    case $verdict in
    libhdf5*) hdf5=$((hdf5 + 1)) ;;
    *)
        ours=$((ours + 1))
        [ "${LANE_KEEP_GOING:-0}" = 1 ] || break
        ;;
    esac
    # A crash before the first mutation is an input of the corpus that
    # crashes when replayed (libhdf5's use-after-free of its metadata cache
    # depends on the inputs before it, so a unit that passed when it was
    # added may not on a later start): it leaves the corpus for
    # OUTDIR/quarantine (libFuzzer names both the unit and the artifact by
    # the input's SHA-1), or the same crash would repeat on every start.
    if grep -q '^#[0-9]*[[:space:]]*INITED' "$log"; then
        stuck=0
    else
        sha=${art##*-}
        if [ -n "$art" ] && [ -f "$corpus/$sha" ]; then
            mkdir -p "$out/quarantine"
            mv "$corpus/$sha" "$out/quarantine/" 2>/dev/null || :
            stuck=0
        else
            stuck=$((stuck + 1))
        fi
    fi
    [ "$stuck" -lt 3 ] || break
done
echo "executions=$done_runs seconds=$(($(date +%s) - t0)) starts=$starts libhdf5=$hdf5 colossal=$ours" >"$out/lane.txt"
[ "$ours" -eq 0 ]
