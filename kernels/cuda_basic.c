/* CUDA backend: fills, copies with dtype conversion (RNE and stochastic),
 * BLAS-1 style elementwise ops, deterministic reductions and AdamW. Every
 * op accepts F32, BF16 and F16 storage for its float tensors (computing in
 * f32); statistics and optimizer state stay F32 as on the CPU. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <math.h>
#include <string.h>

#define STREAM(dev) (cai_cuda_of(dev)->stream)

cai_status cai_cuda_fill(cai_device_t *dev, cai_tensor *x, float value) {
    static const char *op = "fill";
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_CUDA, x && x->dtype == CAI_DTYPE_I32 ? CAI_I32 : CAI_ANYF, -1, &r));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_fill(STREAM(dev), cai_cuda_mat(&r), value));
    return CAI_OK;
}

cai_status cai_cuda_rows_like(const char *op, const char *arg, const cai_tensor *t, const char *ref_arg,
                              const cai_rows *ref, cai_rows *out) {
    CAI_CALL(cai_ops_rows(op, arg, t, CAI_CUDA, CAI_ANYF, -1, out));
    CAI_CALL(cai_ops_same_rows(op, arg, out, ref_arg, ref));
    return CAI_OK;
}

static cai_status check_copy(const char *op, const cai_tensor *dst, const cai_tensor *src, int src_want) {
    CAI_CALL(cai_ops_check(op, "dst", dst, CAI_CUDA, CAI_ANYF));
    CAI_CALL(cai_ops_check(op, "src", src, CAI_CUDA, src_want));
    if (!cai_tensor_same_shape(dst, src))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dst is %s but src is %s; shapes must match", op,
                         CAI_OPS_DESCRIBE(dst), CAI_OPS_DESCRIBE(src));
    return CAI_OK;
}

/* Both tensors as rows, when their layouts allow it (the usual case). */
static int both_rows(const char *op, const cai_tensor *dst, const cai_tensor *src, cai_rows *rd, cai_rows *rs) {
    if (cai_ops_rows(op, "dst", dst, CAI_CUDA, CAI_ANYF, -1, rd) == CAI_OK &&
        cai_ops_rows(op, "src", src, CAI_CUDA, src->dtype, -1, rs) == CAI_OK)
        return 1;
    cai_error_clear(); /* not an error: the general strided kernel takes it */
    return 0;
}

static cuk_strided strided_of(const cai_tensor *dst, const cai_tensor *src) {
    cuk_strided g;
    memset(&g, 0, sizeof g);
    g.ndim = dst->ndim;
    for (int i = 0; i < dst->ndim; i++) {
        g.shape[i] = dst->shape[i];
        g.dstride[i] = dst->stride[i];
        g.sstride[i] = src->stride[i];
    }
    return g;
}

cai_status cai_cuda_copy(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src) {
    static const char *op = "copy";
    CAI_CALL(check_copy(op, dst, src, CAI_ANYF));
    int64_t n = cai_tensor_numel(src);
    if (n == 0) return CAI_OK;
    CAI_CALL(cai_cuda_enter(dev, op));
    cudaStream_t s = STREAM(dev);
    if (dst->dtype == src->dtype && cai_tensor_is_contiguous(dst) && cai_tensor_is_contiguous(src)) {
        CUK_LAUNCH(op, cudaMemcpyAsync(dst->data, src->data, cai_tensor_nbytes(src), cudaMemcpyDeviceToDevice, s));
        return CAI_OK;
    }
    cai_rows rd, rs;
    if (both_rows(op, dst, src, &rd, &rs)) CUK_LAUNCH(op, cuk_copy_rows(s, cai_cuda_mat(&rd), cai_cuda_mat(&rs)));
    else
        CUK_LAUNCH(op, cuk_copy_strided(s, dst->data, (int)dst->dtype, src->data, (int)src->dtype, strided_of(dst, src),
                                        n));
    return CAI_OK;
}

cai_status cai_cuda_copy_sr(cai_device_t *dev, cai_tensor *dst, const cai_tensor *src, uint64_t seed, uint64_t stream,
                            uint64_t index_offset) {
    static const char *op = "copy_sr";
    CAI_CALL(check_copy(op, dst, src, CAI_F32));
    int64_t n = cai_tensor_numel(src);
    if (n == 0) return CAI_OK;
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_rows rd, rs;
    if (both_rows(op, dst, src, &rd, &rs))
        CUK_LAUNCH(op, cuk_copy_sr_rows(STREAM(dev), cai_cuda_mat(&rd), cai_cuda_mat(&rs), seed, stream, index_offset));
    else
        CUK_LAUNCH(op, cuk_copy_sr_strided(STREAM(dev), dst->data, (int)dst->dtype, (const float *)src->data,
                                           strided_of(dst, src), n, seed, stream, index_offset));
    return CAI_OK;
}

cai_status cai_cuda_scale(cai_device_t *dev, cai_tensor *x, float alpha) {
    static const char *op = "scale";
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_CUDA, CAI_ANYF, -1, &r));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_scale(STREAM(dev), cai_cuda_mat(&r), alpha));
    return CAI_OK;
}

cai_status cai_cuda_axpy(cai_device_t *dev, cai_tensor *y, float alpha, const cai_tensor *x) {
    static const char *op = "axpy";
    cai_rows ry, rx;
    CAI_CALL(cai_ops_rows(op, "y", y, CAI_CUDA, CAI_ANYF, -1, &ry));
    CAI_CALL(cai_cuda_rows_like(op, "x", x, "y", &ry, &rx));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_axpy(STREAM(dev), cai_cuda_mat(&ry), alpha, cai_cuda_mat(&rx)));
    return CAI_OK;
}

