/* CPU op table: every op against a naive double-precision reference on
 * random inputs with odd sizes; backward passes against central finite
 * differences of the double reference (loss = sum(out * random weights)) or
 * against the analytic reference where the op is linear.
 *
 * Tolerances (max abs error / max abs reference): forward 2e-6..1e-5 (f32
 * arithmetic on O(10)-term sums); backward vs finite differences 1e-4 (f32
 * rounding of the op, FD truncation at h = 1e-5 is ~1e-10). */
#include "cai_config.h"
#include "colossal/ops.h"

#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "test_ops_util.h"

static cai_device_t *dev;
static const cai_ops *ops;

#define F32 CAI_DTYPE_F32

/* ---------------------------------------------------------------- matmul */

/* c = alpha op(a) op(b) + beta c against the double reference; with beta 0
 * c starts as NaN, which the op must not read. */
static void matmul_case_ab(int64_t M, int64_t K, int64_t N, int ta, int tb, float alpha, float beta) {
    double *a = drandn(M * K, 1, 1.0), *b = drandn(K * N, 2, 1.0), *c0 = drandn(M * N, 3, 1.0);
    float *fa = to_f(a, M * K), *fb = to_f(b, K * N), *fc = to_f(c0, M * N);
    if (beta == 0.0f)
        for (int64_t i = 0; i < M * N; i++) fc[i] = NAN;
    cai_tensor ta_ = ta ? cai_tensor_2d(dev, fa, F32, K, M) : cai_tensor_2d(dev, fa, F32, M, K);
    cai_tensor tb_ = tb ? cai_tensor_2d(dev, fb, F32, N, K) : cai_tensor_2d(dev, fb, F32, K, N);
    cai_tensor tc = cai_tensor_2d(dev, fc, F32, M, N);
    ASSERT_OK(ops->matmul(dev, &tc, &ta_, ta, &tb_, tb, alpha, beta));
    double *ref = dalloc(M * N);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (ta ? a[k * M + m] : a[m * K + k]) * (tb ? b[n * K + k] : b[k * N + n]);
            ref[m * N + n] = alpha * s + (beta == 0.0f ? 0.0 : beta * c0[m * N + n]);
        }
    ASSERT_REL(fc, ref, M * N, 1e-5);
    free(a);
    free(b);
    free(c0);
    free(fa);
    free(fb);
    free(fc);
    free(ref);
}

static void matmul_case(int64_t M, int64_t K, int64_t N, int ta, int tb) {
    matmul_case_ab(M, K, N, ta, tb, 0.7f, 0.3f);
}

START_TEST(matmul_all_transposes) {
    /* one row runs through sgemv, in column panels across threads when
     * large enough (1 x 300 x 700) */
    int64_t shapes[][3] = {{7, 13, 5},   {1, 1, 1},    {33, 17, 9}, {2, 64, 3},   {1, 64, 300},
                           {3, 64, 300}, {4, 40, 700}, {5, 9, 20},  {2, 300, 700}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) matmul_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb);
}
END_TEST

START_TEST(matmul_panels_match_reference_and_repeat_exactly) {
    /* Large enough (> 2^18 multiply-adds) to be split over threads: by rows
     * when M >= N, by columns otherwise. OpenBLAS computes the last rows or
     * columns of a call with its tail kernels, so different splits (thread
     * counts) may differ in the last bits; the same split repeats exactly. */
    int64_t shapes[][3] = {{100, 70, 50}, {40, 60, 130}, {1, 300, 1000}};
    cai_device_t *d1 = test_device(1), *d3 = test_device(3);
    ck_assert(d1 && d3);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int64_t M = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
                matmul_case(M, K, N, ta, tb);
                double *a = drandn(M * K, 6, 1.0), *b = drandn(K * N, 7, 1.0);
                float *fa = to_f(a, M * K), *fb = to_f(b, K * N), *c1 = falloc(M * N), *c3 = falloc(M * N);
                float *c3b = falloc(M * N);
                cai_tensor A = ta ? cai_tensor_2d(d1, fa, F32, K, M) : cai_tensor_2d(d1, fa, F32, M, K);
                cai_tensor Bt = tb ? cai_tensor_2d(d1, fb, F32, N, K) : cai_tensor_2d(d1, fb, F32, K, N);
                cai_tensor C1 = cai_tensor_2d(d1, c1, F32, M, N), C3 = cai_tensor_2d(d3, c3, F32, M, N);
                ASSERT_OK(d1->ops->matmul(d1, &C1, &A, ta, &Bt, tb, 1.0f, 0.0f));
                ASSERT_OK(d3->ops->matmul(d3, &C3, &A, ta, &Bt, tb, 1.0f, 0.0f));
                double *r1 = to_d(c1, M * N);
                ASSERT_REL(c3, r1, M * N, 1e-6);
                cai_tensor C3b = cai_tensor_2d(d3, c3b, F32, M, N);
                ASSERT_OK(d3->ops->matmul(d3, &C3b, &A, ta, &Bt, tb, 1.0f, 0.0f));
                ck_assert_mem_eq(c3, c3b, (size_t)(M * N) * sizeof(float));
                free(a);
                free(b);
                free(fa);
                free(fb);
                free(c1);
                free(c3);
                free(c3b);
                free(r1);
            }
    cai_device_free(d1);
    cai_device_free(d3);
}
END_TEST

/* beta 0, one row (sgemv) and a few (sgemm): c's old contents (NaN) are not read */
START_TEST(matmul_few_rows_beta_zero) {
    for (int64_t M = 1; M <= 4; M++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) matmul_case_ab(M, 70, 300, ta, tb, 1.0f, 0.0f);
}
END_TEST

/* The forward product of a few rows (a small decode batch, x W^T: gemm_few
 * up to 8 rows) reads each weight row once for all of them: a row's result
 * is the same bits whichever rows share the call and however many threads
 * split it. */
START_TEST(matmul_few_rows_row_independent) {
    enum { M = 4, K = 771, N = 300 };
    double *a = drandn(M * K, 8, 1.0), *b = drandn(N * K, 9, 1.0);
    float *fa = to_f(a, M * K), *fb = to_f(b, N * K), *full = falloc(M * N), *part = falloc(M * N);
    cai_device_t *d3 = test_device(3);
    ck_assert_ptr_nonnull(d3);
    cai_tensor A = cai_tensor_2d(dev, fa, F32, M, K), B = cai_tensor_2d(dev, fb, F32, N, K);
    cai_tensor C = cai_tensor_2d(dev, full, F32, M, N);
    ASSERT_OK(ops->matmul(dev, &C, &A, 0, &B, 1, 1.0f, 0.0f));
    for (int64_t m0 = 0; m0 + 2 <= M; m0 += 2) { /* rows two at a time, on three threads */
        cai_tensor A2 = cai_tensor_2d(d3, fa + m0 * K, F32, 2, K), B3 = cai_tensor_2d(d3, fb, F32, N, K);
        cai_tensor C2 = cai_tensor_2d(d3, part + m0 * N, F32, 2, N);
        ASSERT_OK(d3->ops->matmul(d3, &C2, &A2, 0, &B3, 1, 1.0f, 0.0f));
    }
    ck_assert_mem_eq(full, part, sizeof(float) * M * N);
    cai_tensor A3 = cai_tensor_2d(dev, fa + K, F32, 3, K), C3 = cai_tensor_2d(dev, part, F32, 3, N);
    ASSERT_OK(ops->matmul(dev, &C3, &A3, 0, &B, 1, 1.0f, 0.0f));
    ck_assert_mem_eq(full + N, part, sizeof(float) * 3 * N);
    cai_device_free(d3);
    free(a);
    free(b);
    free(fa);
    free(fb);
    free(full);
    free(part);
}
END_TEST

START_TEST(matmul_batched_strided_and_beta_zero) {
    enum { BT = 3, M = 7, K = 5, N = 4, PAD = 3 };
    /* a: [BT,M,K] as a view into rows of width K + PAD */
    double *a = drandn(BT * M * (K + PAD), 4, 1.0), *b = drandn(BT * K * N, 5, 1.0);
    float *fa = to_f(a, BT * M * (K + PAD)), *fb = to_f(b, BT * K * N), *fc = falloc(BT * M * N);
    cai_tensor wide = cai_tensor_3d(dev, fa, F32, BT, M, K + PAD), ta, tb2 = cai_tensor_2d(dev, fb, F32, K, N);
    cai_tensor tb3 = cai_tensor_3d(dev, fb, F32, BT, K, N), tc = cai_tensor_3d(dev, fc, F32, BT, M, N);
    ASSERT_OK(cai_tensor_narrow(&wide, 2, PAD, K, &ta));
    for (int shared = 0; shared < 2; shared++) {
        for (int64_t i = 0; i < BT * M * N; i++) fc[i] = NAN; /* beta = 0 must not read c */
        ASSERT_OK(ops->matmul(dev, &tc, &ta, 0, shared ? &tb2 : &tb3, 0, 1.0f, 0.0f));
        double *ref = dalloc(BT * M * N);
        for (int64_t t = 0; t < BT; t++)
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    double s = 0;
                    for (int64_t k = 0; k < K; k++)
                        s += a[(t * M + m) * (K + PAD) + PAD + k] * b[(shared ? 0 : t * K * N) + k * N + n];
                    ref[(t * M + m) * N + n] = s;
                }
        ASSERT_REL(fc, ref, BT * M * N, 1e-5);
        free(ref);
    }
    /* contiguous a with shared b: the whole batch folds into one gemm */
    cai_tensor ac = cai_tensor_3d(dev, fa, F32, BT, M, K);
    ASSERT_OK(ops->matmul(dev, &tc, &ac, 0, &tb2, 0, 1.0f, 0.0f));
    double *ref = dalloc(BT * M * N);
    for (int64_t r = 0; r < BT * M; r++)
        for (int64_t n = 0; n < N; n++) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)fa[r * K + k] * b[k * N + n];
            ref[r * N + n] = s;
        }
    ASSERT_REL(fc, ref, BT * M * N, 1e-5);
    /* shape errors name the op */
    cai_tensor bad = cai_tensor_2d(dev, fb, F32, K + 1, N);
    ck_assert_int_eq(ops->matmul(dev, &tc, &ac, 0, &bad, 0, 1.0f, 0.0f), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "matmul: op(a) is [7,5], op(b) [6,4]"));
    cai_error_clear();
    free(a);
    free(b);
    free(fa);
    free(fb);
    free(fc);
    free(ref);
}
END_TEST

