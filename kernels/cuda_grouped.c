/* Grouped products on the GPU (docs/moe.md), two ways (CAI_CUDA_GROUPED):
 * one cuBLASLt product per block, every block planned as if it had the
 * blocks' mean row count (cuda_matmul.c: one plan whatever the routing),
 * the blocks spread over the device's stream and three side streams so one
 * block's tail overlaps the next one's start, or all blocks in one
 * cublasGemmGroupedBatchedEx call, each block its own GEMM of its own shape, cuBLAS reading the blocks' A, B, C
 * addresses from device arrays that this file keeps (one buffer that grows to the largest call, so a training step
 * allocates nothing after its first). On an H200 cuBLAS's grouped kernel runs 2048-row blocks at about 300 TFLOP/s
 * where cuBLASLt runs each at 530 and one dense product at 720 (bench/RESULTS.md). Row-major tensors are handed to
 * column-major cuBLAS transposed, as cuda_matmul.c does. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

static cudaDataType_t blas_type(cai_dtype dt) {
    return dt == CAI_DTYPE_BF16 ? CUDA_R_16BF : dt == CAI_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

static size_t dt_size(cai_dtype dt) { return dt == CAI_DTYPE_F32 ? 4 : 2; }

/* CAI_CUDA_GROUPED: 1 when blocks of `rows` rows in all (n of them) run one
 * cuBLASLt product each. auto: per block when the blocks average 1024 rows
 * or more. Measured on an H200 (bench/RESULTS.md): 8 blocks of about 2048
 * rows run 1.7x faster forward per block; 64 blocks of about 256 rows 8x
 * faster in one grouped launch (a loop of small products is launch-bound);
 * between the two the threshold is a guess. */
static int per_block(int n, int64_t rows) {
    static int mode = -1; /* 0 auto, 1 per block, 2 grouped; the knob is read once */
    if (mode < 0) {
        const char *v = NULL;
        mode = cai_knob_str("CAI_CUDA_GROUPED", &v) == CAI_OK && v ? (!strcmp(v, "loop")      ? 1
                                                                      : !strcmp(v, "grouped") ? 2
                                                                                              : 0)
                                                                   : 0;
    }
    if (mode) return mode == 1;
    return n > 0 && rows / n >= 1024;
}

/* Side streams, events and workspaces, made at the first fork. */
static cai_status side_ready(cai_device_t *dev, const char *op) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    cudaError_t e = cudaSuccess;
    for (int i = 0; e == cudaSuccess && i <= CAI_CUDA_SIDE; i++)
        if (!c->side_ev[i]) e = cudaEventCreateWithFlags(&c->side_ev[i], cudaEventDisableTiming);
    for (int i = 0; e == cudaSuccess && i < CAI_CUDA_SIDE; i++) {
        if (!c->side[i]) e = cudaStreamCreateWithFlags(&c->side[i], cudaStreamNonBlocking);
        if (e == cudaSuccess && !c->side_ws[i] && c->lt_ws_bytes) e = cudaMalloc(&c->side_ws[i], c->lt_ws_bytes);
    }
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: side streams on cuda:%d (%zu-byte cuBLASLt workspaces): %s", op, c->ordinal,
                         c->lt_ws_bytes, cudaGetErrorString(e));
    return CAI_OK;
}

cai_status cai_cuda_fork(cai_device_t *dev, const char *op, int n) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    CAI_CALL(side_ready(dev, op));
    cudaError_t e = cudaEventRecord(c->side_ev[0], c->stream);
    for (int i = 0; e == cudaSuccess && i < n; i++) e = cudaStreamWaitEvent(c->side[i], c->side_ev[0], 0);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: forking %d side streams: %s", op, n, cudaGetErrorString(e));
    return CAI_OK;
}

