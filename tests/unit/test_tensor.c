/* tensor module: bf16/f16 rounding against brute-force nearest-value
 * references, special values, stochastic rounding statistics, tensor views,
 * devices and the copy ops. */
#include "cai_config.h"
#include "colossal/ops.h"
#include "colossal/tensor.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops_util.h"

static int is_nan_f(float f) { return f != f; }

/* ---------------------------------------------------------------- references */

/* Value of a bf16 pattern computed without bit tricks. */
static double bf16_value_ref(uint16_t h) {
    int sign = h >> 15, e = (h >> 7) & 0xff, m = h & 0x7f;
    double v;
    if (e == 0xff) return m ? NAN : (sign ? -INFINITY : INFINITY);
    if (e == 0) v = ldexp((double)m, -126 - 7);
    else v = ldexp(1.0 + m / 128.0, e - 127);
    return sign ? -v : v;
}

static double f16_value_ref(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v;
    if (e == 0x1f) return m ? NAN : (sign ? -INFINITY : INFINITY);
    if (e == 0) v = ldexp((double)m, -24);
    else v = ldexp(1.0 + m / 1024.0, e - 15);
    return sign ? -v : v;
}

/* Nearest representable pattern among the non-negative finite values of a
 * 16-bit format, whose values increase with the pattern: binary search, then
 * compare neighbours; ties go to the even pattern. `inf_pattern` stands in
 * as the value 2^emax+1 so that overflow rounds like IEEE (to infinity at and
 * beyond the midpoint). */
static uint16_t nearest_ref(double ax, double (*decode)(uint16_t), uint16_t max_finite, uint16_t inf_pattern,
                            double inf_value) {
    /* decoded values of the non-negative patterns, cached per format */
    static double tabs[2][0x8000];
    static double (*owner[2])(uint16_t);
    int which = decode == bf16_value_ref;
    if (owner[which] != decode) {
        for (unsigned i = 0; i < 0x8000; i++) tabs[which][i] = decode((uint16_t)i);
        owner[which] = decode;
    }
    const double *tab = tabs[which];
#define value(h) tab[h]
    unsigned lo = 0, hi = max_finite;
    if (ax >= value(max_finite)) {
        double a = value(max_finite);
        if (ax - a < inf_value - ax) return max_finite;
        if (ax - a > inf_value - ax) return inf_pattern;
        return (max_finite & 1) ? inf_pattern : max_finite;
    }
    while (hi - lo > 1) {
        unsigned mid = (lo + hi) / 2;
        if (value((uint16_t)mid) <= ax) lo = mid;
        else hi = mid;
    }
    double dl = ax - value((uint16_t)lo), dh = value((uint16_t)hi) - ax;
    if (dl < dh) return (uint16_t)lo;
    if (dh < dl) return (uint16_t)hi;
    return (lo & 1) ? (uint16_t)hi : (uint16_t)lo;
#undef value
}

static uint16_t bf16_ref(float f) {
    double x = f;
    uint16_t s = signbit(f) ? 0x8000 : 0;
    return s | nearest_ref(fabs(x), bf16_value_ref, 0x7f7f, 0x7f80, ldexp(1.0, 128));
}

static uint16_t f16_ref(float f) {
    double x = f;
    uint16_t s = signbit(f) ? 0x8000 : 0;
    return s | nearest_ref(fabs(x), f16_value_ref, 0x7bff, 0x7c00, 65536.0);
}

/* ---------------------------------------------------------------- bf16 */

