/* CPU backend: matrix products through OpenBLAS sgemm (and, for the
 * forward product of a few rows, a loop of our own: gemm_few). Weights are [out,in]
 * row-major, so forward is x W^T, the input gradient dy W and the weight
 * gradient dy^T x: sgemm calls with transposes, no copies. The fused
 * linear + GELU and linear + residual ops are compositions here (see
 * cai_cpu_linear_gelu_fwd, cai_cpu_linear_residual_fwd).
 *
 * Threads: OpenBLAS is kept single-threaded (cai_device_init) and large
 * products are split into row or column panels across the device's OpenMP
 * threads, one sgemm each (sgemv for a product of one row, gemm_few for
 * a forward product of a few). One thread
 * pool serves every op, so BLAS threads never spin against OpenMP threads.
 * OpenBLAS computes the last rows/columns of a call with tail kernels whose
 * rounding differs, so results can change in the last bits with the thread
 * count (never from run to run). */
#include "cai_config.h"
#include "cpu_internal.h"

#include <cblas.h>
#include <string.h>

/* A (possibly batched) row-major matrix: batch x [rows, cols], leading
 * dimension ld, batch stride bs (elements). */
typedef struct {
    float *data;
    int64_t batch, rows, cols, ld, bs;
} bmat;

static cai_status as_bmat(const char *op, const char *arg, const cai_tensor *t, bmat *m) {
    CAI_CALL(cai_ops_check(op, arg, t, CAI_HOST, CAI_F32));
    if (t->ndim < 2)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected at least 2 dimensions", op, arg,
                         CAI_OPS_DESCRIBE(t));
    int nd = t->ndim;
    bmat r = {.data = t->data, .batch = 1, .rows = t->shape[nd - 2], .cols = t->shape[nd - 1]};
    if (r.cols > 1 && t->stride[nd - 1] != 1)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: %s (%s) needs a contiguous last dimension (transpose through "
                         "trans_a/trans_b instead)",
                         op, arg, CAI_OPS_DESCRIBE(t));
    r.ld = r.rows > 1 ? t->stride[nd - 2] : (r.cols > 0 ? r.cols : 1);
    if (r.ld < r.cols)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s) has overlapping rows", op, arg, CAI_OPS_DESCRIBE(t));
    int64_t expect = -1;
    r.bs = 0;
    for (int i = nd - 3; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (expect < 0) r.bs = t->stride[i];
        else if (t->stride[i] != expect)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s (%s): its batch dimensions do not collapse into one", op, arg,
                             CAI_OPS_DESCRIBE(t));
        expect = t->stride[i] * t->shape[i];
        r.batch *= t->shape[i];
    }
    for (int i = nd - 3; i >= 0; i--)
        if (t->shape[i] == 0) r.batch = 0;
    *m = r;
    return CAI_OK;
}

/* c (rows x cols, ld) = beta * c: BLAS does this itself except when K = 0. */
static void scale_matrix(float *c, int64_t rows, int64_t cols, int64_t ld, float beta) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) c[i * ld + j] = beta == 0.0f ? 0.0f : beta * c[i * ld + j];
}

/* One row (a decode step of one sequence): sgemm packs all of op(B) on
 * every call, which at one row takes 2.5-3.6x the product itself; sgemv
 * reads it once (bench/RESULTS.md). With beta 0, sgemv (as sgemm) does not
 * read C. */
static void gemv_row(int ta, int tb, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C) {
    const blasint inc = ta ? (blasint)(lda > 0 ? lda : 1) : 1, lb = (blasint)(ldb > 0 ? ldb : 1);
    if (tb) cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, alpha, B, lb, A, inc, beta, C, 1);
    else cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)K, (blasint)N, alpha, B, lb, A, inc, beta, C, 1);
}

/* A few rows of the forward product C = alpha A B^T + beta C (a small
 * decode batch: B the [N,K] weights): sgemm packs B on every call, as at
 * one row, and sgemv per row would read it M times. Here each row of B is
 * read once for all the rows of A (FEW_ROWS at a time: their partial sums
 * fill the vector registers), in 8 partial sums a row added in a fixed
 * order, so a row's result does not depend on the others or on the thread
 * count. */
