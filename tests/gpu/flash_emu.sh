#!/bin/sh
# Runs the CPU emulation of kernels/attention_flash.cu (tests/gpu/flash_emu.cpp)
# against a double-precision reference. No GPU needed; needs g++ with C++20.
#   tests/gpu/flash_emu.sh [case-number]
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# the kernels: from the fragment helpers up to the launchers; dynamic shared
# memory becomes the emulated block's buffer
awk '/^\/\* A operand \(16 rows x 16 k\)/{on=1} /launchers \*\/$/{on=0} on' "$top/kernels/attention_flash.cu" |
    sed 's/extern __shared__ __align__(128) unsigned char fl_sm\[\];/unsigned char *fl_sm = g_smem;/' >"$dir/kern.inc"
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/flash_emu" "$top/tests/gpu/flash_emu.cpp"
"$dir/flash_emu" "$@"
