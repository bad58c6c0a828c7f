#!/bin/sh
# Runs the CPU emulation of the LayerNorm/RMSNorm, cross-entropy and RoPE
# fast-path kernels (kernels/norm.cu, embed.cu, elementwise.cu; tests/gpu/normxent_emu.cpp)
# against double-precision references. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/normxent_emu.sh
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
norm = source(top, "kernels/norm.cu")
embed = source(top, "kernels/embed.cu")
elementwise = source(top, "kernels/elementwise.cu")
parts = common_parts(top) + [
    region(norm, "norm_fwd"),
    region(norm, "norm_bwd"),
    region(embed, "xent_fast"),
    region(elementwise, "rope_fast"),
    region(elementwise, "adamw"),
]
subs = [
    ("extern __shared__ float4 sprm[];", "float4 *sprm = (float4 *)g_smem;"),
    ("extern __shared__ float4 sbw[];", "float4 *sbw = (float4 *)g_smem;"),
    ("__shared__ float shm[32], shs[32], shx;", "float *shm = g_blk->shm, *shs = g_blk->shs; float &shx = g_blk->shx;"),
    ("__shared__ float shl;", "float &shl = g_blk->shl;"),
    ('asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));', "r = exp2f(t);"),
]
write(out, parts, subs)
PY
g++ -std=c++20 -O1 -pthread -I"$dir" -o "$dir/normxent_emu" "$top/tests/gpu/normxent_emu.cpp"
"$dir/normxent_emu" "$@"
