#!/bin/sh
# Runs the CPU emulation of the mixture-of-experts kernels (kernels/moe.cu:
# k_moe_permute, k_moe_combine_fwd, k_moe_combine_bwd; tests/gpu/moe_emu.cpp)
# against host references. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/moe_emu.sh
set -eu
command -v g++ >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || { echo "SKIP: needs g++ and python3"; exit 77; }
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$top" "$dir" <<'PY'
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[1] + "/tests/gpu")
from emu_extract import common_parts, region, source, write
top, out = sys.argv[1], sys.argv[2]
moe = source(top, "kernels/moe.cu")
parts = common_parts(top) + [region(moe, "moe")]
subs = [("__shared__ float sh[32];", "float *sh = g_blk->sh;")]
write(out, parts, subs)
PY
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/moe_emu" "$top/tests/gpu/moe_emu.cpp"
"$dir/moe_emu" "$@"
