/* CUDA backend: LayerNorm/RMSNorm, GELU, SwiGLU and RoPE (validation here,
 * kernels in norm.cu and elementwise.cu). Activations may be F32, BF16 or
 * F16; statistics (mean, rstd) and parameter gradients are F32. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <string.h>

#define STREAM(dev) (cai_cuda_of(dev)->stream)

/* ---------------------------------------------------------------- norms */

typedef struct {
    cai_rows x, y;
    const char *w, *b;
    cai_dtype wdt, bdt;
    float *mean, *rstd;
} norm_args;

static cai_status norm_common(const char *op, norm_args *a, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                              const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias) {
    char *p;
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, -1, &a->x));
    if (out) {
        CAI_CALL(cai_ops_rows(op, "out", out, CAI_CUDA, CAI_ANYF, a->x.cols, &a->y));
        CAI_CALL(cai_ops_same_rows(op, "out", &a->y, "inp", &a->x));
    }
    CAI_CALL(cai_ops_vec(op, "weight", weight, CAI_CUDA, CAI_ANYF, a->x.cols, &p));
    a->w = p;
    a->wdt = weight->dtype;
    if (bias) {
        CAI_CALL(cai_ops_vec(op, "bias", bias, CAI_CUDA, CAI_ANYF, a->x.cols, &p));
        a->b = p;
        a->bdt = bias->dtype;
    }
    if (mean) {
        CAI_CALL(cai_ops_vec(op, "mean", mean, CAI_CUDA, CAI_F32, a->x.rows, &p));
        a->mean = (float *)p;
    }
    if (rstd) {
        CAI_CALL(cai_ops_vec(op, "rstd", rstd, CAI_CUDA, CAI_F32, a->x.rows, &p));
        a->rstd = (float *)p;
    }
    return CAI_OK;
}

static cai_status norm_fwd(const char *op, cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                           const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias, float eps,
                           int rms) {
    norm_args a;
    CAI_CHECK_ARG(out, "%s: out is NULL", op);
    CAI_CALL(norm_common(op, &a, out, mean, rstd, inp, weight, bias));
    CAI_CALL(cai_cuda_enter(dev, op));
    int done = 0;
    CUK_LAUNCH(op, cuk_norm_fwd_fast(STREAM(dev), cai_cuda_mat(&a.y), a.mean, a.rstd, cai_cuda_mat(&a.x), a.w,
                                     (int)a.wdt, a.b, (int)a.bdt, eps, rms, &done));
    if (done) return CAI_OK;
    CUK_LAUNCH(op, cuk_norm_fwd(STREAM(dev), cai_cuda_mat(&a.y), a.mean, a.rstd, cai_cuda_mat(&a.x), a.w, (int)a.wdt,
                                a.b, (int)a.bdt, eps, rms));
    return CAI_OK;
}

cai_status cai_cuda_layernorm_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                                  const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias, float eps) {
    CAI_CALL(norm_fwd("layernorm_fwd", dev, out, mean, rstd, inp, weight, bias, eps, 0));
    return CAI_OK;
}

cai_status cai_cuda_rmsnorm_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *rstd, const cai_tensor *inp,
                                const cai_tensor *weight, float eps) {
    CAI_CALL(norm_fwd("rmsnorm_fwd", dev, out, NULL, rstd, inp, weight, NULL, eps, 1));
    return CAI_OK;
}

static cai_status norm_bwd(const char *op, cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                           const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                           const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp, int rms) {
    norm_args a;
    CAI_CALL(norm_common(op, &a, NULL, (cai_tensor *)mean, (cai_tensor *)rstd, inp, weight, NULL));
    if (!a.rstd || (!mean && !rms))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the saved statistics from the forward pass are required", op);
    cai_rows dy, dx;
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_CUDA, CAI_ANYF, a.x.cols, &dy));
    CAI_CALL(cai_ops_same_rows(op, "dout", &dy, "inp", &a.x));
    char *pw = NULL, *pb = NULL;
    if (dweight) CAI_CALL(cai_ops_vec(op, "dweight", dweight, CAI_CUDA, CAI_F32, a.x.cols, &pw));
    if (dbias) CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_CUDA, CAI_F32, a.x.cols, &pb));
    if (dinp) {
        CAI_CALL(cai_ops_rows(op, "dinp", dinp, CAI_CUDA, CAI_ANYF, a.x.cols, &dx));
        CAI_CALL(cai_ops_same_rows(op, "dinp", &dx, "inp", &a.x));
    }
    CAI_CALL(cai_cuda_enter(dev, op));
    if (!dinp && !pw && !pb) return CAI_OK;
    /* The one-pass kernel when the rows allow it (aligned, one activation dtype, C <= 1024). */
    size_t nf;
    float *scratch = cai_cuda_scratch_f(dev, &nf);
    cuk_mat mdx = {NULL, 0, 0, 0, 0};
    if (dinp) mdx = cai_cuda_mat(&dx);
    int done = 0;
    CUK_LAUNCH(op, cuk_norm_bwd_fast(STREAM(dev), mdx, (float *)pw, (float *)pb, cai_cuda_mat(&dy), cai_cuda_mat(&a.x),
                                     a.w, (int)a.wdt, a.mean, a.rstd, accum_dinp, scratch, nf, &done));
    if (done) return CAI_OK;
    /* Parameter gradients first: they read dout, which dinp may overwrite (same stream). */
    if (pw || pb) CAI_CALL(cai_cuda_colsums(dev, op, (float *)pw, (float *)pb, &dy, &a.x, a.mean, a.rstd));
    if (dinp)
        CUK_LAUNCH(op, cuk_norm_bwd_dinp(STREAM(dev), cai_cuda_mat(&dx), cai_cuda_mat(&dy), cai_cuda_mat(&a.x), a.w,
                                         (int)a.wdt, a.mean, a.rstd, accum_dinp));
    return CAI_OK;
}

