/* CPU backend: LayerNorm and RMSNorm over the last dimension. Forward saves
 * per-row statistics; backward computes parameter gradients column-blocked
 * (one thread owns each column, rows summed in order: deterministic) and
 * input gradients row-parallel. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

typedef struct {
    cai_rows x, y; /* input and output rows */
    const float *w, *b;
    float *mean, *rstd;
} norm_args;

static cai_status norm_common(const char *op, norm_args *a, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                              const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias) {
    char *p;
    memset(a, 0, sizeof *a);
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_HOST, CAI_F32, -1, &a->x));
    if (out) {
        CAI_CALL(cai_ops_rows(op, "out", out, CAI_HOST, CAI_F32, a->x.cols, &a->y));
        CAI_CALL(cai_ops_same_rows(op, "out", &a->y, "inp", &a->x));
    }
    CAI_CALL(cai_ops_vec(op, "weight", weight, CAI_HOST, CAI_F32, a->x.cols, &p));
    a->w = (const float *)p;
    if (bias) {
        CAI_CALL(cai_ops_vec(op, "bias", bias, CAI_HOST, CAI_F32, a->x.cols, &p));
        a->b = (const float *)p;
    }
    if (mean) {
        CAI_CALL(cai_ops_vec(op, "mean", mean, CAI_HOST, CAI_F32, a->x.rows, &p));
        a->mean = (float *)p;
    }
    if (rstd) {
        CAI_CALL(cai_ops_vec(op, "rstd", rstd, CAI_HOST, CAI_F32, a->x.rows, &p));
        a->rstd = (float *)p;
    }
    return CAI_OK;
}

cai_status cai_cpu_layernorm_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *mean, cai_tensor *rstd,
                                 const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *bias, float eps) {
    norm_args a;
    CAI_CALL(norm_common("layernorm_fwd", &a, out, mean, rstd, inp, weight, bias));
    const int64_t C = a.x.cols;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t i = 0; i < a.x.rows; i++) {
        const float *x = cai_row_f32(&a.x, i);
        float *y = cai_row_f32(&a.y, i);
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < C; j++) s += x[j];
        float m = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int64_t j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
        float r = 1.0f / sqrtf(v / (float)C + eps);
        if (a.b) {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) y[j] = (x[j] - m) * r * a.w[j] + a.b[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) y[j] = (x[j] - m) * r * a.w[j];
        }
        if (a.mean) a.mean[i] = m;
        if (a.rstd) a.rstd[i] = r;
    }
    return CAI_OK;
}

/* dweight[c] += sum_i dout[i,c] * xhat[i,c], dbias[c] += sum_i dout[i,c],
 * xhat = (x - mean_i) * rstd_i (mean NULL: RMSNorm, xhat = x * rstd_i). */
static void norm_param_grads(const cai_device_t *dev, float *dw, float *db, const cai_rows *dy, const cai_rows *x,
                             const float *mean, const float *rstd) {
    const int64_t BLK = cai_cpu_colblk(dev, x->cols), nblk = (x->cols + BLK - 1) / BLK;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, nblk)) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * BLK, w = x->cols - c0 < BLK ? x->cols - c0 : BLK;
        double sw[CAI_COLBLK_MAX] = {0}, sb[CAI_COLBLK_MAX] = {0};
        for (int64_t i = 0; i < x->rows; i++) {
            const float *px = cai_row_f32(x, i) + c0, *pd = cai_row_f32(dy, i) + c0;
            float m = mean ? mean[i] : 0.0f, r = rstd[i];
#pragma omp simd
            for (int64_t j = 0; j < w; j++) {
                sw[j] += pd[j] * ((px[j] - m) * r);
                sb[j] += pd[j];
            }
        }
        for (int64_t j = 0; j < w; j++) {
            if (dw) dw[c0 + j] = (float)((double)dw[c0 + j] + sw[j]);
            if (db) db[c0 + j] = (float)((double)db[c0 + j] + sb[j]);
        }
    }
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; the
 * mean(g) term is dropped for RMSNorm (no centring). */