START_TEST(linear_fwd_bwd_match_reference) {
    enum { B = 2, T = 7, IC = 13, OC = 5, N = B * T };
    double *x = drandn(N * IC, 10, 1.0), *w = drandn(OC * IC, 11, 0.5), *bias = drandn(OC, 12, 1.0);
    double *dy = drandn(N * OC, 13, 1.0), *dw0 = drandn(OC * IC, 14, 1.0), *db0 = drandn(OC, 15, 1.0);
    double *dx0 = drandn(N * IC, 16, 1.0);
    float *fx = to_f(x, N * IC), *fw = to_f(w, OC * IC), *fb = to_f(bias, OC), *fdy = to_f(dy, N * OC);
    float *fdw = to_f(dw0, OC * IC), *fdb = to_f(db0, OC), *fdx = to_f(dx0, N * IC), *fy = falloc(N * OC);
    cai_tensor tx = cai_tensor_3d(dev, fx, F32, B, T, IC), tw = cai_tensor_2d(dev, fw, F32, OC, IC);
    cai_tensor tb = cai_tensor_1d(dev, fb, F32, OC), ty = cai_tensor_3d(dev, fy, F32, B, T, OC);
    cai_tensor tdy = cai_tensor_3d(dev, fdy, F32, B, T, OC), tdw = cai_tensor_2d(dev, fdw, F32, OC, IC);
    cai_tensor tdb = cai_tensor_1d(dev, fdb, F32, OC), tdx = cai_tensor_3d(dev, fdx, F32, B, T, IC);
    double *ry = dalloc(N * OC), *rdx = dalloc(N * IC), *rdw = dalloc(OC * IC), *rdb = dalloc(OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        ASSERT_OK(ops->linear_fwd(dev, &ty, &tx, &tw, with_bias ? &tb : NULL));
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) ry[n * OC + o] = (with_bias ? bias[o] : 0) + dot_d(x + n * IC, w + o * IC, IC);
        ASSERT_REL(fy, ry, N * OC, 1e-5);
    }
    /* accumulate into dinp, dweight and dbias */
    ASSERT_OK(ops->linear_bwd(dev, &tdx, &tdw, &tdb, &tdy, &tx, &tw, 1));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = dx0[n * IC + i];
            for (int o = 0; o < OC; o++) s += dy[n * OC + o] * w[o * IC + i];
            rdx[n * IC + i] = s;
        }
    for (int o = 0; o < OC; o++) {
        rdb[o] = db0[o];
        for (int n = 0; n < N; n++) rdb[o] += dy[n * OC + o];
        for (int i = 0; i < IC; i++) {
            double s = dw0[o * IC + i];
            for (int n = 0; n < N; n++) s += dy[n * OC + o] * x[n * IC + i];
            rdw[o * IC + i] = s;
        }
    }
    ASSERT_REL(fdx, rdx, N * IC, 1e-5);
    ASSERT_REL(fdw, rdw, OC * IC, 1e-5);
    ASSERT_REL(fdb, rdb, OC, 1e-5);
    /* overwrite mode for dinp, nothing else requested */
    ASSERT_OK(ops->linear_bwd(dev, &tdx, NULL, NULL, &tdy, &tx, &tw, 0));
    for (int64_t i = 0; i < N * IC; i++) rdx[i] -= dx0[i];
    ASSERT_REL(fdx, rdx, N * IC, 1e-5);
    ASSERT_REL(fdw, rdw, OC * IC, 1e-5); /* untouched */
    free(x);
    free(w);
    free(bias);
    free(dy);
    free(dw0);
    free(db0);
    free(dx0);
    free(fx);
    free(fw);
    free(fb);
    free(fdy);
    free(fdw);
    free(fdb);
    free(fdx);
    free(fy);
    free(ry);
    free(rdx);
    free(rdw);
    free(rdb);
}
END_TEST

START_TEST(bias_ops_match_reference) {
    enum { N = 19, C = 70 }; /* C spans two column blocks */
    double *x = drandn(N * C, 20, 1.0), *b = drandn(C, 21, 1.0), *d0 = drandn(C, 22, 1.0);
    float *fx = to_f(x, N * C), *fb = to_f(b, C), *fd = to_f(d0, C);
    cai_tensor tx = cai_tensor_2d(dev, fx, F32, N, C), tb = cai_tensor_1d(dev, fb, F32, C);
    cai_tensor td = cai_tensor_1d(dev, fd, F32, C);
    ASSERT_OK(ops->bias_grad(dev, &td, &tx));
    double *rd = dalloc(C), *rx = dalloc(N * C);
    for (int c = 0; c < C; c++) {
        rd[c] = d0[c];
        for (int n = 0; n < N; n++) rd[c] += x[n * C + c];
    }
    ASSERT_REL(fd, rd, C, 1e-6);
    ASSERT_OK(ops->bias_add(dev, &tx, &tb));
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) rx[n * C + c] = x[n * C + c] + b[c];
    ASSERT_REL(fx, rx, N * C, 1e-7);
    free(x);
    free(b);
    free(d0);
    free(fx);
    free(fb);
    free(fd);
    free(rd);
    free(rx);
}
END_TEST

/* ---------------------------------------------------------------- norms */

typedef struct {
    int64_t N, C;
    int rms, has_bias;
    double *x, *w, *b, *W; /* W: loss weights */
    double *y, *mean, *rstd;
} norm_ref;

static void norm_forward(norm_ref *r) {
    for (int64_t n = 0; n < r->N; n++) {
        const double *x = r->x + n * r->C;
        double m = 0, v = 0;
        if (!r->rms) {
            for (int64_t c = 0; c < r->C; c++) m += x[c];
            m /= (double)r->C;
        }
        for (int64_t c = 0; c < r->C; c++) v += (x[c] - m) * (x[c] - m);
        double rs = 1.0 / sqrt(v / (double)r->C + 1e-5);
        for (int64_t c = 0; c < r->C; c++)
            r->y[n * r->C + c] = (x[c] - m) * rs * r->w[c] + (r->has_bias ? r->b[c] : 0.0);
        r->mean[n] = m;
        r->rstd[n] = rs;
    }
}

static double norm_loss(void *ctx) {
    norm_ref *r = ctx;
    norm_forward(r);
    return dot_d(r->y, r->W, r->N * r->C);
}

static void norm_case(int64_t N, int64_t C, int rms, int has_bias, int accum) {
    norm_ref r = {.N = N, .C = C, .rms = rms, .has_bias = has_bias};
    r.x = drandn(N * C, 30, 2.0);
    for (int64_t i = 0; i < N * C; i++) r.x[i] += 0.5; /* non-zero mean */
    r.w = drandn(C, 31, 1.0);
    r.b = drandn(C, 32, 1.0);
    r.W = drandn(N * C, 33, 1.0);
    r.y = dalloc(N * C);
    r.mean = dalloc(N);
    r.rstd = dalloc(N);
    float *fx = to_f(r.x, N * C), *fw = to_f(r.w, C), *fb = to_f(r.b, C), *fW = to_f(r.W, N * C);
    float *fy = falloc(N * C), *fm = falloc(N), *fr = falloc(N);
    double *dx0 = drandn(N * C, 34, 1.0), *dw0 = drandn(C, 35, 1.0), *db0 = drandn(C, 36, 1.0);
    float *fdx = to_f(dx0, N * C), *fdw = to_f(dw0, C), *fdb = to_f(db0, C);
    cai_tensor tx = cai_tensor_2d(dev, fx, F32, N, C), ty = cai_tensor_2d(dev, fy, F32, N, C);
    cai_tensor tw = cai_tensor_1d(dev, fw, F32, C), tb = cai_tensor_1d(dev, fb, F32, C);
    cai_tensor tm = cai_tensor_1d(dev, fm, F32, N), tr = cai_tensor_1d(dev, fr, F32, N);
    cai_tensor tdy = cai_tensor_2d(dev, fW, F32, N, C), tdx = cai_tensor_2d(dev, fdx, F32, N, C);
    cai_tensor tdw = cai_tensor_1d(dev, fdw, F32, C), tdb = cai_tensor_1d(dev, fdb, F32, C);
    if (rms) {
        ASSERT_OK(ops->rmsnorm_fwd(dev, &ty, &tr, &tx, &tw, 1e-5f));
        ASSERT_OK(ops->rmsnorm_bwd(dev, &tdx, &tdw, &tdy, &tx, &tw, &tr, accum));
    } else {
        ASSERT_OK(ops->layernorm_fwd(dev, &ty, &tm, &tr, &tx, &tw, has_bias ? &tb : NULL, 1e-5f));
        ASSERT_OK(ops->layernorm_bwd(dev, &tdx, &tdw, has_bias ? &tdb : NULL, &tdy, &tx, &tw, &tm, &tr, accum));
    }
    norm_forward(&r);
    ASSERT_REL(fy, r.y, N * C, 1e-5);
    ASSERT_REL(fr, r.rstd, N, 1e-5);
    if (!rms) ASSERT_REL(fm, r.mean, N, 1e-5);
    double *gx = dalloc(N * C), *gw = dalloc(C), *gb = dalloc(C);
    fd_grad(norm_loss, &r, r.x, N * C, 1e-5, gx);
    fd_grad(norm_loss, &r, r.w, C, 1e-5, gw);
    fd_grad(norm_loss, &r, r.b, C, 1e-5, gb);
    if (accum)
        for (int64_t i = 0; i < N * C; i++) gx[i] += dx0[i];
    for (int64_t c = 0; c < C; c++) {
        gw[c] += dw0[c];
        gb[c] += db0[c];
    }
    ASSERT_REL(fdx, gx, N * C, 1e-4);
    ASSERT_REL(fdw, gw, C, 1e-4);
    if (!rms && has_bias) ASSERT_REL(fdb, gb, C, 1e-4);
    else ASSERT_REL(fdb, db0, C, 0.0); /* no bias gradient requested: untouched */
    free(r.x);
    free(r.w);
    free(r.b);
    free(r.W);
    free(r.y);
    free(r.mean);
    free(r.rstd);
    free(fx);
    free(fw);
    free(fb);
    free(fW);
    free(fy);
    free(fm);
    free(fr);
    free(dx0);
    free(dw0);
    free(db0);
    free(fdx);
    free(fdw);
    free(fdb);
    free(gx);
    free(gw);
    free(gb);
}

START_TEST(layernorm_fwd_bwd) {
    norm_case(14, 13, 0, 1, 0);
    norm_case(3, 70, 0, 1, 1);
    norm_case(5, 7, 0, 0, 1);
}
END_TEST

