/* The FP8 ops' argument checks, shared by the backends so their errors read
 * the same (ops_internal.h). */
#include "cai_config.h"
#include "ops_internal.h"

static cai_status fmt_ok(const char *op, const char *arg, cai_fp8_format f) {
    if ((int)f < 0 || f >= CAI_FP8_FORMAT_COUNT)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %d, expected CAI_FP8_E4M3 or CAI_FP8_E5M2", op, arg, (int)f);
    return CAI_OK;
}

static cai_status codes(const char *op, const char *arg, const cai_tensor *t, cai_device_kind kind, int64_t rows,
                        int64_t cols, cai_rows *out) {
    cai_rows r;
    CAI_CALL(cai_ops_rows(op, arg, t, kind, CAI_DTYPE_U8, -1, &r));
    if (!cai_tensor_is_contiguous(t))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) must be contiguous", op, arg, CAI_OPS_DESCRIBE(t));
    if ((rows >= 0 && r.rows != rows) || (cols >= 0 && r.cols != cols))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected [%" PRId64 ",%" PRId64 "]", op, arg,
                         CAI_OPS_DESCRIBE(t), rows, cols);
    if (out) *out = r;
    return CAI_OK;
}

static cai_status meta_ok(const char *op, const char *arg, const cai_tensor *m, cai_device_kind kind, float **data) {
    char *d;
    CAI_CALL(cai_ops_vec(op, arg, m, kind, CAI_DTYPE_F32, -1, &d));
    if (cai_tensor_numel(m) < CAI_FP8_META_LEN(1))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) has fewer than %d elements (scale, 1/scale, amax history)",
                         op, arg, CAI_OPS_DESCRIBE(m), CAI_FP8_META_LEN(1));
    *data = (float *)d;
    return CAI_OK;
}

cai_status cai_ops_fp8_cast_args(const char *op, cai_device_kind kind, int want, const cai_tensor *q,
                                 const cai_tensor *qt, const cai_tensor *x, const cai_tensor *meta, cai_fp8_format fmt,
                                 cai_rows *xr, float **meta_data) {
    CAI_CALL(fmt_ok(op, "fmt", fmt));
    CAI_CALL(cai_ops_rows(op, "x", x, kind, want, -1, xr));
    if (q) CAI_CALL(codes(op, "q", q, kind, xr->rows, xr->cols, NULL));
    if (qt) CAI_CALL(codes(op, "qt", qt, kind, xr->cols, xr->rows, NULL));
    return meta_ok(op, "meta", meta, kind, meta_data);
}

cai_status cai_ops_fp8_dequant_args(const char *op, cai_device_kind kind, const cai_tensor *y, const cai_tensor *q,
                                    const cai_tensor *metas, int64_t stride, cai_fp8_format fmt, float beta, int64_t *S,
                                    int64_t *n) {
    CAI_CALL(fmt_ok(op, "fmt", fmt));
    if (beta != 0.0f && beta != 1.0f)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: beta is %g, expected 0 or 1", op, (double)beta);
    if (stride < CAI_FP8_META_LEN(1) || stride % 4)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: stride %" PRId64 " is not a multiple of 4 of at least %d", op,
                         stride, CAI_FP8_META_LEN(1));
    cai_rows qr;
    CAI_CALL(codes(op, "q", q, kind, -1, -1, &qr));
    char *d;
    CAI_CALL(cai_ops_vec(op, "y", y, kind, CAI_DTYPE_F32, qr.cols, &d));
    CAI_CALL(cai_ops_vec(op, "metas", metas, kind, CAI_DTYPE_F32, qr.rows * stride, &d));
    *S = qr.rows;
    *n = qr.cols;
    return CAI_OK;
}

