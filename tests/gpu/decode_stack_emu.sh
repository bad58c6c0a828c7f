#!/bin/sh
# Runs the CPU emulation of kernels/decode_stack.cu (tests/gpu/decode_stack_emu.cpp):
# a decode token through a stack of Llama layers as the separate kernels and
# as the one-launch kernel, bit for bit, and against a double-precision
# reference. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/decode_stack_emu.sh [case-number]
set -eu
. "$(dirname "$0")/emu_common.sh"
emu_build decode_stack -I"$top/kernels" <<'PY'
parts = common_parts(top) + [
    region(source(top, "kernels/norm.cu"), "norm_fwd_rows"),
    region(source(top, "kernels/norm.cu"), "norm_fwd"),
    region(source(top, "kernels/gemv.cu"), "gemv"),
    region(source(top, "kernels/elementwise.cu"), "rope_fast"),
    region(source(top, "kernels/elementwise.cu"), "rope_kv"),
    region(source(top, "kernels/paged.cuh"), "paged"),
    region(source(top, "kernels/paged.cu"), "paged_pipe"),
    region(source(top, "kernels/decode_stack.cu"), "dstack"),
]
# shared memory becomes the emulated block's, inline PTX host code
subs = [
    ("extern __shared__ float4 sprm[];", "float4 *sprm = (float4 *)g_smem;"),
    ("__shared__ float sm[KS > 1 ? GV_WARPS * NB : 1];", "float *sm = g_blk->gv_sm;"),
    ("__shared__ float sm[KS > 1 ? 2 * GV_WARPS * NB : 1];", "float *sm = g_blk->gv_sm;"),
    ('asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),\n'
     '                 "l"(src));', "memcpy(dst, src, 16);"),
    ('asm volatile("cp.async.commit_group;\\n" ::);', ""),
    ('asm volatile("cp.async.wait_group %0;\\n" ::"n"(N));', ""),
    ("__shared__ int last;", "int &last = g_blk->last;"),
    ("__shared__ pg_pipe_smem<DT, DMAX, GH> sm;",
     "pg_pipe_smem<DT, DMAX, GH> &sm = *(pg_pipe_smem<DT, DMAX, GH> *)g_blk->big;"),
    ('asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar + 1) : "memory");',
     "v = *(volatile unsigned *)(bar + 1);\n                if (v == g) emu::yield();"),
    ('asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));', "(void)(row + b);"),
    ("__shared__ __align__(16) ds_smem<DT, DMAX, GH> sm;",
     "ds_smem<DT, DMAX, GH> &sm = *(ds_smem<DT, DMAX, GH> *)g_blk->big;"),
]
write(out, parts, subs)
# the kernels' C interface, whose only CUDA types are names
with open(out + "/cuda_runtime.h", "w") as f:
    f.write("typedef int cudaError_t;\ntypedef struct CUstream_st *cudaStream_t;\n")
PY
"$dir/decode_stack_emu" "$@"