START_TEST(rmsnorm_fwd_bwd) {
    norm_case(14, 13, 1, 0, 0);
    norm_case(3, 70, 1, 0, 1);
}
END_TEST

/* ---------------------------------------------------------------- activations */

typedef struct {
    int64_t n;
    double *x, *u, *W, *y;
    int swiglu;
} act_ref;

static double gelu_d(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

static double act_loss(void *ctx) {
    act_ref *r = ctx;
    for (int64_t i = 0; i < r->n; i++)
        r->y[i] = r->swiglu ? r->x[i] / (1.0 + exp(-r->x[i])) * r->u[i] : gelu_d(r->x[i]);
    return dot_d(r->y, r->W, r->n);
}

START_TEST(gelu_fwd_bwd) {
    enum { N = 7, C = 13 };
    act_ref r = {.n = N * C, .x = drandn(N * C, 40, 2.0), .W = drandn(N * C, 41, 1.0), .y = dalloc(N * C)};
    float *fx = to_f(r.x, N * C), *fW = to_f(r.W, N * C), *fy = falloc(N * C), *fdx = falloc(N * C);
    cai_tensor tx = cai_tensor_2d(dev, fx, F32, N, C), ty = cai_tensor_2d(dev, fy, F32, N, C);
    cai_tensor tW = cai_tensor_2d(dev, fW, F32, N, C), tdx = cai_tensor_2d(dev, fdx, F32, N, C);
    ASSERT_OK(ops->gelu_fwd(dev, &ty, &tx));
    ASSERT_OK(ops->gelu_bwd(dev, &tdx, &tx, &tW));
    act_loss(&r);
    ASSERT_REL(fy, r.y, N * C, 2e-6);
    double *g = dalloc(N * C);
    fd_grad(act_loss, &r, r.x, N * C, 1e-5, g);
    ASSERT_REL(fdx, g, N * C, 1e-5);
    /* in place: dinp over dout */
    ASSERT_OK(ops->gelu_bwd(dev, &tW, &tx, &tW));
    ASSERT_REL(fW, g, N * C, 1e-5);
    free(r.x);
    free(r.W);
    free(r.y);
    free(fx);
    free(fW);
    free(fy);
    free(fdx);
    free(g);
}
END_TEST

/* linear_gelu_fwd / linear_bwd_dgelu: on the CPU they are compositions, so
 * they must equal linear_fwd + gelu_fwd and linear_bwd + gelu_bwd bit for
 * bit; also against the double reference (gelu' analytic). */
static double gelu_grad_d(double x) {
    const double k = sqrt(2.0 / M_PI), u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

START_TEST(linear_gelu_fused_ops_match_composition) {
    enum { B = 2, T = 7, IC = 13, OC = 11, N = B * T };
    double *x = drandn(N * IC, 50, 1.0), *w = drandn(OC * IC, 51, 0.5), *bias = drandn(OC, 52, 0.5);
    /* The layer after the GELU (GPT-2's mlp_proj): weight w2 [IC,OC] maps
     * act [N,OC] back to [N,IC]; its backward gets dout [N,IC]. */
    double *dw0 = drandn(IC * OC, 54, 1.0), *db0 = drandn(IC, 55, 1.0);
    double *w2 = drandn(IC * OC, 56, 0.5), *dout2 = drandn(N * IC, 57, 1.0);
    float *fx = to_f(x, N * IC), *fw = to_f(w, OC * IC), *fb = to_f(bias, OC), *fw2 = to_f(w2, IC * OC);
    float *fdout2 = to_f(dout2, N * IC);
    float *act = falloc(N * OC), *pre = falloc(N * OC), *ract = falloc(N * OC), *rpre = falloc(N * OC);
    cai_tensor tx = cai_tensor_3d(dev, fx, F32, B, T, IC), tw = cai_tensor_2d(dev, fw, F32, OC, IC);
    cai_tensor tb = cai_tensor_1d(dev, fb, F32, OC);
    cai_tensor tact = cai_tensor_3d(dev, act, F32, B, T, OC), tpre = cai_tensor_3d(dev, pre, F32, B, T, OC);
    cai_tensor tract = cai_tensor_3d(dev, ract, F32, B, T, OC), trpre = cai_tensor_3d(dev, rpre, F32, B, T, OC);
    double *rp = dalloc(N * OC), *ra = dalloc(N * OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const cai_tensor *b = with_bias ? &tb : NULL;
        ASSERT_OK(ops->linear_gelu_fwd(dev, &tact, &tpre, &tx, &tw, b));
        ASSERT_OK(ops->linear_fwd(dev, &trpre, &tx, &tw, b));
        ASSERT_OK(ops->gelu_fwd(dev, &tract, &trpre));
        ck_assert_mem_eq(pre, rpre, sizeof(float) * N * OC);
        ck_assert_mem_eq(act, ract, sizeof(float) * N * OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++) {
                rp[n * OC + o] = (with_bias ? bias[o] : 0) + dot_d(x + n * IC, w + o * IC, IC);
                ra[n * OC + o] = gelu_d(pre[n * OC + o]);
            }
        ASSERT_REL(pre, rp, N * OC, 1e-5);
        ASSERT_REL(act, ra, N * OC, 2e-6);
    }
    /* backward through a second linear layer [IC, OC] whose input is act */
    float *dpre = falloc(N * OC), *rdpre = falloc(N * OC);
    float *fdw = to_f(dw0, IC * OC), *rfdw = to_f(dw0, IC * OC), *fdb = to_f(db0, IC), *rfdb = to_f(db0, IC);
    cai_tensor tw2 = cai_tensor_2d(dev, fw2, F32, IC, OC), tdout = cai_tensor_3d(dev, fdout2, F32, B, T, IC);
    cai_tensor tdpre = cai_tensor_3d(dev, dpre, F32, B, T, OC), trdpre = cai_tensor_3d(dev, rdpre, F32, B, T, OC);
    cai_tensor tdw = cai_tensor_2d(dev, fdw, F32, IC, OC), trdw = cai_tensor_2d(dev, rfdw, F32, IC, OC);
    cai_tensor tdb = cai_tensor_1d(dev, fdb, F32, IC), trdb = cai_tensor_1d(dev, rfdb, F32, IC);
    ASSERT_OK(ops->linear_bwd_dgelu(dev, &tdpre, &tdw, &tdb, &tdout, &tact, &tw2, &tpre));
    ASSERT_OK(ops->linear_bwd(dev, &trdpre, &trdw, &trdb, &tdout, &tact, &tw2, 0));
    ASSERT_OK(ops->gelu_bwd(dev, &trdpre, &tpre, &trdpre));
    ck_assert_mem_eq(dpre, rdpre, sizeof(float) * N * OC);
    ck_assert_mem_eq(fdw, rfdw, sizeof(float) * IC * OC);
    ck_assert_mem_eq(fdb, rfdb, sizeof(float) * IC);
    double *rdp = dalloc(N * OC), *rdw = dalloc(IC * OC), *rdb = dalloc(IC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = 0;
            for (int i = 0; i < IC; i++) s += dout2[n * IC + i] * w2[i * OC + o];
            rdp[n * OC + o] = gelu_grad_d(pre[n * OC + o]) * s;
        }
    for (int i = 0; i < IC; i++) {
        rdb[i] = db0[i];
        for (int n = 0; n < N; n++) rdb[i] += dout2[n * IC + i];
        for (int o = 0; o < OC; o++) {
            double s = dw0[i * OC + o];
            for (int n = 0; n < N; n++) s += dout2[n * IC + i] * (double)act[n * OC + o];
            rdw[i * OC + o] = s;
        }
    }
    ASSERT_REL(dpre, rdp, N * OC, 1e-5);
    ASSERT_REL(fdw, rdw, IC * OC, 1e-5);
    ASSERT_REL(fdb, rdb, IC, 1e-5);
    /* dweight and dbias NULL: only dpre, overwritten (poisoned first) */
    for (int64_t i = 0; i < N * OC; i++) dpre[i] = NAN;
    ASSERT_OK(ops->linear_bwd_dgelu(dev, &tdpre, NULL, NULL, &tdout, &tact, &tw2, &tpre));
    ck_assert_mem_eq(dpre, rdpre, sizeof(float) * N * OC);
    ASSERT_REL(fdw, rdw, IC * OC, 1e-5); /* untouched */
    ASSERT_REL(fdb, rdb, IC, 1e-5);

    /* argument errors name the fused op and fail before anything is written */
    for (int64_t i = 0; i < N * OC; i++) pre[i] = 42.0f;
    cai_tensor tbad = cai_tensor_3d(dev, act, F32, B, T, OC - 1);
    ck_assert_int_eq(ops->linear_gelu_fwd(dev, &tbad, &tpre, &tx, &tw, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_gelu_fwd: act"));
    for (int64_t i = 0; i < N * OC; i++) ck_assert(pre[i] == 42.0f);
    ck_assert_int_eq(ops->linear_bwd_dgelu(dev, &tdpre, NULL, NULL, &tdout, &tact, &tw2, &tbad), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_bwd_dgelu: pre"));
    ck_assert_int_eq(ops->linear_bwd_dgelu(dev, NULL, NULL, NULL, &tdout, &tact, &tw2, &tpre), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_bwd_dgelu: dpre is NULL"));
    /* bf16: this backend computes in f32 */
    uint16_t *hx = calloc(N * IC, 2), *hw = calloc(OC * IC, 2), *ha = calloc(N * OC, 2), *hp = calloc(N * OC, 2);
    uint16_t *hw2 = calloc(IC * OC, 2), *hd = calloc(N * IC, 2), *hdp = calloc(N * OC, 2);
    cai_tensor bx = cai_tensor_2d(dev, hx, CAI_DTYPE_BF16, N, IC), bw = cai_tensor_2d(dev, hw, CAI_DTYPE_BF16, OC, IC);
    cai_tensor ba = cai_tensor_2d(dev, ha, CAI_DTYPE_BF16, N, OC), bp = cai_tensor_2d(dev, hp, CAI_DTYPE_BF16, N, OC);
    cai_tensor bw2 = cai_tensor_2d(dev, hw2, CAI_DTYPE_BF16, IC, OC),
               bd = cai_tensor_2d(dev, hd, CAI_DTYPE_BF16, N, IC);
    cai_tensor bdp = cai_tensor_2d(dev, hdp, CAI_DTYPE_BF16, N, OC);
    ck_assert_int_eq(ops->linear_gelu_fwd(dev, &ba, &bp, &bx, &bw, NULL), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(
        strstr(cai_error_message(), "linear_gelu_fwd: weight is bf16[11,13]; this backend computes in f32"));
    cai_tensor bb = cai_tensor_1d(dev, hp, CAI_DTYPE_BF16, OC);
    ck_assert_int_eq(ops->linear_gelu_fwd(dev, &tact, &tpre, &tx, &tw, &bb), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_gelu_fwd: bias is bf16[11]"));
    ck_assert_int_eq(ops->linear_bwd_dgelu(dev, &bdp, NULL, NULL, &bd, &ba, &bw2, &bp), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(
        strstr(cai_error_message(), "linear_bwd_dgelu: weight is bf16[13,11]; this backend computes in f32"));
    cai_error_clear();
    free(hx);
    free(hw);
    free(ha);
    free(hp);
    free(hw2);
    free(hd);
    free(hdp);
    free(x);
    free(w);
    free(bias);
    free(dw0);
    free(db0);
    free(w2);
    free(dout2);
    free(fx);
    free(fw);
    free(fb);
    free(fw2);
    free(fdout2);
    free(act);
    free(pre);
    free(ract);
    free(rpre);
    free(rp);
    free(ra);
    free(dpre);
    free(rdpre);
    free(fdw);
    free(rfdw);
    free(fdb);
    free(rfdb);
    free(rdp);
    free(rdw);
    free(rdb);
}
END_TEST

/* linear_residual_fwd: on the CPU a composition, so out must equal
 * linear_fwd + add bit for bit -- into a separate out, in place (out is the
 * residual) and with a strided residual (a column range of a wider
 * buffer) -- and the double reference within f32 tolerance. */
START_TEST(linear_residual_fused_op_matches_composition) {
    enum { B = 3, T = 23, IC = 37, OC = 29, N = B * T, RW = OC + 5 };
    double *x = drandn(N * IC, 60, 1.0), *w = drandn(OC * IC, 61, 0.5), *bias = drandn(OC, 62, 0.5);
    double *res = drandn(N * RW, 63, 1.0);
    float *fx = to_f(x, N * IC), *fw = to_f(w, OC * IC), *fb = to_f(bias, OC), *fres = to_f(res, N * RW);
    float *out = falloc(N * OC), *tmp = falloc(N * OC), *ref = falloc(N * OC), *inpl = falloc(N * OC);
    cai_tensor tx = cai_tensor_3d(dev, fx, F32, B, T, IC), tw = cai_tensor_2d(dev, fw, F32, OC, IC);
    cai_tensor tb = cai_tensor_1d(dev, fb, F32, OC), wide = cai_tensor_3d(dev, fres, F32, B, T, RW), tr;
    ASSERT_OK(cai_tensor_narrow(&wide, 2, 3, OC, &tr)); /* residual [B,T,OC], row stride RW */
    cai_tensor tout = cai_tensor_3d(dev, out, F32, B, T, OC), ttmp = cai_tensor_3d(dev, tmp, F32, B, T, OC);
    cai_tensor tref = cai_tensor_3d(dev, ref, F32, B, T, OC), tin = cai_tensor_3d(dev, inpl, F32, B, T, OC);
    double *rd = dalloc(N * OC);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const cai_tensor *b = with_bias ? &tb : NULL;
        ASSERT_OK(ops->linear_fwd(dev, &ttmp, &tx, &tw, b));
        ASSERT_OK(ops->add(dev, &tref, &tr, &ttmp));
        ASSERT_OK(ops->linear_residual_fwd(dev, &tout, &tx, &tw, b, &tr));
        ck_assert_mem_eq(out, ref, sizeof(float) * N * OC);
        /* in place: a contiguous copy of the residual is both residual and out */
        ASSERT_OK(ops->copy(dev, &tin, &tr));
        ASSERT_OK(ops->linear_residual_fwd(dev, &tin, &tx, &tw, b, &tin));
        ck_assert_mem_eq(inpl, ref, sizeof(float) * N * OC);
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC; o++)
                rd[n * OC + o] =
                    (with_bias ? bias[o] : 0) + dot_d(x + n * IC, w + o * IC, IC) + (double)fres[n * RW + 3 + o];
        ASSERT_REL(out, rd, N * OC, 1e-5);
    }
    /* argument errors name the op and argument and write nothing */
    for (int64_t i = 0; i < N * OC; i++) out[i] = 42.0f;
    cai_tensor tbad = cai_tensor_3d(dev, fres, F32, B, T, OC - 1);
    ck_assert_int_eq(ops->linear_residual_fwd(dev, &tout, &tx, &tw, NULL, &tbad), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_residual_fwd: residual"));
    cai_tensor talias; /* same address as out, another row stride */
    ASSERT_OK(cai_tensor_narrow(&wide, 2, 0, OC, &talias));
    cai_tensor tout_w = cai_tensor_3d(dev, fres, F32, B, T, OC);
    ck_assert_int_eq(ops->linear_residual_fwd(dev, &tout_w, &tx, &tw, NULL, &talias), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "linear_residual_fwd: out"));
    ck_assert_int_eq(ops->linear_residual_fwd(dev, &tout, &tx, &tw, NULL, NULL), CAI_ERR_INVALID_ARG);
    for (int64_t i = 0; i < N * OC; i++) ck_assert(out[i] == 42.0f);
    cai_error_clear();
    free(x);
    free(w);
    free(bias);
    free(res);
    free(fx);
    free(fw);
    free(fb);
    free(fres);
    free(out);
    free(tmp);
    free(ref);
    free(inpl);
    free(rd);
}
END_TEST

START_TEST(swiglu_fwd_bwd_on_fused_views) {
    enum { N = 7, F = 13 };
    /* gate | up halves of one [N, 2F] buffer, as a fused up projection gives */
    double *gu = drandn(N * 2 * F, 42, 2.0);
    float *fgu = to_f(gu, N * 2 * F), *fdgu = falloc(N * 2 * F), *fy = falloc(N * F);
    act_ref r = {.n = N * F,
                 .x = dalloc(N * F),
                 .u = dalloc(N * F),
                 .W = drandn(N * F, 43, 1.0),
                 .y = dalloc(N * F),
                 .swiglu = 1};
    for (int n = 0; n < N; n++)
        for (int j = 0; j < F; j++) {
            r.x[n * F + j] = gu[n * 2 * F + j];
            r.u[n * F + j] = gu[n * 2 * F + F + j];
        }
    float *fW = to_f(r.W, N * F);
    cai_tensor fused = cai_tensor_2d(dev, fgu, F32, N, 2 * F), dfused = cai_tensor_2d(dev, fdgu, F32, N, 2 * F);
    cai_tensor g, u, dg, du, ty = cai_tensor_2d(dev, fy, F32, N, F), tW = cai_tensor_2d(dev, fW, F32, N, F);
    ASSERT_OK(cai_tensor_narrow(&fused, 1, 0, F, &g));
    ASSERT_OK(cai_tensor_narrow(&fused, 1, F, F, &u));
    ASSERT_OK(cai_tensor_narrow(&dfused, 1, 0, F, &dg));
    ASSERT_OK(cai_tensor_narrow(&dfused, 1, F, F, &du));
    ASSERT_OK(ops->swiglu_fwd(dev, &ty, &g, &u));
    ASSERT_OK(ops->swiglu_bwd(dev, &dg, &du, &tW, &g, &u));
    act_loss(&r);
    ASSERT_REL(fy, r.y, N * F, 2e-6);
    double *gx = dalloc(N * F), *guu = dalloc(N * F);
    fd_grad(act_loss, &r, r.x, N * F, 1e-5, gx);
    fd_grad(act_loss, &r, r.u, N * F, 1e-5, guu);
    float *got_g = falloc(N * F), *got_u = falloc(N * F);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < F; j++) {
            got_g[n * F + j] = fdgu[n * 2 * F + j];
            got_u[n * F + j] = fdgu[n * 2 * F + F + j];
        }
    ASSERT_REL(got_g, gx, N * F, 1e-5);
    ASSERT_REL(got_u, guu, N * F, 1e-5);
    free(gu);
    free(fgu);
    free(fdgu);
    free(fy);
    free(r.x);
    free(r.u);
    free(r.W);
    free(r.y);
    free(fW);
    free(gx);
    free(guu);
    free(got_g);
    free(got_u);
}
END_TEST

/* ---------------------------------------------------------------- RoPE */

typedef struct {
    int64_t B, T, H, D, R, off;
    const int32_t *pos; /* [B,T] or NULL */
    double theta;
    double *x, *W, *y;
} rope_ref;

static void rope_forward(rope_ref *r) {
    int64_t half = r->R / 2;
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t t = 0; t < r->T; t++) {
            double p = r->pos ? r->pos[b * r->T + t] : (double)(r->off + t);
            for (int64_t h = 0; h < r->H; h++) {
                const double *x = r->x + ((b * r->T + t) * r->H + h) * r->D;
                double *y = r->y + ((b * r->T + t) * r->H + h) * r->D;
                for (int64_t i = 0; i < r->D; i++) y[i] = x[i];
                for (int64_t i = 0; i < half; i++) {
                    double a = p / pow(r->theta, (double)(2 * i) / (double)r->R);
                    y[i] = x[i] * cos(a) - x[i + half] * sin(a);
                    y[i + half] = x[i + half] * cos(a) + x[i] * sin(a);
                }
            }
        }
}

static double rope_loss(void *ctx) {
    rope_ref *r = ctx;
    rope_forward(r);
    return dot_d(r->y, r->W, r->B * r->T * r->H * r->D);
}

static void rope_case(int64_t R, int use_positions) {
    enum { B = 2, T = 7, H = 3, D = 8, P = 40 };
    const int64_t n = B * T * H * D;
    int32_t pos[B * T];
    for (int i = 0; i < B * T; i++) pos[i] = (int32_t)((i * 7 + 3) % P);
    rope_ref r = {.B = B,
                  .T = T,
                  .H = H,
                  .D = D,
                  .R = R,
                  .off = 5,
                  .pos = use_positions ? pos : NULL,
                  .theta = 500.0,
                  .x = drandn(n, 50, 1.0),
                  .W = drandn(n, 51, 1.0),
                  .y = dalloc(n)};
    float *fx = to_f(r.x, n), *fW = to_f(r.W, n), *fy = falloc(n), *fcos = falloc(P * R / 2), *fsin = falloc(P * R / 2);
    cai_tensor tc = cai_tensor_2d(dev, fcos, F32, P, R / 2), ts = cai_tensor_2d(dev, fsin, F32, P, R / 2);
    cai_tensor tp = cai_tensor_2d(dev, pos, CAI_DTYPE_I32, B, T);
    cai_tensor tx = cai_tensor_4d(dev, fx, F32, B, T, H, D), ty = cai_tensor_4d(dev, fy, F32, B, T, H, D);
    cai_tensor tW = cai_tensor_4d(dev, fW, F32, B, T, H, D);
    ASSERT_OK(ops->rope_tables(dev, &tc, &ts, r.theta));
    for (int p = 0; p < P; p++)
        for (int i = 0; i < R / 2; i++) {
            double a = p / pow(r.theta, 2.0 * i / (double)R);
            ck_assert_double_le(fabs(fcos[p * R / 2 + i] - cos(a)), 1e-7);
            ck_assert_double_le(fabs(fsin[p * R / 2 + i] - sin(a)), 1e-7);
        }
    ASSERT_OK(ops->rope_fwd(dev, &ty, &tx, &tc, &ts, use_positions ? &tp : NULL, r.off));
    rope_forward(&r);
    ASSERT_REL(fy, r.y, n, 1e-6);
    /* backward = transpose rotation, checked by finite differences, in place */
    ASSERT_OK(ops->rope_bwd(dev, &tW, &tW, &tc, &ts, use_positions ? &tp : NULL, r.off));
    double *g = dalloc(n);
    fd_grad(rope_loss, &r, r.x, n, 1e-5, g);
    ASSERT_REL(fW, g, n, 1e-5);
    /* in-place forward equals out-of-place */
    ASSERT_OK(ops->rope_fwd(dev, &tx, &tx, &tc, &ts, use_positions ? &tp : NULL, r.off));
    ck_assert_mem_eq(fx, fy, (size_t)n * sizeof(float));
    free(r.x);
    free(r.W);
    free(r.y);
    free(fx);
    free(fW);
    free(fy);
    free(fcos);
    free(fsin);
    free(g);
}

START_TEST(rope_fwd_bwd) {
    rope_case(8, 0);
    rope_case(8, 1);
    rope_case(4, 0); /* partial rotary: dims 4..7 pass through */
}
END_TEST

/* paged_attention of one group of sequences into out (rows [q0, q0 + N) of the full q); returns the status */
static cai_status paged_run(float *out, const float *q, int64_t q0, int64_t N, int64_t Hq, int64_t D, cai_tensor *kc,
                            cai_tensor *vc, const int32_t *bt, int64_t S, int64_t max_blocks, const int32_t *qs,
                            const int32_t *cl, int64_t max_ctx, size_t ws_bytes) {
    cai_tensor tq = cai_tensor_4d(dev, (void *)(q + q0 * Hq * D), F32, 1, N, Hq, D),
               to = cai_tensor_4d(dev, out, F32, 1, N, Hq, D),
               tb = cai_tensor_2d(dev, (void *)bt, CAI_DTYPE_I32, S, max_blocks),
               ts = cai_tensor_1d(dev, (void *)qs, CAI_DTYPE_I32, S + 1),
               tc = cai_tensor_1d(dev, (void *)cl, CAI_DTYPE_I32, S);
    const size_t need = ops->paged_attention_workspace_bytes(dev, N, S, Hq, D, max_ctx);
    void *ws = malloc(need);
    ck_assert_ptr_nonnull(ws);
    const cai_status st =
        ops->paged_attention(dev, &to, &tq, kc, vc, &tb, &ts, &tc, max_ctx, 0.0f, ws, ws_bytes ? ws_bytes : need);
    free(ws);
    return st;
}

/* Paged attention on the host against double precision over the values
 * the op reads: a decode row beside a prompt, a long decode and a chunk
 * over a cached prefix; groups of 1, 3, 16 and 20 heads (a query tile of
 * 16, 5, 1 and 1 tokens); head_dim 20 and 64; f32, bf16 and f16 caches;
 * blocks of 4 and 16 in shuffled order. Every sequence's rows are bit for
 * bit those of the sequence alone, and the prompt's those of the same
 * tokens prefilled in two chunks (other query tiles). */
static void paged_case(int64_t Hq, int64_t Hkv, int64_t D, int64_t bs, cai_dtype cdt) {
    enum { S = 4, N = 62, MAXC = 130 };
    const int32_t ql[S] = {1, 37, 1, 23}, cl[S] = {9, 37, MAXC, 60}, qs[S + 1] = {0, 1, 38, 39, N};
    const int64_t G = Hq / Hkv, max_blocks = (MAXC + bs - 1) / bs;
    int64_t n_blocks = 3;
    for (int s = 0; s < S; s++) n_blocks += (cl[s] + bs - 1) / bs;
    int32_t *bt = calloc((size_t)(S * max_blocks), sizeof(int32_t)), *perm = calloc((size_t)n_blocks, sizeof(int32_t));
    ck_assert_ptr_nonnull(bt);
    ck_assert_ptr_nonnull(perm);
    for (int64_t i = 0; i < n_blocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = n_blocks - 1; i > 0; i--) { /* a fixed shuffle: blocks out of order */
        const int64_t j = (int64_t)(cai_rng_uniform(7, 70, (uint64_t)i) * (double)(i + 1)) % (i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int s = 0, u = 0; s < S; s++)
        for (int64_t b = 0; b < max_blocks; b++) bt[s * max_blocks + b] = b < (cl[s] + bs - 1) / bs ? perm[u++] : -1;
    const int64_t nc = n_blocks * bs * Hkv * D, es = cdt == F32 ? 4 : 2;
    double *dq = drandn(N * Hq * D, 71, 1.0), *dk = drandn(nc, 72, 1.0), *dv = drandn(nc, 73, 1.0);
    float *q = to_f(dq, N * Hq * D), *out = falloc(N * Hq * D), *part = falloc(N * Hq * D);
    unsigned char *kcb = malloc((size_t)(nc * es)), *vcb = malloc((size_t)(nc * es));
    ck_assert_ptr_nonnull(kcb);
    ck_assert_ptr_nonnull(vcb);
    for (int64_t i = 0; i < nc; i++) { /* the cache in its type; the reference from the values it holds */
        double *x[2] = {dk, dv};
        unsigned char *c[2] = {kcb, vcb};
        for (int w = 0; w < 2; w++) {
            const float f = (float)x[w][i];
            if (cdt == F32) ((float *)c[w])[i] = f, x[w][i] = f;
            else if (cdt == CAI_DTYPE_BF16)
                ((cai_bf16 *)c[w])[i] = cai_f32_to_bf16(f), x[w][i] = cai_bf16_to_f32(((cai_bf16 *)c[w])[i]);
            else ((cai_f16 *)c[w])[i] = cai_f32_to_f16(f), x[w][i] = cai_f16_to_f32(((cai_f16 *)c[w])[i]);
        }
    }
    cai_tensor kc = cai_tensor_4d(dev, kcb, cdt, n_blocks, bs, Hkv, D),
               vc = cai_tensor_4d(dev, vcb, cdt, n_blocks, bs, Hkv, D);
    ASSERT_OK(paged_run(out, q, 0, N, Hq, D, &kc, &vc, bt, S, max_blocks, qs, cl, MAXC, 0));
    double *ref = dalloc(N * Hq * D), *sc = dalloc(MAXC);
    for (int s = 0; s < S; s++)
        for (int64_t i = qs[s]; i < qs[s + 1]; i++)
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t nk = cl[s] - ql[s] + (i - qs[s]) + 1;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < nk; j++) {
                    const int64_t row = (((int64_t)bt[s * max_blocks + j / bs] * bs + j % bs) * Hkv + h / G) * D;
                    double d = 0.0;
                    for (int64_t e = 0; e < D; e++) d += dq[(i * Hq + h) * D + e] * dk[row + e];
                    sc[j] = d / sqrt((double)D);
                    mx = fmax(mx, sc[j]);
                }
                for (int64_t j = 0; j < nk; j++) sum += (sc[j] = exp(sc[j] - mx));
                for (int64_t e = 0; e < D; e++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < nk; j++)
                        o += sc[j] * dv[(((int64_t)bt[s * max_blocks + j / bs] * bs + j % bs) * Hkv + h / G) * D + e];
                    ref[(i * Hq + h) * D + e] = o / sum;
                }
            }
    ASSERT_REL(out, ref, N * Hq * D, 1e-5);
    for (int s = 0; s < S; s++) { /* alone */
        const int32_t qs1[2] = {0, ql[s]};
        ASSERT_OK(paged_run(part, q, qs[s], ql[s], Hq, D, &kc, &vc, bt + s * max_blocks, 1, max_blocks, qs1, cl + s,
                            MAXC, 0));
        ck_assert_mem_eq(part, out + qs[s] * Hq * D, (size_t)(ql[s] * Hq * D) * sizeof(float));
    }
    /* the prompt in chunks of 20 and 17 tokens, its cache already written */
    const int32_t qa[2] = {0, 20}, ca = 20, qb[2] = {0, 17}, cb = 37;
    ASSERT_OK(paged_run(part, q, 1, 20, Hq, D, &kc, &vc, bt + max_blocks, 1, max_blocks, qa, &ca, MAXC, 0));
    ASSERT_OK(
        paged_run(part + 20 * Hq * D, q, 21, 17, Hq, D, &kc, &vc, bt + max_blocks, 1, max_blocks, qb, &cb, MAXC, 0));
    ck_assert_mem_eq(part, out + Hq * D, (size_t)(37 * Hq * D) * sizeof(float));
    /* refused by name: a block outside the pool, a context shorter than its queries, a short workspace */
    bt[3 * max_blocks + 2] = (int32_t)n_blocks;
    ck_assert_int_eq(paged_run(out, q, 0, N, Hq, D, &kc, &vc, bt, S, max_blocks, qs, cl, MAXC, 0), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "paged_attention: block_tables[3, 2]"));
    bt[3 * max_blocks + 2] = perm[0];
    const int32_t short_cl[S] = {9, 36, MAXC, 60};
    ck_assert_int_eq(paged_run(out, q, 0, N, Hq, D, &kc, &vc, bt, S, max_blocks, qs, short_cl, MAXC, 0),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "sequence 1 has 37 queries and ctx_len 36"));
    ck_assert_int_eq(paged_run(out, q, 0, N, Hq, D, &kc, &vc, bt, S, max_blocks, qs, cl, MAXC, 64),
                     CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "paged_attention: workspace of 64 bytes"));
    free(bt);
    free(perm);
    free(dq);
    free(dk);
    free(dv);
    free(q);
    free(out);
    free(part);
    free(kcb);
    free(vcb);
    free(ref);
    free(sc);
}

