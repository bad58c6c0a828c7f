/* CPU op table: moe_permute, moe_combine_fwd and moe_combine_bwd against
 * references written as the MoE layer's host loops. F32 must match them bit
 * for bit (the layer's results may not move when it switches to the ops);
 * BF16 and F16 must equal the same loops run on the decoded inputs, rounded
 * once to nearest even. Rows pos does not name keep a sentinel. Every case
 * runs on a 1-thread and a 3-thread device. grouped_linear_fwd/bwd equal a
 * linear_fwd/bwd per block. */
#include "cai_config.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops_util.h"

static cai_device_t *devs[2];
#define F32 CAI_DTYPE_F32
#define BF16 CAI_DTYPE_BF16
#define F16 CAI_DTYPE_F16

static const cai_dtype dtypes[3] = {F32, BF16, F16};
static const int ks[3] = {1, 2, 4};
enum { N = 7, C = 13, EXTRA = 3 };

static size_t esz(cai_dtype dt) { return dt == F32 ? 4 : 2; }

/* Random values of dtype dt (bytes) and the f32 values they hold. */
static void *rand_rows(int64_t n, uint64_t stream, cai_dtype dt, float *vals) {
    char *b = calloc((size_t)n, esz(dt));
    ck_assert_ptr_nonnull(b);
    for (int64_t i = 0; i < n; i++) {
        float v = cai_rng_normal(20261204, stream, (uint64_t)i);
        if (dt == BF16) {
            ((cai_bf16 *)(void *)b)[i] = cai_f32_to_bf16(v);
            v = cai_bf16_to_f32(((cai_bf16 *)(void *)b)[i]);
        } else if (dt == F16) {
            ((cai_f16 *)(void *)b)[i] = cai_f32_to_f16(v);
            v = cai_f16_to_f32(((cai_f16 *)(void *)b)[i]);
        } else {
            ((float *)(void *)b)[i] = v;
        }
        vals[i] = v;
    }
    return b;
}

/* f32 values encoded as dt (the op's single rounding on store). */
static void *encode(const float *v, int64_t n, cai_dtype dt) {
    char *b = calloc((size_t)n, esz(dt));
    ck_assert_ptr_nonnull(b);
    for (int64_t i = 0; i < n; i++) {
        if (dt == BF16) ((cai_bf16 *)(void *)b)[i] = cai_f32_to_bf16(v[i]);
        else if (dt == F16) ((cai_f16 *)(void *)b)[i] = cai_f32_to_f16(v[i]);
        else ((float *)(void *)b)[i] = v[i];
    }
    return b;
}

static void *sentinel_rows(int64_t n, cai_dtype dt) {
    unsigned char *b = malloc((size_t)n * esz(dt));
    ck_assert_ptr_nonnull(b);
    memset(b, 0xA5, (size_t)n * esz(dt));
    return b;
}

static int is_sentinel(const void *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)p)[i] != 0xA5) return 0;
    return 1;
}

/* pos for N tokens x k choices into S = N k + EXTRA rows: a shuffled
 * assignment with about one choice in four dropped (-1). */
