/* CUDA backend: matrix products through cuBLASLt.
 *
 * cuBLASLt is column-major and our tensors are row-major. A row-major [r,c]
 * matrix with row stride ld is the column-major [c,r] matrix with the same
 * ld, so C = op(A) op(B) is computed as C^T = op(B)^T op(A)^T: cuBLASLt's
 * "A" is our b, its "B" our a, the transpose flags carry over unchanged,
 * and nothing is copied. Inputs f32 (exact f32, or TF32 when CAI_CUDA_TF32=1),
 * bf16 or f16 with f32 accumulation; outputs f32 or the input dtype. The
 * linear forward fuses its bias as a cuBLASLt epilogue; linear_gelu_fwd and
 * linear_bwd_dgelu fuse GPT-2's GELU and its derivative the same way (the
 * GELU input "pre" is cuBLASLt's aux matrix), falling back to the plain
 * gemm and the elementwise GELU kernels where cuBLASLt cannot;
 * linear_residual_fwd adds the residual as cuBLASLt's C input (beta = 1, C
 * separate from the output D). Heuristic answers are cached per device,
 * keyed by everything the query depends on. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <string.h>

/* A (possibly batched) row-major matrix: batch x [rows, cols], row stride
 * ld, batch stride bs (elements). */
typedef struct {
    char *data;
    int64_t batch, rows, cols, ld, bs;
    cai_dtype dt;
} cmat;

static cai_status as_cmat(const char *op, const char *arg, const cai_tensor *t, cmat *m) {
    CAI_CALL(cai_ops_check(op, arg, t, CAI_CUDA, CAI_ANYF));
    if (t->ndim < 2)
        return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s is %s, expected at least 2 dimensions", op, arg,
                         CAI_OPS_DESCRIBE(t));
    int nd = t->ndim;
    cmat r = {.data = t->data, .batch = 1, .rows = t->shape[nd - 2], .cols = t->shape[nd - 1], .dt = t->dtype};
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

static cmat cmat_of_rows(const cai_rows *r) {
    cmat m = {.data = r->data, .batch = 1, .rows = r->rows, .cols = r->cols, .ld = r->ld, .bs = 0, .dt = r->dtype};
    if (m.ld < 1) m.ld = m.cols > 0 ? m.cols : 1;
    return m;
}

static cudaDataType_t cuda_type(cai_dtype dt) {
    return dt == CAI_DTYPE_BF16 ? CUDA_R_16BF : dt == CAI_DTYPE_F16 ? CUDA_R_16F : CUDA_R_32F;
}

/* Largest power of two <= 256 dividing the address and both strides in bytes. */
static uint32_t alignment(const void *p, int64_t ld, int64_t bs, cai_dtype dt) {
    size_t es = cai_dtype_size(dt);
    uintptr_t v = (uintptr_t)p | (uintptr_t)((size_t)ld * es) | (uintptr_t)((size_t)bs * es);
    uint32_t a = 256;
    while (a > 1 && (v & (a - 1))) a >>= 1;
    return a;
}

/* GELU epilogues. Forward: D = gelu(AB + bias), aux = AB + bias (written).
 * Backward: D = gelu'(aux) * AB (aux read). aux has D's layout (our row-major
 * [M,N] with row stride aux_ld, i.e. cuBLASLt's column-major [N,M]) and D's
 * dtype (cuBLASLt's default aux type). */
enum { GELU_NONE, GELU_FWD, GELU_BWD };

typedef struct {
    int ta, tb;
    int64_t M, N, K, batch;
    const cmat *A, *B;
    const cmat *C;
    float alpha, beta;
    const void *bias; /* epilogue bias [N] (NULL: none) */
    cai_dtype bias_dt;
    int gelu;  /* GELU_NONE / GELU_FWD / GELU_BWD (single gemm only, batch 1) */
    void *aux; /* the GELU input matrix when gelu != GELU_NONE */
    int64_t aux_ld;
    /* cuBLASLt's C input when it is not the output: D = alpha AB + beta Cin
     * (+ bias), and the member C above is then the output D only. NULL: C
     * is both (in place). The caller gives it C's dtype (cuBLASLt's C and D
     * types agree for these inputs); row stride and alignment its own. */
    const cmat *Cin;
    /* Nonzero: the plan is looked up under this row count instead of M (key_m)
     * or K (key_k), so calls whose count changes every time (an expert's
     * tokens) share one plan */
    int64_t key_m, key_k;
    int lane; /* 0: the device's stream; i > 0: side stream i and its workspace (no autotuning there) */
} gemm_req;

/* The plan bucket of a row count: the next of 2^j x {1, 1.25, 1.5, 1.75}
 * at or above it (exact below 64). */
static int64_t row_bucket(int64_t r) {
    if (r < 64) return r;
    int64_t p = 64;
    while (p * 2 <= r) p *= 2;
    for (int q = 4; q <= 8; q++)
        if (p * q / 4 >= r) return p * q / 4;
    return p * 2;
}

static cai_status set_batch(const char *op, cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
    int32_t n = (int32_t)batch;
    if (cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride) !=
            CUBLAS_STATUS_SUCCESS)
        return CAI_ERROR(CAI_ERR_CUDA, "%s: setting a batch of %" PRId64 " on a cuBLASLt layout failed", op, batch);
    return CAI_OK;
}

/* The stretch of memory a column-major [rows x cols] layout with leading
 * dimension ld spans over `batch` entries `bs` apart, in elements. */
static size_t layout_span(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t bs) {
    return (size_t)((batch > 1 ? (batch - 1) * bs : 0) + (cols - 1) * ld + rows);
}

#define AUTOTUNE_REPS 3

/* CAI_CUBLASLT_AUTOTUNE: the heuristic's first answer is a model's guess;
 * timing its few best on the real operands once per new shape (the first
 * step) and keeping the fastest is what PyTorch's TunableOp does. Each
 * candidate runs once to warm up and AUTOTUNE_REPS times timed. A gemm that
 * accumulates into its output in place runs on a copy of it, so the real
 * result is computed once, afterwards; the others write the same values
 * each time. Skipped during stream capture (it synchronises). Sets *best
 * to the index of the fastest candidate that ran. */
