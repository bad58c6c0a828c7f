#!/bin/sh
# colossal-check command line: --help lists the keys once and exits 0; an
# unknown flag or a bad value fails with a message naming it.
. "$top_srcdir/tests/apps/check_lib.sh"

run_np 2 --help
expect_ok
for key in info layout bench mesh.tp mesh.pp mesh.dp mesh.ep mesh.sp mesh.order np model.n_heads \
    model.n_kv_heads model.n_layers model.n_experts sweep.min_bytes sweep.max_bytes sweep.iters sweep.warmup \
    sweep.axes sweep.ops sweep.device watchdog.timeout log.level; do
    expect_grep out "$key" "--help does not list $key"
done
[ "$(count_grep out 'sweep\.max_bytes')" -eq 1 ] || fail "--help printed more than once (only rank 0 should)"

run_np 2 --no-such-flag
expect_fail
expect_grep err "no-such-flag" "the error does not name the unknown flag"
[ ! -s "$TMP/out" ] || fail "an unknown flag still produced a report"

# A close miss: the message names the flag as given.
run_np 1 --layout --np 8 --tpp 2
expect_fail
expect_grep err "tpp" "the error does not name --tpp"

# Values are checked: ranges by the config table, sizes by colossal-check.
run_np 1 --layout --np 8 --tp 0
expect_fail
expect_grep err "mesh.tp" "an out-of-range tp is not reported by key"

run_np 1 --bench --sweep.min_bytes 1X
expect_fail
expect_grep err "sweep.min_bytes" "a bad size is not reported by key"
expect_grep err "1X"

run_np 1 --bench --ops allreduce,broadcastx
expect_fail
expect_grep err "broadcastx" "an unknown collective is not named"
# GPU buffers on a machine without a usable GPU: refused up front, saying why.
run_np 1
if grep -Eq 'no GPU visible|CUDA +not built' "$TMP/out"; then
    run_np 2 --bench --device cuda --max_bytes 4K
    expect_fail
    expect_grep err 'no GPU is visible|has no CUDA' "sweep.device=cuda without a GPU is not explained"
    expect_no_grep out '^# axis' "the bench ran without a GPU"
fi
# Forcing CUDA-aware MPI on an MPI that is not: refused before the mesh exists.
if grep -Eq '^  CUDA-aware MPI +no' "$TMP/out"; then
    run_np 2 --bench --device cuda --sweep.transport mpi --max_bytes 4K
    expect_fail
    expect_grep err 'not CUDA-aware' "sweep.transport=mpi on a non-CUDA-aware MPI is not explained"
    expect_no_grep out '^# axis'
fi
echo "ok"
