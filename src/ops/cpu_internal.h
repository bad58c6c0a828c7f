/* CPU backend internals: the op implementations the table in cpu_table.c
 * points to, and small helpers for the OpenMP loops. */
#ifndef CAI_OPS_CPU_INTERNAL_H
#define CAI_OPS_CPU_INTERNAL_H

#include "ops_internal.h"

#ifdef _OPENMP
#include <omp.h>
#define CAI_THREAD_ID() omp_get_thread_num()
#else
#define CAI_THREAD_ID() 0
#endif

#define CAI_HOST CAI_DEVICE_HOST
#define CAI_F32 ((int)CAI_DTYPE_F32)
#define CAI_I32 ((int)CAI_DTYPE_I32)
#define CAI_ANYF (-1)

/* Threads for a loop of `work` items: all the device's, or one for a
 * single item. libgomp parks and relaunches its pool threads whenever a
 * parallel region asks for another team size, which costs far more than
 * the idle threads of a loop shorter than the team: with teams sized by
 * work, a CPU decode step of two sequences (teams of two between the
 * products' full teams) took 9x one of a single sequence at 4 threads on 2
 * cores, and 2x with this rule (bench/RESULTS.md). */
static inline int cai_cpu_threads(const cai_device_t *dev, int64_t work) {
    const int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    return work > 1 ? nt : 1;
}

static inline float *cai_row_f32(const cai_rows *r, int64_t i) { return (float *)r->data + i * r->ld; }

#define CPU_OP(name) cai_status cai_cpu_##name

/* memory, elementwise (cpu_basic.c) */
CPU_OP(alloc)(cai_device_t *dev, size_t bytes, const char *what, void **out);
void cai_cpu_dealloc(cai_device_t *dev, void *ptr);
CPU_OP(memcpy)(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind);
CPU_OP(sync)(cai_device_t *dev);
CPU_OP(fill)(cai_device_t *dev, cai_tensor *x, float value);
CPU_OP(copy)(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src);
CPU_OP(copy_sr)(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src, uint64_t seed, uint64_t stream,
                uint64_t index_offset);
CPU_OP(scale)(cai_device_t *dev, cai_tensor *x, float alpha);
CPU_OP(axpy)(cai_device_t *dev, cai_tensor *y, float alpha, const cai_tensor *x);
CPU_OP(add)(cai_device_t *dev, cai_tensor *out, const cai_tensor *a, const cai_tensor *b);
CPU_OP(sum)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);
CPU_OP(sumsq)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);

/* matmul family (cpu_matmul.c) */
CPU_OP(matmul)(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, int trans_a, const cai_tensor *b, int trans_b,
               float alpha, float beta);
CPU_OP(linear_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                   const cai_tensor *bias);
CPU_OP(linear_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias, const cai_tensor *dout,
                   const cai_tensor *inp, const cai_tensor *weight, int accum_dinp);
/* the fused compositions of linear with GELU and with the residual add (cpu_matmul.c) */
CPU_OP(linear_gelu_fwd)(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp,
                        const cai_tensor *weight, const cai_tensor *bias);
CPU_OP(linear_swiglu_fwd)(cai_device_t *dev, cai_tensor *act, cai_tensor *gate, cai_tensor *up, const cai_tensor *inp,
                          const cai_tensor *w_gate, const cai_tensor *w_up);
CPU_OP(linear_bwd_dgelu)(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias,
                         const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                         const cai_tensor *pre);
CPU_OP(linear_residual_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                            const cai_tensor *bias, const cai_tensor *residual);
CPU_OP(bias_add)(cai_device_t *dev, cai_tensor *x, const cai_tensor *bias);
CPU_OP(bias_grad)(cai_device_t *dev, cai_tensor *dbias, const cai_tensor *dout);

/* FP8 casts and emulated products (cpu_fp8.c) */
CPU_OP(fp8_cast)(cai_device_t *dev, cai_tensor *q, cai_tensor *qt, const cai_tensor *x, cai_tensor *meta,
                 cai_fp8_format fmt, int current, int margin);
size_t cai_cpu_fp8_gemm_workspace_bytes(const cai_device_t *dev, int64_t M, int64_t N, int64_t K);
CPU_OP(fp8_dequant_sum)(cai_device_t *dev, cai_tensor *y, const cai_tensor *q, const cai_tensor *metas, int64_t stride,
                        cai_fp8_format fmt, float beta);
CPU_OP(fp8_gemm)(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt, const cai_tensor *a_meta,
                 const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta, float beta,
                 const cai_fp8_epilogue *ep, void *workspace, size_t workspace_bytes);