cai_status cai_cuda_join(cai_device_t *dev, const char *op, int n) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    cudaError_t e = cudaSuccess;
    for (int i = 0; e == cudaSuccess && i < n; i++) {
        e = cudaEventRecord(c->side_ev[i + 1], c->side[i]);
        if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream, c->side_ev[i + 1], 0);
    }
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: joining %d side streams: %s", op, n, cudaGetErrorString(e));
    return CAI_OK;
}

/* Blocks on the device's stream and the side streams in turn; the side
 * streams start after everything enqueued before and the device's stream
 * continues after all of them. */
static int lanes(int n) { return n < CAI_CUDA_SIDE + 1 ? n : CAI_CUDA_SIDE + 1; }

/* rows [off, off + n) of r */
static cai_rows rows_at(const cai_rows *r, int64_t off, int64_t n) {
    cai_rows b = *r;
    b.data += (size_t)(off * r->ld) * dt_size(r->dtype);
    b.rows = n;
    return b;
}

/* One grouped call's per-block arguments (host arrays; only blocks with rows). */
typedef struct {
    int n;
    cublasOperation_t *ta, *tb;
    int *m, *nn, *k, *lda, *ldb, *ldc, *size;
    float *alpha, *beta;
    const void **ptr; /* A[cap], B[cap], C[cap] */
    int cap;
} gcall;

static void gcall_free(gcall *g) {
    free(g->ta);
    free(g->tb);
    free(g->m);
    free(g->ptr);
    free(g->alpha);
}

static cai_status gcall_init(gcall *g, int cap, const char *op) {
    memset(g, 0, sizeof *g);
    const size_t n = (size_t)(cap > 0 ? cap : 1);
    g->cap = (int)n;
    g->ta = malloc(n * sizeof *g->ta);
    g->tb = malloc(n * sizeof *g->tb);
    g->m = malloc(n * 7 * sizeof *g->m);
    g->ptr = malloc(n * 3 * sizeof *g->ptr);
    g->alpha = malloc(n * 2 * sizeof *g->alpha);
    if (!g->ta || !g->tb || !g->m || !g->ptr || !g->alpha) {
        gcall_free(g);
        return CAI_ERROR(CAI_ERR_NOMEM, "%s: the argument arrays of %d blocks", op, cap);
    }
    g->nn = g->m + n;
    g->k = g->m + 2 * n;
    g->lda = g->m + 3 * n;
    g->ldb = g->m + 4 * n;
    g->ldc = g->m + 5 * n;
    g->size = g->m + 6 * n;
    g->beta = g->alpha + n;
    return CAI_OK;
}

/* C (m x n, column-major) = op(A) op(B) + beta C over k. */
static void gcall_add(gcall *g, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const void *a, int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc, float beta) {
    const int i = g->n++;
    g->ta[i] = ta;
    g->tb[i] = tb;
    g->m[i] = (int)m;
    g->nn[i] = (int)n;
    g->k[i] = (int)k;
    g->lda[i] = (int)lda;
    g->ldb[i] = (int)ldb;
    g->ldc[i] = (int)ldc;
    g->size[i] = 1;
    g->alpha[i] = 1.0f;
    g->beta[i] = beta;
    g->ptr[i] = a;
    g->ptr[g->cap + i] = b;
    g->ptr[2 * g->cap + i] = c;
}

static cai_status blas_ready(cai_device_t *dev, const char *op, size_t pointers) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    if (!c->blas) {
        cublasStatus_t s = cublasCreate(&c->blas);
        if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(c->blas, c->stream);
        if (s == CUBLAS_STATUS_SUCCESS && c->lt_ws) s = cublasSetWorkspace(c->blas, c->lt_ws, c->lt_ws_bytes);
        if (s != CUBLAS_STATUS_SUCCESS)
            return CAI_ERROR(CAI_ERR_CUDA, "%s: cuBLAS handle: status %d (%s)", op, (int)s, cublasGetStatusString(s));
    }
    if (pointers > c->grouped_cap) {
        if (c->grouped_ptrs) {
            cudaStreamSynchronize(c->stream);
            cai_cuda_dealloc(dev, c->grouped_ptrs);
            c->grouped_ptrs = NULL;
            c->grouped_cap = 0;
        }
        CAI_CALL(cai_cuda_alloc(dev, pointers * sizeof(void *), "grouped product pointers", (void **)&c->grouped_ptrs));
        c->grouped_cap = pointers;
    }
    return CAI_OK;
}

