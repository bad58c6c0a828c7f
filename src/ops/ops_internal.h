/* Shared by the backends: argument validation with op-and-argument-named
 * errors, and the few layouts ops accept (row matrices, [B,T,H,D] views). */
#ifndef CAI_OPS_INTERNAL_H
#define CAI_OPS_INTERNAL_H

#include "colossal/ops.h"

#include <inttypes.h>

/* A tensor seen as `rows` rows of `cols` contiguous elements, row i at
 * data + i * ld elements: every dimension but the last collapses into rows. */
typedef struct {
    char *data;
    int64_t rows, cols, ld;
    cai_dtype dtype;
} cai_rows;

/* A 4-D [B,T,H,D] tensor with arbitrary strides on B, T, H and contiguous D. */
typedef struct {
    char *data;
    int64_t B, T, H, D;
    int64_t sb, st, sh; /* strides in elements */
    cai_dtype dtype;
} cai_bthd;

/* Fail unless t is non-NULL, lives on a device of this backend's kind and has
 * the wanted dtype (want < 0: any of F32/BF16/F16). */
cai_status cai_ops_check(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want);
/* cai_ops_check plus the row view; `cols` >= 0 also checks the last dim. */
cai_status cai_ops_rows(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want,
                        int64_t cols, cai_rows *out);
/* cai_ops_check plus a 1-D contiguous view of `n` elements (n < 0: any). */
cai_status cai_ops_vec(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want, int64_t n,
                       char **data);
/* Token ids: an I32 [B,T] or [T] tensor (then B = 1), contiguous. */
cai_status cai_ops_tokens(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int64_t *B,
                          int64_t *T, const int32_t **data);
cai_status cai_ops_bthd(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want,
                        cai_bthd *out);
/* A linear layer's forward arguments under the calling op's name (out_arg
 * names the product's output, e.g. "out" or "pre"): weight [OC,IC], inp
 * [N,IC], out [N,OC] of dtype `want`, bias [OC] (NULL: none, *bias_data
 * NULL). Shared by the backends' linear, linear+GELU and linear+residual. */
cai_status cai_ops_linear_args(const char *op, const char *out_arg, const cai_tensor *out, const cai_tensor *inp,
                               const cai_tensor *weight, const cai_tensor *bias, cai_device_kind kind, int want,
                               cai_rows *x, cai_rows *w, cai_rows *y, char **bias_data);
/* attention_merge's arguments: out and blk_out [B,T,H,D] alike (dtype
 * `want`), lse and blk_lse F32 [B,H,T] views with a contiguous last
 * dimension; the lse strides on B and H into ls and bs. */
cai_status cai_ops_merge_args(const char *op, const cai_tensor *out, const cai_tensor *lse, const cai_tensor *blk_out,
                              const cai_tensor *blk_lse, cai_device_kind kind, int want, cai_bthd *o, cai_bthd *bo,
                              int64_t ls[2], int64_t bs[2]);
/* Same shape (and rows) as `ref`. */
cai_status cai_ops_same_rows(const char *op, const char *arg, const cai_rows *r, const char *ref_arg,
                             const cai_rows *ref);

/* The paged-KV ops' arguments, checked alike by every backend: shapes,
 * dtypes (q/k/v/out of dtype `want`; the caches f32, bf16 or f16) and
 * layouts. The index tensors' values are not read here (a device backend
 * cannot without waiting for the device); the pointers are returned. */
typedef struct {
    cai_bthd kc, vc, k, v;
    const int32_t *slots;
} cai_kv_write_args;
/* rope_kv_cache_write's keys: the last Hkv (the caches') heads of qk, a view. */
cai_status cai_ops_rope_kv_keys(const char *op, const cai_tensor *qk, const cai_tensor *k_cache, cai_tensor *k);
cai_status cai_ops_kv_cache_write_args(const char *op, cai_device_kind kind, int want, const cai_tensor *k_cache,
                                       const cai_tensor *v_cache, const cai_tensor *k, const cai_tensor *v,
                                       const cai_tensor *slots, cai_kv_write_args *a);
typedef struct {
    cai_bthd q, out, kc, vc;
    const int32_t *bt, *qs, *cl;
    int64_t S, N, Hq, Hkv, D, bs, max_blocks;
} cai_paged_args;
cai_status cai_ops_paged_attention_args(const char *op, cai_device_kind kind, int want, const cai_tensor *out,
                                        const cai_tensor *q, const cai_tensor *k_cache, const cai_tensor *v_cache,
                                        const cai_tensor *block_tables, const cai_tensor *q_start,
                                        const cai_tensor *ctx_len, int64_t max_ctx, cai_paged_args *a);

/* argmax_rows' arguments: logits of dtype `want`, idx I32 [rows] and maxv
 * F32 [rows] contiguous, ids that fit 32 bits; ncols = the valid columns. */