static cai_status autotune(cai_device_t *dev, const char *op, const gemm_req *g, cublasLtMatmulDesc_t desc,
                           cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc_in,
                           cublasLtMatrixLayout_t lc, const cublasLtMatmulHeuristicResult_t *res, int nres, int64_t sc,
                           int *best) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    const cmat *A = g->A, *B = g->B, *C = g->C, *Ci = g->Cin ? g->Cin : g->C;
    *best = 0;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (nres < 2 || cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
        return CAI_OK;
    const int in_place_accumulate = g->beta != 0.0f && Ci->data == C->data;
    const size_t bytes = layout_span(g->N, g->M, C->ld, g->batch, sc) * cai_dtype_size(C->dt);
    void *copy = NULL, *cin = Ci->data, *d = C->data;
    cudaEvent_t t0 = NULL, t1 = NULL;
    cai_status st = CAI_OK;
    cudaError_t e = cudaEventCreate(&t0);
    if (e == cudaSuccess) e = cudaEventCreate(&t1);
    if (e == cudaSuccess && in_place_accumulate) {
        e = cudaMallocAsync(&copy, bytes, c->stream);
        if (e == cudaSuccess) e = cudaMemcpyAsync(copy, C->data, bytes, cudaMemcpyDeviceToDevice, c->stream);
        cin = d = copy;
    }
    if (e != cudaSuccess) {
        st = CAI_ERROR(CAI_ERR_CUDA, "%s: cuBLASLt autotune set-up (%zu bytes) failed: %s", op, bytes,
                       cudaGetErrorString(e));
        goto done;
    }
    float best_ms = 0, first_ms = -1;
    int ran = 0;
    for (int i = 0; i < nres; i++) {
        cublasStatus_t ms = CUBLAS_STATUS_SUCCESS;
        for (int r = 0; r <= AUTOTUNE_REPS && ms == CUBLAS_STATUS_SUCCESS; r++) {
            if (r == 1) cudaEventRecord(t0, c->stream);
            ms = cublasLtMatmul(c->lt, desc, &g->alpha, B->data, la, A->data, lb, &g->beta, cin, lc_in, d, lc,
                                &res[i].algo, c->lt_ws, c->lt_ws_bytes, c->stream);
        }
        if (ms != CUBLAS_STATUS_SUCCESS) continue; /* the heuristic may offer what the run then refuses */
        cudaEventRecord(t1, c->stream);
        float t = 0;
        if ((e = cudaEventSynchronize(t1)) != cudaSuccess || (e = cudaEventElapsedTime(&t, t0, t1)) != cudaSuccess) {
            st = CAI_ERROR(CAI_ERR_CUDA, "%s: timing cuBLASLt candidate %d failed: %s", op, i, cudaGetErrorString(e));
            goto done;
        }
        t /= AUTOTUNE_REPS;
        if (i == 0) first_ms = t;
        if (!ran || t < best_ms) {
            best_ms = t;
            *best = i;
        }
        ran = 1;
    }
    if (ran)
        cai_log(CAI_LOG_INFO,
                "%s: cuBLASLt autotune M=%" PRId64 " N=%" PRId64 " K=%" PRId64 " batch %" PRId64
                ": candidate %d of %d, %.3f ms (the heuristic's first: %.3f ms)",
                op, g->M, g->N, g->K, g->batch, *best + 1, nres, best_ms, first_ms);
done:
    if (copy) cudaFreeAsync(copy, c->stream);
    if (t0) cudaEventDestroy(t0);
    if (t1) cudaEventDestroy(t1);
    return st;
}

cai_cuda_plan *cai_cuda_plan_find(cai_cuda_impl *c, const int64_t *key) {
    for (int i = 0; i < CAI_CUDA_PLANS; i++)
        if (c->plans[i].valid && memcmp(c->plans[i].key, key, CAI_CUDA_PLAN_KEY * sizeof *key) == 0)
            return &c->plans[i];
    return NULL;
}

cai_cuda_plan *cai_cuda_plan_add(cai_cuda_impl *c, const int64_t *key, const cublasLtMatmulAlgo_t *algo) {
    cai_cuda_plan *plan = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % CAI_CUDA_PLANS;
    memcpy(plan->key, key, CAI_CUDA_PLAN_KEY * sizeof *key);
    plan->algo = *algo;
    plan->valid = 1;
    return plan;
}

cublasStatus_t cai_cuda_lt_pref(const cai_cuda_impl *c, uint32_t al_a, uint32_t al_b, uint32_t al_c, uint32_t al_d,
                                cublasLtMatmulPreference_t *out) {
    uint64_t ws = c->lt_ws_bytes;
    cublasLtMatmulPreference_t p = NULL;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&p);
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const void *v;
        size_t n;
    } set[] = {{CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws},
               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a},
               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b},
               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c},
               {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d}};
    for (size_t i = 0; s == CUBLAS_STATUS_SUCCESS && i < sizeof set / sizeof set[0]; i++)
        s = cublasLtMatmulPreferenceSetAttribute(p, set[i].attr, set[i].v, set[i].n);
    if (s != CUBLAS_STATUS_SUCCESS && p) {
        cublasLtMatmulPreferenceDestroy(p);
        p = NULL;
    }
    *out = p;
    return s;
}

/* One cuBLASLt call. *no_algo is set (and CAI_OK returned) when cuBLASLt has
 * no algorithm for this combination, so the caller can fall back. */
