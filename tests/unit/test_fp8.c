/* FP8 numerics (colossal/tensor.h) and the CPU backend's FP8 ops: every
 * code of both formats, ties, saturation, NaN, agreement with a brute-force
 * nearest-value reference, the scaling recipes, and FP8 products within the
 * error bound their scales imply. */
#include "cai_config.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"
#include "test_ops_util.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>

static const cai_fp8_format FMTS[2] = {CAI_FP8_E4M3, CAI_FP8_E5M2};

static int is_nan_code(uint8_t c, cai_fp8_format f) {
    uint8_t m = c & 0x7f;
    return f == CAI_FP8_E4M3 ? m == 0x7f : m > 0x7c;
}
static int is_inf_code(uint8_t c, cai_fp8_format f) { return f == CAI_FP8_E5M2 && (c & 0x7f) == 0x7c; }

START_TEST(every_code_decodes_and_round_trips) {
    for (int fi = 0; fi < 2; fi++) {
        cai_fp8_format f = FMTS[fi];
        int n_finite = 0;
        for (int c = 0; c < 256; c++) {
            float v = cai_fp8_to_f32((uint8_t)c, f);
            if (is_nan_code((uint8_t)c, f)) {
                ck_assert_msg(isnan(v), "%s code 0x%02x should be NaN", cai_fp8_format_name(f), c);
                ck_assert_int_eq(cai_f32_to_fp8(v, f), (c & 0x80) | 0x7f);
                continue;
            }
            if (is_inf_code((uint8_t)c, f)) {
                ck_assert(isinf(v) && (v < 0) == (c >= 0x80));
                ck_assert_int_eq(cai_f32_to_fp8(v, f), (c & 0x80) | 0x7b); /* saturates */
                continue;
            }
            n_finite++;
            ck_assert_msg(cai_f32_to_fp8(v, f) == c, "%s code 0x%02x -> %g -> 0x%02x", cai_fp8_format_name(f), c,
                          (double)v, cai_f32_to_fp8(v, f));
            /* magnitudes increase with the code */
            if ((c & 0x7f) > 0 && !is_nan_code((uint8_t)(c - 1), f))
                ck_assert(fabsf(cai_fp8_to_f32((uint8_t)(c - 1), f)) < fabsf(v));
        }
        ck_assert_int_eq(n_finite, f == CAI_FP8_E4M3 ? 254 : 248);
    }
    /* the formats' landmarks */
    ck_assert(cai_fp8_to_f32(0x7e, CAI_FP8_E4M3) == 448.0f && cai_fp8_max(CAI_FP8_E4M3) == 448.0f);
    ck_assert(cai_fp8_to_f32(0x7b, CAI_FP8_E5M2) == 57344.0f && cai_fp8_max(CAI_FP8_E5M2) == 57344.0f);
    ck_assert(cai_fp8_to_f32(0x38, CAI_FP8_E4M3) == 1.0f && cai_fp8_to_f32(0x3c, CAI_FP8_E5M2) == 1.0f);
    ck_assert(cai_fp8_to_f32(0x01, CAI_FP8_E4M3) == ldexpf(1, -9));
    ck_assert(cai_fp8_to_f32(0x08, CAI_FP8_E4M3) == ldexpf(1, -6));
    ck_assert(cai_fp8_to_f32(0x01, CAI_FP8_E5M2) == ldexpf(1, -16));
    ck_assert(cai_fp8_to_f32(0x04, CAI_FP8_E5M2) == ldexpf(1, -14));
    ck_assert(cai_fp8_to_f32(0xb8, CAI_FP8_E4M3) == -1.0f);
    ck_assert(signbit(cai_fp8_to_f32(0x80, CAI_FP8_E4M3)) && cai_fp8_to_f32(0x80, CAI_FP8_E4M3) == 0.0f);
}
END_TEST

