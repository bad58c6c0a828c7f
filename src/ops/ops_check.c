/* Argument validation shared by every backend, so shape errors read the same
 * on CPU and GPU: "<op>: <arg> is <what it is>, expected <what fits>". */
#include "cai_config.h"
#include "ops_internal.h"

#include <string.h>

float cai_clip_coef(double grad_norm, double max_norm) {
    if (max_norm <= 0 || !(grad_norm == grad_norm)) return 1.0f;
    double c = max_norm / (grad_norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

cai_status cai_ops_check(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want) {
    if (!t) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    cai_device_kind have = t->device ? t->device->kind : CAI_DEVICE_HOST;
    if (have != kind)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s lives on a %s device but the op runs on %s", op, arg,
                         cai_device_kind_name(have), cai_device_kind_name(kind));
    if (want >= 0 && t->dtype != (cai_dtype)want) {
        if (want == CAI_DTYPE_F32 && (t->dtype == CAI_DTYPE_BF16 || t->dtype == CAI_DTYPE_F16))
            return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                             "%s: %s is %s; this backend computes in f32 (convert with "
                             "ops->copy at the boundary, see docs/ops.md)",
                             op, arg, CAI_OPS_DESCRIBE(t));
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected dtype %s", op, arg, CAI_OPS_DESCRIBE(t),
                         cai_dtype_name((cai_dtype)want));
    }
    if (want < 0 && t->dtype != CAI_DTYPE_F32 && t->dtype != CAI_DTYPE_BF16 && t->dtype != CAI_DTYPE_F16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: %s is %s, expected a float dtype (f32, bf16, f16)", op, arg,
                         CAI_OPS_DESCRIBE(t));
    if (!t->data && cai_tensor_numel(t) > 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) has no data", op, arg, CAI_OPS_DESCRIBE(t));
    return CAI_OK;
}

cai_status cai_ops_rows(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want,
                        int64_t cols, cai_rows *out) {
    CAI_CALL(cai_ops_check(op, arg, t, kind, want));
    cai_rows r = {.data = t->data, .rows = 1, .cols = 1, .ld = 1, .dtype = t->dtype};
    if (t->ndim >= 1) {
        int last = t->ndim - 1;
        r.cols = t->shape[last];
        if (r.cols > 1 && t->stride[last] != 1)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) needs a contiguous last dimension", op, arg,
                             CAI_OPS_DESCRIBE(t));
        r.ld = r.cols;
        /* Collapse the leading dimensions, innermost first; size-1 dims have
         * no say in the layout. */
        int64_t rows = 1, ld = -1, expect = -1;
        for (int i = last - 1; i >= 0; i--) {
            if (t->shape[i] == 1) continue;
            if (ld < 0) {
                ld = t->stride[i];
            } else if (t->stride[i] != expect) {
                return CAI_ERROR(CAI_ERR_INVALID_ARG,
                                 "%s: %s (%s) cannot be viewed as rows: its leading "
                                 "dimensions are not contiguous with each other",
                                 op, arg, CAI_OPS_DESCRIBE(t));
            }
            expect = t->stride[i] * t->shape[i];
            rows *= t->shape[i];
        }
        for (int i = last - 1; i >= 0; i--)
            if (t->shape[i] == 0) rows = 0;
        r.rows = rows;
        if (ld >= 0) r.ld = ld;
        if (r.rows > 1 && r.ld < r.cols)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) has overlapping rows", op, arg, CAI_OPS_DESCRIBE(t));
    }
    if (cols >= 0 && r.cols != cols)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected a last dimension of %" PRId64, op, arg,
                         CAI_OPS_DESCRIBE(t), cols);
    *out = r;
    return CAI_OK;
}

cai_status cai_ops_vec(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want, int64_t n,
                       char **data) {
    CAI_CALL(cai_ops_check(op, arg, t, kind, want));
    if (!cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) must be contiguous", op, arg, CAI_OPS_DESCRIBE(t));
    if (n >= 0 && cai_tensor_numel(t) != n)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected %" PRId64 " elements", op, arg,
                         CAI_OPS_DESCRIBE(t), n);
    *data = t->data;
    return CAI_OK;
}