/* norms (cpu_norm.c) */
CPU_OP(layernorm_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd, const cai_tensor *inp,
                      const cai_tensor *weight, const cai_tensor *bias, float eps);
CPU_OP(layernorm_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                      const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *mean,
                      const cai_tensor *rstd, int accum_dinp);
CPU_OP(rmsnorm_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *rstd, const cai_tensor *inp,
                    const cai_tensor *weight, float eps);
CPU_OP(rmsnorm_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                    const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *rstd, int accum_dinp);

/* activations and RoPE (cpu_pointwise.c) */
CPU_OP(gelu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp);
CPU_OP(gelu_bwd)(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *inp, const cai_tensor *dout);
CPU_OP(swiglu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *gate, const cai_tensor *up);
CPU_OP(swiglu_bwd)(cai_device_t *dev, cai_tensor *dgate, cai_tensor *dup, const cai_tensor *dout,
                   const cai_tensor *gate, const cai_tensor *up);
CPU_OP(rope_tables)(cai_device_t *dev, cai_tensor *cos, cai_tensor *sin, double theta);
CPU_OP(rope_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *cos,
                 const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset);
CPU_OP(rope_bwd)(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *dout, const cai_tensor *cos,
                 const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset);

/* mixture of experts: token rows <-> expert-grouped rows (cpu_moe.c) */
CPU_OP(moe_permute)(cai_device_t *dev, cai_tensor *xe, const cai_tensor *x, const cai_tensor *pos);
CPU_OP(grouped_linear_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                           const int64_t *rows, int n);
CPU_OP(grouped_linear_bwd)(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                           const cai_tensor *inp, const cai_tensor *weight, const int64_t *rows, int n, int accum);
CPU_OP(moe_combine_fwd)(cai_device_t *dev, cai_tensor *y, const cai_tensor *ye, const cai_tensor *pos,
                        const cai_tensor *w, int accum);
CPU_OP(moe_route)(cai_device_t *dev, cai_tensor *sel, cai_tensor *wts, cai_tensor *probs, cai_tensor *lse,
                  const cai_tensor *logits, cai_route_fn fn, int norm_topk);
CPU_OP(moe_assign)(cai_device_t *dev, cai_tensor *pos, cai_tensor *load, cai_tensor *kept, const cai_tensor *sel,
                   int64_t capacity);
CPU_OP(moe_router_sums)(cai_device_t *dev, cai_tensor *sums, const cai_tensor *probs, const cai_tensor *lse,
                        cai_route_fn fn);
CPU_OP(moe_router_bwd)(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *probs,
                       const cai_tensor *lse, const cai_tensor *sel, const cai_tensor *wts, const cai_tensor *dw,
                       const cai_tensor *load, cai_route_fn fn, int norm_topk, double aux_scale, double z_scale);
CPU_OP(moe_combine_bwd)(cai_device_t *dev, cai_tensor *dye, cai_tensor *dw, const cai_tensor *dy, const cai_tensor *ye,
                        const cai_tensor *pos, const cai_tensor *w);

/* paged KV cache (cpu_paged.c) */
CPU_OP(rope_kv_cache_write)(cai_device_t *dev, cai_tensor *qk, cai_tensor *k_cache, cai_tensor *v_cache,
                            const cai_tensor *v, const cai_tensor *slots, const cai_tensor *cos, const cai_tensor *sin,
                            const cai_tensor *positions);
CPU_OP(kv_cache_write)(cai_device_t *dev, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *k,
                       const cai_tensor *v, const cai_tensor *slots);
size_t cai_cpu_paged_attention_workspace_bytes(const cai_device_t *dev, int64_t n_tokens, int64_t n_seqs, int64_t Hq,
                                               int64_t D, int64_t max_ctx);
CPU_OP(paged_attention)(cai_device_t *dev, cai_tensor *out, const cai_tensor *q, const cai_tensor *k_cache,
                        const cai_tensor *v_cache, const cai_tensor *block_tables, const cai_tensor *q_start,
                        const cai_tensor *ctx_len, int64_t max_ctx, float scale, void *workspace,
                        size_t workspace_bytes);

/* attention (cpu_attention.c) */
size_t cai_cpu_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                         int64_t Hkv, int64_t D);
CPU_OP(attention_fwd)(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q, const cai_tensor *k,
                      const cai_tensor *v, const cai_attn_params *params, void *workspace, size_t workspace_bytes);
