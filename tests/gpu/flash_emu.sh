#!/bin/sh
# Runs the CPU emulation of kernels/attention_flash.cu (tests/gpu/flash_emu.cpp)
# against a double-precision reference. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/flash_emu.sh [case-number]
set -eu
command -v g++ >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs g++ and python3"; exit 77; }
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$top" "$dir" <<'PY'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1] + "/tests/gpu")
from emu_extract import region, source, write
top, out = sys.argv[1], sys.argv[2]
# the kernels, from the fragment helpers up to the launchers; dynamic shared
# memory becomes the emulated block's buffer
parts = [region(source(top, "kernels/attention_flash.cu"), "flash")]
subs = [("extern __shared__ __align__(128) unsigned char fl_sm[];", "unsigned char *fl_sm = g_smem;")]
write(out, parts, subs)
PY
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/flash_emu" "$top/tests/gpu/flash_emu.cpp"
"$dir/flash_emu" "$@"
