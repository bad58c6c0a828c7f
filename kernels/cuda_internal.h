/* CUDA backend internals (host side, C): the device state behind
 * dev->impl, error helpers, and the op implementations that
 * kernels/cuda_table.c puts in the table. Validation reuses the checks every
 * backend shares (src/ops/ops_internal.h), so an invalid call fails with the
 * same message on CPU and GPU, before anything is enqueued. */
#ifndef CAI_CUDA_INTERNAL_H
#define CAI_CUDA_INTERNAL_H

#include "ops/ops_internal.h"

#include "cuda_backend.h"
#include "cuda_kernels.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#define CAI_CUDA CAI_DEVICE_CUDA
#define CAI_F32 ((int)CAI_DTYPE_F32)
#define CAI_I32 ((int)CAI_DTYPE_I32)
#define CAI_ANYF (-1)

/* One cached cuBLASLt heuristic answer: the key is every input of the
 * heuristic query (shapes, layouts, dtypes, alignments, epilogue with its
 * bias dtype and GELU aux layout, the separate C input's layout). */
#define CAI_CUDA_PLAN_KEY 27
typedef struct {
    int64_t key[CAI_CUDA_PLAN_KEY];
    cublasLtMatmulAlgo_t algo;
    int valid;
} cai_cuda_plan;

#define CAI_CUDA_PLANS 128
#define CAI_CUDA_SIDE 3

/* The split-K partials of dgemm.cu's products: 8 rows by 128 f32 sums
 * for up to 1024 blocks. A split product has about one block an SM (the
 * SwiGLU pair two); cuk_dgemm_fits declines what would not fit. */
#define CAI_CUDA_DGEMM_WS ((size_t)4 << 20)

/* Enough for a decode step of 1024 tokens over 8 kv heads of up to 4 query heads each. */
#define CAI_CUDA_PAGED_COUNTERS 8192

typedef struct cai_cuda_impl {
    cudaStream_t stream; /* first member on purpose: docs/cuda.md lets other modules read it */
    int ordinal;
    int allow_tf32;  /* CAI_CUDA_TF32=1: f32 matmuls on tensor cores (10-bit mantissa) */
    int lt_autotune; /* CAI_CUBLASLT_AUTOTUNE: candidates timed per new gemm shape (0: heuristic's first) */
    int pdl;         /* CAI_CUDA_PDL on an sm_90+ device: programmatic dependent launches (gemv.cu) */
    int num_sms;
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    void *scratch; /* reduction partials, embedding sort buffers */
    size_t scratch_bytes;
    cuk_errrec *err;      /* device memory the kernels write; read back at synchronisation */
    cuk_errrec *err_host; /* pinned mirror of *err */
    unsigned *paged_cnt;  /* CAI_CUDA_PAGED_COUNTERS counters of paged attention's merge, zero between calls */
    void *dgemm_ws;       /* CAI_CUDA_DGEMM_WS bytes where cuk_dgemm_ready, else NULL */
    unsigned *dgemm_cnt;  /* CUK_DGEMM_COUNTERS counters, zero between calls */
    cublasHandle_t blas;  /* grouped products (cublasGemmGroupedBatchedEx); made at the first one */
    void **grouped_ptrs;  /* device: the grouped products' A, B, C pointer arrays */
    size_t grouped_cap;   /* pointers grouped_ptrs holds */
    cai_cuda_plan plans[CAI_CUDA_PLANS];
    int next_plan;
    /* more streams for products that may overlap (a grouped product's
     * blocks, cuda_grouped.c), each with its cuBLASLt workspace; made at
     * the first use. side_ev[0]: the fork point on `stream`; side_ev[i]:
     * side stream i's end */
    cudaStream_t side[CAI_CUDA_SIDE];
    cudaEvent_t side_ev[CAI_CUDA_SIDE + 1];
    void *side_ws[CAI_CUDA_SIDE];
} cai_cuda_impl;

static inline cai_cuda_impl *cai_cuda_of(const cai_device_t *dev) { return (cai_cuda_impl *)dev->impl; }

/* A cuBLASLt call inside a function with `op` (its name), a cai_status
 * `st` and a cleanup label `done`: a failure sets st and jumps there. */