cai_status cai_cuda_lt_epilogue(const char *op, cublasLtMatmulDesc_t desc, cublasLtEpilogue_t epi, const void *bias,
                                cai_dtype bias_dt, const void *aux, int64_t aux_ld) {
    cai_status st = CAI_OK;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        LT("set EPILOGUE", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (bias) {
        int32_t bt = (int32_t)cuda_type(bias_dt);
        LT("set BIAS_POINTER",
           cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        LT("set BIAS_DATA_TYPE",
           cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (aux) {
        LT("set EPILOGUE_AUX_POINTER",
           cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        LT("set EPILOGUE_AUX_LD",
           cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    }
done:
    return st;
}

static cai_status lt_gemm(cai_device_t *dev, const char *op, const gemm_req *g, int *no_algo) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    const cmat *A = g->A, *B = g->B, *C = g->C, *Ci = g->Cin ? g->Cin : g->C;
    *no_algo = 0;
    cai_status st = CAI_OK;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, lci = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cublasComputeType_t ct =
        A->dt == CAI_DTYPE_F32 && c->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cublasOperation_t opa = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t sa = g->batch > 1 && B->batch > 1 ? B->bs : 0, sb = g->batch > 1 && A->batch > 1 ? A->bs : 0;
    const int64_t sc = g->batch > 1 ? C->bs : 0;
    const uint32_t al_a = alignment(B->data, B->ld, sa, B->dt), al_b = alignment(A->data, A->ld, sb, A->dt);
    const uint32_t al_c = alignment(C->data, C->ld, sc, C->dt);
    const int64_t sci = g->Cin && g->batch > 1 ? g->Cin->bs : sc;
    const uint32_t al_ci = g->Cin ? alignment(Ci->data, Ci->ld, sci, Ci->dt) : al_c;
    cublasLtEpilogue_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (g->gelu == GELU_FWD) epi = g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (g->gelu == GELU_BWD) epi = CUBLASLT_EPILOGUE_DGELU; /* callers pass no bias with it */
    /* the heuristic reads the bias and aux addresses for their alignment */
    const int64_t al_bias = g->bias ? alignment(g->bias, 0, 0, g->bias_dt) : 0;
    const int64_t al_aux = g->gelu ? alignment(g->aux, g->aux_ld, 0, C->dt) : 0;

    LT("cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    LT("set TRANSA", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT("set TRANSB", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    CAI_CALL_GOTO(cai_cuda_lt_epilogue(op, desc, epi, g->bias, g->bias_dt, g->gelu ? g->aux : NULL, g->aux_ld), st,
                  done);
    /* column-major views: Lt's A is our B, Lt's B our A, Lt's C is C^T */
    LT("layout A", cublasLtMatrixLayoutCreate(&la, cuda_type(B->dt), (uint64_t)B->cols, (uint64_t)B->rows, B->ld));
    LT("layout B", cublasLtMatrixLayoutCreate(&lb, cuda_type(A->dt), (uint64_t)A->cols, (uint64_t)A->rows, A->ld));
    LT("layout C", cublasLtMatrixLayoutCreate(&lc, cuda_type(C->dt), (uint64_t)g->N, (uint64_t)g->M, C->ld));
    if (g->Cin)
        LT("layout C input",
           cublasLtMatrixLayoutCreate(&lci, cuda_type(Ci->dt), (uint64_t)g->N, (uint64_t)g->M, Ci->ld));
    if (g->batch > 1) {
        CAI_CALL_GOTO(set_batch(op, la, g->batch, sa), st, done);
        CAI_CALL_GOTO(set_batch(op, lb, g->batch, sb), st, done);
        CAI_CALL_GOTO(set_batch(op, lc, g->batch, sc), st, done);
        if (lci) CAI_CALL_GOTO(set_batch(op, lci, g->batch, sci), st, done);
    }
    cublasLtMatrixLayout_t lc_in = lci ? lci : lc;
    /* epi tells every epilogue apart (bias or not, GELU forward or backward);
     * the aux dtype is D's, already in the key; a separate C input adds
     * its dtype, row stride, batch stride and alignment (0s when C is D) */
    int64_t key[CAI_CUDA_PLAN_KEY] = {g->key_m ? g->key_m : g->M,
                                      g->N,
                                      g->key_k ? g->key_k : g->K,
                                      g->ta,
                                      g->tb,
                                      g->batch,
                                      A->ld,
                                      B->ld,
                                      C->ld,
                                      sa,
                                      sb,
                                      sc,
                                      (int64_t)A->dt,
                                      (int64_t)C->dt,
                                      (int64_t)ct,
                                      al_a,
                                      al_b,
                                      al_c,
                                      (int64_t)epi * 16 + (g->bias ? (int64_t)g->bias_dt : 0),
                                      (int64_t)c->lt_ws_bytes,
                                      al_bias,
                                      g->gelu ? g->aux_ld : 0,
                                      al_aux,
                                      g->Cin ? 1 + (int64_t)Ci->dt : 0,
                                      g->Cin ? Ci->ld : 0,
                                      g->Cin ? sci : 0,
                                      g->Cin ? (int64_t)al_ci : 0};
    cai_cuda_plan *plan = cai_cuda_plan_find(c, key);
    int fresh = 0;
again:
    if (!plan) {
        fresh = 1;
        LT("cublasLtMatmulPreference", cai_cuda_lt_pref(c, al_a, al_b, al_ci, al_c, &pref));
        cublasLtMatmulHeuristicResult_t res[16];
        int nres = 0, best = 0;
        memset(res, 0, sizeof res);
        const int want = c->lt_autotune > 1 ? c->lt_autotune : 1;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, lc_in, lc, pref, want, res, &nres);
        if (hs != CUBLAS_STATUS_SUCCESS || nres == 0) {
            *no_algo = 1;
            goto done;
        }
        if (!g->lane) CAI_CALL_GOTO(autotune(dev, op, g, desc, la, lb, lc_in, lc, res, nres, sc, &best), st, done);
        plan = cai_cuda_plan_add(c, key, &res[best].algo);
    }
    cublasStatus_t ms = cublasLtMatmul(c->lt, desc, &g->alpha, B->data, la, A->data, lb, &g->beta, Ci->data, lc_in,
                                       C->data, lc, &plan->algo, g->lane ? c->side_ws[g->lane - 1] : c->lt_ws,
                                       c->lt_ws_bytes, g->lane ? c->side[g->lane - 1] : c->stream);
    if (ms == CUBLAS_STATUS_NOT_SUPPORTED) {
        plan->valid = 0;
        plan = NULL;
        /* a bucket's plan, chosen for another row count, may not take this one */
        if (!fresh) goto again;
        *no_algo = 1;
    } else if (ms != CUBLAS_STATUS_SUCCESS) {
        st = CAI_ERROR(CAI_ERR_CUDA,
                       "%s: cublasLtMatmul (M=%" PRId64 " N=%" PRId64 " K=%" PRId64 ", batch %" PRId64
                       ") failed with status %d (%s)",
                       op, g->M, g->N, g->K, g->batch, (int)ms, cublasLtGetStatusString(ms));
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lci) cublasLtMatrixLayoutDestroy(lci);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return st;
}

static cai_status check_types(const char *op, const cmat *A, const cmat *B, const cmat *C) {
    if (A->dt != B->dt)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: the inputs are %s and %s; cuBLASLt multiplies one input dtype "
                         "(convert one with ops->copy)",
                         op, cai_dtype_name(A->dt), cai_dtype_name(B->dt));
    if (C->dt != CAI_DTYPE_F32 && C->dt != A->dt)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED, "%s: output is %s for %s inputs; expected f32 or %s", op,
                         cai_dtype_name(C->dt), cai_dtype_name(A->dt), cai_dtype_name(A->dt));
    return CAI_OK;
}

/* C (batch x [M,N]) = beta * C, for K = 0 where cuBLASLt has nothing to multiply. */
static cai_status scale_only(cai_device_t *dev, const char *op, const cmat *C, int64_t M, int64_t N, float beta) {
    cudaStream_t s = cai_cuda_of(dev)->stream;
    for (int64_t b = 0; b < C->batch; b++) {
        cuk_mat m = {C->data + (size_t)(b * C->bs) * cai_dtype_size(C->dt), M, N, C->ld, (int)C->dt};
        if (beta == 0.0f) CUK_LAUNCH(op, cuk_fill(s, m, 0.0f));
        else CUK_LAUNCH(op, cuk_scale(s, m, beta));
    }
    return CAI_OK;
}

/* op(A) op(B) into C over `batch` entries, falling back from one strided
 * batched call to one call per entry when cuBLASLt refuses the batch. */
/* gemm with gemm_req's plan keys and lane (0 0 0: gemm). */
static cai_status gemm_on(cai_device_t *dev, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                          int64_t batch, float alpha, const cmat *A, const cmat *B, float beta, const cmat *C,
                          int64_t key_m, int64_t key_k, int lane) {
    if (M == 0 || N == 0 || batch == 0) return CAI_OK;
    if (K == 0) {
        cmat cc = *C;
        cc.batch = batch;
        CAI_CALL(scale_only(dev, op, &cc, M, N, beta));
        return CAI_OK;
    }
    gemm_req g = {.ta = ta,
                  .tb = tb,
                  .M = M,
                  .N = N,
                  .K = K,
                  .batch = batch,
                  .A = A,
                  .B = B,
                  .C = C,
                  .alpha = alpha,
                  .beta = beta,
                  .key_m = key_m,
                  .key_k = key_k,
                  .lane = lane};
    int no_algo = 0;
    CAI_CALL(lt_gemm(dev, op, &g, &no_algo));
    if (!no_algo) return CAI_OK;
    if (batch == 1)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: cuBLASLt has no algorithm for M=%" PRId64 " N=%" PRId64 " K=%" PRId64
                         " (%s inputs, %s output, row strides %" PRId64 "/%" PRId64 "/%" PRId64 ")",
                         op, M, N, K, cai_dtype_name(A->dt), cai_dtype_name(C->dt), A->ld, B->ld, C->ld);
    for (int64_t i = 0; i < batch; i++) {
        cmat a1 = *A, b1 = *B, c1 = *C;
        a1.data += (size_t)(A->batch > 1 ? i * A->bs : 0) * cai_dtype_size(A->dt);
        b1.data += (size_t)(B->batch > 1 ? i * B->bs : 0) * cai_dtype_size(B->dt);
        c1.data += (size_t)(i * C->bs) * cai_dtype_size(C->dt);
        a1.batch = b1.batch = c1.batch = 1;
        CAI_CALL(gemm_on(dev, op, ta, tb, M, N, K, 1, alpha, &a1, &b1, beta, &c1, key_m, key_k, lane));
    }
    return CAI_OK;
}

static cai_status gemm(cai_device_t *dev, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                       int64_t batch, float alpha, const cmat *A, const cmat *B, float beta, const cmat *C) {
    return gemm_on(dev, op, ta, tb, M, N, K, batch, alpha, A, B, beta, C, 0, 0, 0);
}

cai_status cai_cuda_matmul(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, int trans_a, const cai_tensor *b,
                           int trans_b, float alpha, float beta) {
    static const char *op = "matmul";
    cmat A, B, C;
    CAI_CALL(as_cmat(op, "a", a, &A));
    CAI_CALL(as_cmat(op, "b", b, &B));
    CAI_CALL(as_cmat(op, "c", c, &C));
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
    CAI_CALL(check_types(op, &A, &B, &C));
    CAI_CALL(cai_cuda_enter(dev, op));
    /* A shared b with a plain a: the batch is just more rows of one gemm. */
    if (C.batch > 1 && B.batch == 1 && !trans_a && A.bs == A.rows * A.ld && C.bs == C.rows * C.ld) {
        cmat A2 = A, C2 = C;
        A2.rows *= A.batch;
        C2.rows *= C.batch;
        A2.batch = C2.batch = 1;
        CAI_CALL(gemm(dev, op, 0, trans_b, M * C.batch, N, K, 1, alpha, &A2, &B, beta, &C2));
        return CAI_OK;
    }
    CAI_CALL(gemm(dev, op, trans_a, trans_b, M, N, K, C.batch, alpha, &A, &B, beta, &C));
    return CAI_OK;
}

/* Whether dgemm.cu takes this product (the rule few_rows_linear and the
 * SwiGLU pair share, so the pair's sums stay the products'). */
static int dgemm_takes(const cai_cuda_impl *c, cuk_mat y, cuk_mat x, cuk_mat w, cuk_mat r) {
    return c->dgemm_ws && cuk_dgemm_fits(y, x, w, r, CAI_CUDA_DGEMM_WS);
}

/* y = x w^T (+ bias) (+ r) on a decode step's few rows: dgemm.cu's
 * tensor-core kernels from CUK_DGEMM_MIN_N to CUK_DGEMM_MAX_N rows where
 * they take the shape (sm_90a, deep weights), else gemv.cu's CUDA-core ones
 * up to CUK_GEMV_MAX_N rows; *done 0 where neither takes the shape. */
static cai_status few_rows_linear(cai_device_t *dev, const char *op, cuk_mat y, cuk_mat x, cuk_mat w, const void *bd,
                                  cai_dtype bias_dt, cuk_mat r, int *done) {
    cai_cuda_impl *c = cai_cuda_of(dev);
    *done = 1;
    if (dgemm_takes(c, y, x, w, r)) {
        CUK_LAUNCH(op, cuk_dgemm(c->stream, y, x, w, bd, (int)bias_dt, r, c->dgemm_ws, c->dgemm_cnt, c->pdl));
        return CAI_OK;
    }
    if (cuk_gemv_fits(y, x, w, r)) {
        CUK_LAUNCH(op, cuk_gemv(c->stream, y, x, w, bd, (int)bias_dt, r, c->pdl));
        return CAI_OK;
    }
    *done = 0;
    return CAI_OK;
}

/* y = x w^T (+ bias) on validated rows, after cai_cuda_enter: the bias as a
 * cuBLASLt epilogue when there is one for this combination, else a plain
 * gemm and the bias kernel. */
static cai_status linear_rows(cai_device_t *dev, const char *op, const cai_rows *x, const cai_rows *w,
                              const cai_rows *y, const void *bd, cai_dtype bias_dt) {
    const cuk_mat none = {0};
    int done;
    CAI_CALL(few_rows_linear(dev, op, cai_cuda_mat(y), cai_cuda_mat(x), cai_cuda_mat(w), bd, bias_dt, none, &done));
    if (done) return CAI_OK;
    cmat A = cmat_of_rows(x), B = cmat_of_rows(w), C = cmat_of_rows(y);
    if (bd && x->rows > 0 && w->rows > 0 && w->cols > 0) {
        gemm_req g = {.ta = 0,
                      .tb = 1,
                      .M = x->rows,
                      .N = w->rows,
                      .K = w->cols,
                      .batch = 1,
                      .A = &A,
                      .B = &B,
                      .C = &C,
                      .alpha = 1.0f,
                      .beta = 0.0f,
                      .bias = bd,
                      .bias_dt = bias_dt};
        int no_algo = 0;
        CAI_CALL(lt_gemm(dev, op, &g, &no_algo));
        if (!no_algo) return CAI_OK;
    }
    /* no bias, K = 0, or no fused epilogue for this combination */
    CAI_CALL(gemm(dev, op, 0, 1, x->rows, w->rows, w->cols, 1, 1.0f, &A, &B, 0.0f, &C));
    if (bd) CUK_LAUNCH(op, cuk_bias_add(cai_cuda_of(dev)->stream, cai_cuda_mat(y), bd, (int)bias_dt));
    return CAI_OK;
}

/* linear_fwd's argument checks under the calling op's name (out_arg names
 * the product's output: "out", or "pre" for linear_gelu_fwd), dtypes
 * included, before anything is enqueued. */
static cai_status linear_fwd_args(const char *op, const char *out_arg, const cai_tensor *out, const cai_tensor *inp,
                                  const cai_tensor *weight, const cai_tensor *bias, cai_rows *x, cai_rows *w,
                                  cai_rows *y, char **bd) {
    CAI_CALL(cai_ops_linear_args(op, out_arg, out, inp, weight, bias, CAI_CUDA, CAI_ANYF, x, w, y, bd));
    cmat A = cmat_of_rows(x), B = cmat_of_rows(w), C = cmat_of_rows(y);
    return check_types(op, &A, &B, &C);
}

cai_status cai_cuda_linear_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp, const cai_tensor *weight,
                               const cai_tensor *bias) {
    static const char *op = "linear_fwd";
    cai_rows x, w, y;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "out", out, inp, weight, bias, &x, &w, &y, &bd));
    CAI_CALL(cai_cuda_enter(dev, op));
    return linear_rows(dev, op, &x, &w, &y, bd, bias ? bias->dtype : CAI_DTYPE_F32);
}