#define FEW_ROWS 4

/* The row's 8 partial sums (lane k mod 8) added in a fixed order, then the
 * columns past the last multiple of 8, into C. */
static inline void few_rows_store(const float *p, const float *a, const float *b, int64_t K8, int64_t K, float alpha,
                                  float beta, float *c) {
    float s = ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
    for (int64_t k = K8; k < K; k++) s += a[k] * b[k];
    *c = beta == 0.0f ? alpha * s : alpha * s + beta * *c;
}

/* Rows 0 .. MR of A (and C) for column n. MR is a constant where it is
 * called and the sums are named variables, not an array, so they stay in
 * registers. Two widths, 4 (SSE, any x86-64; NEON) and 8 (AVX2), with the
 * same 8 partial sums a row (lane k mod 8: low and high halves at 4 wide),
 * so both give the same bits. */
#define FEW_ROW(i, acc, VT, off)                               \
    do {                                                       \
        if (MR > (i)) {                                        \
            VT av_;                                            \
            memcpy(&av_, A + (i)*lda + k + (off), sizeof av_); \
            acc += av_ * bv;                                   \
        }                                                      \
    } while (0)
/* One k step of VT-wide lanes at k + off: b's lanes against rows 0..3's, into s0..s3. */
#define FEW_STEP(VT, off, s0, s1, s2, s3)      \
    do {                                       \
        VT bv;                                 \
        memcpy(&bv, b + k + (off), sizeof bv); \
        FEW_ROW(0, s0, VT, off);               \
        FEW_ROW(1, s1, VT, off);               \
        FEW_ROW(2, s2, VT, off);               \
        FEW_ROW(3, s3, VT, off);               \
    } while (0)

typedef float cai_v4 __attribute__((vector_size(16)));
static inline __attribute__((always_inline)) void few_rows_v4(int MR, int64_t n, int64_t K, float alpha, const float *A,
                                                              int64_t lda, const float *b, float beta, float *C,
                                                              int64_t ldc) {
    const int64_t K8 = K / 8 * 8;
    cai_v4 l0 = {0}, l1 = {0}, l2 = {0}, l3 = {0}, h0 = {0}, h1 = {0}, h2 = {0}, h3 = {0};
    for (int64_t k = 0; k < K8; k += 8) {
        FEW_STEP(cai_v4, 0, l0, l1, l2, l3);
        FEW_STEP(cai_v4, 4, h0, h1, h2, h3);
    }
    const cai_v4 lo[FEW_ROWS] = {l0, l1, l2, l3}, hi[FEW_ROWS] = {h0, h1, h2, h3};
    for (int i = 0; i < MR; i++) {
        float p[8];
        memcpy(p, &lo[i], 16);
        memcpy(p + 4, &hi[i], 16);
        few_rows_store(p, A + i * lda, b, K8, K, alpha, beta, C + i * ldc + n);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FEW_AVX2 1
typedef float cai_v8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline, target("avx2"))) void few_rows_v8(int MR, int64_t n, int64_t K, float alpha,
                                                                              const float *A, int64_t lda,
                                                                              const float *b, float beta, float *C,
                                                                              int64_t ldc) {
    const int64_t K8 = K / 8 * 8;
    cai_v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t k = 0; k < K8; k += 8) FEW_STEP(cai_v8, 0, a0, a1, a2, a3);
    float p[FEW_ROWS][8];
    memcpy(p[0], &a0, 32);
    memcpy(p[1], &a1, 32);
    memcpy(p[2], &a2, 32);
    memcpy(p[3], &a3, 32);
    for (int i = 0; i < MR; i++) few_rows_store(p[i], A + i * lda, b, K8, K, alpha, beta, C + i * ldc + n);
}
#endif
#undef FEW_STEP
#undef FEW_ROW