cai_status cai_ops_bthd(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want,
                        cai_bthd *out) {
    CAI_CALL(cai_ops_check(op, arg, t, kind, want));
    if (t->ndim != 4)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected 4 dimensions [B,T,heads,head_dim]", op, arg,
                         CAI_OPS_DESCRIBE(t));
    if (t->shape[3] > 1 && t->stride[3] != 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) needs a contiguous head_dim", op, arg, CAI_OPS_DESCRIBE(t));
    cai_bthd r = {.data = t->data,
                  .B = t->shape[0],
                  .T = t->shape[1],
                  .H = t->shape[2],
                  .D = t->shape[3],
                  .sb = t->stride[0],
                  .st = t->stride[1],
                  .sh = t->stride[2],
                  .dtype = t->dtype};
    *out = r;
    return CAI_OK;
}

/* An lse view [B,H,T] F32 with a contiguous last dimension. */
static cai_status lse_view(const char *op, const char *arg, const cai_tensor *t, const cai_bthd *like,
                           cai_device_kind kind, int64_t st[2]) {
    CAI_CALL(cai_ops_check(op, arg, t, kind, (int)CAI_DTYPE_F32));
    if (t->ndim != 3 || t->shape[0] != like->B || t->shape[1] != like->H || t->shape[2] != like->T ||
        (t->shape[2] > 1 && t->stride[2] != 1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %s is %s, expected [%" PRId64 ",%" PRId64 ",%" PRId64
                         "] (B, heads, T of out) with a contiguous last dimension",
                         op, arg, CAI_OPS_DESCRIBE(t), like->B, like->H, like->T);
    st[0] = t->stride[0];
    st[1] = t->stride[1];
    return CAI_OK;
}

cai_status cai_ops_merge_args(const char *op, const cai_tensor *out, const cai_tensor *lse, const cai_tensor *blk_out,
                              const cai_tensor *blk_lse, cai_device_kind kind, int want, cai_bthd *o, cai_bthd *bo,
                              int64_t ls[2], int64_t bs[2]) {
    CAI_CALL(cai_ops_bthd(op, "out", out, kind, want, o));
    CAI_CALL(cai_ops_bthd(op, "blk_out", blk_out, kind, want, bo));
    if (!cai_tensor_same_shape(out, blk_out) || out->dtype != blk_out->dtype)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: blk_out is %s but out is %s; they must match", op,
                         CAI_OPS_DESCRIBE(blk_out), CAI_OPS_DESCRIBE(out));
    CAI_CALL(lse_view(op, "lse", lse, o, kind, ls));
    CAI_CALL(lse_view(op, "blk_lse", blk_lse, o, kind, bs));
    return CAI_OK;
}

cai_status cai_ops_same_rows(const char *op, const char *arg, const cai_rows *r, const char *ref_arg,
                             const cai_rows *ref) {
    if (r->rows != ref->rows || r->cols != ref->cols)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %s has %" PRId64 " rows of %" PRId64 " but %s has %" PRId64 " rows of %" PRId64
                         "; they must match",
                         op, arg, r->rows, r->cols, ref_arg, ref->rows, ref->cols);
    return CAI_OK;
}

cai_status cai_ops_linear_args(const char *op, const char *out_arg, const cai_tensor *out, const cai_tensor *inp,
                               const cai_tensor *weight, const cai_tensor *bias, cai_device_kind kind, int want,
                               cai_rows *x, cai_rows *w, cai_rows *y, char **bias_data) {
    CAI_CALL(cai_ops_rows(op, "weight", weight, kind, want, -1, w));
    CAI_CALL(cai_ops_rows(op, "inp", inp, kind, want, w->cols, x));
    CAI_CALL(cai_ops_rows(op, out_arg, out, kind, want, w->rows, y));
    if (y->rows != x->rows)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: inp has %" PRId64 " rows but %s %" PRId64, op, x->rows, out_arg,
                         y->rows);
    *bias_data = NULL;
    if (bias) CAI_CALL(cai_ops_vec(op, "bias", bias, kind, want, w->rows, bias_data));
    return CAI_OK;
}

cai_status cai_ops_tokens(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int64_t *B,
                          int64_t *T, const int32_t **data) {
    char *p;
    CAI_CALL(cai_ops_vec(op, arg, t, kind, (int)CAI_DTYPE_I32, -1, &p));
    if (t->ndim == 2) {
        *B = t->shape[0];
        *T = t->shape[1];
    } else if (t->ndim == 1) {
        *B = 1;
        *T = t->shape[0];
    } else {
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected [B,T] or [T]", op, arg, CAI_OPS_DESCRIBE(t));
    }
    *data = (const int32_t *)p;
    return CAI_OK;
}

/* ------------------------------------------------------------ paged KV cache */

