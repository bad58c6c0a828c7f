#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of kernels/paged.cu's attention kernels
# (tests/gpu/paged_emu.cpp) against a double-precision reference. No GPU
# needed; needs g++ (C++20) and python3.
#   tests/gpu/paged_emu.sh [case-number]
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build paged <<'PY'
# the number formats and vector loads of cuda_common.cuh, the fragment
# helpers of mma.cuh, then paged.cu's attention kernels; the tensor-core
# kernel's dynamic shared memory becomes the emulated block's buffer
parts = common_parts(top) + [region(source(top, "kernels/mma.cuh"), "mma"),
                             region(source(top, "kernels/paged.cu"), "paged")]
subs = [("extern __shared__ __align__(16) unsigned char pgt_sm[];", "unsigned char *pgt_sm = g_smem;")]
write(out, parts, subs)
PY
"$dir/paged_emu" "$@"