START_TEST(bf16_rne_ties_and_specials) {
    /* 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even
     * mantissa (1.0); 1 + 3*2^-8 lies between odd 1+2^-7 and even 1+2^-6. */
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x3f808000u)), 0x3f80);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x3f818000u)), 0x3f82);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x3f808001u)), 0x3f81);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x3f817fffu)), 0x3f81);
    ck_assert_uint_eq(cai_f32_to_bf16(-0.0f), 0x8000);
    ck_assert_uint_eq(cai_f32_to_bf16(INFINITY), 0x7f80);
    ck_assert_uint_eq(cai_f32_to_bf16(-INFINITY), 0xff80);
    /* The largest f32 is past the midpoint between bf16's max and 2^128. */
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x7f7fffffu)), 0x7f80);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x7f7f7fffu)), 0x7f7f);
    /* A signalling NaN whose payload sits in the low bits would truncate to
     * infinity: it must stay a NaN, with its sign. */
    uint16_t n = cai_f32_to_bf16(cai_bits_f32(0x7f800001u));
    ck_assert(is_nan_f(cai_bf16_to_f32(n)));
    n = cai_f32_to_bf16(cai_bits_f32(0xffc00000u));
    ck_assert(is_nan_f(cai_bf16_to_f32(n)) && (n & 0x8000));
    /* Subnormals: f32 subnormal halfway between two bf16 subnormals. */
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x00018000u)), 0x0002);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x00008000u)), 0x0000);
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x00008001u)), 0x0001);
    /* Rounding up from the largest subnormal gives the smallest normal. */
    ck_assert_uint_eq(cai_f32_to_bf16(cai_bits_f32(0x007fffffu)), 0x0080);
}
END_TEST

START_TEST(bf16_all_patterns_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cai_bf16_to_f32((uint16_t)h);
        double ref = bf16_value_ref((uint16_t)h);
        if (ref != ref) {
            EXPECT(is_nan_f(f), "%s", "is_nan_f(f)");
            uint16_t back = cai_f32_to_bf16(f);
            EXPECT(is_nan_f(cai_bf16_to_f32(back)), "%s", "is_nan_f(cai_bf16_to_f32(back))");
            EXPECT((back & 0x8000) == (h & 0x8000), "%s", "back & 0x8000 == h & 0x8000");
            continue;
        }
        EXPECT((double)f == ref, "bf16 0x%04x decodes to %a, expected %a", h, (double)f, ref);
        EXPECT(cai_f32_to_bf16(f) == h, "bf16 0x%04x does not round-trip", h);
    }
}
END_TEST

START_TEST(bf16_matches_nearest_reference) {
    /* Random f32 bit patterns across the whole range, plus exact ties. */
    for (uint64_t i = 0; i < 120000; i++) {
        cai_philox_block b = cai_philox4x32(7, 1, i);
        uint32_t x = b.v[0];
        if (i % 3 == 0) x = (x & 0xffff0000u) | 0x8000u; /* exact tie */
        float f = cai_bits_f32(x);
        if (is_nan_f(f)) continue;
        uint16_t got = cai_f32_to_bf16(f), want = bf16_ref(f);
        EXPECT(got == want, "f32 0x%08x -> bf16 0x%04x, nearest-even is 0x%04x", x, got, want);
    }
}
END_TEST

/* ---------------------------------------------------------------- f16 */

START_TEST(f16_all_patterns_round_trip) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = cai_f16_to_f32((uint16_t)h);
        double ref = f16_value_ref((uint16_t)h);
        if (ref != ref) {
            EXPECT(is_nan_f(f), "%s", "is_nan_f(f)");
            uint16_t back = cai_f32_to_f16(f);
            EXPECT(is_nan_f(cai_f16_to_f32(back)), "%s", "is_nan_f(cai_f16_to_f32(back))");
            EXPECT((back & 0x8000) == (h & 0x8000), "%s", "back & 0x8000 == h & 0x8000");
            continue;
        }
        EXPECT((double)f == ref, "f16 0x%04x decodes to %a, expected %a", h, (double)f, ref);
        EXPECT(cai_f32_to_f16(f) == h, "f16 0x%04x does not round-trip", h);
    }
}
END_TEST