START_TEST(ties_go_to_even_and_saturate) {
    for (int fi = 0; fi < 2; fi++) {
        cai_fp8_format f = FMTS[fi];
        const int top = f == CAI_FP8_E4M3 ? 0x7e : 0x7b;
        for (int c = 0; c < top; c++) {
            float lo = cai_fp8_to_f32((uint8_t)c, f), hi = cai_fp8_to_f32((uint8_t)(c + 1), f);
            float mid = (float)(((double)lo + hi) / 2); /* exact: fp8 values have few bits */
            ck_assert((double)mid == ((double)lo + hi) / 2);
            int even = (c & 1) ? c + 1 : c;
            for (int s = 0; s < 2; s++) {
                float sg = s ? -1.0f : 1.0f;
                int sb = s ? 0x80 : 0;
                ck_assert_msg(cai_f32_to_fp8(sg * mid, f) == (sb | even), "%s tie %g -> 0x%02x, expected 0x%02x",
                              cai_fp8_format_name(f), (double)(sg * mid), cai_f32_to_fp8(sg * mid, f), sb | even);
                ck_assert_int_eq(cai_f32_to_fp8(sg * nextafterf(mid, 0), f), sb | c);
                ck_assert_int_eq(cai_f32_to_fp8(sg * nextafterf(mid, INFINITY), f), sb | (c + 1));
            }
        }
        /* beyond the largest value: saturate, infinities included */
        float mx = cai_fp8_max(f);
        float big[] = {nextafterf(mx, INFINITY), mx * 1.0625f, mx * 1.2f, mx * 2, 1e30f, FLT_MAX, INFINITY};
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
            ck_assert_int_eq(cai_f32_to_fp8(big[i], f), top);
            ck_assert_int_eq(cai_f32_to_fp8(-big[i], f), 0x80 | top);
        }
        /* NaN keeps its sign; below half the smallest subnormal is zero */
        ck_assert_int_eq(cai_f32_to_fp8(NAN, f), 0x7f);
        ck_assert_int_eq(cai_f32_to_fp8(-NAN, f), 0xff);
        float tiny = cai_fp8_to_f32(1, f);
        ck_assert_int_eq(cai_f32_to_fp8(tiny / 2, f), 0); /* tie with 0: even */
        ck_assert_int_eq(cai_f32_to_fp8(nextafterf(tiny / 2, 1), f), 1);
        ck_assert_int_eq(cai_f32_to_fp8(-tiny / 4, f), 0x80);
        ck_assert_int_eq(cai_f32_to_fp8(FLT_MIN / 4, f), 0); /* an f32 subnormal */
    }
}
END_TEST

/* Brute force: the nearest finite code, ties to the even code, values
 * beyond the largest saturating. */
static uint8_t nearest_ref(float x, cai_fp8_format f) {
    const int top = f == CAI_FP8_E4M3 ? 0x7e : 0x7b;
    double ax = fabs((double)x);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= top; c++) {
        double d = fabs((double)cai_fp8_to_f32((uint8_t)c, f) - ax);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return (uint8_t)((x < 0 ? 0x80 : 0) | best);
}

START_TEST(matches_nearest_value_reference) {
    for (int fi = 0; fi < 2; fi++) {
        cai_fp8_format f = FMTS[fi];
        for (uint64_t i = 0; i < 200000; i++) {
            /* log-uniform magnitudes across and beyond the format's range */
            double u = cai_rng_uniform(7, (uint64_t)fi, i);
            double e = f == CAI_FP8_E4M3 ? -12 + 23 * u : -19 + 37 * u;
            float x = (float)(ldexp(1.0, (int)floor(e)) * (1 + (e - floor(e))));
            if (i & 1) x = -x;
            uint8_t got = cai_f32_to_fp8(x, f), want = nearest_ref(x, f);
            EXPECT(got == want, "%s: %.9g -> 0x%02x, nearest is 0x%02x", cai_fp8_format_name(f), (double)x, got, want);
        }
    }
}
END_TEST