/* Whether a GELU epilogue may write/read `aux` as the aux matrix of output
 * `d`: 16-bit data only (f32 keeps the unfused kernels, so f32 results stay
 * within the f32 parity of the CPU backend whatever GELU approximation the
 * epilogue evaluates), aux in d's dtype (cuBLASLt's aux type is D's), aux row
 * stride a multiple of 8 elements and a 16-byte aligned address (cuBLASLt's
 * requirement on the aux leading dimension; strided or odd views fail it). */
static int gelu_epilogue_ok(const cai_rows *d, const cai_rows *aux, int64_t K) {
    if (d->rows <= 0 || d->cols <= 0 || K <= 0) return 0;
    if (d->dtype != CAI_DTYPE_BF16 && d->dtype != CAI_DTYPE_F16) return 0;
    return aux->dtype == d->dtype && aux->ld % 8 == 0 && aux->ld >= aux->cols && ((uintptr_t)aux->data & 15) == 0;
}

cai_status cai_cuda_linear_gelu_fwd(cai_device_t *dev, cai_tensor *act, cai_tensor *pre, const cai_tensor *inp,
                                    const cai_tensor *weight, const cai_tensor *bias) {
    static const char *op = "linear_gelu_fwd";
    cai_rows x, w, p, a;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "pre", pre, inp, weight, bias, &x, &w, &p, &bd));
    CAI_CALL(cai_cuda_rows_like(op, "act", act, "pre", &p, &a));
    cmat X = cmat_of_rows(&x), W = cmat_of_rows(&w), A = cmat_of_rows(&a);
    CAI_CALL(cai_cuda_enter(dev, op));
    const cai_dtype bias_dt = bias ? bias->dtype : CAI_DTYPE_F32;
    if (gelu_epilogue_ok(&a, &p, w.cols) && A.dt == X.dt) {
        /* act is cuBLASLt's D, pre its aux: pre row-major [N,OC] is the
         * column-major [OC,N] aux matrix with ld = pre's row stride */
        gemm_req g = {.ta = 0,
                      .tb = 1,
                      .M = x.rows,
                      .N = w.rows,
                      .K = w.cols,
                      .batch = 1,
                      .A = &X,
                      .B = &W,
                      .C = &A,
                      .alpha = 1.0f,
                      .beta = 0.0f,
                      .bias = bd,
                      .bias_dt = bias_dt,
                      .gelu = GELU_FWD,
                      .aux = p.data,
                      .aux_ld = p.ld};
        int no_algo = 0;
        CAI_CALL(lt_gemm(dev, op, &g, &no_algo));
        if (!no_algo) return CAI_OK;
    }
    /* f32, strided or unaligned views, or no algorithm: linear, then GELU */
    CAI_CALL(linear_rows(dev, op, &x, &w, &p, bd, bias_dt));
    CUK_LAUNCH(op, cuk_gelu_fwd(cai_cuda_of(dev)->stream, cai_cuda_mat(&a), cai_cuda_mat(&p)));
    return CAI_OK;
}

