/* Vectorised row kernels for the CPU backend's transcendental-heavy loops
 * (softmax, cross-entropy, GELU, SiLU). libm's expf/tanhf do not vectorise
 * without -ffast-math, so exp is computed here with Cody-Waite range
 * reduction and Cephes' degree-6 polynomial (about 1 ulp on [-87, 88];
 * exp(x) = 0 below -87 and +inf above 88; NaN propagates).
 *
 * Each kernel is compiled for AVX-512, AVX2 and baseline x86-64 and picked at
 * load time (GCC target_clones), so the library needs no -march flag. -std=c11
 * keeps floating-point contraction off, so every clone computes the same
 * elementwise results; only the summation order of reductions differs
 * between instruction sets (never between runs or thread counts). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <math.h>
#include <string.h>

static inline float fexp(float x) {
    float xc = x > -87.0f ? x : -87.0f; /* NaN lands here too: no UB in the int conversion */
    xc = xc < 88.0f ? xc : 88.0f;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (works without SSE4.1 roundps) */
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * z + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, sizeof s);
    float res = p * s;
    res = x > 88.0f ? INFINITY : res;
    res = x < -87.0f ? 0.0f : res;
    return x != x ? x : res;
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_C 0.044715f

/* tanh(u) = 1 - 2 / (exp(2u) + 1): saturates correctly at both ends. */
static inline float ftanh(float u) { return 1.0f - 2.0f / (fexp(2.0f * u) + 1.0f); }

CAI_KERNEL void cai_k_gelu_fwd(float *y, const float *x, int64_t n) {
    /* y may alias x */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + ftanh(GELU_K * (v + GELU_C * v * v * v)));
    }
}

CAI_KERNEL void cai_k_gelu_bwd(float *dx, const float *x, const float *dy, int64_t n) {
    /* dx may alias dy: element i is read before it is written */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], d = dy[i];
        float t = ftanh(GELU_K * (v + GELU_C * v * v * v));
        dx[i] = d * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_C * v * v));
    }
}

CAI_KERNEL void cai_k_swiglu_fwd(float *y, const float *g, const float *u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = g[i];
        y[i] = v / (1.0f + fexp(-v)) * u[i];
    }
}

CAI_KERNEL void cai_k_swiglu_bwd(float *dg, float *du, const float *g, const float *u, const float *dy, int64_t n) {
    /* dg may alias g and du may alias u */
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float v = g[i], w = u[i], d = dy[i];
        float sig = 1.0f / (1.0f + fexp(-v));
        dg[i] = d * w * sig * (1.0f + v * (1.0f - sig));
        du[i] = d * v * sig;
    }
}

/* R rows (a constant where inlined) in R x 16 accumulators: a key element loaded once serves every row */
static inline void scores16_rows(float *s, int64_t lds, const float *const *q, int R, const float *kt, int64_t D) {
    float a[4][16];
    memset(a, 0, sizeof a);
    for (int64_t d = 0; d < D; d++) {
        const float *k = kt + d * 16;
        for (int r = 0; r < R; r++) {
            const float x = q[r][d];
#pragma omp simd
            for (int u = 0; u < 16; u++) a[r][u] = fmaf(x, k[u], a[r][u]);
        }
    }
    for (int r = 0; r < R; r++) memcpy(s + r * lds, a[r], sizeof a[r]);
}

CAI_KERNEL void cai_k_scores16(float *s, int64_t lds, const float *const *q, int rows, const float *kt, int64_t D) {
    switch (rows) {
    case 1: scores16_rows(s, lds, q, 1, kt, D); break;
    case 2: scores16_rows(s, lds, q, 2, kt, D); break;
    case 3: scores16_rows(s, lds, q, 3, kt, D); break;
    default: scores16_rows(s, lds, q, 4, kt, D); break;
    }
}

CAI_KERNEL void cai_k_keys_t16(float *kt, const void *const *rows, cai_dtype dt, int64_t D) {
    /* d outer: each store is 16 contiguous floats; the 16 loads hit rows already in L1 */
    const void *r[16];
    static const float zero[1];
    for (int u = 0; u < 16; u++) r[u] = rows[u];
    if (dt == CAI_DTYPE_F32)
        for (int64_t d = 0; d < D; d++)
            for (int u = 0; u < 16; u++) kt[d * 16 + u] = r[u] ? ((const float *)r[u])[d] : zero[0];
    else if (dt == CAI_DTYPE_BF16)
        for (int64_t d = 0; d < D; d++)
            for (int u = 0; u < 16; u++) kt[d * 16 + u] = r[u] ? cai_bf16_to_f32(((const cai_bf16 *)r[u])[d]) : 0.0f;
    else
        for (int64_t d = 0; d < D; d++)
            for (int u = 0; u < 16; u++) kt[d * 16 + u] = r[u] ? cai_f16_to_f32(((const cai_f16 *)r[u])[d]) : 0.0f;
}

CAI_KERNEL void cai_k_pv(float *o, const float *p, int n, const float *v, int64_t D) {
    /* 32 of o in registers across the n rows of v */
    int64_t d0 = 0;
    for (; d0 + 32 <= D; d0 += 32) {
        float a[32];
        memcpy(a, o + d0, sizeof a);
        for (int u = 0; u < n; u++) {
            const float w = p[u], *vr = v + u * D + d0;
#pragma omp simd
            for (int e = 0; e < 32; e++) a[e] = fmaf(w, vr[e], a[e]);
        }
        memcpy(o + d0, a, sizeof a);
    }
    for (; d0 < D; d0++)
        for (int u = 0; u < n; u++) o[d0] = fmaf(p[u], v[u * D + d0], o[d0]);
}

CAI_KERNEL float cai_k_max(const float *x, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

CAI_KERNEL float cai_k_expsum(const float *x, float shift, int64_t n) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += fexp(x[i] - shift);
    return s;
}

CAI_KERNEL float cai_k_exp_store(float *y, const float *x, float shift, float mul, int64_t n) {
    /* y may alias x */
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) {
        float e = fexp(x[i] - shift);
        s += e;
        y[i] = mul * e;
    }
    return s;
}
