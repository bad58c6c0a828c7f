#!/bin/sh
# colossal-check --info on 2 ranks: one report (rank 0 only) naming the MPI
# library the launcher belongs to, the standard version, the world size and
# this host with both ranks; a machine without a GPU is reported, not fatal.
. "$top_srcdir/tests/apps/check_lib.sh"

run_np 2
expect_ok
[ "$(count_grep out '^  MPI library')" -eq 1 ] || fail "expected exactly one MPI library line (rank 0 only)"

# Independent reference: the launcher states its own version.
ver=$($MPIEXEC --version 2>&1 | grep -Eo '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n 1)
[ -n "$ver" ] || fail "could not read a version from '$MPIEXEC --version'"
grep -E '^  MPI library' "$TMP/out" | grep -Fq "$ver" || fail "MPI library line does not name version $ver"
expect_grep out '^  MPI standard +[0-9]+\.[0-9]+$'
expect_grep out '^  world +2 ranks on 1 node, 2 ranks per node$'
host=$(hostname)
expect_grep out "^    $host +2 ranks \\(0-1\\)" "host line for $host with ranks 0-1 missing"
expect_grep out '^  colossal +[0-9]+\.[0-9]+'
expect_grep out '^  CUDA-aware MPI +(yes|no)'
expect_grep out '^  PMIx '
expect_grep out '^  (HDF5|NCCL|OpenMP|OpenBLAS|BLAS) '
# GPU: either each device is listed or the absence is stated.
if ! grep -Eq '^    \[0\] ' "$TMP/out"; then
    expect_grep out 'no GPU visible|CUDA +not built' "neither a GPU list nor 'no GPU visible'"
fi

# The knob table: every knob with its value, where it came from and its
# default; a value from the environment is marked, a bad one reported.
expect_grep out '^  knobs '
expect_grep out '^    CAI_CUDA_SCRATCH_MB +64 \(default\)$'
expect_grep out '^      default 64, integer in \[1, [0-9]+\]: MiB of device scratch'
expect_grep out '^    CAI_CKPT_MPIIO +independent \(default\)$'
expect_grep out '^      default independent, one of independent\|two-phase: '
expect_grep out '^    CAI_NCCL_TRACE '
expect_grep out '^  test hooks +(compiled in|not compiled in)'
expect_no_grep out 'CAI_CUDA_BGRAD|CAI_CUDA_XENT_FUSED|CAI_CUDA_FLASH_|CAI_NCCL_STREAM_PRIORITY'
export CAI_CUDA_SCRATCH_MB=128 CAI_CUDA_TF32=yes
run_np 1 --info
unset CAI_CUDA_SCRATCH_MB CAI_CUDA_TF32
expect_ok
expect_grep out '^    CAI_CUDA_SCRATCH_MB +128 \(environment\)$'
expect_grep out "^    CAI_CUDA_TF32 +INVALID: .*CAI_CUDA_TF32='yes': expected an integer in \[0, 1\]"

# --info runs alongside another mode when asked for explicitly.
run_np 1 --info --layout --np 2
expect_ok
expect_grep out '^  MPI library'
expect_grep out '^dp groups: \[0 1\]'
echo "ok"
