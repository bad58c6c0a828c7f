#!/bin/sh
# Runs the CPU emulation of kernels/gemv.cu's decode-step products
# (tests/gpu/gemv_emu.cpp) against a double-precision reference. No GPU
# needed; needs g++ (C++20) and python3.
#   tests/gpu/gemv_emu.sh
set -eu
. "$(dirname "$0")/emu_common.sh"
# kernels/cuda_kernels.h, which the emulation includes for the kernels'
# types, needs only these two names from the CUDA runtime
printf 'typedef int cudaError_t;\ntypedef struct CUstream_st *cudaStream_t;\n' >"$dir/cuda_runtime.h"
emu_build gemv -I"$top/kernels" <<'PY'
# the number formats and vector loads of cuda_common.cuh, then gemv.cu's kernels
parts = common_parts(top) + [region(source(top, "kernels/gemv.cu"), "gemv")]
write(out, parts, [])
PY
"$dir/gemv_emu" "$@"