static int32_t *make_pos(int k, uint64_t seed, int64_t *S) {
    const int64_t n = (int64_t)N * k, s = n + EXTRA;
    int32_t *perm = malloc((size_t)s * sizeof *perm), *pos = malloc((size_t)n * sizeof *pos);
    ck_assert(perm && pos);
    for (int64_t i = 0; i < s; i++) perm[i] = (int32_t)i;
    for (int64_t i = s - 1; i > 0; i--) {
        int64_t j = (int64_t)(cai_rng_uniform(seed, 1, (uint64_t)i) * (float)(i + 1));
        if (j > i) j = i;
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int dropped = 0;
    for (int64_t i = 0; i < n; i++) {
        pos[i] = cai_rng_uniform(seed, 2, (uint64_t)i) < 0.25f || i == 3 ? -1 : perm[i];
        dropped += pos[i] < 0;
    }
    ck_assert_int_gt(dropped, 0);
    free(perm);
    *S = s;
    return pos;
}

static int named(const int32_t *pos, int64_t n, int64_t r) {
    for (int64_t i = 0; i < n; i++)
        if (pos[i] == r) return 1;
    return 0;
}

/* ------------------------------------------------ the MoE layer's loops */

static void ref_combine_fwd(float *out, const float *sy, const int32_t *pos, const float *w, int k, int accum) {
    if (!accum) memset(out, 0, (size_t)(N * C) * sizeof(float));
    for (int64_t t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[t * k + j];
            if (r < 0) continue;
            const float *src = sy + (int64_t)r * C;
            float *dst = out + t * C;
            if (w) {
                const float wj = w[t * k + j];
                for (int64_t c = 0; c < C; c++) dst[c] += wj * src[c];
            } else {
                for (int64_t c = 0; c < C; c++) dst[c] += src[c];
            }
        }
}

static void ref_combine_bwd(float *ds, float *dw, const float *gy, const float *sy, const int32_t *pos, const float *w,
                            int k) {
    for (int64_t i = 0; i < (int64_t)N * k; i++) {
        const int32_t r = pos[i];
        const float *d = gy + (i / k) * C;
        double dot = 0.0;
        if (r >= 0) {
            const float *e = sy + (int64_t)r * C;
            float *o = ds + (int64_t)r * C;
            for (int64_t c = 0; c < C; c++) {
                o[c] = w[i] * d[c];
                dot += (double)d[c] * e[c];
            }
        }
        dw[i] = (float)dot;
    }
}

/* ----------------------------------------------------------------- tests */

/* Every (device, dtype, k) with `variants` values of v (accum, weighted bits). */
typedef void (*moe_case)(cai_device_t *dev, cai_dtype dt, int k, int v);
static void each_case(moe_case f, int variants) {
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 3; ti++)
            for (int ki = 0; ki < 3; ki++)
                for (int v = 0; v < variants; v++) f(devs[di], dtypes[ti], ks[ki], v);
}

static void permute_case(cai_device_t *dev, cai_dtype dt, int k, int v) {
    (void)v;
    int64_t S;
    int32_t *pos = make_pos(k, 100 + (uint64_t)k, &S);
    /* x is a view with a row stride of C + 2 (columns of a wider buffer) */
    float *xv = falloc(N * (C + 2));
    char *xb = rand_rows(N * (C + 2), 1, dt, xv), *xe = sentinel_rows(S * C, dt);
    cai_tensor xw = cai_tensor_2d(dev, xb, dt, N, C + 2), tx, txe = cai_tensor_2d(dev, xe, dt, S, C);
    cai_tensor tpos = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, (int64_t)N * k);
    ASSERT_OK(cai_tensor_narrow(&xw, 1, 1, C, &tx));
    ASSERT_OK(dev->ops->moe_permute(dev, &txe, &tx, &tpos));
    int copied = 0;
    for (int64_t i = 0; i < (int64_t)N * k; i++) {
        if (pos[i] < 0) continue;
        const char *src = xb + (size_t)((i / k) * (C + 2) + 1) * esz(dt);
        ck_assert_msg(!memcmp(xe + (size_t)pos[i] * C * esz(dt), src, (size_t)C * esz(dt)),
                      "dtype %d k %d: xe row %d is not x row %lld", (int)dt, k, pos[i], (long long)(i / k));
        copied++;
    }
    int untouched = 0;
    for (int64_t r = 0; r < S; r++)
        if (!named(pos, (int64_t)N * k, r)) {
            ck_assert_msg(is_sentinel(xe + (size_t)r * C * esz(dt), (size_t)C * esz(dt)),
                          "dtype %d k %d: xe row %lld is not named by pos but was written", (int)dt, k, (long long)r);
            untouched++;
        }
    ck_assert_int_eq(copied + untouched, S);
    ck_assert_int_ge(untouched, EXTRA + 1);
    free(pos);
    free(xv);
    free(xb);
    free(xe);
}

START_TEST(moe_permute_copies_named_rows_only) { each_case(permute_case, 1); }
END_TEST

