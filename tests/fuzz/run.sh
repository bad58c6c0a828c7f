#!/bin/sh
# make check driver of one libFuzzer target (tests/fuzz/README.md):
#   run.sh tests/fuzz/NAME.fuzz      (the marker automake passes)
# replays every file of tests/fuzz/regressions/NAME/ (inputs that once
# crashed), then fuzzes briefly from tests/fuzz/corpus/NAME/ (FUZZ_RUNS
# executions, default 2000, at most FUZZ_SECONDS, default 10, seconds).
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
ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:allocator_may_return_null=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
LSAN_OPTIONS="suppressions=$srcdir/tests/fuzz/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
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
set -- -runs="${FUZZ_RUNS:-2000}" -max_total_time="${FUZZ_SECONDS:-10}" -timeout=20 -rss_limit_mb=2048 \
    -artifact_prefix="$tmp/" -print_final_stats=1 "$tmp/new" "$srcdir/tests/fuzz/corpus/$name"
echo "+ fuzz_$name $*"
"$prog" "$@" >"$tmp/log" 2>&1
rc=$?
tail -n 25 "$tmp/log"
if [ $rc -ne 0 ]; then
    for f in "$tmp"/crash-* "$tmp"/leak-* "$tmp"/timeout-* "$tmp"/oom-*; do
        [ -f "$f" ] && { echo "input: $(basename "$f") (base64)"; base64 "$f" | head -n 40; }
    done
    echo "FAIL: fuzz_$name found a crash (add the input to tests/fuzz/regressions/$name/ once fixed)" >&2
    exit 1
fi
exit 0