#define LT(what, expr)                                                                                     \
    do {                                                                                                   \
        cublasStatus_t lt_s_ = (expr);                                                                     \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            st = CAI_ERROR(CAI_ERR_CUDA, "%s: %s failed with cuBLAS status %d (%s)", op, what, (int)lt_s_, \
                           cublasLtGetStatusString(lt_s_));                                                \
            goto done;                                                                                     \
        }                                                                                                  \
    } while (0)

/* The heuristic-answer cache (cuda_matmul.c): the plan of `key`
 * (CAI_CUDA_PLAN_KEY entries) or NULL; a new plan in the next slot. */
cai_cuda_plan *cai_cuda_plan_find(cai_cuda_impl *c, const int64_t *key);
cai_cuda_plan *cai_cuda_plan_add(cai_cuda_impl *c, const int64_t *key, const cublasLtMatmulAlgo_t *algo);
/* A heuristic preference with the device's workspace and the A, B, C, D
 * alignments (bytes); *out NULL unless CUBLAS_STATUS_SUCCESS. */
/* desc's epilogue with its bias (pointer, dtype) and GELU aux (pointer,
 * ld), each when not NULL. */
cai_status cai_cuda_lt_epilogue(const char *op, cublasLtMatmulDesc_t desc, cublasLtEpilogue_t epi, const void *bias,
                                cai_dtype bias_dt, const void *aux, int64_t aux_ld);
cublasStatus_t cai_cuda_lt_pref(const cai_cuda_impl *c, uint32_t al_a, uint32_t al_b, uint32_t al_c, uint32_t al_d,
                                cublasLtMatmulPreference_t *out);

/* Side streams (cuda_grouped.c): fork makes side streams 1..n wait for
 * the work enqueued so far; join makes the device's stream wait for theirs. */
cai_status cai_cuda_fork(cai_device_t *dev, const char *op, int n);
cai_status cai_cuda_join(cai_device_t *dev, const char *op, int n);

/* Make dev's GPU current for this thread (ops may be called from any thread). */
cai_status cai_cuda_enter(cai_device_t *dev, const char *op);
/* Turn a launcher's result into a status naming the op. */
cai_status cai_cuda_launch_status(cudaError_t e, const char *op, const char *what, const char *file, int line);
#define CUK_LAUNCH(op, expr)                                                                               \
    do {                                                                                                   \
        cudaError_t cuk_e_ = (expr);                                                                       \
        if (cuk_e_ != cudaSuccess) return cai_cuda_launch_status(cuk_e_, (op), #expr, __FILE__, __LINE__); \
    } while (0)

/* Report (and clear) a data-dependent error the kernels recorded. */
cai_status cai_cuda_take_device_error(cai_device_t *dev);

static inline cuk_mat cai_cuda_mat(const cai_rows *r) {
    cuk_mat m = {r->data, r->rows, r->cols, r->ld, (int)r->dtype};
    return m;
}

static inline cuk_bthd cai_cuda_bthd(const cai_bthd *t) {
    cuk_bthd m = {t->data, t->B, t->T, t->H, t->D, t->sb, t->st, t->sh, (int)t->dtype};
    return m;
}

/* t as rows with the same rows and columns as ref (validated, op and argument named). */
cai_status cai_cuda_rows_like(const char *op, const char *arg, const cai_tensor *t, const char *ref_arg,
                              const cai_rows *ref, cai_rows *out);

/* Scratch in floats, for column-sum partials. */
static inline float *cai_cuda_scratch_f(cai_device_t *dev, size_t *nfloats) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    *nfloats = c->scratch_bytes / sizeof(float);
    return (float *)c->scratch;
}

/* Column-sum helper shared by bias_grad and the norm backward passes:
 * checks that the partials fit the scratch before launching. */
cai_status cai_cuda_colsums(cai_device_t *dev, const char *op, float *dw, float *db, const cai_rows *dy,
                            const cai_rows *x, const float *mean, const float *rstd);

#define CUDA_OP(name) cai_status cai_cuda_##name