static cai_status paged_cache(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind,
                              cai_bthd *out) {
    CAI_CALL(cai_ops_bthd(op, arg, t, kind, -1, out));
    if (!cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) must be contiguous [n_blocks, block_size, Hkv, D]", op, arg,
                         CAI_OPS_DESCRIBE(t));
    return CAI_OK;
}

static cai_status paged_index(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int ndim,
                              const int32_t **data) {
    CAI_CALL(cai_ops_check(op, arg, t, kind, (int)CAI_DTYPE_I32));
    if (t->ndim != ndim || !cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected a contiguous %d-D I32 tensor", op, arg,
                         CAI_OPS_DESCRIBE(t), ndim);
    *data = (const int32_t *)t->data;
    return CAI_OK;
}

static cai_status paged_caches(const char *op, const cai_tensor *k_cache, const cai_tensor *v_cache,
                               cai_device_kind kind, cai_bthd *kc, cai_bthd *vc) {
    CAI_CALL(paged_cache(op, "k_cache", k_cache, kind, kc));
    CAI_CALL(paged_cache(op, "v_cache", v_cache, kind, vc));
    if (!cai_tensor_same_shape(k_cache, v_cache) || k_cache->dtype != v_cache->dtype)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: k_cache %s and v_cache %s must match (f32, bf16 or f16)", op,
                         CAI_OPS_DESCRIBE(k_cache), CAI_OPS_DESCRIBE(v_cache));
    return CAI_OK;
}

cai_status cai_ops_rope_kv_keys(const char *op, const cai_tensor *qk, const cai_tensor *k_cache, cai_tensor *k) {
    if (!qk || !k_cache || qk->ndim != 4 || k_cache->ndim != 4 || qk->shape[2] <= k_cache->shape[2])
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: qk %s must be [1,N,Hq+Hkv,D] with Hq > 0 for caches %s of Hkv heads",
                         op, CAI_OPS_DESCRIBE(qk), CAI_OPS_DESCRIBE(k_cache));
    return cai_tensor_narrow(qk, 2, qk->shape[2] - k_cache->shape[2], k_cache->shape[2], k);
}

cai_status cai_ops_kv_cache_write_args(const char *op, cai_device_kind kind, int want, const cai_tensor *k_cache,
                                       const cai_tensor *v_cache, const cai_tensor *k, const cai_tensor *v,
                                       const cai_tensor *slots, cai_kv_write_args *a) {
    memset(a, 0, sizeof *a);
    CAI_CALL(paged_caches(op, k_cache, v_cache, kind, &a->kc, &a->vc));
    CAI_CALL(cai_ops_bthd(op, "k", k, kind, want, &a->k));
    CAI_CALL(cai_ops_bthd(op, "v", v, kind, want, &a->v));
    CAI_CALL(paged_index(op, "slots", slots, kind, 1, &a->slots));
    if (!cai_tensor_same_shape(k, v) || a->k.B != 1 || a->k.H != a->kc.H || a->k.D != a->kc.D ||
        slots->shape[0] != a->k.T)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: k %s, v %s and slots %s must be [1,N,Hkv,D], [1,N,Hkv,D] and [N] for a cache of %s", op,
                         CAI_OPS_DESCRIBE(k), CAI_OPS_DESCRIBE(v), CAI_OPS_DESCRIBE(slots), CAI_OPS_DESCRIBE(k_cache));
    return CAI_OK;
}