START_TEST(scaling_recipes) {
    /* scale = fp8_max / amax / 2^margin */
    ck_assert(cai_fp8_scale_from_amax(2.0f, CAI_FP8_E4M3, 0, 5) == 224.0f);
    ck_assert(cai_fp8_scale_from_amax(2.0f, CAI_FP8_E4M3, 1, 5) == 112.0f);
    ck_assert(cai_fp8_scale_from_amax(8.0f, CAI_FP8_E5M2, 2, 5) == 57344.0f / 8 / 4);
    ck_assert(cai_fp8_scale_from_amax(0.0f, CAI_FP8_E4M3, 0, 5) == 5.0f);
    ck_assert(cai_fp8_scale_from_amax(INFINITY, CAI_FP8_E4M3, 0, 5) == 5.0f);
    ck_assert(cai_fp8_scale_from_amax(NAN, CAI_FP8_E4M3, 0, 5) == 5.0f);
    ck_assert(cai_fp8_scale_from_amax(1e-40f, CAI_FP8_E4M3, 0, 5) == 5.0f); /* quotient overflows */

    /* delayed scaling, history 3: max over the window, newest first */
    enum { H = 3 };
    float m[CAI_FP8_META_LEN(H)] = {0};
    float amax[] = {4.0f, 1.0f, 2.0f, 0.5f, 0.25f};
    float want_max[] = {112.0f, 112.0f, 112.0f, 224.0f, 448.0f / 2};
    float want_recent[] = {112.0f, 448.0f, 224.0f, 896.0f, 1792.0f};
    for (int algo = 0; algo < 2; algo++) {
        memset(m, 0, sizeof m);
        for (int s = 0; s < 5; s++) {
            m[CAI_FP8_META_AMAX] = amax[s];
            cai_fp8_meta_update(m, H, CAI_FP8_E4M3, (cai_fp8_amax_algo)algo, 0);
            float want = algo == CAI_FP8_AMAX_MAX ? want_max[s] : want_recent[s];
            ck_assert_msg(m[CAI_FP8_META_SCALE] == want, "algo %d step %d: scale %g, expected %g", algo, s,
                          (double)m[CAI_FP8_META_SCALE], (double)want);
            ck_assert(m[CAI_FP8_META_SCALE_INV] == 1.0f / want);
            ck_assert(m[CAI_FP8_META_AMAX] == 0.0f && m[CAI_FP8_META_AMAX + 1] == amax[s]);
            if (s >= 1) ck_assert(m[CAI_FP8_META_AMAX + 2] == amax[s - 1]);
        }
    }
    /* an empty history keeps the scale it had (0: none yet) */
    memset(m, 0, sizeof m);
    cai_fp8_meta_update(m, H, CAI_FP8_E5M2, CAI_FP8_AMAX_MAX, 0);
    ck_assert(m[CAI_FP8_META_SCALE] == 0.0f && m[CAI_FP8_META_SCALE_INV] == 0.0f);
    ck_assert_str_eq(cai_fp8_format_name(CAI_FP8_E5M2), "e5m2");
}
END_TEST

static cai_tensor t2(cai_device_t *dev, void *p, cai_dtype dt, int64_t r, int64_t c) {
    return cai_tensor_2d(dev, p, dt, r, c);
}