CPU_OP(attention_bwd)(cai_device_t *dev, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv, const cai_tensor *dout,
                      const cai_tensor *q, const cai_tensor *k, const cai_tensor *v, const cai_tensor *out,
                      const cai_tensor *lse, const cai_attn_params *params, void *workspace, size_t workspace_bytes);
/* cpu_attn_merge.c */
CPU_OP(attention_merge)(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out,
                        const cai_tensor *blk_lse);

/* embeddings and cross-entropy (cpu_embed.c) */
CPU_OP(embedding_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *tokens, const cai_tensor *wte,
                      const cai_tensor *wpe, int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset);
CPU_OP(embedding_bwd)(cai_device_t *dev, cai_tensor *dwte, cai_tensor *dwpe, const cai_tensor *dout,
                      const cai_tensor *tokens, int64_t vocab_offset, int64_t pos_offset);
CPU_OP(xent_fwd)(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, const cai_tensor *logits,
                 const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
CPU_OP(xent_stats)(cai_device_t *dev, cai_tensor *maxv, cai_tensor *sumexp, cai_tensor *target_logit,
                   const cai_tensor *logits, const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab,
                   int ignore_index);
CPU_OP(xent_bwd)(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *lse,
                 const cai_tensor *targets, const cai_tensor *dlosses, float dloss_scale, int64_t vocab_offset,
                 int64_t valid_vocab, int ignore_index);
CPU_OP(xent_fwd_bwd)(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, cai_tensor *dlogits,
                     const cai_tensor *logits, const cai_tensor *targets, float dloss_scale, int64_t vocab_offset,
                     int64_t valid_vocab, int ignore_index);
CPU_OP(argmax_rows)(cai_device_t *dev, cai_tensor *idx, cai_tensor *maxv, const cai_tensor *logits,
                    int64_t vocab_offset, int64_t valid_vocab);

/* optimizer (cpu_optim.c) */
CPU_OP(adamw)(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v,
              cai_tensor *param_lowp, const cai_adamw_params *p, int apply_decay);

/* Vectorised row kernels (cpu_kernels.c). Their definitions are cloned per
 * instruction set (CAI_KERNEL); callers see plain prototypes and reach the
 * clone picked at load time through the ifunc symbol. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define CAI_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CAI_KERNEL
#endif
void cai_k_gelu_fwd(float *y, const float *x, int64_t n);
void cai_k_gelu_bwd(float *dx, const float *x, const float *dy, int64_t n);
void cai_k_swiglu_fwd(float *y, const float *g, const float *u, int64_t n);
void cai_k_swiglu_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int64_t n);
/* Scores of up to 4 query rows against 16 keys: s[r * lds + u] = sum over d of q[r][d] kt[d * 16 + u]
 * (the keys transposed, 16 a row), one fma chain a score in d order, so a score's bits depend on its
 * query and key rows alone, not on the rows beside it. */
void cai_k_scores16(float *s, int64_t lds, const float *const *q, int rows, const float *kt, int64_t D);
/* kt[d * 16 + u] = row u's element d as f32 (0 where rows[u] is null): 16 cache rows transposed. */
void cai_k_keys_t16(float *kt, const void *const *rows, cai_dtype dt, int64_t D);
/* o[d] += sum over u < n of p[u] v[u * D + d], an fma a term in u order. */
void cai_k_pv(float *o, const float *p, int n, const float *v, int64_t D);
/* max(x); sum(exp(x - shift)); y = mul * exp(x - shift) returning sum(exp(x - shift)). */
float cai_k_max(const float *x, int64_t n);
float cai_k_expsum(const float *x, float shift, int64_t n);
float cai_k_exp_store(float *y, const float *x, float shift, float mul, int64_t n);

/* Column-block width for column-parallel reductions: enough blocks to keep
 * every thread busy, at least one cache line (16 floats), at most
 * CAI_COLBLK_MAX. Per-column results do not depend on it. */
#define CAI_COLBLK_MAX 256
static inline int64_t cai_cpu_colblk(const cai_device_t *dev, int64_t cols) {
    int nt = dev && dev->num_threads > 0 ? dev->num_threads : 1;
    int64_t w = (cols + 2 * nt - 1) / (2 * nt);
    w = (w + 15) / 16 * 16;
    return w < 16 ? 16 : (w > CAI_COLBLK_MAX ? CAI_COLBLK_MAX : w);
}

/* Column-block reduction used by bias_grad and the norm backward passes:
 * acc[c] += sum over rows of src[r, c] (both F32), parallel over column
 * blocks so each column is summed by one thread in row order. */
void cai_cpu_colsum(const cai_device_t *dev, float *acc, const cai_rows *src);

#endif