static void combine_fwd_case(cai_device_t *dev, cai_dtype dt, int k, int v) {
    const int accum = v & 1, weighted = v >> 1;
    int64_t S;
    int32_t *pos = make_pos(k, 200 + (uint64_t)k, &S);
    float *yev = falloc(S * C), *yv = falloc(N * (C + 1)), *ref = falloc(N * C);
    float *w = falloc((int64_t)N * k);
    for (int64_t i = 0; i < (int64_t)N * k; i++) w[i] = cai_rng_uniform(20261204, 9, (uint64_t)i);
    char *ye = rand_rows(S * C, 3, dt, yev);
    /* y: rows of stride C + 1, its last column a pad the op must not write */
    char *y = rand_rows(N * (C + 1), 4, dt, yv);
    for (int64_t t = 0; t < N; t++) memcpy(ref + t * C, yv + t * (C + 1), C * sizeof(float));
    ref_combine_fwd(ref, yev, pos, weighted ? w : NULL, k, accum);
    char *want = encode(ref, N * C, dt);
    char *pad = malloc((size_t)N * esz(dt));
    ck_assert_ptr_nonnull(pad);
    for (int64_t t = 0; t < N; t++) memcpy(pad + t * esz(dt), y + (size_t)(t * (C + 1) + C) * esz(dt), esz(dt));
    cai_tensor yw = cai_tensor_2d(dev, y, dt, N, C + 1), ty;
    cai_tensor tye = cai_tensor_2d(dev, ye, dt, S, C);
    cai_tensor tpos = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, (int64_t)N * k);
    cai_tensor tw = cai_tensor_1d(dev, w, F32, (int64_t)N * k);
    ASSERT_OK(cai_tensor_narrow(&yw, 1, 0, C, &ty));
    ASSERT_OK(dev->ops->moe_combine_fwd(dev, &ty, &tye, &tpos, weighted ? &tw : NULL, accum));
    for (int64_t t = 0; t < N; t++) {
        const char *got = y + (size_t)t * (C + 1) * esz(dt);
        for (int64_t c = 0; c < C; c++)
            EXPECT(!memcmp(got + c * esz(dt), want + (size_t)(t * C + c) * esz(dt), esz(dt)),
                   "dtype %d k %d accum %d weighted %d: y[%lld,%lld] differs from the loop's "
                   "%.9g",
                   (int)dt, k, accum, weighted, (long long)t, (long long)c, (double)ref[t * C + c]);
        ck_assert(!memcmp(got + C * esz(dt), pad + t * esz(dt), esz(dt)));
    }
    /* a token whose choices were all dropped gets 0 (or keeps y) */
    if (k == 1 && !accum) {
        ck_assert_int_lt(pos[3], 0);
        ck_assert_float_eq(ref[3 * C], 0.0f);
    }
    free(pos);
    free(yev);
    free(yv);
    free(ref);
    free(w);
    free(ye);
    free(y);
    free(want);
    free(pad);
}

START_TEST(moe_combine_fwd_matches_layer_loop) { each_case(combine_fwd_case, 4); }
END_TEST

static void combine_bwd_case(cai_device_t *dev, cai_dtype dt, int k, int v) {
    (void)v;
    const int64_t n = (int64_t)N * k;
    int64_t S;
    int32_t *pos = make_pos(k, 300 + (uint64_t)k, &S);
    float *dyv = falloc(N * C), *yev = falloc(S * C), *ds = falloc(S * C), *dw_ref = falloc(n);
    float *w = falloc(n), *dw = falloc(n);
    for (int64_t i = 0; i < n; i++) {
        w[i] = cai_rng_uniform(20261204, 10, (uint64_t)i);
        dw[i] = 77.0f; /* dropped entries must be overwritten with 0 */
    }
    char *dy = rand_rows(N * C, 5, dt, dyv), *ye = rand_rows(S * C, 6, dt, yev);
    char *dye = sentinel_rows(S * C, dt);
    ref_combine_bwd(ds, dw_ref, dyv, yev, pos, w, k);
    char *want = encode(ds, S * C, dt);
    cai_tensor tdy = cai_tensor_2d(dev, dy, dt, N, C), tye = cai_tensor_2d(dev, ye, dt, S, C);
    cai_tensor tdye = cai_tensor_2d(dev, dye, dt, S, C);
    cai_tensor tpos = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, n);
    cai_tensor tw = cai_tensor_1d(dev, w, F32, n), tdw = cai_tensor_1d(dev, dw, F32, n);
    ASSERT_OK(dev->ops->moe_combine_bwd(dev, &tdye, &tdw, &tdy, &tye, &tpos, &tw));
    for (int64_t i = 0; i < n; i++) {
        ck_assert_msg(!memcmp(&dw[i], &dw_ref[i], sizeof(float)), "dtype %d k %d: dw[%lld] %.9g vs %.9g", (int)dt, k,
                      (long long)i, (double)dw[i], (double)dw_ref[i]);
        if (pos[i] < 0) ck_assert_float_eq(dw[i], 0.0f);
        else ck_assert_float_ne(dw[i], 0.0f);
    }
    for (int64_t r = 0; r < S; r++) {
        const size_t rb = (size_t)C * esz(dt);
        if (named(pos, n, r))
            ck_assert_msg(!memcmp(dye + r * rb, want + r * rb, rb),
                          "dtype %d k %d: dye row %lld differs from the loop's", (int)dt, k, (long long)r);
        else
            ck_assert_msg(is_sentinel(dye + r * rb, rb),
                          "dtype %d k %d: dye row %lld is not named by pos but was written", (int)dt, k, (long long)r);
    }
    free(pos);
    free(dyv);
    free(yev);
    free(ds);
    free(dw_ref);
    free(w);
    free(dw);
    free(dy);
    free(ye);
    free(dye);
    free(want);
}