cai_status cai_cuda_add(cai_device_t *dev, cai_tensor *out, const cai_tensor *a, const cai_tensor *b) {
    static const char *op = "add";
    cai_rows ro, ra, rb;
    CAI_CALL(cai_ops_rows(op, "out", out, CAI_CUDA, CAI_ANYF, -1, &ro));
    CAI_CALL(cai_cuda_rows_like(op, "a", a, "out", &ro, &ra));
    CAI_CALL(cai_cuda_rows_like(op, "b", b, "out", &ro, &rb));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_add(STREAM(dev), cai_cuda_mat(&ro), cai_cuda_mat(&ra), cai_cuda_mat(&rb)));
    return CAI_OK;
}

static cai_status reduce(const char *op, cai_device_t *dev, cai_tensor *out, const cai_tensor *x, int squares) {
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_CUDA, CAI_ANYF, -1, &r));
    CAI_CALL(cai_ops_check(op, "out", out, CAI_CUDA, out && out->dtype == CAI_DTYPE_F64 ? CAI_DTYPE_F64 : CAI_F32));
    if (cai_tensor_numel(out) != 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: out is %s, expected a single element", op, CAI_OPS_DESCRIBE(out));
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *c = cai_cuda_of(dev);
    CUK_LAUNCH(op, cuk_reduce(c->stream, cai_cuda_mat(&r), squares, out->data, (int)out->dtype, (double *)c->scratch));
    return CAI_OK;
}

cai_status cai_cuda_sum(cai_device_t *dev, cai_tensor *out, const cai_tensor *x) {
    CAI_CALL(reduce("sum", dev, out, x, 0));
    return CAI_OK;
}

cai_status cai_cuda_sumsq(cai_device_t *dev, cai_tensor *out, const cai_tensor *x) {
    CAI_CALL(reduce("sumsq", dev, out, x, 1));
    return CAI_OK;
}

cai_status cai_cuda_colsums(cai_device_t *dev, const char *op, float *dw, float *db, const cai_rows *dy,
                            const cai_rows *x, const float *mean, const float *rstd) {
    int per = (dw ? 1 : 0) + (db ? 1 : 0);
    if (per == 0 || dy->rows == 0 || dy->cols == 0) return CAI_OK;
    size_t nf;
    float *scratch = cai_cuda_scratch_f(dev, &nf);
    if ((size_t)per * (size_t)dy->cols > nf)
        return CAI_ERROR(CAI_ERR_NOMEM,
                         "%s: column sums over %" PRId64
                         " columns need %zu bytes of device scratch, "
                         "this device has %zu (raise CAI_CUDA_SCRATCH_MB)",
                         op, dy->cols, (size_t)per * (size_t)dy->cols * sizeof(float), nf * sizeof(float));
    cuk_mat mx = {NULL, 0, 0, 0, 0};
    if (x) mx = cai_cuda_mat(x);
    CUK_LAUNCH(op, cuk_colsums(cai_cuda_of(dev)->stream, dw, db, cai_cuda_mat(dy), mx, mean, rstd, scratch, nf));
    return CAI_OK;
}

cai_status cai_cuda_adamw(cai_device_t *dev, cai_tensor *param, const cai_tensor *grad, cai_tensor *m, cai_tensor *v,
                          cai_tensor *param_lowp, const cai_adamw_params *p, int apply_decay) {
    static const char *op = "adamw";
    char *pp, *pg, *pm, *pv, *pl = NULL;
    CAI_CHECK_ARG(p, "%s: NULL hyper-parameters", op);
    CAI_CHECK_ARG(p->step >= 1, "%s: step %" PRId64 " must start at 1 (bias correction divides by 1 - beta^step)", op,
                  p->step);
    CAI_CHECK_ARG(p->beta1 >= 0 && p->beta1 < 1 && p->beta2 >= 0 && p->beta2 < 1,
                  "%s: betas (%g, %g) must lie in [0, 1)", op, p->beta1, p->beta2);
    CAI_CALL(cai_ops_vec(op, "param", param, CAI_CUDA, CAI_F32, -1, &pp));
    int64_t n = cai_tensor_numel(param);
    CAI_CALL(cai_ops_vec(op, "grad", grad, CAI_CUDA, CAI_ANYF, n, &pg));
    CAI_CALL(cai_ops_vec(op, "m", m, CAI_CUDA, CAI_F32, n, &pm));
    CAI_CALL(cai_ops_vec(op, "v", v, CAI_CUDA, CAI_F32, n, &pv));
    int ldt = CAI_F32;
    if (param_lowp) {
        CAI_CALL(cai_ops_vec(op, "param_lowp", param_lowp, CAI_CUDA, CAI_ANYF, n, &pl));
        ldt = (int)param_lowp->dtype;
    }
    /* The scalars exactly as the CPU backend forms them (double, then f32),
     * so every rank and backend applies the same step. */
    const double bc1 = 1.0 - pow((double)p->beta1, (double)p->step);
    const double bc2 = 1.0 - pow((double)p->beta2, (double)p->step);
    const float step_size = (float)(p->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float decay = apply_decay ? 1.0f - p->lr * p->weight_decay : 1.0f;
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_adamw(cai_cuda_of(dev)->stream, (float *)pp, pg, (int)grad->dtype, (float *)pm, (float *)pv, pl,
                             ldt, n, p->beta1, p->beta2, p->eps, step_size, bc2_sqrt, decay, p->grad_scale));
    return CAI_OK;
}