/* Runs g's blocks as one grouped GEMM with A/B of type ab and C of type cd. */
static cai_status gcall_run(cai_device_t *dev, const char *op, gcall *g, cai_dtype ab, cai_dtype cd) {
    if (!g->n) return CAI_OK;
    cai_cuda_impl *c = cai_cuda_of(dev);
    CAI_CALL(blas_ready(dev, op, (size_t)3 * (size_t)g->cap));
    const cublasComputeType_t ct =
        ab == CAI_DTYPE_F32 && c->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    if (ab != cd) {
        /* cuBLAS has no grouped product of 16-bit inputs into f32 (status
         * NOT_SUPPORTED): f32 gradients of 16-bit weights take one cublasGemmEx
         * per block, whose kernel choice costs nothing per shape (cuBLASLt's
         * heuristic query would run again for every new row count) */
        for (int i = 0; i < g->n; i++) {
            cublasStatus_t s =
                cublasGemmEx(c->blas, g->ta[i], g->tb[i], g->m[i], g->nn[i], g->k[i], &g->alpha[i], g->ptr[i],
                             blas_type(ab), g->lda[i], g->ptr[g->cap + i], blas_type(ab), g->ldb[i], &g->beta[i],
                             (void *)g->ptr[2 * g->cap + i], blas_type(cd), g->ldc[i], ct, CUBLAS_GEMM_DEFAULT);
            if (s != CUBLAS_STATUS_SUCCESS)
                return CAI_ERROR(CAI_ERR_CUDA, "%s: cublasGemmEx of block %d (%s x %s -> %s): status %d (%s)", op, i,
                                 cai_dtype_name(ab), cai_dtype_name(ab), cai_dtype_name(cd), (int)s,
                                 cublasGetStatusString(s));
        }
        return CAI_OK;
    }
    /* pageable source: the copy has read it when the call returns, and the
     * device array is reused only by later work on the same stream */
    cudaError_t e = cudaMemcpyAsync(c->grouped_ptrs, g->ptr, (size_t)3 * (size_t)g->cap * sizeof(void *),
                                    cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: copying the block addresses: %s", op, cudaGetErrorString(e));
    void **d = c->grouped_ptrs;
    cublasStatus_t s =
        cublasGemmGroupedBatchedEx(c->blas, g->ta, g->tb, g->m, g->nn, g->k, g->alpha, (const void *const *)d,
                                   blas_type(ab), g->lda, (const void *const *)(d + g->cap), blas_type(ab), g->ldb,
                                   g->beta, d + 2 * g->cap, blas_type(cd), g->ldc, g->n, g->size, ct);
    if (s != CUBLAS_STATUS_SUCCESS)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: cublasGemmGroupedBatchedEx of %d blocks (%s x %s -> %s): status %d (%s)",
                         op, g->n, cai_dtype_name(ab), cai_dtype_name(ab), cai_dtype_name(cd), (int)s,
                         cublasGetStatusString(s));
    return CAI_OK;
}

/* The blocks' rows fit x (and every other row tensor); *out (if given)
 * gets their sum. */
static cai_status block_total(const char *op, const int64_t *rows, int n, const cai_rows *x, const char *arg,
                              int64_t *out) {
    if (n < 0 || (n > 0 && !rows))
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %d blocks, rows %p", op, n, (const void *)rows);
    int64_t total = 0;
    for (int g = 0; g < n; g++) {
        if (rows[g] < 0) return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: block %d has %lld rows", op, g, (long long)rows[g]);
        total += rows[g];
    }
    if (total > x->rows)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: the blocks need %lld rows of %s, which has %lld", op,
                         (long long)total, arg, (long long)x->rows);
    if (out) *out = total;
    return CAI_OK;
}

