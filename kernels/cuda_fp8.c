/* CUDA backend: FP8 casts (kernels/fp8.cu) and FP8 products through
 * cuBLASLt. Our c [M,N] = a [M,K] b [N,K]^T, row-major, is cuBLASLt's
 * column-major D [N,M] = op(A) op(B) with A = our b (K x N, transposed) and
 * B = our a (K x M, not transposed): the "TN" layout Hopper's FP8 GEMMs
 * require. The dequantisation factors 1/scale are read by cuBLASLt from the
 * operands' metas on the device (A/B_SCALE_POINTER), so a scale computed on
 * the GPU in the same stream needs no host round trip. Accumulation is f32
 * unless CAI_CUDA_FP8_FAST_ACCUM=1; D is F32 or BF16. The epilogue (bias,
 * GELU keeping its input, a separate C) is cuBLASLt's where it has a
 * kernel for it, else separate ops after the product. */
#include "cai_config.h"
#include "cuda_internal.h"

#include <string.h>

cai_status cai_cuda_fp8_cast(cai_device_t *dev, cai_tensor *q, cai_tensor *qt, const cai_tensor *x, cai_tensor *meta,
                             cai_fp8_format fmt, int current, int margin) {
    static const char *op = "fp8_cast";
    cai_rows xr;
    float *m;
    CAI_CALL(cai_ops_fp8_cast_args(op, CAI_CUDA, CAI_ANYF, q, qt, x, meta, fmt, &xr, &m));
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *c = cai_cuda_of(dev);
    CUK_LAUNCH(op, cuk_fp8_cast(cai_cuda_mat(&xr), m, c->scratch, fmt == CAI_FP8_E5M2, current, margin,
                                q ? (uint8_t *)q->data : NULL, qt ? (uint8_t *)qt->data : NULL, c->stream));
    return CAI_OK;
}

cai_status cai_cuda_fp8_dequant_sum(cai_device_t *dev, cai_tensor *y, const cai_tensor *q, const cai_tensor *metas,
                                    int64_t stride, cai_fp8_format fmt, float beta) {
    static const char *op = "fp8_dequant_sum";
    int64_t S = 0, n = 0;
    CAI_CALL(cai_ops_fp8_dequant_args(op, CAI_CUDA, y, q, metas, stride, fmt, beta, &S, &n));
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *c = cai_cuda_of(dev);
    CUK_LAUNCH(op, cuk_fp8_dequant_sum((float *)y->data, (const uint8_t *)q->data, (const float *)metas->data, S, n,
                                       stride, fmt == CAI_FP8_E5M2, beta != 0.0f, c->stream));
    return CAI_OK;
}

size_t cai_cuda_fp8_gemm_workspace_bytes(const cai_device_t *dev, int64_t M, int64_t N, int64_t K) {
    (void)dev, (void)M, (void)N, (void)K;
    return 0; /* cuBLASLt's workspace is the device's */
}

static uint32_t align_of(const void *p, int64_t ld_bytes) {
    uintptr_t v = (uintptr_t)p | (uintptr_t)ld_bytes;
    uint32_t a = 256;
    while (a > 1 && (v & (a - 1))) a >>= 1;
    return a;
}

/* The epilogue by separate ops around a plain product (where cuBLASLt
 * offers no fused kernel for it). */
static cai_status unfused(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt,
                          const cai_tensor *a_meta, const cai_tensor *b, cai_fp8_format b_fmt, const cai_tensor *b_meta,
                          float beta, const cai_fp8_epilogue *ep) {
    cai_tensor dst;
    CAI_CALL(cai_ops_fp8_epilogue_pre(dev, c, beta, ep, &dst));
    CAI_CALL(cai_cuda_fp8_gemm(dev, &dst, a, a_fmt, a_meta, b, b_fmt, b_meta, beta, NULL, NULL, 0));
    return cai_ops_fp8_epilogue_post(dev, c, ep);
}