START_TEST(f16_rne_ties_specials_subnormals) {
    ck_assert_uint_eq(cai_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);     /* tie -> even */
    ck_assert_uint_eq(cai_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02); /* tie -> even */
    ck_assert_uint_eq(cai_f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(cai_f32_to_f16(65519.99f), 0x7bff);
    ck_assert_uint_eq(cai_f32_to_f16(65520.0f), 0x7c00); /* midpoint to 2^16: even is infinity */
    ck_assert_uint_eq(cai_f32_to_f16(1e10f), 0x7c00);
    ck_assert_uint_eq(cai_f32_to_f16(-1e10f), 0xfc00);
    ck_assert_uint_eq(cai_f32_to_f16(ldexpf(1.0f, -24)), 0x0001); /* smallest subnormal */
    ck_assert_uint_eq(cai_f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* tie with 0 -> 0 */
    ck_assert_uint_eq(cai_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    ck_assert_uint_eq(cai_f32_to_f16(ldexpf(3.0f, -25)), 0x0002);         /* 1.5 units: tie -> 2 */
    ck_assert_uint_eq(cai_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400);      /* -> smallest normal */
    ck_assert_uint_eq(cai_f32_to_f16(cai_bits_f32(0x00000001u)), 0x0000); /* f32 subnormal */
    ck_assert_uint_eq(cai_f32_to_f16(-0.0f), 0x8000);
    ck_assert(is_nan_f(cai_f16_to_f32(cai_f32_to_f16(cai_bits_f32(0x7f800001u)))));
    ck_assert(is_nan_f(cai_f16_to_f32(cai_f32_to_f16(NAN))));
}
END_TEST

START_TEST(f16_matches_nearest_reference) {
    for (uint64_t i = 0; i < 120000; i++) {
        cai_philox_block b = cai_philox4x32(8, 2, i);
        /* Exponents concentrated on f16's range (subnormal to overflow). */
        int e = (int)(b.v[1] % 48) - 30;
        uint32_t x = (b.v[0] & 0x807fffffu) | ((uint32_t)(e + 127) << 23);
        if (i % 3 == 0) x = (x & ~0xfffu) | 0x1000u; /* many exact ties in the normal range */
        float f = cai_bits_f32(x);
        uint16_t got = cai_f32_to_f16(f), want = f16_ref(f);
        EXPECT(got == want, "f32 %a -> f16 0x%04x, nearest-even is 0x%04x", (double)f, got, want);
    }
}
END_TEST

/* ---------------------------------------------------------------- stochastic rounding */

static void sr_mean_check(float x, int f16) {
    const int n = 100000;
    double sum = 0.0;
    uint16_t lo = 0xffff, hi = 0;
    for (int i = 0; i < n; i++) {
        uint32_t r = cai_sr_bits(99, f16, (uint64_t)i);
        uint16_t h = f16 ? cai_f32_to_f16_sr(x, r) : cai_f32_to_bf16_sr(x, r);
        sum += f16 ? cai_f16_to_f32(h) : cai_bf16_to_f32(h);
        if ((h & 0x7fff) < lo) lo = h & 0x7fff;
        if ((h & 0x7fff) > hi) hi = h & 0x7fff;
    }
    /* Only the two neighbours ever appear... */
    ck_assert_msg(hi - lo <= 1, "stochastic rounding of %a produced patterns 0x%x..0x%x", (double)x, lo, hi);
    /* ...and their mean is x: the spread of a mean of n Bernoulli choices is
     * at most ulp / (2 sqrt(n)); allow 5 of those. */
    double ulp = f16 ? fabs((double)cai_f16_to_f32(hi) - cai_f16_to_f32(lo))
                     : fabs((double)cai_bf16_to_f32(hi) - cai_bf16_to_f32(lo));
    double mean = sum / n;
    ck_assert_msg(fabs(mean - x) <= 5 * ulp / (2 * sqrt(n)) + 1e-30, "SR mean %.9g for x = %.9g (ulp %.3g)", mean,
                  (double)x, ulp);
}

START_TEST(stochastic_rounding_is_unbiased) {
    sr_mean_check(1.0f + ldexpf(1.0f, -9), 0); /* 1/4 of a bf16 ulp */
    sr_mean_check(-3.14159265f, 0);
    sr_mean_check(1.0f + ldexpf(1.0f, -13) * 3, 1); /* 3/8 of an f16 ulp */
    sr_mean_check(ldexpf(0.3f, -24), 1);            /* below the smallest f16 subnormal */
    sr_mean_check(ldexpf(700.7f, -24), 1);          /* f16 subnormal range */
    sr_mean_check(cai_bits_f32(0x00012345u), 0);    /* f32 subnormal */
    /* Exactly representable values never move; specials stay special. */
    for (uint32_t r = 0; r < 1000; r++) {
        EXPECT((cai_f32_to_bf16_sr(1.5f, r * 2654435761u)) == (0x3fc0), "%s",
               "cai_f32_to_bf16_sr(1.5f, r * 2654435761u) == 0x3fc0");
        EXPECT((cai_f32_to_f16_sr(1.5f, r * 2654435761u)) == (0x3e00), "%s",
               "cai_f32_to_f16_sr(1.5f, r * 2654435761u) == 0x3e00");
        EXPECT((cai_f32_to_bf16_sr(INFINITY, r * 2654435761u)) == (0x7f80), "%s",
               "cai_f32_to_bf16_sr(INFINITY, r * 2654435761u) == 0x7f80");
        EXPECT(is_nan_f(cai_bf16_to_f32(cai_f32_to_bf16_sr(cai_bits_f32(0x7f800001u), r * 2654435761u))), "%s",
               "is_nan_f(cai_bf16_to_f32(cai_f32_to_bf16_sr(cai_bits_f32(0x7f800001u), r * 2654435761u)))");
        EXPECT(is_nan_f(cai_f16_to_f32(cai_f32_to_f16_sr(NAN, r))), "%s",
               "is_nan_f(cai_f16_to_f32(cai_f32_to_f16_sr(NAN, r)))");
    }
}
END_TEST

START_TEST(buffer_conversions_match_scalar_rules) {
    const size_t n = 1000;
    double *d = drandn((int64_t)n, 3, 100.0);
    float *f = to_f(d, (int64_t)n), *back = falloc((int64_t)n);
    uint16_t *b = calloc(n, 2), *h = calloc(n, 2), *hb = calloc(n, 2);
    ASSERT_OK(cai_convert_host(b, CAI_DTYPE_BF16, f, CAI_DTYPE_F32, n));
    ASSERT_OK(cai_convert_host(h, CAI_DTYPE_F16, f, CAI_DTYPE_F32, n));
    ASSERT_OK(cai_convert_host(hb, CAI_DTYPE_F16, b, CAI_DTYPE_BF16, n));
    for (size_t i = 0; i < n; i++) {
        EXPECT((b[i]) == (cai_f32_to_bf16(f[i])), "%s", "b[i] == cai_f32_to_bf16(f[i])");
        EXPECT((h[i]) == (cai_f32_to_f16(f[i])), "%s", "h[i] == cai_f32_to_f16(f[i])");
        EXPECT((hb[i]) == (cai_f32_to_f16(cai_bf16_to_f32(b[i]))), "%s",
               "hb[i] == cai_f32_to_f16(cai_bf16_to_f32(b[i]))");
    }
    ASSERT_OK(cai_convert_host(back, CAI_DTYPE_F32, h, CAI_DTYPE_F16, n));
    for (size_t i = 0; i < n; i++) EXPECT(back[i] == cai_f16_to_f32(h[i]), "%s", "back[i] == cai_f16_to_f32(h[i])");
    ck_assert_int_eq(cai_convert_host(b, CAI_DTYPE_I32, f, CAI_DTYPE_F32, n), CAI_ERR_UNSUPPORTED);

    /* Stochastic conversion depends only on global indices: converting the
     * buffer in two pieces with offsets gives the same bits. */
    uint16_t *s1 = calloc(n, 2), *s2 = calloc(n, 2);
    ASSERT_OK(cai_convert_host_sr(s1, CAI_DTYPE_BF16, f, n, 5, 6, 1000));
    ASSERT_OK(cai_convert_host_sr(s2, CAI_DTYPE_BF16, f, 333, 5, 6, 1000));
    ASSERT_OK(cai_convert_host_sr(s2 + 333, CAI_DTYPE_BF16, f + 333, n - 333, 5, 6, 1333));
    ck_assert_mem_eq(s1, s2, n * 2);
    for (size_t i = 0; i < n; i++)
        EXPECT(s1[i] == cai_f32_to_bf16_sr(f[i], cai_sr_bits(5, 6, 1000 + i)), "stochastic bf16 %zu differs", i);
    free(d);
    free(f);
    free(back);
    free(b);
    free(h);
    free(hb);
    free(s1);
    free(s2);
}
END_TEST

/* ---------------------------------------------------------------- views and devices */

START_TEST(tensor_views) {
    float buf[2 * 3 * 12];
    for (int i = 0; i < 72; i++) buf[i] = (float)i;
    cai_tensor t = cai_tensor_3d(NULL, buf, CAI_DTYPE_F32, 2, 3, 12), k, kh, tt, r;
    ck_assert(cai_tensor_is_contiguous(&t));
    ck_assert_int_eq(cai_tensor_numel(&t), 72);
    ck_assert_uint_eq(cai_tensor_nbytes(&t), 288);
    /* A K view out of a fused [B,T,3C] buffer, split into [B,T,H,D]. */
    ASSERT_OK(cai_tensor_narrow(&t, -1, 4, 4, &k));
    ck_assert(!cai_tensor_is_contiguous(&k));
    ASSERT_OK(cai_tensor_unflatten(&k, 2, 2, &kh));
    ck_assert_int_eq(kh.ndim, 4);
    ck_assert_int_eq(kh.shape[2], 2);
    ck_assert_int_eq(kh.stride[2], 2);
    ck_assert_int_eq(kh.stride[1], 12);
    /* element [1,2,1,1] = buf[1*36 + 2*12 + 4 + 1*2 + 1] */
    float *e = (float *)kh.data + 1 * kh.stride[0] + 2 * kh.stride[1] + 1 * kh.stride[2] + 1 * kh.stride[3];
    ck_assert(*e == 67.0f);
    ASSERT_OK(cai_tensor_transpose(&t, 0, 2, &tt));
    ck_assert_int_eq(tt.shape[0], 12);
    ck_assert_int_eq(tt.stride[0], 1);
    ASSERT_OK(cai_tensor_reshape(&t, 2, (int64_t[]){-1, 12}, &r));
    ck_assert_int_eq(r.shape[0], 6);
    ck_assert_int_eq(cai_tensor_reshape(&k, 1, (int64_t[]){24}, &r), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_tensor_reshape(&t, 2, (int64_t[]){7, -1}, &r), CAI_ERR_INVALID_ARG);
    ck_assert_int_eq(cai_tensor_narrow(&t, 1, 2, 2, &r), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "outside dimension 1 of size 3"));
    ck_assert_int_eq(cai_tensor_unflatten(&t, 2, 5, &r), CAI_ERR_INVALID_ARG);
    char d[128];
    ck_assert_str_eq(cai_tensor_describe(&t, d, sizeof d), "f32[2,3,12]");
    ck_assert_str_eq(cai_tensor_describe(&k, d, sizeof d), "f32[2,3,4] strides [36,12,1]");
    cai_error_clear();
}
END_TEST

START_TEST(devices_and_arenas) {
    cai_device_t *dev = test_device(2), *cuda = NULL;
    ck_assert_int_eq(dev->kind, CAI_DEVICE_HOST);
    ck_assert_int_eq(dev->num_threads, 2);
    ck_assert_ptr_nonnull(dev->ops);
    ck_assert_str_eq(dev->ops->backend, "cpu");
    ck_assert_int_eq(cai_device_init(&cuda, CAI_DEVICE_CUDA, 0, 0), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_null(cuda);

    cai_tensor t;
    ASSERT_OK(cai_tensor_alloc(&t, dev, CAI_DTYPE_BF16, 2, (int64_t[]){5, 7}, "test tensor"));
    ck_assert(t.owns_data);
    for (int i = 0; i < 35; i++) ck_assert_uint_eq(((uint16_t *)t.data)[i], 0);
    ASSERT_OK(dev->ops->fill(dev, &t, 1.5f));
    uint16_t host[35];
    ASSERT_OK(cai_device_copy(dev, host, t.data, sizeof host, CAI_COPY_D2H));
    for (int i = 0; i < 35; i++) ck_assert_uint_eq(host[i], 0x3fc0);
    ASSERT_OK(cai_device_sync(dev));
    cai_tensor_free(&t);
    ck_assert_ptr_null(t.data);

    cai_arena_t arena;
    ASSERT_OK(cai_device_arena_init(dev, &arena, 4096, "activations"));
    cai_tensor a, b;
    ASSERT_OK(cai_tensor_arena(&a, &arena, dev, CAI_DTYPE_F32, 2, (int64_t[]){10, 10}));
    ASSERT_OK(cai_tensor_arena(&b, &arena, dev, CAI_DTYPE_F32, 1, (int64_t[]){100}));
    ck_assert_int_eq((uintptr_t)b.data % 64, 0);
    ck_assert(!a.owns_data);
    ck_assert_int_eq(cai_tensor_arena(&b, &arena, dev, CAI_DTYPE_F32, 1, (int64_t[]){1000}), CAI_ERR_NOMEM);
    cai_device_arena_free(dev, &arena);
    cai_device_free(dev);
    cai_error_clear();
}
END_TEST

START_TEST(copy_converts_and_follows_strides) {
    cai_device_t *dev = test_device(2);
    enum { R = 5, C = 9 };
    double *d = drandn(R * C, 11, 3.0);
    float *src = to_f(d, R * C);
    /* transpose view [C,R] of src -> contiguous bf16 [C,R] -> f32 -> compare */
    cai_tensor s = cai_tensor_2d(dev, src, CAI_DTYPE_F32, R, C), st;
    ASSERT_OK(cai_tensor_transpose(&s, 0, 1, &st));
    uint16_t bf[R * C];
    float back[R * C];
    cai_tensor b = cai_tensor_2d(dev, bf, CAI_DTYPE_BF16, C, R), f = cai_tensor_2d(dev, back, CAI_DTYPE_F32, C, R);
    ASSERT_OK(dev->ops->copy(dev, &b, &st));
    ASSERT_OK(dev->ops->copy(dev, &f, &b));
    for (int i = 0; i < C; i++)
        for (int j = 0; j < R; j++) {
            ck_assert_uint_eq(bf[i * R + j], cai_f32_to_bf16(src[j * C + i]));
            ck_assert(back[i * R + j] == cai_bf16_to_f32(cai_f32_to_bf16(src[j * C + i])));
        }
    /* copy_sr over a narrowed view equals the host routine at global indices */
    cai_tensor sv, hv;
    uint16_t h16[R * 4];
    ASSERT_OK(cai_tensor_narrow(&s, 1, 2, 4, &sv));
    hv = cai_tensor_2d(dev, h16, CAI_DTYPE_F16, R, 4);
    ASSERT_OK(dev->ops->copy_sr(dev, &hv, &sv, 42, 3, 100));
    for (int i = 0; i < R; i++)
        for (int j = 0; j < 4; j++)
            ck_assert_uint_eq(h16[i * 4 + j],
                              cai_f32_to_f16_sr(src[i * C + 2 + j], cai_sr_bits(42, 3, 100 + (uint64_t)(i * 4 + j))));
    ck_assert_int_eq(dev->ops->copy(dev, &f, &s), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "copy: dst is f32[9,5] but src is f32[5,9]"));
    cai_error_clear();
    free(d);
    free(src);
    cai_device_free(dev);
}
END_TEST

static Suite *tensor_suite(void) {
    Suite *s = suite_create("tensor");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bf16_rne_ties_and_specials);
    tcase_add_test(tc, bf16_all_patterns_round_trip);
    tcase_add_test(tc, bf16_matches_nearest_reference);
    tcase_add_test(tc, f16_all_patterns_round_trip);
    tcase_add_test(tc, f16_rne_ties_specials_subnormals);
    tcase_add_test(tc, f16_matches_nearest_reference);
    tcase_add_test(tc, stochastic_rounding_is_unbiased);
    tcase_add_test(tc, buffer_conversions_match_scalar_rules);
    tcase_add_test(tc, tensor_views);
    tcase_add_test(tc, devices_and_arenas);
    tcase_add_test(tc, copy_converts_and_follows_strides);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    SRunner *sr = srunner_create(tensor_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    MPI_Finalize();
    return failed ? 1 : 0;
}