static void norm_input_grads(const cai_device_t *dev, cai_rows *dx, const cai_rows *dy, const cai_rows *x,
                             const float *w, const float *mean, const float *rstd, int accum) {
    const int64_t C = x->cols;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, x->rows)) schedule(static)
    for (int64_t i = 0; i < x->rows; i++) {
        const float *px = cai_row_f32(x, i), *pd = cai_row_f32(dy, i);
        float *pdx = cai_row_f32(dx, i);
        float m = mean ? mean[i] : 0.0f, r = rstd[i];
        float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t j = 0; j < C; j++) {
            float g = pd[j] * w[j];
            sg += g;
            sgx += g * ((px[j] - m) * r);
        }
        float mg = mean ? sg / (float)C : 0.0f, mgx = sgx / (float)C;
        if (accum) {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) pdx[j] += r * (pd[j] * w[j] - mg - (px[j] - m) * r * mgx);
        } else {
#pragma omp simd
            for (int64_t j = 0; j < C; j++) pdx[j] = r * (pd[j] * w[j] - mg - (px[j] - m) * r * mgx);
        }
    }
}

static cai_status norm_bwd(const char *op, cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                           const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                           const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp) {
    norm_args a;
    CAI_CALL(norm_common(op, &a, NULL, (cai_tensor *)mean, (cai_tensor *)rstd, inp, weight, NULL));
    if (!a.rstd || (!mean && strcmp(op, "layernorm_bwd") == 0))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the saved statistics from the forward pass are required", op);
    cai_rows dy, dx;
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, a.x.cols, &dy));
    CAI_CALL(cai_ops_same_rows(op, "dout", &dy, "inp", &a.x));
    char *pw = NULL, *pb = NULL;
    if (dweight) CAI_CALL(cai_ops_vec(op, "dweight", dweight, CAI_HOST, CAI_F32, a.x.cols, &pw));
    if (dbias) CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_HOST, CAI_F32, a.x.cols, &pb));
    if (dinp) {
        CAI_CALL(cai_ops_rows(op, "dinp", dinp, CAI_HOST, CAI_F32, a.x.cols, &dx));
        CAI_CALL(cai_ops_same_rows(op, "dinp", &dx, "inp", &a.x));
    }
    /* Parameter gradients first: they read dout, which dinp may overwrite. */
    if (pw || pb) norm_param_grads(dev, (float *)pw, (float *)pb, &dy, &a.x, a.mean, a.rstd);
    if (dinp) norm_input_grads(dev, &dx, &dy, &a.x, a.w, a.mean, a.rstd, accum_dinp);
    return CAI_OK;
}

cai_status cai_cpu_layernorm_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                                 const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                 const cai_tensor *mean, const cai_tensor *rstd, int accum_dinp) {
    CAI_CALL(norm_bwd("layernorm_bwd", dev, dinp, dweight, dbias, dout, inp, weight, mean, rstd, accum_dinp));
    return CAI_OK;
}

cai_status cai_cpu_rmsnorm_fwd(cai_device_t *dev, cai_tensor *out, cai_tensor *rstd, const cai_tensor *inp,
                               const cai_tensor *weight, float eps) {
    norm_args a;
    CAI_CALL(norm_common("rmsnorm_fwd", &a, out, NULL, rstd, inp, weight, NULL));
    const int64_t C = a.x.cols;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, a.x.rows)) schedule(static)
    for (int64_t i = 0; i < a.x.rows; i++) {
        const float *x = cai_row_f32(&a.x, i);
        float *y = cai_row_f32(&a.y, i);
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < C; j++) s += x[j] * x[j];
        float r = 1.0f / sqrtf(s / (float)C + eps);
        /* Hugging Face order: normalise, then scale by the weight. */
#pragma omp simd
        for (int64_t j = 0; j < C; j++) y[j] = a.w[j] * (x[j] * r);
        if (a.rstd) a.rstd[i] = r;
    }
    return CAI_OK;
}

cai_status cai_cpu_rmsnorm_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                               const cai_tensor *inp, const cai_tensor *weight, const cai_tensor *rstd,
                               int accum_dinp) {
    CAI_CALL(norm_bwd("rmsnorm_bwd", dev, dinp, dweight, NULL, dout, inp, weight, NULL, rstd, accum_dinp));
    return CAI_OK;
}