START_TEST(paged_attention_matches_reference_and_is_batch_independent) {
    paged_case(12, 12, 64, 16, CAI_DTYPE_BF16);
    paged_case(12, 4, 20, 4, F32);
    paged_case(32, 2, 64, 16, CAI_DTYPE_F16);
    paged_case(40, 2, 20, 16, F32);
}
END_TEST

/* rope_kv_cache_write on a fused [1,N,(Hq+2Hkv)*D] buffer: bitwise
 * rope_fwd of the query and key heads, then kv_cache_write of the keys and
 * values (a slot of -1 writes nothing); qk without query heads is refused. */
START_TEST(rope_kv_cache_write_equals_the_two_ops) {
    enum { N = 4, Hq = 4, Hkv = 2, D = 8, W = (Hq + 2 * Hkv) * D, P = 16, NS = 12 };
    const int32_t pos[N] = {0, 5, 15, 3}, slots[N] = {2, -1, 11, 0};
    double *da = drandn(N * W, 53, 1.0), *dk = drandn(NS * Hkv * D, 54, 1.0), *dv = drandn(NS * Hkv * D, 55, 1.0);
    float *a = to_f(da, N * W), *b = falloc(N * W), *fc = falloc(P * D / 2), *fs = falloc(P * D / 2);
    float *kc[2], *vc[2];
    for (int i = 0; i < 2; i++) {
        kc[i] = to_f(dk, NS * Hkv * D);
        vc[i] = to_f(dv, NS * Hkv * D);
    }
    memcpy(b, a, sizeof(float) * N * W);
    cai_tensor tc = cai_tensor_2d(dev, fc, F32, P, D / 2), ts = cai_tensor_2d(dev, fs, F32, P, D / 2);
    cai_tensor tp = cai_tensor_1d(dev, (void *)pos, CAI_DTYPE_I32, N),
               tsl = cai_tensor_1d(dev, (void *)slots, CAI_DTYPE_I32, N);
    ASSERT_OK(ops->rope_tables(dev, &tc, &ts, 10000.0));
    cai_tensor qk[2], k[2], v[2], kct[2], vct[2];
    for (int i = 0; i < 2; i++) {
        cai_tensor t = cai_tensor_3d(dev, i ? b : a, F32, 1, N, W), x;
        ASSERT_OK(cai_tensor_narrow(&t, 2, 0, (Hq + Hkv) * D, &x));
        ASSERT_OK(cai_tensor_unflatten(&x, 2, D, &qk[i]));
        ASSERT_OK(cai_tensor_narrow(&t, 2, Hq * D, Hkv * D, &x));
        ASSERT_OK(cai_tensor_unflatten(&x, 2, D, &k[i]));
        ASSERT_OK(cai_tensor_narrow(&t, 2, (Hq + Hkv) * D, Hkv * D, &x));
        ASSERT_OK(cai_tensor_unflatten(&x, 2, D, &v[i]));
        kct[i] = cai_tensor_4d(dev, kc[i], F32, NS / 4, 4, Hkv, D);
        vct[i] = cai_tensor_4d(dev, vc[i], F32, NS / 4, 4, Hkv, D);
    }
    ASSERT_OK(ops->rope_kv_cache_write(dev, &qk[0], &kct[0], &vct[0], &v[0], &tsl, &tc, &ts, &tp));
    ASSERT_OK(ops->rope_fwd(dev, &qk[1], &qk[1], &tc, &ts, &tp, 0));
    ASSERT_OK(ops->kv_cache_write(dev, &kct[1], &vct[1], &k[1], &v[1], &tsl));
    ck_assert_mem_eq(a, b, sizeof(float) * N * W);
    ck_assert_mem_eq(kc[0], kc[1], sizeof(float) * NS * Hkv * D);
    ck_assert_mem_eq(vc[0], vc[1], sizeof(float) * NS * Hkv * D);
    ck_assert_float_ne(a[0], a[W * 2]); /* rotated rows, not untouched ones */
    cai_tensor only_k;
    ASSERT_OK(cai_tensor_narrow(&qk[0], 2, Hq, Hkv, &only_k));
    ck_assert_int_eq(ops->rope_kv_cache_write(dev, &only_k, &kct[0], &vct[0], &v[0], &tsl, &tc, &ts, &tp),
                     CAI_ERR_INVALID_ARG);
    free(da);
    free(dk);
    free(dv);
    free(a);
    free(b);
    free(fc);
    free(fs);
    for (int i = 0; i < 2; i++) {
        free(kc[i]);
        free(vc[i]);
    }
}
END_TEST