cai_status cai_cuda_layernorm_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                                  const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                  const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp) {
    CAI_CALL(norm_bwd("layernorm_bwd", dev, dinp, dweight, dbias, dout, inp, weight, mean, rstd, accum_dinp, 0));
    return CAI_OK;
}

cai_status cai_cuda_rmsnorm_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                                const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *rstd,
                                int accum_dinp) {
    CAI_CALL(norm_bwd("rmsnorm_bwd", dev, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, accum_dinp, 1));
    return CAI_OK;
}

/* ---------------------------------------------------------------- activations */

cai_status cai_cuda_gelu_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp) {
    static const char *op = "gelu_fwd";
    cai_rows x, y;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, -1, &x));
    CAI_CALL(cai_cuda_rows_like(op, "out", out, "inp", &x, &y));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_gelu_fwd(STREAM(dev), cai_cuda_mat(&y), cai_cuda_mat(&x)));
    return CAI_OK;
}

cai_status cai_cuda_gelu_bwd(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *inp, const cai_tensor *dout) {
    static const char *op = "gelu_bwd";
    cai_rows x, dy, dx;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, -1, &x));
    CAI_CALL(cai_cuda_rows_like(op, "dout", dout, "inp", &x, &dy));
    CAI_CALL(cai_cuda_rows_like(op, "dinp", dinp, "inp", &x, &dx));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_gelu_bwd(STREAM(dev), cai_cuda_mat(&dx), cai_cuda_mat(&x), cai_cuda_mat(&dy)));
    return CAI_OK;
}

cai_status cai_cuda_swiglu_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *gate, const cai_tensor *up) {
    static const char *op = "swiglu_fwd";
    cai_rows g, u, y;
    CAI_CALL(cai_ops_rows(op, "gate", gate, CAI_CUDA, CAI_ANYF, -1, &g));
    CAI_CALL(cai_cuda_rows_like(op, "up", up, "gate", &g, &u));
    CAI_CALL(cai_cuda_rows_like(op, "out", out, "gate", &g, &y));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_swiglu_fwd(STREAM(dev), cai_cuda_mat(&y), cai_cuda_mat(&g), cai_cuda_mat(&u)));
    return CAI_OK;
}

cai_status cai_cuda_swiglu_bwd(cai_device_t *dev, cai_tensor *dgate, cai_tensor *dup, const cai_tensor *dout,
                               const cai_tensor *gate, const cai_tensor *up) {
    static const char *op = "swiglu_bwd";
    cai_rows g, u, dy, dg, du;
    memset(&dg, 0, sizeof dg);
    memset(&du, 0, sizeof du);
    CAI_CALL(cai_ops_rows(op, "gate", gate, CAI_CUDA, CAI_ANYF, -1, &g));
    CAI_CALL(cai_cuda_rows_like(op, "up", up, "gate", &g, &u));
    CAI_CALL(cai_cuda_rows_like(op, "dout", dout, "gate", &g, &dy));
    if (dgate) {
        CAI_CALL(cai_cuda_rows_like(op, "dgate", dgate, "gate", &g, &dg));
    }
    if (dup) {
        CAI_CALL(cai_cuda_rows_like(op, "dup", dup, "gate", &g, &du));
    }
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_swiglu_bwd(STREAM(dev), cai_cuda_mat(&dg), cai_cuda_mat(&du), cai_cuda_mat(&dy),
                                  cai_cuda_mat(&g), cai_cuda_mat(&u)));
    return CAI_OK;
}

/* ---------------------------------------------------------------- RoPE */