#define FEW_SWEEP(NAME, COL, ATTR)                                                                                   \
    static ATTR void NAME(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B, \
                          int64_t ldb, float beta, float *C, int64_t ldc) {                                          \
        for (int64_t n = 0; n < N; n++)                                                                              \
            for (int64_t m0 = 0; m0 < M; m0 += FEW_ROWS) {                                                           \
                const float *a = A + m0 * lda, *b = B + n * ldb;                                                     \
                float *c = C + m0 * ldc;                                                                             \
                switch (M - m0 < FEW_ROWS ? M - m0 : FEW_ROWS) {                                                     \
                case 1: COL(1, n, K, alpha, a, lda, b, beta, c, ldc); break;                                         \
                case 2: COL(2, n, K, alpha, a, lda, b, beta, c, ldc); break;                                         \
                case 3: COL(3, n, K, alpha, a, lda, b, beta, c, ldc); break;                                         \
                default: COL(4, n, K, alpha, a, lda, b, beta, c, ldc); break;                                        \
                }                                                                                                    \
            }                                                                                                        \
    }
FEW_SWEEP(gemm_few_v4, few_rows_v4, )
#ifdef FEW_AVX2
FEW_SWEEP(gemm_few_v8, few_rows_v8, __attribute__((target("avx2"))))
#endif

/* The most rows gemm_few takes: on a 2-core Xeon it beat OpenBLAS's sgemm
 * at 2 to 8 rows with AVX2 and at 2 to 4 without, and sgemv at one row
 * stays ahead of it (bench/RESULTS.md). */
static int few_max(void) {
#ifdef FEW_AVX2
    if (__builtin_cpu_supports("avx2")) return 8;
#endif
    return 4;
}