/* A decode step's few rows: one pass over both weights (dgemm.cu or
 * gemv.cu, chosen as few_rows_linear chooses); else the two products into
 * gate and up, then the SwiGLU kernel. */
cai_status cai_cuda_linear_swiglu_fwd(cai_device_t *dev, cai_tensor *act, cai_tensor *gate, cai_tensor *up,
                                      const cai_tensor *inp, const cai_tensor *w_gate, const cai_tensor *w_up) {
    static const char *op = "linear_swiglu_fwd";
    cai_rows x, wg, wu, g, u, a;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "gate", gate, inp, w_gate, NULL, &x, &wg, &g, &bd));
    CAI_CALL(linear_fwd_args(op, "up", up, inp, w_up, NULL, &x, &wu, &u, &bd));
    CAI_CALL(cai_cuda_rows_like(op, "act", act, "gate", &g, &a));
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *c = cai_cuda_of(dev);
    const cuk_mat A = cai_cuda_mat(&a), X = cai_cuda_mat(&x), WG = cai_cuda_mat(&wg), WU = cai_cuda_mat(&wu);
    /* where dgemm.cu takes the two products but not the pair (its workspace), the three ops: the pair's sums
     * are then the products' all the same */
    const cuk_mat none = {0};
    const int dg = dgemm_takes(c, A, X, WG, none);
    if (a.dtype == x.dtype && dg && cuk_dgemm_swiglu_fits(A, X, WG, WU, CAI_CUDA_DGEMM_WS)) {
        CUK_LAUNCH(op, cuk_dgemm_swiglu(c->stream, A, X, WG, WU, c->dgemm_ws, c->dgemm_cnt, c->pdl));
        return CAI_OK;
    }
    if (a.dtype == x.dtype && !dg && cuk_gemv_swiglu_fits(A, X, WG, WU)) {
        CUK_LAUNCH(op, cuk_gemv_swiglu(c->stream, A, X, WG, WU, c->pdl));
        return CAI_OK;
    }
    CAI_CALL(linear_rows(dev, op, &x, &wg, &g, NULL, CAI_DTYPE_F32));
    CAI_CALL(linear_rows(dev, op, &x, &wu, &u, NULL, CAI_DTYPE_F32));
    CUK_LAUNCH(op, cuk_swiglu_fwd(cai_cuda_of(dev)->stream, cai_cuda_mat(&a), cai_cuda_mat(&g), cai_cuda_mat(&u)));
    return CAI_OK;
}