START_TEST(rope_on_fused_qkv_view_and_errors) {
    enum { B = 1, T = 5, H = 2, D = 4, C = H * D, P = 8 };
    double *qkv = drandn(B * T * 3 * C, 52, 1.0);
    float *f = to_f(qkv, B * T * 3 * C), *orig = falloc(B * T * 3 * C), *fc = falloc(P * D / 2),
          *fs = falloc(P * D / 2);
    memcpy(orig, f, sizeof(float) * B * T * 3 * C);
    cai_tensor t = cai_tensor_3d(dev, f, F32, B, T, 3 * C), k, k4;
    cai_tensor tc = cai_tensor_2d(dev, fc, F32, P, D / 2), ts = cai_tensor_2d(dev, fs, F32, P, D / 2);
    ASSERT_OK(ops->rope_tables(dev, &tc, &ts, 10000.0));
    ASSERT_OK(cai_tensor_narrow(&t, 2, C, C, &k));
    ASSERT_OK(cai_tensor_unflatten(&k, 2, D, &k4));
    ASSERT_OK(ops->rope_fwd(dev, &k4, &k4, &tc, &ts, NULL, 0));
    for (int tt = 0; tt < T; tt++)
        for (int j = 0; j < 3 * C; j++) {
            int i = tt * 3 * C + j;
            if (j < C || j >= 2 * C) ck_assert(f[i] == orig[i]); /* q and v untouched */
            else if (tt == 0) ck_assert(f[i] == orig[i]);        /* position 0: identity */
        }
    ck_assert(f[1 * 3 * C + C] != orig[1 * 3 * C + C]);
    ck_assert_int_eq(ops->rope_fwd(dev, &k4, &k4, &tc, &ts, NULL, 4), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "exceed the tables' 8 rows"));
    cai_error_clear();
    free(qkv);
    free(f);
    free(orig);
    free(fc);
    free(fs);
}
END_TEST