static void gemm_few(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda, const float *B,
                     int64_t ldb, float beta, float *C, int64_t ldc) {
#ifdef FEW_AVX2
    if (__builtin_cpu_supports("avx2")) {
        gemm_few_v8(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    gemm_few_v4(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M == 0 || N == 0) return;
    if (K == 0) {
        scale_matrix(C, M, N, ldc, beta);
        return;
    }
    if (!ta && tb && M >= 2 && M <= few_max()) {
        gemm_few(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (M == 1) {
        gemv_row(ta, tb, N, K, alpha, A, lda, B, ldb, beta, C);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, (blasint)(lda > 0 ? lda : 1), B, (blasint)(ldb > 0 ? ldb : 1), beta, C,
                (blasint)(ldc > 0 ? ldc : 1));
}

/* gemm split over the device's threads: panels of the larger of M and N, in
 * multiples of 16 rows/columns (kernel-friendly); the team is all the
 * threads however few the panels (cai_cpu_threads says why). */
static void pgemm(const cai_device_t *dev, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int nt = dev->num_threads;
    if (nt <= 1 || (double)M * (double)N * (double)K < 262144.0) {
        gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int split_m = M >= N;
    int64_t total = split_m ? M : N;
    int64_t parts = (total + 15) / 16;
    if (parts > nt) parts = nt;
    int64_t chunk = ((total + parts - 1) / parts + 15) / 16 * 16;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t p = 0; p < parts; p++) {
        int64_t s = p * chunk, len = total - s < chunk ? total - s : chunk;
        if (len <= 0) continue;
        if (split_m) gemm(ta, tb, len, N, K, alpha, ta ? A + s : A + s * lda, lda, B, ldb, beta, C + s * ldc, ldc);
        else gemm(ta, tb, M, len, K, alpha, A, lda, tb ? B + s * ldb : B + s, ldb, beta, C + s, ldc);
    }
}

cai_status cai_cpu_matmul(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, int trans_a, const cai_tensor *b,
                          int trans_b, float alpha, float beta) {
    static const char *op = "matmul";
    bmat A, B, C;
    CAI_CALL(as_bmat(op, "a", a, &A));
    CAI_CALL(as_bmat(op, "b", b, &B));
    CAI_CALL(as_bmat(op, "c", c, &C));
    int64_t M = trans_a ? A.cols : A.rows, K = trans_a ? A.rows : A.cols;
    int64_t Kb = trans_b ? B.cols : B.rows, N = trans_b ? B.rows : B.cols;
    if (K != Kb || C.rows != M || C.cols != N)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: op(a) is [%" PRId64 ",%" PRId64 "], op(b) [%" PRId64 ",%" PRId64 "], c [%" PRId64
                         ",%" PRId64 "] (a %s%s, b %s%s): inner sizes or c's shape do not fit",
                         op, M, K, Kb, N, C.rows, C.cols, CAI_OPS_DESCRIBE(a), trans_a ? "^T" : "", CAI_OPS_DESCRIBE(b),
                         trans_b ? "^T" : "");
    if ((A.batch != 1 && A.batch != C.batch) || (B.batch != 1 && B.batch != C.batch) ||
        (C.batch != (A.batch > B.batch ? A.batch : B.batch)))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: batch sizes a=%" PRId64 ", b=%" PRId64 ", c=%" PRId64
                         " do not match (a or b may be unbatched)",
                         op, A.batch, B.batch, C.batch);
    /* A shared b with a plain a: the batch is just more rows of one gemm. */
    if (C.batch > 1 && B.batch == 1 && !trans_a && A.bs == A.rows * A.ld && C.bs == C.rows * C.ld) {
        pgemm(dev, 0, trans_b, M * C.batch, N, K, alpha, A.data, A.ld, B.data, B.ld, beta, C.data, C.ld);
        return CAI_OK;
    }
    for (int64_t i = 0; i < C.batch; i++)
        pgemm(dev, trans_a, trans_b, M, N, K, alpha, A.data + (A.batch > 1 ? i * A.bs : 0), A.ld,
              B.data + (B.batch > 1 ? i * B.bs : 0), B.ld, beta, C.data + i * C.bs, C.ld);
    return CAI_OK;
}

/* linear_fwd's argument checks under the calling op's name; out_arg names
 * the output ("out", or "pre" for linear_gelu_fwd). */
static cai_status linear_fwd_args(const char *op, const char *out_arg, const cai_tensor *out, const cai_tensor *inp,
                                  const cai_tensor *weight, const cai_tensor *bias, cai_rows *x, cai_rows *w,
                                  cai_rows *y, char **bd) {
    return cai_ops_linear_args(op, out_arg, out, inp, weight, bias, CAI_HOST, CAI_F32, x, w, y, bd);
}

static void linear_fwd_run(cai_device_t *dev, const cai_rows *x, const cai_rows *w, const cai_rows *y, const char *bd) {
    if (bd) {
        const float *pb = (const float *)bd;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, y->rows)) schedule(static)
        for (int64_t i = 0; i < y->rows; i++) memcpy(cai_row_f32(y, i), pb, (size_t)y->cols * sizeof(float));
    }
    pgemm(dev, 0, 1, x->rows, w->rows, w->cols, 1.0f, (const float *)x->data, x->ld, (const float *)w->data, w->ld,
          bd ? 1.0f : 0.0f, (float *)y->data, y->ld);
}

cai_status cai_cpu_linear_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                              const cai_tensor *bias) {
    cai_rows x, w, y;
    char *bd;
    CAI_CALL(linear_fwd_args("linear_fwd", "out", out, inp, weight, bias, &x, &w, &y, &bd));
    linear_fwd_run(dev, &x, &w, &y, bd);
    return CAI_OK;
}

/* linear_bwd's argument checks under the calling op's name; dinp_arg names
 * the input gradient ("dinp", or "dpre" for linear_bwd_dgelu). */
