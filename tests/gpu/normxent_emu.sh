#!/bin/sh
# suite-lock: shared
# Runs the CPU emulation of the LayerNorm/RMSNorm, cross-entropy and RoPE
# fast-path kernels (kernels/norm.cu, embed.cu, elementwise.cu; tests/gpu/normxent_emu.cpp)
# against double-precision references. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/normxent_emu.sh
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build normxent <<'PY'
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
"$dir/normxent_emu" "$@"