START_TEST(moe_combine_bwd_matches_layer_loop) { each_case(combine_bwd_case, 1); }
END_TEST

/* bf16 against the f32 path on the same (bf16-representable) inputs: the
 * only difference is the rounding on store, at most half a bf16 ulp. */
START_TEST(moe_combine_bf16_within_an_ulp_of_f32) {
    cai_device_t *dev = devs[1];
    const int k = 2;
    const int64_t n = (int64_t)N * k;
    int64_t S;
    int32_t *pos = make_pos(k, 400, &S);
    float *yev = falloc(S * C), *w = falloc(n), *y32 = falloc(N * C);
    cai_bf16 *ye = rand_rows(S * C, 7, BF16, yev), *y = calloc((size_t)(N * C), sizeof *y);
    ck_assert_ptr_nonnull(y);
    for (int64_t i = 0; i < n; i++) w[i] = cai_rng_uniform(20261204, 11, (uint64_t)i);
    cai_tensor tpos = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, n), tw = cai_tensor_1d(dev, w, F32, n);
    cai_tensor tye = cai_tensor_2d(dev, ye, BF16, S, C), ty = cai_tensor_2d(dev, y, BF16, N, C);
    cai_tensor tye32 = cai_tensor_2d(dev, yev, F32, S, C), ty32 = cai_tensor_2d(dev, y32, F32, N, C);
    ASSERT_OK(dev->ops->moe_combine_fwd(dev, &ty, &tye, &tpos, &tw, 0));
    ASSERT_OK(dev->ops->moe_combine_fwd(dev, &ty32, &tye32, &tpos, &tw, 0));
    int nonzero = 0;
    for (int64_t i = 0; i < N * C; i++) {
        const float got = cai_bf16_to_f32(y[i]), ulp = ldexpf(1.0f, ilogbf(y32[i]) - 7);
        EXPECT(fabsf(got - y32[i]) <= (y32[i] == 0.0f ? 0.0f : ulp), "y[%lld] bf16 %.9g vs f32 %.9g", (long long)i,
               (double)got, (double)y32[i]);
        nonzero += y32[i] != 0.0f;
    }
    ck_assert_int_gt(nonzero, N * C / 2);
    free(pos);
    free(yev);
    free(w);
    free(y32);
    free(ye);
    free(y);
}
END_TEST