cai_status cai_cuda_rope_tables(cai_device_t *dev, cai_tensor *cos_t, cai_tensor *sin_t, double theta) {
    static const char *op = "rope_tables";
    cai_rows c, s;
    CAI_CALL(cai_ops_rows(op, "cos", cos_t, CAI_CUDA, CAI_F32, -1, &c));
    CAI_CALL(cai_ops_rows(op, "sin", sin_t, CAI_CUDA, CAI_F32, -1, &s));
    CAI_CALL(cai_ops_same_rows(op, "sin", &s, "cos", &c));
    CAI_CHECK_ARG(theta > 0, "%s: theta %g must be positive", op, theta);
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_rope_tables(STREAM(dev), cai_cuda_mat(&c), cai_cuda_mat(&s), theta));
    return CAI_OK;
}

/* Positions are checked on the device (reading them here would need a
 * synchronisation): an out-of-range one is reported at the next sync. */
cai_status cai_cuda_rope_args(const char *op, cai_tensor *out, const char *out_name, const cai_tensor *inp,
                              const char *inp_name, const cai_tensor *cos, const cai_tensor *sin,
                              const cai_tensor *positions, int64_t pos_offset, cai_cuda_rope *r) {
    memset(r, 0, sizeof *r);
    cai_bthd x, y;
    cai_rows c, s;
    CAI_CALL(cai_ops_bthd(op, inp_name, inp, CAI_CUDA, CAI_ANYF, &x));
    CAI_CALL(cai_ops_bthd(op, out_name, out, CAI_CUDA, CAI_ANYF, &y));
    if (!cai_tensor_same_shape(inp, out))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s but %s is %s", op, out_name, CAI_OPS_DESCRIBE(out),
                         inp_name, CAI_OPS_DESCRIBE(inp));
    CAI_CALL(cai_ops_rows(op, "cos", cos, CAI_CUDA, CAI_F32, -1, &c));
    CAI_CALL(cai_ops_rows(op, "sin", sin, CAI_CUDA, CAI_F32, c.cols, &s));
    CAI_CALL(cai_ops_same_rows(op, "sin", &s, "cos", &c));
    if (2 * c.cols > x.D || c.cols == 0)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: tables of %" PRId64 " frequencies rotate %" PRId64 " dims but head_dim is %" PRId64, op,
                         c.cols, 2 * c.cols, x.D);
    const int32_t *pos = NULL;
    int per_batch = 0;
    if (positions) {
        char *pp;
        CAI_CALL(cai_ops_vec(op, "positions", positions, CAI_CUDA, CAI_I32, -1, &pp));
        int64_t n = cai_tensor_numel(positions);
        if (n != x.T && n != x.B * x.T)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: positions is %s, expected [B,T] = [%" PRId64 ",%" PRId64 "] or [T]", op,
                             CAI_OPS_DESCRIBE(positions), x.B, x.T);
        pos = (const int32_t *)pp;
        per_batch = n != x.T || x.B == 1;
    } else if (pos_offset < 0 || pos_offset + x.T > c.rows) {
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: positions [%" PRId64 ", %" PRId64 ") exceed the tables' %" PRId64
                         " rows (build them for a longer max_pos)",
                         op, pos_offset, pos_offset + x.T, c.rows);
    }
    r->x = cai_cuda_bthd(&x);
    r->y = cai_cuda_bthd(&y);
    r->cos = cai_cuda_mat(&c);
    r->sin = cai_cuda_mat(&s);
    r->pos = pos;
    r->per_batch = per_batch;
    r->pos_offset = pos_offset;
    return CAI_OK;
}

static cai_status rope_run(const char *op, cai_device_t *dev, cai_tensor *out, const char *out_name,
                           const cai_tensor *inp, const char *inp_name, const cai_tensor *cos, const cai_tensor *sin,
                           const cai_tensor *positions, int64_t pos_offset, float sign) {
    cai_cuda_rope r;
    CAI_CALL(cai_cuda_rope_args(op, out, out_name, inp, inp_name, cos, sin, positions, pos_offset, &r));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_rope(STREAM(dev), r.y, r.x, r.cos, r.sin, r.pos, r.per_batch, r.pos_offset, sign,
                            cai_cuda_of(dev)->err));
    return CAI_OK;
}

cai_status cai_cuda_rope_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *cos,
                             const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset) {
    CAI_CALL(rope_run("rope_fwd", dev, out, "out", inp, "inp", cos, sin, positions, pos_offset, 1.0f));
    return CAI_OK;
}

cai_status cai_cuda_rope_bwd(cai_device_t *dev, cai_tensor *dinp, const cai_tensor *dout, const cai_tensor *cos,
                             const cai_tensor *sin, const cai_tensor *positions, int64_t pos_offset) {
    CAI_CALL(rope_run("rope_bwd", dev, dinp, "dinp", dout, "dout", cos, sin, positions, pos_offset, -1.0f));
    return CAI_OK;
}