typedef struct {
    cai_rows x;
    int32_t *idx;
    float *maxv;
    int64_t off, ncols;
} cai_argmax_args;
cai_status cai_ops_argmax_rows_args(const char *op, cai_device_kind kind, int want, const cai_tensor *idx,
                                    const cai_tensor *maxv, const cai_tensor *logits, int64_t vocab_offset,
                                    int64_t valid_vocab, cai_argmax_args *a);

/* fp8_cast's arguments: x [R,C] of dtype `want` with contiguous rows, q
 * [R,C] and qt [C,R] U8 contiguous (NULL: none), meta F32 contiguous of
 * at least CAI_FP8_META_LEN(1) elements; *meta_data its data. */
cai_status cai_ops_fp8_cast_args(const char *op, cai_device_kind kind, int want, const cai_tensor *q,
                                 const cai_tensor *qt, const cai_tensor *x, const cai_tensor *meta, cai_fp8_format fmt,
                                 cai_rows *xr, float **meta_data);
/* fp8_gemm's arguments: a [M,K], b [N,K] U8 contiguous, c [M,N] of dtype
 * `want` (< 0: F32 or BF16), metas as fp8_cast's, formats valid and not
 * both E5M2, beta 0 or 1. */
typedef struct {
    cai_rows a, b, c;
    const float *a_meta, *b_meta;
} cai_fp8_gemm_args;
cai_status cai_ops_fp8_gemm_args(const char *op, cai_device_kind kind, int want, const cai_tensor *c,
                                 const cai_tensor *a, cai_fp8_format a_fmt, const cai_tensor *a_meta,
                                 const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta, float beta,
                                 cai_fp8_gemm_args *g);
/* fp8_dequant_sum's arguments: y F32 [n], q U8 [S, n], metas F32 with S
 * metas of `stride` floats, fmt valid, beta 0 or 1. */
cai_status cai_ops_fp8_dequant_args(const char *op, cai_device_kind kind, const cai_tensor *y, const cai_tensor *q,
                                    const cai_tensor *metas, int64_t stride, cai_fp8_format fmt, float beta, int64_t *S,
                                    int64_t *n);
/* fp8_gemm's epilogue checked against c (NULL ep passes). */
cai_status cai_ops_fp8_epilogue_args(const char *op, cai_device_kind kind, const cai_tensor *c, float beta,
                                     const cai_fp8_epilogue *ep);
/* The epilogue by separate ops around a product that only writes c (the
 * host's way, and a backend's where it cannot fuse): _pre copies c_in to
 * where the product lands (*dst: aux for GELU, else c), _post adds the bias
 * and applies the activation. */
cai_status cai_ops_fp8_epilogue_pre(cai_device_t *dev, cai_tensor *c, float beta, const cai_fp8_epilogue *ep,
                                    cai_tensor *dst);
cai_status cai_ops_fp8_epilogue_post(cai_device_t *dev, cai_tensor *c, const cai_fp8_epilogue *ep);

/* The router ops' arguments (ops.h moe_route, moe_router_sums,
 * moe_router_bwd), checked alike by every backend, each op's tensors all
 * required: probs F32 [N, E] (contiguous) fixes N and E; logits and
 * dlogits are the same shape, lse F32 [N], sel I32 and wts, dw F32 [N * k]
 * with 1 <= k <= E, load I64 [E]. Pointers of tensors an op does not take
 * stay NULL. */
typedef struct {
    int64_t N, E, k;
    float *logits, *probs, *lse, *wts, *dw, *dlogits;
    int32_t *sel;
    int64_t *load;
} cai_route_args;
cai_status cai_ops_moe_route_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *sel,
                                  const cai_tensor *wts, const cai_tensor *probs, const cai_tensor *lse,
                                  const cai_tensor *logits, cai_route_args *out);
/* moe_router_sums' (sums F64 [E + 1] into *sums_data). */
cai_status cai_ops_moe_sums_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *sums,
                                 const cai_tensor *probs, const cai_tensor *lse, cai_route_args *out,
                                 double **sums_data);
cai_status cai_ops_moe_router_bwd_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *dlogits,
                                       const cai_tensor *logits, const cai_tensor *probs, const cai_tensor *lse,
                                       const cai_tensor *sel, const cai_tensor *wts, const cai_tensor *dw,
                                       const cai_tensor *load, cai_route_args *out);
/* moe_assign's: sel and pos I32 [n] alike, load and kept I64 [E], capacity
 * >= 1. The values of sel are not read here. */
cai_status cai_ops_assign_args(const char *op, cai_device_kind kind, const cai_tensor *pos, const cai_tensor *load,
                               const cai_tensor *kept, const cai_tensor *sel, int64_t capacity, int64_t *n, int64_t *E,
                               int32_t **pos_data, int64_t **load_data, int64_t **kept_data, const int32_t **sel_data);

#define CAI_OPS_DESCRIBE(t) cai_tensor_describe((t), (char[160]){0}, 160)

#endif