START_TEST(cast_op_current_and_delayed) {
    cai_device_t *dev = test_device(2);
    ck_assert_ptr_nonnull(dev);
    const int64_t R = 37, C = 29;
    double *xd = drandn(R * C, 1, 3.0);
    float *x = to_f(xd, R * C);
    uint8_t *q = malloc((size_t)(R * C)), *qt = malloc((size_t)(R * C)), *ref = malloc((size_t)(R * C));
    float meta[CAI_FP8_META_LEN(4)] = {0};
    cai_tensor X = t2(dev, x, CAI_DTYPE_F32, R, C), Q = t2(dev, q, CAI_DTYPE_U8, R, C),
               QT = t2(dev, qt, CAI_DTYPE_U8, C, R), M = cai_tensor_1d(dev, meta, CAI_DTYPE_F32, 6);
    /* scale 0: the first cast scales from this tensor's amax */
    ASSERT_OK(dev->ops->fp8_cast(dev, &Q, &QT, &X, &M, CAI_FP8_E4M3, 0, 1));
    float amax = cai_fp8_quantize_host(NULL, x, (size_t)(R * C), 1, CAI_FP8_E4M3);
    ck_assert(meta[CAI_FP8_META_SCALE] == 448.0f / amax / 2 &&
              meta[CAI_FP8_META_SCALE_INV] == 1.0f / meta[CAI_FP8_META_SCALE] && meta[2] == amax);
    cai_fp8_quantize_host(ref, x, (size_t)(R * C), meta[CAI_FP8_META_SCALE], CAI_FP8_E4M3);
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) ck_assert(q[i * C + j] == ref[i * C + j] && qt[j * R + i] == ref[i * C + j]);
    /* delayed: the given scale, the amax only recorded (running max) */
    meta[CAI_FP8_META_SCALE] = 3.0f;
    meta[CAI_FP8_META_SCALE_INV] = 1.0f / 3;
    meta[2] = 100.0f;
    ASSERT_OK(dev->ops->fp8_cast(dev, &Q, NULL, &X, &M, CAI_FP8_E5M2, 0, 0));
    ck_assert(meta[CAI_FP8_META_SCALE] == 3.0f && meta[2] == 100.0f);
    cai_fp8_quantize_host(ref, x, (size_t)(R * C), 3.0f, CAI_FP8_E5M2);
    ck_assert(memcmp(q, ref, (size_t)(R * C)) == 0);
    meta[2] = 0.0f;
    ASSERT_OK(dev->ops->fp8_cast(dev, NULL, NULL, &X, &M, CAI_FP8_E5M2, 0, 0));
    ck_assert(meta[2] == amax && meta[CAI_FP8_META_SCALE] == 3.0f);
    /* current: rescaled every call */
    ASSERT_OK(dev->ops->fp8_cast(dev, &Q, NULL, &X, &M, CAI_FP8_E5M2, 1, 0));
    ck_assert(meta[CAI_FP8_META_SCALE] == 57344.0f / amax);
    /* saturation: a delayed scale too large for this tensor clips to +-max */
    meta[CAI_FP8_META_SCALE] = 1e6f;
    ASSERT_OK(dev->ops->fp8_cast(dev, &Q, NULL, &X, &M, CAI_FP8_E4M3, 0, 0));
    for (int64_t i = 0; i < R * C; i++)
        if (fabsf(x[i]) * 1e6f > 464.0f) ck_assert_int_eq(q[i] & 0x7f, 0x7e);
    /* bad arguments name the op and the argument */
    cai_tensor Qbad = t2(dev, q, CAI_DTYPE_U8, C, R);
    ck_assert_int_eq(dev->ops->fp8_cast(dev, &Qbad, NULL, &X, &M, CAI_FP8_E4M3, 0, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "fp8_cast: q"));
    cai_tensor Mshort = cai_tensor_1d(dev, meta, CAI_DTYPE_F32, 2);
    ck_assert_int_eq(dev->ops->fp8_cast(dev, &Q, NULL, &X, &Mshort, CAI_FP8_E4M3, 0, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "meta"));
    ck_assert_int_eq(dev->ops->fp8_cast(dev, &Q, NULL, &X, &M, (cai_fp8_format)7, 0, 0), CAI_ERR_INVALID_ARG);
    free(q);
    free(qt);
    free(ref);
    free(x);
    free(xd);
    cai_device_free(dev);
}
END_TEST

/* FP8 products against the exact f64 product of the unquantised inputs,
 * within the bound their quantisation implies: each input is off by at
 * most half an ulp of its format relative (2^-4 E4M3, 2^-3 E5M2) plus half
 * the smallest subnormal divided by its scale, and the f32 accumulation
 * adds K * 2^-24 of sum |a b|. */