/* ---------------------------------------------------------------- embeddings */

START_TEST(embedding_fwd_bwd_and_vocab_shards) {
    enum { B = 2, T = 7, C = 13, V = 11, P = 12, OFF = 3, SPLIT = 6 };
    int32_t tok[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)((i * 5) % V); /* repeats */
    tok[3] = tok[9] = 4;
    double *wte = drandn(V * C, 60, 1.0), *wpe = drandn(P * C, 61, 1.0), *dy = drandn(B * T * C, 62, 1.0);
    float *fe = to_f(wte, V * C), *fp = to_f(wpe, P * C), *fdy = to_f(dy, B * T * C);
    float *fy = falloc(B * T * C), *fy2 = falloc(B * T * C), *fde = falloc(V * C), *fdp = falloc(P * C);
    cai_tensor tt = cai_tensor_2d(dev, tok, CAI_DTYPE_I32, B, T), te = cai_tensor_2d(dev, fe, F32, V, C);
    cai_tensor tp = cai_tensor_2d(dev, fp, F32, P, C), ty = cai_tensor_3d(dev, fy, F32, B, T, C);
    cai_tensor ty2 = cai_tensor_3d(dev, fy2, F32, B, T, C), tdy = cai_tensor_3d(dev, fdy, F32, B, T, C);
    cai_tensor tde = cai_tensor_2d(dev, fde, F32, V, C), tdp = cai_tensor_2d(dev, fdp, F32, P, C);
    ASSERT_OK(ops->embedding_fwd(dev, &ty, &tt, &te, &tp, 0, V, OFF));
    double *ry = dalloc(B * T * C), *rde = dalloc(V * C), *rdp = dalloc(P * C);
    for (int n = 0; n < B * T; n++)
        for (int c = 0; c < C; c++) ry[n * C + c] = wte[tok[n] * C + c] + wpe[(OFF + n % T) * C + c];
    ASSERT_REL(fy, ry, B * T * C, 1e-7);
    /* vocab-parallel: shard A [0,6) with wpe, shard B [6,11) without; sum == full */
    cai_tensor ea, eb;
    ASSERT_OK(cai_tensor_slice0(&te, 0, SPLIT, &ea));
    ASSERT_OK(cai_tensor_slice0(&te, SPLIT, V - SPLIT, &eb));
    ASSERT_OK(ops->embedding_fwd(dev, &ty, &tt, &ea, &tp, 0, V, OFF));
    ASSERT_OK(ops->embedding_fwd(dev, &ty2, &tt, &eb, NULL, SPLIT, V, OFF));
    for (int i = 0; i < B * T * C; i++) fy[i] += fy2[i];
    ASSERT_REL(fy, ry, B * T * C, 1e-7);
    /* backward accumulates; twice gives double */
    ASSERT_OK(ops->embedding_bwd(dev, &tde, &tdp, &tdy, &tt, 0, OFF));
    ASSERT_OK(ops->embedding_bwd(dev, &tde, &tdp, &tdy, &tt, 0, OFF));
    for (int n = 0; n < B * T; n++)
        for (int c = 0; c < C; c++) {
            rde[tok[n] * C + c] += 2 * dy[n * C + c];
            rdp[(OFF + n % T) * C + c] += 2 * dy[n * C + c];
        }
    ASSERT_REL(fde, rde, V * C, 1e-6);
    ASSERT_REL(fdp, rdp, P * C, 1e-6);
    /* shard B's gradient holds exactly the rows of its ids */
    float *fdeb = falloc((V - SPLIT) * C);
    cai_tensor tdeb = cai_tensor_2d(dev, fdeb, F32, V - SPLIT, C);
    ASSERT_OK(ops->embedding_bwd(dev, &tdeb, NULL, &tdy, &tt, SPLIT, OFF));
    for (int i = 0; i < (V - SPLIT) * C; i++) ck_assert_float_eq_tol(2 * fdeb[i], fde[SPLIT * C + i], 1e-5);
    /* bad input gets a message naming the position */
    tok[9] = V;
    ck_assert_int_eq(ops->embedding_fwd(dev, &ty, &tt, &te, &tp, 0, V, OFF), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "token id 11 at batch 1, position 2"));
    ck_assert_int_eq(ops->embedding_fwd(dev, &ty, &tt, &te, &tp, 0, 0, 6), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "exceed wpe's 12 rows"));
    cai_error_clear();
    free(wte);
    free(wpe);
    free(dy);
    free(fe);
    free(fp);
    free(fdy);
    free(fy);
    free(fy2);
    free(fde);
    free(fdp);
    free(ry);
    free(rde);
    free(rdp);
    free(fdeb);
}
END_TEST

