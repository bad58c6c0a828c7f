#!/bin/sh
# make check driver of one libFuzzer target (tests/fuzz/README.md):
#   run.sh tests/fuzz/NAME.fuzz      (the marker automake passes)
# replays every file of tests/fuzz/regressions/NAME/ (inputs that once
# crashed), then fuzzes briefly from tests/fuzz/corpus/NAME/ (FUZZ_RUNS
# executions, default 2000, at most FUZZ_SECONDS, default 10, seconds;
# through tests/fuzz/lane.sh, so a crash inside libhdf5 is listed and
# fuzzing goes on, and any other crash fails the test).
# New inputs go to a scratch directory, never into the source tree. SKIP (77)
# when the targets were not built (configure found no clang with libFuzzer).
name=$(basename "$1" .fuzz)
srcdir=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${top_builddir:-.}
prog="$builddir/tests/fuzz/bin/fuzz_$name"
if [ ! -x "$prog" ]; then
    echo "SKIP: $prog not built (needs clang with libFuzzer; see tests/fuzz/README.md)"
    exit 77
fi
# Fast (frame-pointer) unwinding of allocation stacks: the slow DWARF
# unwinder cost most of the time per input. The suite-wide setting of make
# check (slow unwinding, for the MPI tests' leak suppressions) is dropped
# here; a target that needs other stacks sets them in its
# __asan_default_options.
inherited=$(printf '%s' "${ASAN_OPTIONS:-}" | tr ':' '\n' | grep -v '^fast_unwind_on_malloc=\|^malloc_context_size=' |
    paste -s -d: -)
ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1${inherited:+:$inherited}"
LSAN_OPTIONS="suppressions=$srcdir/tests/fuzz/lsan.supp:print_suppressions=0"
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# MPI plugins stay mapped so that their frames (and the suppressions) resolve
OMPI_MCA_mca_base_component_disable_dlclose=1
export OMPI_MCA_mca_base_component_disable_dlclose
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cai-fuzz-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
reg="$srcdir/tests/fuzz/regressions/$name"
if [ -d "$reg" ] && [ -n "$(ls "$reg")" ]; then
    echo "+ replaying $(ls "$reg" | wc -l) regression inputs"
    "$prog" -runs=1 "$reg"/* 2>"$tmp/replay.log" || {
        cat "$tmp/replay.log" >&2
        echo "FAIL: a regression input of $name crashes again" >&2
        exit 1
    }
fi
mkdir "$tmp/new"
# tests/fuzz/lane.sh starts the target again after a crash inside libhdf5
# (HDF5's bug) and stops at any other.
# A fixed seed: the same mutations in every run of the suite (a CI run must not
# meet a new input by chance).
set -- -timeout=20 -rss_limit_mb=2048 -seed=1
echo "+ fuzz_$name $* (${FUZZ_RUNS:-2000} executions or ${FUZZ_SECONDS:-10} s)"
sh "$srcdir/tests/fuzz/lane.sh" "$prog" "$srcdir" "$tmp/new" "$srcdir/tests/fuzz/corpus/$name" "$tmp/out" \
    "${FUZZ_RUNS:-2000}" "${FUZZ_SECONDS:-10}" "$@"
rc=$?
last=$(ls -t "$tmp/out"/run-*.log | head -n 1)
tail -n 25 "$last"
cat "$tmp/out/lane.txt"
if [ -s "$tmp/out/triage.txt" ]; then
    echo "crashes (artifact, verdict of tests/fuzz/triage.sh):"
    cat "$tmp/out/triage.txt"
fi
if [ $rc -ne 0 ]; then
    while read -r f verdict _; do
        [ "$verdict" != libhdf5 ] && [ -f "$f" ] && { echo "input: $(basename "$f") (base64)"; base64 "$f" | head -n 40; }
    done <"$tmp/out/triage.txt"
    echo "FAIL: fuzz_$name found a crash (add the input to tests/fuzz/regressions/$name/ once fixed)" >&2
    exit 1
fi
exit 0