/* memory (cuda_device.c) */
CUDA_OP(alloc)(cai_device_t *dev, size_t bytes, const char *what, void **out);
void cai_cuda_dealloc(cai_device_t *dev, void *ptr);
CUDA_OP(alloc_staging)(cai_device_t *dev, size_t bytes, const char *what, void **out);
void cai_cuda_dealloc_staging(cai_device_t *dev, void *ptr);
CUDA_OP(memcpy)(cai_device_t *dev, void *dst, const void *src, size_t bytes, cai_copy_kind kind);
CUDA_OP(sync)(cai_device_t *dev);

/* device graphs (cuda_graph.c) */
CUDA_OP(graph_begin)(cai_device_t *dev);
CUDA_OP(graph_end)(cai_device_t *dev, void **graph);
CUDA_OP(graph_launch)(cai_device_t *dev, void *graph);
void cai_cuda_graph_free(cai_device_t *dev, void *graph);

/* elementwise and reductions (cuda_basic.c) */
CUDA_OP(fill)(cai_device_t *dev, cai_tensor *x, float value);
CUDA_OP(copy)(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src);
CUDA_OP(copy_sr)
(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src, uint64_t seed, uint64_t stream, uint64_t index_offset);
CUDA_OP(scale)(cai_device_t *dev, cai_tensor *x, float alpha);
CUDA_OP(axpy)(cai_device_t *dev, cai_tensor *y, float alpha, const cai_tensor *x);
CUDA_OP(add)(cai_device_t *dev, cai_tensor *out, const cai_tensor *a, const cai_tensor *b);
CUDA_OP(sum)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);
CUDA_OP(sumsq)(cai_device_t *dev, cai_tensor *out, const cai_tensor *x);
CUDA_OP(adamw)
(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v, cai_tensor *param_lowp,
 const cai_adamw_params *p, int apply_decay);

/* matmul family (cuda_matmul.c) */
CUDA_OP(matmul)
(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, int trans_a, const cai_tensor *b, int trans_b, float alpha,
 float beta);
CUDA_OP(linear_fwd)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias);
CUDA_OP(linear_bwd)
(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias, const cai_tensor *dout,
 const cai_tensor *inp, const cai_tensor *weight, int accum_dinp);
CUDA_OP(linear_gelu_fwd)
(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp, const cai_tensor *weight,
 const cai_tensor *bias);
CUDA_OP(linear_swiglu_fwd)
(cai_device_t *dev, cai_tensor *act, cai_tensor *gate, cai_tensor *up, const cai_tensor *inp, const cai_tensor *w_gate,
 const cai_tensor *w_up);
CUDA_OP(linear_bwd_dgelu)
(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias, const cai_tensor *dout,
 const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *pre);
CUDA_OP(linear_residual_fwd)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias,
 const cai_tensor *residual);
CUDA_OP(bias_add)(cai_device_t *dev, cai_tensor *x, const cai_tensor *bias);
CUDA_OP(bias_grad)(cai_device_t *dev, cai_tensor *dbias, const cai_tensor *dout);

/* FP8 casts and products (cuda_fp8.c, fp8.cu) */
CUDA_OP(fp8_cast)
(cai_device_t *dev, cai_tensor *q, cai_tensor *qt, const cai_tensor *x, cai_tensor *meta, cai_fp8_format fmt,
 int current, int margin);
size_t cai_cuda_fp8_gemm_workspace_bytes(const cai_device_t *dev, int64_t M, int64_t N, int64_t K);
CUDA_OP(fp8_dequant_sum)
(cai_device_t *dev, cai_tensor *y, const cai_tensor *q, const cai_tensor *metas, int64_t stride, cai_fp8_format fmt,
 float beta);
CUDA_OP(fp8_gemm)
(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt, const cai_tensor *a_meta,
 const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta, float beta, const cai_fp8_epilogue *ep,
 void *workspace, size_t workspace_bytes);

/* norms, activations, RoPE (cuda_pointwise.c) */
CUDA_OP(layernorm_fwd)
(cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd, const cai_tensor *inp,
 const cai_tensor *weight, const cai_tensor *bias, float eps);
CUDA_OP(layernorm_bwd)
(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias, const cai_tensor *dout,
 const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp);