static cai_status linear_bwd_args(const char *op, const char *dinp_arg, const cai_tensor *dinp,
                                  const cai_tensor *dweight, const cai_tensor *dbias, const cai_tensor *dout,
                                  const cai_tensor *inp, const cai_tensor *weight, cai_rows *dx, cai_rows *dw,
                                  cai_rows *dy, cai_rows *x, cai_rows *w, char **bd) {
    CAI_CALL(cai_ops_rows(op, "weight", weight, CAI_HOST, CAI_F32, -1, w));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, w->rows, dy));
    if (dinp) {
        CAI_CALL(cai_ops_rows(op, dinp_arg, dinp, CAI_HOST, CAI_F32, w->cols, dx));
        if (dx->rows != dy->rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s has %" PRId64 " rows but dout %" PRId64, op, dinp_arg,
                             dx->rows, dy->rows);
    }
    if (dweight) {
        CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_HOST, CAI_F32, w->cols, x));
        CAI_CALL(cai_ops_rows(op, "dweight", dweight, CAI_HOST, CAI_F32, w->cols, dw));
        if (x->rows != dy->rows || dw->rows != w->rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: inp has %" PRId64 " rows (dout %" PRId64 "), dweight %" PRId64 " (weight %" PRId64
                             ")",
                             op, x->rows, dy->rows, dw->rows, w->rows);
    }
    *bd = NULL;
    if (dbias) CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_HOST, CAI_F32, w->rows, bd));
    return CAI_OK;
}

/* The products and the bias gradient of a validated linear backward (dx,
 * dw, db NULL: skip). */
static void linear_bwd_run(cai_device_t *dev, const cai_rows *dx, const cai_rows *dw, char *db, const cai_rows *dy,
                           const cai_rows *x, const cai_rows *w, int accum_dinp) {
    if (dx)
        pgemm(dev, 0, 0, dy->rows, w->cols, w->rows, 1.0f, (const float *)dy->data, dy->ld, (const float *)w->data,
              w->ld, accum_dinp ? 1.0f : 0.0f, (float *)dx->data, dx->ld);
    if (dw)
        pgemm(dev, 1, 0, w->rows, w->cols, dy->rows, 1.0f, (const float *)dy->data, dy->ld, (const float *)x->data,
              x->ld, 1.0f, (float *)dw->data, dw->ld);
    if (db) cai_cpu_colsum(dev, (float *)db, dy);
}

cai_status cai_cpu_linear_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                              const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight, int accum_dinp) {
    cai_rows dx, dw, dy, x, w;
    char *bd;
    CAI_CALL(
        linear_bwd_args("linear_bwd", "dinp", dinp, dweight, dbias, dout, inp, weight, &dx, &dw, &dy, &x, &w, &bd));
    linear_bwd_run(dev, dinp ? &dx : NULL, dweight ? &dw : NULL, bd, &dy, &x, &w, accum_dinp);
    return CAI_OK;
}

/* The fused linear + GELU ops are compositions on this backend (no epilogue
 * to fuse into): the linear above, then the GELU kernels of
 * cpu_pointwise.c (gelu_bwd in place on dpre), so results equal the two-op
 * sequence bit for bit. Every argument is checked first, under the fused
 * op's name, so a bad call fails before anything is written. */
cai_status cai_cpu_linear_gelu_fwd(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp,
                                   const cai_tensor *weight, const cai_tensor *bias) {
    static const char *op = "linear_gelu_fwd";
    cai_rows x, w, p, a;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "pre", pre, inp, weight, bias, &x, &w, &p, &bd));
    CAI_CALL(cai_ops_rows(op, "act", act, CAI_HOST, CAI_F32, -1, &a));
    CAI_CALL(cai_ops_same_rows(op, "act", &a, "pre", &p));
    linear_fwd_run(dev, &x, &w, &p, bd);
    return cai_cpu_gelu_fwd(dev, act, pre);
}

/* No pass over the weights to save on the host: the three ops. */
cai_status cai_cpu_linear_swiglu_fwd(cai_device_t *dev, cai_tensor *act, cai_tensor *gate, cai_tensor *up,
                                     const cai_tensor *inp, const cai_tensor *w_gate, const cai_tensor *w_up) {
    CAI_CALL(cai_cpu_linear_fwd(dev, gate, inp, w_gate, NULL));
    CAI_CALL(cai_cpu_linear_fwd(dev, up, inp, w_up, NULL));
    return cai_cpu_swiglu_fwd(dev, act, gate, up);
}

