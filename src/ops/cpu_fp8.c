/* CPU backend: FP8 casts and products, emulated. The casts produce the
 * same codes a GPU does (colossal/tensor.h's encoder); the product decodes
 * the codes to f32 (exact) and runs the f32 sgemm with the two 1/scale
 * factors as alpha, so a model trained here in FP8 sees FP8's rounding
 * and saturation, and only the accumulation order differs from the GPU. */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>

CPU_OP(fp8_cast)(cai_device_t *dev, cai_tensor *q, cai_tensor *qt, const cai_tensor *x, cai_tensor *meta,
                 cai_fp8_format fmt, int current, int margin) {
    cai_rows xr;
    float *m;
    CAI_CALL(cai_ops_fp8_cast_args("fp8_cast", CAI_HOST, CAI_F32, q, qt, x, meta, fmt, &xr, &m));
    const int64_t R = xr.rows, C = xr.cols;
    float amax = 0.0f;
    int nan = 0;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, R)) reduction(max : amax) reduction(| : nan)
    for (int64_t i = 0; i < R; i++) {
        const float *row = cai_row_f32(&xr, i);
        for (int64_t j = 0; j < C; j++) {
            float a = fabsf(row[j]);
            if (a > amax) amax = a;
            nan |= isnan(a);
        }
    }
    if (nan) amax = NAN;
    float scale = m[CAI_FP8_META_SCALE];
    if (current || !(scale > 0.0f)) {
        scale = cai_fp8_scale_from_amax(amax, fmt, margin, 0.0f);
        m[CAI_FP8_META_SCALE] = scale;
        m[CAI_FP8_META_SCALE_INV] = scale > 0.0f ? 1.0f / scale : 0.0f;
        if (!(scale > 0.0f)) scale = 1.0f;
    }
    float *h = &m[CAI_FP8_META_AMAX];
    if (amax > *h || isnan(amax)) *h = amax;
    uint8_t *qd = q ? q->data : NULL, *qtd = qt ? qt->data : NULL;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, R))
    for (int64_t i = 0; i < R; i++) {
        const float *row = cai_row_f32(&xr, i);
        for (int64_t j = 0; j < C; j++) {
            uint8_t c = cai_f32_to_fp8(row[j] * scale, fmt);
            if (qd) qd[i * C + j] = c;
            if (qtd) qtd[j * R + i] = c;
        }
    }
    return CAI_OK;
}

size_t cai_cpu_fp8_gemm_workspace_bytes(const cai_device_t *dev, int64_t M, int64_t N, int64_t K) {
    (void)dev;
    return (size_t)((M + N) * K) * sizeof(float);
}

static void decode(cai_device_t *dev, float *dst, const uint8_t *src, int64_t n, cai_fp8_format f) {
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = cai_fp8_to_f32((uint8_t)i, f);
#pragma omp parallel for num_threads(cai_cpu_threads(dev, n / 4096 + 1))
    for (int64_t i = 0; i < n; i++) dst[i] = lut[src[i]];
}

CPU_OP(fp8_dequant_sum)(cai_device_t *dev, cai_tensor *y, const cai_tensor *q, const cai_tensor *metas, int64_t stride,
                        cai_fp8_format fmt, float beta) {
    int64_t S = 0, n = 0;
    CAI_CALL(cai_ops_fp8_dequant_args("fp8_dequant_sum", CAI_HOST, y, q, metas, stride, fmt, beta, &S, &n));
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = cai_fp8_to_f32((uint8_t)i, fmt);
    const float *m = metas->data;
    float *yd = y->data;
    const uint8_t *qd = q->data;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, n / 4096 + 1))
    for (int64_t i = 0; i < n; i++) {
        float acc = beta != 0.0f ? yd[i] : 0.0f;
        for (int64_t s = 0; s < S; s++) {
            const float *ms = m + s * stride;
            const float inv = isfinite(ms[CAI_FP8_META_AMAX]) ? ms[CAI_FP8_META_SCALE_INV] : NAN;
            acc += lut[qd[s * n + i]] * inv;
        }
        yd[i] = acc;
    }
    return CAI_OK;
}

CPU_OP(fp8_gemm)(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt, const cai_tensor *a_meta,
                 const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta, float beta,
                 const cai_fp8_epilogue *ep, void *workspace, size_t workspace_bytes) {
    static const char *op = "fp8_gemm";
    cai_fp8_gemm_args g;
    CAI_CALL(cai_ops_fp8_gemm_args(op, CAI_HOST, CAI_F32, c, a, a_fmt, a_meta, b, b_fmt, b_meta, beta, &g));
    CAI_CALL(cai_ops_fp8_epilogue_args(op, CAI_HOST, c, beta, ep));
    const int64_t M = g.a.rows, N = g.b.rows, K = g.a.cols;
    size_t need = cai_cpu_fp8_gemm_workspace_bytes(dev, M, N, K);
    if (workspace_bytes < need || (need && !workspace))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: workspace of %zu bytes, [%" PRId64 ",%" PRId64 ",%" PRId64
                         "] needs %zu (fp8_gemm_workspace_bytes)",
                         op, workspace_bytes, M, N, K, need);
    float *A = workspace, *B = A + M * K;
    decode(dev, A, (const uint8_t *)g.a.data, M * K, a_fmt);
    decode(dev, B, (const uint8_t *)g.b.data, N * K, b_fmt);
    cai_tensor At = cai_tensor_2d(dev, A, CAI_DTYPE_F32, M, K), Bt = cai_tensor_2d(dev, B, CAI_DTYPE_F32, N, K);
    float alpha = g.a_meta[CAI_FP8_META_SCALE_INV] * g.b_meta[CAI_FP8_META_SCALE_INV];
    cai_tensor dst;
    CAI_CALL(cai_ops_fp8_epilogue_pre(dev, c, beta, ep, &dst));
    cai_rows d;
    CAI_CALL(cai_ops_rows(op, "c", &dst, CAI_HOST, CAI_F32, N, &d));
    cai_tensor cv = cai_tensor_2d(dev, d.data, CAI_DTYPE_F32, M, N);
    cv.stride[0] = d.ld;
    CAI_CALL(cai_cpu_matmul(dev, &cv, &At, 0, &Bt, 1, alpha, beta));
    return cai_ops_fp8_epilogue_post(dev, c, ep);
}