/* out = x w^T + bias + residual in one cuBLASLt call: D = out, C = the
 * residual (a separate C input, or D itself in place), beta = 1, the bias as
 * the epilogue. The sum of product, bias and residual is formed in f32 and
 * rounded once into out; linear_fwd + add rounds the product + bias to out's
 * dtype first and the sum again, so bf16 results differ from the two-op
 * sequence by up to an ulp of out (f32 results: in the last bits). Fallback
 * (residual dtype differs from out's, K = 0, or no algorithm for these
 * alignments and strides): linear_fwd then the add kernel, or in place the
 * bias kernel then a beta = 1 gemm accumulating onto out. */
cai_status cai_cuda_linear_residual_fwd(cai_device_t *dev, cai_tensor *out, const cai_tensor *inp,
                                        const cai_tensor *weight, const cai_tensor *bias, const cai_tensor *residual) {
    static const char *op = "linear_residual_fwd";
    cai_rows x, w, y, r;
    char *bd;
    CAI_CALL(linear_fwd_args(op, "out", out, inp, weight, bias, &x, &w, &y, &bd));
    CAI_CALL(cai_cuda_rows_like(op, "residual", residual, "out", &y, &r));
    const int in_place = r.data == y.data;
    if (in_place && y.rows > 1 && (r.ld != y.ld || r.dtype != y.dtype))
        return CAI_ERROR(CAI_ERR_INVALID_ARG,
                         "%s: out (%s) and residual (%s) start at the same address but are "
                         "different views; in place needs the same view",
                         op, CAI_OPS_DESCRIBE(out), CAI_OPS_DESCRIBE(residual));
    cmat X = cmat_of_rows(&x), W = cmat_of_rows(&w), Y = cmat_of_rows(&y), R = cmat_of_rows(&r);
    CAI_CALL(cai_cuda_enter(dev, op));
    if (y.rows == 0 || y.cols == 0) return CAI_OK;
    const cai_dtype bias_dt = bias ? bias->dtype : CAI_DTYPE_F32;
    int done;
    CAI_CALL(few_rows_linear(dev, op, cai_cuda_mat(&y), cai_cuda_mat(&x), cai_cuda_mat(&w), bd, bias_dt,
                             cai_cuda_mat(&r), &done));
    if (done) return CAI_OK;
    if (r.dtype == y.dtype && w.cols > 0) {
        gemm_req g = {.ta = 0,
                      .tb = 1,
                      .M = x.rows,
                      .N = w.rows,
                      .K = w.cols,
                      .batch = 1,
                      .A = &X,
                      .B = &W,
                      .C = &Y,
                      .alpha = 1.0f,
                      .beta = 1.0f,
                      .bias = bd,
                      .bias_dt = bias_dt,
                      .Cin = in_place ? NULL : &R};
        int no_algo = 0;
        CAI_CALL(lt_gemm(dev, op, &g, &no_algo));
        if (!no_algo) return CAI_OK;
    }
    cudaStream_t s = cai_cuda_of(dev)->stream;
    if (in_place) {
        /* the product cannot go into out before the residual is read */
        if (bd) CUK_LAUNCH(op, cuk_bias_add(s, cai_cuda_mat(&y), bd, (int)bias_dt));
        return gemm(dev, op, 0, 1, x.rows, w.rows, w.cols, 1, 1.0f, &X, &W, 1.0f, &Y);
    }
    CAI_CALL(linear_rows(dev, op, &x, &w, &y, bd, bias_dt));
    CUK_LAUNCH(op, cuk_add(s, cai_cuda_mat(&y), cai_cuda_mat(&r), cai_cuda_mat(&y)));
    return CAI_OK;
}