static void gemm_case(cai_device_t *dev, int64_t M, int64_t N, int64_t K, cai_fp8_format fa, cai_fp8_format fb,
                      double sa_scale, double sb_scale, float beta, double *worst_ratio) {
    double *ad = drandn(M * K, 11, sa_scale), *bd = drandn(N * K, 12, sb_scale), *cd = drandn(M * N, 13, 1.0);
    float *a = to_f(ad, M * K), *b = to_f(bd, N * K), *c = to_f(cd, M * N);
    uint8_t *qa = malloc((size_t)(M * K)), *qb = malloc((size_t)(N * K));
    float ma[CAI_FP8_META_LEN(1)] = {0}, mb[CAI_FP8_META_LEN(1)] = {0};
    cai_tensor A = t2(dev, a, CAI_DTYPE_F32, M, K), B = t2(dev, b, CAI_DTYPE_F32, N, K),
               QA = t2(dev, qa, CAI_DTYPE_U8, M, K), QB = t2(dev, qb, CAI_DTYPE_U8, N, K),
               MA = cai_tensor_1d(dev, ma, CAI_DTYPE_F32, 3), MB = cai_tensor_1d(dev, mb, CAI_DTYPE_F32, 3),
               Ct = t2(dev, c, CAI_DTYPE_F32, M, N);
    ASSERT_OK(dev->ops->fp8_cast(dev, &QA, NULL, &A, &MA, fa, 1, 0));
    ASSERT_OK(dev->ops->fp8_cast(dev, &QB, NULL, &B, &MB, fb, 1, 0));
    size_t ws_bytes = dev->ops->fp8_gemm_workspace_bytes(dev, M, N, K);
    void *ws = malloc(ws_bytes);
    ASSERT_OK(dev->ops->fp8_gemm(dev, &Ct, &QA, fa, &MA, &QB, fb, &MB, beta, NULL, ws, ws_bytes));
    const double ua = fa == CAI_FP8_E4M3 ? 1.0 / 16 : 1.0 / 8, ub = fb == CAI_FP8_E4M3 ? 1.0 / 16 : 1.0 / 8;
    const double ea = cai_fp8_to_f32(1, fa) / 2 / ma[CAI_FP8_META_SCALE],
                 eb = cai_fp8_to_f32(1, fb) / 2 / mb[CAI_FP8_META_SCALE];
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double exact = 0, bound = 0, mag = 0, deq = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = ad[i * K + k], y = bd[j * K + k];
                double dx = ua * fabs(x) + ea, dy = ub * fabs(y) + eb;
                exact += x * y;
                bound += dx * (fabs(y) + dy) + fabs(x) * dy;
                double xq = cai_fp8_to_f32(qa[i * K + k], fa), yq = cai_fp8_to_f32(qb[j * K + k], fb);
                deq += xq * yq;
                mag += fabs(xq * yq);
            }
            deq = deq * ma[CAI_FP8_META_SCALE_INV] * mb[CAI_FP8_META_SCALE_INV] + beta * cd[i * N + j];
            exact += beta * cd[i * N + j];
            double got = c[i * N + j],
                   f32_slack =
                       (double)K * ldexp(1, -23) * mag * ma[CAI_FP8_META_SCALE_INV] * mb[CAI_FP8_META_SCALE_INV] + 1e-6;
            /* the emulation is exactly the product of the decoded codes, up to f32 rounding */
            EXPECT(fabs(got - deq) <= f32_slack, "[%ld,%ld]: %g vs dequantised %g", (long)i, (long)j, got, deq);
            double err = fabs(got - exact), lim = bound + f32_slack;
            EXPECT(err <= lim, "[%ld,%ld]: %g vs exact %g: error %g above the bound %g", (long)i, (long)j, got, exact,
                   err, lim);
            if (bound > 0 && err / lim > *worst_ratio) *worst_ratio = err / lim;
        }
    free(ws);
    free(qa);
    free(qb);
    free(a);
    free(b);
    free(c);
    free(ad);
    free(bd);
    free(cd);
}