cai_status cai_cuda_fp8_gemm(cai_device_t *dev, cai_tensor *c, const cai_tensor *a, cai_fp8_format a_fmt,
                             const cai_tensor *a_meta, const cai_tensor *b, cai_fp8_format b_fmt,
                             const cai_tensor *b_meta, float beta, const cai_fp8_epilogue *ep, void *workspace,
                             size_t workspace_bytes) {
    static const char *op = "fp8_gemm";
    (void)workspace, (void)workspace_bytes;
    cai_fp8_gemm_args g;
    CAI_CALL(cai_ops_fp8_gemm_args(op, CAI_CUDA, CAI_ANYF, c, a, a_fmt, a_meta, b, b_fmt, b_meta, beta, &g));
    CAI_CALL(cai_ops_fp8_epilogue_args(op, CAI_CUDA, c, beta, ep));
    /* cuBLASLt runs an FP8 product's DGELU as a kernel of its own after the
     * product, at 615 us for GPT-2 124M's [32768, 3072] against 240 us for
     * gelu_bwd (ncu, H200; bench/RESULTS.md) */
    if (ep && ep->act == CAI_FP8_ACT_DGELU) return unfused(dev, c, a, a_fmt, a_meta, b, b_fmt, b_meta, beta, ep);
    const int64_t M = g.a.rows, N = g.b.rows, K = g.a.cols;
    if (M % 16 || N % 16 || K % 16)
        return CAI_ERROR(CAI_ERR_UNSUPPORTED,
                         "%s: [M=%" PRId64 ", N=%" PRId64 ", K=%" PRId64
                         "]: cuBLASLt's FP8 products need every size a multiple of 16",
                         op, M, N, K);
    if (M == 0 || N == 0) return CAI_OK;
    long long fast = 0;
    CAI_CALL(cai_knob_int("CAI_CUDA_FP8_FAST_ACCUM", &fast));
    const int8_t fast_accum = (int8_t)fast;
    CAI_CALL(cai_cuda_enter(dev, op));
    cai_cuda_impl *cu = cai_cuda_of(dev);
    /* the epilogue as cuBLASLt's: bias, GELU with its input kept (DGELU
     * returned above); a separate C input (c_in) as Lt's C with c as its D */
    const cai_fp8_act act = ep ? ep->act : CAI_FP8_ACT_NONE;
    const void *bias = ep && ep->bias ? ep->bias->data : NULL;
    cai_rows ci = g.c, ax = {0};
    if (ep && ep->c_in && ep->c_in->data != c->data && beta != 0.0f)
        CAI_CALL(cai_ops_rows(op, "epilogue c_in", ep->c_in, CAI_CUDA, (int)c->dtype, N, &ci));
    if (act != CAI_FP8_ACT_NONE) CAI_CALL(cai_ops_rows(op, "epilogue aux", ep->aux, CAI_CUDA, (int)c->dtype, N, &ax));
    cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (act == CAI_FP8_ACT_GELU) epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    const int sep_c = ci.data != g.c.data;
    cai_status st = CAI_OK;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL, lci = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const cudaDataType_t ta = b_fmt == CAI_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3,
                         tb = a_fmt == CAI_FP8_E5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3,
                         tc = g.c.dtype == CAI_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    const void *sa = g.b_meta + CAI_FP8_META_SCALE_INV, *sb = g.a_meta + CAI_FP8_META_SCALE_INV;
    const int64_t es = (int64_t)cai_dtype_size(g.c.dtype);
    const uint32_t al_a = align_of(g.b.data, K), al_b = align_of(g.a.data, K), al_c = align_of(g.c.data, g.c.ld * es),
                   al_ci = align_of(ci.data, ci.ld * es), al_bias = bias ? align_of(bias, 0) : 0,
                   al_aux = ax.data ? align_of(ax.data, ax.ld * es) : 0;
    const float alpha = 1.0f;
    int no_algo = 0;
    LT("cublasLtMatmulDescCreate", cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT("set TRANSA", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT));
    LT("set TRANSB", cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN));
    LT("set A_SCALE_POINTER",
       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa));
    LT("set B_SCALE_POINTER",
       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb));
    LT("set FAST_ACCUM",
       cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum));
    CAI_CALL_GOTO(cai_cuda_lt_epilogue(op, desc, epi, bias, c->dtype, ax.data, ax.ld), st, done);
    LT("layout A", cublasLtMatrixLayoutCreate(&la, ta, (uint64_t)K, (uint64_t)N, K));
    LT("layout B", cublasLtMatrixLayoutCreate(&lb, tb, (uint64_t)K, (uint64_t)M, K));
    LT("layout C", cublasLtMatrixLayoutCreate(&lc, tc, (uint64_t)N, (uint64_t)M, g.c.ld));
    if (sep_c) LT("layout C input", cublasLtMatrixLayoutCreate(&lci, tc, (uint64_t)N, (uint64_t)M, ci.ld));
    cublasLtMatrixLayout_t lc_in = lci ? lci : lc;
    /* a key of its own kind (-8 first: a plain gemm's first entry is M >= 0) */
    int64_t key[CAI_CUDA_PLAN_KEY] = {-8,
                                      M,
                                      N,
                                      K,
                                      (int64_t)a_fmt,
                                      (int64_t)b_fmt,
                                      (int64_t)g.c.dtype,
                                      g.c.ld,
                                      beta != 0.0f,
                                      al_a,
                                      al_b,
                                      al_c,
                                      (int64_t)cu->lt_ws_bytes,
                                      fast_accum,
                                      (int64_t)epi,
                                      ax.data ? ax.ld : 0,
                                      al_aux,
                                      al_bias,
                                      sep_c ? ci.ld : 0,
                                      sep_c ? al_ci : 0};
    cai_cuda_plan *plan = cai_cuda_plan_find(cu, key);
    cublasStatus_t ms = CUBLAS_STATUS_NOT_SUPPORTED;
    if (plan && plan->valid == 2) {
        no_algo = 1; /* known: no fused kernel for this epilogue */
    } else if (plan) {
        ms = cublasLtMatmul(cu->lt, desc, &alpha, g.b.data, la, g.a.data, lb, &beta, ci.data, lc_in, g.c.data, lc,
                            &plan->algo, cu->lt_ws, cu->lt_ws_bytes, cu->stream);
    } else {
        /* The heuristic's ranking can include algorithms the launch then
         * refuses (NOT_SUPPORTED) for FP8 operands: the first that runs is
         * kept. A refusal happens before any work, so C is untouched. */
        enum { TRIES = 8 };
        LT("cublasLtMatmulPreference", cai_cuda_lt_pref(cu, al_a, al_b, al_ci, al_c, &pref));
        cublasLtMatmulHeuristicResult_t res[TRIES];
        int nres = 0;
        memset(res, 0, sizeof res);
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(cu->lt, desc, la, lb, lc_in, lc, pref, TRIES, res, &nres);
        if ((hs != CUBLAS_STATUS_SUCCESS || nres == 0) && epi == CUBLASLT_EPILOGUE_DEFAULT && !sep_c) {
            st = CAI_ERROR(CAI_ERR_UNSUPPORTED,
                           "%s: cuBLASLt has no FP8 algorithm for [M=%" PRId64 ", N=%" PRId64 ", K=%" PRId64
                           "] %s x %s -> %s (status %d; FP8 products need sm_89 or later)",
                           op, M, N, K, cai_fp8_format_name(a_fmt), cai_fp8_format_name(b_fmt),
                           cai_dtype_name(g.c.dtype), (int)hs);
            goto done;
        }
        for (int i = 0; i < nres && ms != CUBLAS_STATUS_SUCCESS; i++) {
            ms = cublasLtMatmul(cu->lt, desc, &alpha, g.b.data, la, g.a.data, lb, &beta, ci.data, lc_in, g.c.data, lc,
                                &res[i].algo, cu->lt_ws, cu->lt_ws_bytes, cu->stream);
            if (ms == CUBLAS_STATUS_SUCCESS) plan = cai_cuda_plan_add(cu, key, &res[i].algo);
        }
        if (ms != CUBLAS_STATUS_SUCCESS && (epi != CUBLASLT_EPILOGUE_DEFAULT || sep_c)) {
            cublasLtMatmulAlgo_t none;
            memset(&none, 0, sizeof none);
            cai_cuda_plan_add(cu, key, &none)->valid = 2;
            no_algo = 1;
        }
    }
    if (!no_algo && ms != CUBLAS_STATUS_SUCCESS) {
        if (plan) plan->valid = 0;
        st = CAI_ERROR(CAI_ERR_CUDA,
                       "%s: cublasLtMatmul (M=%" PRId64 " N=%" PRId64 " K=%" PRId64
                       ") %s x %s -> %s, beta %g: status %d (%s) for every algorithm the heuristic offered",
                       op, M, N, K, cai_fp8_format_name(a_fmt), cai_fp8_format_name(b_fmt), cai_dtype_name(g.c.dtype),
                       (double)beta, (int)ms, cublasLtGetStatusString(ms));
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lci) cublasLtMatrixLayoutDestroy(lci);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (st == CAI_OK && no_algo) return unfused(dev, c, a, a_fmt, a_meta, b, b_fmt, b_meta, beta, ep);
    return st;
}