/* The parameter half of a linear backward, on validated rows after
 * cai_cuda_enter: dw += dy^T x (dw NULL: skip), db += column sums of dy
 * (db NULL: skip). */
static cai_status linear_param_grads(cai_device_t *dev, const char *op, const cai_rows *dy, const cai_rows *x,
                                     const cai_rows *dw, float *db) {
    if (dw) {
        cmat DY = cmat_of_rows(dy), X = cmat_of_rows(x), DW = cmat_of_rows(dw);
        CAI_CALL(gemm(dev, op, 1, 0, dw->rows, dw->cols, dy->rows, 1, 1.0f, &DY, &X, 1.0f, &DW));
    }
    if (db) CAI_CALL(cai_cuda_colsums(dev, op, NULL, db, dy, NULL, NULL, NULL));
    return CAI_OK;
}

/* C = op(A) op(B) + beta C (batch 1) with the plan looked up as if M
 * (bucket_m) or K were plan_rows. */
static cai_status bucket_gemm(cai_device_t *dev, const char *op, int ta, int tb, int64_t M, int64_t N, int64_t K,
                              const cmat *A, const cmat *B, float beta, const cmat *C, int bucket_m, int64_t plan_rows,
                              int lane) {
    const int64_t key = row_bucket(plan_rows);
    return gemm_on(dev, op, ta, tb, M, N, K, 1, 1.0f, A, B, beta, C, bucket_m ? key : 0, bucket_m ? 0 : key, lane);
}

cai_status cai_cuda_block_linear_fwd(cai_device_t *dev, const char *op, const cai_rows *x, const cai_rows *w,
                                     const cai_rows *y, int64_t plan_rows, int lane) {
    cmat A = cmat_of_rows(x), B = cmat_of_rows(w), C = cmat_of_rows(y);
    return bucket_gemm(dev, op, 0, 1, x->rows, w->rows, w->cols, &A, &B, 0.0f, &C, 1, plan_rows, lane);
}

cai_status cai_cuda_block_linear_bwd(cai_device_t *dev, const char *op, const cai_rows *dx, const cai_rows *dw,
                                     const cai_rows *dy, const cai_rows *x, const cai_rows *w, int accum,
                                     int64_t plan_rows, int lane) {
    cmat DY = cmat_of_rows(dy), W = cmat_of_rows(w), X = cmat_of_rows(x), DW = cmat_of_rows(dw);
    if (dx) {
        cmat DX = cmat_of_rows(dx);
        CAI_CALL(bucket_gemm(dev, op, 0, 0, dy->rows, w->cols, w->rows, &DY, &W, accum ? 1.0f : 0.0f, &DX, 1, plan_rows,
                             lane));
    }
    return bucket_gemm(dev, op, 1, 0, dw->rows, dw->cols, dy->rows, &DY, &X, 1.0f, &DW, 0, plan_rows, lane);
}

/* Validation shared by linear_bwd and linear_bwd_dgelu: weight, dout, the
 * input gradient (dinp_arg; NULL tensor: none) and, with dweight, inp;
 * checks the dtypes of both gemms before anything is enqueued. */