/* The receiving side of an FP8 reduction: each sender's codes decoded,
 * times its 1/scale, summed over the senders in order (products and sums
 * rounded apart) onto y or 0; a sender whose cast saw a non-finite amax
 * makes the sum NaN; bad arguments are refused naming them. */
START_TEST(dequant_sum_decodes_and_adds_in_order) {
    cai_device_t *dev = test_device(2);
    ck_assert_ptr_nonnull(dev);
    enum { S = 3, N = 101, STRIDE = 4 };
    uint8_t q[S * N];
    float metas[S * STRIDE] = {0}, y[N], y0[N];
    for (int s = 0; s < S; s++) {
        metas[s * STRIDE + CAI_FP8_META_SCALE_INV] = 0.125f * (float)(s + 1);
        metas[s * STRIDE + CAI_FP8_META_AMAX] = 1.0f;
        for (int i = 0; i < N; i++) q[s * N + i] = (uint8_t)((i * 7 + s * 31) % 251); /* no NaN code below 0x7c */
    }
    for (int i = 0; i < N; i++) y0[i] = 0.5f * (float)i - 3.0f;
    for (int f = 0; f < 2; f++)
        for (int beta = 0; beta <= 1; beta++) {
            memcpy(y, y0, sizeof y);
            cai_tensor Y = cai_tensor_1d(dev, y, CAI_DTYPE_F32, N), Q = t2(dev, q, CAI_DTYPE_U8, S, N),
                       M = cai_tensor_1d(dev, metas, CAI_DTYPE_F32, S * STRIDE);
            ASSERT_OK(dev->ops->fp8_dequant_sum(dev, &Y, &Q, &M, STRIDE, FMTS[f], (float)beta));
            for (int i = 0; i < N; i++) {
                float want = beta ? y0[i] : 0.0f;
                for (int s = 0; s < S; s++) {
                    const float p = cai_fp8_to_f32(q[s * N + i], FMTS[f]) * metas[s * STRIDE];
                    want = want + p;
                }
                ck_assert_msg(memcmp(&want, &y[i], sizeof want) == 0 || (isnan(want) && isnan(y[i])),
                              "fmt %d beta %d element %d: %g, not %g", f, beta, i, (double)y[i], (double)want);
            }
        }
    /* an overflow on one sender: NaN everywhere */
    metas[1 * STRIDE + CAI_FP8_META_AMAX] = INFINITY;
    cai_tensor Y = cai_tensor_1d(dev, y, CAI_DTYPE_F32, N), Q = t2(dev, q, CAI_DTYPE_U8, S, N),
               M = cai_tensor_1d(dev, metas, CAI_DTYPE_F32, S * STRIDE);
    ASSERT_OK(dev->ops->fp8_dequant_sum(dev, &Y, &Q, &M, STRIDE, CAI_FP8_E5M2, 0.0f));
    for (int i = 0; i < N; i++) ck_assert(isnan(y[i]));
    /* refused: a stride that is no multiple of 4, beta 2, too few metas */
    ck_assert_int_eq(dev->ops->fp8_dequant_sum(dev, &Y, &Q, &M, 3, CAI_FP8_E5M2, 0.0f), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "stride 3"));
    cai_error_clear();
    ck_assert_int_eq(dev->ops->fp8_dequant_sum(dev, &Y, &Q, &M, STRIDE, CAI_FP8_E5M2, 2.0f), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "beta"));
    cai_error_clear();
    cai_tensor M2 = cai_tensor_1d(dev, metas, CAI_DTYPE_F32, S * STRIDE - 4);
    ck_assert_int_eq(dev->ops->fp8_dequant_sum(dev, &Y, &Q, &M2, STRIDE, CAI_FP8_E5M2, 0.0f), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "metas"));
    cai_error_clear();
    cai_device_free(dev);
}
END_TEST