cai_status cai_cpu_linear_bwd_dgelu(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias,
                                    const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                    const cai_tensor *pre) {
    static const char *op = "linear_bwd_dgelu";
    cai_rows dx, dw, dy, x, w, p;
    char *bd;
    CAI_CHECK_ARG(dpre, "%s: dpre is NULL", op);
    CAI_CALL(linear_bwd_args(op, "dpre", dpre, dweight, dbias, dout, inp, weight, &dx, &dw, &dy, &x, &w, &bd));
    CAI_CALL(cai_ops_rows(op, "pre", pre, CAI_HOST, CAI_F32, -1, &p));
    CAI_CALL(cai_ops_same_rows(op, "pre", &p, "dpre", &dx));
    linear_bwd_run(dev, &dx, dweight ? &dw : NULL, bd, &dy, &x, &w, 0);
    return cai_cpu_gelu_bwd(dev, dpre, pre, dpre);
}

/* The fused linear + residual is a composition here too: linear_fwd into
 * out, then add(out, residual, out) -- the model's old linear_fwd(tmp) +
 * add(out, residual, tmp) bit for bit (same products, same panels, one f32
 * addition). In place (out is residual) the product cannot go into out
 * first, so it goes into a temporary [N,OC] buffer: the same numbers at the
 * cost of an allocation, which the model never pays (its out and residual
 * are different buffers). */
cai_status cai_cpu_linear_residual_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                       const cai_tensor *weight, const cai_tensor *bias, const cai_tensor *residual) {
    static const char *op = "linear_residual_fwd";
    cai_rows x, w, y, r;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "out", out, inp, weight, bias, &x, &w, &y, &bd));
    CAI_CALL(cai_ops_rows(op, "residual", residual, CAI_HOST, CAI_F32, -1, &r));
    CAI_CALL(cai_ops_same_rows(op, "residual", &r, "out", &y));
    if (y.rows == 0 || y.cols == 0) return CAI_OK;
    if (r.data != y.data) {
        linear_fwd_run(dev, &x, &w, &y, bd);
        return cai_cpu_add(dev, out, residual, out);
    }
    if (y.rows > 1 && r.ld != y.ld)
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: out (%s) and residual (%s) start at the same address with "
                         "different row strides; in place needs the same view",
                         op, CAI_OPS_DESCRIBE(out), CAI_OPS_DESCRIBE(residual));
    void *buf = NULL;
    CAI_CALL(cai_malloc(&buf, (size_t)(y.rows * y.cols) * sizeof(float), "linear_residual_fwd in-place product"));
    cai_rows t = {.data = buf, .rows = y.rows, .cols = y.cols, .ld = y.cols, .dtype = CAI_DTYPE_F32};
    linear_fwd_run(dev, &x, &w, &t, bd);
    cai_tensor tt = cai_tensor_2d(NULL, buf, CAI_DTYPE_F32, y.rows, y.cols);
    cai_status st = cai_cpu_add(dev, out, residual, &tt);
    cai_free(buf);
    return st;
}

cai_status cai_cpu_bias_add(cai_device_t *dev, cai_tensor *x, const cai_tensor *bias) {
    static const char *op = "bias_add";
    cai_rows r;
    char *bd;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_HOST, CAI_F32, -1, &r));
    CAI_CALL(cai_ops_vec(op, "bias", bias, CAI_HOST, CAI_F32, r.cols, &bd));
    const float *pb = (const float *)bd;
#pragma omp parallel for num_threads(cai_cpu_threads(dev, r.rows)) schedule(static)
    for (int64_t i = 0; i < r.rows; i++) {
        float *p = cai_row_f32(&r, i);
#pragma omp simd
        for (int64_t j = 0; j < r.cols; j++) p[j] += pb[j];
    }
    return CAI_OK;
}

cai_status cai_cpu_bias_grad(cai_device_t *dev, cai_tensor *dbias, const cai_tensor *dout) {
    static const char *op = "bias_grad";
    cai_rows r;
    char *bd;
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_HOST, CAI_F32, -1, &r));
    CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_HOST, CAI_F32, r.cols, &bd));
    cai_cpu_colsum(dev, (float *)bd, &r);
    return CAI_OK;
}