/* weight[g] as rows [OC, IC] of one dtype. */
static cai_status block_weights(const char *op, const char *arg, const cai_tensor *w, int n, int want_dt, int64_t oc,
                                int64_t ic, cai_rows *out) {
    for (int g = 0; g < n; g++) {
        char name[48];
        snprintf(name, sizeof name, "%s[%d]", arg, g);
        CAI_CALL(cai_ops_rows(op, name, &w[g], CAI_CUDA, want_dt, ic, &out[g]));
        if (out[g].rows != oc)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s has %lld rows, expected %lld", op, name,
                             (long long)out[g].rows, (long long)oc);
    }
    return CAI_OK;
}

cai_status cai_cuda_grouped_linear_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                       const cai_tensor *weight, const int64_t *rows, int n) {
    static const char *op = "grouped_linear_fwd";
    if (n == 0) return CAI_OK;
    CAI_CHECK_ARG(weight, "%s: weight is NULL", op);
    cai_rows x, y;
    int64_t total;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, -1, &x));
    CAI_CALL(block_total(op, rows, n, &x, "inp", &total));
    const int64_t IC = x.cols, OC = weight[0].ndim == 2 ? weight[0].shape[0] : -1;
    cai_rows *w = malloc((size_t)n * sizeof *w);
    if (!w) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %d weights", op, n);
    cai_status st = block_weights(op, "weight", weight, n, (int)x.dtype, OC, IC, w);
    if (st == CAI_OK) st = cai_ops_rows(op, "out", out, CAI_CUDA, (int)x.dtype, OC, &y);
    if (st == CAI_OK) st = block_total(op, rows, n, &y, "out", NULL);
    if (st == CAI_OK) st = cai_cuda_enter(dev, op);
    if (st == CAI_OK && per_block(n, total)) {
        const int L = lanes(n);
        const int forked = (st = cai_cuda_fork(dev, op, L - 1)) == CAI_OK;
        for (int64_t b = 0, off = 0; st == CAI_OK && b < n; off += rows[b], b++) {
            const cai_rows xb = rows_at(&x, off, rows[b]), yb = rows_at(&y, off, rows[b]);
            if (rows[b]) st = cai_cuda_block_linear_fwd(dev, op, &xb, &w[b], &yb, total / n, (int)(b % L));
        }
        const cai_status sj = forked ? cai_cuda_join(dev, op, L - 1) : CAI_OK;
        free(w);
        return st == CAI_OK ? sj : st;
    }
    gcall g;
    if (st == CAI_OK) st = gcall_init(&g, n, op);
    if (st != CAI_OK) {
        free(w);
        return st;
    }
    const size_t ex = dt_size(x.dtype);
    for (int64_t b = 0, off = 0; b < n; off += rows[b], b++) {
        if (!rows[b]) continue;
        /* out^T [OC, r] = W [OC, IC] (row-major W read as W^T, transposed) x^T [IC, r] */
        gcall_add(&g, CUBLAS_OP_T, CUBLAS_OP_N, OC, rows[b], IC, w[b].data, w[b].ld, x.data + off * x.ld * ex, x.ld,
                  y.data + off * y.ld * ex, y.ld, 0.0f);
    }
    st = gcall_run(dev, op, &g, x.dtype, y.dtype);
    gcall_free(&g);
    free(w);
    return st;
}