START_TEST(gemm_within_scale_bound) {
    cai_device_t *dev = test_device(2);
    ck_assert_ptr_nonnull(dev);
    double worst = 0;
    gemm_case(dev, 32, 48, 64, CAI_FP8_E4M3, CAI_FP8_E4M3, 1.0, 0.02, 0.0f, &worst);
    gemm_case(dev, 17, 9, 33, CAI_FP8_E5M2, CAI_FP8_E4M3, 1e-4, 3.0, 1.0f, &worst);
    gemm_case(dev, 64, 16, 128, CAI_FP8_E4M3, CAI_FP8_E5M2, 50.0, 1e-3, 0.0f, &worst);
    printf("fp8_gemm: largest error / bound %.3f\n", worst);
    ck_assert(worst < 1.0);

    /* bad calls */
    uint8_t q[64] = {0};
    float c[64], meta[3] = {1, 1, 0}, ws[256];
    cai_tensor A = t2(dev, q, CAI_DTYPE_U8, 4, 16), B = t2(dev, q, CAI_DTYPE_U8, 4, 16),
               C = t2(dev, c, CAI_DTYPE_F32, 4, 4), Mt = cai_tensor_1d(dev, meta, CAI_DTYPE_F32, 3);
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, CAI_FP8_E5M2, &Mt, &B, CAI_FP8_E5M2, &Mt, 0, NULL, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "both E5M2"));
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, CAI_FP8_E4M3, &Mt, &B, CAI_FP8_E5M2, &Mt, 0, NULL, ws, 16),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "workspace"));
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, CAI_FP8_E4M3, &Mt, &B, CAI_FP8_E4M3, &Mt, 0.5f, NULL, ws,
                                        sizeof ws),
                     CAI_ERR_INVALID_ARG);
    cai_tensor Bw = t2(dev, q, CAI_DTYPE_U8, 2, 32);
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, CAI_FP8_E4M3, &Mt, &Bw, CAI_FP8_E4M3, &Mt, 0, NULL, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "fp8_gemm: b"));
    cai_tensor Af = t2(dev, c, CAI_DTYPE_F32, 4, 16);
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &Af, CAI_FP8_E4M3, &Mt, &B, CAI_FP8_E4M3, &Mt, 0, NULL, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    cai_device_free(dev);
}
END_TEST

/* The epilogue equals the product followed by the separate ops; misuse is
 * refused naming the epilogue's part. */