/* ---------------------------------------------------------------- cross-entropy */

typedef struct {
    int64_t N, V, valid;
    const int32_t *tgt;
    int ignore;
    double *x, *w, *loss, *lse;
} xent_ref;

static double xent_loss(void *ctx) {
    xent_ref *r = ctx;
    double total = 0;
    for (int64_t n = 0; n < r->N; n++) {
        const double *x = r->x + n * r->V;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < r->valid; j++) m = fmax(m, x[j]);
        for (int64_t j = 0; j < r->valid; j++) s += exp(x[j] - m);
        r->lse[n] = m + log(s);
        r->loss[n] = r->tgt[n] == r->ignore ? 0.0 : r->lse[n] - x[r->tgt[n]];
        total += r->w[n] * r->loss[n];
    }
    return total;
}

START_TEST(xent_fwd_bwd_with_padding_and_ignore) {
    enum { N = 14, V = 16, VALID = 13, IGN = -100 };
    int32_t tgt[N];
    for (int n = 0; n < N; n++) tgt[n] = (int32_t)((n * 7 + 2) % VALID);
    tgt[3] = tgt[10] = IGN;
    xent_ref r = {.N = N,
                  .V = V,
                  .valid = VALID,
                  .tgt = tgt,
                  .ignore = IGN,
                  .x = drandn(N * V, 70, 3.0),
                  .w = drandn(N, 71, 1.0),
                  .loss = dalloc(N),
                  .lse = dalloc(N)};
    for (int n = 0; n < N; n++) r.x[n * V + VALID] = 50.0; /* padding: must not count */
    float *fx = to_f(r.x, N * V), *fw = to_f(r.w, N), *fl = falloc(N), *flse = falloc(N), *fdx = falloc(N * V);
    cai_tensor tx = cai_tensor_2d(dev, fx, F32, N, V), tt = cai_tensor_1d(dev, tgt, CAI_DTYPE_I32, N);
    cai_tensor tl = cai_tensor_1d(dev, fl, F32, N), tlse = cai_tensor_1d(dev, flse, F32, N);
    cai_tensor tw = cai_tensor_1d(dev, fw, F32, N), tdx = cai_tensor_2d(dev, fdx, F32, N, V);
    ASSERT_OK(ops->xent_fwd(dev, &tl, &tlse, &tx, &tt, 0, VALID, IGN));
    xent_loss(&r);
    ASSERT_REL(fl, r.loss, N, 1e-6);
    ck_assert(fl[3] == 0.0f && fl[10] == 0.0f);
    ASSERT_OK(ops->xent_bwd(dev, &tdx, &tx, &tlse, &tt, &tw, 0.0f, 0, VALID, IGN));
    double *g = dalloc(N * V);
    fd_grad(xent_loss, &r, r.x, N * V, 1e-5, g);
    ASSERT_REL(fdx, g, N * V, 1e-5);
    for (int n = 0; n < N; n++)
        for (int j = VALID; j < V; j++) ck_assert(fdx[n * V + j] == 0.0f);
    for (int j = 0; j < V; j++) ck_assert(fdx[3 * V + j] == 0.0f);
    /* scalar dloss and in place over the logits */
    float *fx2 = falloc(N * V);
    memcpy(fx2, fx, sizeof(float) * N * V);
    cai_tensor tx2 = cai_tensor_2d(dev, fx2, F32, N, V);
    ASSERT_OK(ops->xent_bwd(dev, &tx2, &tx2, &tlse, &tt, NULL, 0.25f, 0, VALID, IGN));
    for (int n = 0; n < N; n++) r.w[n] = 0.25;
    fd_grad(xent_loss, &r, r.x, N * V, 1e-5, g);
    ASSERT_REL(fx2, g, N * V, 1e-5);
    /* xent_fwd_bwd: the two ops' results bit for bit, in place; lse required */
    float *fx3 = falloc(N * V), *fl3 = falloc(N), *flse3 = falloc(N);
    memcpy(fx3, fx, sizeof(float) * N * V);
    cai_tensor tx3 = cai_tensor_2d(dev, fx3, F32, N, V), tl3 = cai_tensor_1d(dev, fl3, F32, N);
    cai_tensor tlse3 = cai_tensor_1d(dev, flse3, F32, N);
    ASSERT_OK(ops->xent_fwd_bwd(dev, &tl3, &tlse3, &tx3, &tx3, &tt, 0.25f, 0, VALID, IGN));
    ck_assert(memcmp(fl3, fl, sizeof(float) * N) == 0 && memcmp(flse3, flse, sizeof(float) * N) == 0);
    ck_assert(memcmp(fx3, fx2, sizeof(float) * N * V) == 0);
    ck_assert_int_eq(ops->xent_fwd_bwd(dev, &tl3, NULL, &tx3, &tx3, &tt, 0.25f, 0, VALID, IGN), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "xent_fwd_bwd: lse is NULL"));
    cai_error_clear();
    free(fx3);
    free(fl3);
    free(flse3);
    /* vocab-parallel statistics: shards [0,7) and [7,16) combine to the full result */
    float mx[2][N], se[2][N], tl2[2][N];
    for (int s = 0; s < 2; s++) {
        cai_tensor shard, tm = cai_tensor_1d(dev, mx[s], F32, N), tse = cai_tensor_1d(dev, se[s], F32, N);
        cai_tensor ttl = cai_tensor_1d(dev, tl2[s], F32, N);
        ASSERT_OK(cai_tensor_narrow(&tx, 1, s ? 7 : 0, s ? V - 7 : 7, &shard));
        ASSERT_OK(ops->xent_stats(dev, &tm, &tse, &ttl, &shard, &tt, s ? 7 : 0, VALID, IGN));
    }
    for (int n = 0; n < N; n++) {
        double m = fmax(mx[0][n], mx[1][n]);
        double lse = m + log(se[0][n] * exp(mx[0][n] - m) + se[1][n] * exp(mx[1][n] - m));
        ck_assert_double_le(fabs(lse - r.lse[n]), 1e-5 * fabs(r.lse[n]) + 1e-6);
        double loss = tgt[n] == IGN ? 0.0 : lse - (tl2[0][n] + tl2[1][n]);
        ck_assert_double_le(fabs(loss - r.loss[n]), 1e-5 * fabs(r.loss[n]) + 1e-5);
    }
    /* out-of-range target */
    tgt[0] = VALID;
    ck_assert_int_eq(ops->xent_fwd(dev, &tl, &tlse, &tx, &tt, 0, VALID, IGN), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "target 13 of row 0"));
    cai_error_clear();
    free(r.x);
    free(r.w);
    free(r.loss);
    free(r.lse);
    free(fx);
    free(fw);
    free(fl);
    free(flse);
    free(fdx);
    free(g);
    free(fx2);
}
END_TEST

/* argmax_rows: the lowest id among equal maxima, padding columns left out,
 * a NaN before any number, -inf rows and shards that combine. */
START_TEST(argmax_rows_ties_padding_nan_and_shards) {
    enum { N = 6, V = 11, VALID = 9, LD = 13 };
    float x[N * LD], maxv[N];
    int32_t idx[N];
    for (int i = 0; i < N * LD; i++) x[i] = (float)((i * 7919) % 23) - 11.0f;
    for (int n = 0; n < N; n++) x[n * LD + VALID] = 100.0f; /* padding column: must not win */
    x[0 * LD + 2] = 40.0f, x[0 * LD + 5] = 40.0f;           /* tie: id 2 */
    x[1 * LD + 8] = 50.0f;                                  /* last valid column */
    x[2 * LD + 3] = NAN, x[2 * LD + 4] = 60.0f;             /* NaN wins */
    for (int j = 0; j < V; j++) x[3 * LD + j] = -INFINITY;  /* all masked: id 0, -inf */
    x[4 * LD + 1] = INFINITY;
    cai_tensor full = cai_tensor_2d(dev, x, F32, N, LD), tx;
    ASSERT_OK(cai_tensor_narrow(&full, 1, 0, V, &tx)); /* strided rows */
    cai_tensor ti = cai_tensor_1d(dev, idx, CAI_DTYPE_I32, N), tm = cai_tensor_1d(dev, maxv, F32, N);
    ASSERT_OK(ops->argmax_rows(dev, &ti, &tm, &tx, 0, VALID));
    ck_assert_int_eq(idx[0], 2);
    ck_assert(maxv[0] == 40.0f);
    ck_assert_int_eq(idx[1], 8);
    ck_assert(isnan(maxv[2]) && idx[2] == 3);
    ck_assert(idx[3] == 0 && maxv[3] == -INFINITY);
    ck_assert(idx[4] == 1 && maxv[4] == INFINITY);
    for (int n = 0; n < N; n++) {
        if (n == 2) continue;
        int b = 0;
        for (int j = 1; j < VALID; j++)
            if (x[n * LD + j] > x[n * LD + b]) b = j;
        ck_assert_int_eq(idx[n], b);
        ck_assert(maxv[n] == x[n * LD + b]);
    }
    /* a shard at offset 4 with the valid ids [4, 9): columns 0..4 */
    cai_tensor sh;
    ASSERT_OK(cai_tensor_narrow(&full, 1, 4, 7, &sh));
    ASSERT_OK(ops->argmax_rows(dev, &ti, &tm, &sh, 4, VALID));
    for (int n = 0; n < N; n++) {
        if (n == 2) continue;
        int b = 4;
        for (int j = 5; j < VALID; j++)
            if (x[n * LD + j] > x[n * LD + b]) b = j;
        ck_assert_int_eq(idx[n], b);
    }
    /* a shard past the valid vocabulary: none */
    ASSERT_OK(ops->argmax_rows(dev, &ti, &tm, &sh, 20, VALID));
    for (int n = 0; n < N; n++) ck_assert(idx[n] == -1 && maxv[n] == -INFINITY);
    cai_tensor bad = cai_tensor_1d(dev, idx, CAI_DTYPE_I32, N - 1);
    ck_assert_int_eq(ops->argmax_rows(dev, &bad, &tm, &tx, 0, VALID), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(cai_error_message(), "argmax_rows"));
    cai_error_clear();
}
END_TEST

/* ---------------------------------------------------------------- optimizer, norms, elementwise */