cai_status cai_cuda_grouped_linear_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, const cai_tensor *dout,
                                       const cai_tensor *inp, const cai_tensor *weight, const int64_t *rows, int n,
                                       int accum) {
    static const char *op = "grouped_linear_bwd";
    if (n == 0) return CAI_OK;
    CAI_CHECK_ARG(weight && dweight, "%s: weight or dweight is NULL", op);
    cai_rows x, dy, dx;
    int64_t total;
    CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, -1, &x));
    CAI_CALL(block_total(op, rows, n, &x, "inp", &total));
    const int64_t IC = x.cols, OC = weight[0].ndim == 2 ? weight[0].shape[0] : -1;
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_CUDA, (int)x.dtype, OC, &dy));
    CAI_CALL(block_total(op, rows, n, &dy, "dout", NULL));
    if (dinp) {
        CAI_CALL(cai_ops_rows(op, "dinp", dinp, CAI_CUDA, (int)x.dtype, IC, &dx));
        CAI_CALL(block_total(op, rows, n, &dx, "dinp", NULL));
    }
    cai_rows *w = malloc((size_t)n * 2 * sizeof *w);
    if (!w) return CAI_ERROR(CAI_ERR_NOMEM, "%s: %d weights", op, n);
    cai_rows *dw = w + n;
    gcall gx, gw;
    memset(&gx, 0, sizeof gx);
    memset(&gw, 0, sizeof gw);
    cai_status st = block_weights(op, "weight", weight, n, (int)x.dtype, OC, IC, w);
    if (st == CAI_OK) st = block_weights(op, "dweight", dweight, n, CAI_ANYF, OC, IC, dw);
    for (int b = 1; st == CAI_OK && b < n; b++)
        if (dw[b].dtype != dw[0].dtype)
            st = CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: dweight[%d] is %s, dweight[0] %s", op, b,
                           cai_dtype_name(dw[b].dtype), cai_dtype_name(dw[0].dtype));
    if (st == CAI_OK) st = cai_cuda_enter(dev, op);
    if (st == CAI_OK && per_block(n, total)) {
        const int L = lanes(n);
        const int forked = (st = cai_cuda_fork(dev, op, L - 1)) == CAI_OK;
        for (int64_t b = 0, off = 0; st == CAI_OK && b < n; off += rows[b], b++) {
            const cai_rows xb = rows_at(&x, off, rows[b]), dyb = rows_at(&dy, off, rows[b]);
            const cai_rows dxb = dinp ? rows_at(&dx, off, rows[b]) : xb;
            if (rows[b])
                st = cai_cuda_block_linear_bwd(dev, op, dinp ? &dxb : NULL, &dw[b], &dyb, &xb, &w[b], accum, total / n,
                                               (int)(b % L));
        }
        const cai_status sj = forked ? cai_cuda_join(dev, op, L - 1) : CAI_OK;
        free(w);
        return st == CAI_OK ? sj : st;
    }
    if (st == CAI_OK) st = gcall_init(&gx, n, op);
    if (st == CAI_OK) st = gcall_init(&gw, n, op);
    const size_t ex = dt_size(x.dtype);
    for (int64_t b = 0, off = 0; st == CAI_OK && b < n; off += rows[b], b++) {
        if (!rows[b]) continue;
        const char *xb = x.data + off * x.ld * ex, *dyb = dy.data + off * dy.ld * ex;
        /* dinp^T [IC, r] = W^T [IC, OC] dout^T [OC, r] */
        if (dinp)
            gcall_add(&gx, CUBLAS_OP_N, CUBLAS_OP_N, IC, rows[b], OC, w[b].data, w[b].ld, dyb, dy.ld,
                      dx.data + off * dx.ld * ex, dx.ld, accum ? 1.0f : 0.0f);
        /* dW^T [IC, OC] += x^T [IC, r] dout [r, OC] */
        gcall_add(&gw, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, rows[b], xb, x.ld, dyb, dy.ld, dw[b].data, dw[b].ld, 1.0f);
    }
    if (st == CAI_OK && dinp) st = gcall_run(dev, op, &gx, x.dtype, dx.dtype);
    if (st == CAI_OK) st = gcall_run(dev, op, &gw, x.dtype, dw[0].dtype);
    gcall_free(&gx);
    gcall_free(&gw);
    free(w);
    return st;
}
