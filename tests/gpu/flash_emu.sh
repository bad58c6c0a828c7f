#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of kernels/attention_flash.cu (tests/gpu/flash_emu.cpp)
# against a double-precision reference. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/flash_emu.sh [case-number]
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build flash <<'PY'
# the fragment helpers of mma.cuh, then the kernels up to the launchers;
# dynamic shared memory becomes the emulated block's buffer
parts = [region(source(top, "kernels/mma.cuh"), "mma"), region(source(top, "kernels/attention_flash.cu"), "flash")]
subs = [("extern __shared__ __align__(128) unsigned char fl_sm[];", "unsigned char *fl_sm = g_smem;")]
write(out, parts, subs)
PY
"$dir/flash_emu" "$@"