START_TEST(adamw_matches_reference_over_steps) {
    enum { N = 37, STEPS = 5 };
    for (int decay = 0; decay < 2; decay++) {
        double *p = drandn(N, 80, 1.0), m[N] = {0}, v[N] = {0};
        float *fp = to_f(p, N), fm[N] = {0}, fv[N] = {0}, fg[N];
        uint16_t lowp[N];
        cai_tensor tp = cai_tensor_1d(dev, fp, F32, N), tm = cai_tensor_1d(dev, fm, F32, N);
        cai_tensor tv = cai_tensor_1d(dev, fv, F32, N), tg = cai_tensor_1d(dev, fg, F32, N);
        cai_tensor tl = cai_tensor_1d(dev, lowp, CAI_DTYPE_BF16, N);
        cai_adamw_params hp = {
            .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
        for (int t = 1; t <= STEPS; t++) {
            double *g = drandn(N, 81 + (uint64_t)t, 1.0);
            for (int i = 0; i < N; i++) fg[i] = (float)g[i];
            hp.step = t;
            ASSERT_OK(ops->adamw(dev, &tp, &tg, &tm, &tv, &tl, &hp, decay));
            /* reference in double, written from the paper / torch docs */
            double b1 = 0.9, b2 = 0.95, lr = (double)1e-2f, wd = (double)0.1f, eps = (double)1e-8f;
            for (int i = 0; i < N; i++) {
                double gi = 0.5 * (double)fg[i];
                if (decay) p[i] -= lr * wd * p[i];
                m[i] = b1 * m[i] + (1 - b1) * gi;
                v[i] = b2 * v[i] + (1 - b2) * gi * gi;
                double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
                p[i] -= lr * mh / (sqrt(vh) + eps);
            }
            free(g);
        }
        ASSERT_REL(fp, p, N, 1e-6);
        ASSERT_REL(fm, m, N, 1e-6);
        ASSERT_REL(fv, v, N, 1e-5);
        for (int i = 0; i < N; i++) ck_assert_uint_eq(lowp[i], cai_f32_to_bf16(fp[i]));
        free(p);
        free(fp);
    }
    cai_adamw_params bad = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .step = 0, .grad_scale = 1};
    float x[1] = {0};
    cai_tensor t = cai_tensor_1d(dev, x, F32, 1);
    ck_assert_int_eq(ops->adamw(dev, &t, &t, &t, &t, NULL, &bad, 1), CAI_ERR_INVALID_ARG);
    cai_error_clear();
}
END_TEST

START_TEST(grad_norm_and_clip) {
    enum { R = 13, C = 7 };
    double *x = drandn(R * C, 90, 2.0);
    float *fx = to_f(x, R * C), f32acc = 0.0f;
    double acc = 1.0, ref = 0.0, sum = 0.0;
    for (int i = 0; i < R * C; i++) {
        ref += x[i] * x[i];
        sum += x[i];
    }
    cai_tensor tx = cai_tensor_2d(dev, fx, F32, R, C), ta = cai_tensor_1d(dev, &acc, CAI_DTYPE_F64, 1);
    cai_tensor tf = cai_tensor_1d(dev, &f32acc, F32, 1), half;
    ASSERT_OK(cai_tensor_narrow(&tx, 1, 0, 3, &half)); /* strided rows */
    ASSERT_OK(ops->sumsq(dev, &ta, &tx));
    ASSERT_OK(ops->sumsq(dev, &ta, &tx)); /* accumulates (two "shards") */
    ck_assert_double_le(fabs(acc - (1.0 + 2 * ref)), 1e-9 * ref);
    ASSERT_OK(ops->sum(dev, &tf, &tx));
    ck_assert_double_le(fabs(f32acc - sum), 1e-5 * fabs(sum) + 1e-5);
    acc = 0.0;
    ASSERT_OK(ops->sumsq(dev, &ta, &half));
    double rh = 0;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 3; c++) rh += x[r * C + c] * x[r * C + c];
    ck_assert_double_le(fabs(acc - rh), 1e-9 * rh);
    ck_assert_float_eq_tol(cai_clip_coef(2.0, 1.0), 1.0 / (2.0 + 1e-6), 1e-7);
    ck_assert_float_eq(cai_clip_coef(0.5, 1.0), 1.0f);
    ck_assert_float_eq(cai_clip_coef(5.0, 0.0), 1.0f);
    /* clipping by scale makes the norm max_norm */
    float coef = cai_clip_coef(sqrt(ref), 1.0);
    ASSERT_OK(ops->scale(dev, &tx, coef));
    acc = 0.0;
    ASSERT_OK(ops->sumsq(dev, &ta, &tx));
    ck_assert_double_le(fabs(sqrt(acc) - 1.0), 1e-5);
    free(x);
    free(fx);
}
END_TEST

START_TEST(elementwise_ops) {
    enum { R = 5, C = 11 };
    double *a = drandn(R * C, 95, 1.0), *b = drandn(R * C, 96, 1.0);
    float *fa = to_f(a, R * C), *fb = to_f(b, R * C), *fo = falloc(R * C);
    cai_tensor ta = cai_tensor_2d(dev, fa, F32, R, C), tb = cai_tensor_2d(dev, fb, F32, R, C);
    cai_tensor to = cai_tensor_2d(dev, fo, F32, R, C);
    double *ref = dalloc(R * C);
    ASSERT_OK(ops->add(dev, &to, &ta, &tb));
    for (int i = 0; i < R * C; i++) ref[i] = a[i] + b[i];
    ASSERT_REL(fo, ref, R * C, 1e-7);
    ASSERT_OK(ops->axpy(dev, &to, -2.0f, &ta));
    for (int i = 0; i < R * C; i++) ref[i] -= 2 * a[i];
    ASSERT_REL(fo, ref, R * C, 1e-7);
    ASSERT_OK(ops->add(dev, &ta, &ta, &tb)); /* out aliases a */
    for (int i = 0; i < R * C; i++) ref[i] = a[i] + b[i];
    ASSERT_REL(fa, ref, R * C, 1e-7);
    ASSERT_OK(ops->fill(dev, &to, 0.0f));
    for (int i = 0; i < R * C; i++) ck_assert(fo[i] == 0.0f);
    cai_tensor col;
    ASSERT_OK(cai_tensor_narrow(&to, 1, 3, 2, &col));
    ASSERT_OK(ops->fill(dev, &col, 7.0f));
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) ck_assert(fo[r * C + c] == ((c == 3 || c == 4) ? 7.0f : 0.0f));
    int32_t ids[4];
    cai_tensor ti = cai_tensor_1d(dev, ids, CAI_DTYPE_I32, 4);
    ASSERT_OK(ops->fill(dev, &ti, -100.0f));
    ck_assert_int_eq(ids[3], -100);
    free(a);
    free(b);
    free(fa);
    free(fb);
    free(fo);
    free(ref);
}
END_TEST

START_TEST(argument_errors_name_op_and_argument) {
    float x[26] = {0}, w[13] = {0}, m[2], r[2];
    uint16_t xb[26] = {0};
    cai_tensor tx = cai_tensor_2d(dev, x, F32, 2, 13), tw = cai_tensor_1d(dev, w, F32, 12);
    cai_tensor tm = cai_tensor_1d(dev, m, F32, 2), tr = cai_tensor_1d(dev, r, F32, 2);
    cai_tensor txb = cai_tensor_2d(dev, xb, CAI_DTYPE_BF16, 2, 13);
    ck_assert_int_eq(ops->layernorm_fwd(dev, &tx, &tm, &tr, &tx, &tw, NULL, 1e-5f), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "layernorm_fwd: weight is f32[12], expected 13 elements");
    tw.shape[0] = 13;
    ck_assert_int_eq(ops->layernorm_fwd(dev, &txb, &tm, &tr, &txb, &tw, NULL, 1e-5f), CAI_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(
        strstr(cai_error_message(), "layernorm_fwd: inp is bf16[2,13]; this backend computes in f32"));
    cai_tensor tT;
    ASSERT_OK(cai_tensor_transpose(&tx, 0, 1, &tT));
    ck_assert_int_eq(ops->gelu_fwd(dev, &tT, &tT), CAI_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(
        strstr(cai_error_message(), "gelu_fwd: inp (f32[13,2] strides [1,13]) needs a contiguous last"));
    ck_assert_int_eq(ops->add(dev, &tx, &tx, NULL), CAI_ERR_INVALID_ARG);
    ck_assert_str_eq(cai_error_message(), "add: b is NULL");
    cai_error_clear();
}
END_TEST

static Suite *ops_suite(void) {
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, matmul_all_transposes);
    tcase_add_test(tc, matmul_panels_match_reference_and_repeat_exactly);
    tcase_add_test(tc, matmul_few_rows_beta_zero);
    tcase_add_test(tc, matmul_few_rows_row_independent);
    tcase_add_test(tc, matmul_batched_strided_and_beta_zero);
    tcase_add_test(tc, linear_fwd_bwd_match_reference);
    tcase_add_test(tc, bias_ops_match_reference);
    tcase_add_test(tc, layernorm_fwd_bwd);
    tcase_add_test(tc, rmsnorm_fwd_bwd);
    tcase_add_test(tc, gelu_fwd_bwd);
    tcase_add_test(tc, linear_gelu_fused_ops_match_composition);
    tcase_add_test(tc, linear_residual_fused_op_matches_composition);
    tcase_add_test(tc, swiglu_fwd_bwd_on_fused_views);
    tcase_add_test(tc, rope_fwd_bwd);
    tcase_add_test(tc, paged_attention_matches_reference_and_is_batch_independent);
    tcase_add_test(tc, rope_kv_cache_write_equals_the_two_ops);
    tcase_add_test(tc, rope_on_fused_qkv_view_and_errors);
    tcase_add_test(tc, embedding_fwd_bwd_and_vocab_shards);
    tcase_add_test(tc, xent_fwd_bwd_with_padding_and_ignore);
    tcase_add_test(tc, argmax_rows_ties_padding_nan_and_shards);
    tcase_add_test(tc, adamw_matches_reference_over_steps);
    tcase_add_test(tc, grad_norm_and_clip);
    tcase_add_test(tc, elementwise_ops);
    tcase_add_test(tc, argument_errors_name_op_and_argument);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    dev = test_device(2);
    if (!dev) {
        MPI_Finalize();
        return 1;
    }
    ops = dev->ops;
    SRunner *sr = srunner_create(ops_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    cai_device_free(dev);
    MPI_Finalize();
    return failed ? 1 : 0;
}