cai_status cai_ops_fp8_gemm_args(const char *op, cai_device_kind kind, int want, const cai_tensor *c,
                                 const cai_tensor *a, cai_fp8_format a_fmt, const cai_tensor *a_meta,
                                 const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta, float beta,
                                 cai_fp8_gemm_args *g) {
    CAI_CALL(fmt_ok(op, "a_fmt", a_fmt));
    CAI_CALL(fmt_ok(op, "b_fmt", b_fmt));
    if (a_fmt == CAI_FP8_E5M2 && b_fmt == CAI_FP8_E5M2)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: a and b are both E5M2; FP8 tensor cores need one E4M3 operand", op);
    if (beta != 0.0f && beta != 1.0f)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: beta is %g, expected 0 or 1", op, (double)beta);
    CAI_CALL(codes(op, "a", a, kind, -1, -1, &g->a));
    CAI_CALL(codes(op, "b", b, kind, -1, g->a.cols, &g->b));
    if (want < 0 && c && c->dtype != CAI_DTYPE_F32 && c->dtype != CAI_DTYPE_BF16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: c is %s, expected f32 or bf16", op, CAI_OPS_DESCRIBE(c));
    CAI_CALL(cai_ops_rows(op, "c", c, kind, want, g->b.rows, &g->c));
    if (g->c.rows != g->a.rows)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: c has %" PRId64 " rows but a %" PRId64, op, g->c.rows, g->a.rows);
    float *am, *bm;
    CAI_CALL(meta_ok(op, "a_meta", a_meta, kind, &am));
    CAI_CALL(meta_ok(op, "b_meta", b_meta, kind, &bm));
    g->a_meta = am;
    g->b_meta = bm;
    return CAI_OK;
}

cai_status cai_ops_fp8_epilogue_args(const char *op, cai_device_kind kind, const cai_tensor *c, float beta,
                                     const cai_fp8_epilogue *ep) {
    if (!ep) return CAI_OK;
    if ((int)ep->act < 0 || ep->act > CAI_FP8_ACT_DGELU)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: epilogue act is %d, expected NONE, GELU or DGELU", op, (int)ep->act);
    cai_rows cr, r;
    CAI_CALL(cai_ops_rows(op, "c", c, kind, -1, -1, &cr));
    if (ep->c_in && ep->c_in->data != c->data) {
        CAI_CALL(cai_ops_rows(op, "epilogue c_in", ep->c_in, kind, (int)c->dtype, cr.cols, &r));
        if (r.rows != cr.rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: epilogue c_in is %s, c %s", op, CAI_OPS_DESCRIBE(ep->c_in),
                             CAI_OPS_DESCRIBE(c));
    }
    if (ep->bias) {
        char *d;
        CAI_CALL(cai_ops_vec(op, "epilogue bias", ep->bias, kind, (int)c->dtype, cr.cols, &d));
    }
    if (ep->act == CAI_FP8_ACT_NONE) return CAI_OK;
    if (!ep->aux) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: a GELU epilogue needs aux (the pre-activation)", op);
    CAI_CALL(cai_ops_rows(op, "epilogue aux", ep->aux, kind, (int)c->dtype, cr.cols, &r));
    if (r.rows != cr.rows || ep->aux->data == c->data)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: epilogue aux is %s, expected c's shape %s in a buffer of its own",
                         op, CAI_OPS_DESCRIBE(ep->aux), CAI_OPS_DESCRIBE(c));
    if (ep->c_in || beta != 0.0f || (ep->act == CAI_FP8_ACT_DGELU && ep->bias))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: a %s epilogue takes no c_in or beta%s", op,
                         ep->act == CAI_FP8_ACT_GELU ? "GELU" : "DGELU",
                         ep->act == CAI_FP8_ACT_GELU ? "" : ", no bias");
    return CAI_OK;
}

cai_status cai_ops_fp8_epilogue_pre(cai_device_t *dev, cai_tensor *c, float beta, const cai_fp8_epilogue *ep,
                                    cai_tensor *dst) {
    *dst = ep && ep->act == CAI_FP8_ACT_GELU ? *ep->aux : *c;
    if (ep && ep->c_in && beta != 0.0f && ep->c_in->data != dst->data) CAI_CALL(dev->ops->copy(dev, dst, ep->c_in));
    return CAI_OK;
}

cai_status cai_ops_fp8_epilogue_post(cai_device_t *dev, cai_tensor *c, const cai_fp8_epilogue *ep) {
    if (!ep) return CAI_OK;
    cai_tensor *t = ep->act == CAI_FP8_ACT_GELU ? ep->aux : c;
    if (ep->bias) CAI_CALL(dev->ops->bias_add(dev, t, ep->bias));
    if (ep->act == CAI_FP8_ACT_GELU) return dev->ops->gelu_fwd(dev, c, ep->aux);
    if (ep->act == CAI_FP8_ACT_DGELU) return dev->ops->gelu_bwd(dev, c, ep->aux, c);
    return CAI_OK;
}