static cai_status linear_bwd_args(const char *op, const char *dinp_arg, cai_tensor *dinp, cai_tensor *dweight,
                                  cai_tensor *dbias, const cai_tensor *dout, const cai_tensor *inp,
                                  const cai_tensor *weight, cai_rows *dx, cai_rows *dw, cai_rows *dy, cai_rows *x,
                                  cai_rows *w, char **bd) {
    CAI_CALL(cai_ops_rows(op, "weight", weight, CAI_CUDA, CAI_ANYF, -1, w));
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_CUDA, CAI_ANYF, w->rows, dy));
    cmat DY = cmat_of_rows(dy);
    if (dinp) {
        CAI_CALL(cai_ops_rows(op, dinp_arg, dinp, CAI_CUDA, CAI_ANYF, w->cols, dx));
        if (dx->rows != dy->rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG, "%s: %s has %" PRId64 " rows but dout %" PRId64, op, dinp_arg,
                             dx->rows, dy->rows);
        cmat W = cmat_of_rows(w), DX = cmat_of_rows(dx);
        CAI_CALL(check_types(op, &DY, &W, &DX));
    }
    if (dweight) {
        CAI_CALL(cai_ops_rows(op, "inp", inp, CAI_CUDA, CAI_ANYF, w->cols, x));
        CAI_CALL(cai_ops_rows(op, "dweight", dweight, CAI_CUDA, CAI_ANYF, w->cols, dw));
        if (x->rows != dy->rows || dw->rows != w->rows)
            return CAI_ERROR(CAI_ERR_INVALID_ARG,
                             "%s: inp has %" PRId64 " rows (dout %" PRId64 "), dweight %" PRId64 " (weight %" PRId64
                             ")",
                             op, x->rows, dy->rows, dw->rows, w->rows);
        cmat X = cmat_of_rows(x), DW = cmat_of_rows(dw);
        CAI_CALL(check_types(op, &DY, &X, &DW));
    }
    *bd = NULL;
    if (dbias) CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_CUDA, CAI_F32, w->rows, bd));
    return CAI_OK;
}

cai_status cai_cuda_linear_bwd(cai_device_t *dev, cai_tensor *dinp, cai_tensor *dweight, cai_tensor *dbias,
                               const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                               int accum_dinp) {
    static const char *op = "linear_bwd";
    cai_rows dy, w, dx, x, dw;
    char *bd;
    CAI_CALL(linear_bwd_args(op, "dinp", dinp, dweight, dbias, dout, inp, weight, &dx, &dw, &dy, &x, &w, &bd));
    CAI_CALL(cai_cuda_enter(dev, op));
    if (dinp) {
        cmat DY = cmat_of_rows(&dy), W = cmat_of_rows(&w), DX = cmat_of_rows(&dx);
        CAI_CALL(gemm(dev, op, 0, 0, dy.rows, w.cols, w.rows, 1, 1.0f, &DY, &W, accum_dinp ? 1.0f : 0.0f, &DX));
    }
    return linear_param_grads(dev, op, &dy, &x, dweight ? &dw : NULL, (float *)bd);
}

cai_status cai_cuda_linear_bwd_dgelu(cai_device_t *dev, cai_tensor *dpre, cai_tensor *dweight, cai_tensor *dbias,
                                     const cai_tensor *dout, const cai_tensor *inp, const cai_tensor *weight,
                                     const cai_tensor *pre) {
    static const char *op = "linear_bwd_dgelu";
    cai_rows dy, w, dx, x, dw, p;
    char *bd;
    CAI_CHECK_ARG(dpre, "%s: dpre is NULL", op);
    CAI_CALL(linear_bwd_args(op, "dpre", dpre, dweight, dbias, dout, inp, weight, &dx, &dw, &dy, &x, &w, &bd));
    CAI_CALL(cai_cuda_rows_like(op, "pre", pre, "dpre", &dx, &p));
    CAI_CALL(cai_cuda_enter(dev, op));
    cmat DY = cmat_of_rows(&dy), W = cmat_of_rows(&w), DX = cmat_of_rows(&dx);
    int fused = 0;
    if (gelu_epilogue_ok(&dx, &p, w.rows)) {
        /* dpre is D, pre the aux input, both row-major [N,IC] */
        gemm_req g = {.ta = 0,
                      .tb = 0,
                      .M = dy.rows,
                      .N = w.cols,
                      .K = w.rows,
                      .batch = 1,
                      .A = &DY,
                      .B = &W,
                      .C = &DX,
                      .alpha = 1.0f,
                      .beta = 0.0f,
                      .gelu = GELU_BWD,
                      .aux = p.data,
                      .aux_ld = p.ld};
        int no_algo = 0;
        CAI_CALL(lt_gemm(dev, op, &g, &no_algo));
        fused = !no_algo;
    }
    if (!fused) { /* f32, strided or unaligned views, or no algorithm */
        CAI_CALL(gemm(dev, op, 0, 0, dy.rows, w.cols, w.rows, 1, 1.0f, &DY, &W, 0.0f, &DX));
        CUK_LAUNCH(op, cuk_gelu_bwd(cai_cuda_of(dev)->stream, cai_cuda_mat(&dx), cai_cuda_mat(&p), cai_cuda_mat(&dx)));
    }
    return linear_param_grads(dev, op, &dy, &x, dweight ? &dw : NULL, (float *)bd);
}

cai_status cai_cuda_bias_add(cai_device_t *dev, cai_tensor *x, const cai_tensor *bias) {
    static const char *op = "bias_add";
    cai_rows r;
    char *bd;
    CAI_CALL(cai_ops_rows(op, "x", x, CAI_CUDA, CAI_ANYF, -1, &r));
    CAI_CALL(cai_ops_vec(op, "bias", bias, CAI_CUDA, CAI_ANYF, r.cols, &bd));
    CAI_CALL(cai_cuda_enter(dev, op));
    CUK_LAUNCH(op, cuk_bias_add(cai_cuda_of(dev)->stream, cai_cuda_mat(&r), bd, (int)bias->dtype));
    return CAI_OK;
}

cai_status cai_cuda_bias_grad(cai_device_t *dev, cai_tensor *dbias, const cai_tensor *dout) {
    static const char *op = "bias_grad";
    cai_rows r;
    char *bd;
    CAI_CALL(cai_ops_rows(op, "dout", dout, CAI_CUDA, CAI_ANYF, -1, &r));
    CAI_CALL(cai_ops_vec(op, "dbias", dbias, CAI_CUDA, CAI_F32, r.cols, &bd));
    CAI_CALL(cai_cuda_enter(dev, op));
    CAI_CALL(cai_cuda_colsums(dev, op, NULL, (float *)bd, &r, NULL, NULL, NULL));
    return CAI_OK;
}