cai_status cai_ops_paged_attention_args(const char *op, cai_device_kind kind, int want, const cai_tensor *out,
                                        const cai_tensor *q, const cai_tensor *k_cache, const cai_tensor *v_cache,
                                        const cai_tensor *block_tables, const cai_tensor *q_start,
                                        const cai_tensor *ctx_len, int64_t max_ctx, cai_paged_args *a) {
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_bthd(op, "q", q, kind, want, &a->q));
    CAI_CALL(cai_ops_bthd(op, "out", out, kind, want, &a->out));
    CAI_CALL(paged_caches(op, k_cache, v_cache, kind, &a->kc, &a->vc));
    CAI_CALL(paged_index(op, "block_tables", block_tables, kind, 2, &a->bt));
    CAI_CALL(paged_index(op, "q_start", q_start, kind, 1, &a->qs));
    CAI_CALL(paged_index(op, "ctx_len", ctx_len, kind, 1, &a->cl));
    if (!cai_tensor_same_shape(q, out) || a->q.B != 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: q %s and out %s must both be [1,N,Hq,D]", op, CAI_OPS_DESCRIBE(q),
                         CAI_OPS_DESCRIBE(out));
    if (a->kc.D != a->q.D || a->kc.H <= 0 || a->q.H % a->kc.H != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: q %s and the cache %s: head_dim must match and Hkv divide Hq", op,
                         CAI_OPS_DESCRIBE(q), CAI_OPS_DESCRIBE(k_cache));
    a->S = ctx_len->shape[0];
    a->N = a->q.T;
    a->Hq = a->q.H;
    a->Hkv = a->kc.H;
    a->D = a->q.D;
    a->bs = a->kc.T;
    a->max_blocks = block_tables->shape[1];
    if (q_start->shape[0] != a->S + 1 || block_tables->shape[0] != a->S || (a->S == 0 && a->N > 0))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: q_start %s, ctx_len %s and block_tables %s must describe S sequences over N = %lld "
                         "query rows (q_start [S+1] from 0 to N, ctx_len [S], block_tables [S, max_blocks])",
                         op, CAI_OPS_DESCRIBE(q_start), CAI_OPS_DESCRIBE(ctx_len), CAI_OPS_DESCRIBE(block_tables),
                         (long long)a->N);
    if (a->N > 0 && max_ctx < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: max_ctx %lld cannot hold the %lld query rows' own keys", op,
                         (long long)max_ctx, (long long)a->N);
    if (a->N > 0 && (a->kc.B < 1 || a->max_blocks * a->bs < 1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the cache %s and block_tables %s have no slot for a key", op,
                         CAI_OPS_DESCRIBE(k_cache), CAI_OPS_DESCRIBE(block_tables));
    return CAI_OK;
}

cai_status cai_ops_argmax_rows_args(const char *op, cai_device_kind kind, int want, const cai_tensor *idx,
                                    const cai_tensor *maxv, const cai_tensor *logits, int64_t vocab_offset,
                                    int64_t valid_vocab, cai_argmax_args *a) {
    char *pi, *pm;
    CAI_CALL(cai_ops_rows(op, "logits", logits, kind, want, -1, &a->x));
    CAI_CALL(cai_ops_vec(op, "idx", idx, kind, (int)CAI_DTYPE_I32, a->x.rows, &pi));
    CAI_CALL(cai_ops_vec(op, "maxv", maxv, kind, (int)CAI_DTYPE_F32, a->x.rows, &pm));
    CAI_CHECK_ARG(vocab_offset >= 0 && vocab_offset + a->x.cols <= INT32_MAX,
                  "%s: vocab_offset %" PRId64 " with %" PRId64 " columns: ids must lie in [0, 2^31)", op, vocab_offset,
                  a->x.cols);
    a->idx = (int32_t *)pi;
    a->maxv = (float *)pm;
    a->off = vocab_offset;
    const int64_t nc = valid_vocab - vocab_offset;
    a->ncols = nc < 0 ? 0 : (nc > a->x.cols ? a->x.cols : nc);
    return CAI_OK;
}

/* ---------------------------------------------------------------- router */

static cai_status route_vec(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int want,
                            int64_t n, void **out) {
    char *p = NULL;
    if (t) CAI_CALL(cai_ops_vec(op, arg, t, kind, want, n, &p));
    *out = p;
    return CAI_OK;
}

/* NULL tensors are the ones the op does not take (its caller has checked
 * that every tensor it takes is given). */
static cai_status route_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *logits,
                             const cai_tensor *probs, const cai_tensor *lse, const cai_tensor *sel,
                             const cai_tensor *wts, const cai_tensor *dw, const cai_tensor *load,
                             const cai_tensor *dlogits, cai_route_args *out) {
    if (fn != CAI_ROUTE_SOFTMAX && fn != CAI_ROUTE_TOPK_SOFTMAX && fn != CAI_ROUTE_SIGMOID)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: router function %d is not one of softmax (0), topk_softmax (1), "
                         "sigmoid (2)",
                         op, fn);
    cai_route_args r = {0};
    CAI_CALL(cai_ops_check(op, "probs", probs, kind, (int)CAI_DTYPE_F32));
    if (probs->ndim != 2 || !cai_tensor_is_contiguous(probs))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: probs is %s, expected a contiguous [tokens, experts] matrix", op,
                         CAI_OPS_DESCRIBE(probs));
    r.N = probs->shape[0];
    r.E = probs->shape[1];
    if (r.E < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: probs is %s, expected at least one expert", op,
                         CAI_OPS_DESCRIBE(probs));
    const int f32 = (int)CAI_DTYPE_F32;
    r.probs = (float *)probs->data;
    CAI_CALL(route_vec(op, "logits", logits, kind, f32, r.N * r.E, (void **)&r.logits));
    CAI_CALL(route_vec(op, "dlogits", dlogits, kind, f32, r.N * r.E, (void **)&r.dlogits));
    CAI_CALL(route_vec(op, "lse", lse, kind, f32, r.N, (void **)&r.lse));
    CAI_CALL(route_vec(op, "load", load, kind, (int)CAI_DTYPE_I64, r.E, (void **)&r.load));
    if (sel) {
        CAI_CALL(route_vec(op, "sel", sel, kind, (int)CAI_DTYPE_I32, -1, (void **)&r.sel));
        const int64_t n = cai_tensor_numel(sel);
        r.k = r.N ? n / r.N : 0;
        if (r.N ? (n % r.N != 0 || r.k < 1 || r.k > r.E) : n != 0)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: sel is %s, expected N * k elements for the N = %" PRId64
                             " tokens with 1 <= k <= %" PRId64 " (the experts of probs)",
                             op, CAI_OPS_DESCRIBE(sel), r.N, r.E);
    } else if (wts || dw) {
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: sel is NULL but the weights are given", op);
    }
    CAI_CALL(route_vec(op, "wts", wts, kind, f32, r.N * r.k, (void **)&r.wts));
    CAI_CALL(route_vec(op, "dw", dw, kind, f32, r.N * r.k, (void **)&r.dw));
    *out = r;
    return CAI_OK;
}