START_TEST(moe_argument_errors_name_op_and_argument) {
    cai_device_t *dev = devs[0];
    const cai_ops *ops = dev->ops;
    float x[4 * 3] = {0}, xe[5 * 3] = {0}, ye[5 * 3] = {0}, w[8] = {0}, dw[8];
    uint16_t xb[5 * 3] = {0};
    int32_t pos[8] = {0, 1, 2, -1, 3, 4, -1, -1};
    float posf[8] = {0};
    cai_tensor tx = cai_tensor_2d(dev, x, F32, 4, 3), txe = cai_tensor_2d(dev, xe, F32, 5, 3);
    cai_tensor txb = cai_tensor_2d(dev, xb, BF16, 5, 3), tw = cai_tensor_1d(dev, w, F32, 8);
    cai_tensor tdw = cai_tensor_1d(dev, dw, F32, 8), tpos = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, 8);
    cai_tensor tye = cai_tensor_2d(dev, ye, F32, 5, 3);
    /* the valid call first, so each error below is down to one change */
    ASSERT_OK(ops->moe_permute(dev, &txe, &tx, &tpos));
    ASSERT_OK(ops->moe_combine_fwd(dev, &tx, &tye, &tpos, &tw, 1));
    ASSERT_OK(ops->moe_combine_bwd(dev, &txe, &tdw, &tx, &tye, &tpos, &tw));

    pos[4] = 5;
    ck_assert_int_eq(ops->moe_permute(dev, &txe, &tx, &tpos), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_permute: pos[4] = 5 is past xe's 5 rows");
    ck_assert_int_eq(ops->moe_combine_fwd(dev, &tx, &tye, &tpos, &tw, 0), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_combine_fwd: pos[4] = 5 is past ye's 5 rows");
    ck_assert_int_eq(ops->moe_combine_bwd(dev, &txe, &tdw, &tx, &tye, &tpos, &tw), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_combine_bwd: pos[4] = 5 is past dye's 5 rows");
    pos[4] = 1;
    ck_assert_int_eq(ops->moe_permute(dev, &txe, &tx, &tpos), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "moe_permute: pos[4] = 1 repeats an earlier entry; each kept choice needs its own row of xe");
    ck_assert_int_eq(ops->moe_combine_bwd(dev, &txe, &tdw, &tx, &tye, &tpos, &tw), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "moe_combine_bwd: pos[4] = 1 repeats an earlier entry"));
    /* reading the same grouped row twice is fine */
    ASSERT_OK(ops->moe_combine_fwd(dev, &tx, &tye, &tpos, &tw, 1));
    pos[4] = 3;

    ck_assert_int_eq(ops->moe_permute(dev, &txb, &tx, &tpos), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "moe_permute: xe is bf16[5,3] but x is f32[4,3]; the rows must be of one dtype");
    ck_assert_int_eq(ops->moe_combine_fwd(dev, &tx, &txb, &tpos, NULL, 0), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "moe_combine_fwd: ye is bf16[5,3] but y is f32[4,3]; the rows must be of one dtype");
    ck_assert_int_eq(ops->moe_combine_bwd(dev, &txb, &tdw, &tx, &tye, &tpos, &tw), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "moe_combine_bwd: dye is bf16[5,3] but dy is f32[4,3]; the rows must be of one dtype");

    cai_tensor tpos7 = cai_tensor_1d(dev, pos, CAI_DTYPE_I32, 7);
    ck_assert_int_eq(ops->moe_permute(dev, &txe, &tx, &tpos7), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(),
                     "moe_permute: pos is i32[7], expected N * k elements for the 4 token rows (k choices each)");
    ck_assert_int_eq(ops->moe_combine_fwd(dev, &tx, &tye, &tpos7, NULL, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "moe_combine_fwd: pos is i32[7], expected N * k elements"));

    cai_tensor tposf = cai_tensor_1d(dev, posf, F32, 8);
    ck_assert_int_eq(ops->moe_permute(dev, &txe, &tx, &tposf), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_permute: pos is f32[8], expected dtype i32");

    cai_tensor tw7 = cai_tensor_1d(dev, w, F32, 7);
    ck_assert_int_eq(ops->moe_combine_fwd(dev, &tx, &tye, &tpos, &tw7, 0), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_combine_fwd: w is f32[7], expected 8 elements");
    ck_assert_int_eq(ops->moe_combine_bwd(dev, &txe, &tdw, &tx, &tye, &tpos, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_combine_bwd: w is NULL");

    cai_tensor txe4 = cai_tensor_2d(dev, xe, F32, 3, 4);
    ck_assert_int_eq(ops->moe_permute(dev, &txe4, &tx, &tpos), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "moe_permute: xe is f32[3,4], expected a last dimension of 3");
    cai_error_clear();
}
END_TEST

/* Grouped products equal one linear_fwd / linear_bwd per block, bit for
 * bit, with an empty block among them; rows past the blocks untouched. */
START_TEST(grouped_linear_equals_a_product_per_block) {
    cai_device_t *dev = devs[1];
    const cai_ops *ops = dev->ops;
    enum { G = 4, IC = 6, OC = 5, ROWS = 12 };
    const int64_t rows[G] = {3, 0, 5, 2}; /* 10 of ROWS */
    float *x = falloc(ROWS * IC), *w = falloc(G * OC * IC), *dy = falloc(ROWS * OC);
    for (int i = 0; i < ROWS * IC; i++) x[i] = (float)cai_rng_normal(3, 1, (uint64_t)i);
    for (int i = 0; i < G * OC * IC; i++) w[i] = (float)cai_rng_normal(3, 2, (uint64_t)i);
    for (int i = 0; i < ROWS * OC; i++) dy[i] = (float)cai_rng_normal(3, 3, (uint64_t)i);
    float *y = falloc(ROWS * OC), *y_ref = falloc(ROWS * OC), *dx = falloc(ROWS * IC), *dx_ref = falloc(ROWS * IC);
    float *dw = falloc(G * OC * IC), *dw_ref = falloc(G * OC * IC);
    for (int i = 0; i < ROWS * OC; i++) y[i] = y_ref[i] = 7.0f;
    for (int i = 0; i < ROWS * IC; i++) dx[i] = dx_ref[i] = 0.5f;
    for (int i = 0; i < G * OC * IC; i++) dw[i] = dw_ref[i] = 0.25f;
    cai_tensor W[G], DW[G], DWr[G];
    for (int g = 0; g < G; g++) {
        W[g] = cai_tensor_2d(dev, w + g * OC * IC, F32, OC, IC);
        DW[g] = cai_tensor_2d(dev, dw + g * OC * IC, F32, OC, IC);
        DWr[g] = cai_tensor_2d(dev, dw_ref + g * OC * IC, F32, OC, IC);
    }
    cai_tensor tx = cai_tensor_2d(dev, x, F32, ROWS, IC), ty = cai_tensor_2d(dev, y, F32, ROWS, OC);
    cai_tensor tdy = cai_tensor_2d(dev, dy, F32, ROWS, OC), tdx = cai_tensor_2d(dev, dx, F32, ROWS, IC);
    ck_assert_int_eq(ops->grouped_linear_fwd(dev, &ty, &tx, W, rows, G), CAI_OK);
    ck_assert_int_eq(ops->grouped_linear_bwd(dev, &tdx, DW, &tdy, &tx, W, rows, G, 1), CAI_OK);
    for (int64_t g = 0, off = 0; g < G; off += rows[g], g++) {
        if (!rows[g]) continue;
        cai_tensor bx = cai_tensor_2d(dev, x + off * IC, F32, rows[g], IC);
        cai_tensor by = cai_tensor_2d(dev, y_ref + off * OC, F32, rows[g], OC);
        cai_tensor bdy = cai_tensor_2d(dev, dy + off * OC, F32, rows[g], OC);
        cai_tensor bdx = cai_tensor_2d(dev, dx_ref + off * IC, F32, rows[g], IC);
        ck_assert_int_eq(ops->linear_fwd(dev, &by, &bx, &W[g], NULL), CAI_OK);
        ck_assert_int_eq(ops->linear_bwd(dev, &bdx, &DWr[g], NULL, &bdy, &bx, &W[g], 1), CAI_OK);
    }
    ck_assert_mem_eq(y, y_ref, sizeof(float) * ROWS * OC);
    ck_assert_mem_eq(dx, dx_ref, sizeof(float) * ROWS * IC);
    ck_assert_mem_eq(dw, dw_ref, sizeof(float) * G * OC * IC);
    for (int i = 10 * OC; i < ROWS * OC; i++) ck_assert(y[i] == 7.0f);
    for (int i = 10 * IC; i < ROWS * IC; i++) ck_assert(dx[i] == 0.5f);
    for (int i = OC * IC; i < 2 * OC * IC; i++) ck_assert(dw[i] == 0.25f); /* the empty block's gradient */
    const int64_t too_many[G] = {3, 0, 5, 5};
    ck_assert_int_eq(ops->grouped_linear_fwd(dev, &ty, &tx, W, too_many, G), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "grouped_linear_fwd: the blocks need 13 rows of inp, which has 12");
    cai_error_clear();
    const int64_t negative[G] = {3, -1, 5, 2};
    ck_assert_int_eq(ops->grouped_linear_bwd(dev, &tdx, DW, &tdy, &tx, W, negative, G, 0), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "grouped_linear_bwd: block 1 has -1 rows");
    cai_error_clear();
    free(x);
    free(w);
    free(dy);
    free(y);
    free(y_ref);
    free(dx);
    free(dx_ref);
    free(dw);
    free(dw_ref);
}
END_TEST

static Suite *moe_suite(void) {
    Suite *s = suite_create("ops_moe");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, moe_permute_copies_named_rows_only);
    tcase_add_test(tc, moe_combine_fwd_matches_layer_loop);
    tcase_add_test(tc, moe_combine_bwd_matches_layer_loop);
    tcase_add_test(tc, moe_combine_bf16_within_an_ulp_of_f32);
    tcase_add_test(tc, moe_argument_errors_name_op_and_argument);
    tcase_add_test(tc, grouped_linear_equals_a_product_per_block);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    devs[0] = test_device(1);
    devs[1] = test_device(3);
    if (!devs[0] || !devs[1]) {
        MPI_Finalize();
        return 1;
    }
    SRunner *sr = srunner_create(moe_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(devs[1]);
    cai_device_free(devs[0]);
    MPI_Finalize();
    return failed ? 1 : 0;
}
