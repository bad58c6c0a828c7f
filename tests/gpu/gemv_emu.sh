#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of kernels/gemv.cu's decode-step products
# (tests/gpu/gemv_emu.cpp) against a double-precision reference. No GPU
# needed; needs g++ (C++20) and python3.
#   tests/gpu/gemv_emu.sh
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build gemv <<'PY'
# the number formats and vector loads of cuda_common.cuh, then gemv.cu's kernels
parts = common_parts(top) + [region(source(top, "kernels/gemv.cu"), "gemv")]
write(out, parts, [])
PY
"$dir/gemv_emu" "$@"