cai_status cai_ops_moe_route_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *sel,
                                  const cai_tensor *wts, const cai_tensor *probs, const cai_tensor *lse,
                                  const cai_tensor *logits, cai_route_args *out) {
    if (!logits || !lse || !sel || !wts)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: logits, lse, sel and wts are all required", op);
    return route_args(op, kind, fn, logits, probs, lse, sel, wts, NULL, NULL, NULL, out);
}

cai_status cai_ops_moe_sums_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *sums,
                                 const cai_tensor *probs, const cai_tensor *lse, cai_route_args *out,
                                 double **sums_data) {
    if (!lse) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: lse is required", op);
    CAI_CALL(route_args(op, kind, fn, NULL, probs, lse, NULL, NULL, NULL, NULL, NULL, out));
    char *p;
    CAI_CALL(cai_ops_vec(op, "sums", sums, kind, (int)CAI_DTYPE_F64, out->E + 1, &p));
    *sums_data = (double *)(void *)p;
    return CAI_OK;
}

cai_status cai_ops_moe_router_bwd_args(const char *op, cai_device_kind kind, int fn, const cai_tensor *dlogits,
                                       const cai_tensor *logits, const cai_tensor *probs, const cai_tensor *lse,
                                       const cai_tensor *sel, const cai_tensor *wts, const cai_tensor *dw,
                                       const cai_tensor *load, cai_route_args *out) {
    if (!dlogits || !logits || !lse || !sel || !wts || !dw || !load)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: every tensor argument is required", op);
    return route_args(op, kind, fn, logits, probs, lse, sel, wts, dw, load, dlogits, out);
}

cai_status cai_ops_assign_args(const char *op, cai_device_kind kind, const cai_tensor *pos, const cai_tensor *load,
                               const cai_tensor *kept, const cai_tensor *sel, int64_t capacity, int64_t *n, int64_t *E,
                               int32_t **pos_data, int64_t **load_data, int64_t **kept_data, const int32_t **sel_data) {
    char *s, *p, *l, *k;
    CAI_CALL(cai_ops_vec(op, "sel", sel, kind, (int)CAI_DTYPE_I32, -1, &s));
    *n = cai_tensor_numel(sel);
    CAI_CALL(cai_ops_vec(op, "pos", pos, kind, (int)CAI_DTYPE_I32, *n, &p));
    CAI_CALL(cai_ops_vec(op, "load", load, kind, (int)CAI_DTYPE_I64, -1, &l));
    *E = cai_tensor_numel(load);
    if (*E < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: load is %s, expected one entry per expert", op,
                         CAI_OPS_DESCRIBE(load));
    CAI_CALL(cai_ops_vec(op, "kept", kept, kind, (int)CAI_DTYPE_I64, *E, &k));
    if (capacity < 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: capacity %" PRId64 " per expert; must be >= 1", op, capacity);
    if (*n > INT32_MAX)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %" PRId64 " choices; pos is I32, at most %d", op, *n, INT32_MAX);
    *sel_data = (const int32_t *)(void *)s;
    *pos_data = (int32_t *)(void *)p;
    *load_data = (int64_t *)(void *)l;
    *kept_data = (int64_t *)(void *)k;
    return CAI_OK;
}
