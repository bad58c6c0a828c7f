/* CUDA backend: mixture-of-experts row movement between token rows and
 * rows grouped by expert (ops.h; kernels in moe.cu). Shapes and dtypes are
 * checked here; pos's values live on the device, so a pos past the grouped
 * rows is found by the kernel (its row skipped) and reported at the next
 * synchronisation. */
#include "cai_config.h"
#include "cuda_internal.h"

#define STREAM(dev) (cai_cuda_of(dev)->stream)

/* t as rows of ref's dtype and width (any row count), errors naming both. */
static cai_status moe_rows(const char *op, const char *arg, const cai_tensor *t, const char *ref_arg,
                           const cai_rows *ref, cai_rows *out) {
    CAI_CALL(cai_ops_rows(op, arg, t, CAI_CUDA, CAI_ANYF, -1, out));
    if (out->dtype != ref->dtype)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but %s is %s; all rows must have one dtype", op, arg,
                         CAI_OPS_DESCRIBE(t), ref_arg, cai_dtype_name(ref->dtype));
    if (out->cols != ref->cols)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected rows of %" PRId64 " columns like %s", op, arg,
                         CAI_OPS_DESCRIBE(t), ref->cols, ref_arg);
    return CAI_OK;
}

/* pos: I32, contiguous, N * k entries for the N token rows. */
static cai_status moe_pos(const char *op, const cai_tensor *pos, const char *tok_arg, int64_t N, const int32_t **data,
                          int64_t *k) {
    char *p;
    CAI_CALL(cai_ops_vec(op, "pos", pos, CAI_CUDA, CAI_I32, -1, &p));
    const int64_t n = cai_tensor_numel(pos);
    if (N == 0 ? n != 0 : n % N != 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: pos is %s, expected N * k elements for the N = %" PRId64 " rows of %s (k choices each)",
                         op, CAI_OPS_DESCRIBE(pos), N, tok_arg);
    *data = (const int32_t *)p;
    *k = N ? n / N : 0;
    return CAI_OK;
}

/* An F32 contiguous vector of n entries (w, dw). */
static cai_status moe_f32(const char *op, const char *arg, const cai_tensor *t, int64_t n, float **data) {
    char *p;
    CAI_CALL(cai_ops_vec(op, arg, t, CAI_CUDA, CAI_F32, n, &p));
    *data = (float *)p;
    return CAI_OK;
}