START_TEST(gemm_epilogues_equal_the_separate_ops) {
    cai_device_t *dev = test_device(2);
    ck_assert_ptr_nonnull(dev);
    enum { M = 8, N = 16, K = 32 };
    uint8_t qa[M * K], qb[N * K];
    for (int i = 0; i < M * K; i++) qa[i] = (uint8_t)((i * 37 + 11) % 120);
    for (int i = 0; i < N * K; i++) qb[i] = (uint8_t)((i * 53 + 5) % 120) | (i % 3 ? 0x80 : 0);
    float meta[3] = {0.5f, 2.0f, 0}, ws[(M + N) * K], res[M * N], bias[N], pre[M * N];
    for (int i = 0; i < M * N; i++) res[i] = (float)(i % 7) - 3.0f, pre[i] = 0.25f * (float)(i % 13) - 1.5f;
    for (int i = 0; i < N; i++) bias[i] = 0.1f * (float)i - 0.8f;
    float c[M * N], ref[M * N], aux[M * N], ref_aux[M * N];
    cai_tensor A = t2(dev, qa, CAI_DTYPE_U8, M, K), B = t2(dev, qb, CAI_DTYPE_U8, N, K),
               Mt = cai_tensor_1d(dev, meta, CAI_DTYPE_F32, 3), C = t2(dev, c, CAI_DTYPE_F32, M, N),
               Rf = t2(dev, ref, CAI_DTYPE_F32, M, N), R = t2(dev, res, CAI_DTYPE_F32, M, N),
               Bias = cai_tensor_1d(dev, bias, CAI_DTYPE_F32, N), Aux = t2(dev, aux, CAI_DTYPE_F32, M, N),
               RAux = t2(dev, ref_aux, CAI_DTYPE_F32, M, N), P = t2(dev, pre, CAI_DTYPE_F32, M, N);
    const cai_fp8_format E4 = CAI_FP8_E4M3;
    /* bias + a residual in its own buffer */
    cai_fp8_epilogue ep = {.c_in = &R, .bias = &Bias};
    ASSERT_OK(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 1.0f, &ep, ws, sizeof ws));
    ASSERT_OK(dev->ops->copy(dev, &Rf, &R));
    ASSERT_OK(dev->ops->fp8_gemm(dev, &Rf, &A, E4, &Mt, &B, E4, &Mt, 1.0f, NULL, ws, sizeof ws));
    ASSERT_OK(dev->ops->bias_add(dev, &Rf, &Bias));
    ck_assert(memcmp(c, ref, sizeof c) == 0);
    /* GELU: aux keeps the pre-activation */
    ep = (cai_fp8_epilogue){.bias = &Bias, .act = CAI_FP8_ACT_GELU, .aux = &Aux};
    ASSERT_OK(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 0.0f, &ep, ws, sizeof ws));
    ASSERT_OK(dev->ops->fp8_gemm(dev, &RAux, &A, E4, &Mt, &B, E4, &Mt, 0.0f, NULL, ws, sizeof ws));
    ASSERT_OK(dev->ops->bias_add(dev, &RAux, &Bias));
    ASSERT_OK(dev->ops->gelu_fwd(dev, &Rf, &RAux));
    ck_assert(memcmp(c, ref, sizeof c) == 0 && memcmp(aux, ref_aux, sizeof aux) == 0);
    /* GELU's gradient from a kept pre-activation */
    ep = (cai_fp8_epilogue){.act = CAI_FP8_ACT_DGELU, .aux = &P};
    ASSERT_OK(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 0.0f, &ep, ws, sizeof ws));
    ASSERT_OK(dev->ops->fp8_gemm(dev, &Rf, &A, E4, &Mt, &B, E4, &Mt, 0.0f, NULL, ws, sizeof ws));
    ASSERT_OK(dev->ops->gelu_bwd(dev, &Rf, &P, &Rf));
    ck_assert(memcmp(c, ref, sizeof c) == 0);
    /* refused: a DGELU with a bias, a GELU without aux or with beta 1, a c_in of another shape */
    ep = (cai_fp8_epilogue){.bias = &Bias, .act = CAI_FP8_ACT_DGELU, .aux = &P};
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 0.0f, &ep, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no bias"));
    ep = (cai_fp8_epilogue){.act = CAI_FP8_ACT_GELU};
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 0.0f, &ep, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "needs aux"));
    ep = (cai_fp8_epilogue){.act = CAI_FP8_ACT_GELU, .aux = &Aux};
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 1.0f, &ep, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "no c_in or beta"));
    cai_tensor Rs = t2(dev, res, CAI_DTYPE_F32, M / 2, N);
    ep = (cai_fp8_epilogue){.c_in = &Rs};
    ck_assert_int_eq(dev->ops->fp8_gemm(dev, &C, &A, E4, &Mt, &B, E4, &Mt, 1.0f, &ep, ws, sizeof ws),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "epilogue c_in"));
    cai_device_free(dev);
}
END_TEST

static Suite *fp8_suite(void) {
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_code_decodes_and_round_trips);
    tcase_add_test(tc, ties_go_to_even_and_saturate);
    tcase_add_test(tc, matches_nearest_value_reference);
    tcase_add_test(tc, scaling_recipes);
    tcase_add_test(tc, cast_op_current_and_delayed);
    tcase_add_test(tc, dequant_sum_decodes_and_adds_in_order);
    tcase_add_test(tc, gemm_within_scale_bound);
    tcase_add_test(tc, gemm_epilogues_equal_the_separate_ops);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    SRunner *sr = srunner_create(fp8_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
