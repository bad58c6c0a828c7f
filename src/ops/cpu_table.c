/* The CPU backend's op table. */
#include "cai_config.h"
#include "cpu_internal.h"

/* The fused linear + GELU and linear + residual compositions
 * (cpu_matmul.c). Declared here, not in cpu_internal.h, to keep that change
 * out of the shared header; they belong with the matmul family there. */
CPU_OP(linear_gelu_fwd)(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp,
                        const cai_tensor *weight, const cai_tensor *bias);
CPU_OP(linear_bwd_dgelu)(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias,
                         const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                         const cai_tensor *pre);
CPU_OP(linear_residual_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                            const cai_tensor *bias, const cai_tensor *residual);

static const cai_ops cpu_ops = {
    .backend = "cpu",
    .alloc = cai_cpu_alloc,
    .dealloc = cai_cpu_dealloc,
    .alloc_staging = cai_cpu_alloc,
    .dealloc_staging = cai_cpu_dealloc,
    .memcpy = cai_cpu_memcpy,
    .sync = cai_cpu_sync,
    .fill = cai_cpu_fill,
    .copy = cai_cpu_copy,
    .copy_sr = cai_cpu_copy_sr,
    .scale = cai_cpu_scale,
    .axpy = cai_cpu_axpy,
    .add = cai_cpu_add,
    .sum = cai_cpu_sum,
    .sumsq = cai_cpu_sumsq,
    .matmul = cai_cpu_matmul,
    .linear_fwd = cai_cpu_linear_fwd,
    .linear_bwd = cai_cpu_linear_bwd,
    .linear_gelu_fwd = cai_cpu_linear_gelu_fwd,
    .linear_bwd_dgelu = cai_cpu_linear_bwd_dgelu,
    .linear_residual_fwd = cai_cpu_linear_residual_fwd,
    .bias_add = cai_cpu_bias_add,
    .bias_grad = cai_cpu_bias_grad,
    .layernorm_fwd = cai_cpu_layernorm_fwd,
    .layernorm_bwd = cai_cpu_layernorm_bwd,
    .rmsnorm_fwd = cai_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cai_cpu_rmsnorm_bwd,
    .gelu_fwd = cai_cpu_gelu_fwd,
    .gelu_bwd = cai_cpu_gelu_bwd,
    .swiglu_fwd = cai_cpu_swiglu_fwd,
    .swiglu_bwd = cai_cpu_swiglu_bwd,
    .rope_tables = cai_cpu_rope_tables,
    .rope_fwd = cai_cpu_rope_fwd,
    .rope_bwd = cai_cpu_rope_bwd,
    .attention_workspace_bytes = cai_cpu_attention_workspace_bytes,
    .attention_fwd = cai_cpu_attention_fwd,
    .attention_bwd = cai_cpu_attention_bwd,
    .embedding_fwd = cai_cpu_embedding_fwd,
    .embedding_bwd = cai_cpu_embedding_bwd,
    .xent_fwd = cai_cpu_xent_fwd,
    .xent_stats = cai_cpu_xent_stats,
    .xent_bwd = cai_cpu_xent_bwd,
    .adamw = cai_cpu_adamw,
};

const cai_ops *cai_ops_cpu(void) { return &cpu_ops; }