cai_status cai_cuda_moe_permute(cai_device_t *dev, cai_tensor *xe, const cai_tensor *x, const cai_tensor *pos) {
    static const char op[] = "moe_permute";
    cai_rows rx, re;
    const int32_t *p;
    int64_t k;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_CUDA, CAI_ANYF, -1, &rx));
    CAI_CALL(moe_rows(op, "xe", xe, "x", &rx, &re));
    CAI_CALL(moe_pos(op, pos, "x", rx.rows, &p, &k));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_permute(STREAM(dev), cai_cuda_mat(&re), cai_cuda_mat(&rx), p, k, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_moe_combine_fwd(cai_device_t *dev, cai_tensor *y, const cai_tensor *ye, const cai_tensor *pos,
                                    const cai_tensor *w, int accum) {
    static const char op[] = "moe_combine_fwd";
    cai_rows ry, re;
    const int32_t *p;
    float *wp = NULL;
    int64_t k;
    CAI_CALL(cai_ops_rows(op, "y", y, CAI_CUDA, CAI_ANYF, -1, &ry));
    CAI_CALL(moe_rows(op, "ye", ye, "y", &ry, &re));
    CAI_CALL(moe_pos(op, pos, "y", ry.rows, &p, &k));
    if (w) {
        CAI_CALL(moe_f32(op, "w", w, ry.rows * k, &wp));
    }
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_combine_fwd(STREAM(dev), cai_cuda_mat(&ry), cai_cuda_mat(&re), p, k, wp, accum != 0,
                                       cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_moe_combine_bwd(cai_device_t *dev, cai_tensor *dye, cai_tensor *dw, const cai_tensor *dy,
                                    const cai_tensor *ye, const cai_tensor *pos, const cai_tensor *w) {
    static const char op[] = "moe_combine_bwd";
    cai_rows rdy, re, rde;
    const int32_t *p;
    float *wp, *dwp;
    int64_t k;
    CAI_CALL(cai_ops_rows(op, "dy", dy, CAI_CUDA, CAI_ANYF, -1, &rdy));
    CAI_CALL(moe_rows(op, "ye", ye, "dy", &rdy, &re));
    CAI_CALL(moe_rows(op, "dye", dye, "dy", &rdy, &rde));
    CAI_CALL(moe_pos(op, pos, "dy", rdy.rows, &p, &k));
    CAI_CALL(moe_f32(op, "w", w, rdy.rows * k, &wp));
    CAI_CALL(moe_f32(op, "dw", dw, rdy.rows * k, &dwp));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_combine_bwd(STREAM(dev), cai_cuda_mat(&rde), dwp, cai_cuda_mat(&rdy), cai_cuda_mat(&re), p,
                                       k, wp, cai_cuda_of(dev)->err));
    return CAI_OK;
}

/* ---------------------------------------------------------------- router
 * Shapes are checked on the host (ops_check.c, shared with the CPU); a
 * non-finite logit or a sel outside the experts is found by the kernel and
 * reported at the next synchronisation. */

cai_status cai_cuda_moe_route(cai_device_t *dev, cai_tensor *sel, cai_tensor *wts, cai_tensor *probs, cai_tensor *lse,
                              const cai_tensor *logits, cai_route_fn fn, int norm_topk) {
    static const char op[] = "moe_route";
    cai_route_args r;
    CAI_CALL(cai_ops_moe_route_args(op, CAI_CUDA, (int)fn, sel, wts, probs, lse, logits, &r));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_route(STREAM(dev), r.logits, r.probs, r.lse, r.sel, r.wts, r.N, r.E, r.k, (int)fn,
                                 norm_topk != 0, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_moe_assign(cai_device_t *dev, cai_tensor *pos, cai_tensor *load, cai_tensor *kept,
                               const cai_tensor *sel, int64_t capacity) {
    static const char op[] = "moe_assign";
    int64_t n, E, *ld, *kp;
    int32_t *p;
    const int32_t *s;
    CAI_CALL(cai_ops_assign_args(op, CAI_CUDA, pos, load, kept, sel, capacity, &n, &E, &p, &ld, &kp, &s));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_assign(STREAM(dev), s, p, ld, kp, n, E, capacity, cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_moe_router_sums(cai_device_t *dev, cai_tensor *sums, const cai_tensor *probs, const cai_tensor *lse,
                                    cai_route_fn fn) {
    static const char op[] = "moe_router_sums";
    cai_route_args r;
    double *o;
    CAI_CALL(cai_ops_moe_sums_args(op, CAI_CUDA, (int)fn, sums, probs, lse, &r, &o));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_router_sums(STREAM(dev), o, r.probs, r.lse, r.N, r.E, (int)fn));
    return CAI_OK;
}

cai_status cai_cuda_moe_router_bwd(cai_device_t *dev, cai_tensor *dlogits, const cai_tensor *logits,
                                   const cai_tensor *probs, const cai_tensor *lse, const cai_tensor *sel,
                                   const cai_tensor *wts, const cai_tensor *dw, const cai_tensor *load, cai_route_fn fn,
                                   int norm_topk, double aux_scale, double z_scale) {
    static const char op[] = "moe_router_bwd";
    cai_route_args r;
    CAI_CALL(cai_ops_moe_router_bwd_args(op, CAI_CUDA, (int)fn, dlogits, logits, probs, lse, sel, wts, dw, load, &r));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_moe_router_bwd(STREAM(dev), r.dlogits, r.logits, r.probs, r.lse, r.sel, r.wts, r.dw, r.load, r.N,
                                      r.E, r.k, (int)fn, norm_topk != 0, aux_scale, z_scale));
    return CAI_OK;
}