CUDA_OP(rmsnorm_fwd)
(cai_device_t *dev, cai_tensor *out, cai_tensor *rstd, const cai_tensor *inp, const cai_tensor *weight, float eps);
CUDA_OP(rmsnorm_bwd)
(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout, const cai_tensor *inp,
 const cai_tensor *weight, const cai_tensor *rstd, int accum_dinp);
CUDA_OP(gelu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp);
CUDA_OP(gelu_bwd)(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *inp, const cai_tensor *dout);
CUDA_OP(swiglu_fwd)(cai_device_t *dev, cai_tensor *out, const cai_tensor *gate, const cai_tensor *up);
CUDA_OP(swiglu_bwd)
(cai_device_t *dev, cai_tensor *dgate, cai_tensor *dup, const cai_tensor *dout, const cai_tensor *gate,
 const cai_tensor *up);
CUDA_OP(rope_tables)(cai_device_t *dev, cai_tensor *cos, cai_tensor *sin, double theta);
CUDA_OP(rope_fwd)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *cos, const cai_tensor *sin,
 const cai_tensor *positions, int64_t pos_offset);
CUDA_OP(rope_bwd)
(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *dout, const cai_tensor *cos, const cai_tensor *sin,
 const cai_tensor *positions, int64_t pos_offset);
/* rope_fwd's checked arguments as the kernels take them */
typedef struct {
    cuk_bthd x, y;
    cuk_mat cos, sin;
    const int32_t *pos;
    int per_batch;
    int64_t pos_offset;
} cai_cuda_rope;
cai_status cai_cuda_rope_args(const char *op, cai_tensor *out, const char *out_name, const cai_tensor *inp,
                              const char *inp_name, const cai_tensor *cos, const cai_tensor *sin,
                              const cai_tensor *positions, int64_t pos_offset, cai_cuda_rope *r);

/* mixture of experts: token rows <-> rows grouped by expert (cuda_moe.c) */
CUDA_OP(moe_permute)(cai_device_t *dev, cai_tensor *xe, const cai_tensor *x, const cai_tensor *pos);
CUDA_OP(moe_combine_fwd)
(cai_device_t *dev, cai_tensor *y, const cai_tensor *ye, const cai_tensor *pos, const cai_tensor *w, int accum);
CUDA_OP(moe_combine_bwd)
(cai_device_t *dev, cai_tensor *dye, cai_tensor *dw, const cai_tensor *dy, const cai_tensor *ye, const cai_tensor *pos,
 const cai_tensor *w);
/* the router (cuda_moe.c, kernels in moe_route.cu) */
CUDA_OP(moe_route)
(cai_device_t *dev, cai_tensor *sel, cai_tensor *wts, cai_tensor *probs, cai_tensor *lse, const cai_tensor *logits,
 cai_route_fn fn, int norm_topk);
CUDA_OP(moe_assign)
(cai_device_t *dev, cai_tensor *pos, cai_tensor *load, cai_tensor *kept, const cai_tensor *sel, int64_t capacity);
CUDA_OP(moe_router_sums)
(cai_device_t *dev, cai_tensor *sums, const cai_tensor *probs, const cai_tensor *lse, cai_route_fn fn);
CUDA_OP(moe_router_bwd)
(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *probs, const cai_tensor *lse,
 const cai_tensor *sel, const cai_tensor *wts, const cai_tensor *dw, const cai_tensor *load, cai_route_fn fn,
 int norm_topk, double aux_scale, double z_scale);
/* One block of a grouped product on validated rows (cuda_matmul.c), on
 * stream `lane` (0: the device's stream, i: side stream i, between
 * cai_cuda_fork and cai_cuda_join): as
 * linear_fwd, and linear_bwd's dx (= or += with accum; NULL: skipped) and
 * dw +=, with cuBLASLt's plan looked up as if the block had plan_rows rows
 * (bucketed): a block's row count changes from call to call, and a
 * heuristic query (and, the first time, loading the kernel it picks) per
 * new count costs more than the product. A plan cuBLASLt refuses for the
 * real count is queried again for it. */
cai_status cai_cuda_block_linear_fwd(cai_device_t *dev, const char *op, const cai_rows *x, const cai_rows *w,
                                     const cai_rows *y, int64_t plan_rows, int lane);
