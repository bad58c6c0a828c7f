/* The CUDA backend's op table (DESIGN decision 4): same semantics and
 * layouts as the CPU table, see docs/ops.md and docs/cuda.md. */
#include "cai_config.h"
#include "cuda_internal.h"

static const cai_ops cuda_ops = {
    .backend = "cuda",
    .alloc = cai_cuda_alloc,
    .dealloc = cai_cuda_dealloc,
    .alloc_staging = cai_cuda_alloc_staging,
    .dealloc_staging = cai_cuda_dealloc_staging,
    .memcpy = cai_cuda_memcpy,
    .sync = cai_cuda_sync,
    .fill = cai_cuda_fill,
    .copy = cai_cuda_copy,
    .copy_sr = cai_cuda_copy_sr,
    .scale = cai_cuda_scale,
    .axpy = cai_cuda_axpy,
    .add = cai_cuda_add,
    .sum = cai_cuda_sum,
    .sumsq = cai_cuda_sumsq,
    .matmul = cai_cuda_matmul,
    .linear_fwd = cai_cuda_linear_fwd,
    .linear_bwd = cai_cuda_linear_bwd,
    .bias_add = cai_cuda_bias_add,
    .bias_grad = cai_cuda_bias_grad,
    .layernorm_fwd = cai_cuda_layernorm_fwd,
    .layernorm_bwd = cai_cuda_layernorm_bwd,
    .rmsnorm_fwd = cai_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cai_cuda_rmsnorm_bwd,
    .gelu_fwd = cai_cuda_gelu_fwd,
    .gelu_bwd = cai_cuda_gelu_bwd,
    .swiglu_fwd = cai_cuda_swiglu_fwd,
    .swiglu_bwd = cai_cuda_swiglu_bwd,
    .rope_tables = cai_cuda_rope_tables,
    .rope_fwd = cai_cuda_rope_fwd,
    .rope_bwd = cai_cuda_rope_bwd,
    .attention_workspace_bytes = cai_cuda_attention_workspace_bytes,
    .attention_fwd = cai_cuda_attention_fwd,
    .attention_bwd = cai_cuda_attention_bwd,
    .embedding_fwd = cai_cuda_embedding_fwd,
    .embedding_bwd = cai_cuda_embedding_bwd,
    .xent_fwd = cai_cuda_xent_fwd,
    .xent_stats = cai_cuda_xent_stats,
    .xent_bwd = cai_cuda_xent_bwd,
    .adamw = cai_cuda_adamw,
};

const cai_ops *cai_ops_cuda(void) { return &cuda_ops; }
