#!/bin/sh
# Runs the CPU emulation of kernels/decode_stack.cu (tests/gpu/decode_stack_emu.cpp):
# a decode token through a stack of Llama layers as the separate kernels and
# as the one-launch kernel, bit for bit, and against a double-precision
# reference. No GPU needed; needs g++ (C++20) and python3.
#   tests/gpu/decode_stack_emu.sh [case-number]
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
g++ -std=c++20 -O1 -pthread -I"$dir" -I"$top/kernels" -o "$dir/decode_stack_emu" "$top/tests/gpu/decode_stack_emu.cpp"
"$dir/decode_stack_emu" "$@"