cai_status cai_cuda_block_linear_bwd(cai_device_t *dev, const char *op, const cai_rows *dx, const cai_rows *dw,
                                     const cai_rows *dy, const cai_rows *x, const cai_rows *w, int accum,
                                     int64_t plan_rows, int lane);
/* grouped products (cuda_grouped.c) */
CUDA_OP(grouped_linear_fwd)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight, const int64_t *rows, int n);
CUDA_OP(grouped_linear_bwd)
(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout, const cai_tensor *inp,
 const cai_tensor *weight, const int64_t *rows, int n, int accum);

/* attention, embeddings, cross-entropy (cuda_attention.c, cuda_embed.c) */
size_t cai_cuda_attention_workspace_bytes(const cai_device_t *dev, int64_t B, int64_t Tq, int64_t Tk, int64_t Hq,
                                          int64_t Hkv, int64_t D);
CUDA_OP(attention_fwd)
(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *q, const cai_tensor *k, const cai_tensor *v,
 const cai_attn_params *params, void *workspace, size_t workspace_bytes);
CUDA_OP(attention_bwd)
(cai_device_t *dev, cai_tensor *dq, cai_tensor *dk, cai_tensor *dv, const cai_tensor *dout, const cai_tensor *q,
 const cai_tensor *k, const cai_tensor *v, const cai_tensor *out, const cai_tensor *lse, const cai_attn_params *params,
 void *workspace, size_t workspace_bytes);
CUDA_OP(attention_merge)
(cai_device_t *dev, cai_tensor *out, cai_tensor *lse, const cai_tensor *blk_out, const cai_tensor *blk_lse);
CUDA_OP(embedding_fwd)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *tokens, const cai_tensor *wte, const cai_tensor *wpe,
 int64_t vocab_offset, int64_t vocab_total, int64_t pos_offset);
CUDA_OP(embedding_bwd)
(cai_device_t *dev, cai_tensor *dwte, cai_tensor *dwpe, const cai_tensor *dout, const cai_tensor *tokens,
 int64_t vocab_offset, int64_t pos_offset);
CUDA_OP(xent_fwd)
(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, const cai_tensor *logits, const cai_tensor *targets,
 int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
CUDA_OP(xent_stats)
(cai_device_t *dev, cai_tensor *maxv, cai_tensor *sumexp, cai_tensor *target_logit, const cai_tensor *logits,
 const cai_tensor *targets, int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
CUDA_OP(argmax_rows)
(cai_device_t *dev, cai_tensor *idx, cai_tensor *maxv, const cai_tensor *logits, int64_t vocab_offset,
 int64_t valid_vocab);
CUDA_OP(xent_bwd)
(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits, const cai_tensor *lse, const cai_tensor *targets,
 const cai_tensor *dlosses, float dloss_scale, int64_t vocab_offset, int64_t valid_vocab, int ignore_index);
CUDA_OP(xent_fwd_bwd)
(cai_device_t *dev, cai_tensor *losses, cai_tensor *lse, cai_tensor *dlogits, const cai_tensor *logits,
 const cai_tensor *targets, float dloss_scale, int64_t vocab_offset, int64_t valid_vocab, int ignore_index);

/* paged KV cache (cuda_paged.c) */
CUDA_OP(kv_cache_write)
(cai_device_t *dev, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *k, const cai_tensor *v,
 const cai_tensor *slots);
CUDA_OP(rope_kv_cache_write)
(cai_device_t *dev, cai_tensor *qk, cai_tensor *k_cache, cai_tensor *v_cache, const cai_tensor *v,
 const cai_tensor *slots, const cai_tensor *cos, const cai_tensor *sin, const cai_tensor *positions);
size_t cai_cuda_paged_attention_workspace_bytes(const cai_device_t *dev, int64_t n_tokens, int64_t n_seqs, int64_t Hq,
                                                int64_t D, int64_t max_ctx);
CUDA_OP(paged_attention)
(cai_device_t *dev, cai_tensor *out, const cai_tensor *q, const cai_tensor *k_cache, const cai_tensor *v_cache,
 const cai_tensor *block_tables, const cai_tensor *q_start, const cai_tensor *ctx_len, int64_t max_ctx, float scale,
 void *workspace, size_t workspace_bytes);

#endif
